//! The requester's retransmission timeout: the one owner of "how long to wait for an
//! acknowledgement before going back".
//!
//! IBTA 9.7.6.1.3 gives one number, the Local ACK Timeout `4.096 µs × 2^timeout`, and
//! makes every expiry cost one of `retry_cnt` retries. Applications choose `timeout`
//! for the worst path they expect (perftest and rdma-core's examples use 14: 67 ms), so
//! on a path whose round trip is 50 µs a lost tail packet, a lost NAK or a lost ACK
//! stalls the QP a thousand round trips. Hardware RNICs ship adaptive retransmission
//! for this reason. [`Rto`] does the same, within the spec's bounds:
//!
//! * **When to resend** — an RTT estimate as TCP keeps it (RFC 6298: smoothed RTT plus
//!   four deviations, Karn's rule: no sample from a resent PSN, exponential backoff on
//!   each expiry, reset by forward progress), clamped to `[MIN_RTO, Local ACK
//!   Timeout]`. The estimate is the larger of the QP's own and that of its peer NIC,
//!   shared by every QP to that peer (`peer_rtt.rs`); the QP's own is left out once it
//!   is stale (neither a sample nor forward progress for eight of its timeouts), and
//!   then the peer's counts at least as the largest round trip to that peer of the last
//!   0.5–1 s, so a QP that sends only now and then times its burst on what the path is
//!   doing now, stalls included. Before any sample the timeout is the Local ACK Timeout
//!   itself.
//!
//!   Progress keeps the own estimate fresh because go-back-N recovery starves it of
//!   samples: Karn's rule drops the timed packet at every rewind, and at 5 % loss with
//!   32 packets resent per rewind most timed packets never see their ACK. Counting
//!   samples alone, a QP repairing losses went "stale" within a millisecond and timed
//!   its tail-loss repairs on the peer's worst round trip of the last second (logged
//!   over three 64 KiB WRITE runs at 5 % loss on a loaded host: 29–39 % of the timer
//!   resends waited 0.57–1.3 ms where the QP's own estimate said 135–320 µs). A QP
//!   whose ACKs keep arriving is talking to the path now; one that only sends now and
//!   then still goes stale as before.
//! * **What it costs** — a retry is charged against `retry_cnt` only when a whole Local
//!   ACK Timeout has passed without forward progress since the last charge, so the QP
//!   still fails with RETRY_EXC_ERR after `retry_cnt + 1` Local ACK Timeouts of silence,
//!   exactly when strict timing would: an early resend changes how soon data is
//!   repaired, never whether a connection is declared dead.
//!
//! [`AckTimer::Strict`] turns all of this off (every expiry is a Local ACK Timeout and
//! is charged), for conformance testing against the spec's timing.

use super::peer_rtt::{PeerRtt, RttEstimate};
use crate::time::{Duration, Instant};
use wire::Psn;

/// Shortest adaptive timeout: a couple of loopback round trips, below which smoothed
/// RTT + 4 deviations decides alone. On a loaded host (two NIC processes and two
/// applications on two cores) the scheduler sometimes delays an ACK longer; such a
/// spurious resend costs bandwidth, never a retry, and each one doubles the next
/// timeout until the path answers. At 5 % loss about one go-back-N in twenty was
/// repaired by the timer (a lost NAK: the responder NAKs a gap once, IBTA 9.7.5.1.3 as
/// rxe; a lost first resend was as frequent until the requester sent it twice,
/// `Requester::repeat_head`), so the floor was paid often; since the responder NAKs
/// again for a packet that asks (`responder.rs`), one in sixty or fewer.
/// Measured, 64 KiB WRITEs at 5 % loss on both NICs, window floor 32, alternating
/// builds on a loaded 2-core host
/// (while the NIC still slept in whole milliseconds, so a deadline that outlived its
/// 100 µs of spinning cost ~1.2 ms: docs/perf.md "Goodput under loss"):
/// 300 / 100 / 50 µs gave median 380 / 505 / 470 MB/s, with as many timer resends
/// (~200 per 32,000 packets) and no more duplicates at the responder — the estimate,
/// not the floor, was keeping spurious resends away. (Earlier, with a window floor of
/// 8: 1 ms ~150 MB/s, 300 µs ~200 MB/s.) Lossless, 8 B WRITEs over 1,000 and 10,000 QPs
/// (`nic_bench small_write_rate_over_many_connected_qps`, bursts of 16, two rounds
/// each): 2,300–19,800 packets resent per run against 1,700–8,800 with the 300 µs floor,
/// of 4–11 million sent — within this host's noise, perhaps somewhat more.
pub const MIN_RTO: Duration = Duration::from_micros(100);

/// The shortest Local ACK Timeout the adaptive timer charges retries by: 4.096 µs ×
/// 2^8 ≈ 1.05 ms, what rxe's timer gives any shorter `timeout` (it counts in jiffies,
/// at least one: 1 ms at HZ=1000, 4 ms at Debian's HZ=250). Below it a loaded host,
/// not the path, decides whether a connection lives: `ib_write_bw -u 1` (8 µs) charged
/// a retry every 8 µs without progress, so seven retries lasted 64 µs — shorter than
/// one scheduling delay of the peer NIC with two busy-polling programs on two cores
/// (about 1 ms in the captures) — and failed with RETRY_EXC_ERR every run, where rxe
/// runs it. Resends are still timed on the RTT estimate; only what counts as a
/// retry waits this long. [`AckTimer::Strict`] keeps the exact value.
pub const MIN_CHARGED_ACK_TIMEOUT: Duration = Duration::from_nanos(4096 << 8);

/// How the requester times acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckTimer {
    /// RTT-estimated resends, bounded by the Local ACK Timeout (module documentation).
    #[default]
    Adaptive,
    /// Resend only after the Local ACK Timeout (IBTA 9.7.6.1.3), as Linux rxe does.
    Strict,
}

/// RTT estimate, backoff and retry accounting of one requester.
#[derive(Debug, Clone, Default)]
pub(super) struct Rto {
    mode: AckTimer,
    /// This QP's own estimate, once sampled.
    own: Option<RttEstimate>,
    /// The estimate shared by every QP to the same peer NIC (private until the caller
    /// gives one).
    peer: PeerRtt,
    /// The one packet being timed: its PSN and when it was first sent.
    sample: Option<(Psn, Instant)>,
    /// Expiries since the last forward progress (each doubles the timeout).
    backoff: u32,
    /// Start of the current Local ACK Timeout period: the last forward progress, the
    /// first send after the window was empty, or the last charged retry.
    epoch: Option<Instant>,
    /// The last forward progress: with a sample, what keeps the own estimate fresh.
    progress: Option<Instant>,
}

impl Rto {
    pub fn mode(&self) -> AckTimer {
        self.mode
    }

    /// The Local ACK Timeout this timer works with for the `timeout` attribute's value
    /// `attr` (`None`: infinite): adaptive timing raises it to
    /// [`MIN_CHARGED_ACK_TIMEOUT`], strict timing takes it as it is.
    pub fn local_ack_timeout(&self, attr: Option<Duration>) -> Option<Duration> {
        match self.mode {
            AckTimer::Adaptive => attr.map(|d| d.max(MIN_CHARGED_ACK_TIMEOUT)),
            AckTimer::Strict => attr,
        }
    }

    pub fn set_mode(&mut self, mode: AckTimer) {
        *self = Rto {
            mode,
            peer: self.peer.clone(),
            ..Rto::default()
        };
    }

    /// From now on, samples feed (and timeouts read) `peer`, shared with the other QPs
    /// to the same peer NIC.
    pub fn set_peer(&mut self, peer: PeerRtt) {
        self.peer = peer;
    }

    /// The estimated timeout at `now` before backoff. With a fresh estimate of its own
    /// (a sample or progress lately), the larger of its own and the peer's. Without
    /// (idle, or sending only now and then), the peer's, and at least the largest round
    /// trip to the peer of the last 0.5–1 s (`peer_rtt.rs`: the stalls of a loaded
    /// host). The peer's is never older than the QP's own (every own sample feeds it):
    /// the freshest word on the path.
    fn estimate(&self, now: Instant) -> Option<Duration> {
        let heard = self.progress.unwrap_or(Instant::ZERO);
        match self.own.filter(|e| !e.is_stale_since(heard, now)) {
            Some(own) => Some(own.rto()).max(self.peer.get().map(|e| e.rto())),
            None => self
                .peer
                .get()
                .map(|e| e.rto().max(self.peer.recent_max(now))),
        }
    }

    /// The timeout at `now`, at most the Local ACK Timeout `bound`.
    fn rto(&self, now: Instant, bound: Duration) -> Duration {
        match (self.mode, self.estimate(now)) {
            (AckTimer::Adaptive, Some(base)) => {
                base.saturating_mul(1 << self.backoff.min(16)).min(bound)
            }
            _ => bound,
        }
    }

    /// When the timer armed at `now` fires, given the Local ACK Timeout (`None`:
    /// infinite, no timer at all — IBTA 9.7.6.1.3 timeout 0). Never later than the end
    /// of the current Local ACK Timeout period, so the charged expiries fall exactly
    /// where strict timing puts them.
    pub fn deadline(&self, now: Instant, local_ack: Option<Duration>) -> Option<Instant> {
        let bound = local_ack?;
        let t = now + self.rto(now, bound);
        Some(match (self.mode, self.epoch) {
            (AckTimer::Adaptive, Some(e)) => t.min(e + bound),
            _ => t,
        })
    }

    /// A packet with `psn` goes out at `now`; `resend` when it was sent before.
    pub fn on_send(&mut self, psn: Psn, resend: bool, now: Instant) {
        if !resend && self.sample.is_none() {
            self.sample = Some((psn, now));
        }
    }

    /// The first packet is sent into an empty window: a Local ACK Timeout period starts.
    pub fn on_arm_from_idle(&mut self, now: Instant) {
        self.epoch = Some(now);
    }

    /// Forward progress at `now`; `acked(psn)` tells whether a PSN is now acknowledged.
    ///
    /// A sample counts (in the QP's and the peer's smoothed estimate) at most as the
    /// timeout this QP had running. A longer round trip is one the timer could not cut
    /// short only because the requester's NIC was not running to fire it: on a loaded
    /// host it measures how long that thread waited for a core, not the path. Taken
    /// whole, one such sample (up to 9 ms among 100 µs ones, logged in issue 12 at 5 %
    /// loss) raised smoothed RTT + 4 deviations to 1–9 ms until later samples wore it
    /// down, and every tail-loss repair meanwhile waited that long. Clamped, it still
    /// raises the timeout (≈ 1.6× per such sample), so a path that really slows down
    /// is followed within a few samples. A QP whose estimate is stale already waits
    /// the peer's largest recent round trip, which keeps every sample whole, so the
    /// stalls of a busy host still count for QPs that send only now and then.
    pub fn on_progress(&mut self, now: Instant, acked: impl Fn(Psn) -> bool) {
        let taken = self.sample.take_if(|&mut (psn, _)| acked(psn));
        // The timeout that was running, read before this progress resets it; only a
        // sample needs it (most ACKs carry none).
        let running = taken.map(|_| self.rto(now, Duration::MAX));
        self.epoch = Some(now);
        self.progress = Some(now);
        // The path answers: drop the backoff at once rather than waiting for a clean
        // sample, which go-back-N recovery (all resends, Karn's rule) rarely yields.
        self.backoff = 0;
        if let (Some((_, sent)), Some(running)) = (taken, running) {
            let r = now.saturating_duration_since(sent);
            let counted = r.min(running);
            self.own = Some(RttEstimate::update(self.own, counted));
            self.peer.sample(counted, r, now);
        }
    }

    /// The requester goes back (any cause): a timed PSN is about to be resent, so its
    /// acknowledgement would no longer tell which send it answers (Karn's rule).
    pub fn on_rewind(&mut self) {
        self.sample = None;
    }

    /// The timer expired at `now`: doubles the next timeout, and tells whether this
    /// expiry is charged against `retry_cnt` (a full Local ACK Timeout without
    /// progress has passed, or timing is strict).
    pub fn on_expiry(&mut self, now: Instant, local_ack: Duration) -> bool {
        self.backoff = self.backoff.saturating_add(1);
        let charged = match (self.mode, self.epoch) {
            (AckTimer::Adaptive, Some(e)) => now.saturating_duration_since(e) >= local_ack,
            _ => true,
        };
        if charged {
            self.epoch = Some(now);
        }
        charged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: Duration = Duration::from_millis(67);

    fn at(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    #[test]
    fn strict_and_unsampled_use_the_local_ack_timeout() {
        let mut r = Rto::default();
        assert_eq!(r.rto(at(0), LAT), LAT);
        assert_eq!(r.deadline(at(0), None), None);
        r.set_mode(AckTimer::Strict);
        r.on_send(Psn::new(1), false, at(0));
        r.on_progress(at(50), |_| true);
        assert_eq!(r.rto(at(50), LAT), LAT);
        assert!(r.on_expiry(at(100), LAT), "strict: every expiry is charged");
    }

    #[test]
    fn samples_set_the_timeout_with_floor_backoff_and_bound() {
        let mut r = Rto::default();
        r.on_send(Psn::new(1), false, at(0));
        r.on_progress(at(20), |_| true);
        // srtt 20 µs, rttvar 10 µs: 60 µs, below the floor.
        assert_eq!(r.rto(at(20), LAT), MIN_RTO);
        r.on_send(Psn::new(2), false, at(1000));
        r.on_progress(at(5000), |_| true);
        let t = r.rto(at(5000), LAT);
        assert!(t > MIN_RTO && t < LAT, "{t:?}");
        r.on_arm_from_idle(at(5000));
        assert_eq!(r.deadline(at(5000), Some(LAT)), Some(at(5000) + t));
        assert!(!r.on_expiry(at(5000) + t, LAT));
        assert_eq!(r.rto(at(5000), LAT), (t * 2).min(LAT));
        for _ in 0..20 {
            r.on_expiry(at(6000), LAT);
        }
        assert_eq!(r.rto(at(6000), LAT), LAT, "backoff stops at the bound");
        // Armed late in a period, the timer fires at the period's end.
        r.on_arm_from_idle(at(10_000));
        assert_eq!(
            r.deadline(at(10_000) + (LAT - MIN_RTO), Some(LAT)),
            Some(at(10_000) + LAT)
        );
    }

    /// A 50 µs loopback path resends a lost tail after srtt + 4 deviations = 150 µs,
    /// not after a floor of several round trips (the floor was 300 µs).
    #[test]
    fn a_fast_path_resends_after_its_estimate() {
        let mut r = Rto::default();
        feed(&mut r, 1, Duration::from_micros(50), at(0));
        r.on_arm_from_idle(at(1_000));
        assert_eq!(r.deadline(at(1_000), Some(LAT)), Some(at(1_150)));
    }

    #[test]
    fn karn_no_sample_across_a_rewind_or_from_a_resend() {
        let mut r = Rto::default();
        r.on_send(Psn::new(1), false, at(0));
        r.on_rewind();
        r.on_send(Psn::new(1), true, at(10));
        r.on_progress(at(20_000), |_| true);
        assert_eq!(r.rto(at(20_000), LAT), LAT, "no sample taken");
        // An unacknowledged sample stays pending.
        r.on_send(Psn::new(2), false, at(30_000));
        r.on_progress(at(30_010), |_| false);
        assert_eq!(r.rto(at(30_010), LAT), LAT);
        r.on_progress(at(30_020), |_| true);
        assert_eq!(r.rto(at(30_020), LAT), MIN_RTO);
    }

    #[test]
    fn retries_are_charged_once_per_local_ack_timeout_without_progress() {
        let mut r = Rto::default();
        r.on_send(Psn::new(1), false, at(0));
        r.on_progress(at(100), |_| true);
        r.on_arm_from_idle(at(1_000));
        let mut charged = 0;
        let mut t = at(1_000);
        while t < at(1_000) + LAT * 3 {
            t = t + Duration::from_millis(1);
            if r.on_expiry(t, LAT) {
                charged += 1;
            }
        }
        assert_eq!(charged, 3, "one charge per 67 ms of silence");
        // Progress starts a new period.
        r.on_progress(t, |_| false);
        assert!(!r.on_expiry(t + Duration::from_millis(66), LAT));
        assert!(r.on_expiry(t + LAT, LAT));
    }

    /// `r` takes `n` samples of `rtt`, one every `rtt`, from `start`.
    fn feed(r: &mut Rto, n: u32, rtt: Duration, start: Instant) {
        for k in 0..n {
            let sent = start + rtt * k;
            r.on_send(Psn::new(k), false, sent);
            r.on_progress(sent + rtt, |_| true);
        }
    }

    /// A sample longer than the timeout the QP had running (its NIC was descheduled)
    /// moves the estimate by a bounded step; a path that stays slow is followed within
    /// a few samples.
    #[test]
    fn a_stalled_sample_counts_at_most_as_the_running_timeout() {
        let mut r = Rto::default();
        feed(&mut r, 40, Duration::from_micros(40), at(0));
        assert_eq!(r.rto(at(2_000), LAT), MIN_RTO);
        feed(&mut r, 1, Duration::from_millis(9), at(2_000));
        let after = r.rto(at(11_000), LAT);
        assert!(after <= MIN_RTO * 2, "{after:?}");
        assert_eq!(r.peer.recent_max(at(11_000)), Duration::from_millis(9));
        feed(&mut r, 20, Duration::from_millis(5), at(11_000));
        let slow = r.rto(at(111_000), LAT);
        assert!(slow >= Duration::from_millis(5), "{slow:?}");
    }

    /// Two QPs to one peer NIC, sharing its estimate.
    fn sharing_pair() -> (Rto, Rto) {
        let peer = PeerRtt::new();
        let (mut a, mut b) = (Rto::default(), Rto::default());
        a.set_peer(peer.clone());
        b.set_peer(peer);
        (a, b)
    }

    #[test]
    fn an_idle_qp_times_its_burst_on_the_peers_current_estimate() {
        let (mut idle, mut busy) = sharing_pair();
        // A 20 µs sample from a quiet moment...
        feed(&mut idle, 1, Duration::from_micros(20), at(0));
        // ...then the path to that peer fills: other QPs see 5 ms.
        feed(&mut busy, 40, Duration::from_millis(5), at(800_000));
        let now = at(1_000_000);
        idle.on_arm_from_idle(now);
        let wait = idle.deadline(now, Some(LAT)).unwrap() - now;
        assert!(
            wait >= Duration::from_micros(4_900),
            "resends after {wait:?}"
        );
        assert!(wait <= LAT);
        // Alone, its own sample would have resent after the floor.
        let mut alone = Rto::default();
        feed(&mut alone, 1, Duration::from_micros(20), at(0));
        alone.on_arm_from_idle(now);
        assert_eq!(alone.deadline(now, Some(LAT)), Some(now + MIN_RTO));
    }

    /// Go-back-N recovery takes few samples (Karn's rule), but a QP whose ACKs keep
    /// arriving keeps its own estimate: it does not wait out the peer's worst recent
    /// round trip for each tail-loss repair.
    #[test]
    fn progress_without_samples_keeps_the_own_estimate() {
        let (mut stalled, mut repairing) = sharing_pair();
        feed(&mut stalled, 1, Duration::from_millis(3), at(0));
        feed(&mut repairing, 80, Duration::from_micros(20), at(1_000));
        let base = repairing.rto(at(2_600), LAT);
        assert_eq!(base, MIN_RTO);
        // 5 ms of ACKs every 200 µs, none acknowledging a timed packet.
        let mut t = 2_600;
        while t < 7_600 {
            t += 200;
            repairing.on_progress(at(t), |_| false);
        }
        assert_eq!(repairing.rto(at(t + 100), LAT), base, "still its own");
        // Silent for eight of its timeouts: the peer's worst recent round trip.
        assert_eq!(repairing.rto(at(t + 801), LAT), Duration::from_millis(3));
    }

    #[test]
    fn the_own_estimate_counts_while_fresh_then_gives_way_to_the_peers() {
        let (mut slow, mut fast) = sharing_pair();
        // 5 ms: own timeout 15 ms, stale 120 ms later.
        feed(&mut slow, 1, Duration::from_millis(5), at(0));
        feed(&mut fast, 80, Duration::from_micros(20), at(10_000));
        // Fresh, the own estimate counts when it is the larger: its packets may take
        // longer than the peer's average.
        assert_eq!(slow.rto(at(100_000), LAT), Duration::from_millis(15));
        // Its own stale already (nothing since 12 ms), the fast one waits at least the
        // peer's largest recent round trip, the 5 ms one.
        assert_eq!(fast.rto(at(100_000), LAT), Duration::from_millis(5));
        // Own stale: the peer's, at least its largest round trip of the last 0.5–1 s
        // (the 5 ms one)...
        let five = Duration::from_millis(5);
        assert_eq!(slow.rto(at(200_000), LAT), five, "own stale: the peer's");
        assert_eq!(fast.rto(at(200_000), LAT), five);
        // ...which is forgotten a second later.
        assert_eq!(slow.rto(at(1_000_000), LAT), MIN_RTO);
        // A QP with a fresh estimate does not wait out the peer's recent stall.
        feed(&mut slow, 1, Duration::from_millis(20), at(1_100_000));
        feed(&mut fast, 80, Duration::from_micros(20), at(1_120_000));
        assert_eq!(fast.rto(at(1_122_100), LAT), MIN_RTO);
        assert_eq!(fast.rto(at(1_200_000), LAT), Duration::from_millis(20));
        // A peer estimate beyond the Local ACK Timeout is bounded by it, and a whole
        // Local ACK Timeout still charges exactly one retry.
        feed(&mut fast, 4, Duration::from_millis(200), at(1_300_000));
        slow.on_arm_from_idle(at(3_000_000));
        assert_eq!(
            slow.deadline(at(3_000_000), Some(LAT)),
            Some(at(3_000_000) + LAT)
        );
        assert!(!slow.on_expiry(at(3_000_000) + LAT / 2, LAT));
        assert!(slow.on_expiry(at(3_000_000) + LAT, LAT));
    }
}
