//! The round-trip time to one peer NIC, shared by every QP that talks to it: the one
//! owner of the RFC 6298 estimator and of "how old may an estimate be".
//!
//! All RC QPs of a NIC that talk to the same remote NIC (IP and UDP port) cross the same
//! two single-threaded NIC loops and the same sockets, so the round trip one of them
//! sees now is the round trip any of them will see: queueing behind the other QPs' work
//! dominates it, not the QP's own traffic. A QP that sends a burst only now and then
//! (10,000 QPs in round robin: one burst per QP every ~100 ms) would otherwise time its
//! next burst on a sample or two taken at a quieter moment and resend packets that were
//! never lost. Linux TCP keeps per-destination metrics (`tcp_metrics`) for the same
//! reason. [`PeerRtt`] is fed by every QP's samples and read by each QP's `Rto`.
//!
//! Sans-IO and single-threaded: a [`PeerRtt`] is a shared handle (`Rc<Cell<_>>`) the
//! caller creates per peer and gives to each QP ([`super::Qp::set_peer_rtt`]); no locks,
//! no global state. A QP that is given none keeps a private one, which then holds
//! exactly its own samples.

use std::cell::Cell;
use std::rc::Rc;

use super::rto::MIN_RTO;
use crate::time::{Duration, Instant};

/// An estimate with no sample for this many of its own timeouts is stale. RFC 6298
/// (§3) assumes a sample about once per round trip; an estimate that has missed this
/// many timeouts' worth of samples describes the path as it was, not as it is (the
/// NIC's queues fill and drain with the applications' load within milliseconds). Eight
/// keeps the estimate of a QP that streams (a sample every round trip) or pauses for a
/// few round trips, and drops that of a QP idle for longer (at the 100 µs floor: 0.8 ms).
pub const STALE_RTOS: u32 = 8;

/// Smoothed RTT and its mean deviation (RFC 6298 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RttEstimate {
    srtt: Duration,
    rttvar: Duration,
}

impl RttEstimate {
    /// `prev` updated with the round trip `r` (RFC 6298 §2.2, §2.3).
    pub fn update(prev: Option<RttEstimate>, r: Duration) -> RttEstimate {
        let (srtt, rttvar) = match prev {
            None => (r, r / 2),
            Some(e) => {
                let dev = e.srtt.abs_diff(r);
                (e.srtt * 7 / 8 + r / 8, e.rttvar * 3 / 4 + dev / 4)
            }
        };
        RttEstimate { srtt, rttvar }
    }

    /// The timeout it gives: smoothed RTT plus four deviations, at least [`MIN_RTO`].
    pub fn rto(&self) -> Duration {
        (self.srtt + self.rttvar * 4).max(MIN_RTO)
    }

    /// True when [`STALE_RTOS`] of its timeouts passed before `now` since `heard`, the
    /// last time its QP heard from the path (a sample only comes with forward progress,
    /// so `heard` is never older than the last sample).
    pub fn is_stale_since(&self, heard: Instant, now: Instant) -> bool {
        now.saturating_duration_since(heard) > self.rto().saturating_mul(STALE_RTOS)
    }
}

/// The largest round trip any QP to the peer measured in the current and the previous
/// [`WINDOW`], so over the last 0.5–1 s. A QP whose own estimate is stale waits at least
/// this long: on a loaded host a NIC thread is now and then descheduled for milliseconds,
/// far beyond smoothed RTT + 4 deviations of a path that otherwise answers in tens of
/// microseconds, and a QP that sends only now and then has no recent sample of its own to
/// have seen it. Measured (docs/perf.md "Many busy QPs"): 8 B WRITEs over 1,000 and 10,000
/// QPs resent hundreds to a few thousand packets with nothing lost, where without this
/// floor they resent up to ≈ 50,000. QPs with a fresh estimate of their own (a streaming
/// QP, the one QP of a loss test) do not use it: waiting out a stall delays each
/// tail-loss repair (5 % loss goodput halved when every QP used it).
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    cur: Duration,
    prev: Duration,
    start: Instant,
}

/// The length of one window of [`Recent`].
pub const WINDOW: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, Default)]
struct State {
    estimate: Option<RttEstimate>,
    recent: Recent,
}

/// The shared RTT estimate of one peer NIC. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct PeerRtt(Rc<Cell<State>>);

impl PeerRtt {
    /// A new, unsampled estimate.
    pub fn new() -> PeerRtt {
        PeerRtt::default()
    }

    pub(super) fn get(&self) -> Option<RttEstimate> {
        self.0.get().estimate
    }

    /// A QP measured the round trip `r` at `now`, of which the smoothed estimate
    /// counts `counted` (`rto.rs`: at most the timeout that QP had running); the
    /// largest recent round trip ([`Recent`]) keeps `r` whole.
    pub(super) fn sample(&self, counted: Duration, r: Duration, now: Instant) {
        let mut s = self.0.get();
        s.estimate = Some(RttEstimate::update(s.estimate, counted));
        if now.saturating_duration_since(s.recent.start) >= WINDOW {
            s.recent = Recent {
                cur: Duration::ZERO,
                prev: s.recent.cur,
                start: now,
            };
        }
        s.recent.cur = s.recent.cur.max(r);
        self.0.set(s);
    }

    /// The largest round trip measured in the last 0.5–1 s before `now` ([`Recent`]).
    pub(super) fn recent_max(&self, now: Instant) -> Duration {
        let r = self.0.get().recent;
        let age = now.saturating_duration_since(r.start);
        if age >= WINDOW * 2 {
            Duration::ZERO
        } else if age >= WINDOW {
            r.cur
        } else {
            r.cur.max(r.prev)
        }
    }

    /// The smoothed RTT, once sampled (for statistics and tests).
    pub fn srtt(&self) -> Option<Duration> {
        self.get().map(|e| e.srtt)
    }

    /// True when both handles share one estimate.
    pub fn ptr_eq(&self, other: &PeerRtt) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    /// True when more than one holder (the caller's table and QPs) shares it: a table
    /// entry that is not shared any more can go.
    pub fn is_shared(&self) -> bool {
        Rc::strong_count(&self.0) > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    #[test]
    fn shared_by_clones_and_stale_after_eight_timeouts() {
        let p = PeerRtt::new();
        let q = p.clone();
        assert!(p.is_shared() && p.srtt().is_none());
        q.sample(Duration::from_millis(1), Duration::from_millis(1), at(0));
        assert_eq!(p.srtt(), Some(Duration::from_millis(1)));
        let e = p.get().unwrap();
        // 1 ms + 4 × 0.5 ms = 3 ms; stale after 24 ms.
        assert_eq!(e.rto(), Duration::from_millis(3));
        assert!(!e.is_stale_since(at(0), at(24_000)));
        assert!(e.is_stale_since(at(0), at(24_001)));
        assert!(!e.is_stale_since(at(1), at(24_001)), "heard from since");
        drop(q);
        assert!(!p.is_shared());
    }
}
