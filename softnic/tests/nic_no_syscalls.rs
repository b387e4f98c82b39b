//! Issue 3's proof that posting work and polling completions make no system calls,
//! against two real `softnic run` NICs talking RoCEv2 over loopback.
//!
//! How: the parent test starts two NICs and re-executes this test binary as a child
//! client. The child connects an RC QP pair (QP x on NIC A, QP y on NIC B) with memory
//! regions, then hands both QPs and both CQs to a *dedicated thread* that installs a
//! seccomp filter and runs the whole data path: post RECVs on y, post signaled SENDs
//! and RDMA WRITEs on x, poll both CQs until every completion has arrived. The filter
//! kills the whole process (`SECCOMP_RET_KILL_PROCESS`, SIGSYS) on every system call
//! except `exit` — the raw thread exit with which the filtered thread ends, because
//! even ending a thread the normal way makes syscalls (futex, munmap, madvise). The
//! parent passes only if the child exits with status 0; verification of completions
//! and of the bytes that landed happens afterwards, on the unfiltered main thread.
//!
//! Why a thread and not the whole child process: seccomp filters are per thread (and
//! inherited by threads it creates later), so the filter covers exactly the data path
//! while the child's main thread may still sleep, read the clock and report. Why
//! KILL_PROCESS rather than KILL_THREAD: a killed thread would leave the process
//! running and the failure would look like a hang; killing the process makes the
//! parent see SIGSYS at once. Why only `exit` allowed: an `exit` in the middle of the
//! loop would end it before the "done" pointer is published, which the child reports
//! as a failure, so allowing it hides nothing.
//!
//! A poll that finds completions also notes it for hybrid polling
//! (`verbs_api::poll_idle`: a load and a store), under the filter like the rest; the
//! loop never calls `CompletionQueue::idle`, whose yield and sleep are syscalls by
//! design and happen only after empty polls.
//!
//! The NIC must not sleep during the loop: a sleeping NIC sets NEED_WAKEUP and the next
//! post writes the wake pipe — one legitimate syscall (contract seam 2). A NIC
//! spins only 100 µs after its last work, and on a loaded 2-core host the poster can
//! be descheduled for longer, so "traffic in flight" cannot keep it awake reliably.
//! The NICs therefore run with `--busy-poll` (never sleep, never set NEED_WAKEUP), and
//! the parent checks their `sleeps` counter is still 0 afterwards.
//!
//! Controls (each can only pass if the filter bites):
//! * `a_syscall_under_the_filter_kills_the_client`: the same loop makes one
//!   `getppid` half-way through; the child must die by SIGSYS.
//! * `a_post_while_the_nic_sleeps_is_caught`: NICs without `--busy-poll`; the main
//!   thread lets the NIC fall asleep before each single post; the post sees
//!   NEED_WAKEUP, writes the wake pipe and must die by SIGSYS.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

mod nic_support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nic_support::{pattern, softnic_dir, NicProc};
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu, ProtectionDomain,
    QpAttr, QpCap, QpEndpoint, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendWr, Sge,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Environment of the child: mode, then the two control-socket paths.
const MODE_ENV: &str = "SOFTNIC_NOSYSCALL_MODE";
const SOCK_A_ENV: &str = "SOFTNIC_NOSYSCALL_SOCK_A";
const SOCK_B_ENV: &str = "SOFTNIC_NOSYSCALL_SOCK_B";

/// Work requests in the filtered loop: even ones SEND, odd ones RDMA WRITE.
const OPS: usize = 2000;
/// Bytes reserved per request in both regions; request `i` carries `len(i)` of them.
const SLOT: usize = 256;
/// Queue depths (SQ, RQ; the CQs hold both queues' completions).
const DEPTH: u32 = 32;
/// Posts in the wake-up control: more than enough for one to find the NIC asleep.
const WAKE_ROUNDS: u32 = 20;
/// Longest a child may run; the parent kills it (by PID) after this.
const CHILD_LIMIT: Duration = Duration::from_secs(120);
/// Upper bound of passes through the filtered loop (it cannot read the clock: on some
/// hosts `clock_gettime` is a real syscall). The child's main thread gives up sooner.
const MAX_SPINS: u64 = 1 << 40;

/// Payload length of request `i`: 1..=SLOT, so short and full-slot messages both occur.
fn len(i: usize) -> usize {
    1 + (i * 37) % SLOT
}

/// Seed of request `i`'s bytes.
fn seed(i: usize) -> u8 {
    (i % 251) as u8
}

// ---------------------------------------------------------------------------------
// The seccomp filter.

/// `AUDIT_ARCH_*` of this target (linux/audit.h: EM_* | 64-bit | little-endian). The
/// filter checks it because syscall numbers are per architecture.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Installs, for the calling thread, "kill the process on any syscall but `exit`".
fn forbid_syscalls_but_exit() {
    // Offsets in struct seccomp_data: nr (i32) at 0, arch (u32) at 4.
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        /* 0 */ stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        /* 1 */ jeq(AUDIT_ARCH, 0, 3), // other arch: 5
        /* 2 */ stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        /* 3 */ jeq(libc::SYS_exit as u32, 0, 1), // not exit: 5
        /* 4 */ stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        /* 5 */ stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` points to a valid filter that outlives the call
    // (the kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &prog as *const libc::sock_fprog as libc::c_ulong,
                0,
                0
            ),
            0,
            "PR_SET_SECCOMP"
        );
    }
}

/// Ends the calling thread with the raw `exit` syscall (the one the filter allows):
/// no destructor, TLS teardown or stack unmapping runs, so nothing else is called.
fn exit_thread() -> ! {
    // SAFETY: ends only this thread; it owns nothing another thread waits for (the
    // handle was detached, the results were published before).
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("exit returned")
}

// ---------------------------------------------------------------------------------
// The child client.

/// What the filtered thread owns, and hands back when it is done: the queues (so the
/// main thread can destroy them normally) and every completion it polled.
struct DataPath {
    x_qp: QueuePair,
    x_cq: CompletionQueue,
    y_qp: QueuePair,
    y_cq: CompletionQueue,
    /// Source SGE of each request (slot `i` of x's region).
    send_sges: Vec<Sge>,
    /// Receive SGE of each SEND (slot `i` of y's region).
    recv_sges: Vec<Sge>,
    /// y's region address and rkey (target of the WRITEs).
    y_addr: u64,
    y_rkey: u32,
    /// Completions, preallocated so pushing never allocates (malloc may call mmap).
    x_wcs: Vec<WorkCompletion>,
    y_wcs: Vec<WorkCompletion>,
}

/// Set by the filtered thread when its loop finished (a leaked `Box<DataPath>`).
static FINISHED: AtomicPtr<DataPath> = AtomicPtr::new(std::ptr::null_mut());
/// Progress, for the report when the child gives up.
static POSTED: AtomicU32 = AtomicU32::new(0);
static COMPLETED: AtomicU32 = AtomicU32::new(0);
/// Wake-up control: rounds the main thread allowed / the filtered thread finished.
static GO: AtomicU32 = AtomicU32::new(0);
static ROUNDS_DONE: AtomicU32 = AtomicU32::new(0);
/// Why the filtered loop stopped early (an index into [`FAILURES`]). A verb error under
/// the filter is recorded, not unwrapped: a panic writes to stderr, which the filter
/// would turn into a misleading SIGSYS.
static FAILED: AtomicU32 = AtomicU32::new(0);
const FAILURES: [&str; 4] = [
    "none",
    "post_recv failed",
    "post_send failed",
    "poll failed",
];

/// The filtered loop: every request posted, every completion polled, no syscall.
/// `violate`: make one `getppid` half-way (negative control).
fn run_ops(d: &mut DataPath, violate: bool) {
    let sends = OPS.div_ceil(2);
    let mut wc = [WorkCompletion::default(); 16];
    let (mut posted, mut recvs_posted) = (0usize, 0usize);
    let mut spins = 0u64;
    while (d.x_wcs.len() < OPS || d.y_wcs.len() < sends) && spins < MAX_SPINS {
        spins += 1;
        // Keep the receive queue full ahead of the SENDs (SEND i is request 2i).
        while recvs_posted < sends && recvs_posted - d.y_wcs.len() < DEPTH as usize {
            let sge = [d.recv_sges[recvs_posted]];
            if d.y_qp
                .post_recv(&[RecvWr::new(recvs_posted as u64, &sge)])
                .is_err()
            {
                FAILED.store(1, Ordering::Relaxed);
                return;
            }
            recvs_posted += 1;
        }
        if posted < OPS && posted - d.x_wcs.len() < DEPTH as usize {
            // A SEND only once its receive is posted, so no RNR NAK slows the loop.
            if posted % 2 == 1 || posted / 2 < recvs_posted {
                let op = if posted % 2 == 0 {
                    WrOpcode::Send
                } else {
                    WrOpcode::RdmaWrite {
                        remote_addr: d.y_addr + (posted * SLOT) as u64,
                        rkey: d.y_rkey,
                    }
                };
                let sge = [d.send_sges[posted]];
                if d.x_qp
                    .post_send(&[SendWr::new(posted as u64, op, &sge).signaled()])
                    .is_err()
                {
                    FAILED.store(2, Ordering::Relaxed);
                    return;
                }
                posted += 1;
                POSTED.store(posted as u32, Ordering::Relaxed);
                if violate && posted == OPS / 2 {
                    // SAFETY: a harmless syscall, made on purpose to trip the filter.
                    unsafe { libc::syscall(libc::SYS_getppid) };
                }
            }
        }
        for (cq, out) in [(&mut d.x_cq, &mut d.x_wcs), (&mut d.y_cq, &mut d.y_wcs)] {
            let Ok(n) = cq.poll(&mut wc) else {
                FAILED.store(3, Ordering::Relaxed);
                return;
            };
            for w in &wc[..n] {
                // Within capacity (checked before the filter): no allocation.
                if out.len() < out.capacity() {
                    out.push(*w);
                }
            }
        }
        COMPLETED.store((d.x_wcs.len() + d.y_wcs.len()) as u32, Ordering::Relaxed);
        std::hint::spin_loop();
    }
}

/// Wake-up control: one RDMA WRITE per round, each posted only when the main thread
/// says so (after letting the NIC fall asleep).
fn run_paced(d: &mut DataPath) {
    let mut wc = [WorkCompletion::default(); 4];
    let mut spins = 0u64;
    for round in 0..WAKE_ROUNDS {
        while GO.load(Ordering::Acquire) <= round && spins < MAX_SPINS {
            spins += 1;
            std::hint::spin_loop();
        }
        let i = round as usize * 2 + 1;
        let op = WrOpcode::RdmaWrite {
            remote_addr: d.y_addr + (i * SLOT) as u64,
            rkey: d.y_rkey,
        };
        let sge = [d.send_sges[i]];
        if d.x_qp
            .post_send(&[SendWr::new(i as u64, op, &sge).signaled()])
            .is_err()
        {
            FAILED.store(2, Ordering::Relaxed);
            return;
        }
        while matches!(d.x_cq.poll(&mut wc), Ok(0)) && spins < MAX_SPINS {
            spins += 1;
            std::hint::spin_loop();
        }
        ROUNDS_DONE.store(round + 1, Ordering::Release);
    }
}

/// One side's objects (the QP and CQ go to the filtered thread).
struct Side {
    ctx: Context,
    /// Kept alive with its region and QP.
    _pd: ProtectionDomain,
    mr: MemoryRegion,
    qp: QueuePair,
    cq: CompletionQueue,
}

fn side(sock: &Path) -> Side {
    let ctx = Device::open_at(sock).expect("open device");
    let pd = ctx.alloc_pd().expect("alloc pd");
    let mr = pd.alloc_mr(OPS * SLOT, AccessFlags::ALL).expect("alloc mr");
    let cq = ctx.create_cq(2 * DEPTH).expect("create cq");
    let cap = QpCap {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
        })
        .expect("create qp");
    Side {
        ctx,
        _pd: pd,
        mr,
        qp,
        cq,
    }
}

fn endpoint(s: &Side, psn: u32) -> QpEndpoint {
    let a = s.ctx.attributes();
    QpEndpoint {
        lid: 0,
        qpn: s.qp.qp_num(),
        psn,
        gid: Gid::from_ip(a.addr),
        udp_port: a.port,
    }
}

/// Connects x and y (RC, path MTU 1024 so the longer messages are single packets and
/// PSNs still advance per request).
fn connect(x: &mut Side, y: &mut Side) {
    let (psn_x, psn_y) = (0x00_1000, 0xFF_FF00); // y's PSN wraps around 2^24
    x.qp.to_init(AccessFlags::ALL).expect("x init");
    y.qp.to_init(AccessFlags::ALL).expect("y init");
    let (ex, ey) = (endpoint(x, psn_x), endpoint(y, psn_y));
    x.qp.to_rtr(&ey, Mtu::Mtu1024).expect("x rtr");
    y.qp.to_rtr(&ex, Mtu::Mtu1024).expect("y rtr");
    for (s, psn) in [(&mut *x, psn_x), (&mut *y, psn_y)] {
        s.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        })
        .expect("rts");
    }
}

/// The child: set up, run the filtered thread, verify. Nothing unless the parent set
/// the mode.
#[test]
#[ignore = "child process of the no-syscall tests"]
fn no_syscall_child() {
    let Ok(mode) = std::env::var(MODE_ENV) else {
        return;
    };
    let sock = |k| PathBuf::from(std::env::var_os(k).expect("socket path"));
    let (mut x, mut y) = (side(&sock(SOCK_A_ENV)), side(&sock(SOCK_B_ENV)));
    connect(&mut x, &mut y);
    for i in 0..OPS {
        let p = pattern(len(i), seed(i));
        x.mr.write(i * SLOT, &p);
    }
    let data = Box::new(DataPath {
        send_sges: (0..OPS)
            .map(|i| x.mr.sge(i * SLOT, len(i) as u32))
            .collect(),
        // SEND i (request 2i) lands in slot 2i of y; a full slot, so an overrun would
        // show as bytes after len(2i).
        recv_sges: (0..OPS.div_ceil(2))
            .map(|k| y.mr.sge(2 * k * SLOT, SLOT as u32))
            .collect(),
        y_addr: y.mr.addr(),
        y_rkey: y.mr.rkey(),
        x_wcs: Vec::with_capacity(OPS),
        y_wcs: Vec::with_capacity(OPS),
        x_qp: x.qp,
        x_cq: x.cq,
        y_qp: y.qp,
        y_cq: y.cq,
    });
    let filtered = std::thread::spawn(move || {
        let mut d = data;
        forbid_syscalls_but_exit();
        match mode.as_str() {
            "wakeup" => run_paced(&mut d),
            m => run_ops(&mut d, m == "violate"),
        }
        FINISHED.store(Box::into_raw(d), Ordering::Release);
        exit_thread()
    });
    drop(filtered); // detached: it ends with a raw exit, so it is never joined

    let deadline = Instant::now() + CHILD_LIMIT - Duration::from_secs(20);
    if std::env::var(MODE_ENV).as_deref() == Ok("wakeup") {
        for round in 1..=WAKE_ROUNDS {
            // The NIC sleeps after 100 µs without work; 30 ms is ample even when loaded.
            std::thread::sleep(Duration::from_millis(30));
            GO.store(round, Ordering::Release);
            while ROUNDS_DONE.load(Ordering::Acquire) < round {
                assert!(Instant::now() < deadline, "wake-up round {round} stuck");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    let done = loop {
        let p = FINISHED.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published once by the filtered thread, which no longer runs.
            break unsafe { Box::from_raw(p) };
        }
        assert!(
            Instant::now() < deadline,
            "filtered loop stuck: {} posted, {} completions",
            POSTED.load(Ordering::Relaxed),
            COMPLETED.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    if std::env::var(MODE_ENV).as_deref() == Ok("wakeup") {
        // No post saw NEED_WAKEUP: the parent fails on exit status 0.
        println!("all {WAKE_ROUNDS} paced posts completed without a wake-up");
        return;
    }
    let failed = FAILED.load(Ordering::Relaxed);
    assert_eq!(
        failed, 0,
        "the filtered loop stopped: {}",
        FAILURES[failed as usize]
    );
    verify(&done, &x.mr, &y.mr);
    println!(
        "verified {} send-side and {} receive completions and their bytes",
        done.x_wcs.len(),
        done.y_wcs.len()
    );
}

/// Completions in order with the right opcode and length, bytes where they belong.
fn verify(d: &DataPath, x_mr: &MemoryRegion, y_mr: &MemoryRegion) {
    assert_eq!(d.x_wcs.len(), OPS, "send-side completions");
    for (i, w) in d.x_wcs.iter().enumerate() {
        assert_eq!(w.status, WcStatus::Success, "request {i}: {w:?}");
        assert_eq!(w.wr_id, i as u64, "RC completes in order: {w:?}");
        let want = if i % 2 == 0 {
            WcOpcode::Send
        } else {
            WcOpcode::RdmaWrite
        };
        assert_eq!(w.opcode, want, "request {i}");
    }
    assert_eq!(d.y_wcs.len(), OPS.div_ceil(2), "receive completions");
    for (k, w) in d.y_wcs.iter().enumerate() {
        assert_eq!(w.status, WcStatus::Success, "receive {k}: {w:?}");
        assert_eq!(w.wr_id, k as u64, "receives complete in order: {w:?}");
        assert_eq!(w.opcode, WcOpcode::Recv, "receive {k}");
        assert_eq!(w.byte_len as usize, len(2 * k), "receive {k}");
    }
    let (src, dst) = (x_mr.read_vec(0, x_mr.len()), y_mr.read_vec(0, y_mr.len()));
    for i in 0..OPS {
        let slot = i * SLOT..(i + 1) * SLOT;
        let (s, t) = (&src[slot.clone()], &dst[slot]);
        assert_eq!(&t[..len(i)], &pattern(len(i), seed(i))[..], "bytes of {i}");
        assert_eq!(&t[..len(i)], &s[..len(i)], "bytes of {i}");
        assert!(t[len(i)..].iter().all(|&b| b == 0), "request {i} overran");
    }
}

// ---------------------------------------------------------------------------------
// The parent tests.

/// Two NICs (with `extra` options) on kernel-chosen ports.
fn nics(tag: &str, extra: &[&str]) -> (NicProc, NicProc) {
    let a = NicProc::start(&format!("nosys-{tag}-a"), "127.0.0.41", 0, extra);
    let b = NicProc::start(&format!("nosys-{tag}-b"), "127.0.0.42", 0, extra);
    (a, b)
}

/// Runs the child client in `mode` against `a` and `b`; returns its status and
/// output. Bounded: killed by PID after [`CHILD_LIMIT`].
fn run_child(mode: &str, a: &NicProc, b: &NicProc) -> (ExitStatus, String) {
    let dir = softnic_dir();
    let out_path = dir.join(format!("child-{mode}.out"));
    let out = std::fs::File::create(&out_path).expect("child output file");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "no_syscall_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(MODE_ENV, mode)
        .env(SOCK_A_ENV, dir.join(format!("{}.sock", a.name)))
        .env(SOCK_B_ENV, dir.join(format!("{}.sock", b.name)))
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .spawn()
        .expect("spawn child client");
    let deadline = Instant::now() + CHILD_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait child") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill(); // by PID: our own child
            let _ = child.wait();
            panic!("child {mode} ran over {CHILD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    (status, out)
}

#[test]
fn post_and_poll_make_no_syscalls_against_real_nics() {
    let (a, b) = nics("ok", &["--busy-poll"]);
    let (st, out) = run_child("post", &a, &b);
    assert_eq!(
        st.code(),
        Some(0),
        "child status {st:?} (SIGSYS = a syscall on the data path):\n{out}"
    );
    assert!(
        out.contains(&format!("verified {OPS} send-side")) && out.contains("1 passed"),
        "the child did not verify:\n{out}"
    );
    // Busy-polling NICs never slept, so NEED_WAKEUP was never set during the loop.
    assert_eq!(a.stat("sleeps"), 0, "NIC A slept");
    assert_eq!(b.stat("sleeps"), 0, "NIC B slept");
    // No poller slept (the loop never idles: hybrid polling's sleep is a syscall by
    // design), so the NICs' CQ flushes only bumped the completion sequence and never
    // made their `futex_wake` either.
    assert_eq!(a.stat("poller_wakes"), 0, "NIC A woke a poller");
    assert_eq!(b.stat("poller_wakes"), 0, "NIC B woke a poller");
}

#[test]
fn a_syscall_under_the_filter_kills_the_client() {
    let (a, b) = nics("violate", &["--busy-poll"]);
    let (st, out) = run_child("violate", &a, &b);
    assert_eq!(
        st.signal(),
        Some(libc::SIGSYS),
        "child status {st:?}:\n{out}"
    );
}

#[test]
fn a_post_while_the_nic_sleeps_is_caught() {
    // Default NICs sleep when idle: each paced post finds NEED_WAKEUP set, so
    // post_send writes the wake pipe, which the filter must kill.
    let (a, b) = nics("wakeup", &[]);
    let (st, out) = run_child("wakeup", &a, &b);
    assert_eq!(
        st.signal(),
        Some(libc::SIGSYS),
        "child status {st:?}:\n{out}"
    );
    assert!(a.stat("sleeps") > 0, "NIC A never slept");
}
