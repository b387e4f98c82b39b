//! Events taken and not yet acknowledged, per object, so that destroying a CQ, QP or
//! SRQ waits for them as rdma-core's does: its `ibv_destroy_cq` blocks until
//! `comp_events_completed` (counted by `ibv_ack_cq_events`) reaches the completion
//! events the kernel reported, and `ibv_destroy_qp` / `ibv_destroy_srq` until
//! `events_completed` (counted by `ibv_ack_async_event`) reaches the async events. A
//! program may take an object's event in one thread and tear the object down in
//! another; the object must stay until that thread acknowledged the event, and an event
//! must never name an object already freed.
//!
//! One [`Unacked`] per kind of event: completion events of all CQs share one (a
//! channel's epoll data names a CQ by address, whatever its context), and each
//! context's async events have their own. An object is entered ([`Unacked::open`])
//! when it is made; an event is counted ([`Unacked::take`]) before its object is
//! touched, and an object being destroyed ([`Unacked::retire`] marked it first)
//! refuses, so the taker never reads it. Counts are by address; an object's entry goes
//! when it is freed, so a later object at the same address starts afresh.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long [`Unacked::retire`] waits for the program to acknowledge an object's
/// events before it gives up (rdma-core waits without bound); the caller then leaves
/// the object allocated, so the late acknowledgement finds it.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(10);

/// An object that may have events out.
struct Entry {
    /// Not being destroyed: events of it may still be taken.
    live: bool,
    /// Events taken and not acknowledged.
    taken: u32,
}

/// Events taken and not acknowledged, by object address.
#[derive(Default)]
pub(crate) struct Unacked {
    objects: Mutex<BTreeMap<usize, Entry>>,
    /// Signalled when an object's last taken event is acknowledged.
    acked: Condvar,
}

impl Unacked {
    pub(crate) const fn new() -> Self {
        Unacked {
            objects: Mutex::new(BTreeMap::new()),
            acked: Condvar::new(),
        }
    }

    fn objects(&self) -> MutexGuard<'_, BTreeMap<usize, Entry>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object at `at` was made: its events may be taken.
    pub(crate) fn open(&self, at: usize) {
        self.objects().insert(
            at,
            Entry {
                live: true,
                taken: 0,
            },
        );
    }

    /// Counts one event of the object at `at` as taken: false (nothing counted) if it
    /// is not a live object — being destroyed, or gone.
    pub(crate) fn take(&self, at: usize) -> bool {
        match self.objects().get_mut(&at) {
            Some(e) if e.live => {
                e.taken += 1;
                true
            }
            _ => false,
        }
    }

    /// `n` events of the object at `at` acknowledged (at most as many as were taken).
    pub(crate) fn ack(&self, at: usize, n: u32) {
        let mut objects = self.objects();
        let Some(e) = objects.get_mut(&at) else {
            return;
        };
        e.taken = e.taken.saturating_sub(n);
        if e.taken == 0 {
            if !e.live {
                objects.remove(&at);
            }
            self.acked.notify_all();
        }
    }

    /// The object at `at` is being destroyed: no event of it is taken from now on, and
    /// this waits, at most [`ACK_WAIT`], until those taken are acknowledged. False if
    /// they were not: the caller must not free the object (the late acknowledgement
    /// will find it).
    pub(crate) fn retire(&self, at: usize) -> bool {
        let mut objects = self.objects();
        match objects.get_mut(&at) {
            Some(e) => e.live = false,
            None => return true,
        }
        let pending = |o: &mut BTreeMap<usize, Entry>| o.get(&at).is_some_and(|e| e.taken > 0);
        let (mut objects, _) = self
            .acked
            .wait_timeout_while(objects, ACK_WAIT, pending)
            .unwrap_or_else(|e| e.into_inner());
        if pending(&mut objects) {
            return false;
        }
        objects.remove(&at);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn retire_waits_for_the_acknowledgement_and_refuses_new_events() {
        let u = Arc::new(Unacked::new());
        u.open(8);
        assert!(u.take(8));
        let acker = {
            let u = Arc::clone(&u);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                // Marked by retire by now: no new event of it is counted.
                assert!(!u.take(8));
                u.ack(8, 1);
            })
        };
        let started = std::time::Instant::now();
        assert!(u.retire(8));
        assert!(started.elapsed() >= Duration::from_millis(100));
        acker.join().unwrap();
        // Gone: a new object at the address starts afresh.
        assert!(!u.take(8));
        u.open(8);
        assert!(u.take(8));
    }

    #[test]
    fn an_object_never_opened_or_with_nothing_out_retires_at_once() {
        let u = Unacked::new();
        assert!(!u.take(16));
        assert!(u.retire(16));
        u.open(16);
        assert!(u.take(16));
        u.ack(16, 5); // more than taken: saturates
        assert!(u.retire(16));
    }
}
