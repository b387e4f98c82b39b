//! RC reliability, one deterministic scenario per behaviour (IBTA 9.7.4–9.7.6): lost
//! request packets, lost ACKs and READ responses, duplicates of each request kind,
//! reordering, RNR, retry exhaustion, flush on Err, PSN wrap-around, READ/atomic
//! limits. All in virtual time through the `Pair` harness.

mod common;

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use common::*;
use softnic_transport::qp::{AckTimer, QpAttr, QpState, RxeCompat};
use softnic_transport::testing::{connect_qp, Filter, Pair, PairConfig, Seen, Side, Verdict};
use softnic_transport::time::Duration;
use softnic_transport::wr::{Queue, SendOp, WcOpcode, WcStatus};
use wire::{Opcode, Operation};

const STEPS: u64 = 2_000_000;

/// A filter that applies `v` to the first packet matching `pred` only.
fn once(pred: impl Fn(&Seen) -> bool + 'static, v: Verdict) -> Filter {
    let mut done = false;
    Box::new(move |s| {
        if !done && pred(s) {
            done = true;
            v
        } else {
            Verdict::Pass
        }
    })
}

/// A filter that applies `v` to every packet A sends.
fn from_a(v: Verdict) -> Filter {
    Box::new(move |s| if s.from == Side::A { v } else { Verdict::Pass })
}

fn op(s: &Seen) -> Operation {
    s.repr
        .bth
        .opcode
        .info()
        .map(|i| i.operation)
        .unwrap_or(Operation::Cnp)
}

fn from_a_psn(psn: u32) -> impl Fn(&Seen) -> bool {
    move |s| s.from == Side::A && s.repr.bth.psn.value() == psn
}

/// SEND of `n` packets at MTU 256 with packet `lost` (index in the message) dropped
/// once; the message arrives once and intact.
fn send_with_loss(lost: u32, n: u32) -> Pair {
    let (mut p, a, b) = pair(rc(256), 1);
    let size = (n as usize - 1) * 256 + 100;
    let data = pattern(7, size);
    fill(&mut p.a, &a, 0, &data);
    p.filter = Some(once(from_a_psn(100 + lost), Verdict::Drop));
    p.b.qp.post_recv(recv(1, &[b.sge(0, size)])).unwrap();
    p.b.qp.post_recv(recv(2, &[b.sge(MIB, size)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, size)]))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(ids(&sc), vec![(1, WcStatus::Success)]);
    let rc = drain(&mut p.b);
    assert_eq!(rc.len(), 1, "delivered exactly once: {rc:?}");
    assert_eq!((rc[0].wr_id, rc[0].byte_len as usize), (1, size));
    assert!(read(&p.b, &b, 0, size) == data);
    assert_eq!(
        p.b.qp.recv_queue_len(),
        1,
        "the second receive is untouched"
    );
    assert!(p.a.qp.counters().retransmitted_packets >= 1);
    p
}

#[test]
fn lost_first_packet() {
    let p = send_with_loss(0, 8);
    // Packets 1..7 arrive out of sequence: exactly one PSN sequence NAK (IBTA
    // 9.7.5.1.3), and the requester goes back N on it.
    assert_eq!(p.b.qp.counters().nak_psn_seq_sent, 1);
    assert_eq!(p.a.qp.counters().seq_nak_retries, 1);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 0);
}

#[test]
fn lost_middle_packet() {
    let p = send_with_loss(4, 8);
    assert_eq!(p.b.qp.counters().nak_psn_seq_sent, 1);
    assert_eq!(p.b.qp.counters().out_of_sequence, 3);
}

/// The responder NAKs a gap once and then drops silently until the missing PSN
/// arrives (IBTA 9.7.5.1.3; a repeated NAK for a later packet that asks is ignored
/// while the requester goes back), so a lost first resend used to wait for the timer. The
/// requester sends that one packet twice: losing one copy costs nothing more.
#[test]
fn lost_packet_and_its_first_resend_are_repaired_without_the_timer() {
    let mut dropped = 0;
    let lost = from_a_psn(102);
    send_repaired_by_one_nak(Box::new(move |s| {
        if dropped < 2 && lost(s) {
            dropped += 1;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
}

/// An 8-packet SEND at MTU 256 through `filter` arrives once and intact, repaired by
/// one go-back-N on a PSN sequence NAK without any retransmission timer; returns the
/// pair.
fn send_repaired_by_one_nak(filter: Filter) -> Pair {
    let (mut p, a, b) = pair(rc(256), 1);
    let size = 7 * 256 + 100;
    let data = pattern(8, size);
    fill(&mut p.a, &a, 0, &data);
    p.filter = Some(filter);
    p.b.qp.post_recv(recv(1, &[b.sge(0, size)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, size)]))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    let rc = drain(&mut p.b);
    assert_eq!(rc.len(), 1, "delivered exactly once: {rc:?}");
    assert!(read(&p.b, &b, 0, size) == data);
    let c = p.a.qp.counters();
    assert_eq!(c.seq_nak_retries, 1);
    assert_eq!(
        (c.early_retransmits, c.retransmit_timeouts),
        (0, 0),
        "no timer ran"
    );
    p
}

/// A lost packet whose NAK is lost too: the responder NAKs once per gap, so the
/// requester used to wait for its retransmission timer. A packet that asks for an
/// ACK and arrives after the NAK left (here the message's last, in a later batch) is
/// NAKed again, and the requester goes back on that NAK instead.
#[test]
fn a_lost_nak_is_repaired_by_the_next_packet_that_asks() {
    let (mut lost_data, mut lost_nak) = (false, false);
    let p = send_repaired_by_one_nak(Box::new(move |s| {
        let psn = s.repr.bth.psn.value();
        if s.from == Side::A && psn == 102 && !lost_data {
            lost_data = true;
            Verdict::Drop
        } else if s.from == Side::B && op(s) == Operation::Acknowledge && !lost_nak {
            lost_nak = true;
            Verdict::Drop
        } else if s.from == Side::A && psn == 107 {
            // The last packet, asking, arrives after the NAK has left.
            Verdict::Delay(Duration::from_micros(5))
        } else {
            Verdict::Pass
        }
    }));
    assert_eq!(p.b.qp.counters().nak_psn_seq_sent, 2);
}

/// When the first resend arrives, its second copy is a duplicate: re-acknowledged,
/// never executed twice.
#[test]
fn the_repeated_first_resend_is_a_harmless_duplicate() {
    let p = send_with_loss(2, 8);
    assert_eq!(p.b.qp.counters().duplicate_requests, 1);
    assert_eq!(p.a.qp.counters().early_retransmits, 0);
}

#[test]
fn lost_last_packet() {
    // Nothing follows the last packet, so only the Local ACK Timeout recovers it.
    let p = send_with_loss(7, 8);
    assert_eq!(p.b.qp.counters().nak_psn_seq_sent, 0);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 1);
}

#[test]
fn lost_only_packet_of_write_and_atomic() {
    for kind in 0..2 {
        let (mut p, a, b) = pair(rc(1024), 2);
        fill(&mut p.a, &a, 0, &pattern(1, 100));
        p.filter = Some(once(from_a_psn(100), Verdict::Drop));
        let w = if kind == 0 {
            rdma(1, SendOp::Write, &[a.sge(0, 100)], &b, 0)
        } else {
            rdma(1, SendOp::FetchAdd { add: 5 }, &[a.sge(200, 8)], &b, 0)
        };
        p.a.qp.post_send(w).unwrap();
        p.drive(STEPS);
        assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
        assert_eq!(p.a.qp.counters().retransmit_timeouts, 1);
    }
}

#[test]
fn lost_ack() {
    let (mut p, a, b) = pair(rc(1024), 3);
    p.filter = Some(once(|s| s.from == Side::B, Verdict::Drop));
    p.b.qp.post_recv(recv(1, &[b.sge(0, 100)])).unwrap();
    p.b.qp.post_recv(recv(2, &[b.sge(0, 100)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 50)]))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a).len(), 1);
    assert_eq!(
        drain(&mut p.b).len(),
        1,
        "the resent SEND is not delivered again"
    );
    assert_eq!(p.b.qp.counters().duplicate_requests, 1);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 1);
}

fn read_with_lost_response(index: u32, timer: AckTimer) -> Pair {
    let (mut p, a, b) = pair(rc(256), 4);
    p.a.qp.set_ack_timer(timer);
    let data = pattern(9, 1000);
    fill(&mut p.b, &b, 0, &data);
    p.filter = Some(once(
        move |s| s.from == Side::B && s.repr.bth.psn.value() == 100 + index,
        Verdict::Drop,
    ));
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(0, 1000)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(
        (sc[0].status, sc[0].byte_len),
        (WcStatus::Success, 1000),
        "lost response {index}: {:?} {:?}",
        p.a.qp.counters(),
        p.b.qp.counters()
    );
    assert!(read(&p.a, &a, 0, 1000) == data);
    p
}

#[test]
fn lost_read_response_first_middle_last() {
    // Losing the first or a middle response packet: the next one skips PSNs, an
    // implied NAK (IBTA 9.7.5.1.4) — the READ is resent for the rest.
    for i in [0, 1] {
        let p = read_with_lost_response(i, AckTimer::Adaptive);
        assert_eq!(p.a.qp.counters().implied_nak_retries, 1, "index {i}");
        assert_eq!(p.b.qp.counters().duplicate_requests, 1);
    }
    // Losing the last: only the timer can tell. The first three responses gave the
    // adaptive timer an RTT sample, so it resends after MIN_RTO at no cost to
    // retry_cnt; strict timing waits the Local ACK Timeout and charges a retry.
    for (timer, want) in [(AckTimer::Adaptive, (0, 1)), (AckTimer::Strict, (1, 0))] {
        let c = *read_with_lost_response(3, timer).a.qp.counters();
        assert_eq!(
            (c.retransmit_timeouts, c.early_retransmits),
            want,
            "{timer:?}"
        );
    }
}

#[test]
fn read_response_lost_then_later_ack_is_an_implied_nak() {
    let (mut p, a, b) = pair(rc(1024), 5);
    fill(&mut p.b, &b, 0, &pattern(3, 64));
    p.filter = Some(once(
        |s| s.from == Side::B && op(s) == Operation::ReadResponse,
        Verdict::Drop,
    ));
    p.b.qp.post_recv(recv(1, &[b.sge(4096, 64)])).unwrap();
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(0, 64)], &b, 0))
        .unwrap();
    p.a.qp
        .post_send(wr(2, SendOp::Send, &[a.sge(100, 10)]))
        .unwrap();
    p.drive(STEPS);
    let ids = ids(&drain(&mut p.a));
    assert_eq!(ids, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(read(&p.a, &a, 0, 64), pattern(3, 64));
    assert_eq!(p.a.qp.counters().implied_nak_retries, 1);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 0);
    assert_eq!(drain(&mut p.b).len(), 1);
}

#[test]
fn duplicated_send_and_write_execute_once() {
    let (mut p, a, b) = pair(rc(256), 6);
    fill(&mut p.a, &a, 0, &pattern(4, 600));
    p.filter = Some(from_a(Verdict::Duplicate));
    p.b.qp.post_recv(recv(1, &[b.sge(0, 600)])).unwrap();
    p.b.qp.post_recv(recv(2, &[b.sge(0, 600)])).unwrap();
    p.b.qp.post_recv(recv(3, &[b.sge(0, 600)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 600)]))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::WriteWithImm(5), &[a.sge(0, 600)], &b, 4096))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a).len(), 2);
    let rc: Vec<_> = drain(&mut p.b)
        .iter()
        .map(|c| (c.wr_id, c.opcode))
        .collect();
    assert_eq!(
        rc,
        vec![(1, WcOpcode::Recv), (2, WcOpcode::RecvRdmaWithImm)]
    );
    assert_eq!(p.b.qp.counters().duplicate_requests, 6);
    assert_eq!(read(&p.b, &b, 4096, 600), pattern(4, 600));
}

#[test]
fn duplicated_read_is_executed_again_and_completes_once() {
    let (mut p, a, b) = pair(rc(256), 7);
    fill(&mut p.b, &b, 0, &pattern(5, 700));
    p.filter = Some(from_a(Verdict::Duplicate));
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(0, 700)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 1);
    assert_eq!(read(&p.a, &a, 0, 700), pattern(5, 700));
    assert_eq!(p.b.qp.counters().duplicate_requests, 1);
    assert_eq!(p.b.qp.counters().read_responses_sent, 6, "3 packets, twice");
    // The second copy of each response is a stale duplicate, ignored (not a drop).
    assert_eq!(p.a.qp.counters().duplicate_responses, 3);
    assert_eq!(p.a.qp.counters().drop_unexpected_response, 0);
}

#[test]
fn duplicated_atomic_is_answered_from_the_cache_never_executed_twice() {
    let (mut p, a, b) = pair(rc(1024), 8);
    p.filter = Some(from_a(Verdict::Duplicate));
    for i in 0..3 {
        p.a.qp
            .post_send(rdma(
                i,
                SendOp::FetchAdd { add: 10 },
                &[a.sge(8 * i as usize, 8)],
                &b,
                0,
            ))
            .unwrap();
    }
    p.a.qp
        .post_send(rdma(
            3,
            SendOp::CompareSwap {
                compare: 30,
                swap: 7,
            },
            &[a.sge(24, 8)],
            &b,
            0,
        ))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert!(sc.iter().all(|c| c.status == WcStatus::Success), "{sc:?}");
    assert_eq!(sc.len(), 4);
    let v = |off| u64::from_ne_bytes(read(&p.a, &a, off, 8).try_into().unwrap());
    assert_eq!([v(0), v(8), v(16), v(24)], [0, 10, 20, 30]);
    let fin = u64::from_ne_bytes(read(&p.b, &b, 0, 8).try_into().unwrap());
    assert_eq!(fin, 7);
    assert_eq!(p.b.qp.counters().atomic_replays, 4);
}

#[test]
fn duplicate_atomic_missing_from_cache_is_dropped() {
    // A copy of the first atomic arrives 1 ms late, after 40 newer atomics have
    // pushed its result out of the cache: it must be dropped, not executed again.
    let (mut p, a, b) = pair(rc(1024), 9);
    p.filter = Some(once(
        from_a_psn(100),
        Verdict::DuplicateLate(Duration::from_millis(1)),
    ));
    for i in 0..40 {
        p.a.qp
            .post_send(rdma(i, SendOp::FetchAdd { add: 1 }, &[a.sge(0, 8)], &b, 0))
            .unwrap();
    }
    p.drive(STEPS);
    let fin = u64::from_ne_bytes(read(&p.b, &b, 0, 8).try_into().unwrap());
    assert_eq!(fin, 40);
    assert_eq!(drain(&mut p.a).len(), 40);
    assert_eq!(p.b.qp.counters().drop_duplicate, 1);
    assert_eq!(p.b.qp.counters().atomic_replays, 0);
}

#[test]
fn reordered_packets() {
    let (mut p, a, b) = pair(rc(256), 10);
    let data = pattern(6, 2560);
    fill(&mut p.a, &a, 0, &data);
    // PSN 102 overtaken by 103..109.
    p.filter = Some(once(
        from_a_psn(102),
        Verdict::Delay(Duration::from_micros(30)),
    ));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 2560)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    assert!(read(&p.b, &b, 0, 2560) == data);
    assert_eq!(p.b.qp.counters().nak_psn_seq_sent, 1);
    assert!(
        p.b.qp.counters().duplicate_requests >= 1,
        "the late original is a duplicate"
    );
}

/// Steps until the first RNR NAK has arrived and A waits it out.
fn until_the_first_rnr_wait(p: &mut Pair) {
    for _ in 0..1000 {
        p.step();
        if p.a.qp.counters().rnr_retries == 1 {
            return;
        }
    }
    panic!("no RNR wait: {p:?}");
}

#[test]
fn rnr_then_recovery() {
    let (mut p, a, b) = pair(rc(1024), 11);
    fill(&mut p.a, &a, 0, &pattern(8, 3000));
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 3000)]))
        .unwrap();
    until_the_first_rnr_wait(&mut p);
    assert_eq!(p.b.qp.counters().nak_rnr_sent, 1);
    let t0 = p.now;
    p.b.qp.post_recv(recv(1, &[b.sge(0, 3000)])).unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!((sc[0].wr_id, sc[0].status), (1, WcStatus::Success));
    assert_eq!(drain(&mut p.b)[0].byte_len, 3000);
    assert_eq!(read(&p.b, &b, 0, 3000), pattern(8, 3000));
    // min_rnr_timer 1 = 10 µs (IBTA table 45) before the resend.
    assert!(p.now - t0 >= Duration::from_micros(9), "{:?}", p.now - t0);
}

/// The first resend after a PSN sequence NAK goes out twice (`repeat_head`); when both
/// copies meet an empty receive queue the responder RNR-NAKs each. The second NAK
/// arrives while the requester already waits out the first: it is an echo, not a
/// second retry, so `rnr_retry` 1 still gives the one retry it promises (the old code
/// charged both NAKs and failed with RNR_RETRY_EXC_ERR without retrying at all).
#[test]
fn an_rnr_nak_echo_during_the_wait_is_not_charged_again() {
    let cfg = PairConfig {
        rnr_retry: 1,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 14);
    // The first SEND's packet is lost; the second's draws the NAK.
    p.filter = Some(once(from_a_psn(100), Verdict::Drop));
    for id in 1..=2 {
        p.a.qp
            .post_send(wr(id, SendOp::Send, &[a.sge(0, 10)]))
            .unwrap();
    }
    until_the_first_rnr_wait(&mut p);
    assert_eq!(p.a.qp.counters().seq_nak_retries, 1);
    for id in 1..=2 {
        p.b.qp.post_recv(recv(id, &[b.sge(0, 10)])).unwrap();
    }
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    assert_eq!(sc, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(drain(&mut p.b).len(), 2, "each SEND delivered once");
    assert_eq!(
        p.b.qp.counters().nak_rnr_sent,
        2,
        "both copies of the resend met an empty queue"
    );
    let c = p.a.qp.counters();
    assert_eq!((c.nak_rnr_received, c.rnr_retries), (2, 1), "{c:?}");
}

#[test]
fn rnr_retry_exhausted() {
    let cfg = PairConfig {
        rnr_retry: 2,
        ..rc(1024)
    };
    let (mut p, a, _b) = pair(cfg, 12);
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 10)]))
        .unwrap();
    p.a.qp
        .post_send(wr(2, SendOp::Send, &[a.sge(0, 10)]))
        .unwrap();
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    assert_eq!(
        sc,
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.b.qp.counters().nak_rnr_sent, 3, "first try + 2 retries");
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(
        p.b.qp.state(),
        QpState::Rts,
        "RNR is not an error for the responder"
    );
}

#[test]
fn rnr_retry_7_is_infinite() {
    let (mut p, a, b) = pair(rc(1024), 13);
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 10)]))
        .unwrap();
    assert!(!p.drive_bounded(2000), "keeps retrying");
    assert!(p.b.qp.counters().nak_rnr_sent > 20);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 10)])).unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
}

#[test]
fn retry_exhausted() {
    let cfg = PairConfig {
        retry_cnt: 3,
        timeout: 8,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 14);
    p.filter = Some(from_a(Verdict::Drop));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 10)], &b, 0))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::Read, &[a.sge(0, 10)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    assert_eq!(
        sc,
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 3);
    // 4 timeouts of 4.096 µs × 2^8 = 1.048576 ms each.
    let t = p.now.as_nanos();
    assert!((4 * 1_048_576..4 * 1_048_576 + 100_000).contains(&t), "{t}");
    assert!(p.a.qp.post_send(wr(3, SendOp::Send, &[])).is_ok());
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::WrFlushErr);
}

/// A Local ACK Timeout far below what a loaded host can answer in (`timeout` 1: 8 µs)
/// is raised to `MIN_CHARGED_ACK_TIMEOUT` (≈ 1.05 ms, rxe's one jiffy at HZ=1000) for
/// what counts as a retry: a peer silent for 2 ms costs no connection with
/// `retry_cnt` 3, where strict timing charges a retry every 8 µs and gives up after 32.
#[test]
fn a_tiny_local_ack_timeout_is_charged_no_faster_than_the_floor() {
    for (timer, dead) in [(AckTimer::Adaptive, false), (AckTimer::Strict, true)] {
        let cfg = PairConfig {
            retry_cnt: 3,
            timeout: 1,
            ..rc(1024)
        };
        let (mut p, a, b) = pair(cfg, 14);
        p.a.qp.set_ack_timer(timer);
        // Silent for 2 ms, then the path answers.
        let until = p.now + softnic_transport::time::Duration::from_millis(2);
        p.filter = Some(from_a(Verdict::Drop));
        p.a.qp
            .post_send(rdma(1, SendOp::Write, &[a.sge(0, 10)], &b, 0))
            .unwrap();
        for _ in 0..STEPS {
            if p.now >= until || !p.step() {
                break;
            }
        }
        p.filter = None;
        p.drive(STEPS);
        let want = if dead {
            WcStatus::RetryExcErr
        } else {
            WcStatus::Success
        };
        assert_eq!(drain(&mut p.a)[0].status, want, "{timer:?}");
        let charged = p.a.qp.counters().retransmit_timeouts;
        if dead {
            assert_eq!(charged, 3, "{timer:?}");
        } else {
            // One per ≈ 1.05 ms of silence, the second at most as the path returns.
            assert!(charged <= 2, "{timer:?}: {charged} charged in 2 ms");
        }
    }
}

/// With an RTT estimate the adaptive timer resends a lost packet within milliseconds
/// instead of the 67 ms Local ACK Timeout of `timeout` 14 — yet a peer that went silent
/// is declared dead exactly when strict timing would: after `retry_cnt + 1` Local ACK
/// Timeouts without progress (IBTA 9.7.6.1.3), and only those cost retries.
#[test]
fn adaptive_timer_resends_early_but_gives_up_on_the_spec_schedule() {
    const LAT_NS: u64 = 4096 << 14;
    let cfg = PairConfig {
        retry_cnt: 3,
        timeout: 14,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 14);
    // One answered WRITE gives the estimator its sample.
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 10)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    // Then the peer goes silent.
    p.filter = Some(from_a(Verdict::Drop));
    let t0 = p.now.as_nanos();
    p.a.qp
        .post_send(rdma(2, SendOp::Write, &[a.sge(0, 10)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::RetryExcErr);
    let c = *p.a.qp.counters();
    assert_eq!(c.retransmit_timeouts, 3, "{c:?}");
    assert!(c.early_retransmits >= 4, "resent early too: {c:?}");
    let dead_after = p.now.as_nanos() - t0;
    assert!(
        (4 * LAT_NS..4 * LAT_NS + LAT_NS / 2).contains(&dead_after),
        "{dead_after} ns"
    );
}

/// A responder whose ACKs come late (its NIC descheduled) makes the adaptive timer
/// expire with nothing lost. The requester resends only the last packet sent, asking
/// (`Qp::probe_tail`); the late ACKs, and the answer to that duplicate, acknowledge
/// everything sent before the expiry, so it goes on with its window whole instead of
/// resending the window it had out. (Before session 7 all 24 packets went out again.)
#[test]
fn a_spurious_early_expiry_resends_one_packet_and_keeps_the_window() {
    let cfg = PairConfig {
        timeout: 14,
        ..rc(1024)
    };
    let (mut p, a, b) = sampled_pair(cfg);
    // B's ACKs are held up for 2 ms, far past the adaptive timeout.
    let mut held = 0;
    p.filter = Some(Box::new(move |s| {
        if s.from == Side::B && held < 1 {
            held += 1;
            Verdict::Delay(Duration::from_millis(2))
        } else {
            Verdict::Pass
        }
    }));
    write_once(&mut p, &a, &b, 24 * 1024, 16, STEPS);
    let c = *p.a.qp.counters();
    assert_eq!(c.early_retransmits, 1, "{c:?}");
    assert_eq!(c.spurious_timeouts, 1, "{c:?}");
    assert_eq!(c.retransmitted_packets, 1, "only the probe: {c:?}");
    assert_eq!(p.b.qp.counters().duplicate_requests, 1);
}

/// A real tail loss: the early expiry resends the last packet sent (a tail-loss
/// probe, `Qp::probe_tail`), which here is the lost one, so the probe alone repairs it
/// and its ACK covers everything sent (counted with `spurious_timeouts`: nothing more
/// to resend). Before, the expiry resent the oldest packet and then went back N from
/// the first PSN not acknowledged: two packets.
#[test]
fn an_early_expiry_on_a_lost_tail_is_repaired_by_the_probe_alone() {
    let (mut p, a, b) = sampled_pair(PairConfig {
        timeout: 14,
        ..rc(1024)
    });
    // The WRITE's last packet (PSN 108 + 23), asking, is lost once.
    p.filter = Some(once(from_a_psn(108 + 23), Verdict::Drop));
    write_once(&mut p, &a, &b, 24 * 1024, 17, STEPS);
    let c = *p.a.qp.counters();
    assert_eq!((c.early_retransmits, c.spurious_timeouts), (1, 1), "{c:?}");
    assert_eq!(
        c.retransmitted_packets, 1,
        "the probe, the lost packet: {c:?}"
    );
}

#[test]
fn retry_cnt_7_is_seven_unless_rxe_compat() {
    let cfg = PairConfig {
        retry_cnt: 7,
        timeout: 1,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 15);
    p.filter = Some(from_a(Verdict::Drop));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::RetryExcErr);
    assert_eq!(p.a.qp.counters().retransmit_timeouts, 7);

    let (mut p, a, b) = pair(cfg, 15);
    p.a.qp.set_rxe_compat(RxeCompat {
        retry_cnt_7_is_infinite: true,
    });
    p.filter = Some(from_a(Verdict::Drop));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1)], &b, 0))
        .unwrap();
    assert!(!p.drive_bounded(5000));
    assert!(p.a.qp.counters().retransmit_timeouts > 100);
    assert!(drain(&mut p.a).is_empty());
}

#[test]
fn timeout_0_is_infinite() {
    let cfg = PairConfig {
        timeout: 0,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 16);
    p.filter = Some(Box::new(|_| Verdict::Drop));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(p.a.qp.poll_timeout(), None);
    assert!(drain(&mut p.a).is_empty());
    assert_eq!(p.a.qp.send_queue_len(), 1, "still outstanding, no timer");
}

#[test]
fn flush_on_err_with_work_in_flight() {
    let (mut p, a, b) = pair(rc(256), 17);
    for i in 0..3 {
        p.b.qp.post_recv(recv(100 + i, &[b.sge(0, 4096)])).unwrap();
    }
    for i in 0..5 {
        let mut w = rdma(i, SendOp::Write, &[a.sge(0, 2000)], &b, 0);
        w.signaled = i != 1;
        p.a.qp.post_send(w).unwrap();
    }
    // A few packets out, none acknowledged yet.
    p.transmit();
    p.a.qp
        .modify(
            p.now,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        )
        .unwrap();
    p.b.qp
        .modify(
            p.now,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        )
        .unwrap();
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    // Every WQE, signaled or not, once, in order.
    assert_eq!(
        sc,
        (0..5)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    let rc: Vec<_> = drain(&mut p.b)
        .iter()
        .map(|c| (c.queue, c.wr_id, c.status))
        .collect();
    assert_eq!(
        rc,
        (100..103)
            .map(|i| (Queue::Recv, i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert_eq!(p.a.qp.poll_timeout(), None);
}

#[test]
fn psn_wraps_at_2_pow_24() {
    let cfg = PairConfig {
        psns: ((1 << 24) - 5, (1 << 24) - 2),
        ..rc(256)
    };
    let (mut p, a, b) = pair(cfg, 18);
    let data = pattern(11, 4000);
    fill(&mut p.a, &a, 0, &data);
    fill(&mut p.b, &b, MIB, &data);
    // Lose the packet with PSN 0 (after the wrap) once, in each direction.
    let seen = Rc::new(RefCell::new(HashSet::new()));
    let s2 = seen.clone();
    p.filter = Some(Box::new(move |s| {
        if s.repr.bth.psn.value() == 0 && s2.borrow_mut().insert(s.from == Side::A) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    p.b.qp.post_recv(recv(1, &[b.sge(0, 4000)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 4000)]))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::Read, &[a.sge(8192, 4000)], &b, MIB))
        .unwrap();
    p.b.qp
        .post_send(rdma(3, SendOp::Write, &[b.sge(MIB, 4000)], &a, 16384))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(seen.borrow().len(), 2);
    let sa = ids(&drain(&mut p.a));
    let sb = ids(&drain(&mut p.b));
    assert_eq!(sa, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(sb, vec![(1, WcStatus::Success), (3, WcStatus::Success)]);
    assert!(read(&p.b, &b, 0, 4000) == data);
    assert!(read(&p.a, &a, 8192, 4000) == data);
    assert!(read(&p.a, &a, 16384, 4000) == data);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let cfg = PairConfig {
        rd_atomic: 2,
        ..rc(256)
    };
    let (mut p, a, b) = pair(cfg, 19);
    // Track READ requests in flight: +1 per request, -1 per last/only response.
    let depth = Rc::new(RefCell::new((0i32, 0i32)));
    let d2 = depth.clone();
    p.filter = Some(Box::new(move |s| {
        let info = s.repr.bth.opcode.info().unwrap();
        let mut d = d2.borrow_mut();
        match info.operation {
            Operation::ReadRequest | Operation::FetchAdd => d.0 += 1,
            Operation::ReadResponse if info.position.ends() => d.0 -= 1,
            Operation::AtomicAcknowledge => d.0 -= 1,
            _ => {}
        }
        d.1 = d.1.max(d.0);
        Verdict::Pass
    }));
    for i in 0..6 {
        let w = if i % 3 == 2 {
            rdma(i, SendOp::FetchAdd { add: 1 }, &[a.sge(MIB, 8)], &b, MIB)
        } else {
            rdma(i, SendOp::Read, &[a.sge(0, 1000)], &b, 0)
        };
        p.a.qp.post_send(w).unwrap();
    }
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a).len(), 6);
    assert_eq!(
        depth.borrow().1,
        2,
        "never more than max_rd_atomic outstanding"
    );
}

#[test]
fn reads_beyond_max_dest_rd_atomic_are_invalid_requests() {
    // A requester allowed 4 outstanding READs against a responder that serves 1.
    let mut p = Pair::connect(rc(1024), 20);
    let cfg_b = PairConfig {
        rd_atomic: 1,
        ..rc(1024)
    };
    let mut qb =
        softnic_transport::qp::Qp::new(0x22, softnic_transport::qp::QpType::Rc, 1, cfg_b.caps);
    connect_qp(&mut qb, &cfg_b, 0x11, p.a.addr, 100, 5000);
    p.b.qp = qb;
    let a = region(
        &mut p.a,
        0x1000,
        8192,
        softnic_transport::memory::Access::ALL,
    );
    let b = region(
        &mut p.b,
        0x1000,
        8192,
        softnic_transport::memory::Access::ALL,
    );
    for i in 0..2 {
        p.a.qp
            .post_send(rdma(i, SendOp::Read, &[a.sge(0, 3000)], &b, 0))
            .unwrap();
    }
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    assert_eq!(
        sc,
        vec![(0, WcStatus::Success), (1, WcStatus::RemInvReqErr)]
    );
    assert_eq!(p.b.qp.counters().nak_invalid_request_sent, 1);
}

#[test]
fn corruption_is_caught_by_the_icrc_and_recovered() {
    let (mut p, a, b) = pair(rc(512), 21);
    p.faults.corrupt = 0.05;
    let data = pattern(12, 200_000);
    fill(&mut p.a, &a, 0, &data);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 200_000)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    assert!(read(&p.b, &b, 0, 200_000) == data);
    assert!(p.stats.corrupted > 5);
    assert_eq!(
        p.stats.icrc_errors + p.stats.corrupted_masked,
        p.stats.corrupted
    );
}

#[test]
fn opcode_table_names_for_traces() {
    // Keep the opcode import honest: traces in failures print IBTA names.
    assert_eq!(format!("{}", Opcode::RC_ACKNOWLEDGE), "RC_ACKNOWLEDGE");
}

#[test]
fn sqd_finishes_started_messages_and_starts_no_new_ones() {
    let (mut p, a, b) = pair(rc(256), 22);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1024)], &b, 0))
        .unwrap();
    // The first packet of WR 1 leaves, then the send queue is drained.
    let mut buf = vec![0u8; 4096 + 128];
    assert!(p.a.qp.poll_transmit(p.now, &mut buf, &p.a.mem).is_some());
    let sqd = QpAttr {
        state: Some(QpState::Sqd),
        ..Default::default()
    };
    p.a.qp.modify(p.now, &sqd).unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::Write, &[a.sge(0, 10)], &b, 4096))
        .unwrap();
    p.filter = Some(Box::new(|_| Verdict::Pass));
    p.drive(STEPS);
    // WR 1 was started (PSNs assigned) and is finished; WR 2 waits.
    assert_eq!(
        drain(&mut p.a).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(p.a.qp.send_queue_len(), 1);
    let rts = QpAttr {
        state: Some(QpState::Rts),
        ..Default::default()
    };
    p.a.qp.modify(p.now, &rts).unwrap();
    p.drive(STEPS);
    assert_eq!(
        drain(&mut p.a).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![2]
    );
}

/// Found by the rxe interop suite (`write_bw_q4`, `send_bw_q4`, softnic as the client of
/// `ib_write_bw -q 4` in a TCG guest): with 1024 unacknowledged PSNs per QP softnic
/// flooded the guest, every loss made go-back-N resend the whole window into the same
/// overflowing queue, and `retry_cnt` ran out (IBV_WC_RETRY_EXC_ERR). rxe's own requester
/// never has more than 128 (`RXE_MAX_UNACKED_PSNS`, rxe_req.c); with the same bound the
/// scenario runs without a single retransmission. Responses are all dropped here, so
/// what A sends before its first timeout is exactly its window.
#[test]
fn unacknowledged_request_psns_are_bounded_like_rxe() {
    let (mut p, a, b) = pair(rc(256), 23);
    let psns = Rc::new(RefCell::new(HashSet::new()));
    let seen = psns.clone();
    p.filter = Some(Box::new(move |s| {
        if s.from == Side::A {
            seen.borrow_mut().insert(s.repr.bth.psn.value());
            Verdict::Pass
        } else {
            Verdict::Drop
        }
    }));
    // 300 packets: more than the window.
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 300 * 256)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(
        psns.borrow().len(),
        128,
        "distinct request PSNs sent without an ACK"
    );
    let sc: Vec<_> = drain(&mut p.a).iter().map(|c| c.status).collect();
    assert_eq!(sc, vec![WcStatus::RetryExcErr]);
}
