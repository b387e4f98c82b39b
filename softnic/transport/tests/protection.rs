//! Protection and request errors: the right NAK, the right completion status, the QPs
//! in Err, and memory untouched.

mod common;

use common::*;
use softnic_transport::memory::Access;
use softnic_transport::qp::{QpAttr, QpState};
use softnic_transport::testing::{Pair, PairConfig};
use softnic_transport::wr::{Queue, SendOp, SendWr, WcStatus};

const STEPS: u64 = 1_000_000;

type Case5 = Box<dyn Fn(&Buf, &Buf, &Buf, &Buf, &Buf) -> SendWr>;
type Case4 = Box<dyn Fn(&Buf, &Buf, &Buf, &Buf) -> SendWr>;

/// A pair whose responder has extra regions: `ro` (remote read only), `wo` (remote
/// write only), `none` (local only). Returns (pair, a.buf, b.all, b.ro, b.wo, b.none).
fn setup() -> (Pair, Buf, Buf, Buf, Buf, Buf) {
    let (mut p, a, b) = pair(rc(1024), 1);
    let lw = Access::LOCAL_WRITE;
    let ro = region(&mut p.b, 0x5000_0000, 4096, lw.union(Access::REMOTE_READ));
    let wo = region(&mut p.b, 0x6000_0000, 4096, lw.union(Access::REMOTE_WRITE));
    let none = region(&mut p.b, 0x6100_0000, 4096, lw);
    for r in [&b, &ro, &wo, &none] {
        let n = r.len;
        fill(&mut p.b, r, 0, &pattern(u64::from(r.key), n));
    }
    fill(&mut p.a, &a, 0, &pattern(99, 8192));
    (p, a, b, ro, wo, none)
}

/// Posts `w` followed by a second WR, drives, and checks: the first completes with
/// `status`, the second is flushed, both QPs are in Err, and b's memory is unchanged.
fn expect_remote_error(mut p: Pair, w: SendWr, status: WcStatus, nak_counter: fn(&Pair) -> u64) {
    let before: Vec<Vec<u8>> = p.b.mem.regions.iter().map(|r| r.data.clone()).collect();
    let a_before: Vec<Vec<u8>> = p.a.mem.regions.iter().map(|r| r.data.clone()).collect();
    let mut second = w.clone();
    second.wr_id = 1000;
    p.a.qp.post_send(w.clone()).unwrap();
    p.a.qp.post_send(second).unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(
        ids(&sc),
        vec![(w.wr_id, status), (1000, WcStatus::WrFlushErr)],
        "{:?}",
        w.op
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(nak_counter(&p), 1);
    let after: Vec<Vec<u8>> = p.b.mem.regions.iter().map(|r| r.data.clone()).collect();
    assert!(before == after, "responder memory touched");
    let a_after: Vec<Vec<u8>> = p.a.mem.regions.iter().map(|r| r.data.clone()).collect();
    assert!(a_before == a_after, "requester memory touched");
}

fn nak_access(p: &Pair) -> u64 {
    assert_eq!(p.a.qp.counters().nak_remote_access_received, 1);
    p.b.qp.counters().nak_remote_access_sent
}

fn nak_invalid(p: &Pair) -> u64 {
    assert_eq!(p.a.qp.counters().nak_invalid_request_received, 1);
    p.b.qp.counters().nak_invalid_request_sent
}

#[test]
fn write_wrong_rkey_out_of_range_or_without_access() {
    let cases: Vec<Case5> = vec![
        Box::new(|a, b, _, _, _| {
            let mut w = rdma(1, SendOp::Write, &[a.sge(0, 100)], b, 0);
            w.rkey ^= 0x0100_0000;
            w
        }),
        Box::new(|a, b, _, _, _| rdma(2, SendOp::Write, &[a.sge(0, 100)], b, b.len - 99)),
        Box::new(|a, _, ro, _, _| rdma(3, SendOp::Write, &[a.sge(0, 100)], ro, 0)),
        Box::new(|a, _, _, _, none| rdma(4, SendOp::WriteWithImm(1), &[a.sge(0, 3000)], none, 0)),
        // Multi-packet: the whole RETH range is checked on the first packet.
        Box::new(|a, _, _, wo, _| rdma(5, SendOp::Write, &[a.sge(0, 5000)], wo, 0)),
    ];
    for c in cases {
        let (mut p, a, b, ro, wo, none) = setup();
        p.b.qp.post_recv(recv(1, &[])).unwrap();
        let w = c(&a, &b, &ro, &wo, &none);
        expect_remote_error(p, w, WcStatus::RemAccessErr, nak_access);
    }
}

#[test]
fn read_wrong_rkey_out_of_range_or_without_access() {
    let cases: Vec<Case4> = vec![
        Box::new(|a, b, _, _| {
            let mut w = rdma(1, SendOp::Read, &[a.sge(0, 100)], b, 0);
            w.rkey = 12345;
            w
        }),
        Box::new(|a, b, _, _| rdma(2, SendOp::Read, &[a.sge(0, 100)], b, b.len - 1)),
        Box::new(|a, _, wo, _| rdma(3, SendOp::Read, &[a.sge(0, 100)], wo, 0)),
        Box::new(|a, _, _, none| rdma(4, SendOp::Read, &[a.sge(0, 4096)], none, 0)),
    ];
    for c in cases {
        let (p, a, b, _ro, wo, none) = setup();
        let w = c(&a, &b, &wo, &none);
        expect_remote_error(p, w, WcStatus::RemAccessErr, nak_access);
    }
}

#[test]
fn atomic_without_access_or_misaligned() {
    let (p, a, _b, ro, _wo, _none) = setup();
    let w = rdma(1, SendOp::FetchAdd { add: 1 }, &[a.sge(0, 8)], &ro, 0);
    expect_remote_error(p, w, WcStatus::RemAccessErr, nak_access);
    let (p, a, b, ..) = setup();
    let w = rdma(
        2,
        SendOp::CompareSwap {
            compare: 0,
            swap: 1,
        },
        &[a.sge(0, 8)],
        &b,
        4,
    );
    expect_remote_error(p, w, WcStatus::RemInvReqErr, nak_invalid);
    let (p, a, b, ..) = setup();
    let mut w = rdma(3, SendOp::FetchAdd { add: 1 }, &[a.sge(0, 8)], &b, 8);
    w.rkey = 0;
    expect_remote_error(p, w, WcStatus::RemAccessErr, nak_access);
}

#[test]
fn qp_access_flags_gate_remote_operations() {
    for (access, op) in [
        (
            Access::REMOTE_READ.union(Access::REMOTE_ATOMIC),
            SendOp::Write,
        ),
        (
            Access::REMOTE_WRITE.union(Access::REMOTE_ATOMIC),
            SendOp::Read,
        ),
        (
            Access::REMOTE_WRITE.union(Access::REMOTE_READ),
            SendOp::FetchAdd { add: 1 },
        ),
    ] {
        let (mut p, a, b, ..) = setup();
        // The responder QP allows less than the memory region does.
        p.b.qp
            .modify(
                p.now,
                &QpAttr {
                    access: Some(access),
                    ..Default::default()
                },
            )
            .unwrap();
        let w = rdma(1, op, &[a.sge(0, 8)], &b, 0);
        expect_remote_error(p, w, WcStatus::RemInvReqErr, nak_invalid);
    }
}

#[test]
fn send_longer_than_the_receive_buffer() {
    let (mut p, a, b, ..) = setup();
    p.b.qp.post_recv(recv(7, &[b.sge(0, 1500)])).unwrap();
    p.b.qp.post_recv(recv(8, &[b.sge(2000, 1500)])).unwrap();
    let before = read(&p.b, &b, 0, 4096);
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 1501)]))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!((sc[0].wr_id, sc[0].status), (1, WcStatus::RemInvReqErr));
    let rc = drain(&mut p.b);
    assert_eq!(
        rc.iter()
            .map(|c| (c.queue, c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![
            (Queue::Recv, 7, WcStatus::LocLenErr),
            (Queue::Recv, 8, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
    // The first packet (1024 bytes) fit and was placed; the second did not.
    assert_eq!(read(&p.b, &b, 1024, 4096 - 1024), before[1024..].to_vec());
}

#[test]
fn bad_local_key_is_a_local_protection_error_and_sends_nothing() {
    let (mut p, a, b, ..) = setup();
    let mut w = rdma(1, SendOp::Write, &[a.sge(0, 100)], &b, 0);
    w.sges[0].lkey = 4242;
    p.a.qp.post_send(w).unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::Write, &[a.sge(0, 100)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(
        ids(&sc),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.stats.sent, 0);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

#[test]
fn read_into_a_buffer_without_local_write_is_a_local_protection_error() {
    let (mut p, _a, b, ..) = setup();
    let ro_local = region(&mut p.a, 0x9000_0000, 4096, Access::NONE);
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[ro_local.sge(0, 100)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!((sc[0].wr_id, sc[0].status), (1, WcStatus::LocProtErr));
    assert_eq!(read(&p.a, &ro_local, 0, 100), vec![0; 100]);
    let _ = PairConfig::default();
}
