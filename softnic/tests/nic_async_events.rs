//! QP affiliated asynchronous events between two NICs (IBTA 11.6.3), as a program sees
//! them through `Context::poll_async_events` (the C library's `ibv_get_async_event`):
//! COMM_EST when an RC or UC QP still in RTR receives its first packet; the error event
//! that says why an RC responder entered ERR — QP_ACCESS_ERR for a bad R_Key,
//! QP_REQ_ERR for a SEND longer than the receive buffer — each once, on the
//! responder's context only (the requester learns of the failure from its completion;
//! a UC QP drops a bad message and raises nothing); and QP_FATAL when a QP's CQ
//! overruns (its completions still all arrive). The readiness pipe
//! (`Context::async_event_channel`) is written when a context's first event is waiting,
//! not again until it has been taken, and one GetAsyncEvents takes it.

mod nic_support;

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{
    os, AccessFlags, AsyncEvent, Context, Device, Mtu, QpCap, QpInitAttr, QpType, RecvWr, SendWr,
    WcStatus, WrOpcode,
};

/// The events `ctx` has, waiting (bounded) until there is at least one.
fn events(ctx: &Context) -> Vec<AsyncEvent> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ev = ctx.poll_async_events().expect("poll_async_events");
        if !ev.is_empty() || Instant::now() > deadline {
            return ev;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `ctx` has no event waiting now (asked once, not waited for).
fn none_waiting(ctx: &Context) -> bool {
    ctx.poll_async_events()
        .expect("poll_async_events")
        .is_empty()
}

/// Whether the readiness pipe becomes readable within `t`.
fn readable(pipe: &OwnedFd, t: Duration) -> bool {
    os::wait_readable(pipe.as_fd(), Some(t)).expect("poll")
}

fn send(x: &mut Side, wr_id: u64, len: u32) -> WcStatus {
    let sge = [x.mr.sge(0, len)];
    x.qp.post_send(&[SendWr::new(wr_id, WrOpcode::Send, &sge).signaled()])
        .expect("post send");
    poll_one(&mut x.cq).status
}

/// A pair of `qp_type` QPs on `a` and `b` where x goes to RTS but y stays in RTR: it
/// can receive but has not been told the connection is up (as a CM passive side
/// before the RTU).
fn pair_with_y_in_rtr(a: &NicProc, b: &NicProc, qp_type: QpType) -> (Side, Side) {
    let mut x = side_of(Device::open(&a.name).expect("open"), qp_type, 4096, 8);
    let mut y = side_of(Device::open(&b.name).expect("open"), qp_type, 4096, 8);
    x.qp.to_init(AccessFlags::ALL).expect("x init");
    y.qp.to_init(AccessFlags::ALL).expect("y init");
    x.qp.to_rtr(&b.endpoint(y.qp.qp_num(), 0x200), Mtu::Mtu1024)
        .expect("x rtr");
    y.qp.to_rtr(&a.endpoint(x.qp.qp_num(), 0x100), Mtu::Mtu1024)
        .expect("y rtr");
    x.qp.to_rts(0x100).expect("x rts");
    assert!(none_waiting(&y.ctx));
    (x, y)
}

#[test]
fn comm_est_in_rtr_then_access_error_as_responder() {
    let (a, b) = NicProc::pair("ae1");
    let (mut x, mut y) = pair_with_y_in_rtr(&a, &b, QpType::Rc);
    let pipe = y.ctx.async_event_channel().expect("channel");
    assert!(!readable(&pipe, Duration::ZERO), "no event yet");

    let rsge = [y.mr.sge(0, 64)];
    y.qp.post_recv(&[RecvWr::new(1, &rsge), RecvWr::new(2, &rsge)])
        .expect("post recv");
    assert_eq!(send(&mut x, 10, 16), WcStatus::Success);
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    let qpn = y.qp.qp_num();
    assert!(
        readable(&pipe, WAIT),
        "the NIC writes the pipe for COMM_EST"
    );
    assert!(os::pipe_drain(pipe.as_fd()).expect("drain"));
    let requests = b.stat("async_event_requests");
    assert_eq!(events(&y.ctx), vec![AsyncEvent::CommEst { qpn }]);
    assert_eq!(
        b.stat("async_event_requests"),
        requests + 1,
        "one request took it"
    );
    // A second packet raises nothing more, and does not write the pipe.
    assert_eq!(send(&mut x, 11, 16), WcStatus::Success);
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    assert!(!readable(&pipe, Duration::from_millis(50)));
    assert!(none_waiting(&y.ctx));

    // A WRITE with an R_Key y never gave out: Remote Access NAK, y to ERR.
    let sge = [x.mr.sge(0, 8)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey() ^ 0x5a5a_0000,
    };
    x.qp.post_send(&[SendWr::new(12, op, &sge).signaled()])
        .expect("post write");
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::RemAccessErr);
    assert!(readable(&pipe, WAIT), "written again: the list was empty");
    assert_eq!(events(&y.ctx), vec![AsyncEvent::QpAccessErr { qpn }]);
    assert!(none_waiting(&y.ctx), "once");
    assert!(
        none_waiting(&x.ctx),
        "the requester learns it from its completion, not an event"
    );
}

#[test]
fn a_send_longer_than_the_receive_buffer_is_a_request_error() {
    let (a, b) = NicProc::pair("ae2");
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let rsge = [y.mr.sge(0, 8)];
    y.qp.post_recv(&[RecvWr::new(1, &rsge)]).expect("post recv");
    assert_eq!(send(&mut x, 10, 64), WcStatus::RemInvReqErr);
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::LocLenErr);
    let qpn = y.qp.qp_num();
    // Both QPs were in RTS before any packet: no COMM_EST.
    assert_eq!(events(&y.ctx), vec![AsyncEvent::QpReqErr { qpn }]);
    assert!(none_waiting(&x.ctx));
}

#[test]
fn a_full_cq_is_qp_fatal_and_loses_no_completion() {
    let (a, b) = NicProc::pair("ae3");
    let mut x = side(&a, 4096, 16);
    let y = side(&b, 4096, 16);
    // y's QP completes to a CQ smaller than the receives it posts, and y never polls.
    let mut small = y.ctx.create_cq(1).expect("cq");
    let cap = small.capacity();
    assert!(cap < 16, "the CQ holds {cap}: no overrun possible");
    let mut yq =
        y.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &small,
            recv_cq: &small,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .expect("qp");
    connect_rc((&mut x.qp, &a), (&mut yq, &b), Mtu::Mtu1024, (0, 0), 14);
    let rsge = [y.mr.sge(0, 64)];
    let n = cap as u64 + 1;
    let recvs: Vec<RecvWr> = (0..n).map(|i| RecvWr::new(i, &rsge)).collect();
    yq.post_recv(&recvs).expect("post recv");
    for i in 0..n {
        let sge = [x.mr.sge(0, 8)];
        x.qp.post_send(&[SendWr::new(100 + i, WrOpcode::Send, &sge)])
            .expect("post send");
    }
    let qpn = yq.qp_num();
    assert_eq!(events(&y.ctx), vec![AsyncEvent::QpFatal { qpn }]);
    // Every receive still completes, in order, once the program makes room: those the
    // NIC had filled before the overrun with success, any later one flushed.
    let wcs = poll_n(&mut small, n as usize);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    assert_eq!(wcs[0].status, WcStatus::Success);
    for w in &wcs {
        assert!(
            matches!(w.status, WcStatus::Success | WcStatus::WrFlushErr),
            "{w:?}"
        );
    }
    assert!(none_waiting(&y.ctx), "once");
}

#[test]
fn uc_raises_comm_est_but_no_error_event() {
    let (a, b) = NicProc::pair("ae4");
    let (mut x, mut y) = pair_with_y_in_rtr(&a, &b, QpType::Uc);
    let rsge = [y.mr.sge(0, 8)];
    y.qp.post_recv(&[RecvWr::new(1, &rsge), RecvWr::new(2, &rsge)])
        .expect("post recv");
    assert_eq!(send(&mut x, 10, 8), WcStatus::Success);
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    let qpn = y.qp.qp_num();
    assert_eq!(events(&y.ctx), vec![AsyncEvent::CommEst { qpn }]);
    // Too long for the receive buffer: UC drops the message silently (IBTA 9.8.3) and
    // stays usable, so no error event; the next message fits and arrives.
    assert_eq!(send(&mut x, 11, 64), WcStatus::Success);
    assert_eq!(send(&mut x, 12, 8), WcStatus::Success);
    let wc = poll_one(&mut y.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert!(none_waiting(&y.ctx));
}
