//! Forged duplicate READs and atomics (issue 9, item 3): a packet whose PSN falls in
//! the responder's duplicate window is answered only if it repeats a READ or atomic
//! the responder really served — same R_Key, and for a READ the original range or its
//! tail from the duplicate's PSN on; for an atomic the same operation and operands.
//! Anything else is dropped and counted, and reads nothing.
//!
//! The forger plays the connected peer (right QPN, PSNs in the duplicate window): the
//! worst case, as an off-path host that got past the source check would.

mod common;
mod peer;

use common::*;
use peer::{collect, counter, inject, packet, read_request};
use softnic_transport::memory::Access;
use softnic_transport::qp::QpState;
use softnic_transport::testing::Pair;
use softnic_transport::wr::{SendOp, WcStatus};
use wire::{AtomicEthRepr, Opcode, Operation, PacketRepr};

const STEPS: u64 = 1_000_000;

fn request(opcode: Opcode, dest_qpn: u32, psn: u32) -> PacketRepr {
    packet(opcode, dest_qpn, psn)
}

fn is_read_response(r: &PacketRepr) -> bool {
    r.bth.opcode.info().map(|i| i.operation) == Some(Operation::ReadResponse)
}

/// A's READ of 1000 bytes from B (PSNs 100..=103 at MTU 256) and a FETCH_ADD (PSN
/// 104), both completed. B holds a second region, `secret`, that A never asked for.
struct Scene {
    p: Pair,
    b: Buf,
    secret: Buf,
    data: Vec<u8>,
}

const READ_OFF: usize = 4096;
const READ_LEN: usize = 1000;
const ATOMIC_OFF: usize = 65536;

fn scene(seed: u64) -> Scene {
    let (mut p, a, b) = pair(rc(256), seed);
    let secret = region(&mut p.b, 0x6000_0000, 8192, Access::ALL);
    let data = pattern(31, b.len);
    fill(&mut p.b, &b, 0, &data);
    fill(&mut p.b, &secret, 0, &pattern(32, 8192));
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(0, READ_LEN)], &b, READ_OFF))
        .unwrap();
    p.a.qp
        .post_send(rdma(
            2,
            SendOp::FetchAdd { add: 5 },
            &[a.sge(8192, 8)],
            &b,
            ATOMIC_OFF,
        ))
        .unwrap();
    p.drive(STEPS);
    let sc: Vec<_> = drain(&mut p.a).iter().map(|c| c.status).collect();
    assert_eq!(sc, vec![WcStatus::Success, WcStatus::Success]);
    assert_eq!(
        read(&p.a, &a, 0, READ_LEN),
        data[READ_OFF..READ_OFF + READ_LEN]
    );
    Scene { p, b, secret, data }
}

#[test]
fn forged_duplicate_reads_read_nothing_and_are_counted() {
    let Scene {
        mut p,
        b,
        secret,
        data: _,
    } = scene(41);
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    let before = *p.b.qp.counters();
    let orig = b.at(READ_OFF);
    let forged = [
        // Another R_Key (a region the peer was never served from), same range.
        ("other rkey", 100, secret.addr, secret.key, READ_LEN as u32),
        // Same R_Key, range starting before the original.
        ("starts before", 100, orig - 256, b.key, READ_LEN as u32),
        // Same R_Key, range running past the original.
        ("runs past", 100, orig, b.key, READ_LEN as u32 + 1),
        // Same R_Key, all of the region.
        ("whole region", 100, b.addr, b.key, 65536),
        // PSN 101 is the original's second response: a retry from there starts
        // 256 bytes in, not at the original's start.
        ("start not at the PSN", 101, orig, b.key, 744),
        // A PSN in the duplicate window where no READ was ever served.
        ("never served", 99, orig, b.key, 16),
        // The PSN of the FETCH_ADD, not a READ.
        ("atomic's PSN", 104, orig, b.key, 16),
    ];
    for (what, psn, va, rkey, len) in forged {
        inject(
            &mut p.b,
            now,
            from,
            read_request(qpn, psn, va, rkey, len),
            &[],
        );
        let out = collect(&mut p.b, now);
        assert!(
            out.iter().all(|(r, _)| !is_read_response(r)),
            "{what}: the forged duplicate READ was answered: {out:?}"
        );
        assert!(out.is_empty(), "{what}: {out:?}");
    }
    let c = p.b.qp.counters();
    assert_eq!(c.read_responses_sent, before.read_responses_sent);
    assert_eq!(c.duplicate_requests - before.duplicate_requests, 7);
    assert_eq!(counter(&p.b.qp, "drop_duplicate_mismatch"), 5);
    assert_eq!(c.drop_duplicate - before.drop_duplicate, 2);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

#[test]
fn genuine_duplicate_reads_replay_only_served_bytes() {
    let Scene { mut p, b, data, .. } = scene(42);
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    let orig = b.at(READ_OFF);
    // The whole READ again, then a retry from its third response PSN.
    for (psn, off, len, expect_psns) in [
        (100u32, 0usize, READ_LEN, 100..104u32),
        (102, 512, READ_LEN - 512, 102..104),
        // A shorter sub-range from the PSN's offset is a subset of what was served.
        (101, 256, 10, 101..102),
    ] {
        inject(
            &mut p.b,
            now,
            from,
            read_request(qpn, psn, orig + off as u64, b.key, len as u32),
            &[],
        );
        let out = collect(&mut p.b, now);
        let psns: Vec<u32> = out.iter().map(|(r, _)| r.bth.psn.value()).collect();
        assert_eq!(psns, expect_psns.collect::<Vec<_>>());
        assert!(out.iter().all(|(r, _)| is_read_response(r)));
        let bytes: Vec<u8> = out.iter().flat_map(|(_, d)| d.clone()).collect();
        assert_eq!(
            bytes,
            data[READ_OFF + off..READ_OFF + off + len],
            "replayed bytes are the served bytes at the same offsets"
        );
    }
    assert_eq!(counter(&p.b.qp, "drop_duplicate_mismatch"), 0);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

#[test]
fn forged_duplicate_atomic_gets_no_answer_and_nothing_executes_twice() {
    let Scene { mut p, b, .. } = scene(43);
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    let target = u64::from_ne_bytes(read(&p.b, &b, ATOMIC_OFF, 8).try_into().unwrap());
    let atomic = |va: u64, rkey: u32, add: u64, op: Opcode| {
        let mut r = request(op, qpn, 104);
        r.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: add,
            compare: 0,
        });
        r
    };
    let va = b.at(ATOMIC_OFF);
    let fetch_add = Opcode::RC_FETCH_ADD;
    for forged in [
        atomic(b.at(0), b.key, 5, fetch_add),
        atomic(va, b.key, 6, fetch_add),
        atomic(va, b.key ^ 1, 5, fetch_add),
        atomic(va, b.key, 5, Opcode::RC_COMPARE_SWAP),
    ] {
        inject(&mut p.b, now, from, forged, &[]);
        assert_eq!(collect(&mut p.b, now), vec![], "{forged:?} was answered");
    }
    assert_eq!(counter(&p.b.qp, "drop_duplicate_mismatch"), 4);
    // The genuine duplicate is answered from the cache with the original value.
    inject(&mut p.b, now, from, atomic(va, b.key, 5, fetch_add), &[]);
    let out = collect(&mut p.b, now);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].0.atomic_ack_eth.map(|a| a.orig),
        Some(target.wrapping_sub(5))
    );
    let after = u64::from_ne_bytes(read(&p.b, &b, ATOMIC_OFF, 8).try_into().unwrap());
    assert_eq!(after, target, "never executed twice");
    assert_eq!(p.b.qp.counters().atomic_replays, 1);
}

#[test]
fn served_reads_are_remembered_up_to_a_bound() {
    // max_dest_rd_atomic 4 (PairConfig default), so the last 16 READs are kept
    // (SERVED_READS_MIN): after 17 READs the first is forgotten, and a duplicate of it
    // is dropped as never served, not executed again; the second is still replayed.
    let (mut p, a, b) = pair(rc(1024), 44);
    fill(&mut p.b, &b, 0, &pattern(33, 8192));
    for i in 0..17u64 {
        p.a.qp
            .post_send(rdma(i, SendOp::Read, &[a.sge(0, 64)], &b, 64 * i as usize))
            .unwrap();
    }
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a).len(), 17);
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    // READ i went out at PSN 100 + i.
    let forgotten = read_request(qpn, 100, b.at(0), b.key, 64);
    inject(&mut p.b, now, from, forgotten, &[]);
    assert!(collect(&mut p.b, now).is_empty());
    assert_eq!(p.b.qp.counters().drop_duplicate, 1);
    let kept = read_request(qpn, 101, b.at(64), b.key, 64);
    inject(&mut p.b, now, from, kept, &[]);
    assert_eq!(collect(&mut p.b, now).len(), 1);
}
