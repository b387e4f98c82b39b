//! Connection management (`rdma_cm`): connect and listen by IP address and port.
//!
//! The IBTA communication manager (IBTA Vol 1 ch. 12) runs *inside the NIC*, on its GSI
//! QP (QP1): the NIC sends and answers the REQ/REP/RTU/REJ/MRA/DREQ/DREP MADs, keeps
//! their timers and retries, and moves the bound RC QP through INIT → RTR → RTS with the
//! negotiated attributes. This module is the client side of that, shaped like
//! librdmacm so that the drop-in `librdmacm.so.1` is a thin layer over it:
//!
//! * an [`EventChannel`] (`rdma_create_event_channel`) is a descriptor you can `poll(2)`
//!   ([`EventChannel::fd`]); [`EventChannel::get_event`] blocks (or, after
//!   [`EventChannel::set_nonblocking`], answers `WouldBlock`) and returns a [`CmEvent`];
//! * a [`CmId`] (`rdma_create_id`) is bound to a NIC by [`CmId::bind_addr`] or
//!   [`CmId::resolve_addr`] (the NIC whose address is the IP, see [`find_device`]);
//! * the passive side [`CmId::listen`]s; each REQ for its service ID surfaces as
//!   [`CmEventKind::ConnectRequest`] carrying a new [`CmId`] for the connection, which
//!   [`CmId::accept`]s or [`CmId::reject`]s;
//! * the active side [`CmId::connect`]s with an RC QP of the same NIC (in
//!   [`PortSpace::Ib`], also an XRC initiator, to a listener whose id has QP type
//!   [`QpType::XrcRecv`], which accepts with an XRC target: [`CmId::with_qp_type`]).
//!
//! The service ID on the wire is the RDMA IP CM service's (IBTA Annex A11, as Linux
//! `cma.c` builds it): `0x0000_0000_0100_0000 | port_space << 16 | port`, see
//! [`service_id`]. The REQ's private data starts with the 36-byte IP CM header
//! (`wire::cm::CmaHeader`: version, IP version, source port, source and destination IP)
//! and then the user's bytes, so a user may send at most
//! [`MAX_REQ_PRIVATE_DATA`] = 92 − 36 = 56 bytes in a connect.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::abi::control::cm::{CmEventMsg, CmReply, CmRequest};
use crate::abi::control::{Handle, Reply, Request};
use crate::device::{Context, ContextInner, Device};
use crate::error::{io, Error, Result};
use crate::mr::AccessFlags;
use crate::os;
use crate::qp::{AhAttr, QpAttr, QpState, QpType, QueuePair};

/// `RDMA_PS_TCP`: reliable connected QPs (RC), connected with REQ/REP/RTU.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// `RDMA_PS_IB`: connections of the id's QP type ([`CmId::with_qp_type`]; RC and XRC
/// here), connected with REQ/REP/RTU.
pub const RDMA_PS_IB: u16 = 0x013F;
/// `RDMA_PS_UDP`: unreliable datagram QPs (UD), resolved with SIDR REQ/REP.
pub const RDMA_PS_UDP: u16 = 0x0111;

/// Private data of a REQ (IBTA 12.6.5: 92 bytes) less the 36-byte IP CM header.
pub const MAX_REQ_PRIVATE_DATA: usize = 92 - 36;
/// Private data of a REP (IBTA 12.6.8: 196 bytes).
pub const MAX_REP_PRIVATE_DATA: usize = 196;
/// Private data of a REJ (IBTA 12.6.7: 148 bytes).
pub const MAX_REJ_PRIVATE_DATA: usize = 148;
/// Private data of a DREQ (IBTA 12.6.10: 220 bytes).
pub const MAX_DREQ_PRIVATE_DATA: usize = 220;
/// Private data of an RTU or DREP (IBTA 12.6.9, 12.6.11: 224 bytes).
pub const MAX_RTU_PRIVATE_DATA: usize = 224;
/// Private data of a SIDR REQ (IBTA 12.11.1: 216 bytes) less the 36-byte IP CM header.
pub const MAX_SIDR_REQ_PRIVATE_DATA: usize = 216 - 36;

/// The Q_Key of UD QPs created through the CM (`RDMA_UDP_QKEY` in Linux `cma.c`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The QP number a multicast group is sent to, reported by MULTICAST_JOIN.
pub use crate::abi::MULTICAST_QPN;

/// The port space of a [`CmId`] (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    /// `RDMA_PS_TCP` (0x0106): RC connections.
    Tcp = RDMA_PS_TCP,
    /// `RDMA_PS_UDP` (0x0111): UD, SIDR.
    Udp = RDMA_PS_UDP,
    /// `RDMA_PS_IB` (0x013F): the id's QP type, RC or XRC.
    Ib = RDMA_PS_IB,
}

impl PortSpace {
    /// From the `rdma_port_space` value; `None` for spaces softnic does not serve
    /// (`RDMA_PS_IPOIB`).
    pub fn from_raw(ps: u32) -> Option<PortSpace> {
        match ps {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }

    /// The QP type of an id created with no other (`rdma_create_id`): UD in
    /// `RDMA_PS_UDP`, RC elsewhere (rdma-core's `ucma_get_qp_type`).
    pub fn default_qp_type(self) -> QpType {
        match self {
            PortSpace::Udp => QpType::Ud,
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
        }
    }
}

/// The service ID of `port` in port space `ps`, as the Linux CM puts it in a REQ
/// (`RDMA_IB_IP_PS_TCP | port`, IBTA Annex A11 "RDMA IP CM Service"):
/// `0x0000_0000_0106_1c06` for TCP port 7174 (rping's).
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(ps as u16) << 16) | u64::from(port)
}

/// The softnic NIC serving `ip`: the running device (in `$SOFTNIC_DIR`) whose bound
/// address is `ip`; an unspecified address (`0.0.0.0`, `::`) takes the first running
/// device of that family, and so does a loopback address no NIC holds (`127.0.0.1`,
/// `::1`), as Linux's CM binds a loopback address to the first RDMA device
/// (`cma_bind_loopback`): libfabric's verbs provider binds "localhost" to find a
/// device. This is how [`CmId::bind_addr`] and [`CmId::resolve_addr`] pick a device
/// (librdmacm asks the kernel's routing table; softnic's "route" is this lookup). An
/// id bound through either fallback takes the NIC's own address as its local address
/// ([`CmId::local_addr`]): it is the one its peers reach. Stale sockets of dead NICs
/// are skipped.
pub fn find_device(ip: IpAddr) -> Result<Device> {
    let fallback = ip.is_unspecified() || ip.is_loopback();
    // One pass over the devices, each queried once: the exact address wins, else the
    // first of the family if the address allows the fallback.
    let mut first = None;
    for d in Device::list().unwrap_or_default() {
        let Ok(a) = d.query() else { continue };
        if !ip.is_unspecified() && a.addr == ip {
            return Ok(d);
        }
        if fallback && first.is_none() && a.addr.is_ipv4() == ip.is_ipv4() {
            first = Some(d);
        }
    }
    first.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no softnic device serves {ip} (rdma_cm: EADDRNOTAVAIL)"
        ))
    })
}

/// The running device whose bound address is exactly `ip` (never for a wildcard).
pub fn device_with_addr(ip: IpAddr) -> Option<Device> {
    if ip.is_unspecified() {
        return None;
    }
    Device::list()
        .ok()?
        .into_iter()
        .find(|d| d.query().is_ok_and(|a| a.addr == ip))
}

/// A CM event type (`enum rdma_cm_event_type`; the discriminants are librdmacm's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: [`CmId::resolve_addr`] found the NIC.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: no NIC serves the source address.
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: [`CmId::resolve_route`] done.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a REQ (or SIDR REQ) reached a listener;
    /// [`CmEvent::new_id`] is the connection's id.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: not raised here (softnic's CM always completes
    /// the RTU itself, as librdmacm does when the id has a QP); softnic's
    /// `librdmacm.so.1` reports the ESTABLISHED of [`CmId::connect_own_qp`] as it.
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the connection failed after the REP (e.g. the
    /// QP could not be moved to RTR/RTS).
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the REQ or REP was retried until its retry count
    /// ran out with no answer (IBTA 12.4); `status` is `-ETIMEDOUT`.
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`: the peer sent a REJ; `status` is its reason
    /// (IBTA table 112: 8 = invalid service ID when nobody listens, 28 = consumer
    /// reject from `rdma_reject`), the private data is the REJ's.
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`: RTU sent (active) or received (passive); the QP
    /// is in RTS.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`: a DREQ was received, or our DREQ was answered or
    /// timed out; the QP is in ERR (its outstanding work requests flush).
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the NIC went away.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` ([`CmId::join_multicast`]).
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` (the C library's, when attaching the id's QP
    /// to a joined group fails).
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (not raised).
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the connection left TimeWait; its QP may be
    /// reused.
    TimewaitExit = 15,
}

/// What a connect/accept asks for (`struct rdma_conn_param`, the fields that go into
/// the REQ or REP): private data (a connect's ≤ [`MAX_REQ_PRIVATE_DATA`], an accept's ≤
/// [`MAX_REP_PRIVATE_DATA`]), responder resources, initiator depth, retry counts, the
/// flow-control and SRQ bits. The same struct travels to the NIC.
pub use crate::abi::control::cm::CmConnParam as ConnParam;

/// What a CONNECT_REQUEST / ESTABLISHED / REJECTED event tells about the peer
/// (`rdma_cm_event.param.conn`): its private data (for a REQ, the bytes after the IP CM
/// header; otherwise the MAD's whole zero-padded field, as librdmacm gives it), responder
/// resources, initiator depth, flow control, retry counts, SRQ bit, QP number and
/// starting PSN. The NIC's event message carries exactly this struct.
pub use crate::abi::control::cm::CmEventConn as ConnEventParam;

/// What a UD (`RDMA_PS_UDP`) CONNECT_REQUEST/ESTABLISHED tells (`param.ud`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdEventParam {
    /// Private data (SIDR REQ: after the IP CM header; SIDR REP: all of it).
    pub private_data: Vec<u8>,
    /// The peer's UD QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
    /// How to address the peer.
    pub ah_attr: AhAttr,
}

/// An event's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CmEventParam {
    /// None (address/route events, errors).
    #[default]
    None,
    /// RC (`RDMA_PS_TCP`).
    Conn(ConnEventParam),
    /// UD (`RDMA_PS_UDP`).
    Ud(UdEventParam),
}

/// A process-unique key naming a [`CmId`] in events ([`CmId::key`]); the C layer maps
/// it to its `struct rdma_cm_id *`. Keys are never reused within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmIdKey(pub u64);

/// One event (`struct rdma_cm_event`). Dropping it is `rdma_ack_cm_event`.
#[derive(Debug)]
pub struct CmEvent {
    /// The id the event is for: for a CONNECT_REQUEST, the new connection's id (the
    /// key of [`CmEvent::new_id`]).
    pub id: CmIdKey,
    /// For a CONNECT_REQUEST: the listening id it arrived on.
    pub listen_id: Option<CmIdKey>,
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a REJ reason (REJECTED), or a negative errno (`-ETIMEDOUT` for UNREACHABLE).
    pub status: i32,
    /// Peer parameters (CONNECT_REQUEST, ESTABLISHED, REJECTED, DISCONNECTED).
    pub param: CmEventParam,
    /// For a CONNECT_REQUEST: the connection's id, bound to the listener's NIC and
    /// channel. Take it (`Option::take`) to accept or reject; dropping it unaccepted
    /// rejects the connection (reason 28, consumer reject).
    pub new_id: Option<CmId>,
}

/// An event channel (`struct rdma_event_channel`): events of every [`CmId`] created on
/// it, from every NIC they are bound to.
///
/// [`EventChannel::fd`] is readable while events are pending, so it works with
/// `poll(2)`/`epoll` (what rping's `rpoll` and ucmatose do): an epoll instance holding
/// the read end of each NIC's event pipe (written by the NIC when its queue of this
/// channel's events stops being empty) and an eventfd of this process's own (events
/// made here, and events fetched but not yet returned). [`EventChannel::get_event`]
/// fetches the NICs' events over the control socket. The NICs write only pipes they
/// made, through write ends of their own: nothing done to this channel's descriptors
/// can make a NIC wait. `Send + Sync`: one thread may wait for events while others
/// connect.
#[derive(Debug, Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug)]
struct ChannelInner {
    /// The epoll instance programs poll (`channel->fd`): readable while `local` or a
    /// NIC's pipe is.
    epoll: OwnedFd,
    /// Written here: events made locally, or fetched and not yet returned.
    local: OwnedFd,
    state: Mutex<ChannelState>,
}

/// One NIC a channel is open on.
#[derive(Debug, Clone)]
struct ChannelNic {
    ctx: Context,
    /// The NIC's handle of the channel.
    handle: Handle,
    /// The read end of the NIC's event pipe.
    pipe: Arc<OwnedFd>,
}

#[derive(Debug, Default)]
struct ChannelState {
    /// NICs this channel is open on.
    nics: Vec<ChannelNic>,
    /// (NIC, NIC id handle) → key.
    keys: HashMap<(usize, Handle), CmIdKey>,
    /// Events fetched (or made locally) but not yet returned.
    pending: VecDeque<CmEvent>,
}

/// The control connection this process's CM ids use on `dev`: one per NIC, shared by
/// every [`CmId`] and [`EventChannel`] of the process, opened by the first id bound
/// there and closed with the last id or channel holding it.
///
/// Why shared: a connection costs the NIC an OS thread and counts against
/// `--max-connections-per-user` (default 256), and costs the process descriptors. A
/// program with one id per QP — perftest `-R -q 1000`, one id per connection of a
/// server — would otherwise hit either limit long before the NIC's QP limit. The NIC
/// serves any number of ids and channels on one connection, and lets an id bind a QP
/// of another connection of the same user (the program's `ibv_context`).
///
/// A connection the NIC has closed (it restarted) is not reused: the next id opens a
/// new one.
fn cm_context(dev: &Device) -> Result<Context> {
    type Shared = Vec<(std::path::PathBuf, Weak<ContextInner>)>;
    static SHARED: Mutex<Shared> = Mutex::new(Vec::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    shared.retain(|(_, w)| w.strong_count() > 0);
    let live = shared
        .iter()
        .filter(|(p, _)| p == dev.path())
        .filter_map(|(_, w)| w.upgrade())
        .find(|c| !c.peer_closed());
    if let Some(inner) = live {
        return Ok(Context { inner });
    }
    let ctx = dev.open_context()?;
    shared.retain(|(p, _)| p != dev.path());
    shared.push((dev.path().to_path_buf(), Arc::downgrade(&ctx.inner)));
    Ok(ctx)
}

fn ctx_key(ctx: &Context) -> usize {
    Arc::as_ptr(&ctx.inner) as usize
}

fn next_key() -> CmIdKey {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    CmIdKey(NEXT.fetch_add(1, Ordering::Relaxed))
}

impl EventChannel {
    /// `rdma_create_event_channel`: a channel, not yet tied to any NIC.
    pub fn new() -> Result<EventChannel> {
        // Blocking until the program sets O_NONBLOCK itself (librdmacm's convention);
        // epoll instances start so.
        let epoll = os::epoll().map_err(io("creating the CM event channel"))?;
        let local = os::eventfd().map_err(io("creating the CM event channel's eventfd"))?;
        os::epoll_add(epoll.as_fd(), local.as_fd(), 0)
            .map_err(io("creating the CM event channel"))?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                epoll,
                local,
                state: Mutex::new(ChannelState::default()),
            }),
        })
    }

    /// The fd to `poll(2)` for POLLIN: readable while an event is pending (an epoll
    /// instance: the program polls it, never reads it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.epoll.as_fd()
    }

    /// Sets or clears `O_NONBLOCK` on [`EventChannel::fd`], what librdmacm programs
    /// do with `fcntl(channel->fd, F_SETFL, O_NONBLOCK)` (either way works: the flag
    /// lives on the fd). With it, [`EventChannel::get_event`] fails with an
    /// [`Error::Io`] of kind `WouldBlock` (`EAGAIN`) instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        os::set_nonblocking(self.fd(), nonblocking).map_err(io("fcntl(O_NONBLOCK)"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ChannelState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The NIC's handle of this channel on `ctx`, opening it there on first use.
    fn attach(&self, ctx: &Context) -> Result<Handle> {
        let mut st = self.lock();
        if let Some(n) = st.nics.iter().find(|n| ctx_key(&n.ctx) == ctx_key(ctx)) {
            return Ok(n.handle);
        }
        let req = Request::Cm(CmRequest::OpenChannel);
        let (reply, mut fds) = ctx.inner.call("rdma_create_event_channel", &req, &[])?;
        let handle = match reply {
            Reply::Cm(CmReply::Channel { channel }) => channel,
            other => return Err(unexpected("OpenChannel", other)),
        };
        let (Some(pipe), true) = (fds.pop(), fds.is_empty()) else {
            return Err(Error::Protocol(
                "OpenChannel reply did not carry exactly the event pipe".into(),
            ));
        };
        os::epoll_add(self.fd(), pipe.as_fd(), 1 + st.nics.len() as u64)
            .map_err(io("adding a NIC to the CM event channel"))?;
        st.nics.push(ChannelNic {
            ctx: ctx.clone(),
            handle,
            pipe: Arc::new(pipe),
        });
        Ok(handle)
    }

    fn register(&self, ctx: &Context, nic_id: Handle, key: CmIdKey) {
        self.lock().keys.insert((ctx_key(ctx), nic_id), key);
    }

    fn unregister(&self, ctx: &Context, nic_id: Handle) {
        self.lock().keys.remove(&(ctx_key(ctx), nic_id));
    }

    /// Takes out the pending events of `key` (and the connection requests queued for
    /// it as a listener, whose new ids move with them to `to`), for
    /// [`CmId::migrate`]. The events keep their order.
    fn take_events_of(&self, key: CmIdKey, to: &EventChannel) -> VecDeque<CmEvent> {
        let mut st = self.lock();
        // What the NICs still queue for this channel (the moved id's went with it),
        // so that the fd's readiness can be settled below. An error (a NIC gone)
        // leaves it for `get_event` to report.
        let _ = self.fetch(&mut st);
        let (mut go, stay): (VecDeque<_>, VecDeque<_>) = st
            .pending
            .drain(..)
            .partition(|e| e.id == key || e.listen_id == Some(key));
        st.pending = stay;
        let mut moved_keys = Vec::new();
        for e in &mut go {
            if let Some(new) = e.new_id.as_mut() {
                new.channel = to.clone();
                if let Some((ctx, h)) = &new.bound {
                    moved_keys.push((ctx.clone(), *h, new.key));
                }
            }
        }
        for (ctx, h, _) in &moved_keys {
            st.keys.remove(&(ctx_key(ctx), *h));
        }
        // Readable only for what is left.
        self.settle_locked(&st);
        drop(st);
        for (ctx, h, k) in moved_keys {
            // The new ids' NIC side moved with their requests (`MigrateId`).
            if to.attach(&ctx).is_ok() {
                to.register(&ctx, h, k);
            }
        }
        go
    }

    /// Makes the fd readable: the caller holds events of its own for this channel
    /// (softnic's librdmacm keeps events it has translated and not yet handed out).
    pub fn wake(&self) {
        let _ = os::eventfd_signal(self.inner.local.as_fd());
    }

    /// Undoes [`EventChannel::wake`] once the caller's own events are handed out: the
    /// fd stays readable only for events pending here or at a NIC.
    pub fn settle(&self) {
        let st = self.lock();
        self.settle_locked(&st);
    }

    /// The local eventfd readable exactly while events are pending here.
    fn settle_locked(&self, st: &ChannelState) {
        let _ = os::eventfd_drain(self.inner.local.as_fd());
        if !st.pending.is_empty() {
            let _ = os::eventfd_signal(self.inner.local.as_fd());
        }
    }

    /// Queues events moved here by [`CmId::migrate`] and wakes the fd.
    fn push_moved(&self, events: VecDeque<CmEvent>) {
        if events.is_empty() {
            return;
        }
        self.lock().pending.extend(events);
        let _ = os::eventfd_signal(self.inner.local.as_fd());
    }

    /// Queues an event made here (address and route resolution) and wakes the fd.
    fn push_local(&self, ev: CmEvent) {
        self.lock().pending.push_back(ev);
        let _ = os::eventfd_signal(self.inner.local.as_fd());
    }

    /// Reads the local eventfd and every NIC's pipe empty, then asks every NIC for its
    /// events (a NIC writes its pipe again for an event queued after the answer).
    fn fetch(&self, st: &mut ChannelState) -> Result<()> {
        if os::wait_readable(self.fd(), Some(Duration::ZERO)).unwrap_or(false) {
            let _ = os::eventfd_drain(self.inner.local.as_fd());
            for n in &st.nics {
                // End of file (the NIC is gone) keeps the channel readable; the
                // GetEvents below then reports the lost NIC.
                let _ = os::pipe_drain(n.pipe.as_fd());
            }
        }
        let nics: Vec<ChannelNic> = st.nics.clone();
        for ChannelNic {
            ctx, handle: ch, ..
        } in nics
        {
            let req = Request::Cm(CmRequest::GetEvents { channel: ch });
            let msgs = match ctx.inner.call("rdma_get_cm_event", &req, &[])?.0 {
                Reply::Cm(CmReply::Events(v)) => v,
                other => return Err(unexpected("GetEvents", other)),
            };
            for m in msgs {
                if let Some(ev) = self.convert(st, &ctx, m) {
                    st.pending.push_back(ev);
                }
            }
        }
        Ok(())
    }

    /// A NIC event as the API's; a CONNECT_REQUEST makes the new [`CmId`].
    fn convert(&self, st: &mut ChannelState, ctx: &Context, m: CmEventMsg) -> Option<CmEvent> {
        let kind = event_kind(m.kind)?;
        // A connection's id takes its listener's port space and QP type.
        let listener = m
            .space
            .and_then(|(ps, t)| Some((PortSpace::from_raw(ps.into())?, t)));
        let (ps, qp_type) = listener.unwrap_or(if m.ud.is_some() {
            (PortSpace::Udp, QpType::Ud)
        } else {
            (PortSpace::Tcp, QpType::Rc)
        });
        let param = match (m.conn, m.ud) {
            (c, Some(u)) => CmEventParam::Ud(UdEventParam {
                private_data: c.map(|c| c.private_data).unwrap_or_default(),
                qp_num: u.qp_num,
                qkey: u.qkey,
                ah_attr: AhAttr {
                    dgid: crate::Gid::from_ip(u.dest.ip()),
                    udp_port: u.dest.port(),
                    traffic_class: u.traffic_class,
                    ..AhAttr::default()
                },
            }),
            (Some(c), None) => CmEventParam::Conn(c),
            (None, None) => CmEventParam::None,
        };
        let (id, listen_id, new_id) = if kind == CmEventKind::ConnectRequest {
            let listen = *st.keys.get(&(ctx_key(ctx), m.listen_id?))?;
            let key = next_key();
            st.keys.insert((ctx_key(ctx), m.id), key);
            let new = CmId {
                key,
                ps,
                qp_type,
                channel: self.clone(),
                bound: Some((ctx.clone(), m.id)),
                local: m.local,
                peer: m.peer,
                peer_nic: None,
                ack_timeout: None,
                tos: None,
            };
            (key, Some(listen), Some(new))
        } else {
            (*st.keys.get(&(ctx_key(ctx), m.id))?, None, None)
        };
        Some(CmEvent {
            id,
            listen_id,
            kind,
            status: m.status,
            param,
            new_id,
        })
    }

    /// `rdma_get_cm_event`: the oldest pending event; waits for one unless the fd has
    /// `O_NONBLOCK`.
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            if let Some(ev) = self.try_get_event()? {
                return Ok(ev);
            }
            if os::is_nonblocking(self.fd()).map_err(io("fcntl(F_GETFL)"))? {
                return Err(Error::Io {
                    what: "rdma_get_cm_event",
                    source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
                });
            }
            // As rdma-core's blocking read: a signal without SA_RESTART ends it (EINTR).
            os::wait_readable_as_read(self.fd()).map_err(io("waiting for CM events"))?;
        }
    }

    /// The oldest pending event, or `None` at once.
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        let mut st = self.lock();
        if st.pending.is_empty() {
            self.fetch(&mut st)?;
        }
        let ev = st.pending.pop_front();
        if !st.pending.is_empty() {
            // Keep the fd readable while events are left.
            let _ = os::eventfd_signal(self.inner.local.as_fd());
        }
        Ok(ev)
    }

    /// Waits at most `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_get_event()? {
                return Ok(Some(ev));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            os::wait_readable(self.fd(), Some(left)).map_err(io("waiting for CM events"))?;
        }
    }
}

fn event_kind(k: u32) -> Option<CmEventKind> {
    use CmEventKind::*;
    Some(match k {
        0 => AddrResolved,
        1 => AddrError,
        2 => RouteResolved,
        3 => RouteError,
        4 => ConnectRequest,
        5 => ConnectResponse,
        6 => ConnectError,
        7 => Unreachable,
        8 => Rejected,
        9 => Established,
        10 => Disconnected,
        11 => DeviceRemoval,
        12 => MulticastJoin,
        13 => MulticastError,
        14 => AddrChange,
        15 => TimewaitExit,
        _ => return None,
    })
}

fn unexpected(what: &str, r: Reply) -> Error {
    Error::Protocol(format!("{what} answered with {r:?}"))
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd().as_raw_fd()
    }
}

/// A connection identifier (`struct rdma_cm_id`). Dropping it is `rdma_destroy_id`:
/// a connected id disconnects (DREQ), a listener stops listening.
///
/// Binding a QP: create an RC QP (`ProtectionDomain::create_qp`) on
/// [`CmId::context`], move it to INIT with [`CmId::init_qp`] (as `rdma_create_qp`
/// does, so receives can be posted), and pass it to [`CmId::connect`] /
/// [`CmId::accept`]. From then on the NIC moves it to RTR and RTS with the negotiated
/// attributes (peer QPN and PSN, path MTU, responder resources/initiator depth,
/// retry counts), and to ERR on a DREQ or disconnect. After ESTABLISHED call
/// `QueuePair::query` to refresh the QP's cached state before posting sends.
pub struct CmId {
    key: CmIdKey,
    ps: PortSpace,
    /// The QP type it connects (`rdma_create_id`'s): what a listener takes.
    qp_type: QpType,
    channel: EventChannel,
    /// The NIC and its handle of this id, once bound.
    bound: Option<(Context, Handle)>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    /// The peer NIC's RoCE address (from `resolve_addr`).
    peer_nic: Option<SocketAddr>,
    /// [`CmId::set_ack_timeout`] before the id was bound: told to the NIC at the bind.
    ack_timeout: Option<u8>,
    /// [`CmId::set_tos`] before the id was bound: told to the NIC at the bind.
    tos: Option<u8>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("key", &self.key)
            .field("ps", &self.ps)
            .field("qp_type", &self.qp_type)
            .field("nic_id", &self.bound.as_ref().map(|b| b.1))
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

/// `IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`: the access
/// the CM gives a connected QP (Linux `cma_init_conn_qp` with responder resources).
pub const CM_QP_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

impl CmId {
    /// `rdma_create_id(channel, &id, context, ps)`: a new id, not bound to a NIC, of
    /// the port space's QP type ([`PortSpace::default_qp_type`]).
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        CmId::with_qp_type(channel, ps, ps.default_qp_type())
    }

    /// A new id of QP type `qp_type` (what `rdma_create_ep` makes from an address
    /// info's `ai_qp_type`): RC in [`PortSpace::Tcp`], UD in [`PortSpace::Udp`], and in
    /// [`PortSpace::Ib`] RC, [`QpType::XrcSend`] (it connects an XRC initiator) or
    /// [`QpType::XrcRecv`] (it listens for XRC initiators, and its connections accept
    /// with XRC targets). Other combinations: [`Error::InvalidArgument`].
    pub fn with_qp_type(channel: &EventChannel, ps: PortSpace, qp_type: QpType) -> Result<CmId> {
        let served = match ps {
            PortSpace::Tcp => qp_type == QpType::Rc,
            PortSpace::Udp => qp_type == QpType::Ud,
            PortSpace::Ib => matches!(qp_type, QpType::Rc | QpType::XrcSend | QpType::XrcRecv),
        };
        if !served {
            return Err(Error::InvalidArgument(format!(
                "rdma_cm: a {qp_type:?} id in {ps:?} is not served"
            )));
        }
        Ok(CmId {
            key: next_key(),
            ps,
            qp_type,
            channel: channel.clone(),
            bound: None,
            local: None,
            peer: None,
            peer_nic: None,
            ack_timeout: None,
            tos: None,
        })
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)` on an RC id: this id's QP gets
    /// local ACK timeout `timeout` (4.096 µs × 2^`timeout`) at RTS instead of what the
    /// peer's REQ or REP offers, and `rdma_init_qp_attr` answers it, as with Linux's CM.
    /// Set before the connection reaches RTS; InvalidArgument past 31 or on a UD id.
    pub fn set_ack_timeout(&mut self, timeout: u8) -> Result<()> {
        if self.ps == PortSpace::Udp || timeout > 31 {
            return Err(Error::InvalidArgument(format!(
                "ACK timeout {timeout} on a {:?} id",
                self.ps
            )));
        }
        self.ack_timeout = Some(timeout);
        if self.bound.is_some() {
            self.send_options()?;
        }
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class (IP TOS byte: DSCP and
    /// ECN) of this id's connection. The REQ's primary path carries it, both sides' QPs
    /// send every packet with it, and `rdma_init_qp_attr` answers it in
    /// `ah_attr.grh.traffic_class`, as Linux's CM routes an id with its TOS. Set it
    /// before `rdma_connect`; a passive connection takes the REQ's. On a UD id it is
    /// the traffic class of the address the ESTABLISHED event gives (`ah_attr`), as
    /// Linux's CM builds that address from the route.
    pub fn set_tos(&mut self, tos: u8) -> Result<()> {
        self.tos = Some(tos);
        if self.bound.is_some() {
            self.send_options()?;
        }
        Ok(())
    }

    /// Tells the NIC the id's ACK timeout and TOS, those that were set.
    fn send_options(&self) -> Result<()> {
        if self.ack_timeout.is_none() && self.tos.is_none() {
            return Ok(());
        }
        let (_, id) = self.nic()?;
        if let Some(timeout) = self.ack_timeout {
            let req = CmRequest::SetAckTimeout { id, timeout };
            self.call("rdma_set_option", req)?;
        }
        if let Some(tos) = self.tos {
            self.call("rdma_set_option", CmRequest::SetTos { id, tos })?;
        }
        Ok(())
    }

    /// The key naming this id in [`CmEvent`]s.
    pub fn key(&self) -> CmIdKey {
        self.key
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// Its QP type (`rdma_cm_id.qp_type`).
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The NIC this id is bound to (`id->verbs`), once bound or resolved.
    pub fn context(&self) -> Option<&Context> {
        self.bound.as_ref().map(|b| &b.0)
    }

    /// Local address (`rdma_get_local_addr`), once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// Peer address (`rdma_get_peer_addr`), once resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn nic(&self) -> Result<(&Context, Handle)> {
        self.bound
            .as_ref()
            .map(|(c, h)| (c, *h))
            .ok_or_else(|| Error::InvalidArgument("the rdma_cm id is not bound to a device".into()))
    }

    fn call(&self, verb: &'static str, req: CmRequest) -> Result<Reply> {
        let (ctx, _) = self.nic()?;
        Ok(ctx.inner.call(verb, &Request::Cm(req), &[])?.0)
    }

    fn bind_to(&mut self, dev: &Device, addr: SocketAddr) -> Result<()> {
        if self.bound.is_some() {
            return Err(Error::InvalidArgument(
                "the rdma_cm id is already bound".into(),
            ));
        }
        let ctx = cm_context(dev)?;
        let channel = self.channel.attach(&ctx)?;
        let req = Request::Cm(CmRequest::CreateId { channel });
        let id = match ctx.inner.call("rdma_create_id", &req, &[])?.0 {
            Reply::Cm(CmReply::Id { id }) => id,
            other => return Err(unexpected("CreateId", other)),
        };
        self.channel.register(&ctx, id, self.key);
        // The NIC's own address: the one asked for, or, through `find_device`'s
        // fallbacks (a wildcard, a loopback address no NIC holds), the NIC's.
        let ip = ctx.attributes().addr;
        self.local = Some(SocketAddr::new(ip, addr.port()));
        self.bound = Some((ctx, id));
        self.send_options()
    }

    /// `rdma_migrate_id`: this id's events go to `to` from now on. Its events not yet
    /// returned move there with it, in order, and so do the connection requests
    /// queued for it as a listener (with their new ids), as Linux's `ucma_migrate_id`
    /// moves a context and its events; a bound id's NIC moves what it still holds
    /// (`CmRequest::MigrateId`).
    pub fn migrate(&mut self, to: &EventChannel) -> Result<()> {
        if Arc::ptr_eq(&self.channel.inner, &to.inner) {
            return Ok(());
        }
        if let Some((ctx, id)) = self.bound.clone() {
            let channel = to.attach(&ctx)?;
            self.call("rdma_migrate_id", CmRequest::MigrateId { id, channel })?;
            self.channel.unregister(&ctx, id);
            to.register(&ctx, id, self.key);
        }
        let moved = self.channel.take_events_of(self.key, to);
        to.push_moved(moved);
        self.channel = to.clone();
        Ok(())
    }

    /// `rdma_bind_addr`: binds to the NIC serving `addr.ip()` ([`find_device`]) and
    /// reserves `addr.port()` in this id's port space there (0 = a free ephemeral port),
    /// as Linux's CM does at bind: [`CmId::local_addr`] names the port at once (qperf
    /// sends it to its peer before it listens), and a port another id holds fails here
    /// (EADDRINUSE), leaving the id unbound.
    pub fn bind_addr(&mut self, addr: SocketAddr) -> Result<()> {
        let dev = find_device(addr.ip())?;
        self.bind_to(&dev, addr)?;
        let (_, id) = self.nic()?;
        let req = CmRequest::Bind {
            id,
            port_space: self.ps as u16,
            port: addr.port(),
        };
        let port = match self.call("rdma_bind_addr", req) {
            Ok(Reply::Cm(CmReply::Port { port })) => port,
            other => {
                // Unbound again, as Linux leaves an id whose bind failed.
                self.unbind();
                return Err(match other {
                    Err(e) => e,
                    Ok(r) => unexpected("Bind", r),
                });
            }
        };
        if let Some(l) = self.local.as_mut() {
            l.set_port(port);
        }
        Ok(())
    }

    /// `rdma_resolve_addr`: binds (if not yet) to the NIC serving `src` (or, with no
    /// `src`, the first NIC of `dst`'s family) and records `dst` as the peer. Raises
    /// ADDR_RESOLVED on the channel. `dst.port()` is the peer's CM port; the peer NIC
    /// is reached at `dst.ip()`, UDP port 4791 unless `peer_udp_port` says otherwise
    /// (several NICs on one host).
    pub fn resolve_addr(
        &mut self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        peer_udp_port: Option<u16>,
        timeout: Duration,
    ) -> Result<()> {
        let _ = timeout; // resolution is a local lookup: it never waits
        if self.bound.is_none() {
            let src = src.unwrap_or_else(|| {
                let any: IpAddr = if dst.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                };
                SocketAddr::new(any, 0)
            });
            let dev = find_device(src.ip())?;
            self.bind_to(&dev, src)?;
        }
        self.peer = Some(dst);
        self.peer_nic = Some(SocketAddr::new(
            dst.ip(),
            peer_udp_port.unwrap_or(crate::gid::ROCE_V2_PORT),
        ));
        self.local_event(CmEventKind::AddrResolved);
        Ok(())
    }

    fn local_event(&self, kind: CmEventKind) {
        self.channel.push_local(CmEvent {
            id: self.key,
            listen_id: None,
            kind,
            status: 0,
            param: CmEventParam::None,
            new_id: None,
        });
    }

    /// `rdma_join_multicast` on a UD id (`RDMA_PS_UDP`) bound to a NIC (after
    /// [`CmId::bind_addr`] or [`CmId::resolve_addr`]): raises MULTICAST_JOIN with what
    /// the kernel's CM reports for a RoCEv2 join (`cma_iboe_join_multicast`): the
    /// address vector of the group (MGID `::ffff:a.b.c.d`, the NIC's address GID, hop
    /// limit 64), QPN 0xFFFFFF and Q_Key [`RDMA_UDP_QKEY`]. There is no subnet
    /// manager to ask: the NIC joins the IP group when a QP attaches
    /// ([`crate::QueuePair::attach_mcast`], which the C library calls as librdmacm
    /// does when the program takes the event). Errors, as Linux's: an IPv6 group is
    /// refused with EOPNOTSUPP (RoCEv2's CM joins IPv4 groups only); an address that
    /// is not IPv4 multicast, or an id that is not UD or not bound, with
    /// InvalidArgument.
    pub fn join_multicast(&mut self, group: SocketAddr) -> Result<()> {
        if self.ps != PortSpace::Udp || self.bound.is_none() {
            return Err(Error::InvalidArgument(
                "rdma_join_multicast needs a UD id bound to a device".into(),
            ));
        }
        let IpAddr::V4(g) = group.ip() else {
            return Err(Error::Io {
                what: "rdma_join_multicast: IPv6 groups over RoCEv2",
                source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            });
        };
        if !g.is_multicast() {
            return Err(Error::InvalidArgument(format!(
                "rdma_join_multicast: {g} is not a multicast group"
            )));
        }
        self.channel.push_local(CmEvent {
            id: self.key,
            listen_id: None,
            kind: CmEventKind::MulticastJoin,
            status: 0,
            param: CmEventParam::Ud(UdEventParam {
                private_data: Vec::new(),
                qp_num: MULTICAST_QPN,
                qkey: RDMA_UDP_QKEY,
                ah_attr: AhAttr {
                    dgid: crate::Gid::from(g),
                    sgid_index: crate::gid::ADDRESS_GID_INDEX as u8,
                    hop_limit: 64,
                    // The kernel's RoCE join leaves the record's traffic class 0.
                    traffic_class: 0,
                    udp_port: 0,
                },
            }),
            new_id: None,
        });
        Ok(())
    }

    /// `rdma_resolve_route`: raises ROUTE_RESOLVED (RoCE needs no path record query:
    /// the path is the peer's GID and the NIC's MTU).
    pub fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        let _ = timeout;
        if self.peer_nic.is_none() {
            return Err(Error::InvalidArgument(
                "rdma_resolve_route before rdma_resolve_addr".into(),
            ));
        }
        self.local_event(CmEventKind::RouteResolved);
        Ok(())
    }

    /// `rdma_listen`: REQs for this id's service ID ([`service_id`] of the bound port)
    /// become CONNECT_REQUEST events, at most `backlog` (the NIC clamps it to 4096) not
    /// yet accepted or rejected at once; further REQs are left unanswered so that the
    /// active side retries (as Linux's CM does when a listener's backlog is full). Needs
    /// a prior [`CmId::bind_addr`], which reserved the port (an ephemeral one for port
    /// 0, shown by [`CmId::local_addr`] since the bind).
    pub fn listen(&mut self, backlog: u32) -> Result<()> {
        let local = self
            .local
            .ok_or_else(|| Error::InvalidArgument("rdma_listen before rdma_bind_addr".into()))?;
        let (_, id) = self.nic()?;
        let req = CmRequest::Listen {
            id,
            port_space: self.ps as u16,
            port: local.port(),
            backlog,
            qp_type: self.qp_type,
        };
        match self.call("rdma_listen", req)? {
            Reply::Cm(CmReply::Port { port }) => {
                self.local = Some(SocketAddr::new(local.ip(), port));
                Ok(())
            }
            other => Err(unexpected("Listen", other)),
        }
    }

    /// RESET → INIT for a QP of this id's NIC with the attributes the CM uses, as
    /// `rdma_create_qp` does: RC gets [`CM_QP_ACCESS`]; UD gets [`RDMA_UDP_QKEY`].
    pub fn init_qp(&self, qp: &mut QueuePair) -> Result<()> {
        qp.modify(&self.init_qp_attr(QpState::Init)?)?;
        if self.ps == PortSpace::Udp {
            // A UD QP needs no peer: librdmacm moves it on to RTS at once.
            for state in [QpState::Rtr, QpState::Rts] {
                let mut a = QpAttr {
                    qp_state: Some(state),
                    ..QpAttr::default()
                };
                if state == QpState::Rts {
                    a.sq_psn = Some(0);
                }
                qp.modify(&a)?;
            }
        }
        Ok(())
    }

    /// `rdma_init_qp_attr`: the attributes for moving a QP of this id to `state`, with
    /// exactly the fields (the "mask") librdmacm's kernel CM fills (`ib_cm_init_qp_attr`):
    ///
    /// * INIT (any bound id): P_Key index 0, port 1, and [`CM_QP_ACCESS`] (RC) or
    ///   [`RDMA_UDP_QKEY`] (UD) — what [`CmId::init_qp`] applies;
    /// * RTR (RC, once the peer's REQ — passive — or REP — active — is known): path
    ///   MTU, the peer's QPN, `rq_psn` (the starting PSN of *our* REQ/REP, or of the REP
    ///   an accept will send), `max_dest_rd_atomic`, `min_rnr_timer` and the address
    ///   (the peer's GID, [`crate::gid::ADDRESS_GID_INDEX`], hop limit 64);
    /// * RTS (the same): `sq_psn` (the peer's starting PSN), timeout, retry and RNR
    ///   retry counts, `max_rd_atomic`.
    ///
    /// RTR/RTS are what the NIC applies to a QP it moves itself ([`CmId::connect`]), so
    /// a program moving its own QP ([`CmId::connect_own_qp`]) gets the same QP. Before
    /// an accept the responder resources/initiator depth are the REQ's initiator
    /// depth/responder resources (Linux's assumption; librdmacm overrides them with its
    /// `rdma_conn_param`). Other states, RTR/RTS on a UD id or with no peer yet:
    /// [`Error::InvalidArgument`] / the NIC's `InvalidState` (EINVAL either way).
    pub fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        match (state, self.ps) {
            (QpState::Init, ps) => {
                let mut a = QpAttr {
                    qp_state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port_num: Some(1),
                    ..QpAttr::default()
                };
                match ps {
                    PortSpace::Tcp | PortSpace::Ib => a.qp_access_flags = Some(CM_QP_ACCESS),
                    PortSpace::Udp => a.qkey = Some(RDMA_UDP_QKEY),
                }
                Ok(a)
            }
            (QpState::Rtr | QpState::Rts, PortSpace::Tcp | PortSpace::Ib) => {
                let (_, id) = self.nic()?;
                let (rtr, rts) = match self.call("rdma_init_qp_attr", CmRequest::QpAttrs { id })? {
                    Reply::Cm(CmReply::QpAttrs { rtr, rts }) => (rtr, rts),
                    other => return Err(unexpected("QpAttrs", other)),
                };
                Ok(QpAttr::from_control(if state == QpState::Rtr {
                    &rtr
                } else {
                    &rts
                }))
            }
            _ => Err(Error::InvalidArgument(format!(
                "rdma_init_qp_attr({state:?}) on a {:?} id",
                self.ps
            ))),
        }
    }

    /// `rdma_connect`. RC (`PortSpace::Tcp`): sends a REQ for the peer's service ID
    /// carrying `qp`'s number and a random starting PSN, the IP CM header and `param`'s
    /// private data (≤ [`MAX_REQ_PRIVATE_DATA`]); `qp` must be an RC QP of this NIC in
    /// RESET or INIT, or an XRC initiator (an RC REQ all the same, as Linux's CM
    /// sends the id's type: libfabric connects XRC so). [`PortSpace::Ib`]: the REQ is
    /// the id's QP type's, RC or, for a [`QpType::XrcSend`] id, XRC (then `qp` must be
    /// an XRC initiator; a listener of QP type [`QpType::XrcRecv`] takes it). Outcome: ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR.
    /// UD (`PortSpace::Udp`): sends a SIDR REQ (private data ≤
    /// [`MAX_SIDR_REQ_PRIVATE_DATA`]); `qp` is a UD QP, left alone. Outcome:
    /// ESTABLISHED with [`CmEventParam::Ud`] (the service's QPN, Q_Key and address),
    /// REJECTED (status 1: nobody listens, 2: refused) or UNREACHABLE.
    pub fn connect(&mut self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        self.connect_qpn(qp.qp_num(), param)
    }

    /// `rdma_connect` for a QP the program moves itself (no `rdma_create_qp`; the QP
    /// named by `conn_param->qp_num`): the NIC sends the REQ with `qp_num` but never
    /// changes that QP's state. When the REP arrives the NIC sends the RTU and raises
    /// ESTABLISHED (librdmacm's layer reports it as CONNECT_RESPONSE); the program
    /// then moves its QP with [`CmId::init_qp_attr`] (RTR, RTS). The RTU goes out at
    /// the REP, not at `rdma_establish`, so the peer may send before this QP is in
    /// RTR: those packets are dropped and retransmitted after the QP's ACK timeout.
    pub fn connect_own_qp(&mut self, qp_num: u32, param: &ConnParam) -> Result<()> {
        self.own_qp()?;
        self.connect_qpn(qp_num, param)
    }

    /// `rdma_accept` for a QP the program moves itself (to RTR and RTS with
    /// [`CmId::init_qp_attr`] before accepting, as librdmacm does): the NIC sends the
    /// REP with `qp_num` and the starting PSN `init_qp_attr(Rtr)` named, and never
    /// changes that QP's state.
    pub fn accept_own_qp(&mut self, qp_num: u32, param: &ConnParam) -> Result<()> {
        self.own_qp()?;
        self.accept_qpn(qp_num, param)
    }

    fn own_qp(&self) -> Result<()> {
        let (_, id) = self.nic()?;
        self.call("rdma_connect", CmRequest::OwnQp { id })
            .map(|_| ())
    }

    fn connect_qpn(&mut self, qpn: u32, param: &ConnParam) -> Result<()> {
        let room = match self.ps {
            PortSpace::Tcp | PortSpace::Ib => MAX_REQ_PRIVATE_DATA,
            PortSpace::Udp => MAX_SIDR_REQ_PRIVATE_DATA,
        };
        if param.private_data.len() > room {
            return Err(Error::InvalidArgument(format!(
                "rdma_connect private data of {} bytes exceeds {room}",
                param.private_data.len()
            )));
        }
        let (Some(peer), Some(dest)) = (self.peer, self.peer_nic) else {
            return Err(Error::InvalidArgument(
                "rdma_connect before rdma_resolve_addr".into(),
            ));
        };
        let (_, id) = self.nic()?;
        let src_port = match self.local.map(|l| l.port()) {
            Some(p) if p != 0 => p,
            // An ephemeral source port for the IP CM header, as Linux picks one.
            _ => 49152 + (self.key.0 % 16384) as u16,
        };
        if let Some(l) = self.local.as_mut() {
            l.set_port(src_port);
        }
        let req = CmRequest::Connect {
            id,
            qpn,
            dest,
            port_space: self.ps as u16,
            dst_port: peer.port(),
            src_port,
            param: param.clone(),
            qp_type: self.qp_type,
        };
        self.call("rdma_connect", req).map(|_| ())
    }

    /// `rdma_accept` (on a CONNECT_REQUEST's id): moves `qp` to RTR and RTS against
    /// the requester and sends the REP; ESTABLISHED follows when the RTU arrives. On a
    /// UD id: answers the SIDR REQ with UD QP `qp` and Q_Key [`RDMA_UDP_QKEY`] (no
    /// event follows).
    pub fn accept(&mut self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        self.accept_qpn(qp.qp_num(), param)
    }

    fn accept_qpn(&mut self, qpn: u32, param: &ConnParam) -> Result<()> {
        if param.private_data.len() > MAX_REP_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "rdma_accept private data of {} bytes exceeds {MAX_REP_PRIVATE_DATA}",
                param.private_data.len()
            )));
        }
        let (_, id) = self.nic()?;
        let req = CmRequest::Accept {
            id,
            qpn,
            param: param.clone(),
        };
        self.call("rdma_accept", req).map(|_| ())
    }

    /// `rdma_reject`: answers a CONNECT_REQUEST with a REJ, reason 28 (consumer
    /// reject), carrying `private_data` (≤ [`MAX_REJ_PRIVATE_DATA`]).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > MAX_REJ_PRIVATE_DATA {
            return Err(Error::InvalidArgument(
                "rdma_reject private data exceeds 148 bytes".into(),
            ));
        }
        let (_, id) = self.nic()?;
        let req = CmRequest::Reject {
            id,
            private_data: private_data.to_vec(),
        };
        self.call("rdma_reject", req).map(|_| ())
    }

    /// `rdma_establish`: no-op kept for librdmacm's API (softnic's CM sends the RTU
    /// itself when the REP arrives).
    pub fn establish(&mut self) -> Result<()> {
        Ok(())
    }

    /// `rdma_disconnect`: sends a DREQ and moves the QP to ERR (not a program's own QP,
    /// see [`CmId::connect_own_qp`]); DISCONNECTED follows.
    pub fn disconnect(&mut self) -> Result<()> {
        let (_, id) = self.nic()?;
        self.call("rdma_disconnect", CmRequest::Disconnect { id })
            .map(|_| ())
    }
}

impl CmId {
    /// Forgets the NIC's id (its reservations go with it) and the binding.
    fn unbind(&mut self) {
        if let Some((ctx, id)) = self.bound.take() {
            self.channel.unregister(&ctx, id);
            let req = Request::Cm(CmRequest::DestroyId { id });
            let _ = ctx.inner.call("rdma_destroy_id", &req, &[]);
        }
        self.local = None;
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        self.unbind();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping's port 7174 in the TCP port space is the service ID the rxe capture's
    /// REQ carries; the UDP space is 0x0111 in bits 16..24.
    #[test]
    fn service_ids_are_the_ip_cm_services() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0000_0000_0111_0001);
    }
}
