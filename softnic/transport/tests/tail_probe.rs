//! The adaptive timer's early expiry with nothing lost, as a loaded host makes it: the
//! responder's NIC is descheduled, its ACKs come late and in batches (docs/perf.md
//! "Goodput under loss", session 12). The expiry resends the last packet sent, asking
//! (`Qp::probe_tail`), so late ACKs that cover only part of the window resend
//! nothing; a gap before that packet is still NAKed and repaired at once. Stale ACKs
//! (duplicates of ones already taken) are counted apart from dropped responses. All in
//! virtual time through the `Pair` harness.

mod common;

use common::*;
use softnic_transport::qp::QpCounters;
use softnic_transport::testing::{Pair, PairConfig, Seen, Side, Verdict};
use softnic_transport::time::Duration;

const STEPS: u64 = 2_000_000;

/// A pair with RTT samples (`common::sampled_pair`): its timer is the adaptive one
/// (`MIN_RTO`, 100 µs), with the Local ACK Timeout at 67 ms.
fn sampled() -> (Pair, Buf, Buf) {
    sampled_pair(PairConfig {
        timeout: 14,
        ..rc(1024)
    })
}

/// Whether the packet is a PSN sequence error NAK.
fn is_seq_nak(s: &Seen) -> bool {
    s.repr.aeth.is_some_and(|a| {
        matches!(
            a.syndrome,
            wire::Syndrome::Nak(wire::NakCode::PsnSequenceError)
        )
    })
}

/// A 100-packet WRITE (PSNs 108..208) on a fresh sampled pair, losing the first
/// `copies` sends of PSN 150 and B's first `naks` PSN sequence NAKs; the time it took
/// and A's counters.
fn write_losing_150(copies: u32, naks: u32, seed: u64) -> (Duration, QpCounters) {
    let (mut p, a, b) = sampled();
    let (mut lost, mut naks_lost) = (0, 0);
    p.filter = Some(Box::new(move |s: &Seen| {
        if s.from == Side::A && s.repr.bth.psn.value() == 150 && lost < copies {
            lost += 1;
            return Verdict::Drop;
        }
        if s.from == Side::B && is_seq_nak(s) && naks_lost < naks {
            naks_lost += 1;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    let took = write_once(&mut p, &a, &b, 100 * 1024, seed, STEPS);
    (took, *p.a.qp.counters())
}

/// A 100-packet WRITE asks for an ACK twice (packet 64, by the interval, and its
/// last); B's responses all arrive 150 µs late and 10 µs apart, in order, so the first
/// late ACK covers the window only up to packet 64. Meanwhile the timer expired once
/// (at 100 µs; the next expiry, with backoff, would come after the late ACKs). The
/// expiry resends only the last packet; nothing else is resent: the late ACKs say
/// everything arrived.
///
/// Before, each expiry went back N and resent the oldest packet, and the first late
/// ACK, partial, was taken for that packet's answer: the requester resent the other
/// 36 packets of the window, duplicates all (on the NIC, lossless 3 M × 8 B WRITEs:
/// 472 packets resent for 93 expiries).
#[test]
fn late_acks_in_batches_resend_nothing_but_the_probes() {
    let (mut p, a, b) = sampled();
    // The WRITE's PSNs are 108..208; the 64th (171) asks. The packets after it reach B
    // 10 µs later the first time, so B answers 171 before it sees them.
    let (mut k, mut newest) = (0u64, 0u32);
    p.filter = Some(Box::new(move |s: &Seen| {
        let psn = s.repr.bth.psn.value();
        if s.from == Side::B {
            k += 1;
            Verdict::Delay(Duration::from_micros(150 + 10 * k))
        } else if psn > 171 && psn > newest {
            newest = psn;
            Verdict::Delay(Duration::from_micros(10))
        } else {
            Verdict::Pass
        }
    }));
    write_once(&mut p, &a, &b, 100 * 1024, 21, STEPS);
    let c = *p.a.qp.counters();
    assert!(c.early_retransmits >= 1, "{c:?}");
    assert_eq!(
        c.retransmitted_packets, c.early_retransmits,
        "only the probes: {c:?}"
    );
    assert_eq!((c.seq_nak_retries, c.retransmit_timeouts), (0, 0), "{c:?}");
    assert_eq!(c.spurious_timeouts, 1, "{c:?}");
    let cb = *p.b.qp.counters();
    assert_eq!(cb.duplicate_requests, c.early_retransmits, "{cb:?}");
    // The answers to the probes arrive after the ACK that covered everything: stale
    // duplicates, counted as such and not as dropped responses.
    assert_eq!(c.duplicate_responses, c.early_retransmits, "{c:?}");
    assert_eq!(c.drop_unexpected_response, 0, "{c:?}");
}

/// PSN 150 of a 100-packet WRITE (PSNs 108..208) is lost, and so are both copies of
/// its first resend and the first NAK, so the timer expires with a go-back-N under way
/// and the responder's repeated NAKs ignored as echoes (`retries_suppressed`). That
/// expiry goes back to the oldest packet (no tail probe there, whose NAK would be
/// ignored too): the WRITE completes within 2 ms of virtual time, with no charged
/// Local ACK Timeout (67 ms), after two early retransmissions: the first expiry, with
/// the first NAK lost and no go-back yet, probes the tail, whose NAK starts the
/// go-back; the second goes back. (A tail probe at the second too is answered by a
/// NAK the go-back ignores, and only a third expiry goes back, a round trip later:
/// this guards `probe_tail`'s `in_retry` test.)
#[test]
fn a_twice_lost_first_resend_is_repaired_by_the_next_expiry() {
    let (took, c) = write_losing_150(3, 1, 22);
    assert_eq!(c.retransmit_timeouts, 0, "{c:?}");
    assert_eq!(
        c.early_retransmits, 2,
        "a tail probe, then a go-back: {c:?}"
    );
    assert!(c.retries_suppressed >= 1, "the echoes were ignored: {c:?}");
    assert!(took < Duration::from_millis(2), "{took:?} {c:?}");
}

/// PSN 150 of a 100-packet WRITE is lost, and B's PSN sequence NAK for it too; B then
/// answers nothing until the gap is filled, as rxe's responder does after one NAK
/// (`sent_psn_nak`; softnic's would NAK a probe again, so here every NAK is dropped).
/// The first early expiry probes the tail and hears nothing; the next does not probe
/// again but goes back N, so the WRITE completes within 2 ms of virtual time with no
/// charged Local ACK Timeout (67 ms). With a tail probe at every early expiry it
/// waited for that timeout.
#[test]
fn a_silent_responder_after_a_lost_nak_gets_a_go_back_not_more_probes() {
    let (took, c) = write_losing_150(1, u32::MAX, 23);
    assert_eq!(c.retransmit_timeouts, 0, "{c:?}");
    assert!(c.early_retransmits >= 2, "a probe, then a go-back: {c:?}");
    assert!(took < Duration::from_millis(2), "{took:?} {c:?}");
}
