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
//! What, after each empty poll ([`IdleState::after_empty`]):
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
//!
//! A poll that finds completions makes no system call (it stores a counter), so a busy
//! data path stays syscall-free (`softnic/tests/nic_no_syscalls.rs`). The window (at
//! least 50 µs, and twice the recent gap between completions) is longer than an 8 B
//! round trip on a quiet 2-core host (≈ 20 µs, docs/perf.md, "Last table"), so a
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

/// The shortest spin window: how long a poller spins (and yields) after the last sign
/// of a completion before it sleeps, at least. 2.5× an 8 B round trip on a quiet
/// 2-core host (≈ 20 µs); [`spin_window`] lengthens it for slower paces.
pub const DEFAULT_SPIN_WINDOW: Duration = Duration::from_micros(50);

/// Longest single sleep: a poll loop that waits for something the NIC does not signal
/// (memory written by a peer, another descriptor) is delayed by at most this.
pub const MAX_SLEEP: Duration = Duration::from_millis(1);

/// The spin window [`POLL_SPIN_ENV`] asks for; `None` = never sleep.
pub fn spin_window_from(value: Option<&str>) -> Option<Duration> {
    match value.map(str::trim) {
        None => Some(DEFAULT_SPIN_WINDOW),
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        Some(v) => Some(
            v.parse()
                .map(Duration::from_micros)
                .unwrap_or(DEFAULT_SPIN_WINDOW),
        ),
    }
}

/// A context's share of hybrid polling: its spin window and whether any of its polls
/// found completions lately.
#[derive(Debug)]
pub(crate) struct ContextPoll {
    /// Bumped by every poll that finds completions (any CQ of the context).
    found: AtomicU32,
    /// The spin window in nanoseconds; [`NEVER`] = never sleep.
    window_ns: AtomicU64,
    /// The longest single sleep in nanoseconds.
    max_sleep_ns: AtomicU64,
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
        let p = ContextPoll {
            found: AtomicU32::new(0),
            window_ns: AtomicU64::new(NEVER),
            max_sleep_ns: AtomicU64::new(0),
            base: Instant::now(),
        };
        p.set(spin_window_from(v.as_deref()), MAX_SLEEP);
        p
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

    /// After a poll that found nothing: spin, yield or sleep (module docs). Returns
    /// whether it slept.
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
            std::thread::yield_now();
            return false;
        }
        let window = nanos(spin_window(
            Duration::from_nanos(window),
            Duration::from_nanos(gap),
        ));
        if now.saturating_sub(since) < window {
            std::thread::yield_now();
            return false;
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
