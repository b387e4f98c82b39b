//! When spinning does not pay: the idle loop's guard against a core held by a thread
//! that never yields.
//!
//! While idle the NIC spins for [`super::runtime::SPIN`], yielding the core after each
//! pass, because a woken thread costs more than the polls it saves (docs/perf.md, "Many
//! QPs", session 18). That holds while the threads it shares the core with yield too
//! (its clients polling a CQ, the peer NIC). A program that waits by reading its own
//! memory in a tight loop — qperf's `rc_rdma_write_poll_lat`, MPI-style RDMA WRITE
//! polling — never yields: a yield hands it the core until the scheduler's next tick
//! (4 ms at `HZ=250`), and each hop of a round trip waited for one (qperf measured
//! 2–4 ms per round trip between two NICs on two cores).
//!
//! A sleeping thread is different: when its wake-up comes (the client's wake pipe
//! written because NEED_WAKEUP is set, a packet on the socket) the scheduler lets it
//! preempt the spinner at once. So when [`STRIKES`] yields in a row, each within
//! [`STRIKE_WINDOW`] of the last, kept the NIC off the core for longer than
//! [`STARVED_GAP`], the loop sleeps as soon as it is idle (no spin) for the next
//! [`STARVED_HOLD`], then tries spinning again. One long gap is not enough: a busy
//! host (or the hypervisor) takes a core away for a millisecond now and then, and
//! sleeping when idle costs a loaded NIC its throughput (the many-QP bench lost 3–6 %
//! when single gaps triggered it). Counted as `spin_starved`.
//!
//! Sans-IO like the transport: the runtime passes the instants; the guard reads no clock.

use softnic_transport::time::Instant;
use std::time::Duration;

/// A yield that lost the core for longer than this means a thread on it does not yield:
/// a quarter of a 250 Hz tick, ten times the spin window. Yields to threads that poll
/// and yield come back within microseconds (the many-QP bench's three threads on two
/// cores: never above this).
pub const STARVED_GAP: Duration = Duration::from_millis(1);

/// Starved gaps that start a hold, each within [`STRIKE_WINDOW`] of the one before:
/// a thread that never yields makes one per scheduler tick (1–4 ms).
pub const STRIKES: u32 = 3;

/// See [`STRIKES`].
pub const STRIKE_WINDOW: Duration = Duration::from_millis(20);

/// How long the loop sleeps when idle instead of spinning once starved; then it spins
/// again, and a spinner still there costs one more gap to notice (≤ 4 ms in 100 ms).
pub const STARVED_HOLD: Duration = Duration::from_millis(100);

/// The loop's record of its last pass and of the last time a yield was starved.
#[derive(Debug, Default)]
pub struct StarvedSpin {
    /// The end of the last pass (or of the last sleep); `None` before the first.
    last_end: Option<Instant>,
    /// Until when idle passes sleep at once.
    sleep_until: Option<Instant>,
    /// Starved gaps so far in a row, and the pass start that noticed the last one.
    strikes: u32,
    last_strike: Option<Instant>,
}

impl StarvedSpin {
    /// A guard that has seen no pass yet.
    pub fn new() -> Self {
        StarvedSpin::default()
    }

    /// At the start of a pass: notes whether the time since the last pass ended (a
    /// yield, or a preemption mid-loop) exceeded [`STARVED_GAP`]; the [`STRIKES`]th such
    /// gap in a row starts a [`STARVED_HOLD`] of sleeping when idle, and is what this
    /// returns `true` for.
    pub fn pass_start(&mut self, now: Instant) -> bool {
        let gap = self
            .last_end
            .is_some_and(|t| now.saturating_duration_since(t) > STARVED_GAP);
        if !gap {
            return false;
        }
        let in_row = self
            .last_strike
            .is_some_and(|t| now.saturating_duration_since(t) <= STRIKE_WINDOW);
        self.strikes = if in_row { self.strikes + 1 } else { 1 };
        self.last_strike = Some(now);
        if self.strikes < STRIKES {
            return false;
        }
        self.strikes = 0;
        self.sleep_until = Some(now + STARVED_HOLD);
        true
    }

    /// After a pass (the yield that may follow is what the next `pass_start` measures).
    pub fn pass_end(&mut self, now: Instant) {
        self.last_end = Some(now);
    }

    /// After a sleep: the time asleep was chosen, not lost.
    pub fn slept(&mut self, now: Instant) {
        self.last_end = Some(now);
    }

    /// Whether an idle pass may spin (otherwise it sleeps at once).
    pub fn may_spin(&self, now: Instant) -> bool {
        self.sleep_until.is_none_or(|t| now >= t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn short_gaps_keep_spinning() {
        let mut s = StarvedSpin::new();
        assert!(!s.pass_start(at(0)), "no pass before the first");
        s.pass_end(at(5));
        for k in 0..10 {
            let t = 5 + k * 1_000;
            assert!(
                !s.pass_start(at(t + 1_000)),
                "exactly the gap is not starved"
            );
            s.pass_end(at(t + 1_000));
        }
        assert!(s.may_spin(at(20_000)));
    }

    /// Gaps of `gap_us` from `t`: returns when the last pass ended and whether any
    /// `pass_start` reported a hold.
    fn gaps(s: &mut StarvedSpin, mut t: u64, n: u32, gap_us: u64) -> (u64, bool) {
        let mut held = false;
        for _ in 0..n {
            t += gap_us;
            held |= s.pass_start(at(t));
            t += 10;
            s.pass_end(at(t));
        }
        (t, held)
    }

    #[test]
    fn three_long_gaps_in_a_row_sleep_for_the_hold_then_spin_again() {
        let mut s = StarvedSpin::new();
        s.pass_end(at(0));
        let (t, held) = gaps(&mut s, 0, 2, 4_000);
        assert!(!held && s.may_spin(at(t)), "two gaps are not enough");
        let (t, held) = gaps(&mut s, t, 1, 4_000);
        assert!(held, "the third in a row starts the hold");
        assert!(!s.may_spin(at(t)));
        let start = t - 10;
        assert!(!s.may_spin(at(start + 99_999)));
        assert!(s.may_spin(at(start + 100_000)));
    }

    #[test]
    fn long_gaps_far_apart_never_sleep() {
        let mut s = StarvedSpin::new();
        s.pass_end(at(0));
        let mut t = 0;
        for _ in 0..10 {
            let (u, held) = gaps(&mut s, t, 1, 2_000);
            assert!(!held);
            // 30 ms of short gaps between two long ones: more than the strike window.
            let (u, held) = gaps(&mut s, u, 300, 100);
            assert!(!held);
            t = u;
        }
        assert!(s.may_spin(at(t)));
    }

    #[test]
    fn time_asleep_is_not_a_gap() {
        let mut s = StarvedSpin::new();
        s.pass_end(at(0));
        for k in 1..=5 {
            s.slept(at(k * 50_000));
            assert!(!s.pass_start(at(k * 50_000 + 10)));
        }
        assert!(s.may_spin(at(250_010)));
    }
}
