//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event` and the
//! `async_fd` a program may `poll(2)`.
//!
//! The NIC lists a context's objects with events and hands the events out on a control
//! request (verbs-api [`Context::poll_async_events`]); when the list goes from empty to
//! not empty it writes a pipe ([`Context::async_event_channel`]). The events:
//! IBV_EVENT_COMM_EST (an RC/UC QP in RTR received its first packet),
//! IBV_EVENT_QP_REQ_ERR / IBV_EVENT_QP_ACCESS_ERR (the QP, as responder, failed a
//! request and entered ERR), IBV_EVENT_QP_FATAL (the NIC moved the QP to ERR: corrupt
//! ring, full CQ), IBV_EVENT_QP_LAST_WQE_REACHED (a QP on an SRQ entered ERR),
//! IBV_EVENT_SRQ_LIMIT_REACHED and IBV_EVENT_SRQ_ERR. IBV_EVENT_CQ_ERR is never raised:
//! a full CQ loses no completion (they wait in the NIC until the program polls) and is
//! reported on the QP as QP_FATAL. SQ_DRAINED and the path-migration and port events
//! are not raised either. Order: each object's events oldest first; across objects, in
//! the order the NIC noticed each object's first waiting event.
//!
//! Once a context has a QP or an SRQ, a watcher thread blocks in `poll(2)` on that pipe
//! and on its own stop eventfd. Woken by the pipe, it reads the pipe empty, then asks
//! (one control round trip), turns each event into a `struct ibv_async_event` (the
//! element is the program's `ibv_qp` / `ibv_srq` pointer) and counts it on `async_fd`,
//! a semaphore eventfd: one readable count per queued event, so `poll(2)` on it and
//! blocking or non-blocking `ibv_get_async_event` behave as on rdma-core. So an idle
//! context makes no control requests and costs the NIC nothing, and an event reaches
//! `async_fd` one wake-up and one round trip after the NIC notices it. A NIC that does
//! not offer the pipe (older than this library) is asked every [`POLL_INTERVAL`]
//! instead. The watcher ends when the NIC goes away (the pipe reads end of file, or the
//! request fails) or at `ibv_close_device`. A context with neither QP nor SRQ starts no
//! thread and its `async_fd` never becomes readable.
//!
//! Destroying a QP or an SRQ ([`Events::retire`]) drops its events not taken yet, and
//! waits until the program acknowledged those it took, as rdma-core's
//! `ibv_destroy_qp` / `ibv_destroy_srq` wait for `events_completed` to reach what the
//! kernel reported (the kernel drops the rest): no event names a freed object, and
//! `ibv_ack_async_event` in another thread never writes into one. The drop takes the
//! dropped events' counts off `async_fd` too, without blocking, so it polls readable
//! exactly while an event is queued; a count another thread's `ibv_get_async_event`
//! had already taken stays with it, and that call finds the queue shorter and waits on
//! for the next event (non-blocking: EAGAIN).

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verbs_api::{os, AsyncEvent, Context};

use crate::abi::*;
use crate::device::softnic_context;
use crate::errno;
use crate::unacked::Unacked;

/// How often the watcher asks a NIC that offers no readiness pipe (one control round
/// trip each time).
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

// enum ibv_event_type
const EVENT_QP_FATAL: c_int = 1;
const EVENT_QP_REQ_ERR: c_int = 2;
const EVENT_QP_ACCESS_ERR: c_int = 3;
const EVENT_COMM_EST: c_int = 4;
const EVENT_SQ_DRAINED: c_int = 5;
const EVENT_PATH_MIG: c_int = 6;
const EVENT_PATH_MIG_ERR: c_int = 7;
const EVENT_DEVICE_FATAL: c_int = 8;
const EVENT_SRQ_ERR: c_int = 14;
const EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// A context's event state, shared with its watcher thread.
#[derive(Default)]
pub struct Events {
    inner: Arc<Shared>,
    /// The watcher, the eventfd that stops it, and the process that started it.
    thread: Mutex<Option<(std::thread::JoinHandle<()>, OwnedFd, u32)>>,
}

#[derive(Default)]
struct Shared {
    /// NIC SRQ handle → the program's `ibv_srq` (as an address).
    srqs: Mutex<HashMap<u32, usize>>,
    /// QP number → the program's `ibv_qp`.
    qps: Mutex<HashMap<u32, usize>>,
    /// Events not yet taken by `ibv_get_async_event`: (element address, event type).
    /// Taken before `qps` / `srqs` where both are held.
    queue: Mutex<VecDeque<(usize, c_int)>>,
    /// Events taken and not acknowledged, by element (rdma-core's events reported
    /// minus `events_completed`); counted under `queue`'s lock as they are taken.
    unacked: Unacked,
}

impl Events {
    pub(crate) fn register_srq(&self, handle: u32, srq: usize) {
        self.inner.unacked.open(srq);
        lock(&self.inner.srqs).insert(handle, srq);
    }

    /// The SRQ of NIC handle `srq_handle` (at `srq`) is being destroyed: [`Self::retire`].
    pub(crate) fn forget(&self, srq_handle: u32, srq: usize, async_fd: &OwnedFd) -> bool {
        self.retire(srq, async_fd, || {
            lock(&self.inner.srqs).remove(&srq_handle);
        })
    }

    pub(crate) fn register_qp(&self, qpn: u32, qp: usize) {
        self.inner.unacked.open(qp);
        lock(&self.inner.qps).insert(qpn, qp);
    }

    /// The QP numbered `qpn` (at `qp`) is being destroyed: [`Self::retire`].
    pub(crate) fn forget_qp(&self, qpn: u32, qp: usize, async_fd: &OwnedFd) -> bool {
        self.retire(qp, async_fd, || {
            lock(&self.inner.qps).remove(&qpn);
        })
    }

    /// An object (at `element`) is being destroyed: `unmap` takes it out of the map
    /// events are resolved through, its events not taken yet are dropped (both under
    /// the queue's lock, which `deliver` holds from resolving an event to queueing
    /// it), then this waits ([`Unacked::retire`]) until the events of it the program
    /// took are acknowledged. False if they were not: the caller must not free it.
    fn retire(&self, element: usize, async_fd: &OwnedFd, unmap: impl FnOnce()) -> bool {
        let s = &self.inner;
        {
            let mut q = lock(&s.queue);
            unmap();
            let before = q.len();
            q.retain(|&(e, _)| e != element);
            // Their counts too, so that `async_fd` polls readable exactly while an
            // event is queued. Never blocking (the watcher needs this lock): a count a
            // reader already took is left to it, and it finds the queue shorter and
            // waits for the next event.
            for _ in q.len()..before {
                if !matches!(os::eventfd_take_nowait(async_fd.as_fd()), Ok(true)) {
                    break;
                }
            }
        }
        s.unacked.retire(element)
    }

    /// Starts the watcher thread if it is not running. On failure (no thread, no fd)
    /// events are simply not delivered; the verbs that called this still succeed.
    pub(crate) fn start(&self, api: &Context, async_fd: &OwnedFd) {
        let mut t = lock(&self.thread);
        if t.is_some() {
            return;
        }
        let (Ok(fd), Ok(stop)) = (async_fd.try_clone(), os::eventfd()) else {
            return;
        };
        let Ok(stop_rx) = stop.try_clone() else {
            return;
        };
        let (api, shared) = (api.clone(), self.inner.clone());
        // Its signals are the program's (`os::spawn_without_signals`).
        *t =
            os::spawn_without_signals("softnic-async", move || watch(&api, &fd, &shared, &stop_rx))
                .ok()
                .map(|h| (h, stop, std::process::id()));
    }

    /// Stops and joins the watcher (at `ibv_close_device`). In a child of `fork(2)`
    /// there is no watcher (threads do not survive a fork) and the stop eventfd is
    /// shared with the parent's: it is left alone, so the parent's watcher keeps
    /// running.
    pub(crate) fn stop(&self) {
        if let Some((t, stop, pid)) = lock(&self.thread).take() {
            if pid == std::process::id() {
                let _ = os::eventfd_signal(stop.as_fd());
                let _ = t.join();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watcher: waits for the NIC's pipe (or [`POLL_INTERVAL`] without one), asks, and
/// queues what it gets until `stop` is signalled or the NIC is gone; then it queues
/// `IBV_EVENT_DEVICE_FATAL`, as a kernel device raises on removal (rxe's `rdma link
/// delete`, a hardware RNIC's catastrophic error), so that a program blocked in
/// `ibv_get_async_event` learns that its device is gone.
fn watch(api: &Context, fd: &OwnedFd, s: &Shared, stop: &OwnedFd) {
    if run_watch(api, fd, s, stop) == Ended::NicGone {
        lock(&s.queue).push_back((0, EVENT_DEVICE_FATAL));
        let _ = os::eventfd_signal(fd.as_fd());
    }
}

/// Why [`run_watch`] returned.
#[derive(PartialEq)]
enum Ended {
    /// `ibv_close_device` (or a failed wait): no event.
    Stopped,
    /// The NIC closed its pipe or stopped answering.
    NicGone,
}

fn run_watch(api: &Context, fd: &OwnedFd, s: &Shared, stop: &OwnedFd) -> Ended {
    let ready = api.async_event_channel().ok();
    loop {
        let stopped = match &ready {
            Some(r) => os::wait_any_readable([stop.as_fd(), r.as_fd()], None).map(|[s, _]| s),
            None => os::wait_readable(stop.as_fd(), Some(POLL_INTERVAL)),
        };
        if stopped.unwrap_or(true) {
            return Ended::Stopped; // stopped, or poll(2) failed
        }
        // Empty the pipe before asking: an event the NIC notices after the answer
        // writes it again. End of file: the NIC is gone.
        if let Some(r) = &ready {
            if !matches!(os::pipe_drain(r.as_fd()), Ok(true)) {
                return Ended::NicGone;
            }
        }
        let events = match api.poll_async_events() {
            Ok(events) => events,
            // The control connection broke: the NIC died or closed it.
            Err(verbs_api::Error::Control(_) | verbs_api::Error::Io { .. }) => {
                return Ended::NicGone;
            }
            // A refusal or a garbled answer from a NIC still there: stop asking.
            Err(_) => return Ended::Stopped,
        };
        deliver(events, fd, s);
    }
}

/// Queues `events` for `ibv_get_async_event`, one count on `async_fd` each.
fn deliver(events: Vec<AsyncEvent>, fd: &OwnedFd, s: &Shared) {
    let qp = |qpn: u32| lock(&s.qps).get(&qpn).copied();
    // Held from resolving each event's object to queueing it: `Events::retire` cannot
    // slip between (its object would be named by an event queued after its drop).
    let mut queue = lock(&s.queue);
    for e in events {
        let (element, kind) = match e {
            AsyncEvent::SrqLimitReached { srq } => {
                (lock(&s.srqs).get(&srq).copied(), EVENT_SRQ_LIMIT_REACHED)
            }
            AsyncEvent::SrqErr { srq } => (lock(&s.srqs).get(&srq).copied(), EVENT_SRQ_ERR),
            AsyncEvent::QpLastWqeReached { qpn } => (qp(qpn), EVENT_QP_LAST_WQE_REACHED),
            AsyncEvent::CommEst { qpn } => (qp(qpn), EVENT_COMM_EST),
            AsyncEvent::QpReqErr { qpn } => (qp(qpn), EVENT_QP_REQ_ERR),
            AsyncEvent::QpAccessErr { qpn } => (qp(qpn), EVENT_QP_ACCESS_ERR),
            AsyncEvent::QpFatal { qpn } => (qp(qpn), EVENT_QP_FATAL),
        };
        let Some(element) = element else { continue };
        queue.push_back((element, kind));
        let _ = os::eventfd_signal(fd.as_fd());
    }
}

/// `ibv_get_async_event`: waits on `async_fd` as rdma-core does — blocking, or -1 with
/// `errno` EAGAIN when the program made the fd non-blocking — then fills `event`.
///
/// # Safety
/// `context` came from `ibv_open_device`; `event` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if context.is_null() || event.is_null() {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    let s = &ctx.events.inner;
    let (element, kind) = loop {
        let mut buf = [0u8; 8];
        // A plain read, as rdma-core's: the kernel restarts it after a signal whose
        // handler has SA_RESTART, and EINTR (like EAGAIN on a non-blocking fd) goes to
        // the program.
        // SAFETY: reads at most 8 bytes into buf.
        let r = unsafe { libc::read(ctx.async_fd().as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if r < 0 {
            return -1; // errno from read
        }
        // One count per queued event, and more while a destroyed object's dropped
        // events leave theirs (`Events::retire`): then wait for the next.
        let mut q = lock(&s.queue);
        if let Some((element, kind)) = q.pop_front() {
            // Live: `retire` drops an element's queued events (under this lock)
            // before it marks the element.
            s.unacked.take(element);
            break (element, kind);
        }
    };
    // SAFETY: writable (caller contract).
    unsafe {
        event.write(ibv_async_event {
            element: element as *mut _,
            event_type: kind,
        })
    };
    0
}

/// `ibv_ack_async_event`: counts the event on its object (`events_completed`, under the
/// object's mutex, signalling its condvar), as rdma-core does, and releases the wait of
/// the object's destroy ([`Events::retire`]).
///
/// # Safety
/// `event` came from [`ibv_get_async_event`] and its object is live.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: caller contract.
    let e = unsafe { *event };
    let (mutex, cond, count, context) = match e.event_type {
        EVENT_SRQ_ERR | EVENT_SRQ_LIMIT_REACHED => {
            let s = e.element as *mut ibv_srq;
            // SAFETY: a live SRQ (caller contract).
            unsafe {
                (
                    std::ptr::addr_of_mut!((*s).mutex),
                    std::ptr::addr_of_mut!((*s).cond),
                    std::ptr::addr_of_mut!((*s).events_completed),
                    (*s).context,
                )
            }
        }
        EVENT_QP_FATAL
        | EVENT_QP_REQ_ERR
        | EVENT_QP_ACCESS_ERR
        | EVENT_COMM_EST
        | EVENT_SQ_DRAINED
        | EVENT_PATH_MIG
        | EVENT_PATH_MIG_ERR
        | EVENT_QP_LAST_WQE_REACHED => {
            let q = e.element as *mut ibv_qp;
            // SAFETY: a live QP (caller contract).
            unsafe {
                (
                    std::ptr::addr_of_mut!((*q).mutex),
                    std::ptr::addr_of_mut!((*q).cond),
                    std::ptr::addr_of_mut!((*q).events_completed),
                    (*q).context,
                )
            }
        }
        _ => return,
    };
    // SAFETY: the object's initialised mutex and condvar; the count is guarded by it.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        *count += 1;
        libc::pthread_cond_signal(cond);
        libc::pthread_mutex_unlock(mutex);
    }
    // The object is freed only once this count is down (`Events::retire`), so its
    // fields above were written first.
    // SAFETY: the object's context outlives it.
    let ctx = unsafe { softnic_context(context) };
    let s = &ctx.events.inner;
    s.unacked.ack(e.element as usize, 1);
}
