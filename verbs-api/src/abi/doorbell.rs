//! The doorbell page: how a client tells the NIC *which* of its rings has new entries,
//! without a syscall, so that the NIC reads the rings that were posted to and never
//! walks the idle ones (issue 12: the cost of an idle QP is zero).
//!
//! One page per client connection, in a client-created memfd passed with OpenDevice
//! (mapped by the NIC with [`crate::os::map_peer_shm`], like every other segment):
//!
//! ```text
//!  offset    0  flags    u32 (own cache line)  NEED_WAKEUP: set and cleared by the NIC
//!  offset   64  summary  8 × u64 (one line)    bit i: bitmap word i has a bit set
//!  offset  128  words  512 × u64               bit j of word i: slot 64·i + j was rung
//!  offset 4224  poll     seq u32, sleeping u32, sends_retired u32 (own cache line):
//!                          hybrid CQ polling
//! ```
//!
//! Every QP and SRQ of the client has a slot (0 … [`DOORBELL_SLOTS`] − 1), chosen by the
//! NIC and returned by CreateQp / CreateSrq. One slot serves both rings of a QP.
//!
//! Client, after publishing a ring ([`Doorbell::ring`]):
//! 1. `words[i].fetch_or(bit, Release)`; if the word was zero before,
//!    `summary[i / 64].fetch_or(1 << i % 64, Release)` (whoever turns a word from zero to
//!    non-zero announces it, so a busy word costs one atomic per post);
//! 2. `fence(SeqCst)`, then `flags.load(Relaxed)`: if NEED_WAKEUP is set, write(2) the
//!    wake pipe (io_uring SQPOLL's protocol, now per client instead of per ring).
//!
//! NIC, each loop iteration, per client: `summary[k].swap(0, Acquire)` for each k whose
//! `load(Relaxed)` is non-zero (an idle word costs a shared read, no locked op), then
//! `words[i].swap(0, Acquire)` for each summary bit, then drains the slots' rings. The
//! Acquire swap of the word reads the client's Release `fetch_or`, which came after the
//! ring's producer store, so the entries are visible. The NIC clears a word only after
//! taking its summary bit, so a bit set after the summary swap is announced again by
//! its poster (the word was zero) or stays set for the next round.
//!
//! NIC going to sleep: `flags.fetch_or(NEED_WAKEUP, SeqCst)`, `fence(SeqCst)`, then
//! re-read every summary word; any non-zero means work (do not sleep). Dekker as for the
//! rings (see [`crate::abi`]): the client stores bits then loads the flag, the NIC
//! stores the flag then loads the bits; one of them sees the other.
//!
//! Hybrid polling (the `poll` line; the other direction, NIC → client): `seq` counts
//! the NIC's CQ flushes for this client (any CQ), `sleeping` says a poller of this
//! client is about to sleep on `seq` (a futex word; `crate::poll_idle` is the client).
//! io_uring's NEED_WAKEUP in reverse, Dekker again:
//! * NIC, flushing a CQ ([`Doorbell::note_completions`]): publish the CQ's producer
//!   index, `seq.store(seq + 1, Release)`, `fence(SeqCst)` (the one the CQ_ARMED check
//!   needs anyway), `sleeping.load(Relaxed)`; only if set, `swap(0)` and, if this call
//!   cleared it, `futex_wake(seq)` ([`Doorbell::take_sleeper`]).
//! * Client, after a spin window with `seq` unchanged at `e`: `sleeping.store(1)`,
//!   `fence(SeqCst)`, re-load `seq`; if it is still `e`, `futex_wait(seq, e, ≤ 1 ms)`
//!   (the kernel re-checks `seq == e` atomically with queueing the waiter). Either
//!   the client sees the new `seq` or the NIC sees `sleeping`; a flush between the
//!   re-load and the wait makes the wait return at once. Only the NIC clears
//!   `sleeping` (and then wakes every waiter): a client that cleared it after its own
//!   sleep could hide another thread sleeping on the same page, which would then miss
//!   its wake-up for a whole timeout. A sleep that ended by its timeout thus costs the
//!   NIC's next flush one `futex_wake` that wakes nobody.
//!
//! `sends_retired` counts the send WQEs whose ring slots the NIC has given back to this
//! client (any QP: each advance of an SQ ring's consumer index adds its step; NIC
//! writes, wrapping). With its own count of posted send WQEs the client knows how much
//! work is queued ahead of the NIC in O(1) however many QPs it has, and how fast the
//! NIC gets through it: a poller with deep queued work naps (`crate::poll_idle`). The
//! NIC never reads it back.
//!
//! A client that sets `sleeping` and never sleeps costs the NIC one `futex_wake` per
//! flush of its own CQs (counted: `poller_wakes`); one that writes `seq` only confuses
//! its own pollers, whose sleeps are bounded by their timeout.
//!
//! Trust: the page is the client's memory. The NIC never takes an address, length or
//! count from it: a bit names a slot index that the NIC looks up in its own table of
//! the client's rings; a bit for a slot that is not one of them is ignored and counted,
//! and the work per client per iteration is bounded whatever the bits say.

use core::ptr::NonNull;
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;

use super::layout::{LayoutError, SEGMENT_ALIGN};
use super::ring::CachePadded;
use super::NEED_WAKEUP;

/// Words in the slot bitmap.
pub const DOORBELL_WORDS: usize = 512;

/// Words in the summary (one bit per bitmap word; one cache line).
pub const SUMMARY_WORDS: usize = DOORBELL_WORDS / 64;

/// Slots per client: rings (QPs and SRQs) one client can have.
pub const DOORBELL_SLOTS: u32 = (DOORBELL_WORDS * 64) as u32;

/// The shared page.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct DoorbellPage {
    /// [`NEED_WAKEUP`] (NIC writes; clients read).
    pub flags: CachePadded<AtomicU32>,
    /// Bit i of the summary: `words[i]` may be non-zero.
    pub summary: [AtomicU64; SUMMARY_WORDS],
    /// One bit per slot.
    pub words: [AtomicU64; DOORBELL_WORDS],
    /// Hybrid polling: completion sequence and sleeping poller (module docs).
    pub poll: CachePadded<PollLine>,
}

/// The doorbell page's hybrid-polling line (see the module docs).
#[repr(C)]
#[derive(Debug, Default)]
pub struct PollLine {
    /// CQ flushes of this client so far (NIC writes, wrapping); the futex word.
    pub seq: AtomicU32,
    /// Non-zero: a poller may sleep on `seq` (client sets, NIC clears).
    pub sleeping: AtomicU32,
    /// Send WQEs the NIC has retired for this client so far (NIC writes, wrapping).
    pub sends_retired: AtomicU32,
}

/// Bytes of [`DoorbellPage`].
pub const DOORBELL_PAGE_SIZE: usize = core::mem::size_of::<DoorbellPage>();
const _: () = assert!(DOORBELL_PAGE_SIZE == 64 + 64 + DOORBELL_WORDS * 8 + 64);
const _: () = assert!(core::mem::offset_of!(DoorbellPage, summary) == 64);
const _: () = assert!(core::mem::offset_of!(DoorbellPage, words) == 128);
const _: () = assert!(core::mem::offset_of!(DoorbellPage, poll) == 4224);
const _: () = assert!(core::mem::offset_of!(PollLine, sleeping) == 4);
const _: () = assert!(core::mem::offset_of!(PollLine, sends_retired) == 8);

/// Length of the doorbell memfd (the page rounded up to [`SEGMENT_ALIGN`]).
pub const DOORBELL_SEGMENT_LEN: usize = DOORBELL_PAGE_SIZE.div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN;

/// A view of the doorbell page at offset 0 of a mapping. Holds the mapping alive;
/// clones share it (the NIC's CQs hold one each, for [`Doorbell::note_completions`]).
#[derive(Debug, Clone)]
pub struct Doorbell {
    _map: Arc<MmapRaw>,
    page: NonNull<DoorbellPage>,
}

// SAFETY: the page is only touched through atomics; the mapping is owned by an `Arc`.
// Any number of threads of either process may use it at once.
unsafe impl Send for Doorbell {}
// SAFETY: as above: `&Doorbell` only performs atomic operations.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// A view of the page at the start of `map`: checks that the mapping is large
    /// enough and 64-byte aligned. A fresh memfd is all zeros, which is the initial state.
    pub fn new(map: Arc<MmapRaw>) -> Result<Self, LayoutError> {
        if map.len() < DOORBELL_PAGE_SIZE {
            return Err(LayoutError::OutsideMapping {
                end: DOORBELL_PAGE_SIZE,
                mapping_len: map.len(),
            });
        }
        let base = map.as_mut_ptr();
        if !(base as usize).is_multiple_of(64) {
            return Err(LayoutError::Misaligned {
                offset: base as usize,
            });
        }
        let page = NonNull::new(base.cast::<DoorbellPage>())
            .ok_or(LayoutError::Misaligned { offset: 0 })?;
        Ok(Doorbell { _map: map, page })
    }

    pub(crate) fn page(&self) -> &DoorbellPage {
        // SAFETY: `page` points at the start of the live mapping (kept alive by `_map`),
        // which is at least DOORBELL_PAGE_SIZE bytes and 64-byte aligned (checked in
        // `new`); DoorbellPage consists of atomics only, which may be shared with
        // another process writing them concurrently.
        unsafe { self.page.as_ref() }
    }

    /// Client: announces new entries in the rings of `slot`, after their producer
    /// index was published. Returns true when the NIC sleeps (NEED_WAKEUP): the caller
    /// must write the wake pipe. A slot out of range is ignored (the NIC never hands
    /// one out).
    pub fn ring(&self, slot: u32) -> bool {
        let p = self.page();
        let i = (slot / 64) as usize;
        if let Some(word) = p.words.get(i) {
            let bit = 1u64 << (slot % 64);
            if word.fetch_or(bit, Ordering::Release) == 0 {
                p.summary[i / 64].fetch_or(1u64 << (i % 64), Ordering::Release);
            }
        }
        fence(Ordering::SeqCst);
        p.flags.0.load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }

    /// NIC: takes summary word `k` (all bits cleared). A word read as zero is left
    /// alone: the NIC polls every word on every loop iteration, and a locked swap of a
    /// line the client writes, made whether or not a bit is set, took ≈ 2 % of a 64 KiB
    /// WRITE receiver's samples (issue 12). A bit set just after the load is taken on
    /// the next iteration; before sleeping the NIC re-reads every word after its fence
    /// (module docs), so no ring is missed.
    pub fn take_summary(&self, k: usize) -> u64 {
        self.page().summary.get(k).map_or(0, |s| {
            if s.load(Ordering::Relaxed) == 0 {
                0
            } else {
                s.swap(0, Ordering::Acquire)
            }
        })
    }

    /// NIC: puts summary bits back (words it did not get to this round).
    pub fn restore_summary(&self, k: usize, bits: u64) {
        if let Some(s) = self.page().summary.get(k) {
            s.fetch_or(bits, Ordering::Release);
        }
    }

    /// NIC: takes bitmap word `i` (all bits cleared).
    pub fn take_word(&self, i: usize) -> u64 {
        self.page()
            .words
            .get(i)
            .map_or(0, |w| w.swap(0, Ordering::Acquire))
    }

    /// NIC, before sleeping: sets NEED_WAKEUP. Follow with `fence(SeqCst)` and
    /// [`Doorbell::pending`] (see the module docs).
    pub fn set_need_wakeup(&self) {
        self.page().flags.0.fetch_or(NEED_WAKEUP, Ordering::SeqCst);
    }

    /// NIC, polling again: clears NEED_WAKEUP.
    pub fn clear_need_wakeup(&self) {
        self.page()
            .flags
            .0
            .fetch_and(!NEED_WAKEUP, Ordering::SeqCst);
    }

    /// Whether any summary bit is set (the NIC's pre-sleep re-check).
    pub fn pending(&self) -> bool {
        self.page()
            .summary
            .iter()
            .any(|s| s.load(Ordering::Acquire) != 0)
    }

    /// Client: whether NEED_WAKEUP is set (for tests and tools).
    pub fn need_wakeup(&self) -> bool {
        self.page().flags.0.load(Ordering::Acquire) & NEED_WAKEUP != 0
    }

    /// The futex word of hybrid polling: the client's completion sequence.
    pub fn poll_seq(&self) -> &AtomicU32 {
        &self.page().poll.0.seq
    }

    /// NIC, after publishing a CQ of this client and before the `fence(SeqCst)` that
    /// precedes [`Doorbell::take_sleeper`]: bumps the completion sequence. A plain
    /// load and store: the NIC is its only honest writer.
    pub fn note_completions(&self) {
        let seq = self.poll_seq();
        seq.store(
            seq.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
    }

    /// NIC, after the fence: whether a poller sleeps (or is about to), clearing the
    /// flag; true means `futex_wake` the sequence word. One load when nobody sleeps.
    pub fn take_sleeper(&self) -> bool {
        let s = &self.page().poll.0.sleeping;
        s.load(Ordering::Relaxed) != 0 && s.swap(0, Ordering::SeqCst) != 0
    }

    /// Send WQEs the NIC has retired for this client (module docs; wrapping).
    pub fn sends_retired(&self) -> u32 {
        self.page().poll.0.sends_retired.load(Ordering::Acquire)
    }

    /// NIC: `n` more send WQEs of this client retired (their SQ slots were given
    /// back). A plain load and store, as [`Doorbell::note_completions`].
    pub fn note_sends_retired(&self, n: u32) {
        let r = &self.page().poll.0.sends_retired;
        r.store(r.load(Ordering::Relaxed).wrapping_add(n), Ordering::Release);
    }

    /// Client, before sleeping on the sequence word: announces the sleeper, fences,
    /// and returns whether the sequence is still `seen` (then sleep; otherwise a
    /// completion came: poll). The client never clears the flag (module docs).
    pub fn set_sleeper(&self, seen: u32) -> bool {
        self.page().poll.0.sleeping.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.poll_seq().load(Ordering::Acquire) == seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pair() -> (Doorbell, Doorbell) {
        let fd = crate::os::memfd("db", DOORBELL_SEGMENT_LEN).unwrap();
        let a = crate::os::map_shared(fd.as_fd(), DOORBELL_SEGMENT_LEN).unwrap();
        let b = crate::os::map_shared(fd.as_fd(), DOORBELL_SEGMENT_LEN).unwrap();
        (
            Doorbell::new(Arc::new(a)).unwrap(),
            Doorbell::new(Arc::new(b)).unwrap(),
        )
    }

    #[test]
    fn a_rung_slot_shows_in_its_word_and_summary() {
        let (client, nic) = pair();
        assert!(!nic.pending());
        assert!(!client.ring(5));
        assert!(!client.ring(64 * 70 + 3));
        assert!(!client.ring(DOORBELL_SLOTS - 1));
        assert!(!client.ring(DOORBELL_SLOTS), "out of range: ignored");
        assert!(nic.pending());
        assert_eq!(nic.take_summary(0), 1);
        assert_eq!(
            nic.take_summary(1),
            1 << 6,
            "word 70 is summary word 1, bit 6"
        );
        assert_eq!(nic.take_summary(SUMMARY_WORDS - 1), 1 << 63);
        assert_eq!(nic.take_word(0), 1 << 5);
        assert_eq!(nic.take_word(70), 1 << 3);
        assert_eq!(nic.take_word(DOORBELL_WORDS - 1), 1 << 63);
        assert!(!nic.pending());
    }

    #[test]
    fn a_busy_word_is_announced_once_until_the_nic_takes_it() {
        let (client, nic) = pair();
        client.ring(1);
        assert_eq!(nic.take_summary(0), 1);
        // The word still holds slot 1: slot 2's poster sees it non-zero and does not
        // announce again; the NIC finds both when it takes the word.
        client.ring(2);
        assert_eq!(nic.take_summary(0), 0);
        assert_eq!(nic.take_word(0), 0b110);
        // Taken: the next poster announces again.
        client.ring(2);
        assert_eq!(nic.take_summary(0), 1);
    }

    #[test]
    fn a_flush_wakes_only_a_sleeper_and_once() {
        let (client, nic) = pair();
        let e = client.poll_seq().load(Ordering::Acquire);
        nic.note_completions();
        fence(Ordering::SeqCst);
        assert!(!nic.take_sleeper(), "nobody sleeps: no wake");
        assert!(!client.set_sleeper(e), "the sequence moved: do not sleep");
        let e = client.poll_seq().load(Ordering::Acquire);
        assert!(client.set_sleeper(e), "nothing new: sleep");
        nic.note_completions();
        fence(Ordering::SeqCst);
        assert!(nic.take_sleeper(), "a sleeper: wake it");
        assert!(!nic.take_sleeper(), "one wake per sleep");
    }

    #[test]
    fn need_wakeup_is_seen_by_the_poster() {
        let (client, nic) = pair();
        nic.set_need_wakeup();
        assert!(client.need_wakeup());
        assert!(client.ring(9), "the NIC sleeps: wake it");
        nic.clear_need_wakeup();
        assert!(!client.ring(9));
        nic.restore_summary(0, 1 << 7);
        assert_eq!(nic.take_summary(0), 1 | 1 << 7);
    }
}
