//! `ibv_resize_cq` (`CompletionQueue::resize`): the completions not yet polled move to
//! the new ring in order; a CQ cannot shrink below them (InvalidArgument, as rxe); the
//! NIC keeps completing into the new ring.

mod nic_support;

use nic_support::*;
use verbs_api::{Error, Mtu, RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode};

/// y sends `n` 8-byte messages to x (whose receives `first..first + n` are posted) and
/// waits for their send completions: x's receive completions are then in x's CQ.
fn deliver(x: &mut Side, y: &mut Side, first: u64, n: u64) {
    let rsge = [x.mr.sge(0, 64)];
    for i in first..first + n {
        x.qp.post_recv(&[RecvWr::new(i, &rsge)]).expect("recv");
    }
    let sge = [y.mr.sge(0, 8)];
    for i in first..first + n {
        y.qp.post_send(&[SendWr::new(i, WrOpcode::Send, &sge).signaled()])
            .expect("send");
    }
    for wc in poll_n(&mut y.cq, n as usize) {
        assert_eq!(wc.status, WcStatus::Success);
    }
}

#[test]
fn resize_keeps_unpolled_completions_and_refuses_to_drop_them() {
    let a = NicProc::start("cqr-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("cqr-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let before = x.cq.capacity();
    deliver(&mut x, &mut y, 0, 3);
    // Three completions wait: a depth of 2 would lose one.
    let e = x.cq.resize(2).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Nic {
                code: verbs_api::abi::control::ErrorCode::InvalidArgument,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(x.cq.capacity(), before, "a refused resize changes nothing");
    assert_eq!(x.cq.resize(100).expect("grow"), 128);
    assert_eq!(x.cq.capacity(), 128);
    let got = poll_n(&mut x.cq, 3);
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2], "moved in order");
    assert!(got
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv));
    // Empty now: shrink to 1, and the NIC completes into the new ring.
    assert_eq!(x.cq.resize(1).expect("shrink"), 1);
    deliver(&mut x, &mut y, 10, 1);
    assert_eq!(poll_one(&mut x.cq).wr_id, 10);
}

/// A CQ may be as deep as the device's `max_cqe`, which is above a work queue's
/// `max_qp_wr` (one CQ serves many QPs: perftest's `-q 1000` asks for 128,000), and no
/// deeper: one more is refused before the NIC is asked. The NIC maps the whole ring
/// and completes into it.
#[test]
fn a_cq_grows_to_the_devices_max_cqe_and_no_further() {
    let a = NicProc::start("cqmax-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("cqmax-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let dev = x.ctx.query_device().expect("query");
    assert!(dev.max_cqe > dev.max_qp_wr, "{dev:?}");
    assert!(
        dev.max_cqe >= 1_280_000,
        "perftest -q 10000: {}",
        dev.max_cqe
    );
    deliver(&mut x, &mut y, 0, 2);
    assert_eq!(x.cq.resize(dev.max_cqe).expect("grow"), dev.max_cqe);
    deliver(&mut x, &mut y, 2, 1);
    let ids: Vec<u64> = poll_n(&mut x.cq, 3).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2]);
    let e = x.cq.resize(dev.max_cqe + 1).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = x.ctx.create_cq(dev.max_cqe + 1).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(
        x.cq.capacity(),
        dev.max_cqe,
        "a refused resize changes nothing"
    );
}
