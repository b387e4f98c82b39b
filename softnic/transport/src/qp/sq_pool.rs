//! Send-queue buffers shared by the QPs of one thread, the most recently returned
//! first.
//!
//! Why: a requester queue holds each posted WQE until it completes ([`SqEntry`], 200
//! bytes), and it used to be each QP's own allocation of `max_send_wr` entries, made
//! when the QP was created. With many RC QPs busy in turn (perftest's `-q`, issue 12's
//! many-QP figure: 1,000 QPs, a burst of 16 WRITEs on each, 8 bursts in flight) a QP's
//! buffer is written once per burst and has left the caches by the QP's next turn, and
//! every idle QP keeps 3.2 KB (16 entries) of it. Now a queue that empties returns its
//! buffer here and a queue that gets a WQE takes one, so the few QPs in flight at a
//! time reuse the few buffers whose lines were touched last, and an idle QP holds none:
//! the NIC's private memory per QP went from 4.75 to 1.55 KB (`nic_bench qps_figures`,
//! docs/perf.md "Many QPs").
//!
//! The pool is per thread because a QP is only ever driven by the thread that owns it
//! (the NIC's loop; a test's), and a thread-local list needs no lock. It is bounded:
//! at most [`POOLED`] buffers, each of at most [`POOLED_ENTRIES`] entries (≤ 3.3 MB in
//! all); a queue with more room keeps its buffer when it empties, as every queue did
//! before, so a deep queue that drains after each message (a ping-pong on a QP of
//! 8,192 WQEs) never sends megabytes back to the allocator per message.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::requester::SqEntry;

/// Most buffers the pool keeps; the oldest goes back to the allocator first.
pub(super) const POOLED: usize = 64;

/// Largest queue (entries) whose buffer returns to the pool when it empties.
pub(super) const POOLED_ENTRIES: usize = 256;

thread_local! {
    static POOL: RefCell<Vec<VecDeque<SqEntry>>> = const { RefCell::new(Vec::new()) };
}

/// An empty queue with room for `cap` entries: the most recently returned buffer that
/// has the room, or a new one.
pub(super) fn take(cap: usize) -> VecDeque<SqEntry> {
    let reused = POOL.with_borrow_mut(|pool| {
        let i = pool.iter().rposition(|b| b.capacity() >= cap)?;
        Some(pool.remove(i))
    });
    reused.unwrap_or_else(|| VecDeque::with_capacity(cap))
}

/// Returns an emptied queue's buffer, if it is small enough to keep (else the caller
/// keeps it). True when it was taken.
pub(super) fn give(buf: &mut VecDeque<SqEntry>) -> bool {
    if !buf.is_empty() || buf.capacity() == 0 || buf.capacity() > POOLED_ENTRIES {
        return false;
    }
    let b = std::mem::take(buf);
    POOL.with_borrow_mut(|pool| {
        if pool.len() >= POOLED {
            pool.remove(0);
        }
        pool.push(b);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clear() {
        POOL.with_borrow_mut(Vec::clear);
    }

    fn addr(b: &VecDeque<SqEntry>) -> *const SqEntry {
        b.as_slices().0.as_ptr()
    }

    #[test]
    fn the_last_buffer_returned_is_the_first_taken() {
        clear();
        let (mut a, mut b) = (take(16), take(16));
        let (pa, pb) = (addr(&a), addr(&b));
        assert!(give(&mut a) && give(&mut b));
        assert_eq!(a.capacity(), 0, "the queue holds no buffer once given");
        assert_eq!(addr(&take(16)), pb, "most recent first");
        assert_eq!(addr(&take(16)), pa);
    }

    #[test]
    fn a_buffer_too_small_is_passed_over() {
        clear();
        let mut small = take(4);
        let ps = addr(&small);
        assert!(give(&mut small));
        let big = take(64);
        assert!(big.capacity() >= 64);
        assert_ne!(addr(&big), ps);
        assert_eq!(addr(&take(4)), ps, "still there for a queue it fits");
    }

    #[test]
    fn deep_queues_keep_their_buffer_and_the_pool_is_bounded() {
        clear();
        let mut deep = take(POOLED_ENTRIES + 1);
        assert!(!give(&mut deep), "a deep queue keeps its buffer");
        assert!(deep.capacity() > POOLED_ENTRIES);
        let mut bufs: Vec<_> = (0..POOLED + 5).map(|_| take(8)).collect();
        for b in &mut bufs {
            assert!(give(b));
        }
        assert_eq!(POOL.with_borrow(Vec::len), POOLED);
    }
}
