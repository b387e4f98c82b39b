//! The active side (IBTA 12.9.5): REQ out; REP in → QP to RTR and RTS, RTU out,
//! established; REJ in → rejected; MRA in → wait longer.

use std::net::SocketAddr;

use wire::cm::{
    CmMadRepr, CmMessage, MessageKind, MraRepr, PathRepr, RejRepr, RepRepr, ReqRepr, RtuRepr,
};

use super::id::{padded, CmState, CmTransport, ConnParams, PeerParams};
use super::timer::{timeout, Retry};
use super::{Cm, CmError, Event, IdHandle, QpAction, QpStep};
use crate::time::Instant;

/// The local ACK timeout softnic puts in its REQs (4.096 µs × 2^14 ≈ 67 ms, what
/// `ibv_rc_pingpong` uses): the passive side's QP retransmits after it.
pub const REQ_LOCAL_ACK_TIMEOUT: u8 = 14;
/// The RNR NAK timer both sides' QPs advertise (IBTA table 45: 12 = 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;

/// Where to connect: the peer NIC and the two ends' GIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The peer NIC's address (IP and RoCE UDP port).
    pub dest: SocketAddr,
    /// Our GID (the REQ's primary local port GID).
    pub local_gid: [u8; 16],
    /// The peer's GID.
    pub remote_gid: [u8; 16],
    /// The traffic class (IP TOS) of the connection's packets, carried in the REQ's
    /// primary path so that the passive side uses it too (Linux: the id's TOS,
    /// `cma_resolve_iboe_route`).
    pub traffic_class: u8,
}

impl Cm {
    /// Sends a REQ for `service_id` to `route.dest` binding `params.qpn`
    /// (`rdma_connect`). `params.private_data` (≤ 92 bytes) already holds the IP CM
    /// header. Outcome: `Established`, `Rejected` or `Unreachable`.
    pub fn connect(
        &mut self,
        now: Instant,
        h: IdHandle,
        route: Route,
        service_id: u64,
        params: ConnParams,
    ) -> Result<(), CmError> {
        if params.private_data.len() > wire::cm::REQ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let state = self.ids.get(&h).ok_or(CmError::NoSuchId)?.state;
        if state != CmState::Idle {
            return Err(CmError::InvalidState(state));
        }
        if self.by_qpn.contains_key(&params.qpn) {
            return Err(CmError::QpInUse);
        }
        let comm = self.new_comm_id();
        let tid = u64::from(self.random()) << 32 | u64::from(comm);
        let (transport_type, extended_transport_type) = params.transport.req_fields();
        // An XRC initiator's REQ leaves the fields that describe the target's receive
        // side zero (Linux `cm_format_req`): the target has no receive queue of its
        // own, and it answers READs and atomics for every initiator of its domain.
        let rc = params.transport == CmTransport::Rc;
        let rc_only = |v: u8| if rc { v } else { 0 };
        let path = PathRepr {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: route.local_gid,
            remote_gid: route.remote_gid,
            hop_limit: 64,
            traffic_class: route.traffic_class,
            local_ack_timeout: REQ_LOCAL_ACK_TIMEOUT,
            ..PathRepr::default()
        };
        let req = ReqRepr {
            local_comm_id: comm,
            vendor_id: 0,
            service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: params.qpn & 0xFF_FFFF,
            responder_resources: rc_only(params.responder_resources),
            local_eecn: 0,
            initiator_depth: params.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.cm_response_timeout,
            transport_type,
            end_to_end_flow_control: params.flow_control,
            starting_psn: params.psn & 0xFF_FFFF,
            local_cm_response_timeout: self.cfg.cm_response_timeout,
            retry_count: rc_only(params.retry_count & 7),
            pkey: 0xFFFF,
            path_mtu: self.cfg.path_mtu,
            rdc_exists: false,
            rnr_retry_count: rc_only(params.rnr_retry_count & 7),
            max_cm_retries: self.cfg.max_cm_retries & 0xF,
            srq: rc && params.srq,
            extended_transport_type,
            primary: path,
            alternate: PathRepr::default(),
            sap_supported: false,
            private_data: padded(&params.private_data),
        };
        let mad = CmMadRepr::new(tid, CmMessage::Req(req));
        let (exp, retries) = (self.cfg.cm_response_timeout, self.cfg.max_cm_retries);
        let Some(c) = self.ids.get_mut(&h) else {
            return Err(CmError::NoSuchId);
        };
        c.state = CmState::ReqSent;
        c.local_comm_id = comm;
        c.tid = tid;
        c.peer = Some(route.dest);
        c.traffic_class = route.traffic_class;
        c.qpn = Some(params.qpn);
        c.ours = params;
        c.retry = Some(Retry::new(now, mad, exp, retries));
        self.by_comm_id.insert(comm, h);
        self.by_qpn.insert(c.ours.qpn, h);
        self.send(route.dest, mad);
        Ok(())
    }

    pub(super) fn on_rep(&mut self, _now: Instant, peer: SocketAddr, rep: &RepRepr) {
        let Some(h) = self.lookup(peer, rep.remote_comm_id, Some(rep.local_comm_id)) else {
            return;
        };
        let Some(c) = self.ids.get_mut(&h) else {
            return;
        };
        match c.state {
            CmState::ReqSent => {}
            CmState::Established => {
                // Our RTU was lost: the peer resent its REP. Answer again (IBTA 12.9.5).
                let (dest, mad) = (c.peer, rtu(c.tid, c.local_comm_id, rep.local_comm_id));
                self.counters.rx_duplicates += 1;
                if let Some(d) = dest {
                    self.send(d, mad);
                }
                return;
            }
            _ => {
                self.counters.rx_drop_unexpected += 1;
                return;
            }
        }
        c.remote_comm_id = Some(rep.local_comm_id);
        let transport = c.ours.transport;
        c.theirs = PeerParams {
            transport,
            // An XRC target's REP names its QP in the Local EE Context Number field
            // (Linux `cm_rep_get_qpn`); its Local QPN is 0.
            qpn: match transport {
                CmTransport::Rc => rep.local_qpn,
                CmTransport::Xrc => rep.local_eecn,
            },
            psn: rep.starting_psn,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            flow_control: rep.end_to_end_flow_control,
            srq: rep.srq,
            path_mtu: self.cfg.path_mtu,
            local_ack_timeout: REQ_LOCAL_ACK_TIMEOUT,
            service_id: 0,
            private_data: rep.private_data.to_vec(),
        };
        c.state = CmState::Established;
        c.retry = None;
        let Some(dest) = c.peer else {
            return;
        };
        let qpn = c.ours.qpn;
        let steps = super::qp_attr::steps(
            &c.ours,
            &c.theirs,
            c.theirs.path_mtu,
            c.ours.retry_count,
            dest,
            c.traffic_class,
        );
        let event = Event::Established {
            id: h,
            peer: c.theirs.clone(),
        };
        let mad = rtu(c.tid, c.local_comm_id, rep.local_comm_id);
        for step in steps {
            self.qp_actions.push_back(QpAction { id: h, qpn, step });
        }
        self.send(dest, mad);
        self.events.push_back(event);
    }

    pub(super) fn on_rej(&mut self, peer: SocketAddr, rej: &RejRepr) {
        // A REJ from a CM that never made a connection (no listener) carries local
        // communication ID 0.
        let theirs = Some(rej.local_comm_id).filter(|&x| x != 0);
        let Some(h) = self.lookup(peer, rej.remote_comm_id, theirs) else {
            return;
        };
        let Some(c) = self.ids.get(&h) else {
            return;
        };
        let qp_err = match c.state {
            CmState::ReqSent => false,
            CmState::RepSent => true,
            _ => {
                self.counters.rx_drop_unexpected += 1;
                return;
            }
        };
        if qp_err {
            if let Some(qpn) = c.qpn {
                self.qp_actions.push_back(QpAction {
                    id: h,
                    qpn,
                    step: QpStep::Err,
                });
            }
        }
        self.events.push_back(Event::Rejected {
            id: h,
            reason: rej.reason.0,
            private_data: rej.private_data.to_vec(),
        });
        self.close(h);
    }

    pub(super) fn on_mra(&mut self, now: Instant, peer: SocketAddr, mra: &MraRepr) {
        let theirs = Some(mra.local_comm_id).filter(|&x| x != 0);
        let Some(h) = self.lookup(peer, mra.remote_comm_id, theirs) else {
            return;
        };
        let Some(c) = self.ids.get_mut(&h) else {
            return;
        };
        let expected = matches!(
            (c.state, mra.message_mraed),
            (CmState::ReqSent, MessageKind::Req) | (CmState::RepSent, MessageKind::Rep)
        );
        match (&mut c.retry, expected) {
            (Some(r), true) => {
                // The peer needs longer: wait its service timeout before resending.
                r.deadline =
                    now + timeout(mra.service_timeout) + timeout(self.cfg.cm_response_timeout);
            }
            _ => self.counters.rx_drop_unexpected += 1,
        }
    }
}

/// An RTU for a connection.
pub(super) fn rtu(tid: u64, local: u32, remote: u32) -> CmMadRepr {
    CmMadRepr::new(
        tid,
        CmMessage::Rtu(RtuRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; wire::cm::RTU_PRIVATE_DATA_LEN],
        }),
    )
}
