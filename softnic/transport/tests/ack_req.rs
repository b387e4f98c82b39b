//! The requester's AckReq policy (`qp/requester.rs`, IBTA 9.7.6.1.1): a stream of
//! messages asks for an ACK once per interval, not once per message, every message
//! still completes, and a message with nothing queued behind it asks at its end.

mod common;

use common::*;
use softnic_transport::qp::QpState;
use softnic_transport::testing::Pair;
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
        let mut answers = Vec::new();
        while let Some(t) = p.b.qp.poll_transmit(now, &mut buf, &p.b.mem) {
            answers.push(buf[..t.len].to_vec());
        }
        for bytes in answers {
            let ack = PacketRepr::parse(&bytes).expect("response parses");
            if ack.repr.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                seen.acks += 1;
            }
            p.a.qp.handle_packet(now, p.b.addr, &ack, &mut p.a.mem);
        }
    }
    p.now = now;
    seen
}

#[test]
fn a_stream_of_writes_asks_once_per_interval_and_every_write_completes() {
    let (mut p, a, b) = pair(rc(1024), 21);
    let data = pattern(21, 40 * 4096);
    fill(&mut p.a, &a, 0, &data);
    // 40 WRITEs of 4 packets (160 PSNs), all queued before the first leaves.
    for i in 0..40 {
        let w = rdma(
            i,
            SendOp::Write,
            &[a.sge(i as usize * 4096, 4096)],
            &b,
            i as usize * 4096,
        );
        p.a.qp.post_send(w).unwrap();
    }
    let seen = one_by_one(&mut p);
    assert_eq!(seen.ack_req.len(), 160);
    let asked: Vec<usize> = (0..160).filter(|&k| seen.ack_req[k]).collect();
    // Every 64th packet (ACK_REQ_INTERVAL), and the last: the queue ends there. The old
    // policy asked at each message's end: 40 AckReqs, 40 ACKs.
    assert_eq!(asked, vec![63, 127, 159]);
    assert_eq!(seen.acks, 3);
    let done = drain(&mut p.a);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids,
        (0..40).collect::<Vec<_>>(),
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
        p.a.qp
            .post_send(rdma(i, SendOp::Write, &[a.sge(0, 3000)], &b, 0))
            .unwrap();
        let seen = one_by_one(&mut p);
        assert_eq!(seen.ack_req, vec![false, false, true], "WRITE {i}");
        assert_eq!(seen.acks, 1);
        let done = drain(&mut p.a);
        assert_eq!(
            done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(i, WcStatus::Success)]
        );
    }
}

#[test]
fn a_write_before_a_read_asks_at_its_end() {
    let (mut p, a, b) = pair(rc(1024), 23);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 100)], &b, 0))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::Read, &[a.sge(4096, 100)], &b, 0))
        .unwrap();
    p.a.qp
        .post_send(rdma(3, SendOp::Write, &[a.sge(0, 100)], &b, 0))
        .unwrap();
    let seen = one_by_one(&mut p);
    // The READ waits on max_rd_atomic, so the WRITE before it does not count on it.
    assert_eq!(seen.ack_req, vec![true, true, true]);
    assert_eq!(drain(&mut p.a).len(), 3);
}

/// Window-bound: 200 WRITEs of 4 packets over a link with latency, so the 128-PSN
/// window fills while ACKs are on the way. A full window always holds an AckReq (one
/// every interval ≤ half the window), so it reopens without the retransmission timer.
#[test]
fn a_full_window_reopens_without_the_timer() {
    let (mut p, a, b) = pair(rc(1024), 24);
    p.latency = Duration::from_micros(20);
    for i in 0..200 {
        p.a.qp
            .post_send(rdma(i, SendOp::Write, &[a.sge(0, 4096)], &b, 0))
            .unwrap();
    }
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
