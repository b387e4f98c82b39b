//! A work queue never holds more than its capacity: a ring slot frees only when its
//! work request completes, so the post after `capacity` outstanding WRs is ENOMEM
//! (`PostError::QueueFull`) however long the NIC has had to copy them out, as on rxe.
//! (Before, the NIC freed the slot when it copied the WQE into the QP's own queue, so
//! a client could have up to twice the capacity outstanding and pyverbs'
//! `test_full_rq_bad_flow` failed in some runs.)

mod nic_support;

use std::time::Duration;

use nic_support::*;
use verbs_api::{
    AccessFlags, Error, Mtu, PostError, QpAttr, QpState, RecvWr, SendWr, SrqInitAttr, WcOpcode,
    WcStatus, WrOpcode,
};

const DEPTH: u32 = 8;

fn is_full<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
    matches!(
        r,
        Err(Error::Post {
            reason: PostError::QueueFull { .. },
            ..
        })
    )
}

/// Long enough for an awake NIC to have copied every posted WQE out of the ring.
fn let_the_nic_drain() {
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn receive_queue_full_until_a_receive_completes() {
    let a = NicProc::start("qfull-rq-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("qfull-rq-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, DEPTH);
    let sge = [x.mr.sge(0, 64)];
    for i in 0..DEPTH {
        x.qp.post_recv(&[RecvWr::new(u64::from(i), &sge)])
            .expect("within capacity");
    }
    for round in 0..3u64 {
        let_the_nic_drain();
        assert!(
            is_full(x.qp.post_recv(&[RecvWr::new(100 + round, &sge)])),
            "round {round}: the receive after {DEPTH} outstanding must be ENOMEM"
        );
        // One SEND consumes one receive; after its completion exactly one post fits.
        let ysge = [y.mr.sge(0, 8)];
        y.qp.post_send(&[SendWr::new(round, WrOpcode::Send, &ysge).signaled()])
            .expect("send");
        assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
        let wc = poll_one(&mut x.cq);
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        x.qp.post_recv(&[RecvWr::new(200 + round, &sge)])
            .expect("a completed receive frees its slot");
    }
}

#[test]
fn send_queue_full_while_sends_wait_for_acks() {
    let a = NicProc::start("qfull-sq-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("qfull-sq-b", "127.0.0.1", 0, &[]);
    let mut x = side(&a, 4096, DEPTH);
    // No QP 0xabcd on b: nothing is acknowledged, every SEND stays outstanding.
    x.qp.to_init(AccessFlags::ALL).expect("init");
    x.qp.to_rtr(&b.endpoint(0xabcd, 0), Mtu::Mtu1024)
        .expect("rtr");
    x.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: Some(20), // 4 s: no retry exhaustion during the test
        retry_cnt: Some(1),
        rnr_retry: Some(1),
        max_rd_atomic: Some(1),
        ..QpAttr::default()
    })
    .expect("rts");
    let sge = [x.mr.sge(0, 8)];
    for i in 0..u64::from(DEPTH) {
        x.qp.post_send(&[SendWr::new(i, WrOpcode::Send, &sge)])
            .expect("within capacity");
    }
    for _ in 0..3 {
        let_the_nic_drain();
        assert!(is_full(x.qp.post_send(&[SendWr::new(
            99,
            WrOpcode::Send,
            &sge
        )])));
    }
}

#[test]
fn srq_full_until_a_qp_takes_a_receive() {
    let a = NicProc::start("qfull-srq", "127.0.0.1", 0, &[]);
    let x = side(&a, 4096, DEPTH);
    let mut srq =
        x.pd.create_srq(&SrqInitAttr {
            max_wr: DEPTH,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    let sge = [x.mr.sge(0, 64)];
    for i in 0..DEPTH {
        srq.post_recv(&[RecvWr::new(u64::from(i), &sge)])
            .expect("within capacity");
    }
    for _ in 0..3 {
        let_the_nic_drain();
        assert!(is_full(srq.post_recv(&[RecvWr::new(99, &sge)])));
    }
}
