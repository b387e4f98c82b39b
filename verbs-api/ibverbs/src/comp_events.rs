//! Completion events taken and not yet acknowledged, per CQ, so that `ibv_destroy_cq`
//! waits for them as rdma-core's does: its destroy blocks until
//! `comp_events_completed` (counted by `ibv_ack_cq_events`) reaches the events the
//! kernel reported. A program may take a CQ's event in one thread (`ibv_get_cq_event`)
//! and tear the CQ down in another; the CQ must stay until that thread acknowledged
//! the event, and an event must never name a CQ already freed.
//!
//! A CQ on a completion channel is entered at creation. `ibv_get_cq_event` counts an
//! event here ([`take`]) before it reads the CQ behind the channel's epoll data: a CQ
//! being destroyed refuses ([`retire`] marked it first), so the thread waits on and
//! never touches it. Counts are by address under one lock; a CQ's entry goes when it is
//! freed, so a later CQ at the same address starts afresh.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::async_event::ACK_WAIT;

/// A CQ on a completion channel.
struct Entry {
    /// Not being destroyed: events may still be taken.
    live: bool,
    /// Events taken and not acknowledged.
    taken: u32,
}

static CQS: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);
/// Signalled when a CQ's last taken event is acknowledged.
static ACKED: Condvar = Condvar::new();

fn cqs() -> MutexGuard<'static, Option<HashMap<usize, Entry>>> {
    CQS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CQ at `cq` was created on a completion channel.
pub(crate) fn open(cq: usize) {
    cqs().get_or_insert_with(HashMap::new).insert(
        cq,
        Entry {
            live: true,
            taken: 0,
        },
    );
}

/// Counts one event of the CQ at `cq` as taken: false (nothing counted) if it is not a
/// live CQ on a channel — being destroyed, or gone.
pub(crate) fn take(cq: usize) -> bool {
    let mut m = cqs();
    match m.as_mut().and_then(|m| m.get_mut(&cq)) {
        Some(e) if e.live => {
            e.taken += 1;
            true
        }
        _ => false,
    }
}

/// `n` events of the CQ at `cq` acknowledged (at most as many as were taken).
pub(crate) fn ack(cq: usize, n: u32) {
    let mut m = cqs();
    let Some(map) = m.as_mut() else { return };
    let Some(e) = map.get_mut(&cq) else { return };
    e.taken = e.taken.saturating_sub(n);
    if e.taken == 0 {
        if !e.live {
            map.remove(&cq);
        }
        ACKED.notify_all();
    }
}

/// The CQ at `cq` is being destroyed: no event of it is taken from now on, and this
/// waits, at most [`ACK_WAIT`], until those taken are acknowledged. False if they were
/// not: the caller must not free the CQ (the late acknowledgement will find it).
pub(crate) fn retire(cq: usize) -> bool {
    let mut m = cqs();
    match m.as_mut().and_then(|m| m.get_mut(&cq)) {
        Some(e) => e.live = false,
        None => return true,
    }
    let pending = |m: &mut Option<HashMap<usize, Entry>>| {
        m.as_ref()
            .and_then(|m| m.get(&cq))
            .is_some_and(|e| e.taken > 0)
    };
    let (mut m, _) = ACKED
        .wait_timeout_while(m, ACK_WAIT, pending)
        .unwrap_or_else(|e| e.into_inner());
    if pending(&mut m) {
        return false;
    }
    if let Some(map) = m.as_mut() {
        map.remove(&cq);
    }
    true
}
