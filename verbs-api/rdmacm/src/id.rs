//! Connection ids: `rdma_create_id` … `rdma_destroy_id`, addresses, listen, connect,
//! accept, reject, disconnect — each a call into [`verbs_api::cm::CmId`], whose CM runs
//! in the NIC.
//!
//! `id->verbs` is an `ibv_context` of softnic's libibverbs, one per NIC for the
//! process, around the verbs-api context (control connection) every id bound to that
//! NIC shares ([`softnic_ibverbs::internal::wrap_context`]); the PD, CQs and QP a program creates
//! on it are the objects the CM then binds (the NIC accepts a QP of any connection of
//! the same user). These contexts stay open for the life of the process, as rdma-core's
//! librdmacm keeps its device contexts: programs such as rping destroy the id before
//! the QP and PD they made on `id->verbs`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use softnic_ibverbs::abi::{ibv_context, ibv_pd};
use softnic_ibverbs::internal;
use verbs_api::cm::{CmEventKind, CmId, CmIdKey, ConnParam, PortSpace};
use verbs_api::Gid;

use crate::abi::*;
use crate::addr::{from_sockaddr, to_storage};
use crate::channel::{self, errno_of, fail};
use crate::live::LiveSet;

/// Environment variable: the UDP port of the peer NICs (default 4791, the RoCEv2
/// port stock peers use); for tests running several NICs on one address.
pub const PEER_UDP_PORT_ENV: &str = "SOFTNIC_RDMACM_PEER_UDP_PORT";

/// An id: the public struct first, then ours.
#[repr(C)]
pub struct Id {
    /// Public part.
    pub id: rdma_cm_id,
    /// The verbs-api id (its calls take `&mut`).
    pub(crate) api: Mutex<CmId>,
    /// The channel was made for this id (a synchronous id: `rdma_create_ep`, or
    /// `rdma_create_id` with no channel); destroyed with it.
    pub(crate) own_channel: bool,
    /// Synchronous: calls wait for their outcome (an id with its own channel, and the
    /// connection ids of such a listener).
    pub(crate) sync: bool,
    /// CQs and completion channels `rdma_create_qp` made because the program gave none.
    pub(crate) own_cqs: bool,
    /// `id->recv_cq` (and its channel) was made by `rdma_create_srq` for the id's XRC
    /// SRQ: destroyed after the SRQ, not with the QP.
    pub(crate) srq_cq: bool,
    /// A listener from `rdma_create_ep` with QP attributes: `rdma_get_request` creates
    /// each new connection's QP with them.
    pub(crate) ep_qp: Option<(softnic_ibverbs::abi::ibv_qp_init_attr, *mut ibv_pd)>,
    /// `rdma_connect` on this id named the program's own QP (`conn_param->qp_num`, no
    /// `rdma_create_qp`): its ESTABLISHED is reported as CONNECT_RESPONSE, as the
    /// kernel CM reports a REP to librdmacm for an id without a QP.
    pub(crate) own_qp_active: bool,
    /// Multicast groups joined and not left (`mcast.rs`); locked, because the thread
    /// that takes a join's event reads them while another may join or leave.
    pub(crate) joined: Mutex<Vec<crate::mcast::Joined>>,
}

/// Live ids by key (addresses as usize: the registry only hands them back to the
/// thread that asks, under the program's own rules for id lifetimes), and how many
/// events each id has out ([`Hold`]).
static IDS: Mutex<Registry> = Mutex::new(Registry {
    by_key: None,
    held: None,
});

/// Signalled when an id's last [`Hold`] is released.
static RELEASED: Condvar = Condvar::new();

/// How long [`rdma_destroy_id`] waits for the program to acknowledge the id's events
/// before it gives up and leaves the id allocated (rdma-core waits without bound).
const ACK_WAIT: Duration = Duration::from_secs(10);

struct Registry {
    /// Registered ids by key.
    by_key: Option<HashMap<CmIdKey, usize>>,
    /// Ids (by address) with events out, and how many.
    held: Option<HashMap<usize, u32>>,
}

/// Ids handed out and not destroyed.
static LIVE: LiveSet = LiveSet::new();

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    IDS.lock().unwrap_or_else(|e| e.into_inner())
}

fn register(key: CmIdKey, id: *mut Id) {
    LIVE.insert(id);
    registry()
        .by_key
        .get_or_insert_with(HashMap::new)
        .insert(key, id as usize);
}

/// Takes `key` out of the registry: no event is made for its id from now on.
fn unregister(key: CmIdKey) {
    if let Some(m) = registry().by_key.as_mut() {
        m.remove(&key);
    }
}

/// One event's claim on the id it counts against — the id it names, or for a
/// CONNECT_REQUEST the listener, as rdma-core counts `events_reported` against
/// `evt->id_priv` — from the moment the event is made until it is dropped
/// (acknowledged, or discarded unseen). [`rdma_destroy_id`] frees an id only when no
/// hold on it is left, as rdma-core's waits for `events_completed` to reach
/// `events_reported`: a program whose other thread still reads an event
/// (`event->id->context`, as libfabric's verbs provider does) must not find the id
/// freed under it, and an event being translated in one thread (which writes the id's
/// binding) must not race the id's free in another.
pub(crate) struct Hold(usize);

impl Hold {
    /// The id held.
    pub(crate) fn id(&self) -> *mut Id {
        self.0 as *mut Id
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut r = registry();
        let held = r.held.get_or_insert_with(HashMap::new);
        if let Some(n) = held.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.0);
                RELEASED.notify_all();
            }
        }
    }
}

/// A hold on the live id of `key` (`None`: no such id, or it is being destroyed).
/// Taken under the registry's lock, which [`unregister`] takes too: an id found here
/// is not freed before the hold is released.
pub(crate) fn hold(key: CmIdKey) -> Option<Hold> {
    let mut r = registry();
    let p = *r.by_key.as_ref()?.get(&key)?;
    *r.held
        .get_or_insert_with(HashMap::new)
        .entry(p)
        .or_insert(0) += 1;
    Some(Hold(p))
}

/// Waits until no hold on `id` is left, at most [`ACK_WAIT`]: true if none is.
fn wait_unheld(id: *mut Id) -> bool {
    let held = |r: &mut Registry| {
        r.held
            .as_ref()
            .is_some_and(|h| h.contains_key(&(id as usize)))
    };
    let (mut r, _) = RELEASED
        .wait_timeout_while(registry(), ACK_WAIT, held)
        .unwrap_or_else(|e| e.into_inner());
    !held(&mut r)
}

/// One `ibv_context` per NIC (by name) for the whole process, as rdma-core's
/// librdmacm has one per device: every id on a NIC has the same `verbs`, so a PD made
/// on one id's `verbs` carries the QPs of the others (perftest does this). It wraps
/// the control connection the process's ids share on that NIC (the wrapper keeps it
/// open); the NIC lets an id bind a QP of any connection of the same user. Never
/// closed: see the module doc.
static CONTEXTS: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());

fn context_for(api: &verbs_api::Context) -> *mut ibv_context {
    device_context(api.name(), || internal::wrap_context(api.clone()))
}

/// The process's `ibv_context` of the device named `name`, made with `open` the first
/// time: the one every id bound there carries as `id->verbs` and the one
/// `rdma_get_devices` lists, as rdma-core's librdmacm keeps one context per device for
/// both (libfabric allocates its PD on the `rdma_get_devices` context and creates QPs
/// on ids with it). NULL if `open` fails (nothing kept then).
pub(crate) fn device_context(
    name: &str,
    open: impl FnOnce() -> *mut ibv_context,
) -> *mut ibv_context {
    let mut v = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, c)) = v.iter().find(|(n, _)| n == name) {
        return c as *mut ibv_context;
    }
    let c = open();
    if !c.is_null() {
        v.push((name.to_string(), c as usize));
    }
    c
}

/// The id behind `id`: `None` for NULL or a pointer that is not a live id of ours.
///
/// # Safety
/// No other thread destroys the id meanwhile (librdmacm's rule for programs).
pub(crate) unsafe fn id<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
    // SAFETY: a live id is the first field of a boxed Id (repr(C)); caller contract
    // for concurrent destruction.
    LIVE.contains(id).then(|| unsafe { &mut *(id as *mut Id) })
}

impl Id {
    fn boxed(api: CmId, channel: *mut rdma_event_channel, context: *mut c_void) -> *mut Id {
        let key = api.key();
        let ps = api.port_space() as u16 as c_int;
        let qp_type = ibv_qp_type(api.qp_type());
        // SAFETY: rdma_route is addresses, a pointer and an int: all-zero is valid.
        let route: rdma_route = unsafe { std::mem::zeroed() };
        let b = Box::into_raw(Box::new(Id {
            id: rdma_cm_id {
                verbs: std::ptr::null_mut(),
                channel,
                context,
                qp: std::ptr::null_mut(),
                route,
                ps,
                port_num: 0,
                event: std::ptr::null_mut(),
                send_cq_channel: std::ptr::null_mut(),
                send_cq: std::ptr::null_mut(),
                recv_cq_channel: std::ptr::null_mut(),
                recv_cq: std::ptr::null_mut(),
                srq: std::ptr::null_mut(),
                pd: std::ptr::null_mut(),
                qp_type,
            },
            api: Mutex::new(api),
            own_channel: false,
            sync: false,
            own_cqs: false,
            srq_cq: false,
            ep_qp: None,
            own_qp_active: false,
            joined: Mutex::new(Vec::new()),
        }));
        // SAFETY: b is a fresh box.
        unsafe { (*b).sync_binding() };
        register(key, b);
        b
    }

    /// Copies the verbs-api id's addresses and NIC into the public struct.
    pub(crate) fn sync_binding(&mut self) {
        let api = self.api.lock().unwrap_or_else(|e| e.into_inner());
        let a = &mut self.id.route.addr;
        if let Some(l) = api.local_addr() {
            a.src_storage = to_storage(l).0;
        }
        if let Some(p) = api.peer_addr() {
            a.dst_storage = to_storage(p).0;
            a.ibaddr.dgid.raw = Gid::from_ip(p.ip()).0;
        }
        if let Some(ctx) = api.context() {
            if self.id.verbs.is_null() {
                self.id.verbs = context_for(ctx);
            }
            // librdmacm gives a bound id its device's PD (`ucma_get_device`), and
            // programs use `id->pd` before any QP exists (pyverbs' external QPs,
            // `ibv_create_ah_from_wc` on a UD id).
            if self.id.pd.is_null() {
                self.id.pd = crate::qp::default_pd(self.id.verbs);
            }
            self.id.port_num = 1;
            a.ibaddr.sgid.raw = Gid::from_ip(ctx.attributes().addr).0;
            a.ibaddr.pkey = 0xffff_u16.to_be();
        }
    }

    /// Makes `e` the id's `id->event`, acknowledging the one it held.
    pub(crate) fn keep_event(&mut self, e: Box<channel::Event>) {
        self.ack_event();
        self.id.event = channel::hand_out(e);
    }

    /// Acknowledges the id's `id->event`, if it holds one.
    pub(crate) fn ack_event(&mut self) {
        let old = std::mem::replace(&mut self.id.event, std::ptr::null_mut());
        if !old.is_null() {
            // SAFETY: an event handed out for this id and not acknowledged since.
            unsafe { channel::rdma_ack_cm_event(old) };
        }
    }

    /// After the NIC moved this id's QP: refresh the QP's cached state.
    ///
    /// # Safety
    /// `id` is a live id.
    pub(crate) unsafe fn refresh_qp(id: *mut Id) {
        // SAFETY: caller contract.
        let qp = unsafe { (*id).id.qp };
        if !qp.is_null() {
            // SAFETY: a QP this id created and still holds.
            unsafe { internal::refresh_qp(qp) };
        }
    }

    pub(crate) fn with_api<T>(&self, f: impl FnOnce(&mut CmId) -> verbs_api::Result<T>) -> c_int {
        let mut api = self.api.lock().unwrap_or_else(|e| e.into_inner());
        match f(&mut api) {
            Ok(_) => 0,
            Err(e) => fail(errno_of(&e)),
        }
    }
}

/// The new id of a CONNECT_REQUEST on `listen`: same channel and program context,
/// bound to the listener's NIC.
pub(crate) fn new_child(listen: *mut Id, api: CmId) -> Option<*mut Id> {
    // SAFETY: a live listener of the registry.
    let l = unsafe { &*listen };
    let child = Id::boxed(api, l.id.channel, l.id.context);
    // SAFETY: fresh box.
    unsafe { (*child).sync = l.sync };
    Some(child)
}

/// `channel`, or for NULL a new channel of the id's own (a synchronous id), and
/// whether it is that; `None` (errno set) if it cannot be made.
fn channel_or_own(channel: *mut rdma_event_channel) -> Option<(*mut rdma_event_channel, bool)> {
    if !channel.is_null() {
        return Some((channel, false));
    }
    let c = channel::rdma_create_event_channel();
    (!c.is_null()).then_some((c, true))
}

/// `rdma_create_id`: `RDMA_PS_TCP` (RC), `RDMA_PS_UDP` (UD) or `RDMA_PS_IB` (RC);
/// `RDMA_PS_IPOIB` is EOPNOTSUPP (softnic serves only IP addressing), any other value
/// EINVAL. With no channel the id is synchronous (its calls wait for their outcome),
/// as in librdmacm.
///
/// # Safety
/// `channel` is NULL or live; `id` is writable.
#[export_name = "softnic_rdma_create_id"]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { create_id(channel, id, context, ps, None) }
}

/// [`rdma_create_id`] with QP type `qp_type` (`None`: the port space's), as
/// rdma-core's internal `rdma_create_id2` that `rdma_create_ep` calls with an address
/// info's `ai_qp_type`: in `RDMA_PS_IB` RC, XRC_SEND or XRC_RECV
/// ([`CmId::with_qp_type`]; EINVAL otherwise).
///
/// # Safety
/// As [`rdma_create_id`].
pub(crate) unsafe fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
    qp_type: Option<c_int>,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let Some(space) = PortSpace::from_raw(ps as u32) else {
        return fail(if ps == RDMA_PS_IPOIB {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
    };
    let qp_type = match qp_type.map(qp_type_of) {
        None => space.default_qp_type(),
        Some(Some(t)) => t,
        Some(None) => return fail(libc::EINVAL),
    };
    let Some((channel, own)) = channel_or_own(channel) else {
        return -1;
    };
    // SAFETY: caller contract.
    let Some(ch) = (unsafe { channel::channel(channel) }) else {
        return fail(libc::EINVAL);
    };
    match CmId::with_qp_type(&ch.api, space, qp_type) {
        Ok(api) => {
            let b = Id::boxed(api, channel, context);
            // SAFETY: fresh box; id writable (caller contract).
            unsafe {
                (*b).own_channel = own;
                (*b).sync = own;
                *id = b as *mut rdma_cm_id;
            }
            0
        }
        Err(e) => {
            if own {
                // SAFETY: made above, not handed out.
                unsafe { channel::rdma_destroy_event_channel(channel) };
            }
            fail(errno_of(&e))
        }
    }
}

/// `rdma_destroy_id`: stops listening / disconnects (in the NIC) and frees the id.
/// The program destroys the id's QP first (librdmacm's rule); the `ibv_context` stays.
///
/// As in rdma-core, it returns once every event of the id the program was given is
/// acknowledged ([`Hold`]): another thread may still be reading one. Events of the id
/// not given out yet are dropped (a listener's connection requests with their new
/// ids, which rejects them), as the kernel drops a destroyed id's events. Where
/// rdma-core would wait forever — the calling thread itself holds an unacknowledged
/// event of the id — this waits [`ACK_WAIT`] and then returns with the id left
/// allocated, so that the late acknowledgement finds it.
///
/// # Safety
/// `id` came from [`rdma_create_id`] or an event and is not used again.
#[export_name = "softnic_rdma_destroy_id"]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    if !LIVE.remove(id) {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id (just removed from the live set, so destroyed once).
    let i = unsafe { &mut *(id as *mut Id) };
    unregister(i.api.lock().unwrap_or_else(|e| e.into_inner()).key());
    i.ack_event();
    // SAFETY: the id's channel is live while the id is.
    if let Some(ch) = unsafe { channel::channel(i.id.channel) } {
        for e in channel::unstash_for(ch, id) {
            let child = (e.ev.listen_id == id).then_some(e.ev.id);
            drop(e);
            if let Some(c) = child {
                // SAFETY: the request's new id, made by this library and never given
                // to the program.
                unsafe { rdma_destroy_id(c) };
            }
        }
    }
    if !wait_unheld(id as *mut Id) {
        return 0;
    }
    // SAFETY: no hold on the id is left and no new one can be taken (unregistered):
    // reverses Id::boxed's Box::into_raw.
    let b = unsafe { Box::from_raw(id as *mut Id) };
    let (channel, own) = (b.id.channel, b.own_channel);
    drop(b);
    if own {
        // SAFETY: the id's private channel, used by nothing else.
        unsafe { channel::rdma_destroy_event_channel(channel) };
    }
    0
}

/// `rdma_bind_addr`: binds to the NIC whose address `addr` is (any address: the first
/// NIC) and reserves its port in the id's port space there (0: one the NIC picks), so
/// that `rdma_get_src_port` names it at once; a port another id holds: EADDRINUSE.
///
/// # Safety
/// `id` is live; `addr` is a valid sockaddr.
#[export_name = "softnic_rdma_bind_addr"]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: caller contract.
    let Some(a) = (unsafe { from_sockaddr(addr) }) else {
        return fail(if addr.is_null() {
            libc::EINVAL
        } else {
            libc::EAFNOSUPPORT
        });
    };
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let a = narrowed(Some(a)).unwrap_or(a);
    let r = i.with_api(|api| api.bind_addr(a));
    i.sync_binding();
    r
}

/// The source address to use for `a` (a wildcard, no address, or a loopback address
/// no NIC holds, which Linux's CM binds to the first device as it does a wildcard:
/// `verbs_api::cm::find_device`): under `softnic exec -d NAME`
/// (`$SOFTNIC_IBV_DEVICES`), the address of the first NIC named there, with `a`'s
/// port — so `-d` picks the NIC for the CM as it does for libibverbs; otherwise `a`
/// unchanged (verbs-api then picks the NIC).
pub(crate) fn narrowed(a: Option<SocketAddr>) -> Option<SocketAddr> {
    let any_nic = |ip: std::net::IpAddr| {
        ip.is_unspecified() || (ip.is_loopback() && verbs_api::cm::device_with_addr(ip).is_none())
    };
    if a.is_some_and(|a| !any_nic(a.ip())) {
        return a;
    }
    let names = std::env::var(softnic_ibverbs::device::DEVICES_ENV).unwrap_or_default();
    let Some(first) = names.split(',').find(|n| !n.is_empty()) else {
        return a;
    };
    match verbs_api::Device::named(first).query() {
        Ok(attr) => Some(SocketAddr::new(attr.addr, a.map_or(0, |a| a.port()))),
        Err(_) => a,
    }
}

pub(crate) fn peer_udp_port() -> Option<u16> {
    std::env::var(PEER_UDP_PORT_ENV).ok()?.parse().ok()
}

/// `r` if a call failed, else (for a synchronous id) the outcome of [`complete_sync`].
pub(crate) fn finish(i: &mut Id, r: c_int, want: CmEventKind) -> c_int {
    if r != 0 {
        r
    } else {
        complete_sync(i, want)
    }
}

/// Waits, for a synchronous id, for the outcome of the call just made: 0 when the
/// next event for it is `want`, else -1 with the errno rdma-core gives (ECONNREFUSED
/// for a reject, ETIMEDOUT for unreachable, EHOSTUNREACH for address/route errors).
/// Events for other ids meanwhile stay queued for `rdma_get_cm_event`. The outcome's
/// event stays as `id->event` until the id's next synchronous call or its
/// destruction acknowledges it, as rdma-core's `ucma_complete` keeps it: programs
/// read it (`rdma_xclient` takes the server's SRQ number from the REP's private data
/// there).
fn complete_sync(i: &mut Id, want: CmEventKind) -> c_int {
    if !i.sync {
        return 0;
    }
    // SAFETY: the id's channel is live while the id is.
    let Some(ch) = (unsafe { channel::channel(i.id.channel) }) else {
        return fail(libc::EINVAL);
    };
    let me = i as *const Id as *mut rdma_cm_id;
    let mut others = Vec::new();
    let r = loop {
        let e = match channel::next_event(ch) {
            Ok(e) => e,
            Err(e) => break fail(e),
        };
        if e.ev.id != me {
            others.push(e);
            continue;
        }
        let k = e.ev.event;
        i.keep_event(e);
        break if k == want as c_int {
            0
        } else if k == CmEventKind::Rejected as c_int {
            fail(libc::ECONNREFUSED)
        } else if k == CmEventKind::Unreachable as c_int {
            fail(libc::ETIMEDOUT)
        } else if k == CmEventKind::AddrError as c_int || k == CmEventKind::RouteError as c_int {
            fail(libc::EHOSTUNREACH)
        } else {
            fail(libc::ECONNRESET)
        };
    };
    channel::restash(ch, others);
    r
}

/// `rdma_resolve_addr`: binds to the NIC serving `src` (or, with none, the first NIC)
/// and records `dst`; ADDR_RESOLVED follows on the channel. The peer's NIC is reached
/// on UDP 4791 (or `$SOFTNIC_RDMACM_PEER_UDP_PORT`).
///
/// # Safety
/// `id` is live; `src` is NULL or a sockaddr; `dst` is a sockaddr.
#[export_name = "softnic_rdma_resolve_addr"]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: caller contract.
    let (s, d) = unsafe { (from_sockaddr(src), from_sockaddr(dst)) };
    let Some(d) = d else {
        return fail(libc::EINVAL);
    };
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    if !src.is_null() && s.is_none() {
        return fail(libc::EINVAL);
    }
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    let s = narrowed(s);
    let r = i.with_api(|api| api.resolve_addr(s, d, peer_udp_port(), timeout));
    i.sync_binding();
    finish(i, r, CmEventKind::AddrResolved)
}

/// `rdma_resolve_route`: ROUTE_RESOLVED follows (RoCE needs no path query).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_resolve_route"]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    let r = i.with_api(|api| api.resolve_route(timeout));
    finish(i, r, CmEventKind::RouteResolved)
}

/// `rdma_listen`: CONNECT_REQUEST events for the bound port follow. A backlog ≤ 0
/// means the default (1024, the kernel's `somaxconn`-like cap librdmacm leaves to it).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_listen"]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let backlog = if backlog <= 0 { 1024 } else { backlog as u32 };
    i.with_api(|api| api.listen(backlog))
}

/// The verbs-api parameters of `p` (NULL: what librdmacm sends for a NULL
/// `conn_param`: the device's READ/atomic depth both ways, 7 retries).
///
/// # Safety
/// `p` is NULL or readable, its private data readable for its length.
unsafe fn to_conn_param(i: &Id, p: *const rdma_conn_param) -> ConnParam {
    // SAFETY: caller contract.
    match unsafe { p.as_ref() } {
        Some(p) => ConnParam {
            private_data: if p.private_data.is_null() {
                Vec::new()
            } else {
                // SAFETY: caller contract.
                unsafe {
                    std::slice::from_raw_parts(
                        p.private_data as *const u8,
                        usize::from(p.private_data_len),
                    )
                }
                .to_vec()
            },
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control != 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq != 0,
        },
        None => {
            let depth = if i.id.verbs.is_null() {
                0
            } else {
                // SAFETY: id->verbs is one of our live contexts.
                let a = unsafe { internal::api_context(i.id.verbs) }.attributes();
                a.max_qp_rd_atom.min(255) as u8
            };
            ConnParam {
                responder_resources: depth,
                initiator_depth: depth,
                retry_count: 7,
                rnr_retry_count: 7,
                ..ConnParam::default()
            }
        }
    }
}

/// `rdma_connect` / `rdma_accept` with the id's QP (`rdma_create_qp`'s), which the NIC
/// moves; or, on an id without one, with the program's own RC QP named by
/// `conn_param->qp_num` (a NULL `conn_param`: EINVAL), which the program moves itself
/// with `rdma_init_qp_attr` — before `rdma_accept`, and after the CONNECT_RESPONSE
/// that the active side gets instead of ESTABLISHED.
///
/// # Safety
/// As [`rdma_connect`].
unsafe fn connect_or_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
    accept: bool,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: caller contract.
    let p = unsafe { to_conn_param(i, conn_param) };
    if i.id.qp.is_null() {
        // SAFETY: caller contract.
        let Some(qp_num) = (unsafe { conn_param.as_ref() }).map(|c| c.qp_num) else {
            return fail(libc::EINVAL);
        };
        i.own_qp_active = !accept;
        let r = i.with_api(|api| {
            if accept {
                api.accept_own_qp(qp_num, &p)
            } else {
                api.connect_own_qp(qp_num, &p)
            }
        });
        let want = if accept {
            CmEventKind::Established
        } else {
            CmEventKind::ConnectResponse
        };
        return finish(i, r, want);
    }
    let r = {
        // SAFETY: the id's QP, live while the id holds it.
        let qp = unsafe { internal::queue_pair(i.id.qp) };
        let q = qp.lock().unwrap_or_else(|e| e.into_inner());
        i.with_api(|api| {
            if accept {
                api.accept(&q, &p)
            } else {
                api.connect(&q, &p)
            }
        })
    };
    // The NIC moved the QP (accept: to RTS): refresh its cached state.
    // SAFETY: a live id.
    unsafe { Id::refresh_qp(i) };
    finish(i, r, CmEventKind::Established)
}

/// `rdma_connect`: sends the REQ (RC) or SIDR REQ (UD) for the id's QP; ESTABLISHED,
/// REJECTED or UNREACHABLE follows.
///
/// # Safety
/// `id` is live; `conn_param` is NULL or readable.
#[export_name = "softnic_rdma_connect"]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { connect_or_accept(id, conn_param, false) }
}

/// `rdma_accept`: the NIC moves the QP to RTR and RTS and sends the REP; ESTABLISHED
/// follows when the RTU arrives.
///
/// # Safety
/// `id` is a CONNECT_REQUEST's id; `conn_param` is NULL or readable.
#[export_name = "softnic_rdma_accept"]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { connect_or_accept(id, conn_param, true) }
}

/// `rdma_reject`: a REJ (consumer reject) with the private data.
///
/// # Safety
/// `id` is a CONNECT_REQUEST's id; `private_data` readable for `len` bytes.
#[export_name = "softnic_rdma_reject"]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let data = if private_data.is_null() {
        &[][..]
    } else {
        // SAFETY: caller contract.
        unsafe { std::slice::from_raw_parts(private_data as *const u8, usize::from(len)) }
    };
    i.with_api(|api| api.reject(data))
}

/// `rdma_disconnect`: DREQ (or DREP); the id's QP (not a program's own) goes to ERR and
/// its work requests flush.
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_disconnect"]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let r = i.with_api(|api| api.disconnect());
    // SAFETY: a live id.
    unsafe { Id::refresh_qp(i) };
    r
}

/// `rdma_establish`: nothing to do — softnic's CM sends the RTU itself when the REP
/// arrives (as librdmacm does for an id with a QP; for the program's own QP too, see
/// `connect_or_accept`).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_establish"]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: caller contract.
    match unsafe { self::id(id) } {
        Some(i) => i.with_api(|api| api.establish()),
        None => fail(libc::EINVAL),
    }
}

/// `rdma_migrate_id`: the id's events go to `channel` from now on, or, with NULL, to
/// a channel of its own (the id becomes synchronous), as librdmacm does. Its events
/// not yet handed out move with it, in order, and so do the connection requests that
/// arrived on it as a listener, with their new ids (`CmId::migrate`, and here the
/// events this library has already translated). A channel the id had of its own is
/// destroyed, as librdmacm destroys a synchronous id's channel, unless a connection
/// id of that listener still uses it.
///
/// # Safety
/// `id` is live; `channel` NULL or live.
#[export_name = "softnic_rdma_migrate_id"]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { self::id(id) }) else {
        return fail(libc::EINVAL);
    };
    let old = i.id.channel;
    if channel == old || (channel.is_null() && i.own_channel) {
        return 0;
    }
    let Some((new, own)) = channel_or_own(channel) else {
        return -1;
    };
    let drop_new = |r: c_int| {
        if own {
            // SAFETY: made above, not handed out.
            unsafe { channel::rdma_destroy_event_channel(new) };
        }
        r
    };
    // SAFETY: a channel of ours or the program's live one (caller contract).
    let Some(to) = (unsafe { channel::channel(new) }) else {
        return drop_new(fail(libc::EINVAL));
    };
    let r = i.with_api(|api| api.migrate(&to.api));
    if r != 0 {
        return drop_new(r);
    }
    // SAFETY: the id's channel is live while the id is.
    if let Some(from) = unsafe { channel::channel(old) } {
        let moved = channel::unstash_for(from, id);
        for e in &moved {
            if e.ev.listen_id == id && !e.ev.id.is_null() {
                // SAFETY: a connection id this library made for the request.
                if let Some(c) = unsafe { self::id(e.ev.id) } {
                    if c.with_api(|api| api.migrate(&to.api)) == 0 {
                        c.id.channel = new;
                        c.sync = own;
                    }
                }
            }
        }
        channel::stash_append(to, moved);
    }
    let old_own = i.own_channel;
    i.id.channel = new;
    i.own_channel = own;
    i.sync = own;
    if old_own && !channel_used(old) {
        // SAFETY: the id's former channel of its own, which no live id uses now.
        unsafe { channel::rdma_destroy_event_channel(old) };
    }
    0
}

/// Some live id's events go to `ch`.
fn channel_used(ch: *mut rdma_event_channel) -> bool {
    let r = registry();
    r.by_key.as_ref().is_some_and(|m| {
        m.values()
            // SAFETY: live ids of the registry (removed before they are freed).
            .any(|&p| unsafe { (*(p as *const Id)).id.channel } == ch)
    })
}

/// `rdma_get_src_port`: the bound port, network order (0 if unbound).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_get_src_port"]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: caller contract.
    unsafe { self::id(id) }.map_or(0, |i| crate::addr::port_be(&i.id.route.addr.src_storage))
}

/// `rdma_get_dst_port`: the peer's port, network order (0 if none).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_get_dst_port"]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: caller contract.
    unsafe { self::id(id) }.map_or(0, |i| crate::addr::port_be(&i.id.route.addr.dst_storage))
}

/// The local address of a bound id, for tests and `rdma_create_ep`.
pub fn local_addr(i: &Id) -> Option<SocketAddr> {
    i.api.lock().unwrap_or_else(|e| e.into_inner()).local_addr()
}
