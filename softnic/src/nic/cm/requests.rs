//! The CM control requests (`verbs_api::abi::control::cm`): checked against the
//! client's own objects, then handed to the CM.

use std::os::fd::OwnedFd;

use softnic_transport::cm::{CmState, CmTransport, ConnParams, Route};
use softnic_transport::qp as tqp;
use softnic_transport::time::Instant;
use verbs_api::abi::control::cm::{CmConnParam, CmReply, CmRequest};
use verbs_api::abi::control::{ErrorCode, Handle, QpAttr, QpState, QpType, Reply, Response};
use verbs_api::os::SignalPipe;
use wire::cm::{
    ip_service_id, CmaHeader, CMA_HEADER_LEN, REQ_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN,
};

use super::events::Channel;
use super::IdOwner;
use crate::nic::counters::NicCounters;
use crate::nic::quota::Kind;
use crate::nic::rings::QpEntry;
use crate::nic::state::{err, ok, refuse, Answer, Nic, MAX_QP_RD_ATOM};

/// `RDMA_PS_TCP`: RC connections.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// `RDMA_PS_IB`: connections of the id's QP type (`rdma_create_id`'s, RC by default;
/// softnic serves RC and XRC there), found by the same IP addresses and ports.
pub const RDMA_PS_IB: u16 = 0x013F;
pub use super::events::RDMA_PS_UDP;
/// The Q_Key of UD QPs set up through the CM (`RDMA_UDP_QKEY`, Linux `cma.c`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC`: what the CM
/// gives a QP it moves to INIT (Linux `cma_init_conn_qp` with responder resources).
pub const CM_QP_ACCESS: u32 = 1 | 2 | 4 | 8;

/// Most connection requests one listener holds unanswered (`rdma_listen`'s backlog is
/// clamped to it): each is an id the NIC makes for a REQ from the network, so a client's
/// huge backlog must not let remote peers grow the NIC's tables without bound. The ids a
/// client makes itself count against `--max-cm-ids-per-user`.
pub const MAX_CM_BACKLOG: u32 = 4096;

/// An error answer, boxed (it is large).
fn fail(code: ErrorCode, message: impl Into<String>) -> Box<Answer> {
    Box::new(err(code, message))
}

fn cm_err(e: softnic_transport::cm::CmError) -> Box<Answer> {
    use softnic_transport::cm::CmError as E;
    let code = match e {
        E::NoSuchId => ErrorCode::NotFound,
        E::InvalidState(_) => ErrorCode::InvalidState,
        E::AddressInUse | E::QpInUse => ErrorCode::Busy,
        E::PrivateDataTooLong | E::WrongTransport => ErrorCode::InvalidArgument,
    };
    fail(code, format!("rdma_cm: {e:?}"))
}

/// The transport a listener of port space `ps` whose id has QP type `qp_type` takes
/// REQs for: RC, or in `RDMA_PS_IB` XRC for an XRC target's id (Linux's rdma_cm takes
/// a REQ for the listening id's QP type only). `None` for `RDMA_PS_UDP`, whose
/// listener answers SIDR REQs.
fn listen_transport(ps: u16, qp_type: QpType) -> Result<Option<CmTransport>, Box<Answer>> {
    match (ps, qp_type) {
        (RDMA_PS_UDP, QpType::Ud) => Ok(None),
        (RDMA_PS_TCP | RDMA_PS_IB, QpType::Rc) => Ok(Some(CmTransport::Rc)),
        (RDMA_PS_IB, QpType::XrcRecv) => Ok(Some(CmTransport::Xrc)),
        _ => Err(fail(
            ErrorCode::InvalidArgument,
            format!("rdma_listen: a {qp_type:?} id in port space {ps:#06x} is not served"),
        )),
    }
}

/// The transport of a connection an id of port space `ps` and QP type `qp_type`
/// makes (`rdma_connect`): RC, or in `RDMA_PS_IB` XRC for an XRC initiator's id, as
/// Linux's CM puts the id's QP type in its REQ (`cma_connect_ib`).
fn id_transport(ps: u16, qp_type: QpType) -> Result<CmTransport, Box<Answer>> {
    match (ps, qp_type) {
        (RDMA_PS_TCP | RDMA_PS_IB, QpType::Rc) => Ok(CmTransport::Rc),
        (RDMA_PS_IB, QpType::XrcSend) => Ok(CmTransport::Xrc),
        _ => Err(fail(
            ErrorCode::InvalidArgument,
            format!("rdma_connect: a {qp_type:?} id in port space {ps:#06x} is not served"),
        )),
    }
}

fn done() -> Answer {
    ok(Reply::Done)
}

/// A random starting PSN (24 bits): a guessable one lets an off-path forger inject.
pub(super) fn draw_psn() -> u32 {
    crate::nic::secret::u32().unwrap_or(0) & wire::types::MASK_24
}

fn params(
    transport: CmTransport,
    qpn: u32,
    psn: u32,
    p: CmConnParam,
    private_data: Vec<u8>,
) -> ConnParams {
    let clamp = |v: u8| v.min(MAX_QP_RD_ATOM as u8);
    ConnParams {
        transport,
        qpn,
        psn,
        responder_resources: clamp(p.responder_resources),
        initiator_depth: clamp(p.initiator_depth),
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        flow_control: p.flow_control,
        srq: p.srq,
        private_data,
    }
}

impl super::NicCm {
    /// The port `port` of `ps` for `id` to bind or listen on (`rdma_bind_addr`,
    /// `rdma_listen`): 0 draws a free ephemeral one, except that an id which reserved a
    /// port at bind keeps it; a port another id holds is `Busy` (EADDRINUSE).
    fn take_port(&mut self, id: Handle, ps: u16, port: u16) -> Result<u16, Box<Answer>> {
        if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB {
            return Err(fail(
                ErrorCode::InvalidArgument,
                format!("rdma_cm port space {ps:#06x} is not served (TCP, UDP and IB only)"),
            ));
        }
        let own = self.ids.get(&id).and_then(|o| o.bound);
        match port {
            0 => match own {
                Some((p_ps, p)) if p_ps == ps => Ok(p),
                _ => self
                    .ephemeral_port(ps)
                    .ok_or_else(|| fail(ErrorCode::NoResources, "no free port")),
            },
            p => match self.ports.get(&(ps, p)) {
                Some(&holder) if holder != id => {
                    Err(fail(ErrorCode::Busy, format!("port {p} is in use")))
                }
                _ => Ok(p),
            },
        }
    }
}

impl Nic {
    /// `id`'s owner record, if `id` belongs to `client`.
    fn cm_owned(&mut self, client: u32, id: Handle) -> Result<&mut IdOwner, Box<Answer>> {
        match self.cm.ids.get_mut(&id) {
            Some(o) if o.client == client => Ok(o),
            _ => Err(fail(ErrorCode::NotFound, format!("no CM id {id}"))),
        }
    }

    /// The client connection owning `qpn`, if that is `client` or another connection
    /// of the same user: a CM id may bind a QP created through another device context
    /// of the same process or user (librdmacm's `id->verbs` is often not the context
    /// the program's ibverbs layer opened), never another user's.
    pub(super) fn cm_qp_client(&self, client: u32, qpn: u32) -> Option<u32> {
        let owner = self.qps.get(&qpn)?.client;
        (owner == client || self.uid_of(owner) == self.uid_of(client)).then_some(owner)
    }

    /// QP `qpn` and its owning connection, if that is `client` or another connection
    /// of its user ([`Nic::cm_qp_client`]); `NotFound` otherwise.
    fn cm_qp(&self, client: u32, qpn: u32) -> Result<(&QpEntry, u32), Box<Answer>> {
        self.cm_qp_client(client, qpn)
            .and_then(|owner| Some((&**self.qps.get(&qpn)?, owner)))
            .ok_or_else(|| fail(ErrorCode::NotFound, format!("no QP {qpn:#x}")))
    }

    /// Checks `qpn` is a QP of type `ty` of `client` (or its user).
    fn cm_qp_of_type(
        &self,
        client: u32,
        qpn: u32,
        ty: tqp::QpType,
        why: &str,
    ) -> Result<(), Box<Answer>> {
        if self.cm_qp(client, qpn)?.0.qp.qp_type() == ty {
            Ok(())
        } else {
            Err(fail(ErrorCode::InvalidArgument, why))
        }
    }

    /// Checks `qpn` is a UD QP of `client` (or its user).
    fn cm_ud_qp(&self, client: u32, qpn: u32) -> Result<(), Box<Answer>> {
        self.cm_qp_of_type(client, qpn, tqp::QpType::Ud, "RDMA_PS_UDP needs a UD QP")
    }

    /// Checks `qpn` is a QP of `client` (or its user) that can carry a connection of
    /// `transport` on the side that connects (`active`) or accepts: an RC QP or this
    /// side's XRC half for RC — Linux's CM sends the REQ of the id's port space and
    /// QP type whatever the QP (libfabric's verbs provider connects XRC QPs through
    /// `RDMA_PS_TCP` ids so), and the transitions are RC's, which an XRC half takes
    /// less what it lacks — and only that XRC half for XRC.
    fn cm_qp_fits(
        &self,
        client: u32,
        qpn: u32,
        transport: CmTransport,
        active: bool,
    ) -> Result<(), Box<Answer>> {
        let (e, _) = self.cm_qp(client, qpn)?;
        let half = if active {
            tqp::QpType::XrcSend
        } else {
            tqp::QpType::XrcRecv
        };
        let t = e.qp.qp_type();
        if t == half || (t == tqp::QpType::Rc && transport == CmTransport::Rc) {
            return Ok(());
        }
        let fits = match transport {
            CmTransport::Rc => format!("an RC or an {half:?} QP"),
            CmTransport::Xrc => format!("an {half:?} QP"),
        };
        Err(fail(
            ErrorCode::InvalidArgument,
            format!("this side of a {transport:?} connection takes {fits}, not a {t:?} QP"),
        ))
    }

    /// Moves `qpn` (checked by [`Nic::cm_qp_fits`]) to INIT if it is in RESET; a QP
    /// in INIT is left alone, any other state refused.
    fn cm_prepare_qp(&mut self, now: Instant, client: u32, qpn: u32) -> Result<(), Box<Answer>> {
        let (e, client) = self.cm_qp(client, qpn)?;
        match e.qp.state() {
            tqp::QpState::Init => Ok(()),
            tqp::QpState::Reset => {
                let attr = QpAttr {
                    state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port_num: Some(1),
                    access: Some(CM_QP_ACCESS),
                    ..QpAttr::default()
                };
                match self.modify_qp(now, client, qpn, &attr) {
                    (verbs_api::abi::control::Response::Ok(_), _) => Ok(()),
                    other => Err(Box::new(other)),
                }
            }
            s => Err(fail(
                ErrorCode::InvalidState,
                format!("QP {qpn:#x} is in {s:?}; rdma_cm needs it in RESET or INIT"),
            )),
        }
    }

    /// Checks `qpn` may carry a connection of `transport` ([`Nic::cm_qp_fits`]); a
    /// QP the CM moves itself is prepared by [`Nic::cm_prepare_qp`], the program's own
    /// QP (`own_qp`: the id's `OwnQp`) is left in whatever state the program put it.
    fn cm_bind_qp(
        &mut self,
        now: Instant,
        client: u32,
        (own_qp, active): (bool, bool),
        qpn: u32,
        transport: CmTransport,
    ) -> Result<(), Box<Answer>> {
        self.cm_qp_fits(client, qpn, transport, active)?;
        if !own_qp {
            self.cm_prepare_qp(now, client, qpn)?;
        }
        Ok(())
    }

    /// Handles one CM request of `client`.
    pub(crate) fn cm_request(
        &mut self,
        now: Instant,
        client: u32,
        req: CmRequest,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        // No CM request uses a descriptor the client sends: one sent (with the refused
        // AttachChannel) is closed here.
        drop(fds);
        match self.cm_request_inner(now, client, req, counters) {
            Ok(a) => a,
            Err(a) => *a,
        }
    }

    fn cm_request_inner(
        &mut self,
        now: Instant,
        client: u32,
        req: CmRequest,
        counters: &mut NicCounters,
    ) -> Result<Answer, Box<Answer>> {
        Ok(match req {
            CmRequest::AttachChannel => {
                return Err(fail(
                    ErrorCode::InvalidArgument,
                    "AttachChannel is refused: the NIC writes no descriptor a client \
                     sent (one made blocking would hold the NIC); use OpenChannel",
                ));
            }
            CmRequest::Bind {
                id,
                port_space,
                port,
            } => {
                if self.cm_owned(client, id)?.bound.is_some() {
                    return Err(fail(ErrorCode::InvalidState, "the id is already bound"));
                }
                let port = self.cm.take_port(id, port_space, port)?;
                self.cm.ports.insert((port_space, port), id);
                if let Some(o) = self.cm.ids.get_mut(&id) {
                    o.bound = Some((port_space, port));
                }
                ok(Reply::Cm(CmReply::Port { port }))
            }
            CmRequest::OpenChannel => {
                let no_pipe = |e| fail(ErrorCode::NoResources, format!("CM event pipe: {e}"));
                let pipe = SignalPipe::new().map_err(no_pipe)?;
                let reader = pipe.reader().map_err(no_pipe)?;
                let h = self.cm.channel_handle();
                self.cm.channels.insert(
                    h,
                    Channel {
                        client,
                        pipe,
                        queue: Default::default(),
                    },
                );
                (
                    Response::Ok(Reply::Cm(CmReply::Channel { channel: h })),
                    vec![reader],
                )
            }
            CmRequest::CreateId { channel } => {
                if self.cm.channels.get(&channel).map(|c| c.client) != Some(client) {
                    return Err(fail(
                        ErrorCode::NotFound,
                        format!("no CM channel {channel}"),
                    ));
                }
                let uid = self.uid_of(client);
                if let Err(e) = self.quotas.take(uid, Kind::CmId, 0) {
                    return Err(Box::new(refuse(e, counters)));
                }
                let id = self.cm.cm.create_id();
                self.cm.ids.insert(
                    id,
                    IdOwner {
                        client,
                        channel,
                        quota_uid: Some(uid),
                        listening: None,
                        listen_qp_type: None,
                        bound: None,
                        own_qp: false,
                        accept_psn: None,
                        ack_timeout: None,
                        tos: 0,
                    },
                );
                ok(Reply::Cm(CmReply::Id { id }))
            }
            CmRequest::DestroyId { id } => {
                self.cm_owned(client, id)?;
                self.cm_destroy_id(now, id);
                done()
            }
            CmRequest::Listen {
                id,
                port_space,
                port,
                backlog,
                qp_type,
            } => {
                self.cm_owned(client, id)?;
                let transport = listen_transport(port_space, qp_type)?;
                let port = self.cm.take_port(id, port_space, port)?;
                self.cm
                    .cm
                    .listen(
                        id,
                        ip_service_id(port_space, port),
                        transport,
                        backlog.min(MAX_CM_BACKLOG),
                    )
                    .map_err(cm_err)?;
                self.cm.ports.insert((port_space, port), id);
                if let Some(o) = self.cm.ids.get_mut(&id) {
                    o.listening = Some((port_space, port));
                    o.listen_qp_type = Some(qp_type);
                }
                ok(Reply::Cm(CmReply::Port { port }))
            }
            CmRequest::Connect {
                id,
                qpn,
                dest,
                port_space,
                dst_port,
                src_port,
                param,
                qp_type,
            } => {
                let (own_qp, tos) = {
                    let o = self.cm_owned(client, id)?;
                    (o.own_qp, o.tos)
                };
                let ud = port_space == RDMA_PS_UDP;
                let room = if ud {
                    SIDR_REQ_PRIVATE_DATA_LEN
                } else {
                    REQ_PRIVATE_DATA_LEN
                } - CMA_HEADER_LEN;
                if param.private_data.len() > room {
                    return Err(fail(
                        ErrorCode::InvalidArgument,
                        format!("connect private data exceeds {room} bytes"),
                    ));
                }
                let local = self.info.local;
                if !crate::nic::gid::reachable(local, dest) {
                    return Err(fail(
                        ErrorCode::InvalidArgument,
                        format!("{dest} is not reachable from {local}"),
                    ));
                }
                let mut pd = vec![0u8; CMA_HEADER_LEN];
                CmaHeader {
                    cma_version: 0,
                    src: local.ip(),
                    dst: dest.ip(),
                    src_port,
                }
                .emit(&mut pd);
                pd.extend_from_slice(&param.private_data);
                let route = Route {
                    dest,
                    local_gid: verbs_api::Gid::from_ip(local.ip()).raw(),
                    remote_gid: verbs_api::Gid::from_ip(dest.ip()).raw(),
                    traffic_class: tos,
                };
                let sid = ip_service_id(port_space, dst_port);
                if ud {
                    // SIDR: the UD QP is the client's to set up; only its owner is checked.
                    self.cm_ud_qp(client, qpn)?;
                    self.cm
                        .cm
                        .sidr_request(now, id, route, sid, &pd)
                        .map_err(cm_err)?;
                    return Ok(done());
                }
                let transport = id_transport(port_space, qp_type)?;
                self.cm_bind_qp(now, client, (own_qp, true), qpn, transport)?;
                let p = params(transport, qpn, draw_psn(), param, pd);
                self.cm.cm.connect(now, id, route, sid, p).map_err(cm_err)?;
                done()
            }
            CmRequest::Accept { id, qpn, param } => {
                let sidr = self.cm.cm.state(id) == Some(CmState::SidrReqRcvd);
                let owner = self.cm_owned(client, id)?;
                if sidr {
                    self.cm_ud_qp(client, qpn)?;
                    let answer = Some((qpn, RDMA_UDP_QKEY));
                    self.cm
                        .cm
                        .sidr_reply(id, answer, &param.private_data)
                        .map_err(cm_err)?;
                    return Ok(done());
                }
                let (own_qp, psn) = (owner.own_qp, owner.accept_psn());
                let Some(transport) = self.cm.cm.requested_transport(id) else {
                    return Err(fail(
                        ErrorCode::InvalidState,
                        "no connection request to accept",
                    ));
                };
                self.cm_bind_qp(now, client, (own_qp, false), qpn, transport)?;
                let pd = param.private_data.clone();
                self.cm
                    .cm
                    .accept(now, id, params(transport, qpn, psn, param, pd))
                    .map_err(cm_err)?;
                done()
            }
            CmRequest::Reject { id, private_data } => {
                self.cm_owned(client, id)?;
                if self.cm.cm.state(id) == Some(CmState::SidrReqRcvd) {
                    self.cm.cm.sidr_reply(id, None, &private_data)
                } else {
                    self.cm.cm.reject(id, &private_data)
                }
                .map_err(cm_err)?;
                done()
            }
            CmRequest::Disconnect { id } => {
                self.cm_owned(client, id)?;
                self.cm.cm.disconnect(now, id, &[]).map_err(cm_err)?;
                done()
            }
            CmRequest::QpAttrs { id } => {
                let owner = self.cm_owned(client, id)?;
                let (psn, ack) = (owner.accept_psn(), owner.ack_timeout);
                let Some([rtr, rts]) = self.cm.cm.qp_steps(id, psn) else {
                    return Err(fail(
                        ErrorCode::InvalidState,
                        "rdma_init_qp_attr: the connection has no peer parameters yet",
                    ));
                };
                ok(Reply::Cm(CmReply::QpAttrs {
                    rtr: super::apply::attr(rtr, ack),
                    rts: super::apply::attr(rts, ack),
                }))
            }
            CmRequest::OwnQp { id } => {
                self.cm_owned(client, id)?.own_qp = true;
                done()
            }
            CmRequest::SetAckTimeout { id, timeout } => {
                if timeout > 31 {
                    return Err(fail(
                        ErrorCode::InvalidArgument,
                        format!("ACK timeout {timeout} is more than 31"),
                    ));
                }
                self.cm_owned(client, id)?.ack_timeout = Some(timeout);
                done()
            }
            CmRequest::SetTos { id, tos } => {
                self.cm_owned(client, id)?.tos = tos;
                done()
            }
            CmRequest::MigrateId { id, channel } => {
                self.cm_owned(client, id)?;
                if self.cm.channels.get(&channel).map(|c| c.client) != Some(client) {
                    return Err(fail(
                        ErrorCode::NotFound,
                        format!("no CM channel {channel}"),
                    ));
                }
                self.cm.migrate(id, channel);
                done()
            }
            CmRequest::GetEvents { channel } => match self.cm.channels.get_mut(&channel) {
                Some(c) if c.client == client => ok(Reply::Cm(CmReply::Events(c.take_events()))),
                _ => {
                    return Err(fail(
                        ErrorCode::NotFound,
                        format!("no CM channel {channel}"),
                    ))
                }
            },
        })
    }

    /// Forgets a CM id (a connected one sends its DREQ first).
    pub(crate) fn cm_destroy_id(&mut self, now: Instant, id: Handle) {
        if let Some(o) = self.cm.ids.remove(&id) {
            if let Some(uid) = o.quota_uid {
                self.quotas.give_back(uid, Kind::CmId, 0);
            }
            for p in o.listening.into_iter().chain(o.bound) {
                if self.cm.ports.get(&p) == Some(&id) {
                    self.cm.ports.remove(&p);
                }
            }
        }
        self.cm.cm.destroy_id(now, id);
    }

    /// A client is gone: its ids and channels go too.
    pub(crate) fn cm_remove_client(&mut self, now: Instant, client: u32) {
        let ids: Vec<Handle> = self
            .cm
            .ids
            .iter()
            .filter(|(_, o)| o.client == client)
            .map(|(&h, _)| h)
            .collect();
        for id in ids {
            self.cm_destroy_id(now, id);
        }
        self.cm.channels.retain(|_, c| c.client != client);
    }
}
