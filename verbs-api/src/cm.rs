//! Connection management (`rdma_cm`): connect and listen by IP address and port.
//!
//! The IBTA communication manager (IBTA Vol 1 ch. 12) runs *inside the NIC*, on its GSI
//! QP (QP1): the NIC sends and answers the REQ/REP/RTU/REJ/MRA/DREQ/DREP MADs, keeps
//! their timers and retries, and moves the bound RC QP through INIT → RTR → RTS with the
//! negotiated attributes. This module is the client side of that, shaped like
//! librdmacm so that the drop-in `librdmacm.so.1` is a thin layer over it:
//!
//! * an [`EventChannel`] (`rdma_create_event_channel`) is an eventfd you can `poll(2)`
//!   ([`EventChannel::fd`]); [`EventChannel::get_event`] blocks (or, after
//!   [`EventChannel::set_nonblocking`], answers `WouldBlock`) and returns a [`CmEvent`];
//! * a [`CmId`] (`rdma_create_id`) is bound to a NIC by [`CmId::bind_addr`] or
//!   [`CmId::resolve_addr`] (the NIC whose address is the IP, see [`find_device`]);
//! * the passive side [`CmId::listen`]s; each REQ for its service ID surfaces as
//!   [`CmEventKind::ConnectRequest`] carrying a new [`CmId`] for the connection, which
//!   [`CmId::accept`]s or [`CmId::reject`]s;
//! * the active side [`CmId::connect`]s with an RC QP of the same NIC.
//!
//! The service ID on the wire is the RDMA IP CM service's (IBTA Annex A11, as Linux
//! `cma.c` builds it): `0x0000_0000_0100_0000 | port_space << 16 | port`, see
//! [`service_id`]. The REQ's private data starts with the 36-byte IP CM header
//! (`wire::cm::CmaHeader`: version, IP version, source port, source and destination IP)
//! and then the user's bytes, so a user may send at most
//! [`MAX_REQ_PRIVATE_DATA`] = 92 − 36 = 56 bytes in a connect.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::device::{Context, Device};
use crate::error::{io, Error, Result};
use crate::os;
use crate::qp::{AhAttr, QpAttr, QpState, QueuePair};

/// `RDMA_PS_TCP`: reliable connected QPs (RC), connected with REQ/REP/RTU.
pub const RDMA_PS_TCP: u16 = 0x0106;
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

/// The port space of a [`CmId`] (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    /// `RDMA_PS_TCP` (0x0106): RC connections.
    Tcp = RDMA_PS_TCP,
    /// `RDMA_PS_UDP` (0x0111): UD, SIDR.
    Udp = RDMA_PS_UDP,
}

impl PortSpace {
    /// From the `rdma_port_space` value; `None` for spaces softnic does not serve
    /// (`RDMA_PS_IB`, `RDMA_PS_IPOIB`).
    pub fn from_raw(ps: u32) -> Option<PortSpace> {
        match ps {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            _ => None,
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
/// device. This is how [`CmId::bind_addr`] and [`CmId::resolve_addr`] pick a device
/// (librdmacm asks the kernel's routing table; softnic's "route" is this lookup).
pub fn find_device(ip: IpAddr) -> Result<Device> {
    let _ = ip;
    Err(not_yet("find_device"))
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
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: not raised (softnic's CM always completes the
    /// RTU itself, as librdmacm does when the id has a QP).
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
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` (not raised).
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` (not raised).
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (not raised).
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the connection left TimeWait; its QP may be
    /// reused.
    TimewaitExit = 15,
}

/// What a connect/accept asks for (`struct rdma_conn_param`, the fields that go into
/// the REQ or REP).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// The user's private data: ≤ [`MAX_REQ_PRIVATE_DATA`] in a connect (the IP CM
    /// header takes the rest of the REQ's 92 bytes), ≤ [`MAX_REP_PRIVATE_DATA`] in an
    /// accept.
    pub private_data: Vec<u8>,
    /// RDMA READ/atomics this side serves at once (REQ/REP "responder resources";
    /// becomes the peer's `max_rd_atomic` bound and our `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READ/atomics this side issues at once (REQ/REP "initiator depth"; our
    /// `max_rd_atomic`).
    pub initiator_depth: u8,
    /// End-to-end flow control (REQ/REP bit; informational).
    pub flow_control: bool,
    /// Transport retry count (0..=7): the QP's `retry_cnt` (connect only).
    pub retry_count: u8,
    /// RNR retry count (0..=7, 7 = infinite): the QP's `rnr_retry`.
    pub rnr_retry_count: u8,
    /// The QP receives from an SRQ (REQ/REP "SRQ" bit).
    pub srq: bool,
}

/// What a CONNECT_REQUEST / ESTABLISHED / REJECTED / DISCONNECTED event tells about the
/// peer (`rdma_cm_event.param.conn`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnEventParam {
    /// The peer's private data: for a REQ, the bytes after the IP CM header; for a
    /// REP/REJ/DREQ, all of the MAD's private data field (which is zero-padded to its
    /// fixed size on the wire: the length is the field's, as in librdmacm).
    pub private_data: Vec<u8>,
    /// The peer's responder resources (REQ/REP).
    pub responder_resources: u8,
    /// The peer's initiator depth (REQ/REP).
    pub initiator_depth: u8,
    /// The peer's flow control bit.
    pub flow_control: bool,
    /// The peer's retry count (REQ).
    pub retry_count: u8,
    /// The peer's RNR retry count (REQ/REP).
    pub rnr_retry_count: u8,
    /// The peer's SRQ bit.
    pub srq: bool,
    /// The peer's QP number (REQ "local QPN" / REP "local QPN").
    pub qp_num: u32,
    /// The peer's starting PSN (REQ "starting PSN" / REP "starting PSN"): the first
    /// PSN our QP expects.
    pub psn: u32,
}

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
/// [`EventChannel::fd`] is an eventfd that is readable while events are pending, so it
/// works with `poll(2)`/`epoll` (what rping's `rpoll` and ucmatose do). The NICs write
/// it when they queue an event; [`EventChannel::get_event`] fetches them over the
/// control socket. `Send + Sync`: one thread may wait for events while others connect.
#[derive(Debug, Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug)]
struct ChannelInner {
    /// The eventfd the NICs signal (sent to each NIC when the first id binds to it).
    eventfd: OwnedFd,
    /// Per-NIC state: events fetched but not yet returned, NIC handles → keys.
    _state: Mutex<()>,
}

impl EventChannel {
    /// `rdma_create_event_channel`: a channel, not yet tied to any NIC.
    pub fn new() -> Result<EventChannel> {
        let eventfd = os::eventfd().map_err(io("creating the CM event channel's eventfd"))?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                eventfd,
                _state: Mutex::new(()),
            }),
        })
    }

    /// The fd to `poll(2)` for POLLIN: readable while an event is pending.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.eventfd.as_fd()
    }

    /// Sets or clears `O_NONBLOCK` on [`EventChannel::fd`], what librdmacm programs
    /// do with `fcntl(channel->fd, F_SETFL, O_NONBLOCK)` (either way works: the flag
    /// lives on the fd). With it, [`EventChannel::get_event`] fails with an
    /// [`Error::Io`] of kind `WouldBlock` (`EAGAIN`) instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let _ = nonblocking;
        Err(not_yet("rdma_event_channel nonblocking"))
    }

    /// `rdma_get_cm_event`: the oldest pending event; waits for one unless the fd has
    /// `O_NONBLOCK`.
    pub fn get_event(&self) -> Result<CmEvent> {
        Err(not_yet("rdma_get_cm_event"))
    }

    /// The oldest pending event, or `None` at once.
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        Err(not_yet("rdma_get_cm_event"))
    }

    /// Waits at most `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        let _ = timeout;
        Err(not_yet("rdma_get_cm_event"))
    }
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
#[derive(Debug)]
pub struct CmId {
    key: CmIdKey,
    ps: PortSpace,
    _channel: EventChannel,
    ctx: Option<Context>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

impl CmId {
    /// `rdma_create_id(channel, &id, context, ps)`: a new id, not bound to a NIC.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let _ = (channel, ps);
        Err(not_yet("rdma_create_id"))
    }

    /// The key naming this id in [`CmEvent`]s.
    pub fn key(&self) -> CmIdKey {
        self.key
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// The NIC this id is bound to (`id->verbs`), once bound or resolved.
    pub fn context(&self) -> Option<&Context> {
        self.ctx.as_ref()
    }

    /// Local address (`rdma_get_local_addr`), once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// Peer address (`rdma_get_peer_addr`), once resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// `rdma_bind_addr`: binds to the NIC serving `addr.ip()` ([`find_device`]) and to
    /// `addr.port()` in this id's port space (0 = an ephemeral port the NIC picks).
    /// Fails with `AddrInUse` if another id of that NIC holds the port.
    pub fn bind_addr(&mut self, addr: SocketAddr) -> Result<()> {
        let _ = addr;
        Err(not_yet("rdma_bind_addr"))
    }

    /// `rdma_resolve_addr`: binds (if not yet) to the NIC serving `src` (or, with no
    /// `src`, the NIC whose address is on `dst`'s side: the first NIC on loopback) and
    /// records `dst` as the peer. Raises ADDR_RESOLVED (or ADDR_ERROR) on the channel.
    /// `dst.port()` is the peer's CM port; the peer NIC is reached at `dst.ip()`,
    /// UDP port 4791 unless `peer_udp_port` says otherwise (several NICs on one host).
    pub fn resolve_addr(
        &mut self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        peer_udp_port: Option<u16>,
        timeout: Duration,
    ) -> Result<()> {
        let _ = (src, dst, peer_udp_port, timeout);
        Err(not_yet("rdma_resolve_addr"))
    }

    /// `rdma_resolve_route`: raises ROUTE_RESOLVED (RoCE needs no path record query:
    /// the path is the peer's GID and the NIC's MTU).
    pub fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        let _ = timeout;
        Err(not_yet("rdma_resolve_route"))
    }

    /// `rdma_listen`: REQs for this id's service ID ([`service_id`] of the bound port)
    /// become CONNECT_REQUEST events, at most `backlog` not yet accepted or rejected
    /// at once; further REQs are left unanswered so that the active side retries (as
    /// Linux's CM does when a listener's backlog is full). Needs a prior
    /// [`CmId::bind_addr`].
    pub fn listen(&mut self, backlog: u32) -> Result<()> {
        let _ = backlog;
        Err(not_yet("rdma_listen"))
    }

    /// RESET → INIT for a QP of this id's NIC with the attributes the CM uses, as
    /// `rdma_create_qp` does: RC gets REMOTE_READ | REMOTE_WRITE | LOCAL_WRITE; UD
    /// gets [`RDMA_UDP_QKEY`].
    pub fn init_qp(&self, qp: &mut QueuePair) -> Result<()> {
        let _ = qp;
        Err(not_yet("rdma_create_qp"))
    }

    /// `rdma_init_qp_attr`: the attributes the CM uses to move this id's QP to
    /// `state` (INIT, RTR or RTS), from what it negotiated so far.
    pub fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        let _ = state;
        Err(not_yet("rdma_init_qp_attr"))
    }

    /// `rdma_connect` (RC): sends a REQ for the peer's service ID carrying `qp`'s
    /// number and a random starting PSN, the IP CM header and `param`'s private data
    /// (≤ [`MAX_REQ_PRIVATE_DATA`]). `qp` must be an RC QP of this id's NIC in RESET or
    /// INIT. Outcome: ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&mut self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        let _ = (qp, param);
        Err(not_yet("rdma_connect"))
    }

    /// `rdma_accept` (on a CONNECT_REQUEST's id): moves `qp` to RTR and RTS against
    /// the requester and sends the REP; ESTABLISHED follows when the RTU arrives.
    pub fn accept(&mut self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        let _ = (qp, param);
        Err(not_yet("rdma_accept"))
    }

    /// `rdma_reject`: answers a CONNECT_REQUEST with a REJ, reason 28 (consumer
    /// reject), carrying `private_data` (≤ [`MAX_REJ_PRIVATE_DATA`]).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        let _ = private_data;
        Err(not_yet("rdma_reject"))
    }

    /// `rdma_establish`: no-op kept for librdmacm's API (softnic's CM sends the RTU
    /// itself when the REP arrives).
    pub fn establish(&mut self) -> Result<()> {
        Ok(())
    }

    /// `rdma_disconnect`: sends a DREQ (or answers one with a DREP) and moves the QP
    /// to ERR; DISCONNECTED follows.
    pub fn disconnect(&mut self) -> Result<()> {
        Err(not_yet("rdma_disconnect"))
    }
}

fn not_yet(what: &'static str) -> Error {
    Error::Io {
        what,
        source: std::io::Error::from(std::io::ErrorKind::Unsupported),
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
