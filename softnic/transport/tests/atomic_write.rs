//! RDMA ATOMIC WRITE (IBTA Annex A19, as Linux rxe carries it): one request packet,
//! opcode 0x1D, with a RETH of DMA length 8 and the 8 bytes as payload; the responder
//! stores them in one store under REMOTE_WRITE and answers with an RDMA READ Response
//! Only of zero length; a duplicate is answered again without storing again; malformed
//! or forbidden requests are NAKed; every message arrives once under loss, reordering
//! and duplication.

mod common;

use common::*;
use softnic_transport::memory::Access;
use softnic_transport::qp::PostError;
use softnic_transport::testing::{Faults, Side, Verdict};
use softnic_transport::wr::{SendOp, WcOpcode, WcStatus};
use wire::Opcode;

const STEPS: u64 = 1_000_000;

fn atomic_write(value: [u8; 8]) -> SendOp {
    SendOp::AtomicWrite { value }
}

#[test]
fn atomic_write_stores_eight_bytes_and_is_answered_by_an_empty_read_response() {
    let (mut p, _a, b) = pair(rc(1024), 1);
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let s2 = seen.clone();
    p.filter = Some(Box::new(move |s| {
        s2.borrow_mut().push((
            s.from,
            s.repr.bth.opcode,
            s.repr.reth,
            s.repr.payload_len,
            s.repr.aeth,
        ));
        Verdict::Pass
    }));
    let value = *b"softnic!";
    p.a.qp
        .post_send(rdma(7, atomic_write(value), &[], &b, 64))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 1, "{sc:?}");
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode, sc[0].byte_len),
        (7, WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    assert_eq!(read(&p.b, &b, 64, 8), value);
    assert!(
        drain(&mut p.b).is_empty(),
        "the responder completes nothing"
    );
    let seen = seen.borrow();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (from, op, reth, plen, _) = seen[0];
    assert_eq!((from, op, plen), (Side::A, Opcode(0x1D), 8));
    let reth = reth.expect("a RETH");
    assert_eq!((reth.va, reth.rkey, reth.dma_len), (b.at(64), b.key, 8));
    let (from, op, reth, plen, aeth) = seen[1];
    assert_eq!((from, op, reth, plen), (Side::B, Opcode(0x10), None, 0));
    assert!(aeth.is_some_and(|a| a.syndrome.is_ack()), "{aeth:?}");
}

/// The response is lost; meanwhile the responder's memory changes (a later local
/// store). The retransmitted request is a duplicate: answered again from the
/// responder's memory of it, not stored again, so the later bytes stay.
#[test]
fn a_duplicate_is_answered_without_storing_again() {
    let (mut p, _a, b) = pair(rc(1024), 2);
    let mut dropped = false;
    p.filter = Some(Box::new(move |s| {
        if s.from == Side::B && s.repr.bth.opcode == Opcode(0x10) && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    p.a.qp
        .post_send(rdma(1, atomic_write([1; 8]), &[], &b, 128))
        .unwrap();
    // Until the request has been stored: B's memory holds it.
    for _ in 0..100 {
        p.step();
        if read(&p.b, &b, 128, 8) == [1; 8] {
            break;
        }
    }
    assert_eq!(read(&p.b, &b, 128, 8), [1; 8]);
    fill(&mut p.b, &b, 128, &[2; 8]);
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(ids(&sc), [(1, WcStatus::Success)]);
    assert_eq!(read(&p.b, &b, 128, 8), [2; 8], "stored twice");
    assert_eq!(p.b.qp.counters().atomic_replays, 1);
}

/// Each refusal completes the request with the NAK's status and moves the QP to
/// Err: an unaligned target is an invalid request (IBTA oA19-28; rxe), a region
/// without REMOTE_WRITE (even one open to atomics) a remote access error.
#[test]
fn misaligned_or_forbidden_atomic_writes_are_naked() {
    let (mut p, _a, b) = pair(rc(1024), 3);
    p.a.qp
        .post_send(rdma(1, atomic_write([3; 8]), &[], &b, 4))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a))[0], (1, WcStatus::RemInvReqErr));
    assert_eq!(read(&p.b, &b, 0, 16), [0; 16]);

    let (mut p, _a, _b) = pair(rc(1024), 4);
    let ro = region(
        &mut p.b,
        0x5000_0000,
        4096,
        Access::REMOTE_READ
            .union(Access::REMOTE_ATOMIC)
            .union(Access::LOCAL_WRITE),
    );
    p.a.qp
        .post_send(rdma(2, atomic_write([4; 8]), &[], &ro, 8))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a))[0], (2, WcStatus::RemAccessErr));
    assert_eq!(read(&p.b, &ro, 8, 8), [0; 8]);
}

#[test]
fn only_rc_posts_an_atomic_write_and_it_gathers_nothing() {
    let (mut p, a, b) = pair(rc(1024), 6);
    assert_eq!(
        p.a.qp
            .post_send(rdma(1, atomic_write([0; 8]), &[a.sge(0, 8)], &b, 0)),
        Err(PostError::BadAtomicSge)
    );
    let mut uc = rc(1024);
    uc.qp_type = softnic_transport::qp::QpType::Uc;
    let (mut p, _a, b) = pair(uc, 7);
    assert_eq!(
        p.a.qp.post_send(rdma(1, atomic_write([0; 8]), &[], &b, 0)),
        Err(PostError::UnsupportedOp)
    );
}

/// 64 ATOMIC WRITEs to one target under 10 % loss, reordering and duplication: each
/// completes once, in order, and the target ends with the last one's bytes.
#[test]
fn atomic_writes_survive_loss_reordering_and_duplication() {
    let (mut p, _a, b) = pair(rc(1024), 8);
    p.faults = Faults {
        loss: 0.1,
        reorder: 0.1,
        duplicate: 0.1,
        corrupt: 0.0,
    };
    for i in 0..64u64 {
        p.a.qp
            .post_send(rdma(i, atomic_write((i + 1).to_le_bytes()), &[], &b, 256))
            .unwrap();
        if i % 8 == 7 {
            p.drive(STEPS);
        }
    }
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    let want: Vec<_> = (0..64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(ids(&sc), want);
    assert_eq!(read(&p.b, &b, 256, 8), 64u64.to_le_bytes());
}
