//! Attack: a client changes the flags of the descriptors the NIC shares with it.
//!
//! The wake eventfd the NIC hands out at OpenDevice travels over `SCM_RIGHTS`, so the
//! client holds the NIC's own open file, and `O_NONBLOCK` is a flag of that file: the
//! client can clear it. The NIC drains every client's wake eventfd each time it wakes
//! from `poll(2)`; a blocking read of an empty one would hold the data plane forever
//! (no packet, no control request, not even SIGTERM would get through). The readiness
//! pipe of asynchronous events is handed out as a read end only, a separate open file
//! from the NIC's write end, and the client makes it blocking too. Each Stats request
//! below wakes the sleeping NIC and is answered within a bound, or the test fails.

mod nic_support;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::abi::control::{call, Reply, Request, Response};
use verbs_api::abi::{ABI_VERSION, DOORBELL_SEGMENT_LEN};
use verbs_api::os;

/// How long an answer may take before the NIC counts as hung.
const ANSWER: Duration = Duration::from_secs(5);

fn connect(nic: &NicProc) -> UnixStream {
    let s = UnixStream::connect(softnic_dir().join(format!("{}.sock", nic.name))).expect("connect");
    s.set_read_timeout(Some(ANSWER)).unwrap();
    s
}

/// Opens the device over a raw connection; returns it and the wake eventfd.
fn open(nic: &NicProc) -> (UnixStream, OwnedFd) {
    let sock = connect(nic);
    let req = Request::OpenDevice {
        abi_version: ABI_VERSION,
        pid: std::process::id(),
        program: "fd-flags".into(),
    };
    let db = os::memfd("fd-flags-doorbell", DOORBELL_SEGMENT_LEN).unwrap();
    match call(&sock, &req, &[db.as_fd()]).expect("OpenDevice") {
        (Response::Ok(Reply::Opened { .. }), mut fds) if fds.len() == 1 => {
            let wake = fds.pop().unwrap();
            (sock, wake)
        }
        other => panic!("OpenDevice: {other:?}"),
    }
}

/// The `sleeps` counter, over `ctl`; panics if the NIC does not answer within
/// [`ANSWER`].
fn sleeps(ctl: &UnixStream) -> u64 {
    match call(ctl, &Request::Stats, &[]).expect("the NIC did not answer Stats: hung") {
        (Response::Ok(Reply::Stats { counters }), _) => counters
            .into_iter()
            .find(|(k, _)| k == "sleeps")
            .map(|(_, v)| v)
            .expect("sleeps counter"),
        other => panic!("Stats: {other:?}"),
    }
}

#[test]
fn a_client_that_makes_its_shared_descriptors_blocking_cannot_hang_the_nic() {
    let nic = NicProc::start("atkfd", "127.0.0.1", 0, &[]);
    let ctl = connect(&nic);
    let (attacker, wake) = open(&nic);
    os::set_nonblocking(wake.as_fd(), false).unwrap();
    let pipe = match call(&attacker, &Request::AsyncEventChannel, &[]).expect("channel") {
        (Response::Ok(Reply::Done), mut fds) if fds.len() == 1 => fds.pop().unwrap(),
        other => panic!("AsyncEventChannel: {other:?}"),
    };
    os::set_nonblocking(pipe.as_fd(), false).unwrap();
    // Let the NIC fall asleep between requests, so that each one wakes it and it
    // drains the attacker's (empty, now blocking) wake eventfd.
    let first = sleeps(&ctl);
    let deadline = Instant::now() + WAIT;
    let mut last = first;
    while last < first + 5 {
        assert!(Instant::now() < deadline, "the NIC never slept");
        std::thread::sleep(Duration::from_millis(50));
        last = sleeps(&ctl);
    }
    // The attacker is still served, and so is a new client.
    assert!(matches!(
        call(&attacker, &Request::AllocPd, &[]),
        Ok((Response::Ok(Reply::Pd { .. }), _))
    ));
    let (_other, _) = open(&nic);
    assert!(sleeps(&ctl) >= last);
}
