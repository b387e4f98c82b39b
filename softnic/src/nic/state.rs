//! The NIC's objects — clients, protection domains, memory regions, completion queues,
//! queue pairs — and the control requests that create and destroy them.
//!
//! Only the data-plane thread touches this (`runtime.rs`): control requests arrive over
//! a channel and are executed between packet batches, so the hot path takes no lock.
//! Handles (PD, MR, CQ) and QPNs are global, and every request is checked against the
//! requesting client: a client can name only its own objects. When a client goes away
//! [`Nic::remove_client`] destroys everything it created and unmaps its segments.
//!
//! A hostile local client must not be able to starve the data plane, so every request
//! costs O(1) in the number of objects on the NIC (hash lookups; per-PD and per-CQ use
//! counts instead of scans; a per-client index, so a disconnect costs the client's own
//! objects only), objects count against the quotas of the client's *user*
//! ([`super::quota`]), and handles never wrap onto a live object
//! ([`super::handles`]).

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use softnic_transport::memory::Access;
use softnic_transport::qp::{self as tqp, Qp, QpCounters};
use softnic_transport::time::Instant;
use verbs_api::abi::control::{
    DeviceAttr, ErrorCode, Handle, QpAttr, QpCaps, QpState, QpType, Reply, Request, Response,
};
use verbs_api::abi::{
    layout, Doorbell, QpLayout, ABI_VERSION, DOORBELL_SEGMENT_LEN, DOORBELL_SLOTS, MAX_CQ_ENTRIES,
    MAX_INLINE, MAX_RING_ENTRIES, MAX_SGE,
};
use verbs_api::os::WakePipe;

use super::async_events::{self, EventList, EventSource};
use super::counters::NicCounters;
use super::cq::CompletionQueue;
use super::doorbells::{Doorbells, Target};
use super::gid;
use super::handles::HandleAlloc;
use super::mcast::{self, McastTable, MULTICAST_QPN};
use super::memory::{KeyMap, MrTable, RegError, RegKind, Source, MAX_MR_SIZE};
use super::quota::{Kind, Limits, QuotaError, Quotas};
use super::ready::{ActiveSet, Deadlines, Ticket};
use super::rings::QpEntry;
use super::secret;
use super::srq::SrqEntry;
use super::xrc::{XrcTable, XrcTarget};

/// Most outstanding READ/atomic requests per QP offered.
pub const MAX_QP_RD_ATOM: u32 = 16;

/// A connected client.
#[derive(Debug)]
pub struct Client {
    /// Process id it gave.
    pub pid: u32,
    /// User id of the connection's peer (`SO_PEERCRED`): whose quotas it uses.
    pub uid: u32,
    /// Program name it gave.
    pub program: String,
    /// The pipe it writes when it posts while the NIC sleeps (NEED_WAKEUP); it holds
    /// a copy of the write end only, so it cannot make the NIC's drain block.
    pub wake: WakePipe,
    /// Its doorbell page and the slot of each of its rings (`doorbells.rs`).
    pub doorbells: Doorbells,
    /// Its objects with asynchronous events waiting (`async_events.rs`).
    pub events: EventList,
    /// What it created.
    owned: Owned,
}

/// The objects of one client, with the bytes each maps (given back to its user's quota
/// when the object goes): the index that makes a disconnect cost the client's own
/// objects, not a scan of every table.
#[derive(Debug, Default)]
pub(super) struct Owned {
    pds: KeyMap<()>,
    cqs: KeyMap<u64>,
    pub(super) qps: KeyMap<u64>,
    mrs: KeyMap<u64>,
    /// Shared receive queues (`srq.rs`).
    pub(super) srqs: KeyMap<()>,
    /// Opens of XRC domains (`xrc.rs`).
    pub(super) xrcds: KeyMap<()>,
}

/// A protection domain.
#[derive(Debug)]
struct PdEntry {
    client: u32,
    /// Memory regions and QPs in it (it cannot be deallocated while any is).
    users: u32,
}

/// What the NIC is (fixed at start).
#[derive(Debug, Clone)]
pub struct NicInfo {
    /// Device name.
    pub name: String,
    /// Bound UDP endpoint.
    pub local: SocketAddr,
    /// Largest path MTU.
    pub mtu: u32,
    /// Opt-in rxe deviations applied to every QP.
    pub compat: tqp::RxeCompat,
    /// Retransmission timing of every RC QP (adaptive unless `--strict-ack-timeout`).
    pub ack_timer: tqp::AckTimer,
}

/// All NIC objects.
#[derive(Debug)]
pub struct Nic {
    /// Identity.
    pub info: NicInfo,
    /// Clients that sent OpenDevice.
    pub clients: KeyMap<Client>,
    /// Protection domains.
    pds: KeyMap<PdEntry>,
    /// Memory regions.
    pub mrs: MrTable,
    /// Completion queues.
    pub cqs: KeyMap<CompletionQueue>,
    /// Queue pairs by QPN. Boxed, so that the table itself is small (16 bytes a QP, in
    /// cache even with 10,000 QPs) and a look-up finds a QP's address without touching
    /// its state, which the loop then prefetches for a whole batch at once
    /// (`QpEntry::prefetch`). Inline, each look-up stalled on the cold entry's key
    /// before the next could start (docs/perf.md, session 16).
    pub qps: KeyMap<Box<QpEntry>>,
    /// How many of `qps` are UD: while there are none, the socket does not report the
    /// TOS and TTL a UD receive's GRH needs (`UdpIo::report_ip_fields`).
    pub ud_qps: usize,
    /// Shared receive queues by handle (`srq.rs`).
    pub srqs: KeyMap<SrqEntry>,
    /// Counters of SRQs already destroyed.
    pub retired_srqs: softnic_transport::srq::SrqCounters,
    /// PD and CQ handles (one space, so a PD and a CQ never share a number).
    handles: HandleAlloc,
    /// Per-user quotas.
    pub(crate) quotas: Quotas,
    /// Counters of QPs already destroyed.
    pub retired: QpCounters,
    /// The connection manager on QP1 (`cm/`).
    pub cm: super::cm::NicCm,
    /// QPs the loop visits this iteration (`ready.rs`).
    pub active: ActiveSet,
    /// QP timers (`ready.rs`).
    pub deadlines: Deadlines,
    /// Serial of the next QP (its active-set ticket).
    next_serial: u64,
    /// The RTT estimate of each peer NIC, shared by the QPs connected to it.
    peer_rtts: super::peers::PeerRtts,
    /// Which UD QPs are attached to which multicast groups (`mcast.rs`).
    pub mcast: McastTable,
    /// XRC domains, their opens and the XRC SRQ numbers (`xrc.rs`).
    pub xrc: XrcTable,
}

pub(super) type Answer = (Response, Vec<OwnedFd>);

pub(super) fn err(code: ErrorCode, message: impl Into<String>) -> Answer {
    (
        Response::Err {
            code,
            message: message.into(),
        },
        Vec::new(),
    )
}

pub(super) fn ok(r: Reply) -> Answer {
    (Response::Ok(r), Vec::new())
}

/// The answer to a request over quota (counted under its kind). The client gets the
/// reason, but a stock program turns it into ENOMEM and "Unable to create QP", so the
/// NIC's log says it too, naming the `softnic run` flag that raises the limit: at the
/// 1st, 2nd, 4th, 8th … refusal of each kind, so that a client looping on refusals
/// cannot flood the log.
pub(crate) fn refuse(e: QuotaError, counters: &mut NicCounters) -> Answer {
    let n = match e {
        QuotaError::Objects { .. } => &mut counters.control_refused_quota_objects,
        QuotaError::Bytes { .. } => &mut counters.control_refused_quota_bytes,
    };
    *n += 1;
    if n.is_power_of_two() {
        tracing::warn!(refusals = *n, "refused over quota: {e}");
    }
    err(ErrorCode::NoResources, e.to_string())
}

/// QPN 0 (SMI) and 1 (GSI) are the special QPs (IBTA 10.2.5); never handed out.
const RESERVED_QPNS: u32 = 2;

fn to_transport_type(t: QpType) -> tqp::QpType {
    match t {
        QpType::Rc => tqp::QpType::Rc,
        QpType::Uc => tqp::QpType::Uc,
        QpType::Ud => tqp::QpType::Ud,
        QpType::XrcSend => tqp::QpType::XrcSend,
        QpType::XrcRecv => tqp::QpType::XrcRecv,
    }
}

fn to_transport_state(s: QpState) -> tqp::QpState {
    match s {
        QpState::Reset => tqp::QpState::Reset,
        QpState::Init => tqp::QpState::Init,
        QpState::Rtr => tqp::QpState::Rtr,
        QpState::Rts => tqp::QpState::Rts,
        QpState::Sqd => tqp::QpState::Sqd,
        QpState::Sqe => tqp::QpState::Sqe,
        QpState::Err => tqp::QpState::Err,
    }
}

fn from_transport_state(s: tqp::QpState) -> QpState {
    match s {
        tqp::QpState::Reset => QpState::Reset,
        tqp::QpState::Init => QpState::Init,
        tqp::QpState::Rtr => QpState::Rtr,
        tqp::QpState::Rts => QpState::Rts,
        tqp::QpState::Sqd => QpState::Sqd,
        tqp::QpState::Sqe => QpState::Sqe,
        tqp::QpState::Err => QpState::Err,
    }
}

fn to_transport_attr(a: &QpAttr) -> tqp::QpAttr {
    tqp::QpAttr {
        state: a.state.map(to_transport_state),
        path_mtu: a.path_mtu,
        dest_qpn: a.dest_qpn,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        remote: a.remote,
        traffic_class: a.traffic_class,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        access: a.access.map(Access),
        qkey: a.qkey,
        pkey_index: a.pkey_index,
        port_num: a.port_num,
    }
}

fn from_transport_attrs(a: &tqp::Attrs, s: tqp::QpState) -> QpAttr {
    QpAttr {
        state: Some(from_transport_state(s)),
        path_mtu: Some(a.path_mtu),
        dest_qpn: Some(a.dest_qpn),
        rq_psn: Some(a.rq_psn),
        sq_psn: Some(a.sq_psn),
        remote: a.remote,
        traffic_class: a.traffic_class,
        timeout: Some(a.timeout),
        retry_cnt: Some(a.retry_cnt),
        rnr_retry: Some(a.rnr_retry),
        min_rnr_timer: Some(a.min_rnr_timer),
        max_rd_atomic: Some(a.max_rd_atomic),
        max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
        access: Some(a.access.0),
        qkey: Some(a.qkey),
        pkey_index: Some(a.pkey_index),
        port_num: Some(a.port_num),
    }
}

impl Nic {
    /// A NIC with no objects, whose users may each hold up to `limits`.
    pub fn new(info: NicInfo, limits: Limits) -> Self {
        let guid = verbs_api::gid::node_guid(info.local);
        let cm = super::cm::NicCm::new(info.local, guid, info.mtu);
        Nic {
            cm,
            info,
            clients: KeyMap::default(),
            pds: KeyMap::default(),
            mrs: MrTable::default(),
            cqs: KeyMap::default(),
            qps: KeyMap::default(),
            ud_qps: 0,
            srqs: KeyMap::default(),
            retired_srqs: Default::default(),
            handles: HandleAlloc::new(),
            quotas: Quotas::new(limits),
            retired: QpCounters::default(),
            active: ActiveSet::default(),
            deadlines: Deadlines::default(),
            next_serial: 0,
            peer_rtts: Default::default(),
            mcast: McastTable::default(),
            xrc: XrcTable::default(),
        }
    }

    /// Device attributes.
    pub fn device_attr(&self) -> DeviceAttr {
        DeviceAttr {
            name: self.info.name.clone(),
            gid: gid::gid_of(self.info.local.ip()),
            addr: self.info.local.ip(),
            port: self.info.local.port(),
            mtu: self.info.mtu,
            max_qp: self.quotas.limits().qps,
            max_qp_wr: MAX_RING_ENTRIES,
            max_sge: MAX_SGE as u32,
            max_cqe: MAX_CQ_ENTRIES,
            max_inline: MAX_INLINE as u32,
            max_mr: self.quotas.limits().mrs,
            max_mr_size: MAX_MR_SIZE,
            max_qp_rd_atom: MAX_QP_RD_ATOM,
            max_msg_sz: tqp::MAX_MSG_SZ,
        }
    }

    /// A PD, CQ, SRQ or XRC domain handle that no live one of them holds.
    pub(super) fn handle(&mut self) -> Option<Handle> {
        let (pds, cqs, srqs, xrc) = (&self.pds, &self.cqs, &self.srqs, &self.xrc);
        self.handles.alloc(|h| {
            pds.contains_key(&h) || cqs.contains_key(&h) || srqs.contains_key(&h) || xrc.is_open(h)
        })
    }

    /// Takes one SRQ of `bytes` mapped for `uid`: an SRQ counts as a queue pair
    /// against the per-user QP quota, and its ring as mapped bytes.
    pub(super) fn take_srq_quota(
        &mut self,
        uid: u32,
        bytes: u64,
        counters: &mut NicCounters,
    ) -> Result<(), Box<Answer>> {
        self.quotas
            .take(uid, Kind::Qp, bytes)
            .map_err(|e| Box::new(refuse(e, counters)))
    }

    /// Gives back what [`Nic::take_srq_quota`] took.
    pub(super) fn give_srq_quota(&mut self, uid: u32, bytes: u64) {
        self.quotas.give_back(uid, Kind::Qp, bytes);
    }

    /// The user of an opened client (0 for none: callers check `opened` first).
    pub(super) fn uid_of(&self, client: u32) -> u32 {
        self.clients.get(&client).map_or(0, |c| c.uid)
    }

    pub(super) fn owned(&mut self, client: u32) -> Option<&mut Owned> {
        self.clients.get_mut(&client).map(|c| &mut c.owned)
    }

    /// A fresh QPN: 24 random bits from the OS generator ([`super::secret`]), not
    /// reserved and not in use. Random rather than sequential so that an off-path host
    /// cannot guess the QPN of a new connection from an old one (ReDMArk's QPN
    /// guessing); together with the PSN that makes 48 bits to guess for an injection.
    fn qpn(&self) -> Result<u32, secret::DrawError> {
        secret::draw_where(wire::types::MASK_24, |q| {
            q >= RESERVED_QPNS && q != MULTICAST_QPN && !self.qps.contains_key(&q)
        })
    }

    /// Totals of every QP's counters, live and destroyed.
    pub fn qp_totals(&self) -> QpCounters {
        let mut t = self.retired;
        for e in self.qps.values() {
            t.add(e.qp.counters());
        }
        t
    }

    /// Executes one control request of `client`, a connection of user `uid`. `fds` are
    /// the descriptors that came with it; the answer carries descriptors to send back.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &mut self,
        now: Instant,
        client: u32,
        uid: u32,
        req: Request,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        counters.control_requests += 1;
        let want_fds = matches!(
            req,
            Request::OpenDevice { .. }
                | Request::RegMr { .. }
                | Request::RegMrCopy { .. }
                | Request::CreateCq { .. }
                | Request::CreateQp { .. }
                | Request::CreateSrq { .. }
                | Request::ResizeCq { .. }
                | Request::Cm(verbs_api::abi::control::cm::CmRequest::AttachChannel)
        );
        let want = match &req {
            // One memfd when a segment names it, none when every page is shared.
            Request::RegMrWindow { segments, .. } => {
                usize::from(segments.iter().any(|s| s.share.is_none()))
            }
            _ => usize::from(want_fds),
        };
        if fds.len() != want {
            return err(
                ErrorCode::Protocol,
                format!(
                    "request {} carries {} descriptors, expected {}",
                    request_name(&req),
                    fds.len(),
                    want
                ),
            );
        }
        let opened = self.clients.contains_key(&client);
        match req {
            Request::OpenDevice {
                abi_version,
                pid,
                program,
            } => self.open(client, uid, abi_version, (pid, program), &fds, counters),
            Request::QueryDevice => ok(Reply::Device(self.device_attr())),
            Request::Stats => err(
                ErrorCode::Internal,
                "Stats is answered by the runtime, not the object table",
            ),
            _ if !opened => err(
                ErrorCode::InvalidState,
                "OpenDevice must be the first request on a connection",
            ),
            Request::AllocPd => self.alloc_pd(client, counters),
            Request::DeallocPd { pd } => self.dealloc_pd(client, pd),
            Request::RegMr { .. }
            | Request::RegMrWindow { .. }
            | Request::RegMrSysv { .. }
            | Request::RegMrCopy { .. } => match RegKind::split(req) {
                Some((pd, len, access, at)) => {
                    self.reg_mr(client, pd, len, access, at, fds, counters)
                }
                None => err(ErrorCode::Internal, "not a registration"),
            },
            Request::DeregMr { mr } => {
                if self.dereg_mr(client, mr) {
                    ok(Reply::Done)
                } else {
                    err(ErrorCode::NotFound, format!("no memory region {mr}"))
                }
            }
            Request::ReregMr { mr, pd, access } => self.rereg_mr(client, mr, pd, access),
            Request::CreateCq { depth } => self.create_cq(client, depth, fds, counters),
            Request::DestroyCq { cq } => self.destroy_cq(client, cq),
            Request::CreateQp {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                caps,
                srq,
                xrcd,
            } => {
                let spec = QpSpec {
                    client,
                    pd,
                    qp_type,
                    send_cq,
                    recv_cq,
                    caps,
                    srq,
                    xrcd,
                };
                self.create_qp(&spec, fds, counters)
            }
            Request::CreateSrq { pd, attr, xrc } => {
                self.create_srq(client, pd, (attr, xrc), fds, counters)
            }
            Request::OpenXrcd {
                inode,
                create,
                exclusive,
            } => self.open_xrcd(client, inode, (create, exclusive), counters),
            Request::CloseXrcd { xrcd } => self.close_xrcd(client, xrcd),
            Request::ModifySrq {
                srq,
                max_wr,
                srq_limit,
            } => self.modify_srq(client, srq, max_wr, srq_limit),
            Request::QuerySrq { srq } => self.query_srq(client, srq),
            Request::DestroySrq { srq } => self.destroy_srq(client, srq),
            Request::GetAsyncEvents => self.async_events(client, counters),
            Request::AsyncEventChannel => self.async_event_channel(client),
            Request::AttachMcast { qpn, gid } => self.mcast_request(client, qpn, gid, true),
            Request::DetachMcast { qpn, gid } => self.mcast_request(client, qpn, gid, false),
            Request::Cm(r) => self.cm_request(now, client, r, fds, counters),
            Request::ModifyQp { qpn, attr } => self.modify_qp(now, client, qpn, &attr),
            Request::QueryQp { qpn } => match self.qps.get(&qpn).filter(|e| e.client == client) {
                Some(e) => ok(Reply::QpInfo {
                    state: from_transport_state(e.qp.state()),
                    attr: from_transport_attrs(e.qp.attrs(), e.qp.state()),
                }),
                None => err(ErrorCode::NotFound, format!("no QP {qpn:#x}")),
            },
            Request::DestroyQp { qpn } => {
                if self.destroy_qp(client, qpn) {
                    ok(Reply::Done)
                } else {
                    err(ErrorCode::NotFound, format!("no QP {qpn:#x}"))
                }
            }
            Request::AllocMw { pd, mw_type } => self.alloc_mw(client, pd, mw_type),
            Request::DeallocMw { mw } => self.dealloc_mw(client, mw),
            Request::BindMw {
                qpn,
                mw,
                mr,
                rkey,
                addr,
                len,
                access,
            } => {
                let b = super::mw::Bind {
                    mw,
                    rkey,
                    addr,
                    len,
                    access,
                };
                self.bind_mw(client, qpn, mr, &b)
            }
            Request::InvalidateMw { qpn, rkey } => self.invalidate_mw(client, qpn, rkey),
            Request::ResizeCq { cq, depth } => self.resize_cq(client, cq, depth, fds, counters),
        }
    }

    fn open(
        &mut self,
        client: u32,
        uid: u32,
        abi_version: u32,
        (pid, program): (u32, String),
        fds: &[OwnedFd],
        counters: &mut NicCounters,
    ) -> Answer {
        if abi_version != ABI_VERSION {
            return err(
                ErrorCode::AbiMismatch,
                format!("client ABI version {abi_version}, NIC speaks {ABI_VERSION}"),
            );
        }
        if self.clients.contains_key(&client) {
            return err(
                ErrorCode::InvalidState,
                "device already opened on this connection",
            );
        }
        let Some(fd) = fds.first() else {
            return err(ErrorCode::Protocol, "OpenDevice needs the doorbell memfd");
        };
        let page = match map_checked(fd, DOORBELL_SEGMENT_LEN) {
            Ok(map) => Doorbell::new(map),
            Err(a) => return *a,
        };
        let doorbells = match page {
            Ok(p) => Doorbells::new(p),
            Err(e) => return err(ErrorCode::InvalidArgument, format!("doorbell page: {e}")),
        };
        let wake = match WakePipe::new() {
            Ok(w) => w,
            Err(e) => return err(ErrorCode::Internal, format!("wake pipe: {e}")),
        };
        let writer = match wake.writer() {
            Ok(d) => d,
            Err(e) => return err(ErrorCode::Internal, format!("dup: {e}")),
        };
        // The page whose word the kernel marks when this NIC process exits, so that a
        // client that only polls learns it (`verbs_api::os::life_sign`).
        let life = match verbs_api::os::life_sign().and_then(|l| l.fd().try_clone_to_owned()) {
            Ok(fd) => fd,
            Err(e) => return err(ErrorCode::Internal, format!("life sign: {e}")),
        };
        tracing::info!(client, uid, pid, program = %program, "client opened the device");
        counters.clients_opened += 1;
        self.clients.insert(
            client,
            Client {
                pid,
                uid,
                program,
                wake,
                doorbells,
                events: EventList::default(),
                owned: Owned::default(),
            },
        );
        (
            Response::Ok(Reply::Opened {
                device: self.device_attr(),
            }),
            vec![writer, life],
        )
    }

    pub(super) fn pd_of(&self, client: u32, pd: Handle) -> Result<(), Box<Answer>> {
        if self.pds.get(&pd).is_some_and(|p| p.client == client) {
            Ok(())
        } else {
            Err(Box::new(err(
                ErrorCode::NotFound,
                format!("no protection domain {pd}"),
            )))
        }
    }

    fn alloc_pd(&mut self, client: u32, counters: &mut NicCounters) -> Answer {
        let uid = self.uid_of(client);
        let Some(pd) = self.handle() else {
            return err(ErrorCode::NoResources, "every PD/CQ handle is in use");
        };
        if let Err(e) = self.quotas.take(uid, Kind::Pd, 0) {
            return refuse(e, counters);
        }
        self.pds.insert(pd, PdEntry { client, users: 0 });
        if let Some(o) = self.owned(client) {
            o.pds.insert(pd, ());
        }
        ok(Reply::Pd { pd })
    }

    fn dealloc_pd(&mut self, client: u32, pd: Handle) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let users = self.pds.get(&pd).map_or(0, |p| p.users);
        if users > 0 {
            return err(
                ErrorCode::Busy,
                format!("protection domain {pd} still has {users} memory regions, QPs and SRQs"),
            );
        }
        self.pds.remove(&pd);
        if let Some(o) = self.owned(client) {
            o.pds.remove(&pd);
        }
        let uid = self.uid_of(client);
        self.quotas.give_back(uid, Kind::Pd, 0);
        ok(Reply::Done)
    }

    /// One more (`+1`) or one fewer (`-1`) MR or QP in `pd`.
    pub(super) fn pd_use(&mut self, pd: Handle, more: bool) {
        if let Some(p) = self.pds.get_mut(&pd) {
            p.users = if more {
                p.users.saturating_add(1)
            } else {
                p.users.saturating_sub(1)
            };
        }
    }

    /// `RegMr`, `RegMrWindow`, `RegMrSysv` and `RegMrCopy`: `at` is (iova, offset in
    /// the mapping, what the request names besides `fds`).
    #[allow(clippy::too_many_arguments)]
    fn reg_mr(
        &mut self,
        client: u32,
        pd: Handle,
        len: u64,
        access: u32,
        at: (u64, u64, RegKind),
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        let (iova, offset, kind) = at;
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let fd = fds.first();
        // A window is charged for the pages it maps (shared ones too, as if it mapped
        // them itself); a plain region for its memfd's pages from offset 0. A copied
        // region maps nothing (each access is a read or write of the client's
        // `/proc/<pid>/mem`), so it is charged one page whatever its length: an
        // on-demand region may span the client's whole address space.
        let pages = match &kind {
            RegKind::Window(segs) => segs
                .iter()
                .try_fold(0u64, |a, s| a.checked_add(s.len))
                .and_then(|l| usize::try_from(l).ok()),
            RegKind::Memfd | RegKind::Sysv(_) => offset
                .checked_add(len)
                .and_then(|l| usize::try_from(l).ok()),
            RegKind::Copy => Some(1),
        };
        let map_len = match pages.and_then(|l| layout::mr_segment_len(l).ok()) {
            Some(m) => m,
            None => {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("region length {len} at offset {offset} too large"),
                )
            }
        };
        if len > MAX_MR_SIZE && kind != RegKind::Copy {
            // An argument error whatever the quota (MrTable::register checks it too).
            return err(
                ErrorCode::InvalidArgument,
                format!("region length {len} exceeds the largest region ({MAX_MR_SIZE} bytes)"),
            );
        }
        // The quota before the memfd: a refused request costs no fstat and no mmap. A
        // window onto a shared mapping is charged as if it mapped its pages itself.
        let uid = self.uid_of(client);
        let bytes = map_len as u64;
        if let Err(e) = self.quotas.take(uid, Kind::Mr, bytes) {
            return refuse(e, counters);
        }
        let source = match (&kind, fd) {
            (RegKind::Window(segs), fd) => Ok(Source::Pieces(fd.map(|f| f.as_fd()), segs)),
            (RegKind::Memfd, Some(fd)) => verbs_api::os::check_shm(fd.as_fd(), map_len)
                .map(|()| Source::Memfd(fd.as_fd(), map_len))
                .map_err(|e| RegError::BadRange(format!("region memfd: {e}"))),
            (RegKind::Sysv(shmid), _) => Ok(Source::Sysv { shmid: *shmid, uid }),
            (RegKind::Copy, Some(fd)) => Ok(Source::Copy(fd.as_fd())),
            (RegKind::Memfd | RegKind::Copy, None) => Err(RegError::BadRange(
                "the registration needs its descriptor".into(),
            )),
        };
        let registered = source
            .and_then(|src| {
                self.mrs
                    .register_window(client, pd, src, offset, len, access, iova)
            })
            .map_err(|e| match e {
                RegError::NoKey(_) | RegError::NoHandle => err(ErrorCode::Internal, e.to_string()),
                _ => err(ErrorCode::InvalidArgument, e.to_string()),
            });
        match registered {
            Ok((mr, lkey, rkey)) => {
                self.pd_use(pd, true);
                if let Some(o) = self.owned(client) {
                    o.mrs.insert(mr, bytes);
                }
                ok(Reply::Mr { mr, lkey, rkey })
            }
            Err(a) => {
                self.quotas.give_back(uid, Kind::Mr, bytes);
                a
            }
        }
    }

    /// `ReregMr`: `client`'s region `mr` moves to its PD `pd` and/or takes `access`,
    /// keeping its mapping and keys (so its quota charge stands).
    fn rereg_mr(
        &mut self,
        client: u32,
        mr: Handle,
        pd: Option<Handle>,
        access: Option<u32>,
    ) -> Answer {
        if let Some(pd) = pd {
            if let Err(a) = self.pd_of(client, pd) {
                return *a;
            }
        }
        let access = match access.map(super::memory::check_access).transpose() {
            Ok(a) => a,
            Err(e) => return err(ErrorCode::InvalidArgument, e.to_string()),
        };
        let Some(old) = self.mrs.rereg(client, mr, pd, access) else {
            return err(ErrorCode::NotFound, format!("no memory region {mr}"));
        };
        if let Some(new) = pd.filter(|&p| p != old) {
            self.pd_use(old, false);
            self.pd_use(new, true);
        }
        ok(Reply::Done)
    }

    fn dereg_mr(&mut self, client: u32, mr: Handle) -> bool {
        let Some(r) = self.mrs.deregister(client, mr) else {
            return false;
        };
        self.pd_use(r.pd, false);
        let bytes = self.owned(client).and_then(|o| o.mrs.remove(&mr));
        let uid = self.uid_of(client);
        self.quotas
            .give_back(uid, Kind::Mr, bytes.unwrap_or(r.map_len));
        true
    }

    fn create_cq(
        &mut self,
        client: u32,
        depth: u32,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        let (fd, l, uid, bytes) = match self.charge_cq_segment(client, depth, &fds, counters) {
            Ok(c) => c,
            Err(a) => return *a,
        };
        match self.attach_cq(client, fd, &l) {
            Ok((cq, capacity, dup)) => {
                if let Some(o) = self.owned(client) {
                    o.cqs.insert(cq, bytes);
                }
                (Response::Ok(Reply::Cq { cq, capacity }), vec![dup])
            }
            Err(a) => {
                self.quotas.give_back(uid, Kind::Cq, bytes);
                *a
            }
        }
    }

    /// Maps and attaches a CQ segment; returns (handle, capacity, the event fd to send).
    fn attach_cq(
        &mut self,
        client: u32,
        fd: &OwnedFd,
        l: &verbs_api::abi::CqLayout,
    ) -> Result<(Handle, u32, OwnedFd), Box<Answer>> {
        let boxed = |code, m: String| Box::new(err(code, m));
        let map = map_checked(fd, l.len)?;
        let event = verbs_api::os::SignalPipe::new()
            .map_err(|e| boxed(ErrorCode::Internal, format!("CQ event pipe: {e}")))?;
        let dup = event
            .reader()
            .map_err(|e| boxed(ErrorCode::Internal, format!("dup: {e}")))?;
        let page = self
            .clients
            .get(&client)
            .map(|c| c.doorbells.page().clone())
            .ok_or_else(|| boxed(ErrorCode::NotFound, format!("no client {client}")))?;
        let cq = CompletionQueue::attach(client, map, l, event, page)
            .map_err(|e| boxed(ErrorCode::InvalidArgument, format!("CQ segment: {e}")))?;
        let capacity = cq.capacity();
        let h = self.handle().ok_or_else(|| {
            boxed(
                ErrorCode::NoResources,
                "every PD/CQ handle is in use".into(),
            )
        })?;
        self.cqs.insert(h, cq);
        Ok((h, capacity, dup))
    }

    /// `ResizeCq`: charges the new segment, moves the CQ onto it
    /// ([`CompletionQueue::replace_ring`]), then gives back the old one's bytes.
    fn resize_cq(
        &mut self,
        client: u32,
        cq: Handle,
        depth: u32,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        if self.cqs.get(&cq).is_none_or(|c| c.client != client) {
            return err(ErrorCode::NotFound, format!("no CQ {cq}"));
        }
        let busy = self
            .qps
            .values_mut()
            .filter(|e| e.send_cq == cq || e.recv_cq == cq)
            .any(|e| e.sends_in_flight());
        if busy {
            return err(
                ErrorCode::Busy,
                format!("CQ {cq}: completions of posted sends are still being made"),
            );
        }
        let (fd, l, uid, bytes) = match self.charge_cq_segment(client, depth, &fds, counters) {
            Ok(c) => c,
            Err(a) => return *a,
        };
        let replaced = map_checked(fd, l.len).and_then(|map| {
            let c = self.cqs.get_mut(&cq).expect("checked above");
            c.replace_ring(map, &l, depth)
                .map_err(|m| Box::new(err(ErrorCode::InvalidArgument, format!("CQ {cq}: {m}"))))
        });
        match replaced {
            Ok(()) => {
                let old = self
                    .owned(client)
                    .and_then(|o| o.cqs.insert(cq, bytes))
                    .unwrap_or(0);
                self.quotas.give_back(uid, Kind::Cq, old);
                ok(Reply::Cq {
                    cq,
                    capacity: l.capacity,
                })
            }
            Err(a) => {
                self.quotas.give_back(uid, Kind::Cq, bytes);
                *a
            }
        }
    }

    /// The CQ segment memfd of a CreateCq / ResizeCq, its layout for `depth`, and its
    /// bytes charged to the client's user: (memfd, layout, uid, bytes).
    fn charge_cq_segment<'f>(
        &mut self,
        client: u32,
        depth: u32,
        fds: &'f [OwnedFd],
        counters: &mut NicCounters,
    ) -> Result<(&'f OwnedFd, verbs_api::abi::CqLayout, u32, u64), Box<Answer>> {
        let Some(fd) = fds.first() else {
            return Err(Box::new(err(
                ErrorCode::Protocol,
                "the request needs the CQ segment memfd",
            )));
        };
        let l = verbs_api::abi::CqLayout::new(depth).map_err(|e| {
            Box::new(err(
                ErrorCode::InvalidArgument,
                format!("CQ depth {depth}: {e}"),
            ))
        })?;
        let uid = self.uid_of(client);
        let bytes = l.len as u64;
        if let Err(e) = self.quotas.take(uid, Kind::Cq, bytes) {
            return Err(Box::new(refuse(e, counters)));
        }
        Ok((fd, l, uid, bytes))
    }

    fn destroy_cq(&mut self, client: u32, cq: Handle) -> Answer {
        let Some(c) = self.cqs.get(&cq).filter(|c| c.client == client) else {
            return err(ErrorCode::NotFound, format!("no CQ {cq}"));
        };
        if c.qp_users > 0 {
            return err(
                ErrorCode::Busy,
                format!("CQ {cq} is used by {} QPs and XRC SRQs", c.qp_users),
            );
        }
        self.cqs.remove(&cq);
        let bytes = self.owned(client).and_then(|o| o.cqs.remove(&cq));
        let uid = self.uid_of(client);
        self.quotas.give_back(uid, Kind::Cq, bytes.unwrap_or(0));
        ok(Reply::Done)
    }

    /// One more or one fewer QP or XRC SRQ completing into `cq`.
    pub(super) fn cq_use(&mut self, cq: Handle, more: bool) {
        if let Some(c) = self.cqs.get_mut(&cq) {
            c.qp_users = if more {
                c.qp_users.saturating_add(1)
            } else {
                c.qp_users.saturating_sub(1)
            };
        }
    }

    fn create_qp(
        &mut self,
        spec: &QpSpec,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        let QpSpec {
            client,
            qp_type,
            caps,
            ..
        } = *spec;
        let holds = match self.check_qp_objects(spec) {
            Ok(h) => h,
            Err(a) => return *a,
        };
        if caps.max_sge as usize > MAX_SGE {
            return err(
                ErrorCode::InvalidArgument,
                format!("max_sge {} exceeds {MAX_SGE}", caps.max_sge),
            );
        }
        if caps.max_inline as usize > MAX_INLINE {
            return err(
                ErrorCode::InvalidArgument,
                format!("max_inline {} exceeds {MAX_INLINE}", caps.max_inline),
            );
        }
        let Some(fd) = fds.first() else {
            return err(ErrorCode::Protocol, "CreateQp needs the QP segment memfd");
        };
        let l = match QpLayout::new(caps.max_send_wr, caps.max_recv_wr, caps.sq_shape(qp_type)) {
            Ok(l) => l,
            Err(e) => {
                return err(
                    ErrorCode::InvalidArgument,
                    format!(
                        "max_send_wr {} / max_recv_wr {}: {e}",
                        caps.max_send_wr, caps.max_recv_wr
                    ),
                )
            }
        };
        let uid = self.uid_of(client);
        let bytes = l.len as u64;
        if let Err(e) = self.quotas.take(uid, Kind::Qp, bytes) {
            return refuse(e, counters);
        }
        match self.attach_qp(spec, &holds, fd, &l) {
            Ok((qpn, granted)) => {
                self.hold(&holds, true);
                if let Some(o) = self.owned(client) {
                    o.qps.insert(qpn, bytes);
                }
                tracing::debug!(client, qpn, ?qp_type, "QP created");
                let doorbell = self.qps.get(&qpn).map_or(0, |e| e.doorbell);
                ok(Reply::Qp {
                    qpn,
                    caps: granted,
                    doorbell,
                })
            }
            Err(a) => {
                self.quotas.give_back(uid, Kind::Qp, bytes);
                *a
            }
        }
    }

    /// The objects a CreateQp names, checked for its QP type: what the QP will hold.
    /// An RC, UC or UD QP has a PD, two CQs and maybe an SRQ; an XRC send QP a PD and a
    /// send CQ (its `recv_cq` is ignored, as the kernel ignores it for
    /// IB_QPT_XRC_INI: it has no receive queue); an XRC receive QP only its domain
    /// (`xrc.rs`). No other type names a domain.
    fn check_qp_objects(&self, spec: &QpSpec) -> Result<Holds, Box<Answer>> {
        let QpSpec {
            client,
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            xrcd,
            ..
        } = *spec;
        if qp_type == QpType::XrcRecv {
            return self.check_xrc_recv_qp(spec).map(|xrc| Holds {
                xrc: Some(xrc),
                ..Holds::default()
            });
        }
        if xrcd.is_some() {
            return Err(Box::new(err(
                ErrorCode::InvalidArgument,
                "only an XRC receive QP is created in an XRC domain",
            )));
        }
        self.pd_of(client, pd)?;
        if let Some(h) = srq {
            if qp_type == QpType::XrcSend {
                return Err(Box::new(err(
                    ErrorCode::InvalidArgument,
                    "an XRC send QP has no receive queue, so no SRQ",
                )));
            }
            self.srq_for_qp(client, pd, h)?;
        }
        self.cq_of_client(client, send_cq)?;
        let recv_cq = if qp_type == QpType::XrcSend {
            0
        } else {
            self.cq_of_client(client, recv_cq)?;
            recv_cq
        };
        Ok(Holds {
            pd,
            send_cq,
            recv_cq,
            srq,
            xrc: None,
        })
    }

    /// Whether `cq` is a CQ of `client`, or the refusal.
    fn cq_of_client(&self, client: u32, cq: Handle) -> Result<(), Box<Answer>> {
        if self.cqs.get(&cq).is_some_and(|c| c.client == client) {
            Ok(())
        } else {
            Err(Box::new(err(ErrorCode::NotFound, format!("no CQ {cq}"))))
        }
    }

    /// Takes (`more`) or gives back the uses a QP holds.
    fn hold(&mut self, h: &Holds, more: bool) {
        self.pd_use(h.pd, more);
        self.cq_use(h.send_cq, more);
        self.cq_use(h.recv_cq, more);
        if let Some(s) = h.srq {
            self.srq_use(s, more);
        }
        if let Some(x) = h.xrc {
            self.xrc.open_use(x.open, more);
        }
    }

    /// Maps and attaches a QP segment and makes the QP; returns its QPN and caps.
    fn attach_qp(
        &mut self,
        spec: &QpSpec,
        holds: &Holds,
        fd: &OwnedFd,
        l: &QpLayout,
    ) -> Result<(u32, QpCaps), Box<Answer>> {
        let QpSpec {
            client,
            pd,
            qp_type,
            caps,
            srq,
            ..
        } = *spec;
        let map = map_checked(fd, l.len)?;
        let rings = l.rings(map).and_then(|(sq, rq)| {
            sq.check_header()?;
            rq.check_header()?;
            Ok((sq, rq))
        });
        let (sq, rq) = rings
            .map_err(|e| Box::new(err(ErrorCode::InvalidArgument, format!("QP segment: {e}"))))?;
        let qpn = self.qpn().map_err(|e| {
            let code = match e {
                secret::DrawError::Exhausted => ErrorCode::NoResources,
                secret::DrawError::NoEntropy(_) => ErrorCode::Internal,
            };
            Box::new(err(code, format!("no QP number: {e}")))
        })?;
        let granted = QpCaps {
            max_send_wr: l.sq_capacity,
            max_recv_wr: l.rq_capacity,
            max_sge: caps.max_sge,
            // At least what was asked; the stride has room for more (`inline_capacity`).
            max_inline: caps.sq_shape(qp_type).inline_capacity(),
        };
        let tcaps = tqp::QpCaps {
            max_send_wr: granted.max_send_wr,
            max_recv_wr: granted.max_recv_wr,
            max_sge: granted.max_sge,
            max_inline: granted.max_inline,
        };
        let doorbell = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.doorbells.assign(Target::Qp(qpn)))
            .ok_or_else(|| {
                Box::new(err(
                    ErrorCode::NoResources,
                    format!("every one of the {DOORBELL_SLOTS} doorbell slots of this connection is in use"),
                ))
            })?;
        let mut qp = match (srq, qp_type) {
            (_, QpType::XrcRecv) => Qp::new_xrc_recv(qpn, tcaps),
            (Some(h), _) => Qp::new_with_srq(qpn, to_transport_type(qp_type), pd, tcaps, h),
            (None, _) => Qp::new(qpn, to_transport_type(qp_type), pd, tcaps),
        };
        qp.set_port_mtu(self.info.mtu);
        qp.set_local_addr(self.info.local);
        qp.set_rxe_compat(self.info.compat);
        qp.set_ack_timer(self.info.ack_timer);
        self.next_serial += 1;
        let mut entry = QpEntry::new(
            qp,
            client,
            holds.send_cq,
            holds.recv_cq,
            tcaps,
            sq.into_consumer(),
            rq.into_consumer(),
        );
        entry.xrc = holds.xrc;
        entry.ticket = Ticket::new(self.next_serial);
        entry.doorbell = doorbell;
        entry.page = self
            .clients
            .get(&client)
            .map(|c| c.doorbells.page().clone());
        self.ud_qps += usize::from(qp_type == QpType::Ud);
        self.qps.insert(qpn, Box::new(entry));
        Ok((qpn, granted))
    }

    /// Destroys QP `qpn` if `client` owns it.
    fn destroy_qp(&mut self, client: u32, qpn: u32) -> bool {
        if self.qps.get(&qpn).is_none_or(|e| e.client != client) {
            return false;
        }
        let Some(e) = self.qps.remove(&qpn) else {
            return false;
        };
        if e.qp.qp_type() == tqp::QpType::Ud {
            self.ud_qps = self.ud_qps.saturating_sub(1);
        }
        self.retired.add(e.qp.counters());
        self.mcast.forget_qp(qpn);
        self.mrs.windows.qp_destroyed(qpn);
        // Its active-set item (if any) is stale from now on; its timer and slot go.
        self.deadlines.remove(qpn);
        if let Some(c) = self.clients.get_mut(&client) {
            c.doorbells.release(e.doorbell);
            c.events.forget(EventSource::Qp(qpn));
        }
        self.hold(&Holds::of(&e), false);
        let bytes = self.owned(client).and_then(|o| o.qps.remove(&qpn));
        let uid = self.uid_of(client);
        self.quotas.give_back(uid, Kind::Qp, bytes.unwrap_or(0));
        true
    }

    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast` of the client's QP `qpn`
    /// and the group `gid` (`mcast.rs`).
    fn mcast_request(&mut self, client: u32, qpn: u32, gid: [u8; 16], attach: bool) -> Answer {
        let Some(e) = self.qps.get(&qpn).filter(|e| e.client == client) else {
            return err(ErrorCode::NotFound, format!("no QP {qpn:#x}"));
        };
        if e.qp.qp_type() != tqp::QpType::Ud {
            return err(
                ErrorCode::InvalidArgument,
                "only UD QPs attach to multicast groups",
            );
        }
        let Some(group) = mcast::group_of(gid, self.info.local) else {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "GID {} is not a multicast group of this NIC's address family",
                    std::net::Ipv6Addr::from(gid)
                ),
            );
        };
        let done = if attach {
            self.mcast.attach(group, qpn)
        } else {
            self.mcast.detach(group, qpn)
        };
        match done {
            Ok(()) => ok(Reply::Done),
            Err(mcast::McastError::NotAttached) => err(
                ErrorCode::InvalidArgument,
                format!("QP {qpn:#x} is not attached to {group}"),
            ),
            Err(e) => err(ErrorCode::NoResources, format!("{e:?}")),
        }
    }

    pub(super) fn modify_qp(
        &mut self,
        now: Instant,
        client: u32,
        qpn: u32,
        attr: &QpAttr,
    ) -> Answer {
        let local = self.info.local;
        let mtu = self.info.mtu;
        let peer = attr.remote.map(|r| self.peer_rtts.get(r));
        let Some(e) = self.qps.get_mut(&qpn).filter(|e| e.client == client) else {
            return err(ErrorCode::NotFound, format!("no QP {qpn:#x}"));
        };
        if let Some(r) = attr.remote {
            if !gid::reachable(local, r) {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("QP {qpn:#x}: remote {r} is not reachable from this NIC at {local} (IP family)"),
                );
            }
        }
        if let Some(m) = attr.path_mtu {
            if m > mtu {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("QP {qpn:#x}: path_mtu {m} exceeds the port's active MTU {mtu}"),
                );
            }
        }
        if let Some(a) = attr.max_rd_atomic.max(attr.max_dest_rd_atomic) {
            if u32::from(a) > MAX_QP_RD_ATOM {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("QP {qpn:#x}: max_rd_atomic/max_dest_rd_atomic {a} exceeds {MAX_QP_RD_ATOM}"),
                );
            }
        }
        // A state change can give the QP work (flushes, a first send): visit it.
        self.active.mark(qpn, &mut e.ticket);
        let modified = e.qp.modify(now, &to_transport_attr(attr));
        // A move to ERR may raise an event: listed now, so the next request sees it.
        async_events::note_qp(e, &mut self.clients);
        match modified {
            Ok(()) => {
                if let Some(p) = peer {
                    e.qp.set_peer_rtt(p);
                }
                if e.qp.state() == tqp::QpState::Reset {
                    e.reset();
                }
                ok(Reply::Done)
            }
            Err(me @ tqp::ModifyError::Transition(_)) => {
                err(ErrorCode::InvalidState, format!("QP {qpn:#x}: {me}"))
            }
            Err(me) => err(ErrorCode::InvalidArgument, format!("QP {qpn:#x}: {me}")),
        }
    }

    /// Destroys everything `client` created, in dependency order (QPs, then CQs and
    /// MRs, then PDs), and forgets the client. Returns (QPs, CQs, MRs, PDs) destroyed.
    /// Costs the client's own objects, through its index.
    pub fn remove_client(&mut self, client: u32) -> (usize, usize, usize, usize) {
        let Some(o) = self.clients.get(&client).map(|c| &c.owned) else {
            return (0, 0, 0, 0);
        };
        let qps: Vec<u32> = o.qps.keys().copied().collect();
        let cqs: Vec<u32> = o.cqs.keys().copied().collect();
        let mrs: Vec<u32> = o.mrs.keys().copied().collect();
        let pds: Vec<u32> = o.pds.keys().copied().collect();
        // Its CM ids first (a connected one sends its DREQ), then the QPs they bound.
        self.cm_remove_client(Instant::ZERO, client);
        for &q in &qps {
            self.destroy_qp(client, q);
        }
        let srqs: Vec<u32> = self
            .clients
            .get(&client)
            .map(|c| c.owned.srqs.keys().copied().collect())
            .unwrap_or_default();
        for &h in &srqs {
            self.remove_srq(h);
        }
        // After its XRC SRQs and QPs, which hold them.
        let xrcds: Vec<u32> = self
            .clients
            .get(&client)
            .map(|c| c.owned.xrcds.keys().copied().collect())
            .unwrap_or_default();
        for &h in &xrcds {
            self.drop_xrcd(client, h);
        }
        for &h in &cqs {
            self.destroy_cq(client, h);
        }
        self.mrs.windows.remove_client(client);
        for &h in &mrs {
            self.dereg_mr(client, h);
        }
        for &h in &pds {
            self.dealloc_pd(client, h);
        }
        self.clients.remove(&client);
        (qps.len(), cqs.len(), mrs.len(), pds.len())
    }
}

/// What a CreateQp asks for, once checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct QpSpec {
    pub(super) client: u32,
    pub(super) pd: Handle,
    pub(super) qp_type: QpType,
    pub(super) send_cq: Handle,
    pub(super) recv_cq: Handle,
    pub(super) caps: QpCaps,
    /// The SRQ it receives from.
    pub(super) srq: Option<Handle>,
    /// The XRC domain (open) of an XRC receive QP.
    pub(super) xrcd: Option<Handle>,
}

/// What a QP holds a use of, so that none of it goes while the QP lives (0: none; no
/// PD or CQ has handle 0, so taking or giving back its use does nothing).
#[derive(Debug, Clone, Copy, Default)]
struct Holds {
    pd: Handle,
    send_cq: Handle,
    recv_cq: Handle,
    srq: Option<Handle>,
    xrc: Option<XrcTarget>,
}

impl Holds {
    /// What live QP `e` holds. Not read from its transport state for an XRC receive
    /// QP: its PD and SRQ there are those of the last XRC SRQ a request used.
    fn of(e: &QpEntry) -> Holds {
        let plain = e.xrc.is_none();
        Holds {
            pd: if plain { e.qp.pd() } else { 0 },
            send_cq: e.send_cq,
            recv_cq: e.recv_cq,
            srq: e.qp.srq().filter(|_| plain),
            xrc: e.xrc,
        }
    }
}

pub(super) fn map_checked(fd: &OwnedFd, len: usize) -> Result<Arc<memmap2::MmapRaw>, Box<Answer>> {
    // map_peer_shm checks the memfd, maps it and seals it so that no access can fault.
    verbs_api::os::map_peer_shm(fd.as_fd(), len)
        .map(Arc::new)
        .map_err(|e| {
            Box::new(err(
                ErrorCode::InvalidArgument,
                format!("segment memfd: {e}"),
            ))
        })
}

/// A request's name, for messages.
pub fn request_name(r: &Request) -> &'static str {
    match r {
        Request::OpenDevice { .. } => "OpenDevice",
        Request::QueryDevice => "QueryDevice",
        Request::AllocPd => "AllocPd",
        Request::DeallocPd { .. } => "DeallocPd",
        Request::RegMr { .. } => "RegMr",
        Request::RegMrWindow { .. } => "RegMrWindow",
        Request::RegMrSysv { .. } => "RegMrSysv",
        Request::RegMrCopy { .. } => "RegMrCopy",
        Request::DeregMr { .. } => "DeregMr",
        Request::ReregMr { .. } => "ReregMr",
        Request::CreateCq { .. } => "CreateCq",
        Request::OpenXrcd { .. } => "OpenXrcd",
        Request::CloseXrcd { .. } => "CloseXrcd",
        Request::DestroyCq { .. } => "DestroyCq",
        Request::CreateQp { .. } => "CreateQp",
        Request::ModifyQp { .. } => "ModifyQp",
        Request::QueryQp { .. } => "QueryQp",
        Request::DestroyQp { .. } => "DestroyQp",
        Request::Stats => "Stats",
        Request::CreateSrq { .. } => "CreateSrq",
        Request::ModifySrq { .. } => "ModifySrq",
        Request::QuerySrq { .. } => "QuerySrq",
        Request::DestroySrq { .. } => "DestroySrq",
        Request::GetAsyncEvents => "GetAsyncEvents",
        Request::Cm(_) => "Cm",
        Request::AllocMw { .. } => "AllocMw",
        Request::DeallocMw { .. } => "DeallocMw",
        Request::BindMw { .. } => "BindMw",
        Request::InvalidateMw { .. } => "InvalidateMw",
        Request::ResizeCq { .. } => "ResizeCq",
        Request::AsyncEventChannel => "AsyncEventChannel",
        Request::AttachMcast { .. } => "AttachMcast",
        Request::DetachMcast { .. } => "DetachMcast",
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::quota;
    use super::*;

    use std::sync::Arc;
    use verbs_api::abi::{CqLayout, Cqe};

    /// A QP segment for CreateQp: `max_send_wr`, `max_recv_wr`, one gather entry, no
    /// inline data, RC; both rings initialised.
    pub(crate) fn test_qp_fd(max_send_wr: u32, max_recv_wr: u32) -> OwnedFd {
        let shape = verbs_api::abi::SqShape {
            max_sge: 1,
            max_inline: 0,
            ud: false,
        };
        let l = QpLayout::new(max_send_wr, max_recv_wr, shape).unwrap();
        let fd = verbs_api::os::memfd("qp", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let (sq, rq) = l.rings(map).unwrap();
        sq.init();
        rq.init();
        fd
    }

    const UID: u32 = 1000;

    fn nic(limits: Limits) -> (Nic, NicCounters) {
        let info = NicInfo {
            name: "t".into(),
            local: "127.0.0.1:4791".parse().unwrap(),
            mtu: 4096,
            compat: tqp::RxeCompat::default(),
            ack_timer: Default::default(),
        };
        (Nic::new(info, limits), NicCounters::default())
    }

    fn call(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<Reply, (ErrorCode, String)> {
        match nic.request(Instant::ZERO, client, UID, req, fds, c).0 {
            Response::Ok(r) => Ok(r),
            Response::Err { code, message } => Err((code, message)),
        }
    }

    pub(in super::super) fn doorbell_fd() -> OwnedFd {
        verbs_api::os::memfd("db", DOORBELL_SEGMENT_LEN).unwrap()
    }

    fn cq_fd() -> OwnedFd {
        let l = CqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("cq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        verbs_api::abi::Ring::<Cqe>::new(map, l.offset, l.capacity)
            .unwrap()
            .init();
        fd
    }

    /// PD, CQ, QP and MR of `client`; returns (pd, cq, qpn, mr).
    fn objects(nic: &mut Nic, c: &mut NicCounters, client: u32) -> (u32, u32, u32, u32) {
        let open = Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: 1,
            program: "t".into(),
        };
        call(nic, c, client, open, vec![doorbell_fd()]).unwrap();
        let Ok(Reply::Pd { pd }) = call(nic, c, client, Request::AllocPd, vec![]) else {
            panic!()
        };
        let Ok(Reply::Cq { cq, .. }) = call(
            nic,
            c,
            client,
            Request::CreateCq { depth: 8 },
            vec![cq_fd()],
        ) else {
            panic!()
        };
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_sge: 1,
            max_inline: 0,
        };
        let req = Request::CreateQp {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            caps,
            srq: None,
            xrcd: None,
        };
        let Ok(Reply::Qp { qpn, .. }) = call(nic, c, client, req, vec![test_qp_fd(4, 4)]) else {
            panic!()
        };
        let fd = verbs_api::os::memfd("mr", 4096).unwrap();
        let req = Request::RegMr {
            pd,
            len: 4096,
            access: 1,
            iova: 0,
        };
        let Ok(Reply::Mr { mr, .. }) = call(nic, c, client, req, vec![fd]) else {
            panic!()
        };
        (pd, cq, qpn, mr)
    }

    #[test]
    fn use_counts_quotas_and_disconnect_stay_consistent() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq, qpn, mr) = objects(&mut nic, &mut c, 1);
        let (pd2, ..) = objects(&mut nic, &mut c, 2);
        // In use: refused as Busy, in O(1).
        let e = call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]).unwrap_err();
        assert_eq!(e.0, ErrorCode::Busy, "{e:?}");
        let e = call(&mut nic, &mut c, 1, Request::DestroyCq { cq }, vec![]).unwrap_err();
        assert_eq!(e.0, ErrorCode::Busy, "{e:?}");
        // Another client's objects cannot be named.
        let e = call(&mut nic, &mut c, 1, Request::DeallocPd { pd: pd2 }, vec![]).unwrap_err();
        assert_eq!(e.0, ErrorCode::NotFound);
        // Both clients are one user: the quota counts both.
        let u = nic.quotas.usage(UID);
        assert_eq!((u.pds, u.cqs, u.qps, u.mrs), (2, 2, 2, 2));
        // Tear down in order; each use count falls to zero.
        call(&mut nic, &mut c, 1, Request::DestroyQp { qpn }, vec![]).unwrap();
        call(&mut nic, &mut c, 1, Request::DestroyCq { cq }, vec![]).unwrap();
        let e = call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]).unwrap_err();
        assert_eq!(e.0, ErrorCode::Busy, "the region is still in the PD");
        call(&mut nic, &mut c, 1, Request::DeregMr { mr }, vec![]).unwrap();
        call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]).unwrap();
        // Client 2 goes away with everything: the user holds nothing any more.
        assert_eq!(nic.remove_client(2), (1, 1, 1, 1));
        assert_eq!(nic.quotas.usage(UID), quota::Usage::default());
        assert!(nic.qps.is_empty() && nic.cqs.is_empty() && nic.mrs.is_empty());
        assert!(nic.pds.is_empty());
    }

    #[test]
    fn quotas_are_per_user_across_clients_and_counted() {
        let (mut nic, mut c) = nic(Limits {
            pds: 3,
            ..Limits::default()
        });
        objects(&mut nic, &mut c, 1);
        objects(&mut nic, &mut c, 2);
        call(&mut nic, &mut c, 2, Request::AllocPd, vec![]).unwrap();
        let e = call(&mut nic, &mut c, 1, Request::AllocPd, vec![]).unwrap_err();
        assert_eq!(e.0, ErrorCode::NoResources);
        assert!(e.1.contains("--max-pds-per-user 3"), "{e:?}");
        assert_eq!(c.control_refused_quota_objects, 1);
        nic.remove_client(2);
        call(&mut nic, &mut c, 1, Request::AllocPd, vec![]).unwrap();
    }
}
