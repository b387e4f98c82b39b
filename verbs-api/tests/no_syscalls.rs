//! Proof that the data path makes no syscalls: a thread installs a seccomp filter that
//! kills the whole process on *any* system call, then posts SENDs and polls their
//! completions many times against the mock NIC (which runs in another, unfiltered
//! thread and consumes the rings exactly as the NIC does while awake). The test runs in
//! a child process (this same test binary, re-executed) and passes only if the child
//! exits cleanly; a control run that makes one `getppid` under the filter must die by
//! SIGSYS, which shows the filter bites, and so must a run where the NIC has set
//! NEED_WAKEUP (the post then writes the wake eventfd: the one syscall allowed).

mod mock;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::abi::slots::{send_flags, wc_opcode};
use verbs_api::abi::Cqe;
use verbs_api::*;

const MODE_ENV: &str = "VERBS_NOSYSCALL_MODE";
const POSTS: u32 = 20_000;

/// Installs "kill the process on any syscall" for the calling thread only.
fn forbid_all_syscalls() {
    let filter = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_KILL_PROCESS,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` points to a valid one-instruction filter that
    // outlives the call (the kernel copies it).
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
            0
        );
    }
}

/// 0 = running, 1 = the filtered thread finished its loop.
static DONE: AtomicU32 = AtomicU32::new(0);

fn child(mode: &str) {
    let nic = mock::start("nosyscall");
    let ctx = Device::open("nosyscall").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 32,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let mut qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    qp.to_init(AccessFlags::NONE).unwrap();
    let remote = QpEndpoint {
        qpn: 0x99,
        gid: "::ffff:127.0.0.3".parse().unwrap(),
        ..QpEndpoint::default()
    };
    qp.to_rtr(&remote, Mtu::Mtu1024).unwrap();
    qp.to_rts(0).unwrap();

    // The "NIC" data path: take every SQ entry, complete the signaled ones.
    let dp_nic = nic.clone();
    std::thread::spawn(move || loop {
        let mut guard = dp_nic.lock().unwrap();
        let n = &mut *guard;
        let (_, sq, _) = &mut n.qps[0];
        let (_, cqp, _) = &mut n.cqs[0];
        let mut any = false;
        while let Some(w) = sq.pop().unwrap() {
            any = true;
            if w.flags & send_flags::SIGNALED != 0 {
                cqp.push(&Cqe {
                    wr_id: w.wr_id,
                    opcode: wc_opcode::SEND,
                    byte_len: w.sges[0].length,
                    qp_num: 0x11,
                    ..Cqe::default()
                })
                .unwrap();
            }
        }
        if any {
            sq.release();
            cqp.publish();
        }
        drop(guard);
        std::thread::yield_now();
    });

    let violate = mode == "violate";
    if mode == "wakeup" {
        // The NIC "sleeps": the first post must write the wake eventfd (a syscall).
        let n = nic.lock().unwrap();
        n.doorbell.as_ref().unwrap().set_need_wakeup();
    }
    let sge = [mr.sge(0, 64)];
    let poster = std::thread::spawn(move || {
        let keep = (&ctx, &pd, &mr);
        forbid_all_syscalls();
        if violate {
            // SAFETY: a harmless syscall, made on purpose to trip the filter.
            unsafe { libc::getppid() };
        }
        let mut wc = [WorkCompletion::default(); 16];
        let (mut posted, mut completed) = (0u32, 0u32);
        // Bounded by the mock's progress; the parent gives up after 60 s.
        while completed < POSTS {
            if posted < POSTS && posted - completed < 16 {
                // Every 4th request is signaled; the others complete silently.
                let signaled = posted % 4 == 3 || posted + 1 == POSTS;
                let mut wr = SendWr::new(u64::from(posted), WrOpcode::Send, &sge).inline();
                if signaled {
                    wr = wr.signaled();
                }
                if qp.post_send(&[wr]).is_ok() {
                    posted += 1;
                }
            }
            let n = cq.poll(&mut wc).unwrap_or(0);
            for w in &wc[..n] {
                // A signaled completion retires every earlier unsignaled request.
                completed = w.wr_id as u32 + 1;
            }
            std::hint::spin_loop();
        }
        let _ = keep;
        DONE.store(1, Ordering::Release);
        // Exiting a thread makes syscalls: park in a spin until the process exits.
        loop {
            std::hint::spin_loop();
        }
    });
    drop(poster);
    let t = Instant::now();
    while DONE.load(Ordering::Acquire) == 0 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let code = if DONE.load(Ordering::Acquire) == 1 {
        0
    } else {
        3
    };
    let _ = Arc::strong_count(&nic);
    std::process::exit(code);
}

/// The child side; a no-op unless started by the parent tests below.
#[test]
fn no_syscall_child() {
    if let Ok(mode) = std::env::var(MODE_ENV) {
        child(&mode);
    }
}

fn run_child(mode: &str) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "no_syscall_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(MODE_ENV, mode)
        .status()
        .unwrap()
}

#[test]
fn post_and_poll_make_no_syscalls() {
    let st = run_child("post");
    assert_eq!(
        st.code(),
        Some(0),
        "child status {st:?} (SIGSYS = a syscall on the data path)"
    );
}

#[test]
fn a_post_while_the_nic_sleeps_is_caught() {
    // NEED_WAKEUP set: post_send writes the eventfd, and the filter must see it.
    let st = run_child("wakeup");
    assert_eq!(st.signal(), Some(libc::SIGSYS), "child status {st:?}");
}

#[test]
fn the_filter_kills_on_a_syscall() {
    let st = run_child("violate");
    assert_eq!(st.signal(), Some(libc::SIGSYS), "child status {st:?}");
}
