//! The requester's AckReq policy (`qp/requester.rs`, IBTA 9.7.6.1.1): a stream of
//! messages from a deep send queue asks for an ACK once per interval, not once per
//! message; every message still completes; a message near the end of the queue, or
//! before a READ, asks at its end; a timer expiry on packets that never asked asks
//! rather than resends; and a move to SQD after a message that did not ask asks at once.

mod common;

use common::*;
use softnic_transport::qp::{QpAttr, QpState, ACK_REQ_INTERVAL, DEEP_QUEUE};
use softnic_transport::testing::{Pair, PairConfig};
use softnic_transport::time::{Duration, Instant};
use softnic_transport::wr::{SendOp, WcStatus};
use wire::{Opcode, PacketRepr};

const STEPS: u64 = 1_000_000;

/// What [`one_by_one`] saw.
#[derive(Debug, Default)]
struct Seen {
    /// AckReq of each request packet A sent, in order.
    ack_req: Vec<bool>,
    /// Positive ACKs B sent.
    acks: usize,
}

/// Moves A's packets to B one at a time, B answering each at once and A taking each
/// answer at once, 1 µs apart: no two requests ever share a receive batch, so the
/// responder coalesces nothing and every ACK is one an AckReq asked for (as between
/// two fast NICs on loopback, where the receiving NIC handles about one message per
/// pass of its loop).
fn one_by_one(p: &mut Pair) -> Seen {
    let mut seen = Seen::default();
    let mut buf = vec![0u8; 8192];
    let mut now = p.now;
    for _ in 0..100_000 {
        now = now + Duration::from_micros(1);
        let Some(t) = p.a.qp.poll_transmit(now, &mut buf, &p.a.mem) else {
            break;
        };
        let req = PacketRepr::parse(&buf[..t.len]).expect("request parses");
        seen.ack_req.push(req.repr.bth.ack_req);
        p.b.qp.handle_packet(now, p.a.addr, &req, &mut p.b.mem);
        seen.acks += answer(p, now);
    }
    p.now = now;
    seen
}

/// Hands B's queued responses to A at once; returns how many were ACKs.
fn answer(p: &mut Pair, now: Instant) -> usize {
    let mut buf = vec![0u8; 8192];
    let mut answers = Vec::new();
    while let Some(t) = p.b.qp.poll_transmit(now, &mut buf, &p.b.mem) {
        answers.push(buf[..t.len].to_vec());
    }
    let mut acks = 0;
    for bytes in answers {
        let ack = PacketRepr::parse(&bytes).expect("response parses");
        if ack.repr.bth.opcode == Opcode::RC_ACKNOWLEDGE {
            acks += 1;
        }
        p.a.qp.handle_packet(now, p.b.addr, &ack, &mut p.a.mem);
    }
    acks
}

/// Sends A's next packet to B at `now`; returns (PSN, AckReq).
fn send_one(p: &mut Pair, now: Instant) -> (u32, bool) {
    let mut buf = vec![0u8; 8192];
    let t =
        p.a.qp
            .poll_transmit(now, &mut buf, &p.a.mem)
            .expect("a packet");
    let req = PacketRepr::parse(&buf[..t.len]).expect("request parses");
    p.b.qp.handle_packet(now, p.a.addr, &req, &mut p.b.mem);
    (req.repr.bth.psn.value(), req.repr.bth.ack_req)
}

/// Posts `n` signaled WRITEs of `len` bytes (all from and to offset 0).
fn post_writes(p: &mut Pair, a: &Buf, b: &Buf, first_id: u64, n: usize, len: usize) {
    for i in 0..n as u64 {
        p.a.qp
            .post_send(rdma(first_id + i, SendOp::Write, &[a.sge(0, len)], b, 0))
            .unwrap();
    }
}

#[test]
fn a_stream_of_writes_asks_once_per_interval_and_every_write_completes() {
    let (mut p, a, b) = pair(rc(1024), 21);
    const N: usize = 100;
    let data = pattern(21, N * 4096);
    fill(&mut p.a, &a, 0, &data);
    // 100 WRITEs of 4 packets (400 PSNs), all queued before the first leaves.
    for i in 0..N {
        let w = rdma(
            i as u64,
            SendOp::Write,
            &[a.sge(i * 4096, 4096)],
            &b,
            i * 4096,
        );
        p.a.qp.post_send(w).unwrap();
    }
    let seen = one_by_one(&mut p);
    assert_eq!(seen.ack_req.len(), 4 * N);
    let asked: Vec<usize> = (0..4 * N).filter(|&k| seen.ack_req[k]).collect();
    // While DEEP_QUEUE WRITEs or more wait behind, one packet in ACK_REQ_INTERVAL asks
    // (63, 127, 191, 255); the last DEEP_QUEUE WRITEs (68..99) each ask at their end.
    // The old policy asked at every message's end: 100 AckReqs, 100 ACKs.
    let deep = N - DEEP_QUEUE;
    let interval = ACK_REQ_INTERVAL as usize;
    let mut want: Vec<usize> = (1..)
        .map(|k| k * interval - 1)
        .take_while(|&k| k < 4 * deep)
        .collect();
    want.extend((deep..N).map(|m| 4 * m + 3));
    assert_eq!(asked, want);
    assert_eq!(seen.acks, want.len());
    let done = drain(&mut p.a);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids,
        (0..N as u64).collect::<Vec<_>>(),
        "every WRITE completes, in order"
    );
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
    assert!(read(&p.b, &b, 0, data.len()) == data, "payload differs");
    assert_eq!(p.a.qp.counters().retransmitted_packets, 0);
}

#[test]
fn a_message_posted_alone_asks_at_its_end() {
    let (mut p, a, b) = pair(rc(1024), 22);
    for i in 0..3 {
        // Each WRITE is posted after the one before completed: nothing follows it.
        post_writes(&mut p, &a, &b, i, 1, 3000);
        let seen = one_by_one(&mut p);
        assert_eq!(seen.ack_req, vec![false, false, true], "WRITE {i}");
        assert_eq!(seen.acks, 1);
        let done = drain(&mut p.a);
        assert_eq!(ids(&done), vec![(i, WcStatus::Success)]);
    }
}

#[test]
fn a_write_before_a_read_asks_at_its_end() {
    let (mut p, a, b) = pair(rc(1024), 23);
    // WRITE, READ, then a deep queue of WRITEs: the first WRITE has DEEP_QUEUE + 1
    // WQEs behind it, but the READ next waits on max_rd_atomic, so it asks anyway.
    post_writes(&mut p, &a, &b, 0, 1, 100);
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(4096, 100)], &b, 0))
        .unwrap();
    post_writes(&mut p, &a, &b, 2, DEEP_QUEUE, 100);
    let seen = one_by_one(&mut p);
    assert_eq!(&seen.ack_req[..2], &[true, true]);
    assert_eq!(drain(&mut p.a).len(), 2 + DEEP_QUEUE);
}

/// Window-bound: 200 WRITEs of 4 packets over a link with latency, so the 128-PSN
/// window fills while ACKs are on the way. A full window always holds an AckReq (one
/// every interval ≤ half the window), so it reopens without the retransmission timer.
#[test]
fn a_full_window_reopens_without_the_timer() {
    let (mut p, a, b) = pair(rc(1024), 24);
    p.latency = Duration::from_micros(20);
    post_writes(&mut p, &a, &b, 0, 200, 4096);
    p.drive(STEPS);
    let done = drain(&mut p.a);
    assert_eq!(done.len(), 200);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    let c = p.a.qp.counters();
    assert_eq!(
        (c.retransmitted_packets, c.early_retransmits),
        (0, 0),
        "{c:?}"
    );
    // 800 packets at most 128 per 40 µs round trip: well under 1 ms unless a timer ran.
    assert!(
        p.now < Instant::ZERO + Duration::from_millis(1),
        "{:?}",
        p.now
    );
    assert_eq!(p.a.qp.state(), QpState::Rts);
}

/// Once a loss has shrunk the window (`cwnd.rs`), the packet that fills it asks for
/// an ACK: the ACK that reopens the window then answers everything sent, and if the
/// NAK of a gap before it was lost, the responder NAKs again on that packet instead of
/// leaving the requester to its timer. Every burst the window cuts short ends with
/// a packet that asks (before, only when the interval happened to fall there).
#[test]
fn the_packet_that_fills_a_shrunk_window_asks() {
    use softnic_transport::testing::{Side, Verdict};
    use std::cell::RefCell;
    use std::rc::Rc;
    let (mut p, a, b) = pair(rc(1024), 25);
    p.latency = Duration::from_micros(20);
    post_writes(&mut p, &a, &b, 0, 200, 4096);
    let sent: Rc<RefCell<Vec<(u32, bool)>>> = Rc::default();
    let log = sent.clone();
    let mut dropped = false;
    p.filter = Some(Box::new(move |s| {
        if s.from != Side::A {
            return Verdict::Pass;
        }
        let psn = s.repr.bth.psn.value();
        log.borrow_mut().push((psn, s.repr.bth.ack_req));
        if psn == 110 && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    // The last packet of each burst A sends (one `transmit` pass sends all it may).
    let mut ends = Vec::new();
    for _ in 0..STEPS {
        let before = sent.borrow().len();
        if !p.step() {
            break;
        }
        let now = sent.borrow().len();
        if now > before {
            ends.push(sent.borrow()[now - 1]);
        }
    }
    let done = drain(&mut p.a);
    assert_eq!(done.len(), 200);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(p.a.qp.counters().seq_nak_retries, 1);
    // The first burst filled the whole window; the last ran out of WRITEs.
    let cut = &ends[1..ends.len() - 1];
    assert!(cut.len() > 10, "{ends:?}");
    let unasked: Vec<_> = cut.iter().filter(|(_, ask)| !ask).collect();
    assert!(unasked.is_empty(), "bursts ending unasked: {unasked:?}");
}

/// The requesting NIC stalls (descheduled) in the middle of a stream, after packets
/// that did not ask for an ACK: the timer expires with nothing lost and nothing asked.
/// It asks with the next packet instead of going back N (without
/// `Qp::defer_unasked_timeout` all ten were resent).
#[test]
fn a_timeout_on_packets_that_did_not_ask_asks_instead_of_resending() {
    let (mut p, a, b) = pair(rc(1024), 25);
    post_writes(&mut p, &a, &b, 0, 40, 4096);
    let now = p.now;
    for k in 0..10 {
        assert_eq!(send_one(&mut p, now), (100 + k, false));
    }
    assert_eq!(answer(&mut p, now), 0, "nothing asked, nothing answered");
    let late =
        p.a.qp
            .poll_timeout()
            .expect("the retransmission timer runs");
    p.a.qp.handle_timeout(late);
    assert_eq!(send_one(&mut p, late), (110, true), "the next packet asks");
    assert_eq!(answer(&mut p, late), 1);
    p.now = late;
    one_by_one(&mut p);
    assert_eq!(drain(&mut p.a).len(), 40);
    let c = p.a.qp.counters();
    assert_eq!(
        (c.retransmitted_packets, c.early_retransmits),
        (0, 0),
        "{c:?}"
    );
}

/// A message that did not ask for its ACK (a deep queue was to follow), then a move to
/// SQD, which starts no new WQE: nothing would ask for that ACK any more, so the move
/// resends the message's last packet, asking, at once (`ask_before_draining`), and the
/// send queue drains without a timer. With `timeout` 0 no timer ever runs: the old
/// code had nothing to send and waited forever; with a timer it went back N when the
/// timer expired, and that expiry was charged against `retry_cnt` once a whole Local
/// ACK Timeout had passed.
#[test]
fn moving_to_sqd_after_a_message_that_did_not_ask_asks_at_once() {
    for timeout in [0, 10] {
        let cfg = PairConfig {
            timeout,
            ..rc(1024)
        };
        let (mut p, a, b) = pair(cfg, 26);
        post_writes(&mut p, &a, &b, 0, DEEP_QUEUE + 1, 100);
        let now = p.now;
        assert_eq!(send_one(&mut p, now), (100, false), "a deep queue follows");
        assert_eq!(answer(&mut p, now), 0, "nothing asked, nothing answered");
        let sqd = QpAttr {
            state: Some(QpState::Sqd),
            ..Default::default()
        };
        p.a.qp.modify(now, &sqd).unwrap();
        assert_eq!(
            send_one(&mut p, now),
            (100, true),
            "resent at once, asking (timeout {timeout})"
        );
        assert_eq!(answer(&mut p, now), 1, "the duplicate is re-acknowledged");
        let done = drain(&mut p.a);
        assert_eq!(ids(&done), vec![(0, WcStatus::Success)]);
        // Drained: the rest wait (SQD), nothing is outstanding, no timer runs.
        assert_eq!(p.a.qp.send_queue_len(), DEEP_QUEUE);
        assert_eq!(p.a.qp.poll_timeout(), None);
        let c = p.a.qp.counters();
        assert_eq!(
            (
                c.retransmitted_packets,
                c.early_retransmits,
                c.retransmit_timeouts
            ),
            (1, 0, 0),
            "{c:?}"
        );
        assert_eq!(p.b.qp.counters().duplicate_requests, 1);
    }
}
