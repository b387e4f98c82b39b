//! Hybrid polling: what a program busy-polling an empty CQ does between polls, so that
//! an idle poller gives its core back without slowing a ping-pong.
//!
//! Why: softnic's NIC is a process on the same cores as its clients. A program that
//! spins on an empty CQ (perftest, the pingpongs, `softnic perf`) takes cores the NICs
//! need: during `softnic perf write_bw -s 65536` on a quiet host the client used 66 % of
//! a core polling and yielding, beside a sending NIC that needed a whole one
//! (docs/perf.md, "Hybrid polling"), and a server waiting between requests spins for
//! as long as it waits. `sched_yield` gives the core away for very little time under
//! EEVDF.
//!
//! What, after each empty poll (`IdleState::after_empty`):
//! 1. spin; every [`POLL_YIELD_EVERY`] empty polls in a row, a *yield point*;
//! 2. at a yield point, `sched_yield` — unless nothing happened for the spin window:
//!    no poll of this context found a completion and the NIC flushed none of its CQs
//!    (the completion sequence on the doorbell page did not move) since the window
//!    began. The window is [`DEFAULT_SPIN_WINDOW`] (50 µs) or twice the recent gap
//!    between such events, whichever is longer, up to [`MAX_WINDOW`] ([`spin_window`]
//!    says why);
//! 3. then sleep on the sequence word (a shared futex) for at most [`MAX_SLEEP`]: the
//!    NIC wakes the sleeper when it next publishes a completion to *any* CQ of this
//!    context, so a program that polls its send CQ and its receive CQ in turn wakes
//!    for either. The handshake and its proof are in `abi::doorbell`'s module docs.
//! 4. but at a yield point before the window ran out, *nap* instead of `sched_yield`
//!    (a timed sleep that the NIC does not end early) when much send work is queued
//!    ahead of the NIC for this context: for a [`NAP_SHARE`] of the time the NIC
//!    needs for it (send WQEs queued × the NIC's recent time per retired WQE), if
//!    that is at least the shortest nap ([`DEFAULT_NAP_MIN`], [`POLL_NAP_ENV`]), at
//!    most the longest single sleep ([`nap_for`] says why). Queued = the context's
//!    posted send WQEs less those the NIC retired, which it counts on the doorbell
//!    page: two loads, O(1) however many QPs; the pace is sampled at yield points.
//!    A context that received a message within [`RECV_QUIET`] (2 ms) does not nap.
//!
//! A poll that finds completions makes no system call (it stores a counter), so a busy
//! data path stays syscall-free (`softnic/tests/nic_no_syscalls.rs`). The window (at
//! least 50 µs, and twice the recent gap between completions) is several 8 B round
//! trips on a quiet 2-core host (10–12 µs, docs/perf.md, "Last table"), so a
//! ping-pong sleeps only on its slow tail; the sleep is bounded so that
//! a loop that also watches something else (a socket, a flag in memory) is delayed by
//! ≤ 1 ms.
//! Several threads may sleep on one context (one page) at once: only the NIC clears
//! the shared flag, when it wakes them all, so a sleep that ends by its timeout leaves
//! it set rather than hide the others (the NIC's next flush then makes one
//! `futex_wake` that wakes nobody).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::abi::Doorbell;

/// Empty polls in a row after which a program polling a CQ in a loop should yield the
/// core once (`sched_yield`), when the NIC is softnic rather than hardware.
///
/// Why: the NIC is a process on the same cores. On a host with fewer cores than busy
/// threads (two NICs and two ping-pong clients on two cores) a poller that spins on
/// keeps the NIC, or the peer, off the core until the scheduler preempts it, and every
/// hand-off of a round trip waits for a time slice. Measured on a 2-vCPU VM
/// (docs/perf.md, "Latency"): `softnic perf send_lat -s 8` round trip 78–83 µs when
/// its loops yielded after 256 empty polls, 51–53 µs after 64, 41–42 µs after 4 or 1;
/// stock `ib_send_lat` likewise. A poll that finds a completion never yields, so a busy
/// data path makes no system call. `softnic perf`'s loops and the C library's
/// `ibv_poll_cq` (`SOFTNIC_IBV_POLL_YIELD`) use this value.
pub const POLL_YIELD_EVERY: u32 = 4;

/// The environment variable that sets the spin window in microseconds (read once per
/// context, at open): `off` never sleeps (spin and yield only, as before hybrid
/// polling). Default [`DEFAULT_SPIN_WINDOW`].
pub const POLL_SPIN_ENV: &str = "SOFTNIC_POLL_SPIN_US";

/// The environment variable that sets the shortest nap in microseconds (read once per
/// context, at open): `off` (or 0) never naps. Default [`DEFAULT_NAP_MIN`]. With
/// [`POLL_SPIN_ENV`] `off` a poller never naps either (it never sleeps at all).
pub const POLL_NAP_ENV: &str = "SOFTNIC_POLL_NAP_US";

/// The shortest nap worth taking: twice a normal thread's timer slack (50 µs, which a
/// short sleep oversleeps by), so that a nap is mostly nap.
pub const DEFAULT_NAP_MIN: Duration = Duration::from_micros(100);

/// A nap lasts this fraction (1/`NAP_SHARE`) of the estimated time the NIC needs for
/// the send work queued ahead of it, so that a nap overslept by a loaded scheduler
/// still ends long before the NIC runs dry.
pub const NAP_SHARE: u32 = 4;

/// Fewest queued send WQEs for a nap: with one or two outstanding (a ping-pong) the
/// time per WQE is a round trip, which says how long the *peer* takes, not how much
/// work the NIC has; such a poller spins, yields and sleeps as before.
pub const NAP_MIN_QUEUED: u32 = 4;

/// The retirement rate is sampled at yield points at least this far apart (a dozen
/// 64 KiB WRITEs, hundreds of 8 B ones).
const RATE_PERIOD: Duration = Duration::from_micros(200);

/// A poller that received a message this recently does not nap: what arrives is not
/// bounded by its own send queue, and its receive queue (or its peer, waiting for an
/// answer) may need it sooner than the nap would end.
pub const RECV_QUIET: Duration = Duration::from_millis(2);

/// A rate sample older than this (the program did something else meanwhile) says
/// nothing about the NIC's pace now: it is dropped and measured again.
const RATE_STALE: Duration = Duration::from_millis(5);

/// The shortest spin window: how long a poller spins (and yields) after the last sign
/// of a completion before it sleeps, at least: 4–5 8 B round trips on a quiet 2-core
/// host (10–12 µs; 20 µs when this was chosen, which still fits 2.5 of them), so a
/// slow round trip does not put the poller to sleep; [`spin_window`] lengthens it for
/// slower paces.
pub const DEFAULT_SPIN_WINDOW: Duration = Duration::from_micros(50);

/// Longest single sleep: a poll loop that waits for something the NIC does not signal
/// (memory written by a peer, another descriptor) is delayed by at most this.
pub const MAX_SLEEP: Duration = Duration::from_millis(1);

/// The spin window [`POLL_SPIN_ENV`] asks for; `None` = never sleep.
pub fn spin_window_from(value: Option<&str>) -> Option<Duration> {
    micros_or_off(value, DEFAULT_SPIN_WINDOW)
}

/// The shortest nap [`POLL_NAP_ENV`] asks for; `None` = never nap.
pub fn nap_min_from(value: Option<&str>) -> Option<Duration> {
    micros_or_off(value, DEFAULT_NAP_MIN)
}

/// An environment value in microseconds: unset or unreadable = `default`, `off` = `None`.
fn micros_or_off(value: Option<&str>, default: Duration) -> Option<Duration> {
    match value.map(str::trim) {
        None => Some(default),
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        Some(v) => Some(v.parse().map(Duration::from_micros).unwrap_or(default)),
    }
}

/// How long a poller at a yield point naps, if at all: `queued` send WQEs wait for
/// the NIC, which recently took `per_wqe` for each (`None`: no recent measure), so it
/// is busy for about `queued × per_wqe`; the nap is a [`NAP_SHARE`] of that, when it
/// is at least `min`, at most `max`.
///
/// Why: a poller whose completions come a few tens of µs apart never reaches a sleep
/// (the spin window grows with the gap, [`spin_window`]) and spins and yields between
/// them, taking up to two thirds of a core beside NICs that each need a whole one
/// (docs/perf.md, "Hybrid polling"). When the NIC has milliseconds of work queued
/// (`write_bw -s 65536`: ≈ 128 WRITEs of ≈ 16 µs each) nothing the poller does before
/// it wakes can speed the NIC up, so it may as well give its core away. The NIC is
/// not asked to end the nap (a futex wake per completion would cost the sending NIC,
/// the bottleneck, a system call per message); the nap ends early enough by itself.
/// With little queued (8 B WRITEs, ≈ 0.5 µs each, at most 128 queued) the share is
/// far below `min` and nothing changes: a fixed nap there would starve the NIC
/// ([`spin_window`] tells of a 50 µs window costing 8–17 %).
pub fn nap_for(
    queued: u32,
    per_wqe: Option<Duration>,
    min: Duration,
    max: Duration,
) -> Option<Duration> {
    let per_wqe = per_wqe?;
    if queued < NAP_MIN_QUEUED {
        return None;
    }
    let nap = per_wqe.saturating_mul(queued) / NAP_SHARE;
    (nap >= min && !min.is_zero()).then(|| nap.min(max))
}

/// The pace kept after a rate sample of `sample` ns per WQE, when it was `per` (0 =
/// none): a faster sample is taken at once, a slower one raises it by at most a
/// quarter.
///
/// Why fast down, slow up: the pace sizes a nap that the NIC cannot cut short, so it
/// errs fast. A slow period is often not the NIC's own pace but a moment in which
/// the other processes on its cores preempted it: measured in an 8 B stream at
/// ≈ 1 µs per WQE, single 200 µs periods of 7–22 µs per WQE came every few ms, and
/// a moving average that followed them a quarter of the way napped 100–700 µs with
/// ≈ 130 µs of work queued. Only a slowness that lasts (≈ 1 ms for 3×) sets the pace.
pub fn pace(per: u64, sample: u64) -> u64 {
    if per == 0 {
        sample
    } else {
        sample.min(per + per / 4)
    }
}

/// A context's share of hybrid polling: its spin window, whether any of its polls
/// found completions lately, and the send work it has queued.
#[derive(Debug)]
pub(crate) struct ContextPoll {
    /// Bumped by every poll that finds completions (any CQ of the context).
    found: AtomicU32,
    /// Bumped by every poll that finds a receive completion (any CQ of the context).
    received: AtomicU32,
    /// Send WQEs posted to this context's QPs (wrapping; less those a destroyed QP
    /// left unretired): `posted − sends_retired` (doorbell page) are queued.
    posted: AtomicU32,
    /// The spin window in nanoseconds; [`NEVER`] = never sleep.
    window_ns: AtomicU64,
    /// The longest single sleep in nanoseconds.
    max_sleep_ns: AtomicU64,
    /// The shortest nap in nanoseconds; [`NEVER`] = never nap.
    nap_min_ns: AtomicU64,
    /// Naps taken (for tests and tools).
    naps: AtomicU64,
    base: Instant,
}

/// `window_ns` of a context that never sleeps.
const NEVER: u64 = u64::MAX;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(NEVER - 1)
}

impl ContextPoll {
    /// Reads [`POLL_SPIN_ENV`] (at open: reading the environment allocates).
    pub(crate) fn from_env() -> Self {
        let v = std::env::var(POLL_SPIN_ENV).ok();
        let nap = std::env::var(POLL_NAP_ENV).ok();
        let p = ContextPoll {
            found: AtomicU32::new(0),
            received: AtomicU32::new(0),
            posted: AtomicU32::new(0),
            window_ns: AtomicU64::new(NEVER),
            max_sleep_ns: AtomicU64::new(0),
            nap_min_ns: AtomicU64::new(NEVER),
            naps: AtomicU64::new(0),
            base: Instant::now(),
        };
        p.set(spin_window_from(v.as_deref()), MAX_SLEEP);
        p.set_nap(nap_min_from(nap.as_deref()));
        p
    }

    /// Sets the shortest nap (`None`: never nap).
    pub(crate) fn set_nap(&self, min: Option<Duration>) {
        self.nap_min_ns
            .store(min.map_or(NEVER, nanos), Ordering::Relaxed);
    }

    /// `n` send WQEs were posted (published to an SQ ring of this context).
    pub(crate) fn note_posted(&self, n: u32) {
        self.posted.fetch_add(n, Ordering::Relaxed);
    }

    /// A destroyed QP left `n` send WQEs that the NIC never retired: they are no
    /// longer queued.
    pub(crate) fn note_abandoned(&self, n: u32) {
        self.posted.fetch_sub(n, Ordering::Relaxed);
    }

    /// Naps taken by this context's pollers so far.
    pub(crate) fn naps(&self) -> u64 {
        self.naps.load(Ordering::Relaxed)
    }

    /// Send WQEs queued ahead of the NIC, and the NIC's count of retired ones. The
    /// retired count is read first, so it never includes a WQE posted after `posted`
    /// was read; a difference that is still "negative" (a destroyed QP's WQEs
    /// subtracted while a racing post is not yet counted) reads as 0.
    fn queued(&self, page: &Doorbell) -> (u32, u32) {
        let retired = page.sends_retired();
        let q = self.posted.load(Ordering::Relaxed).wrapping_sub(retired);
        (if q > u32::MAX / 2 { 0 } else { q }, retired)
    }

    /// Sets the spin window (`None`: never sleep) and the longest single sleep.
    pub(crate) fn set(&self, window: Option<Duration>, max_sleep: Duration) {
        self.window_ns
            .store(window.map_or(NEVER, nanos), Ordering::Relaxed);
        self.max_sleep_ns.store(nanos(max_sleep), Ordering::Relaxed);
    }

    /// A poll found completions: a load and a store, no read-modify-write (racing
    /// threads only need to see that the value moved).
    pub(crate) fn note_found(&self) {
        let f = self.found.load(Ordering::Relaxed);
        self.found.store(f.wrapping_add(1), Ordering::Relaxed);
    }

    /// A poll found a receive completion (as [`Self::note_found`]).
    pub(crate) fn note_received(&self) {
        let r = self.received.load(Ordering::Relaxed);
        self.received.store(r.wrapping_add(1), Ordering::Relaxed);
    }
}

/// One CQ's idle state. Atomics, so that the C library can use it through `&self`
/// without a lock; threads polling one CQ at once only blur the heuristic.
#[derive(Debug)]
pub(crate) struct IdleState {
    empty: AtomicU32,
    yield_every: AtomicU32,
    /// The completion sequence and found counter at the last yield point, and when
    /// (nanoseconds after the context's base) either last moved.
    seq: AtomicU32,
    found: AtomicU32,
    since: AtomicU64,
    /// Moving average (1/8 weight) of the time between those moves, each capped at
    /// [`MAX_WINDOW`], in nanoseconds.
    gap: AtomicU64,
    /// The NIC's retired-send count at the last rate sample, and when (nanoseconds
    /// after the context's base; 0 = none yet).
    rate_retired: AtomicU32,
    rate_at: AtomicU64,
    /// The NIC's recent pace in nanoseconds per retired send WQE ([`pace`]); 0 = no
    /// recent measure (none yet, stale, or the NIC retired nothing in a period).
    per_wqe: AtomicU64,
    /// The context's receive count at the last yield point, and when it last moved
    /// (nanoseconds after the context's base; see [`RECV_QUIET`]).
    received: AtomicU32,
    received_at: AtomicU64,
}

/// The spin window never grows past this, however far apart completions come.
pub const MAX_WINDOW: Duration = Duration::from_millis(1);

/// The spin window for a CQ whose completions came `gap` apart on average: at least
/// `min`, at least twice the gap, at most [`MAX_WINDOW`] (but never below `min`).
///
/// Why adaptive: a poller woken by the NIC is late by a wake-up (tens of µs on a
/// loaded host), which costs nothing when the NIC has plenty queued (64 KiB WRITEs,
/// every one signaled: 127 messages ≈ 2 ms of work behind each completion) but starves
/// it when little is (8 B WRITEs signaled every 100th of 128: 28 messages ≈ 20–60 µs).
/// Measured with a fixed 50 µs window, `softnic perf write_bw -s 8` slept at more than
/// half of its completions (≈ 200 µs apart under load) and lost 8–17 % of its rate.
/// A program whose completions come at a steady pace keeps spinning through that
/// pace, and sleeps once they stop.
pub fn spin_window(min: Duration, gap: Duration) -> Duration {
    (gap * 2).min(MAX_WINDOW).max(min)
}

impl Default for IdleState {
    fn default() -> Self {
        IdleState {
            empty: AtomicU32::new(0),
            yield_every: AtomicU32::new(POLL_YIELD_EVERY),
            seq: AtomicU32::new(0),
            found: AtomicU32::new(0),
            since: AtomicU64::new(0),
            gap: AtomicU64::new(0),
            rate_retired: AtomicU32::new(0),
            rate_at: AtomicU64::new(0),
            per_wqe: AtomicU64::new(0),
            received: AtomicU32::new(0),
            received_at: AtomicU64::new(0),
        }
    }
}

impl IdleState {
    /// Empty polls between yield points; 0 = never yield nor sleep (spin as on hardware).
    pub(crate) fn set_yield_every(&self, n: u32) {
        self.yield_every.store(n, Ordering::Relaxed);
    }

    /// This CQ's poll found completions: ends the empty streak.
    pub(crate) fn note_found(&self) {
        if self.empty.load(Ordering::Relaxed) != 0 {
            self.empty.store(0, Ordering::Relaxed);
        }
    }

    /// After a poll that found nothing: spin, yield, nap or sleep (module docs).
    /// Returns whether it slept or napped.
    pub(crate) fn after_empty(&self, ctx: &ContextPoll, page: &Doorbell) -> bool {
        let n = self.empty.load(Ordering::Relaxed).wrapping_add(1);
        self.empty.store(n, Ordering::Relaxed);
        let every = self.yield_every.load(Ordering::Relaxed);
        if every == 0 || !n.is_multiple_of(every) {
            std::hint::spin_loop();
            return false;
        }
        let window = ctx.window_ns.load(Ordering::Relaxed);
        if window == NEVER {
            std::thread::yield_now();
            return false;
        }
        let seq = page.poll_seq().load(Ordering::Acquire);
        let found = ctx.found.load(Ordering::Relaxed);
        let now = ctx.base.elapsed().as_nanos() as u64;
        let since = self.since.load(Ordering::Relaxed);
        let gap = self.gap.load(Ordering::Relaxed);
        if seq != self.seq.load(Ordering::Relaxed) || found != self.found.load(Ordering::Relaxed) {
            self.seq.store(seq, Ordering::Relaxed);
            self.found.store(found, Ordering::Relaxed);
            self.since.store(now, Ordering::Relaxed);
            let sample = now.saturating_sub(since).min(nanos(MAX_WINDOW));
            self.gap.store((gap * 7 + sample) / 8, Ordering::Relaxed);
            return self.nap_or_yield(ctx, page, now);
        }
        let window = nanos(spin_window(
            Duration::from_nanos(window),
            Duration::from_nanos(gap),
        ));
        if now.saturating_sub(since) < window {
            return self.nap_or_yield(ctx, page, now);
        }
        let sleeps = page.set_sleeper(seq);
        if sleeps {
            // An error (none is expected of FUTEX_WAIT) only means no sleep: the loop
            // goes on polling and yielding.
            let max = Duration::from_nanos(ctx.max_sleep_ns.load(Ordering::Relaxed));
            let _ = crate::os::futex_wait(page.poll_seq(), seq, max);
        }
        // The flag is left for the NIC to clear: another thread (or process) on this
        // page may have set it too and still sleep, and clearing it here would hide
        // that sleeper from the next flush. Costs the NIC one futex_wake for a sleep
        // that ended by its timeout.
        sleeps
    }

    /// A yield point before the spin window ran out: naps while much send work is
    /// queued ([`nap_for`]), else `sched_yield`. Returns whether it napped.
    fn nap_or_yield(&self, ctx: &ContextPoll, page: &Doorbell, now: u64) -> bool {
        let (queued, retired) = ctx.queued(page);
        let per_wqe = self.sample_rate(queued, retired, now);
        let min = match self.receiving(ctx, now) {
            true => NEVER,
            false => ctx.nap_min_ns.load(Ordering::Relaxed),
        };
        let max = Duration::from_nanos(ctx.max_sleep_ns.load(Ordering::Relaxed));
        let nap = (min != NEVER)
            .then(|| nap_for(queued, per_wqe, Duration::from_nanos(min), max))
            .flatten();
        match nap {
            Some(d) => {
                ctx.naps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(d);
                true
            }
            None => {
                std::thread::yield_now();
                false
            }
        }
    }

    /// Whether a poll of this context found a receive completion within [`RECV_QUIET`]
    /// (as seen at this CQ's yield points).
    fn receiving(&self, ctx: &ContextPoll, now: u64) -> bool {
        let r = ctx.received.load(Ordering::Relaxed);
        if r != self.received.load(Ordering::Relaxed) {
            self.received.store(r, Ordering::Relaxed);
            self.received_at.store(now.max(1), Ordering::Relaxed);
            return true;
        }
        let at = self.received_at.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) < nanos(RECV_QUIET)
    }

    /// The NIC's recent time per retired send WQE, from its `retired` count `now`
    /// (ns after the context's base), re-sampled at most every [`RATE_PERIOD`], and
    /// only over periods that began and ended with at least [`NAP_MIN_QUEUED`] send
    /// WQEs `queued`: a NIC with little to do retires at the pace of its work, not of
    /// its own (a ping-pong's round trips), which would make a stream that follows
    /// look slow.
    fn sample_rate(&self, queued: u32, retired: u32, now: u64) -> Option<Duration> {
        let at = self.rate_at.load(Ordering::Relaxed);
        if queued < NAP_MIN_QUEUED {
            if at != 0 {
                self.rate_at.store(0, Ordering::Relaxed);
                self.per_wqe.store(0, Ordering::Relaxed);
            }
            return None;
        }
        let per = self.per_wqe.load(Ordering::Relaxed);
        let dt = now.saturating_sub(at);
        if at != 0 && dt < nanos(RATE_PERIOD) {
            return (per != 0).then(|| Duration::from_nanos(per));
        }
        let done = retired.wrapping_sub(self.rate_retired.load(Ordering::Relaxed));
        let fresh = at != 0 && dt <= nanos(RATE_STALE);
        let per = match (fresh, done) {
            // None retired in a period (a stalled or idle NIC), or a stale sample or a
            // count gone backwards (the NIC is the only honest writer): no measure.
            (false, _) | (true, 0) => 0,
            (true, d) if d > u32::MAX / 2 => 0,
            (true, d) => pace(per, dt / u64::from(d)),
        };
        self.rate_retired.store(retired, Ordering::Relaxed);
        self.rate_at.store(now.max(1), Ordering::Relaxed);
        self.per_wqe.store(per, Ordering::Relaxed);
        (per != 0).then(|| Duration::from_nanos(per))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_the_pace_of_completions_within_bounds() {
        let us = Duration::from_micros;
        assert_eq!(
            spin_window(us(50), us(10)),
            us(50),
            "a fast pace: the minimum"
        );
        assert_eq!(spin_window(us(50), us(200)), us(400), "twice a slow pace");
        assert_eq!(spin_window(us(50), us(900)), MAX_WINDOW, "capped");
        assert_eq!(
            spin_window(us(2000), us(900)),
            us(2000),
            "never below the minimum"
        );
    }

    /// Two pollers sleep on one doorbell page (two threads of a context, or of two
    /// contexts sharing it): the one whose sleep times out first must not hide the
    /// other from the NIC. The old code cleared the shared flag after every sleep, so
    /// the NIC's next flush saw nobody sleeping and the other poller slept out its
    /// whole timeout (5 s here) with its completion published.
    #[test]
    fn a_sleep_that_times_out_does_not_hide_another_sleeper() {
        use std::os::fd::AsFd;
        use std::sync::Arc;
        let len = crate::abi::DOORBELL_SEGMENT_LEN;
        let fd = crate::os::memfd("db", len).unwrap();
        let map = || Arc::new(crate::os::map_shared(fd.as_fd(), len).unwrap());
        let (page_b, page_a, nic) = (
            Doorbell::new(map()).unwrap(),
            Doorbell::new(map()).unwrap(),
            Doorbell::new(map()).unwrap(),
        );
        // B sleeps up to 5 s; A (same page) up to 1 ms. Window 0: sleep at once.
        let (ctx_b, ctx_a) = (ContextPoll::from_env(), ContextPoll::from_env());
        ctx_b.set(Some(Duration::ZERO), Duration::from_secs(5));
        ctx_a.set(Some(Duration::ZERO), Duration::from_millis(1));
        let b = std::thread::spawn(move || {
            let idle = IdleState::default();
            while !idle.after_empty(&ctx_b, &page_b) {}
            Instant::now()
        });
        let flag = || nic.page().poll.0.sleeping.load(Ordering::SeqCst);
        let start = Instant::now();
        while flag() == 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "B never slept");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20)); // B is in FUTEX_WAIT
        let idle = IdleState::default();
        while !idle.after_empty(&ctx_a, &page_a) {} // A's sleep times out
                                                    // The NIC's flush (as `CompletionQueue::flush` in softnic/src/nic/cq.rs).
        nic.note_completions();
        std::sync::atomic::fence(Ordering::SeqCst);
        let flushed = Instant::now();
        if nic.take_sleeper() {
            crate::os::futex_wake(nic.poll_seq()).unwrap();
        }
        let woke = b.join().unwrap();
        let took = woke.saturating_duration_since(flushed);
        assert!(
            took < Duration::from_secs(2),
            "B slept {took:?} past the flush: A's sleep hid it from the NIC"
        );
    }

    #[test]
    fn a_nap_is_a_share_of_the_queued_work_within_bounds() {
        let us = Duration::from_micros;
        let (min, max) = (DEFAULT_NAP_MIN, MAX_SLEEP);
        // 64 KiB WRITEs: 128 queued, 16 µs each: 2 ms of work, a 512 µs nap.
        assert_eq!(nap_for(128, Some(us(16)), min, max), Some(us(512)));
        // 8 B WRITEs: 128 queued, 0.5 µs each: 16 µs, too short to nap.
        let half = Duration::from_nanos(500);
        assert_eq!(nap_for(128, Some(half), min, max), None);
        // A ping-pong: one outstanding, however slow the peer.
        assert_eq!(nap_for(1, Some(us(5000)), min, max), None);
        assert_eq!(
            nap_for(NAP_MIN_QUEUED, Some(us(100)), min, max),
            Some(us(100))
        );
        assert_eq!(nap_for(10_000, Some(us(16)), min, max), Some(max), "capped");
        assert_eq!(nap_for(10_000, None, min, max), None, "no measure: no nap");
        assert_eq!(nap_for(10_000, Some(us(16)), Duration::ZERO, max), None);
    }

    #[test]
    fn the_pace_follows_a_faster_sample_at_once_and_a_slower_one_slowly() {
        assert_eq!(pace(0, 16_000), 16_000, "the first sample");
        assert_eq!(pace(30_000, 500), 500, "faster: at once");
        assert_eq!(pace(800, 20_000), 1_000, "slower: a quarter more at most");
        assert_eq!(pace(800, 900), 900);
    }

    #[test]
    fn the_shortest_nap_comes_from_the_environment_value() {
        assert_eq!(nap_min_from(None), Some(DEFAULT_NAP_MIN));
        assert_eq!(nap_min_from(Some("off")), None);
        assert_eq!(nap_min_from(Some("250")), Some(Duration::from_micros(250)));
        assert_eq!(nap_min_from(Some("junk")), Some(DEFAULT_NAP_MIN));
    }

    /// A client page and the NIC's view of it, as in the test below.
    fn pages() -> (Doorbell, Doorbell) {
        use std::os::fd::AsFd;
        use std::sync::Arc;
        let len = crate::abi::DOORBELL_SEGMENT_LEN;
        let fd = crate::os::memfd("db", len).unwrap();
        let map = || Arc::new(crate::os::map_shared(fd.as_fd(), len).unwrap());
        (Doorbell::new(map()).unwrap(), Doorbell::new(map()).unwrap())
    }

    /// Polls idly for `run` with `queued` send WQEs posted while a "NIC" thread
    /// retires one every ~20 µs (keeping `queued` outstanding), the program also
    /// receiving messages if `receives`; returns the naps.
    fn naps_with(queued: u32, set: impl Fn(&ContextPoll), run: Duration, receives: bool) -> u64 {
        let (client, nic) = pages();
        let ctx = ContextPoll::from_env();
        set(&ctx);
        ctx.note_posted(queued);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let nic_thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_micros(20));
                    nic.note_sends_retired(1);
                }
            })
        };
        let idle = IdleState::default();
        let start = Instant::now();
        while start.elapsed() < run {
            // Re-post what the NIC retired, as a bandwidth test does.
            let retired = client.sends_retired();
            let outstanding = ctx.posted.load(Ordering::Relaxed).wrapping_sub(retired);
            ctx.note_posted(queued.saturating_sub(outstanding));
            ctx.note_found();
            if receives {
                ctx.note_received();
            }
            idle.note_found();
            for _ in 0..POLL_YIELD_EVERY {
                idle.after_empty(&ctx, &client);
            }
        }
        stop.store(true, Ordering::Relaxed);
        nic_thread.join().unwrap();
        ctx.naps()
    }

    #[test]
    fn a_poller_naps_only_while_much_work_is_queued() {
        let run = Duration::from_millis(100);
        let defaults = |_: &ContextPoll| {};
        // 128 queued at ≥ 20 µs each: ≥ 2.5 ms of work, naps of ≥ 640 µs.
        assert!(naps_with(128, defaults, run, false) > 0, "deep work: naps");
        assert_eq!(
            naps_with(2, defaults, run, false),
            0,
            "a ping-pong never naps"
        );
        let no_naps = |c: &ContextPoll| c.set_nap(None);
        assert_eq!(naps_with(128, no_naps, run, false), 0, "naps off");
        let never_sleep = |c: &ContextPoll| c.set(None, MAX_SLEEP);
        assert_eq!(
            naps_with(128, never_sleep, run, false),
            0,
            "sleep off: no naps"
        );
        assert_eq!(naps_with(128, defaults, run, true), 0, "receiving: no naps");
    }

    #[test]
    fn the_window_comes_from_the_environment_value() {
        assert_eq!(spin_window_from(None), Some(DEFAULT_SPIN_WINDOW));
        assert_eq!(spin_window_from(Some("off")), None);
        assert_eq!(spin_window_from(Some(" OFF ")), None);
        assert_eq!(
            spin_window_from(Some("20")),
            Some(Duration::from_micros(20))
        );
        assert_eq!(spin_window_from(Some("junk")), Some(DEFAULT_SPIN_WINDOW));
    }
}
