//! The NIC's objects — clients, protection domains, memory regions, completion queues,
//! queue pairs — and the control requests that create and destroy them.
//!
//! Only the data-plane thread touches this (`runtime.rs`): control requests arrive over
//! a channel and are executed between packet batches, so the hot path takes no lock.
//! Handles (PD, MR, CQ) and QPNs are global, and every request is checked against the
//! requesting client: a client can name only its own objects. When a client goes away
//! [`Nic::remove_client`] destroys everything it created and unmaps its segments.

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
    layout, QpLayout, RecvWqe, Ring, SendWqe, ABI_VERSION, MAX_INLINE, MAX_RING_ENTRIES, MAX_SGE,
};

use super::counters::NicCounters;
use super::cq::CompletionQueue;
use super::gid;
use super::memory::{KeyMap, MrTable, MAX_MR_PER_CLIENT, MAX_MR_SIZE};
use super::rings::QpEntry;

/// Most QPs per client.
pub const MAX_QP_PER_CLIENT: usize = 4096;
/// Most CQs per client.
pub const MAX_CQ_PER_CLIENT: usize = 4096;
/// Most PDs per client.
pub const MAX_PD_PER_CLIENT: usize = 4096;
/// Most outstanding READ/atomic requests per QP offered.
pub const MAX_QP_RD_ATOM: u32 = 16;

/// A connected client.
#[derive(Debug)]
pub struct Client {
    /// Process id it gave.
    pub pid: u32,
    /// Program name it gave.
    pub program: String,
    /// The eventfd it writes when it posts while the NIC sleeps (NEED_WAKEUP).
    pub wake: OwnedFd,
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
}

/// All NIC objects.
#[derive(Debug)]
pub struct Nic {
    /// Identity.
    pub info: NicInfo,
    /// Clients that sent OpenDevice.
    pub clients: KeyMap<Client>,
    /// PD handle → owning client.
    pds: KeyMap<u32>,
    /// Memory regions.
    pub mrs: MrTable,
    /// Completion queues.
    pub cqs: KeyMap<CompletionQueue>,
    /// Queue pairs by QPN.
    pub qps: KeyMap<QpEntry>,
    next_handle: u32,
    next_qpn: u32,
    /// Counters of QPs already destroyed.
    pub retired: QpCounters,
}

type Answer = (Response, Vec<OwnedFd>);

fn err(code: ErrorCode, message: impl Into<String>) -> Answer {
    (
        Response::Err {
            code,
            message: message.into(),
        },
        Vec::new(),
    )
}

fn ok(r: Reply) -> Answer {
    (Response::Ok(r), Vec::new())
}

/// First QPN handed out (rxe starts at 0x11 too; 0 and 1 are the special QPs).
const FIRST_QPN: u32 = 0x11;

fn to_transport_type(t: QpType) -> tqp::QpType {
    match t {
        QpType::Rc => tqp::QpType::Rc,
        QpType::Uc => tqp::QpType::Uc,
        QpType::Ud => tqp::QpType::Ud,
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
    /// A NIC with no objects.
    pub fn new(info: NicInfo) -> Self {
        Nic {
            info,
            clients: KeyMap::default(),
            pds: KeyMap::default(),
            mrs: MrTable::default(),
            cqs: KeyMap::default(),
            qps: KeyMap::default(),
            next_handle: 1,
            next_qpn: FIRST_QPN,
            retired: QpCounters::default(),
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
            max_qp: MAX_QP_PER_CLIENT as u32,
            max_qp_wr: MAX_RING_ENTRIES,
            max_sge: MAX_SGE as u32,
            max_cqe: MAX_RING_ENTRIES,
            max_inline: MAX_INLINE as u32,
            max_mr: MAX_MR_PER_CLIENT as u32,
            max_mr_size: MAX_MR_SIZE,
            max_qp_rd_atom: MAX_QP_RD_ATOM,
            max_msg_sz: tqp::MAX_MSG_SZ,
        }
    }

    fn handle(&mut self) -> Handle {
        let h = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        h
    }

    fn qpn(&mut self) -> Option<u32> {
        // Bounded: at most 2^24 candidates, and far fewer QPs exist.
        for _ in 0..(1u32 << 24) {
            let q = self.next_qpn;
            self.next_qpn = (self.next_qpn + 1) & wire::types::MASK_24;
            if self.next_qpn < FIRST_QPN {
                self.next_qpn = FIRST_QPN;
            }
            if !self.qps.contains_key(&q) {
                return Some(q);
            }
        }
        None
    }

    /// Totals of every QP's counters, live and destroyed.
    pub fn qp_totals(&self) -> QpCounters {
        let mut t = self.retired;
        for e in self.qps.values() {
            t.add(e.qp.counters());
        }
        t
    }

    /// Executes one control request of `client`. `fds` are the descriptors that came
    /// with it; the answer carries descriptors to send back.
    pub fn request(
        &mut self,
        now: Instant,
        client: u32,
        req: Request,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        counters.control_requests += 1;
        let want_fds = matches!(
            req,
            Request::RegMr { .. } | Request::CreateCq { .. } | Request::CreateQp { .. }
        );
        if fds.len() != usize::from(want_fds) {
            return err(
                ErrorCode::Protocol,
                format!(
                    "request {} carries {} descriptors, expected {}",
                    request_name(&req),
                    fds.len(),
                    usize::from(want_fds)
                ),
            );
        }
        let opened = self.clients.contains_key(&client);
        match req {
            Request::OpenDevice {
                abi_version,
                pid,
                program,
            } => self.open(client, abi_version, pid, program, counters),
            Request::QueryDevice => ok(Reply::Device(self.device_attr())),
            Request::Stats => err(
                ErrorCode::Internal,
                "Stats is answered by the runtime, not the object table",
            ),
            _ if !opened => err(
                ErrorCode::InvalidState,
                "OpenDevice must be the first request on a connection",
            ),
            Request::AllocPd => self.alloc_pd(client),
            Request::DeallocPd { pd } => self.dealloc_pd(client, pd),
            Request::RegMr {
                pd,
                len,
                access,
                iova,
            } => self.reg_mr(client, pd, len, access, iova, fds),
            Request::DeregMr { mr } => {
                if self.mrs.deregister(client, mr) {
                    ok(Reply::Done)
                } else {
                    err(ErrorCode::NotFound, format!("no memory region {mr}"))
                }
            }
            Request::CreateCq { depth } => self.create_cq(client, depth, fds),
            Request::DestroyCq { cq } => self.destroy_cq(client, cq),
            Request::CreateQp {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                caps,
            } => self.create_qp(client, pd, qp_type, send_cq, recv_cq, caps, fds),
            Request::ModifyQp { qpn, attr } => self.modify_qp(now, client, qpn, &attr),
            Request::QueryQp { qpn } => match self.qps.get(&qpn).filter(|e| e.client == client) {
                Some(e) => ok(Reply::QpInfo {
                    state: from_transport_state(e.qp.state()),
                    attr: from_transport_attrs(e.qp.attrs(), e.qp.state()),
                }),
                None => err(ErrorCode::NotFound, format!("no QP {qpn:#x}")),
            },
            Request::DestroyQp { qpn } => {
                if self.qps.get(&qpn).is_some_and(|e| e.client == client) {
                    if let Some(e) = self.qps.remove(&qpn) {
                        self.retired.add(e.qp.counters());
                    }
                    ok(Reply::Done)
                } else {
                    err(ErrorCode::NotFound, format!("no QP {qpn:#x}"))
                }
            }
        }
    }

    fn open(
        &mut self,
        client: u32,
        abi_version: u32,
        pid: u32,
        program: String,
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
        let wake = match verbs_api::os::eventfd() {
            Ok(w) => w,
            Err(e) => return err(ErrorCode::Internal, format!("eventfd: {e}")),
        };
        let dup = match wake.try_clone() {
            Ok(d) => d,
            Err(e) => return err(ErrorCode::Internal, format!("dup: {e}")),
        };
        tracing::info!(client, pid, program = %program, "client opened the device");
        counters.clients_opened += 1;
        self.clients.insert(client, Client { pid, program, wake });
        (
            Response::Ok(Reply::Opened {
                device: self.device_attr(),
            }),
            vec![dup],
        )
    }

    fn pd_of(&self, client: u32, pd: Handle) -> Result<(), Box<Answer>> {
        if self.pds.get(&pd) == Some(&client) {
            Ok(())
        } else {
            Err(Box::new(err(
                ErrorCode::NotFound,
                format!("no protection domain {pd}"),
            )))
        }
    }

    fn alloc_pd(&mut self, client: u32) -> Answer {
        if self.pds.values().filter(|c| **c == client).count() >= MAX_PD_PER_CLIENT {
            return err(
                ErrorCode::NoResources,
                format!("more than {MAX_PD_PER_CLIENT} PDs"),
            );
        }
        let pd = self.handle();
        self.pds.insert(pd, client);
        ok(Reply::Pd { pd })
    }

    fn dealloc_pd(&mut self, client: u32, pd: Handle) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let mrs = self.mrs.count_for_pd(pd);
        let qps = self.qps.values().filter(|e| e.qp.pd() == pd).count();
        if mrs + qps > 0 {
            return err(
                ErrorCode::Busy,
                format!("protection domain {pd} still has {mrs} memory regions and {qps} QPs"),
            );
        }
        self.pds.remove(&pd);
        ok(Reply::Done)
    }

    fn reg_mr(
        &mut self,
        client: u32,
        pd: Handle,
        len: u64,
        access: u32,
        iova: u64,
        fds: Vec<OwnedFd>,
    ) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let Some(fd) = fds.first() else {
            return err(ErrorCode::Protocol, "RegMr needs the region's memfd");
        };
        let map_len = match usize::try_from(len)
            .ok()
            .and_then(|l| layout::mr_segment_len(l).ok())
        {
            Some(m) => m,
            None => {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("region length {len} too large"),
                )
            }
        };
        if let Err(e) = verbs_api::os::check_shm(fd.as_fd(), map_len) {
            return err(ErrorCode::InvalidArgument, format!("region memfd: {e}"));
        }
        match self
            .mrs
            .register(client, pd, fd.as_fd(), map_len, len, access, iova)
        {
            Ok((mr, lkey, rkey)) => ok(Reply::Mr { mr, lkey, rkey }),
            Err(e) => err(ErrorCode::InvalidArgument, e.to_string()),
        }
    }

    fn create_cq(&mut self, client: u32, depth: u32, fds: Vec<OwnedFd>) -> Answer {
        if self.cqs.values().filter(|c| c.client == client).count() >= MAX_CQ_PER_CLIENT {
            return err(
                ErrorCode::NoResources,
                format!("more than {MAX_CQ_PER_CLIENT} CQs"),
            );
        }
        let Some(fd) = fds.first() else {
            return err(ErrorCode::Protocol, "CreateCq needs the CQ segment memfd");
        };
        let l = match verbs_api::abi::CqLayout::new(depth) {
            Ok(l) => l,
            Err(e) => return err(ErrorCode::InvalidArgument, format!("CQ depth {depth}: {e}")),
        };
        let map = match map_checked(fd, l.len) {
            Ok(m) => m,
            Err(a) => return *a,
        };
        let event = match verbs_api::os::eventfd() {
            Ok(e) => e,
            Err(e) => return err(ErrorCode::Internal, format!("eventfd: {e}")),
        };
        let dup = match event.try_clone() {
            Ok(d) => d,
            Err(e) => return err(ErrorCode::Internal, format!("dup: {e}")),
        };
        let cq = match CompletionQueue::attach(client, map, &l, event) {
            Ok(c) => c,
            Err(e) => return err(ErrorCode::InvalidArgument, format!("CQ segment: {e}")),
        };
        let capacity = cq.capacity();
        let h = self.handle();
        self.cqs.insert(h, cq);
        (Response::Ok(Reply::Cq { cq: h, capacity }), vec![dup])
    }

    fn destroy_cq(&mut self, client: u32, cq: Handle) -> Answer {
        if !self.cqs.get(&cq).is_some_and(|c| c.client == client) {
            return err(ErrorCode::NotFound, format!("no CQ {cq}"));
        }
        let users = self
            .qps
            .values()
            .filter(|e| e.send_cq == cq || e.recv_cq == cq)
            .count();
        if users > 0 {
            return err(ErrorCode::Busy, format!("CQ {cq} is used by {users} QPs"));
        }
        self.cqs.remove(&cq);
        ok(Reply::Done)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_qp(
        &mut self,
        client: u32,
        pd: Handle,
        qp_type: QpType,
        send_cq: Handle,
        recv_cq: Handle,
        caps: QpCaps,
        fds: Vec<OwnedFd>,
    ) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        for cq in [send_cq, recv_cq] {
            if !self.cqs.get(&cq).is_some_and(|c| c.client == client) {
                return err(ErrorCode::NotFound, format!("no CQ {cq}"));
            }
        }
        if self.qps.values().filter(|e| e.client == client).count() >= MAX_QP_PER_CLIENT {
            return err(
                ErrorCode::NoResources,
                format!("more than {MAX_QP_PER_CLIENT} QPs"),
            );
        }
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
        let l = match QpLayout::new(caps.max_send_wr, caps.max_recv_wr) {
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
        let map = match map_checked(fd, l.len) {
            Ok(m) => m,
            Err(a) => return *a,
        };
        let rings = Ring::<SendWqe>::new(map.clone(), l.sq_offset, l.sq_capacity)
            .and_then(|r| r.check_header().map(|()| r))
            .and_then(|sq| {
                Ring::<RecvWqe>::new(map, l.rq_offset, l.rq_capacity)
                    .and_then(|r| r.check_header().map(|()| (sq, r)))
            });
        let (sq, rq) = match rings {
            Ok(v) => v,
            Err(e) => return err(ErrorCode::InvalidArgument, format!("QP segment: {e}")),
        };
        let Some(qpn) = self.qpn() else {
            return err(ErrorCode::NoResources, "no free QP number");
        };
        let granted = QpCaps {
            max_send_wr: l.sq_capacity,
            max_recv_wr: l.rq_capacity,
            max_sge: caps.max_sge,
            max_inline: caps.max_inline,
        };
        let tcaps = tqp::QpCaps {
            max_send_wr: granted.max_send_wr,
            max_recv_wr: granted.max_recv_wr,
            max_sge: granted.max_sge,
            max_inline: granted.max_inline,
        };
        let mut qp = Qp::new(qpn, to_transport_type(qp_type), pd, tcaps);
        qp.set_port_mtu(self.info.mtu);
        qp.set_local_addr(self.info.local);
        qp.set_rxe_compat(self.info.compat);
        let entry = QpEntry::new(
            qp,
            client,
            send_cq,
            recv_cq,
            tcaps,
            sq.into_consumer(),
            rq.into_consumer(),
        );
        self.qps.insert(qpn, entry);
        tracing::debug!(client, qpn, ?qp_type, "QP created");
        ok(Reply::Qp { qpn, caps: granted })
    }

    fn modify_qp(&mut self, now: Instant, client: u32, qpn: u32, attr: &QpAttr) -> Answer {
        let local = self.info.local;
        let mtu = self.info.mtu;
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
        match e.qp.modify(now, &to_transport_attr(attr)) {
            Ok(()) => ok(Reply::Done),
            Err(me @ tqp::ModifyError::Transition(_)) => {
                err(ErrorCode::InvalidState, format!("QP {qpn:#x}: {me}"))
            }
            Err(me) => err(ErrorCode::InvalidArgument, format!("QP {qpn:#x}: {me}")),
        }
    }

    /// Destroys everything `client` created. Returns (QPs, CQs, MRs, PDs) destroyed.
    pub fn remove_client(&mut self, client: u32) -> (usize, usize, usize, usize) {
        let qpns: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, e)| e.client == client)
            .map(|(q, _)| *q)
            .collect();
        for q in &qpns {
            if let Some(e) = self.qps.remove(q) {
                self.retired.add(e.qp.counters());
            }
        }
        let cqs: Vec<u32> = self
            .cqs
            .iter()
            .filter(|(_, c)| c.client == client)
            .map(|(h, _)| *h)
            .collect();
        for h in &cqs {
            self.cqs.remove(h);
        }
        let mrs = self.mrs.remove_client(client);
        let pds: Vec<u32> = self
            .pds
            .iter()
            .filter(|(_, c)| **c == client)
            .map(|(h, _)| *h)
            .collect();
        for h in &pds {
            self.pds.remove(h);
        }
        self.clients.remove(&client);
        (qpns.len(), cqs.len(), mrs, pds.len())
    }
}

fn map_checked(fd: &OwnedFd, len: usize) -> Result<Arc<memmap2::MmapRaw>, Box<Answer>> {
    verbs_api::os::check_shm(fd.as_fd(), len).map_err(|e| {
        Box::new(err(
            ErrorCode::InvalidArgument,
            format!("segment memfd: {e}"),
        ))
    })?;
    verbs_api::os::map_shared(fd.as_fd(), len)
        .map(Arc::new)
        .map_err(|e| {
            Box::new(err(
                ErrorCode::Internal,
                format!("mapping the segment: {e}"),
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
        Request::DeregMr { .. } => "DeregMr",
        Request::CreateCq { .. } => "CreateCq",
        Request::DestroyCq { .. } => "DestroyCq",
        Request::CreateQp { .. } => "CreateQp",
        Request::ModifyQp { .. } => "ModifyQp",
        Request::QueryQp { .. } => "QueryQp",
        Request::DestroyQp { .. } => "DestroyQp",
        Request::Stats => "Stats",
    }
}
