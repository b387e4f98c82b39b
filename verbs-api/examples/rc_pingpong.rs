//! `ibv_rc_pingpong` on softnic: the same flags, the same exchange over TCP (so it can
//! face the C program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example rc_pingpong -- -d nic0 -g 1            # server
//! cargo run --release --example rc_pingpong -- -d nic1 -g 1 127.0.0.1  # client
//! ```
//!
//! Differences from the C program: the GID index defaults to 0 (softnic has one GID and
//! RoCE needs it); `-o`/`-t` are refused; `-P` gives the peer NIC's UDP port when it is
//! not 4791. `-c` is rdma-core's check, so it pairs with a stock `ibv_rc_pingpong -c`:
//! the sender sets the first byte of every 4 KiB page to `page % sizeof(char)` (that is,
//! 0) in a buffer otherwise filled with 0x7b, and the receiver checks those bytes.
//! `--chk-all` (a softnic extension, for two softnic peers) checks every byte against a
//! per-message pattern instead.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use verbs_api::oob;
use verbs_api::*;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

#[derive(Parser, Debug)]
#[command(about = "RC ping-pong over softnic (ibv_rc_pingpong's flags and output)")]
struct Args {
    /// listen on/connect to port <port>
    #[arg(short = 'p', long = "port", default_value_t = oob::DEFAULT_PORT)]
    port: u16,
    /// use device <dev> (default first device found)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// use port <port> of the device (softnic has port 1)
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// service level value (accepted, unused: softnic has no SL-to-priority map)
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// local port gid index
    #[arg(short = 'g', long = "gid-idx", default_value_t = 1)]
    gid_idx: u32,
    /// validate received buffers (rdma-core's check: first byte of each page)
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// validate every byte against a per-message pattern (softnic extension; both
    /// peers must use it)
    #[arg(long = "chk-all")]
    chk_all: bool,
    /// use on demand paging (not supported)
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    /// get CQE with timestamp (not supported)
    #[arg(short = 't', long = "ts")]
    ts: bool,
    /// UDP port of the peer's NIC (softnic extension; default 4791)
    #[arg(short = 'P', long = "remote-udp-port", default_value_t = 0)]
    remote_udp_port: u16,
    /// server to connect to (none: be the server)
    host: Option<String>,
}

/// The byte at offset `j` of message `k` with `--chk-all`.
fn pattern(k: u32, j: usize) -> u8 {
    (j as u32).wrapping_mul(31).wrapping_add(k) as u8
}

/// rdma-core's validation page size (`sysconf(_SC_PAGESIZE)` on x86-64).
const CHECK_PAGE: usize = 4096;

/// What `-c` / `--chk-all` validate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// No validation.
    Off,
    /// rdma-core's `-c`: byte 0 of each page is `page % sizeof(char)`, i.e. 0.
    Pages,
    /// Every byte follows `pattern`.
    Full,
}
struct Pingpong {
    qp: QueuePair,
    mr: MemoryRegion,
    size: u32,
    rx_depth: u32,
    inline: bool,
    chk: Check,
}

impl Pingpong {
    fn post_recv(&mut self, n: u32) -> u32 {
        let sge = [self.mr.sge(0, self.size)];
        for i in 0..n {
            if self.qp.post_recv(&[RecvWr::new(RECV_WRID, &sge)]).is_err() {
                return i;
            }
        }
        n
    }

    fn post_send(&mut self, k: u32) -> Result<()> {
        let n = self.size as usize;
        match self.chk {
            Check::Off => {}
            Check::Pages => {
                for j in (0..n).step_by(CHECK_PAGE) {
                    self.mr.write(j, &[0]);
                }
            }
            Check::Full => {
                let bytes: Vec<u8> = (0..n).map(|j| pattern(k, j)).collect();
                self.mr.write(0, &bytes);
            }
        }
        let sge = [self.mr.sge(0, self.size)];
        let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, &sge).signaled();
        if self.inline {
            wr = wr.inline();
        }
        self.qp.post_send(&[wr])
    }

    fn check(&self, k: u32) -> std::result::Result<(), String> {
        let expect = |j: usize| match self.chk {
            Check::Full => Some(pattern(k, j)),
            Check::Pages if j.is_multiple_of(CHECK_PAGE) => Some(0),
            _ => None,
        };
        let got = self.mr.read_vec(0, self.size as usize);
        match got
            .iter()
            .enumerate()
            .find(|(j, b)| expect(*j).is_some_and(|e| **b != e))
        {
            None => Ok(()),
            Some((j, b)) => Err(format!(
                "invalid data in page {} (byte {j}: {b:#04x}, expected {:#04x}) of message {k}",
                j / CHECK_PAGE,
                expect(j).unwrap_or_default()
            )),
        }
    }
}

fn run(args: Args) -> std::result::Result<(), String> {
    if args.odp || args.ts {
        return Err(
            "-o (on-demand paging) and -t (timestamps) are not supported by softnic".into(),
        );
    }
    if args.ib_port != 1 {
        return Err(format!("softnic has port 1 only (got -i {})", args.ib_port));
    }
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    if args.rx_depth == 0 || args.iters == 0 {
        return Err("rx-depth and iters must be at least 1".into());
    }
    let name = match args.ib_dev {
        Some(d) => d,
        None => Device::list()
            .map_err(|e| e.to_string())?
            .first()
            .map(|d| d.name().to_string())
            .ok_or("No IB devices found")?,
    };
    let ctx = Device::open(&name).map_err(|e| format!("Couldn't get context for {name}: {e}"))?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mut mr = pd
        .alloc_mr(args.size.max(1) as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    mr.fill(0, mr.len(), 0x7b);
    let mut cq = ctx
        .create_cq(args.rx_depth + 1)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let max_inline = ctx.attributes().max_inline;
    let inline = args.size > 0 && args.size <= max_inline;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: args.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: if inline { args.size } else { 0 },
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
        })
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    let mut pp = Pingpong {
        qp,
        mr,
        size: args.size,
        rx_depth: args.rx_depth,
        inline,
        chk: if args.chk_all {
            Check::Full
        } else if args.chk {
            Check::Pages
        } else {
            Check::Off
        },
    };
    pp.qp
        .to_init(AccessFlags::NONE)
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    let mut routs = pp.post_recv(pp.rx_depth);
    if routs < pp.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let gid = ctx
        .query_gid(args.gid_idx)
        .map_err(|e| format!("can't read sgid of index {}: {e}", args.gid_idx))?;
    let my = QpEndpoint {
        lid: 0,
        qpn: pp.qp.qp_num(),
        psn: random_psn(),
        gid,
        udp_port: 0,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my.lid, my.qpn, my.psn, my.gid
    );
    let connect = |qp: &mut QueuePair, rem: &QpEndpoint| -> std::result::Result<(), String> {
        let rem = QpEndpoint {
            udp_port: args.remote_udp_port,
            ..*rem
        };
        qp.to_rtr(&rem, mtu)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.to_rts(my.psn)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    };
    let rem = match &args.host {
        Some(host) => {
            let (mut s, rem) = oob::client_connect(host, args.port, &my)
                .map_err(|e| format!("Couldn't connect to {host}:{}: {e}", args.port))?;
            oob::write_done(&mut s).map_err(|e| e.to_string())?;
            rem
        }
        None => oob::server_accept(args.port, &my, |rem| connect(&mut pp.qp, rem))
            .map_err(|e| e.to_string())?,
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid, rem.qpn, rem.psn, rem.gid
    );
    if args.host.is_some() {
        connect(&mut pp.qp, &rem)?;
    }

    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    if args.host.is_some() {
        pp.post_send(0)
            .map_err(|e| format!("Couldn't post send: {e}"))?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        if args.events {
            cq.wait(None)
                .map_err(|e| format!("Failed to get cq_event: {e}"))?;
        }
        // Busy-poll as the C program does; bounded by the NIC making progress (a
        // failed peer surfaces as an error completion after retries). After a while
        // without a completion, yield the CPU: two pingpongs and two NICs on a 2-core
        // machine otherwise wait for the scheduler's time slice on every message.
        let mut spins = 0u32;
        let ne = loop {
            let ne = cq
                .poll(&mut wc)
                .map_err(|e| format!("poll CQ failed: {e}"))?;
            if ne > 0 || args.events {
                break ne;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        };
        for w in &wc[..ne] {
            if !w.status.is_success() {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    w.status,
                    w.status.raw(),
                    w.wr_id
                ));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if pp.chk != Check::Off {
                        pp.check(rcnt)?;
                    }
                    routs -= 1;
                    if routs <= 1 {
                        routs += pp.post_recv(pp.rx_depth - routs);
                        if routs < pp.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !w.wr_id;
            if scnt < args.iters && pending == 0 {
                pp.post_send(scnt)
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = u64::from(args.size) * u64::from(args.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / f64::from(args.iters)
    );
    Ok(())
}

/// A random 24-bit PSN (`lrand48() & 0xffffff` in the C program), from the standard
/// library's per-process random hash keys.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() & 0xff_ffff) as u32
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
