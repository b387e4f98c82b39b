//! The receiver's single pass (`qp::placement`): WRITE, SEND and READ payloads placed
//! before their ICRC is checked (`Pair::fused_receive`) arrive intact with one
//! completion, each placed packet's handling makes exactly the placed write, and the
//! packets the query must refuse (a RETH's, a multi-SGE window, short payloads,
//! duplicates) are not placed.

mod common;

use common::*;
use softnic_transport::testing::{Filter, Pair, Side, Verdict};
use softnic_transport::wr::{SendOp, WcOpcode, WcStatus};

const STEPS: u64 = 2_000_000;

/// A pair receiving through the single pass.
fn fused(mtu: u32, seed: u64) -> (Pair, Buf, Buf) {
    let (mut p, a, b) = pair(rc(mtu), seed);
    p.fused_receive = true;
    (p, a, b)
}

/// 64 KiB at MTU 4096 is 16 packets: First (RETH, not placed), 14 Middle, Last.
#[test]
fn a_write_is_placed_from_its_second_packet_on() {
    let p = write_64k_through(Box::new(|_| Verdict::Pass));
    assert_placed(&p, 15);
}

/// A SEND into one receive SGE: every packet but the First; into two SGEs, the
/// packet whose window spans both is not placed (nor is a short Last).
#[test]
fn a_send_is_placed_where_its_window_is_one_sge() {
    let (mut p, a, b) = fused(1024, 2);
    let size = 4 * 1024 + 100;
    let data = pattern(5, size);
    fill(&mut p.a, &a, 0, &data);
    p.b.qp.post_recv(recv(7, &[b.sge(0, size)])).unwrap();
    p.b.qp
        .post_recv(recv(
            8,
            &[b.sge(MIB, 1500), b.sge(2 * MIB - 8192, size - 1500)],
        ))
        .unwrap();
    for id in [1, 2] {
        p.a.qp
            .post_send(wr(id, SendOp::Send, &[a.sge(0, size)]))
            .unwrap();
    }
    p.drive(STEPS);
    assert_eq!(
        ids(&drain(&mut p.a)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rc = drain(&mut p.b);
    assert_eq!(ids(&rc), [(7, WcStatus::Success), (8, WcStatus::Success)]);
    assert!(rc
        .iter()
        .all(|c| c.opcode == WcOpcode::Recv && c.byte_len as usize == size));
    assert!(read(&p.b, &b, 0, size) == data, "first SEND differs");
    let mut got = read(&p.b, &b, MIB, 1500);
    got.extend(read(&p.b, &b, 2 * MIB - 8192, size - 1500));
    assert!(got == data, "second SEND differs");
    // First message: Middle ×3 + Last (100 B, too short) → 3. Second: packet 1
    // ([1024, 2048) spans the SGEs at 1500) is not placed; packets 2, 3 are → 2.
    assert_placed(&p, 5);
}

/// READ responses land in the READ's own buffer, the First one included (its
/// destination is the WQE's, not the packet's); B's side places nothing.
#[test]
fn read_responses_are_placed_at_the_requester() {
    let (mut p, a, b) = fused(1024, 3);
    let data = pattern(9, 3 * 1024);
    fill(&mut p.b, &b, 64, &data);
    p.a.qp
        .post_send(rdma(4, SendOp::Read, &[a.sge(8, data.len())], &b, 64))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(4, WcStatus::Success)]);
    assert!(
        read(&p.a, &a, 8, data.len()) == data,
        "READ payload differs"
    );
    assert_placed(&p, 3);
}

/// Duplicates are not placed: every Middle of a WRITE delivered twice still gives
/// 15 placements (not 29) and the right bytes.
#[test]
fn duplicates_are_not_placed() {
    let mut n = 0;
    let p = write_64k_through(Box::new(move |_| {
        n += 1;
        match n {
            2..=15 => Verdict::Duplicate,
            _ => Verdict::Pass,
        }
    }));
    assert_eq!(p.stats.duplicated, 14, "{:?}", p.stats);
    assert_placed(&p, 15);
}

/// Out-of-sequence packets are not placed: with the third packet of a WRITE lost, the
/// 13 after it arrive out of sequence (not placed), and the go-back-N resend of the
/// 14 from the third on is: 1 + 14 placements.
#[test]
fn out_of_sequence_packets_are_not_placed() {
    let mut done = false;
    let p = write_64k_through(Box::new(move |s| {
        if !done && s.from == Side::A && s.repr.bth.psn.value() == 102 {
            done = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    assert_eq!(p.b.qp.counters().out_of_sequence, 13);
    assert_placed(&p, 15);
}

/// A 64 KiB WRITE at MTU 4096 through `filter`, completed once with its bytes intact.
fn write_64k_through(filter: Filter) -> Pair {
    let (mut p, a, b) = fused(4096, 4);
    let data = pattern(11, 64 << 10);
    fill(&mut p.a, &a, 0, &data);
    p.filter = Some(filter);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, data.len())], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::Success)]);
    assert!(
        read(&p.b, &b, 0, data.len()) == data,
        "WRITE payload differs"
    );
    p
}

/// `n` packets were placed, and handling made each placed write.
fn assert_placed(p: &Pair, n: u64) {
    assert_eq!(
        (p.stats.placed, p.stats.place_mismatch),
        (n, 0),
        "{:?}",
        p.stats
    );
}
