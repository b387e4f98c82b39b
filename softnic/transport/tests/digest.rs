//! The gather's payload digest: packets whose payload was gathered with its CRC
//! (`Transmit::digest`) get their ICRC from it (`Pair::transmit` fills them as the NIC
//! does) and the receiver checks that ICRC with a full hash. A digest chained wrongly
//! over the SGEs, or over the wrong bytes, is an ICRC error on arrival; a digest
//! dropped leaves `digested` short.

mod common;

use common::*;
use softnic_transport::sgl::DIGEST_MIN_PAYLOAD;
use softnic_transport::wr::{Inline, SendOp, WcOpcode, WcStatus, MAX_INLINE};

const STEPS: u64 = 1_000_000;

/// A WRITE gathered from four SGEs (one of 7 bytes, packets crossing SGE boundaries)
/// at MTU 1024: payloads 1024, 1024, 533 — three digested packets, every ICRC right.
#[test]
fn multi_sge_write_is_digested_and_verifies() {
    let (mut p, a, b) = pair(rc(1024), 11);
    let lens = [700, 7, 1500, 374];
    let offs = [5, 4096, 10_000, 3 * 4096 + 1];
    let mut data = Vec::new();
    let mut sges = Vec::new();
    for (i, (&off, &len)) in offs.iter().zip(&lens).enumerate() {
        let d = pattern(i as u64 + 40, len);
        fill(&mut p.a, &a, off, &d);
        data.extend(d);
        sges.push(a.sge(off, len));
    }
    p.a.qp
        .post_send(rdma(3, SendOp::Write, &sges, &b, 64))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(ids(&sc), [(3, WcStatus::Success)], "{sc:?}");
    assert!(
        read(&p.b, &b, 64, data.len()) == data,
        "WRITE payload differs"
    );
    assert_eq!(p.stats.icrc_errors, 0);
    assert_eq!(p.stats.digested, 3, "{:?}", p.stats);
}

/// READ responses are digested too (read from the responder's region with its CRC).
#[test]
fn read_responses_are_digested_and_verify() {
    let (mut p, a, b) = pair(rc(1024), 12);
    let data = pattern(9, 2500);
    fill(&mut p.b, &b, 8, &data);
    let sges = [a.sge(32, 1000), a.sge(MIB, 1500)];
    p.a.qp
        .post_send(rdma(7, SendOp::Read, &sges, &b, 8))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(ids(&sc), [(7, WcStatus::Success)], "{sc:?}");
    assert_eq!(sc[0].opcode, WcOpcode::RdmaRead);
    let mut got = read(&p.a, &a, 32, 1000);
    got.extend(read(&p.a, &a, MIB, 1500));
    assert!(got == data, "READ payload differs");
    assert_eq!(p.stats.icrc_errors, 0);
    // 1024 + 1024 + 452: all three responses.
    assert_eq!(p.stats.digested, 3, "{:?}", p.stats);
}

/// Inline data of the threshold's length is digested; one byte less is hashed as
/// before (the small-message path is unchanged).
#[test]
fn inline_and_threshold() {
    const { assert!(MAX_INLINE >= DIGEST_MIN_PAYLOAD) };
    for (len, digested) in [(DIGEST_MIN_PAYLOAD, 1), (DIGEST_MIN_PAYLOAD - 1, 0)] {
        let (mut p, _a, b) = pair(rc(1024), 13);
        let data = pattern(len as u64, len);
        let mut w = rdma(1, SendOp::Write, &[], &b, 0);
        w.inline = Inline::new(&data);
        p.a.qp.post_send(w).unwrap();
        p.drive(STEPS);
        assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::Success)]);
        assert!(read(&p.b, &b, 0, len) == data, "inline WRITE {len}");
        assert_eq!(p.stats.icrc_errors, 0);
        assert_eq!(p.stats.digested, digested, "len {len}");
    }
}
