//! What the loop visits: the *active set* of QPs that may have something to do, and the
//! *deadlines* of QPs with a timer running. Everything else — an idle QP — costs the
//! loop nothing per iteration (issue 12: "cost of an idle QP is zero").
//!
//! **Active set.** A QP joins when something happens to it that can give it work: a
//! work request taken from its rings, a packet for it, a timer that fired, a control
//! request (`ModifyQp`). The loop visits the members to transmit and to deliver
//! completions, and a QP leaves when it has nothing left: nothing more to send this
//! iteration and no completion waiting for CQ room. Membership is a [`Ticket`] kept in
//! the QP's own entry, so marking costs no lookup; the list holds `(QPN, serial)` so an
//! item left behind by a destroyed QP (or one whose QPN was reused) is recognised as
//! stale and skipped, and a live QP is never listed twice.
//!
//! **Deadlines.** A binary heap of `(deadline, QPN)` with lazy invalidation, chosen over
//! a timer wheel because QP deadlines span five orders of magnitude (a 100 µs adaptive
//! RTO to IBTA timeouts of seconds and more), which a wheel covers only with several
//! levels and cascading, while a heap is exact and simple; and because the common
//! re-arm is *later* (the retransmission timer restarts on every ACK), which costs
//! nothing here: the earlier heap entry stays, fires early, and the loop re-arms from
//! `Qp::poll_timeout` then. Only an earlier deadline pushes. A QP whose timers all
//! stopped is disarmed. Entries whose deadline is no longer the armed one (disarmed or
//! re-armed earlier), or whose QP is gone, are dropped when they reach the top.
//! So timeouts and the next wake-up cost O(due · log n), not O(QPs).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use softnic_transport::time::Instant;

use super::memory::KeyMap;

/// A QP's membership of the [`ActiveSet`], kept in its entry.
#[derive(Debug)]
pub struct Ticket {
    /// Unique per QP lifetime (QPNs are reused, serials are not).
    serial: u64,
    /// Listed in the active set (exactly one live list item when true).
    queued: bool,
}

impl Ticket {
    /// The ticket of a new QP; `serial` must differ from every other QP's.
    pub fn new(serial: u64) -> Self {
        Ticket {
            serial,
            queued: false,
        }
    }

    /// Whether the QP is in the active set.
    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// Whether `item` is this QP's live list item.
    pub fn owns(&self, item: Item) -> bool {
        self.queued && self.serial == item.serial
    }
}

/// One entry of the active list: a QPN and the serial of the QP it was listed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// Queue pair number.
    pub qpn: u32,
    serial: u64,
}

/// The QPs the loop visits this iteration.
#[derive(Debug, Default)]
pub struct ActiveSet {
    list: Vec<Item>,
    spare: Vec<Item>,
}

impl ActiveSet {
    /// Adds the QP `qpn` holding `t`, unless it is listed already.
    pub fn mark(&mut self, qpn: u32, t: &mut Ticket) {
        if !t.queued {
            t.queued = true;
            self.list.push(Item {
                qpn,
                serial: t.serial,
            });
        }
    }

    /// The listed items (some may be stale: check with [`Ticket::owns`]).
    pub fn items(&self) -> &[Item] {
        &self.list
    }

    /// Number of list items (live and stale).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Empties the set for a visit: returns the items; the caller [`ActiveSet::claim`]s
    /// each, re-[`ActiveSet::mark`]s the QPs with work left, then gives the vector back with
    /// [`ActiveSet::recycle`] (no allocation per iteration).
    pub fn take(&mut self) -> Vec<Item> {
        let next = std::mem::take(&mut self.spare);
        std::mem::replace(&mut self.list, next)
    }

    /// Gives back the vector [`ActiveSet::take`] returned.
    pub fn recycle(&mut self, mut v: Vec<Item>) {
        v.clear();
        self.spare = v;
    }

    /// Claims `item` for a visit after [`ActiveSet::take`]: true (and the QP is no
    /// longer queued) when it is `t`'s live item; false for a stale one.
    pub fn claim(item: Item, t: &mut Ticket) -> bool {
        if t.owns(item) {
            t.queued = false;
            true
        } else {
            false
        }
    }
}

/// QP deadlines: a min-heap with lazy invalidation (see the module docs).
#[derive(Debug, Default)]
pub struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Per QP, the deadline of its live heap entry (at or before its real deadline).
    armed: KeyMap<Instant>,
}

impl Deadlines {
    /// Arms QP `qpn` for `at` (from `Qp::poll_timeout`). `None` disarms: the heap
    /// entry turns stale and is dropped when it reaches the top, without a visit to the
    /// QP. (Letting it fire instead cost a lookup of a cold QP per message burst with
    /// thousands of QPs: each burst's ACK stops the timer its post started.) A deadline
    /// later than the armed one does nothing: the armed entry fires early and the caller
    /// re-arms.
    pub fn arm(&mut self, qpn: u32, at: Option<Instant>) {
        let Some(at) = at else {
            self.armed.remove(&qpn);
            return;
        };
        if self.armed.get(&qpn).is_some_and(|&h| h <= at) {
            return;
        }
        self.armed.insert(qpn, at);
        self.heap.push(Reverse((at, qpn)));
    }

    /// Forgets QP `qpn` (destroyed): its heap entries become stale.
    pub fn remove(&mut self, qpn: u32) {
        self.armed.remove(&qpn);
    }

    /// The next QP whose armed deadline is at or before `now` (disarmed: the caller
    /// checks the QP's real deadline and re-arms).
    pub fn pop_due(&mut self, now: Instant) -> Option<u32> {
        while let Some(&Reverse((at, qpn))) = self.heap.peek() {
            if at > now {
                return None;
            }
            self.heap.pop();
            if self.armed.get(&qpn) == Some(&at) {
                self.armed.remove(&qpn);
                return Some(qpn);
            }
        }
        None
    }

    /// The earliest armed deadline (drops stale entries on top).
    pub fn earliest(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, qpn))) = self.heap.peek() {
            if self.armed.get(&qpn) == Some(&at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Heap entries (live and stale), for the memory figure.
    pub fn heap_len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    #[test]
    fn active_set_lists_each_qp_once_and_skips_stale_items() {
        let mut s = ActiveSet::default();
        let mut a = Ticket::new(1);
        let mut b = Ticket::new(2);
        s.mark(10, &mut a);
        s.mark(20, &mut b);
        s.mark(10, &mut a);
        assert_eq!(s.len(), 2, "marked twice, listed once");
        // QP 20 is destroyed and its QPN reused by a new QP (serial 3), marked too.
        let mut b2 = Ticket::new(3);
        s.mark(20, &mut b2);
        let items = s.take();
        assert!(s.is_empty());
        let mut visited = Vec::new();
        for &it in &items {
            let t = match it.qpn {
                10 => &mut a,
                _ => &mut b2,
            };
            if ActiveSet::claim(it, t) {
                visited.push((it.qpn, it.serial));
            }
        }
        assert_eq!(
            visited,
            vec![(10, 1), (20, 3)],
            "the old QP 20's item is stale"
        );
        assert!(!a.is_queued() && !b2.is_queued());
        // A QP with work left is marked again for the next iteration.
        s.mark(10, &mut a);
        s.recycle(items);
        assert_eq!(s.items().len(), 1);
        assert!(a.owns(s.items()[0]));
    }

    #[test]
    fn deadlines_pop_in_order_and_only_when_due() {
        let mut d = Deadlines::default();
        d.arm(1, Some(t(30)));
        d.arm(2, Some(t(10)));
        d.arm(3, Some(t(20)));
        d.arm(4, None);
        assert_eq!(d.earliest(), Some(t(10)));
        assert_eq!(d.pop_due(t(5)), None);
        assert_eq!(d.pop_due(t(25)), Some(2));
        assert_eq!(d.pop_due(t(25)), Some(3));
        assert_eq!(d.pop_due(t(25)), None);
        assert_eq!(d.earliest(), Some(t(30)));
        assert_eq!(d.pop_due(t(30)), Some(1));
        assert_eq!(d.earliest(), None);
    }

    #[test]
    fn rearm_earlier_pushes_and_later_keeps_the_early_entry() {
        let mut d = Deadlines::default();
        d.arm(1, Some(t(50)));
        // Earlier: a new entry; the 50 µs one is stale and never fires.
        d.arm(1, Some(t(20)));
        assert_eq!(d.heap_len(), 2);
        assert_eq!(d.earliest(), Some(t(20)));
        // Later: no push; the 20 µs entry fires early and the caller re-arms.
        d.arm(1, Some(t(80)));
        assert_eq!(d.heap_len(), 2);
        assert_eq!(d.pop_due(t(20)), Some(1));
        d.arm(1, Some(t(80)));
        assert_eq!(d.pop_due(t(60)), None, "the stale 50 µs entry is dropped");
        assert_eq!(d.heap_len(), 1);
        assert_eq!(d.earliest(), Some(t(80)));
        assert_eq!(d.pop_due(t(80)), Some(1));
    }

    #[test]
    fn disarmed_qp_never_fires() {
        let mut d = Deadlines::default();
        d.arm(1, Some(t(10)));
        d.arm(2, Some(t(20)));
        // QP 1's timers stopped (its ACK came): the loop passes poll_timeout's None.
        d.arm(1, None);
        assert_eq!(d.earliest(), Some(t(20)), "the stale entry is dropped");
        assert_eq!(d.pop_due(t(30)), Some(2));
        assert_eq!(d.pop_due(t(30)), None);
        // Armed again later: fires once, at the new deadline.
        d.arm(1, Some(t(40)));
        assert_eq!(d.pop_due(t(39)), None);
        assert_eq!(d.pop_due(t(40)), Some(1));
        assert_eq!(d.heap_len(), 0);
    }

    #[test]
    fn destroyed_qp_never_fires_and_a_reused_qpn_starts_fresh() {
        let mut d = Deadlines::default();
        d.arm(7, Some(t(10)));
        d.arm(8, Some(t(40)));
        d.remove(7);
        assert_eq!(d.earliest(), Some(t(40)), "stale top dropped");
        // QPN 7 reused with a later deadline than the dead entry had.
        d.arm(7, Some(t(30)));
        assert_eq!(d.pop_due(t(35)), Some(7));
        assert_eq!(d.pop_due(t(35)), None);
        assert_eq!(d.pop_due(t(45)), Some(8));
        assert_eq!(d.heap_len(), 0);
    }

    #[test]
    fn same_deadline_for_many_qps_fires_each_once() {
        let mut d = Deadlines::default();
        for q in 0..100 {
            d.arm(q, Some(t(5)));
            d.arm(q, Some(t(5)));
        }
        let mut fired: Vec<u32> = std::iter::from_fn(|| d.pop_due(t(5))).collect();
        fired.sort();
        assert_eq!(fired, (0..100).collect::<Vec<_>>());
    }
}
