//! Attack: a client changes the flags of the descriptors the NIC shares with it.
//!
//! The wake descriptor the NIC hands out at OpenDevice travels over `SCM_RIGHTS`, and
//! `O_NONBLOCK` is a flag of the open file, which the client can clear. The NIC drains
//! every client's wake-up each time it wakes from `poll(2)`; a blocking read of an
//! empty one would hold the data plane forever (no packet, no control request, not
//! even SIGTERM would get through). It used to be an eventfd, one open file that the
//! NIC read and the client held, so only `RWF_NOWAIT` kept that read from blocking,
//! and on a kernel refusing the flag for eventfds the NIC fell back to a plain `read`.
//! It is now one end of a UNIX datagram socket pair whose other end only the NIC
//! holds (`os::WakePipe`; a pipe until session 19, whose write raised SIGPIPE in a
//! client whose NIC had died): the client can change neither the NIC's end's flags nor,
//! by shutting its own socket down, put the NIC's end at end of file (readable for
//! good, so that the NIC would never sleep), on any kernel. The readiness
//! pipe of asynchronous events is handed out as a read end only, a separate open file
//! from the NIC's write end, and the client makes it blocking too. Each Stats request
//! below wakes the sleeping NIC and is answered within a bound, or the test fails.
//!
//! A CQ's event descriptor: it used to be an eventfd the NIC made and shared with the
//! client, which the NIC wrote with a plain `write(2)` when it completed into the armed
//! CQ. A client that set its counter to 2^64 − 2 and cleared `O_NONBLOCK` made that
//! write block: the NIC stopped for every client (eventfd ignores `RWF_NOWAIT` on
//! writes). It is now the read end of a pipe; the attacker of
//! `a_client_that_maxes_its_cq_event_descriptor_cannot_hang_the_nic` tries the same and
//! then fills the pipe by arming and completing past its capacity.
//!
//! A CM event channel: `AttachChannel` took any descriptor from the client and the NIC
//! wrote 8 bytes to it per event, so a full blocking pipe (or a blocking eventfd near
//! its maximum) sent as the channel held the NIC at the first event. The request is
//! refused now; a channel is a pipe the NIC makes (`OpenChannel`), and
//! `a_client_that_blocks_its_cm_event_channel_cannot_hang_the_nic` fills that pipe
//! through a write end of its own and makes its read end blocking before an event.

mod nic_support;

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::abi::control::cm::{CmReply, CmRequest};
use verbs_api::abi::control::{call, Handle, Reply, Request, Response};
use verbs_api::abi::{ABI_VERSION, DOORBELL_SEGMENT_LEN};
use verbs_api::cm::{CmId, ConnParam, EventChannel, PortSpace, RDMA_PS_TCP};
use verbs_api::os;
use verbs_api::{Mtu, SendWr, WcStatus, WrOpcode};

/// How long an answer may take before the NIC counts as hung.
const ANSWER: Duration = Duration::from_secs(5);

fn connect(nic: &NicProc) -> UnixStream {
    let s = UnixStream::connect(softnic_dir().join(format!("{}.sock", nic.name))).expect("connect");
    s.set_read_timeout(Some(ANSWER)).unwrap();
    s
}

/// Opens the device over a raw connection; returns it and the wake descriptor.
fn open(nic: &NicProc) -> (UnixStream, OwnedFd) {
    let sock = connect(nic);
    let req = Request::OpenDevice {
        abi_version: ABI_VERSION,
        pid: std::process::id(),
        program: "fd-flags".into(),
    };
    let db = os::memfd("fd-flags-doorbell", DOORBELL_SEGMENT_LEN).unwrap();
    match call(&sock, &req, &[db.as_fd()]).expect("OpenDevice") {
        (Response::Ok(Reply::Opened { .. }), mut fds) if fds.len() == 2 => {
            let wake = fds.swap_remove(0);
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
    // Its own socket shut down both ways: the NIC's end must not read as end of file.
    // SAFETY: shutdown(2) of a socket this test holds; no memory is passed.
    let shut = unsafe { libc::shutdown(wake.as_raw_fd(), libc::SHUT_RDWR) };
    assert_eq!(shut, 0);
    let pipe = match call(&attacker, &Request::AsyncEventChannel, &[]).expect("channel") {
        (Response::Ok(Reply::Done), mut fds) if fds.len() == 1 => fds.pop().unwrap(),
        other => panic!("AsyncEventChannel: {other:?}"),
    };
    os::set_nonblocking(pipe.as_fd(), false).unwrap();
    // Let the NIC fall asleep between requests, so that each one wakes it and it
    // drains the attacker's (empty) wake pipe.
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

/// A connected RC pair between `a` and `b`, never dropped on a panic: dropping a verbs
/// object asks its NIC to destroy it and waits for the answer, and a hung NIC (the
/// failure these tests look for) would then hang the test instead of failing it.
fn pair(a: &NicProc, b: &NicProc) -> (ManuallyDrop<Side>, ManuallyDrop<Side>) {
    let (x, y) = rc_pair(a, b, Mtu::Mtu1024, 4096, 16);
    (ManuallyDrop::new(x), ManuallyDrop::new(y))
}

/// The victim's RC pair: its WRITEs go from `.0` to `.1`.
struct Victim(ManuallyDrop<Side>, ManuallyDrop<Side>);

/// Two NICs, a control connection to the first (for [`sleeps`]), and a victim pair
/// between them whose traffic must keep flowing whatever an attacker on the first NIC
/// does.
fn arena(tag: &str) -> (NicProc, NicProc, UnixStream, Victim) {
    let (a, b) = NicProc::pair(tag);
    let ctl = connect(&a);
    let (x, y) = pair(&a, &b);
    (a, b, ctl, Victim(x, y))
}

impl Victim {
    /// One WRITE of the victim's, which must complete.
    fn write(&mut self, wr_id: u64) {
        write_once(&mut self.0, &self.1, wr_id);
    }
}

/// One signaled 8-byte RDMA WRITE from `x` into `y`'s region, polled to completion.
fn write_once(x: &mut Side, y: &Side, wr_id: u64) {
    let sge = [x.mr.sge(0, 8)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(wr_id, op, &sge).signaled()])
        .expect("post write");
    let c = poll_one(&mut x.cq);
    assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::Success), "{c:?}");
}

#[test]
fn a_client_that_maxes_its_cq_event_descriptor_cannot_hang_the_nic() {
    let (a, b, ctl, mut victim) = arena("atkcq");
    let (mut attacker, attacker_peer) = pair(&a, &b);
    let ev = attacker.cq.event_fd().as_raw_fd();
    // What used to stop the NIC: the counter one below its maximum (an eventfd's write
    // of 1 then blocks), and the shared open file made blocking. The CQ's descriptor is
    // a pipe's read end now: the write fails (EBADF), and the attacker shrinks the
    // pipe to one page instead, so that it fills after 4096 wake-ups.
    let max: u64 = 0xffff_ffff_ffff_fffe;
    // SAFETY: writes 8 bytes from a live u64 to a descriptor this test owns.
    let maxed = unsafe { libc::write(ev, (&max as *const u64).cast(), 8) } == 8;
    // SAFETY: fcntl on a descriptor this test owns; no memory is passed.
    let shrunk = unsafe { libc::fcntl(ev, libc::F_SETPIPE_SZ, 4096) } == 4096;
    assert!(
        maxed || shrunk,
        "neither a maxed eventfd nor a one-page pipe"
    );
    os::set_nonblocking(attacker.cq.event_fd(), false).unwrap();
    // One armed completion: the NIC publishes the CQE, then writes the descriptor.
    assert!(attacker.cq.arm().unwrap(), "nothing waiting yet");
    write_once(&mut attacker, &attacker_peer, 1);
    sleeps(&ctl); // the old NIC hung in that write: no answer
                  // Past the pipe's capacity: every later write finds it full and is skipped.
    const ROUNDS: u64 = 4096 + 256;
    for i in 2..=ROUNDS {
        assert!(attacker.cq.arm().unwrap());
        write_once(&mut attacker, &attacker_peer, i);
    }
    sleeps(&ctl);
    // Another client's traffic still completes.
    for i in 0..16 {
        victim.write(100 + i);
    }
    os::set_nonblocking(attacker.cq.event_fd(), true).unwrap();
    let held = os::pipe_take(attacker.cq.event_fd()).unwrap();
    assert!(
        held.is_some_and(|n| (1..ROUNDS as usize).contains(&n)),
        "{held:?} bytes in the attacker's pipe after {ROUNDS} wake-ups: full, then skipped"
    );
}

/// A pipe made full and blocking at both ends: (read end, write end).
fn full_blocking_pipe() -> (OwnedFd, OwnedFd) {
    let (r, w) = os::pipe().unwrap();
    fill(&r, &w);
    (r, w)
}

/// Shrinks the pipe of `r` to one page, fills it through `w`, and clears `O_NONBLOCK`
/// on both ends.
fn fill(r: &OwnedFd, w: &OwnedFd) {
    // SAFETY: fcntl on a descriptor this test owns; no memory is passed.
    let size = unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert_eq!(size, 4096);
    let page = [0u8; 4096];
    // SAFETY: writes from a live buffer to a non-blocking pipe this test owns.
    let n = unsafe { libc::write(w.as_raw_fd(), page.as_ptr().cast(), page.len()) };
    assert_eq!(n, 4096);
    // SAFETY: as above; the pipe is full.
    let n = unsafe { libc::write(w.as_raw_fd(), page.as_ptr().cast(), 1) };
    assert_eq!(n, -1, "full");
    os::set_nonblocking(r.as_fd(), false).unwrap();
    os::set_nonblocking(w.as_fd(), false).unwrap();
}

fn cm(
    sock: &UnixStream,
    req: CmRequest,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (Response, Vec<OwnedFd>) {
    call(sock, &Request::Cm(req), fds).expect("CM request answered")
}

/// The attacker's CM channel, as blocking and full as it can make it; returns its
/// handle and the descriptors to keep open.
fn hostile_channel(sock: &UnixStream) -> (Handle, Vec<OwnedFd>) {
    // The old request: the NIC would write to the descriptor sent, here the write end
    // of a full blocking pipe.
    let (r, w) = full_blocking_pipe();
    match cm(sock, CmRequest::AttachChannel, &[w.as_fd()]) {
        (Response::Ok(Reply::Cm(CmReply::Channel { channel })), _) => return (channel, vec![r, w]),
        (Response::Err { message, .. }, _) => assert!(message.contains("OpenChannel"), "{message}"),
        other => panic!("AttachChannel: {other:?}"),
    }
    let (channel, read) = match cm(sock, CmRequest::OpenChannel, &[]) {
        (Response::Ok(Reply::Cm(CmReply::Channel { channel })), mut fds) if fds.len() == 1 => {
            (channel, fds.pop().unwrap())
        }
        other => panic!("OpenChannel: {other:?}"),
    };
    // A write end of the attacker's own (`/proc/self/fd/N` opened for writing is a new
    // open file of the same pipe), to fill the pipe and make it blocking.
    let write: OwnedFd = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", read.as_raw_fd()))
        .expect("a write end of the event pipe")
        .into();
    fill(&read, &write);
    (channel, vec![read, write])
}

#[test]
fn a_client_that_blocks_its_cm_event_channel_cannot_hang_the_nic() {
    let (a, b, ctl, mut victim) = arena("atkcm");
    let (attacker, _wake) = open(&a);
    let (channel, _keep) = hostile_channel(&attacker);
    let id = match cm(&attacker, CmRequest::CreateId { channel }, &[]) {
        (Response::Ok(Reply::Cm(CmReply::Id { id })), _) => id,
        other => panic!("CreateId: {other:?}"),
    };
    let listen = CmRequest::Listen {
        id,
        port_space: RDMA_PS_TCP,
        port: 0,
        backlog: 4,
        qp_type: verbs_api::QpType::Rc,
    };
    let port = match cm(&attacker, listen, &[]) {
        (Response::Ok(Reply::Cm(CmReply::Port { port })), _) => port,
        other => panic!("Listen: {other:?}"),
    };
    // A connection request for the attacker's listener: an event on its channel.
    // Never dropped, as `pair`'s sides: its NIC may be the hung one (both NICs are on
    // 127.0.0.1, and the id binds to the first).
    let ch = ManuallyDrop::new(EventChannel::new().unwrap());
    let mut cid = ManuallyDrop::new(CmId::new(&ch, PortSpace::Tcp).unwrap());
    let dst = std::net::SocketAddr::new(a.addr, port);
    cid.resolve_addr(
        Some(std::net::SocketAddr::new(b.addr, 0)),
        dst,
        Some(a.port),
        WAIT,
    )
    .unwrap();
    cid.resolve_route(WAIT).unwrap();
    let mut c = ManuallyDrop::new(side_on(cid.context().unwrap().clone(), 4096, 4));
    cid.init_qp(&mut c.qp).unwrap();
    cid.connect(&c.qp, &ConnParam::default()).unwrap();
    // The event is queued, and the NIC still answers.
    let deadline = Instant::now() + WAIT;
    loop {
        sleeps(&ctl); // the old NIC hung writing the full pipe: no answer
        match cm(&attacker, CmRequest::GetEvents { channel }, &[]) {
            (Response::Ok(Reply::Cm(CmReply::Events(v))), _) if v.is_empty() => {}
            (Response::Ok(Reply::Cm(CmReply::Events(v))), _) => {
                assert_eq!(v[0].kind, 4, "CONNECT_REQUEST: {v:?}");
                break;
            }
            other => panic!("GetEvents: {other:?}"),
        }
        assert!(Instant::now() < deadline, "no CONNECT_REQUEST");
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..16 {
        victim.write(200 + i);
    }
    sleeps(&ctl);
}
