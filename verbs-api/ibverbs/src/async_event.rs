//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event` and the
//! `async_fd` a program may `poll(2)`.
//!
//! The NIC queues a context's events and hands them out on a control request
//! (verbs-api [`Context::poll_async_events`]); it does not signal them. The events:
//! IBV_EVENT_COMM_EST (an RC/UC QP in RTR received its first packet),
//! IBV_EVENT_QP_REQ_ERR / IBV_EVENT_QP_ACCESS_ERR (the QP, as responder, failed a
//! request and entered ERR), IBV_EVENT_QP_FATAL (the NIC moved the QP to ERR: corrupt
//! ring, full CQ), IBV_EVENT_QP_LAST_WQE_REACHED (a QP on an SRQ entered ERR),
//! IBV_EVENT_SRQ_LIMIT_REACHED and IBV_EVENT_SRQ_ERR. IBV_EVENT_CQ_ERR is never raised:
//! a full CQ loses no completion (they wait in the NIC until the program polls) and is
//! reported on the QP as QP_FATAL. SQ_DRAINED and the path-migration and port events
//! are not raised either.
//!
//! Once a context has a QP or an SRQ, a watcher thread asks every [`POLL_INTERVAL`],
//! turns each event into a `struct ibv_async_event` (the element is the program's
//! `ibv_qp` / `ibv_srq` pointer) and counts it on `async_fd`, a semaphore eventfd: one
//! readable count per queued event, so `poll(2)` on it and blocking or non-blocking
//! `ibv_get_async_event` behave as on rdma-core. A context with neither starts no
//! thread and its `async_fd` never becomes readable. Events about an object the
//! program already destroyed are dropped.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verbs_api::{AsyncEvent, Context};

use crate::abi::*;
use crate::device::softnic_context;
use crate::errno;

/// How often the watcher asks the NIC for events (one control round trip).
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

// enum ibv_event_type
const EVENT_QP_FATAL: c_int = 1;
const EVENT_QP_REQ_ERR: c_int = 2;
const EVENT_QP_ACCESS_ERR: c_int = 3;
const EVENT_COMM_EST: c_int = 4;
const EVENT_SQ_DRAINED: c_int = 5;
const EVENT_PATH_MIG: c_int = 6;
const EVENT_PATH_MIG_ERR: c_int = 7;
const EVENT_SRQ_ERR: c_int = 14;
const EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// A context's event state, shared with its watcher thread.
#[derive(Default)]
pub struct Events {
    inner: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    /// NIC SRQ handle → the program's `ibv_srq` (as an address).
    srqs: Mutex<HashMap<u32, usize>>,
    /// QP number → the program's `ibv_qp`.
    qps: Mutex<HashMap<u32, usize>>,
    /// Events not yet taken by `ibv_get_async_event`: (element address, event type).
    queue: Mutex<VecDeque<(usize, c_int)>>,
    stop: AtomicBool,
}

impl Events {
    pub(crate) fn register_srq(&self, handle: u32, srq: usize) {
        lock(&self.inner.srqs).insert(handle, srq);
    }

    pub(crate) fn forget(&self, srq_handle: u32) {
        lock(&self.inner.srqs).remove(&srq_handle);
    }

    pub(crate) fn register_qp(&self, qpn: u32, qp: usize) {
        lock(&self.inner.qps).insert(qpn, qp);
    }

    pub(crate) fn forget_qp(&self, qpn: u32) {
        lock(&self.inner.qps).remove(&qpn);
    }

    /// Starts the watcher thread if it is not running. On failure (no thread, no fd)
    /// events are simply not delivered; the verbs that called this still succeed.
    pub(crate) fn start(&self, api: &Context, async_fd: &OwnedFd) {
        let mut t = lock(&self.thread);
        if t.is_some() {
            return;
        }
        let (Ok(fd), api, shared) = (async_fd.try_clone(), api.clone(), self.inner.clone()) else {
            return;
        };
        *t = std::thread::Builder::new()
            .name("softnic-async".into())
            .spawn(move || watch(&api, &fd, &shared))
            .ok();
    }

    /// Stops and joins the watcher (at `ibv_close_device`).
    pub(crate) fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn watch(api: &Context, fd: &OwnedFd, s: &Shared) {
    while !s.stop.load(Ordering::Acquire) {
        std::thread::sleep(POLL_INTERVAL);
        let Ok(events) = api.poll_async_events() else {
            return; // the NIC is gone: no more events
        };
        let qp = |qpn: u32| lock(&s.qps).get(&qpn).copied();
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
            lock(&s.queue).push_back((element, kind));
            let one: u64 = 1;
            // SAFETY: writes 8 bytes to the async eventfd.
            unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
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
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: reads at most 8 bytes into buf.
        let r = unsafe { libc::read(ctx.async_fd().as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if r < 0 {
            return -1; // errno from read (EAGAIN on a non-blocking fd)
        }
        break;
    }
    // One count per queued event, so the queue cannot be empty here.
    let Some((element, kind)) = lock(&ctx.events.inner.queue).pop_front() else {
        errno::set(libc::EIO);
        return -1;
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
/// object's mutex, signalling its condvar), as rdma-core does.
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
    let (mutex, cond, count) = match e.event_type {
        EVENT_SRQ_ERR | EVENT_SRQ_LIMIT_REACHED => {
            let s = e.element as *mut ibv_srq;
            // SAFETY: a live SRQ (caller contract).
            unsafe {
                (
                    std::ptr::addr_of_mut!((*s).mutex),
                    std::ptr::addr_of_mut!((*s).cond),
                    std::ptr::addr_of_mut!((*s).events_completed),
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
}
