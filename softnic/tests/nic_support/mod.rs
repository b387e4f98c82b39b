//! Shared helpers of the `nic_*` integration tests: start `softnic run` processes on
//! loopback, connect verbs-api clients, wait for completions — every wait bounded, every
//! spawned process killed by PID when its guard drops (also when a test fails).
#![allow(dead_code)]

pub mod veth;

use std::net::IpAddr;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use verbs_api::abi::control::{Reply, Response};

use verbs_api::{
    AccessFlags, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu, ProtectionDomain,
    QpAttr, QpCap, QpEndpoint, QpInitAttr, QpState, QpType, QueuePair, WorkCompletion,
};

/// Longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// Environment variable by which a parent test passes its SOFTNIC_DIR to a child.
pub const CHILD_DIR_ENV: &str = "SOFTNIC_NICTEST_DIR";

/// Name prefix of the per-process test directories (logs, pcaps, sockets).
const DIR_PREFIX: &str = "softnic-nictest-";

/// Removes the directories of earlier test processes that are gone. A test binary has no
/// global teardown, so each run keeps its own directory (its NIC logs help when a test
/// fails) and the next run clears those of processes that no longer exist.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let alive = Path::new("/proc").join(pid).exists();
        if pid.parse::<u32>().is_ok() && !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A verbs-api example binary, built next to the test binaries (`cargo test
/// --workspace` builds every example; alone: `cargo build -p verbs-api --examples`).
/// A missing one fails the test.
pub fn example(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_softnic"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: build the examples (`cargo build -p verbs-api --examples`; \
         `cargo test --workspace` does it)",
        p.display()
    );
    p
}

/// The control-socket directory of this test binary. verbs-api finds sockets through
/// `$SOFTNIC_DIR`, which is process-wide, so it is set once, before any client runs, to
/// a directory private to this test process; NICs get distinct names instead.
pub fn softnic_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // A child client process (see nic_client_crash.rs) uses its parent's directory.
        let d = match std::env::var_os(CHILD_DIR_ENV) {
            Some(d) => PathBuf::from(d),
            None => {
                remove_stale_dirs();
                std::env::temp_dir().join(format!("{DIR_PREFIX}{}", std::process::id()))
            }
        };
        std::fs::create_dir_all(&d).expect("create SOFTNIC_DIR");
        std::env::set_var("SOFTNIC_DIR", &d);
        d
    })
}

/// A `softnic run` process, killed (SIGKILL) on drop if still running.
pub struct NicProc {
    child: Option<Child>,
    /// Device name.
    pub name: String,
    /// Bound address.
    pub addr: IpAddr,
    /// UDP port.
    pub port: u16,
    /// Its stderr.
    pub log: PathBuf,
}

impl NicProc {
    /// Starts a NIC named `name` on `addr:port` with extra arguments; waits (bounded)
    /// until its control socket answers. Port 0 lets the kernel choose a free port (the
    /// tests use it so that they never collide with other NICs on a shared host).
    pub fn start(name: &str, addr: &str, port: u16, extra: &[&str]) -> NicProc {
        Self::start_in(None, name, addr, port, extra)
    }

    /// Two NICs on 127.0.0.1 (ports the kernel chooses), named `{tag}-a` and
    /// `{tag}-b`: the set-up of most two-NIC tests.
    pub fn pair(tag: &str) -> (NicProc, NicProc) {
        let start = |side: &str| NicProc::start(&format!("{tag}-{side}"), "127.0.0.1", 0, &[]);
        (start("a"), start("b"))
    }

    /// As [`NicProc::start`], inside network namespace `netns` when given (through
    /// `ip netns exec`, which execs the NIC in place: the child PID is the NIC's).
    pub fn start_in(
        netns: Option<&str>,
        name: &str,
        addr: &str,
        port: u16,
        extra: &[&str],
    ) -> NicProc {
        let dir = softnic_dir();
        let log = dir.join(format!("{name}.log"));
        let exe = env!("CARGO_BIN_EXE_softnic");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, exe]);
                c
            }
            None => Command::new(exe),
        };
        let child = cmd
            .args([
                "run",
                "--name",
                name,
                "--addr",
                addr,
                "--port",
                &port.to_string(),
            ])
            .args(extra)
            .env("SOFTNIC_DIR", dir)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn softnic run");
        let mut nic = NicProc {
            child: Some(child),
            name: name.to_string(),
            addr: ip_of(addr),
            port,
            log,
        };
        let sock = dir.join(format!("{name}.sock"));
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(s) = UnixStream::connect(&sock) {
                // The socket must be this child's: a NIC of the same name that another
                // test of this process started first keeps the socket (ours exits,
                // "served by a running NIC"), and without this check both tests would
                // share it, each stopping it for the other as it ends.
                let server = peer_pid(&s);
                let own = nic.pid();
                if server != own {
                    panic!(
                        "NIC name {name} is taken: its socket {} is served by process \
                         {server:?}, not by this NIC ({own:?}); give each test's NICs \
                         names of their own",
                        sock.display()
                    );
                }
                // Learn the port (port 0 = the kernel chose one) without opening the
                // device, so no client is counted.
                let req = verbs_api::abi::control::Request::QueryDevice;
                match verbs_api::abi::control::call(&s, &req, &[]) {
                    Ok((Response::Ok(Reply::Device(d)), _)) => nic.port = d.port,
                    other => panic!("QueryDevice on {name}: {other:?}"),
                }
                break;
            }
            if let Some(st) = nic.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("softnic run {name} exited with {st}: {}", nic.log_text());
            }
            assert!(Instant::now() < deadline, "NIC {name} did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        nic
    }

    /// A NIC started by someone else (e.g. the parent test process): not owned, never
    /// killed by this guard.
    pub fn attach(name: &str, addr: &str, port: u16) -> NicProc {
        softnic_dir();
        NicProc {
            child: None,
            name: name.to_string(),
            addr: ip_of(addr),
            port,
            log: PathBuf::new(),
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("NIC {} ignored SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The QP endpoint of a QP of this NIC.
    pub fn endpoint(&self, qpn: u32, psn: u32) -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn,
            psn,
            gid: Gid::from_ip(self.addr),
            udp_port: self.port,
        }
    }

    /// `softnic stats --name` as a list.
    pub fn stats(&self) -> Vec<(String, u64)> {
        let out = Command::new(env!("CARGO_BIN_EXE_softnic"))
            .args(["stats", "--name", &self.name])
            .env("SOFTNIC_DIR", softnic_dir())
            .output()
            .expect("softnic stats");
        assert!(out.status.success(), "softnic stats failed: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// One counter.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no counter {name}"))
    }
}

impl Drop for NicProc {
    /// SIGTERM (so the NIC removes its socket), SIGKILL after 2 s; by PID, only our own
    /// child.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One side of a connected RC pair: context, PD, one CQ for both queues, QP, MR.
pub struct Side {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion,
}

/// Opens `nic`, allocates a `mr_len`-byte region with every access right and an RC QP.
pub fn side(nic: &NicProc, mr_len: usize, depth: u32) -> Side {
    side_on(Device::open(&nic.name).expect("open device"), mr_len, depth)
}

/// [`side`] on an open context (e.g. an rdma_cm id's, whose QPs the CM may bind).
pub fn side_on(ctx: Context, mr_len: usize, depth: u32) -> Side {
    side_of(ctx, QpType::Rc, mr_len, depth)
}

/// [`side_on`] with a QP of type `qp_type`.
pub fn side_of(ctx: Context, qp_type: QpType, mr_len: usize, depth: u32) -> Side {
    let pd = ctx.alloc_pd().expect("alloc pd");
    let access = AccessFlags(AccessFlags::ALL.bits() | AccessFlags::MW_BIND.bits());
    let mr = pd.alloc_mr(mr_len, access).expect("alloc mr");
    let cq = ctx.create_cq(2 * depth).expect("create cq");
    let qp = qp_on(&pd, &cq, qp_type, depth);
    Side {
        ctx,
        pd,
        qp,
        cq,
        mr,
    }
}

/// A QP of type `qp_type` in `pd` completing into `cq`, `depth` WRs deep each way,
/// 4 SGEs, 256 inline bytes (a [`Side`]'s QP; another one on the same PD and CQ).
pub fn qp_on(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    qp_type: QpType,
    depth: u32,
) -> QueuePair {
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    };
    pd.create_qp(&QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        cap,
        sq_sig_all: false,
    })
    .expect("create qp")
}

/// Two RC QPs on `a` and `b`, connected with path MTU `mtu`.
pub fn rc_pair(a: &NicProc, b: &NicProc, mtu: Mtu, mr_len: usize, depth: u32) -> (Side, Side) {
    rc_pair_with_timeout(a, b, mtu, mr_len, depth, 14)
}

/// [`rc_pair`] with local ACK timeout exponent `timeout` (4.096 µs × 2^timeout).
pub fn rc_pair_with_timeout(
    a: &NicProc,
    b: &NicProc,
    mtu: Mtu,
    mr_len: usize,
    depth: u32,
    timeout: u8,
) -> (Side, Side) {
    let mut x = side(a, mr_len, depth);
    let mut y = side(b, mr_len, depth);
    let psns = (0x10_0000, 0xFF_FFF0); // y wraps its PSN around 2^24
    connect_rc((&mut x.qp, a), (&mut y.qp, b), mtu, psns, timeout);
    (x, y)
}

/// Connects RC QP `x` on NIC `a` with RC QP `y` on NIC `b` (INIT, RTR, RTS), sending
/// from PSNs `psns`, with local ACK timeout exponent `timeout`.
pub fn connect_rc(
    (x, a): (&mut QueuePair, &NicProc),
    (y, b): (&mut QueuePair, &NicProc),
    mtu: Mtu,
    (psn_x, psn_y): (u32, u32),
    timeout: u8,
) {
    x.to_init(AccessFlags::ALL).expect("x init");
    y.to_init(AccessFlags::ALL).expect("y init");
    x.to_rtr(&b.endpoint(y.qp_num(), psn_y), mtu)
        .expect("x rtr");
    y.to_rtr(&a.endpoint(x.qp_num(), psn_x), mtu)
        .expect("y rtr");
    for (q, psn) in [(x, psn_x), (y, psn_y)] {
        to_rts(q, psn, timeout);
    }
}

/// Moves RC QP `q` from RTR to RTS, sending from PSN `psn`, with local ACK timeout
/// exponent `timeout`, 7 retries and RNR retries, one READ/atomic outstanding.
pub fn to_rts(q: &mut QueuePair, psn: u32, timeout: u8) {
    q.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(psn),
        timeout: Some(timeout),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..QpAttr::default()
    })
    .expect("rts");
}

/// Prints the counters that explain a throughput figure, for NIC `label`.
pub fn print_traffic_stats(label: &str, nic: &NicProc) {
    let s = nic.stats();
    let pick = |k: &str| s.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
    println!(
        "NIC {label}: tx_datagrams {} tx_gso_sends {} rx_datagrams {} loop passes {} (idle {}) sleeps {} (starved spins {}) retransmitted {} (early timeouts {}, charged {}) tx_drop_socket_full {}",
        pick("tx_datagrams"),
        pick("tx_gso_sends"),
        pick("rx_datagrams"),
        pick("loop_passes"),
        pick("loop_idle_passes"),
        pick("sleeps"),
        pick("spin_starved"),
        pick("qp_retransmitted_packets"),
        pick("qp_early_retransmits"),
        pick("qp_retransmit_timeouts"),
        pick("tx_drop_socket_full")
    );
}

/// Polls `cq` until one completion arrives (bounded by [`WAIT`]).
pub fn poll_one(cq: &mut CompletionQueue) -> WorkCompletion {
    let deadline = Instant::now() + WAIT;
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion within {WAIT:?}");
        // Yield: the NICs may need this core (tests run on 2 cores).
        std::thread::yield_now();
    }
}

/// Polls until `n` completions arrived.
pub fn poll_n(cq: &mut CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    (0..n).map(|_| poll_one(cq)).collect()
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Fills the ICRC of the RoCEv2 packet `buf` (BTH … ICRC) as a sender from `src` to
/// `dst` would: IPv4, DF, IPv4 ID 0.
pub fn fill_icrc_v4(buf: &mut [u8], src: std::net::SocketAddr, dst: std::net::SocketAddr) {
    use wire::icrc::{IcrcParams, IpParams};
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        panic!("IPv4 only here");
    };
    let params = IcrcParams {
        ip: IpParams::V4 {
            src: s,
            dst: d,
            id: 0,
            dont_fragment: true,
        },
        src_port: src.port(),
        dst_port: dst.port(),
    };
    params.fill(buf).expect("icrc");
}

/// The process id of the server of the Unix socket `s` is connected to (SO_PEERCRED:
/// the credentials the server had when it called listen(2)).
fn peer_pid(s: &UnixStream) -> Option<u32> {
    softnic::nic::control::peer_cred(s)
        .ok()
        .map(|c| c.pid as u32)
}

/// The IP address of a `--addr` argument (`fe80::2%sn0` names its interface after `%`).
fn ip_of(addr: &str) -> IpAddr {
    addr.split('%')
        .next()
        .unwrap_or(addr)
        .parse()
        .expect("address")
}

/// Reads `r` to its end on a thread of its own: a child's pipe read as the child
/// writes, so one that prints more than a pipe holds (a line per QP with many QPs)
/// never blocks on it while the test waits for something else.
pub fn read_in_background(
    mut r: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// A child process whose stdout and stderr are read as they come
/// ([`read_in_background`]), waited for at most a given time and killed by PID on drop
/// (also when the test fails): the one way the tests run a program that may print
/// much (a line per QP) or hang.
pub struct Running {
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Running {
    /// Starts `cmd` with its stdout and stderr piped (stdin as `cmd` says).
    pub fn spawn(cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().map(read_in_background);
        let err = child.stderr.take().map(read_in_background);
        Running {
            child: Some(child),
            out,
            err,
        }
    }

    /// Whether it has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("wait").is_some()
    }

    /// Waits at most `limit` for it to exit, else kills it by PID; its output, and
    /// whether it had to be killed.
    pub fn finish(mut self, limit: Duration) -> (std::process::Output, bool) {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + limit;
        let mut killed = false;
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                killed = true;
                break child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        let output = std::process::Output {
            status,
            stdout: join(self.out.take()),
            stderr: join(self.err.take()),
        };
        (output, killed)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
