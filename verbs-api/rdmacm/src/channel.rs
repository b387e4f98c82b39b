//! Event channels and events: `rdma_create_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`.
//!
//! A channel is [`verbs_api::cm::EventChannel`]: its descriptor (an epoll instance over
//! the NICs' event pipes) is `channel->fd`, readable while an event is pending, so
//! `poll(2)` / `rpoll` work; `O_NONBLOCK` set on it by
//! the program makes `rdma_get_cm_event` answer EAGAIN. Events name ids by key; the
//! key → `rdma_cm_id *` map is [`crate::id`]'s. An event for an id already destroyed is
//! dropped (acknowledged) here, as the kernel drops events of a destroyed id.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use softnic_ibverbs::errno;
use verbs_api::cm::{CmEvent, CmEventKind, CmEventParam, EventChannel};

use crate::abi::*;
use crate::id::{self, Id};
use crate::live::LiveSet;

/// Channels handed out and not destroyed.
static CHANNELS: LiveSet = LiveSet::new();
/// Events handed out and not acknowledged.
static EVENTS: LiveSet = LiveSet::new();

/// A channel: the public struct first, then the verbs-api channel.
#[repr(C)]
pub struct Channel {
    /// Public part (`fd`).
    pub ch: rdma_event_channel,
    /// The verbs-api channel.
    pub api: EventChannel,
    /// Events fetched while a synchronous call waited for another id's event; handed
    /// out by `rdma_get_cm_event` first.
    pub(crate) stash: Mutex<VecDeque<Box<Event>>>,
}

/// An event: the public struct first, then what it points into.
#[repr(C)]
pub struct Event {
    /// Public part.
    pub ev: rdma_cm_event,
    /// `param.*.private_data` points here.
    private_data: Vec<u8>,
    /// Dropped on `rdma_ack_cm_event`.
    _api: CmEvent,
    /// The event's claim on the id it counts against, released when it is dropped.
    _held: id::Hold,
}

/// The errno of a verbs-api CM error, as the kernel would answer.
pub fn errno_of(e: &verbs_api::Error) -> c_int {
    // A port another id holds: EADDRINUSE, as Linux's `cma_get_port` answers.
    if let verbs_api::Error::Nic {
        verb: "rdma_bind_addr" | "rdma_listen",
        code: verbs_api::abi::control::ErrorCode::Busy,
        ..
    } = e
    {
        return libc::EADDRINUSE;
    }
    if let verbs_api::Error::Io { source, .. } = e {
        if source.raw_os_error().is_none() {
            return match source.kind() {
                std::io::ErrorKind::WouldBlock => libc::EAGAIN,
                std::io::ErrorKind::Unsupported => libc::ENOSYS,
                std::io::ErrorKind::AddrInUse => libc::EADDRINUSE,
                std::io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
                std::io::ErrorKind::TimedOut => libc::ETIMEDOUT,
                std::io::ErrorKind::NotFound => libc::ENODEV,
                _ => libc::EIO,
            };
        }
    }
    errno::of(e)
}

/// -1 with `errno` for `e` (the librdmacm convention).
pub fn fail(e: c_int) -> c_int {
    errno::set(e);
    -1
}

/// `rdma_create_event_channel`.
#[export_name = "softnic_rdma_create_event_channel"]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    match EventChannel::new() {
        Ok(api) => {
            let c = Box::into_raw(Box::new(Channel {
                ch: rdma_event_channel {
                    fd: api.as_raw_fd(),
                },
                api,
                stash: Mutex::new(VecDeque::new()),
            })) as *mut rdma_event_channel;
            CHANNELS.insert(c);
            c
        }
        Err(e) => errno::null(errno_of(&e)),
    }
}

/// `rdma_destroy_event_channel`: the program has destroyed its ids and acknowledged
/// its events (librdmacm's rule); stashed events are dropped.
///
/// # Safety
/// `channel` is NULL or came from [`rdma_create_event_channel`] and is not used again.
#[export_name = "softnic_rdma_destroy_event_channel"]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if CHANNELS.remove(channel) {
        // SAFETY: a live channel (just removed from the live set, so freed once):
        // reverses rdma_create_event_channel's Box::into_raw.
        drop(unsafe { Box::from_raw(channel as *mut Channel) });
    }
}

/// The channel behind `channel`: `None` for NULL or a pointer that is not a live
/// channel of ours.
///
/// # Safety
/// No other thread destroys the channel meanwhile (librdmacm's rule for programs).
pub(crate) unsafe fn channel<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
    // SAFETY: `ch` is the first field of a boxed Channel (repr(C)); caller contract.
    CHANNELS
        .contains(channel)
        .then(|| unsafe { &*(channel as *const Channel) })
}

/// The next event of `ch` translated for C, stashed ones first; `Err(errno)`.
pub(crate) fn next_event(ch: &Channel) -> Result<Box<Event>, c_int> {
    let stashed = {
        let mut s = ch.stash.lock().unwrap_or_else(|e| e.into_inner());
        s.pop_front().map(|e| (e, s.is_empty()))
    };
    if let Some((e, emptied)) = stashed {
        if emptied {
            // What `stash_append` woke the descriptor for is handed out.
            ch.api.settle();
        }
        return Ok(e);
    }
    loop {
        let api = ch.api.get_event().map_err(|e| errno_of(&e))?;
        if let Some(e) = translate(api) {
            return Ok(e);
        }
    }
}

/// Puts `events` back in front of the stash, in order (a synchronous call fetched
/// them while waiting for its own).
// Boxed: each event becomes the program's `rdma_cm_event *` (Box::into_raw).
#[allow(clippy::vec_box)]
pub(crate) fn restash(ch: &Channel, events: Vec<Box<Event>>) {
    let mut s = ch.stash.lock().unwrap_or_else(|e| e.into_inner());
    for e in events.into_iter().rev() {
        s.push_front(e);
    }
}

/// Takes out of `ch`'s stash the events of `id`, and the connection requests that
/// arrived on it as a listener, in order (`rdma_migrate_id`).
#[allow(clippy::vec_box)]
pub(crate) fn unstash_for(ch: &Channel, id: *mut rdma_cm_id) -> Vec<Box<Event>> {
    let mut s = ch.stash.lock().unwrap_or_else(|e| e.into_inner());
    let (go, stay): (VecDeque<_>, VecDeque<_>) = s
        .drain(..)
        .partition(|e| e.ev.id == id || e.ev.listen_id == id);
    *s = stay;
    go.into()
}

/// Appends `events` to `ch`'s stash, in order (`rdma_migrate_id`).
#[allow(clippy::vec_box)]
pub(crate) fn stash_append(ch: &Channel, events: Vec<Box<Event>>) {
    if events.is_empty() {
        return;
    }
    ch.stash
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(events);
    // The stash is served first; keep the descriptor readable for it.
    ch.api.wake();
}

/// `rdma_get_cm_event`: waits for the next event (EAGAIN at once if the program made
/// `channel->fd` non-blocking and none is pending).
///
/// # Safety
/// `channel` came from [`rdma_create_event_channel`]; `event` is writable.
#[export_name = "softnic_rdma_get_cm_event"]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    // SAFETY: caller contract.
    let Some(ch) = (unsafe { self::channel(channel) }) else {
        return fail(libc::EINVAL);
    };
    if event.is_null() {
        return fail(libc::EINVAL);
    }
    match next_event(ch) {
        Ok(e) => {
            // SAFETY: writable (caller contract).
            unsafe { *event = hand_out(e) };
            0
        }
        Err(e) => fail(e),
    }
}

/// `e` as an event handed to the program, live until [`rdma_ack_cm_event`].
pub(crate) fn hand_out(e: Box<Event>) -> *mut rdma_cm_event {
    let e = Box::into_raw(e) as *mut rdma_cm_event;
    EVENTS.insert(e);
    e
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// `event` came from [`rdma_get_cm_event`] and is not used again.
#[export_name = "softnic_rdma_ack_cm_event"]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if !EVENTS.remove(event) {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live event (just removed from the live set, so freed once): reverses
    // the Box::into_raw of rdma_get_cm_event.
    drop(unsafe { Box::from_raw(event as *mut Event) });
    0
}

/// The C event for `api`, or `None` when its id is gone (then it is dropped, which
/// for a CONNECT_REQUEST rejects the new connection).
fn translate(mut api: CmEvent) -> Option<Box<Event>> {
    // The hold keeps the id (or the listener) from being freed from here until the
    // event is acknowledged or dropped (`id::Hold`).
    let (id_ptr, listen_ptr, held) = if api.kind == CmEventKind::ConnectRequest {
        let held = id::hold(api.listen_id?)?;
        let child = id::new_child(held.id(), api.new_id.take()?)?;
        (child, held.id(), held)
    } else {
        let held = id::hold(api.id)?;
        // Resolution may bind the id (its NIC, addresses) only now: the program reads
        // `id->verbs` on ADDR_RESOLVED.
        // SAFETY: a live id of the registry, held.
        unsafe { (*held.id()).sync_binding() };
        (held.id(), std::ptr::null_mut(), held)
    };
    // SAFETY: rdma_event_param is two plain structs: all-zero is valid.
    let mut param: rdma_event_param = unsafe { std::mem::zeroed() };
    let private_data = match &api.param {
        CmEventParam::None => Vec::new(),
        CmEventParam::Conn(c) => {
            param.conn = rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: c.private_data.len().min(255) as u8,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: u8::from(c.flow_control),
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                srq: u8::from(c.srq),
                qp_num: c.qp_num,
            };
            c.private_data.clone()
        }
        CmEventParam::Ud(u) => {
            param.ud = rdma_ud_param {
                private_data: std::ptr::null(),
                private_data_len: u.private_data.len().min(255) as u8,
                ah_attr: softnic_ibverbs::qp::ibv_ah_attr_of(&u.ah_attr),
                qp_num: u.qp_num,
                qkey: u.qkey,
            };
            u.private_data.clone()
        }
    };
    if matches!(
        api.kind,
        CmEventKind::Established
            | CmEventKind::ConnectError
            | CmEventKind::Disconnected
            | CmEventKind::Rejected
            | CmEventKind::Unreachable
    ) {
        // The NIC moved the QP: refresh the cached state that post_send checks.
        // SAFETY: id_ptr is a live id of the registry.
        unsafe { Id::refresh_qp(id_ptr) };
    }
    // A join's event attaches the id's QP to the group as it is handed out, and
    // carries the join's context (librdmacm's `ucma_process_join`).
    let mut status = api.status;
    let mut join_context = None;
    let mut kind = api.kind;
    if let (CmEventKind::MulticastJoin, CmEventParam::Ud(u)) = (api.kind, &api.param) {
        // SAFETY: id_ptr is a live id of the registry.
        let (context, k, s) = unsafe { crate::mcast::process_join(id_ptr, u.ah_attr.dgid) }?;
        (join_context, kind, status) = (Some(context), k, s);
    }
    // SAFETY: id_ptr is a live id of the registry.
    let own_qp_active = unsafe { (*id_ptr).own_qp_active };
    let kind = match kind {
        // The program moves its own QP on the REP (then calls rdma_establish), as with
        // librdmacm over the kernel CM, which reports a REP as CONNECT_RESPONSE to an
        // id without a QP.
        CmEventKind::Established if own_qp_active => CmEventKind::ConnectResponse,
        k => k,
    };
    let mut e = Box::new(Event {
        ev: rdma_cm_event {
            id: id_ptr as *mut rdma_cm_id,
            listen_id: listen_ptr as *mut rdma_cm_id,
            event: kind as rdma_cm_event_type,
            status,
            param,
        },
        private_data,
        _api: api,
        _held: held,
    });
    if !e.private_data.is_empty() {
        // Both union members start with the private-data pointer.
        e.ev.param.conn.private_data = e.private_data.as_ptr().cast();
    }
    if let Some(c) = join_context {
        e.ev.param.ud.private_data = c as *const c_void;
    }
    Some(e)
}
