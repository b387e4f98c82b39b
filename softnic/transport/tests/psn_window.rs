//! Messages at the edge of the PSN space, and PSN-window abuse by a hostile peer
//! (issue 9, item 4).
//!
//! * The window type ([`SendWindow`]) against an unbounded model, across the 2^24 wrap.
//! * Boundary lengths at every path MTU: the largest message a QP accepts and the
//!   smallest it refuses, at post time (requester) and in a READ's RETH (responder).
//!   At MTU 256 the largest is 2^31 − 256: 2^31 would take 2^23 PSNs, which no window
//!   can order (a 2 GiB READ used to make the requester wait forever).
//! * Requests far ahead of and behind the responder's expected PSN; ACKs, NAKs and
//!   responses for PSNs never sent or long acknowledged; AETH MSNs that lie. Each is
//!   answered as IBTA 9.7.4–9.7.5 says, counted, and the connection carries on.

mod common;
mod peer;

use common::*;
use peer::{ack, collect, collect_from, counter, inject, inject_into, packet, SparseMem};
use proptest::prelude::*;
use softnic_transport::qp::window::{forward, SendWindow, MAX_SPAN};
use softnic_transport::qp::{PostError, Qp, QpState, QpType, PATH_MTUS};
use softnic_transport::testing::{connect_qp, PairConfig};
use softnic_transport::time::Instant;
use softnic_transport::wr::{Queue, SendOp, SendWr, Sge, WcStatus};
use wire::{NakCode, Opcode, Operation, Position, Psn, RethRepr, Syndrome, Transport};

const STEPS: u64 = 1_000_000;

/// The longest message at each MTU, written out (not computed by the code under test):
/// 2^31 bytes (IBTA 9.4.1), except at MTU 256 where 2^31 bytes would be 2^23 packets.
fn largest(mtu: u32) -> u64 {
    if mtu == 256 {
        (1 << 31) - 256
    } else {
        1 << 31
    }
}

// ---------------------------------------------------------------- the window type

/// One operation on the window; PSN arguments are offsets from the model's oldest
/// unacknowledged PSN, anywhere in the PSN space (inside the window or not).
#[derive(Debug, Clone)]
enum WinOp {
    Assign(u32),
    Seek(u32),
    RecordSent(u32),
    Advance(u32),
    Rewind,
    Abandon,
}

fn offset() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..300,
        1 => (1u32 << 23) - 3..(1u32 << 23) + 3,
        1 => (1u32 << 24) - 300..(1u32 << 24),
        1 => any::<u32>().prop_map(|x| x & 0xFF_FFFF),
    ]
}

fn win_op() -> impl Strategy<Value = WinOp> {
    prop_oneof![
        3 => prop_oneof![
            4 => 1u32..200,
            1 => MAX_SPAN - 200..MAX_SPAN + 3,
        ].prop_map(WinOp::Assign),
        2 => offset().prop_map(WinOp::Seek),
        3 => offset().prop_map(WinOp::RecordSent),
        3 => offset().prop_map(WinOp::Advance),
        1 => Just(WinOp::Rewind),
        1 => Just(WinOp::Abandon),
    ]
}

/// The window with unbounded positions: no wrap, no modular arithmetic.
#[derive(Debug, Clone, Copy)]
struct Model {
    start: u32,
    oldest: u64,
    cursor: u64,
    sent: u64,
    next: u64,
}

impl Model {
    fn psn(&self, abs: u64) -> Psn {
        Psn::new((u64::from(self.start) + abs) as u32)
    }
    /// The absolute position of `oldest + off` if it is in `oldest ..= next`.
    fn within(&self, off: u32) -> Option<u64> {
        let abs = self.oldest + u64::from(off);
        (abs <= self.next).then_some(abs)
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5E9D_0123),
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    /// Every call keeps the invariant and agrees with the unbounded model, whatever
    /// PSNs it is given; starting near the 2^24 wrap half the time.
    #[test]
    fn send_window_matches_an_unbounded_model(
        start in prop_oneof![any::<u32>(), (0xFF_FF00u32..0x100_0000)],
        ops in prop::collection::vec(win_op(), 1..120),
    ) {
        let start = start & 0xFF_FFFF;
        let mut w = SendWindow::new(Psn::new(start));
        let mut m = Model { start, oldest: 0, cursor: 0, sent: 0, next: 0 };
        for op in ops {
            match op {
                WinOp::Assign(n) => {
                    let fits = m.next - m.oldest + u64::from(n) <= u64::from(MAX_SPAN);
                    let got = w.assign(n);
                    if fits {
                        prop_assert_eq!(got, Some(m.psn(m.next)));
                        m.next += u64::from(n);
                    } else {
                        prop_assert_eq!(got, None);
                    }
                }
                WinOp::Seek(off) => {
                    let to = m.within(off);
                    prop_assert_eq!(w.seek(m.psn(m.oldest + u64::from(off))), to.is_some());
                    if let Some(abs) = to {
                        m.cursor = abs;
                    }
                }
                WinOp::RecordSent(off) => {
                    let to = m.within(off);
                    prop_assert_eq!(
                        w.record_sent(m.psn(m.oldest + u64::from(off))),
                        to.is_some()
                    );
                    if let Some(abs) = to {
                        m.cursor = abs;
                        m.sent = m.sent.max(abs);
                    }
                }
                WinOp::Advance(off) => {
                    let abs = m.oldest + u64::from(off);
                    let ok = off > 0 && abs <= m.sent;
                    prop_assert_eq!(w.advance(m.psn(abs)), ok);
                    if ok {
                        m.oldest = abs;
                        m.cursor = m.cursor.max(abs);
                    }
                }
                WinOp::Rewind => {
                    w.rewind();
                    m.cursor = m.oldest;
                }
                WinOp::Abandon => {
                    w.abandon();
                    m.oldest = m.next;
                    m.cursor = m.next;
                    m.sent = m.next;
                }
            }
            prop_assert!(w.invariant_holds(), "{:?}", w);
            prop_assert!(m.next - m.oldest <= u64::from(MAX_SPAN));
            prop_assert_eq!(w.oldest_unacked(), m.psn(m.oldest));
            prop_assert_eq!(w.cursor(), m.psn(m.cursor));
            prop_assert_eq!(w.sent_end(), m.psn(m.sent));
            prop_assert_eq!(w.next(), m.psn(m.next));
            prop_assert_eq!(w.span() as u64, m.next - m.oldest);
            prop_assert_eq!(w.outstanding(), m.sent > m.oldest);
            // Exactly the sent, unacknowledged PSNs are answerable: probe both ends
            // and just outside them.
            for abs in [m.oldest, m.sent.saturating_sub(1), m.sent, m.oldest + (1 << 23)] {
                let inside = abs >= m.oldest && abs < m.sent;
                prop_assert_eq!(w.contains(m.psn(abs)), inside, "abs {}", abs);
            }
            prop_assert!(!w.contains(m.psn(m.oldest + (1 << 24) - 1)));
        }
    }
}

#[test]
fn forward_offsets_are_exact_across_the_wrap() {
    assert_eq!(forward(Psn::new(0xFF_FFFF), Psn::new(0)), 1);
    assert_eq!(forward(Psn::new(5), Psn::new(4)), 0xFF_FFFF);
    // Where the signed distance is ambiguous, the forward offset is not.
    let a = Psn::new(0x10);
    let b = a.wrapping_add(1 << 23);
    assert_eq!(a.distance_to(b), -(1 << 23));
    assert_eq!(forward(a, b), 1 << 23);
}

// ------------------------------------------------- boundary lengths at every MTU

fn connected(t: QpType, mtu: u32) -> Qp {
    let cfg = PairConfig {
        qp_type: t,
        mtu,
        ..PairConfig::default()
    };
    let mut qp = Qp::new(0x11, t, 1, cfg.caps);
    // Expects requests from PSN 100; sends its own from PSN 500.
    connect_qp(
        &mut qp,
        &cfg,
        0x22,
        "127.0.0.2:4791".parse().unwrap(),
        100,
        500,
    );
    qp
}

/// A send WR of `len` bytes gathered from the sparse region (two SGEs: a u32 SGE
/// cannot hold 2^31 + 1).
fn long_wr(op: SendOp, len: u64) -> SendWr {
    let first = len.min(1 << 31) as u32;
    let rest = (len - u64::from(first)) as u32;
    let mut sges = vec![Sge {
        addr: 0x1_0000_0000,
        length: first,
        lkey: 7,
    }];
    if rest > 0 {
        sges.push(Sge {
            addr: 0x1_0000_0000 + u64::from(first),
            length: rest,
            lkey: 7,
        });
    }
    let mut w = wr(1, op, &sges);
    w.remote_addr = 0x2_0000_0000;
    w.rkey = 9;
    w
}

#[test]
fn largest_message_is_accepted_and_one_byte_more_refused_at_every_mtu() {
    for mtu in PATH_MTUS {
        let max = largest(mtu);
        for (t, op) in [
            (QpType::Rc, SendOp::Send),
            (QpType::Rc, SendOp::Write),
            (QpType::Rc, SendOp::Read),
            (QpType::Uc, SendOp::Send),
            (QpType::Uc, SendOp::WriteWithImm(1)),
        ] {
            let mut qp = connected(t, mtu);
            assert_eq!(
                qp.post_send(long_wr(op, max + 1)),
                Err(PostError::TooLong),
                "{t:?} {op:?} of {} bytes at MTU {mtu}",
                max + 1
            );
            assert_eq!(
                qp.post_send(long_wr(op, max)),
                Ok(()),
                "{t:?} {op:?} of {max} bytes at MTU {mtu}"
            );
            assert_eq!(qp.send_queue_len(), 1);
        }
    }
}

/// The 2 GiB READ at MTU 256 of the issue: refused at post instead of hanging. The
/// largest accepted READ (2^23 − 1 response PSNs) is in the window: its first
/// response is taken, not dropped as a response to a PSN never sent.
#[test]
fn two_gib_read_at_mtu_256_is_refused_and_the_largest_read_is_answerable() {
    let mut qp = connected(QpType::Rc, 256);
    let mut mem = SparseMem::new(7, 0x1_0000_0000, 1 << 32);
    assert_eq!(
        qp.post_send(long_wr(SendOp::Read, 1 << 31)),
        Err(PostError::TooLong)
    );
    qp.post_send(long_wr(SendOp::Read, (1 << 31) - 256))
        .unwrap();
    let now = Instant::ZERO;
    let out = collect_from(&mut qp, &mem, now, 10);
    assert_eq!(out.len(), 1, "one READ request");
    let req = out[0].0;
    assert_eq!(req.bth.psn.value(), 500);
    assert_eq!(req.reth.map(|r| r.dma_len), Some((1 << 31) - 256));
    let from = "127.0.0.2:4791".parse().unwrap();
    let first = Opcode::find(
        Transport::Rc,
        Operation::ReadResponse,
        Position::First,
        None,
    )
    .unwrap();
    let mut r = packet(first, 0x11, 500);
    r.aeth = Some(wire::AethRepr {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: wire::Msn::new(1),
    });
    inject_into(&mut qp, &mut mem, now, from, r, &[0u8; 256]);
    assert_eq!(qp.counters().drop_unexpected_response, 0);
    assert_eq!(mem.written, 256);
    // The last response PSN (500 + 2^23 − 2) is in the window too: arriving early
    // it is an implied NAK (responses lost), not a ghost.
    let last = Opcode::find(Transport::Rc, Operation::ReadResponse, Position::Last, None).unwrap();
    let mut r = packet(last, 0x11, 500 + (1 << 23) - 2);
    r.aeth = Some(wire::AethRepr {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: wire::Msn::new(1),
    });
    inject_into(&mut qp, &mut mem, now, from, r, &[0u8; 256]);
    assert_eq!(qp.counters().drop_unexpected_response, 0);
    assert_eq!(qp.counters().implied_nak_retries, 1);
    // One past it was never sent.
    let mut r = packet(last, 0x11, 500 + (1 << 23) - 1);
    r.aeth = Some(wire::AethRepr {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: wire::Msn::new(1),
    });
    inject_into(&mut qp, &mut mem, now, from, r, &[0u8; 256]);
    assert_eq!(qp.counters().drop_unexpected_response, 1);
    assert_eq!(qp.state(), QpState::Rts);
}

/// A message that fits the window only once older PSNs are acknowledged waits for
/// them (it is not started across a span of 2^23), then goes out at the next PSN.
#[test]
fn largest_read_waits_until_it_fits_the_window() {
    let mut qp = connected(QpType::Rc, 256);
    let mut mem = SparseMem::new(7, 0x1_0000_0000, 1 << 32);
    let now = Instant::ZERO;
    qp.post_send(long_wr(SendOp::Write, 100 * 256)).unwrap();
    qp.post_send(long_wr(SendOp::Read, (1 << 31) - 256))
        .unwrap();
    let out = collect_from(&mut qp, &mem, now, 1000);
    let psns: Vec<u32> = out.iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(psns, (500..600).collect::<Vec<_>>(), "the WRITE only");
    assert!(out
        .iter()
        .all(|(r, _)| r.reth.is_none() || r.bth.psn.value() == 500));
    // The WRITE is acknowledged: now the READ fits, at PSN 600.
    let from = "127.0.0.2:4791".parse().unwrap();
    inject_into(
        &mut qp,
        &mut mem,
        now,
        from,
        ack(0x11, 599, Syndrome::Ack { credits: 31 }, 1),
        &[],
    );
    assert_eq!(qp.poll_completion().map(|c| c.wr_id), Some(1));
    let out = collect_from(&mut qp, &mem, now, 10);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(out[0].0.bth.psn.value(), 600);
    assert_eq!(qp.state(), QpState::Rts);
}

/// Responder: a READ may ask for at most the largest message at the path MTU; one
/// byte more is NAKed Invalid Request (a length error, IBTA 9.7.4.2.5) and the
/// QP moves to Err, as for every length error. The largest is accepted and takes
/// exactly its response PSNs: the next request PSN is new, not a duplicate.
#[test]
fn responder_bounds_read_length_at_every_mtu() {
    let from = "127.0.0.2:4791".parse().unwrap();
    for mtu in PATH_MTUS {
        let max = largest(mtu) as u32;
        let npkts = max.div_ceil(mtu);
        let now = Instant::ZERO;

        let mut qp = connected(QpType::Rc, mtu);
        let mut mem = SparseMem::new(9, 0x2_0000_0000, 1 << 32);
        let req = |psn, len| peer::read_request(0x11, psn, 0x2_0000_0000, 9, len);
        inject_into(&mut qp, &mut mem, now, from, req(100, max), &[]);
        assert_eq!(qp.counters().nak_invalid_request_sent, 0, "MTU {mtu}");
        assert_eq!(qp.state(), QpState::Rts);
        let out = collect_from(&mut qp, &mem, now, 3);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].0.bth.psn.value(), 100);
        assert_eq!(out[0].1.len(), mtu as usize);
        // The next new request is at 100 + npkts.
        let mut w = packet(Opcode::RC_RDMA_WRITE_ONLY, 0x11, 100 + npkts);
        w.reth = Some(RethRepr {
            va: 0x2_0000_0000,
            rkey: 9,
            dma_len: 0,
        });
        inject_into(&mut qp, &mut mem, now, from, w, &[]);
        assert_eq!(qp.counters().out_of_sequence, 0, "MTU {mtu}");
        assert_eq!(qp.counters().duplicate_requests, 0, "MTU {mtu}");
        // ... and was taken: the same PSN again is now a duplicate.
        inject_into(&mut qp, &mut mem, now, from, w, &[]);
        assert_eq!(qp.counters().duplicate_requests, 1, "MTU {mtu}");

        let mut qp = connected(QpType::Rc, mtu);
        inject_into(&mut qp, &mut mem, now, from, req(100, max + 1), &[]);
        let out = collect_from(&mut qp, &mem, now, 3);
        assert_eq!(out.len(), 1, "MTU {mtu}: {out:?}");
        assert_eq!(
            out[0].0.aeth.map(|a| a.syndrome),
            Some(Syndrome::Nak(NakCode::InvalidRequest)),
            "MTU {mtu}"
        );
        assert_eq!(out[0].0.bth.psn.value(), 100);
        assert_eq!(qp.counters().nak_invalid_request_sent, 1);
        assert_eq!(qp.state(), QpState::Err);
    }
}

#[test]
fn write_announcing_more_than_2_pow_31_bytes_is_an_invalid_request() {
    let from = "127.0.0.2:4791".parse().unwrap();
    let mut qp = connected(QpType::Rc, 4096);
    let mut mem = SparseMem::new(9, 0x2_0000_0000, 1 << 33);
    let first = Opcode::find(Transport::Rc, Operation::Write, Position::First, None).unwrap();
    let mut w = packet(first, 0x11, 100);
    w.reth = Some(RethRepr {
        va: 0x2_0000_0000,
        rkey: 9,
        dma_len: (1 << 31) + 4096,
    });
    inject_into(&mut qp, &mut mem, Instant::ZERO, from, w, &[0u8; 4096]);
    assert_eq!(mem.written, 0);
    assert_eq!(qp.counters().nak_invalid_request_sent, 1);
    assert_eq!(qp.state(), QpState::Err);
}

// ------------------------------------------------- PSN-window abuse, on a live pair

/// Requests far ahead of the expected PSN, read in one batch: one PSN sequence error
/// NAK for the whole gap (IBTA 9.7.5.1.3), then silence; far behind (up to 2^23): duplicates, SENDs
/// re-acknowledged and not executed again (IBTA 9.7.5.1.3 duplicate handling). No
/// receive is consumed, memory is untouched, and the connection then works.
#[test]
fn requests_far_ahead_and_behind_the_expected_psn() {
    let (mut p, a, b) = pair(rc(256), 61);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    let epsn = 100u32; // A's first PSN, what B expects.
    let send = |psn: u32| {
        let mut r = packet(Opcode::RC_SEND_ONLY, qpn, psn);
        r.bth.ack_req = true;
        r
    };
    for ahead in [1u32, 2, 1000, (1 << 23) - 1] {
        inject(&mut p.b, now, from, send(epsn + ahead), b"ahead");
    }
    for behind in [1u32, 2, 1000, 1 << 23] {
        inject(
            &mut p.b,
            now,
            from,
            send(epsn.wrapping_sub(behind)),
            b"behind",
        );
    }
    let out = collect(&mut p.b, now);
    let syn: Vec<_> = out
        .iter()
        .map(|(r, _)| (r.bth.psn.value(), r.aeth.unwrap().syndrome))
        .collect();
    // One NAK at the expected PSN; the duplicates' re-ACKs (PSN expected − 1)
    // coalesce into one.
    assert_eq!(
        syn,
        vec![
            (epsn, Syndrome::Nak(NakCode::PsnSequenceError)),
            (epsn - 1, Syndrome::Ack { credits: 31 }),
        ]
    );
    let c = *p.b.qp.counters();
    assert_eq!(c.out_of_sequence, 4);
    assert_eq!(c.nak_psn_seq_sent, 1);
    assert_eq!(c.duplicate_requests, 4);
    assert_eq!(drain(&mut p.b), vec![], "nothing delivered");
    assert_eq!(p.b.qp.recv_queue_len(), 1);
    assert_eq!(read(&p.b, &b, 0, 4096), vec![0; 4096]);
    // The real peer carries on.
    fill(&mut p.a, &a, 0, &pattern(5, 300));
    p.a.qp
        .post_send(wr(9, SendOp::Send, &[a.sge(0, 300)]))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    let rc = drain(&mut p.b);
    assert_eq!((rc[0].wr_id, rc[0].byte_len), (1, 300));
    assert_eq!(read(&p.b, &b, 0, 300), pattern(5, 300));
}

/// After its PSN sequence NAK has left, the responder answers an out-of-sequence
/// packet that asks for an ACK with the NAK again (a lost NAK is then repaired
/// without the requester's timer); packets that do not ask stay unanswered, and
/// packets read while the NAK is still queued add none (IBTA 9.7.5.1.3).
#[test]
fn a_gap_is_naked_again_for_a_packet_that_asks_once_the_nak_has_left() {
    let (mut p, _a, b) = pair(rc(256), 63);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
    let (qpn, from, now) = (p.b.qp.qpn(), p.a.addr, p.now);
    let send = |psn: u32, ack_req: bool| {
        let mut r = packet(Opcode::RC_SEND_ONLY, qpn, psn);
        r.bth.ack_req = ack_req;
        r
    };
    let syndromes = |p: &mut softnic_transport::testing::Pair| -> Vec<(u32, Syndrome)> {
        collect(&mut p.b, now)
            .iter()
            .map(|(r, _)| (r.bth.psn.value(), r.aeth.unwrap().syndrome))
            .collect()
    };
    let nak = (100, Syndrome::Nak(NakCode::PsnSequenceError));
    // PSN 100 is lost: 101 and 102 (asking) arrive in one batch: one NAK.
    inject(&mut p.b, now, from, send(101, false), b"x");
    inject(&mut p.b, now, from, send(102, true), b"x");
    assert_eq!(syndromes(&mut p), vec![nak]);
    // Later packets that do not ask: silence.
    inject(&mut p.b, now, from, send(103, false), b"x");
    assert_eq!(syndromes(&mut p), vec![]);
    // One that asks: the NAK again (the first may have been lost).
    inject(&mut p.b, now, from, send(104, true), b"x");
    inject(&mut p.b, now, from, send(105, true), b"x");
    assert_eq!(syndromes(&mut p), vec![nak]);
    let c = *p.b.qp.counters();
    assert_eq!((c.out_of_sequence, c.nak_psn_seq_sent), (5, 2));
    // The gap filled, the next packets are new requests.
    inject(&mut p.b, now, from, send(100, true), b"y");
    assert_eq!(
        syndromes(&mut p),
        vec![(100, Syndrome::Ack { credits: 31 })]
    );
    assert_eq!(drain(&mut p.b).len(), 1, "delivered once");
}

/// ACKs, NAKs, READ responses and atomic ACKs for PSNs never sent are dropped and
/// counted (`drop_unexpected_response`), those for PSNs already acknowledged (behind
/// the oldest unacknowledged, within half the PSN space) are ignored as stale
/// duplicates (`duplicate_responses`); nothing completes, nothing is retried, and the
/// genuine ACK then completes the WQE.
#[test]
fn responses_for_psns_never_sent_or_long_acknowledged() {
    let (mut p, a, b) = pair(rc(256), 62);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1024)], &b, 0))
        .unwrap();
    let (qpn, from, now) = (p.a.qp.qpn(), p.b.addr, p.now);
    let sent = collect(&mut p.a, now);
    let psns: Vec<u32> = sent.iter().map(|(r, _)| r.bth.psn.value()).collect();
    assert_eq!(psns, vec![100, 101, 102, 103]);
    let ack_syn = Syndrome::Ack { credits: 31 };
    let resp = |op, pos, psn| {
        let mut r = packet(
            Opcode::find(Transport::Rc, op, pos, None).unwrap(),
            qpn,
            psn,
        );
        r.aeth = Some(wire::AethRepr {
            syndrome: ack_syn,
            msn: wire::Msn::new(1),
        });
        r
    };
    let mut atomic_ack = resp(Operation::AtomicAcknowledge, Position::Only, 104);
    atomic_ack.atomic_ack_eth = Some(wire::AtomicAckEthRepr { orig: 1 });
    let hostile: Vec<(wire::PacketRepr, Vec<u8>)> = vec![
        (ack(qpn, 104, ack_syn, 1), vec![]),
        (ack(qpn, 100 + 1000, ack_syn, 1), vec![]),
        (ack(qpn, 100 + (1 << 23) - 1, ack_syn, 1), vec![]),
        (ack(qpn, 100 + (1 << 23), ack_syn, 1), vec![]),
        (ack(qpn, 99, ack_syn, 0), vec![]),
        (ack(qpn, 100u32.wrapping_sub(1 << 23), ack_syn, 0), vec![]),
        (
            ack(qpn, 104, Syndrome::Nak(NakCode::PsnSequenceError), 1),
            vec![],
        ),
        (
            ack(qpn, 5000, Syndrome::Nak(NakCode::RemoteAccessError), 1),
            vec![],
        ),
        (ack(qpn, 104, Syndrome::RnrNak { timer: 1 }, 1), vec![]),
        (
            resp(Operation::ReadResponse, Position::Only, 104),
            vec![0; 16],
        ),
        (
            resp(Operation::ReadResponse, Position::First, 99),
            vec![0; 256],
        ),
        (atomic_ack, vec![]),
    ];
    let n = hostile.len() as u64;
    for (r, payload) in hostile {
        inject(&mut p.a, now, from, r, &payload);
    }
    // PSN 99, twice, is behind the oldest unacknowledged (100); 100 − 2^23 is not
    // within half the PSN space behind it.
    assert_eq!(p.a.qp.counters().duplicate_responses, 2);
    assert_eq!(p.a.qp.counters().drop_unexpected_response, n - 2);
    assert_eq!(drain(&mut p.a), vec![]);
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.a.qp.counters().seq_nak_retries, 0);
    assert_eq!(p.a.qp.counters().rnr_retries, 0);
    assert_eq!(collect(&mut p.a, now), vec![], "nothing resent");
    // The genuine ACK of the last packet completes the WRITE; a replay of it is stale.
    inject(&mut p.a, now, from, ack(qpn, 103, ack_syn, 1), &[]);
    let sc = drain(&mut p.a);
    assert_eq!((sc[0].wr_id, sc[0].status), (1, WcStatus::Success));
    inject(&mut p.a, now, from, ack(qpn, 103, ack_syn, 1), &[]);
    assert_eq!(p.a.qp.counters().duplicate_responses, 3);
    assert_eq!(p.a.qp.counters().drop_unexpected_response, n - 2);
    assert_eq!(p.a.qp.poll_timeout(), None, "nothing outstanding");
}

/// The AETH MSN is the responder's count of completed messages; softnic's completer
/// retires WQEs by PSN alone, so an MSN that lies (far ahead, behind, wrapped) cannot
/// complete a WQE whose PSNs are not acknowledged, and cannot stop one that is.
#[test]
fn aeth_msn_lies_complete_nothing_that_is_not_acknowledged() {
    let (mut p, a, b) = pair(rc(256), 63);
    for i in 0..3u64 {
        p.a.qp
            .post_send(rdma(i, SendOp::Write, &[a.sge(0, 512)], &b, 0))
            .unwrap();
    }
    let (qpn, from, now) = (p.a.qp.qpn(), p.b.addr, p.now);
    let sent = collect(&mut p.a, now);
    assert_eq!(sent.len(), 6, "PSNs 100..=105");
    // B gets them (its own ACKs are lost), so B has executed all three WRITEs.
    for (r, payload) in sent {
        inject(&mut p.b, now, p.a.addr, r, &payload);
    }
    let _lost_acks = collect(&mut p.b, now);
    let ack_syn = Syndrome::Ack { credits: 31 };
    // PSN 100 (first half of WQE 0) with an MSN claiming all 3 messages done.
    inject(&mut p.a, now, from, ack(qpn, 100, ack_syn, 3), &[]);
    assert_eq!(drain(&mut p.a), vec![]);
    // PSN 101 (end of WQE 0) with an MSN claiming none.
    inject(&mut p.a, now, from, ack(qpn, 101, ack_syn, 0), &[]);
    let ids: Vec<_> = drain(&mut p.a).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0]);
    // PSN 103 (end of WQE 1) with MSN 2^24 − 1: WQE 1, and only WQE 1.
    inject(&mut p.a, now, from, ack(qpn, 103, ack_syn, 0xFF_FFFF), &[]);
    let ids: Vec<_> = drain(&mut p.a).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1]);
    assert_eq!(p.a.qp.send_queue_len(), 1);
    // Taken by their PSNs, whatever the MSN said.
    assert_eq!(counter(&p.a.qp, "drop_unexpected_response"), 0);
    // The rest completes over the real network.
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(
        sc.iter().map(|c| (c.queue, c.wr_id)).collect::<Vec<_>>(),
        vec![(Queue::Send, 2)]
    );
}

#[test]
fn remote_read_of_the_largest_message_is_checked_against_the_region() {
    // The length bound comes before the R_Key check; within it, the region still
    // decides (a sparse 4 GiB region for the largest, a 1 MiB one that is too small).
    let from = "127.0.0.2:4791".parse().unwrap();
    let mut qp = connected(QpType::Rc, 1024);
    let mut mem = SparseMem::new(9, 0x2_0000_0000, 1 << 20);
    let req = peer::read_request(0x11, 100, 0x2_0000_0000, 9, 1 << 31);
    inject_into(&mut qp, &mut mem, Instant::ZERO, from, req, &[]);
    assert_eq!(qp.counters().nak_remote_access_sent, 1);
    assert_eq!(qp.counters().nak_invalid_request_sent, 0);
}
