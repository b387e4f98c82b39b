//! A client killed (SIGKILL) in the middle of a transfer does not crash the NICs, its
//! objects are destroyed, and another client keeps working.

mod nic_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{Mtu, SendWr, WcOpcode, WcStatus, WrOpcode};

const CHILD_ENV: &str = "SOFTNIC_NICTEST_CHILD";

/// The child: connects a pair of QPs across the two NICs named in the environment and
/// WRITEs 64 KiB messages until it is killed (or 60 s pass, so it can never outlive a
/// failed parent for long). Does nothing when run directly.
#[test]
#[ignore = "child process of killed_client_does_not_hurt_the_nic"]
fn child_client_writing_forever() {
    let Ok(names) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut it = names.split(',');
    let mut next = || it.next().expect("child spec");
    let (na, aa, pa, nb, ab, pb) = (next(), next(), next(), next(), next(), next());
    let (pa, pb) = (pa.parse().expect("port"), pb.parse().expect("port"));
    let a = NicProc::attach(na, aa, pa);
    let b = NicProc::attach(nb, ab, pb);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 1 << 20, 64);
    let sge = [x.mr.sge(0, 64 << 10)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done = 0u64;
    while Instant::now() < deadline {
        x.qp.post_send(&[SendWr::new(done, op, &sge).signaled()])
            .expect("post");
        let c = poll_one(&mut x.cq);
        assert_eq!(c.status, WcStatus::Success);
        done += 1;
        if done == 4 {
            println!("READY");
        }
    }
}

#[test]
fn killed_client_does_not_hurt_the_nic() {
    let a = NicProc::start("crash-a", "127.0.0.6", 0, &[]);
    let b = NicProc::start("crash-b", "127.0.0.7", 0, &[]);
    // A bystander client, connected before the crash.
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 1 << 16, 16);

    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_client_writing_forever",
            "--ignored",
            "--nocapture",
        ])
        .env(
            CHILD_ENV,
            format!("crash-a,127.0.0.6,{},crash-b,127.0.0.7,{}", a.port, b.port),
        )
        .env(CHILD_DIR_ENV, softnic_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child client");
    let pid = child.id();
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("READY") {
                let _ = tx.send(());
                return;
            }
        }
    });
    let ready = rx.recv_timeout(WAIT);
    // Kill it mid-transfer (it is writing continuously), by PID, whatever happened.
    // SAFETY: kill(2) on the PID of the child spawned above, not yet reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let status = child.wait().expect("wait child");
    assert!(ready.is_ok(), "child client never got going ({status})");

    // Both NICs notice and clean up; they keep running.
    let deadline = Instant::now() + WAIT;
    while a.stat("clients_closed") < 1 || b.stat("clients_closed") < 1 {
        assert!(
            Instant::now() < deadline,
            "NICs did not clean up the dead client"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.stat("qps"), 1, "only the bystander's QP is left on NIC a");
    assert_eq!(b.stat("qps"), 1);
    assert_eq!(a.stat("mrs"), 1);
    let mut nics = [a, b];
    assert!(nics.iter_mut().all(|n| n.is_running()));

    // The bystander still works.
    for i in 0..10u64 {
        let data = pattern(4000, i as u8);
        x.mr.write(0, &data);
        let sge = [x.mr.sge(0, 4000)];
        let op = WrOpcode::RdmaWrite {
            remote_addr: y.mr.addr(),
            rkey: y.mr.rkey(),
        };
        x.qp.post_send(&[SendWr::new(i, op, &sge).signaled()])
            .expect("post");
        let c = poll_one(&mut x.cq);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (i, WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert!(y.mr.read_vec(0, 4000) == data[..]);
    }
    let _ = &mut y;
}
