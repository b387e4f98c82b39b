//! The passive side (IBTA 12.9.6): REQ in → a new connection under its listener (or a
//! REJ "invalid service ID" when nobody listens); accept → QP to RTR and RTS, REP out;
//! RTU in → established; reject → REJ out.

use std::net::SocketAddr;

use wire::cm::{CmMadRepr, CmMessage, MessageKind, RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr};

use super::id::{padded, CmId, CmState, CmTransport, ConnParams, PeerParams};
use super::timer::Retry;
use super::{roce_dest, Cm, CmError, Event, IdHandle, QpAction};
use crate::time::Instant;

impl Cm {
    pub(super) fn on_req(&mut self, now: Instant, src: SocketAddr, tid: u64, req: &ReqRepr) {
        let _ = now;
        let transport = CmTransport::of_req(req.transport_type, req.extended_transport_type);
        let Some(transport) = transport.filter(|_| req.local_qpn != 0) else {
            self.counters.rx_drop_bad_req += 1;
            return;
        };
        let dest = roce_dest(src, self.cfg.local);
        // A REQ we already took (the peer resent it): answer as the state says.
        let dup = self.ids.values().find(|c| {
            c.remote_comm_id == Some(req.local_comm_id)
                && c.listener.is_some()
                && c.peer.map(|p| p.ip()) == Some(src.ip())
        });
        if let Some(c) = dup {
            self.counters.rx_duplicates += 1;
            if let (CmState::RepSent, Some(r)) = (c.state, c.retry) {
                if let Some(mad) = r.mad {
                    self.send(dest, mad);
                }
            }
            return;
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.counters.rej_no_listener += 1;
            self.refuse_req(dest, tid, req, RejReason::INVALID_SERVICE_ID);
            return;
        };
        let takes = self.ids.get(&listener).and_then(|l| l.listen_transport);
        if takes.is_some_and(|t| t != transport) {
            // Linux's CM makes the connection, its rdma_cm consumer refuses it
            // (`cma_check_req_qp_type`), and destroying it sends this REJ.
            self.counters.rej_wrong_transport += 1;
            self.refuse_req(dest, tid, req, RejReason::CONSUMER_DEFINED);
            return;
        }
        let Some(mut c) = self.new_request(listener, CmState::ReqRcvd, tid, dest) else {
            return;
        };
        let (h, comm) = (c.handle, self.new_comm_id());
        c.local_comm_id = comm;
        c.remote_comm_id = Some(req.local_comm_id);
        c.traffic_class = req.primary.traffic_class;
        c.theirs = PeerParams {
            transport,
            qpn: req.local_qpn,
            psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            flow_control: req.end_to_end_flow_control,
            srq: req.srq,
            path_mtu: req.path_mtu,
            local_ack_timeout: req.primary.local_ack_timeout,
            service_id: req.service_id,
            private_data: req.private_data.to_vec(),
        };
        let peer = c.theirs.clone();
        self.ids.insert(h, c);
        self.by_comm_id.insert(comm, h);
        self.events.push_back(Event::ConnectRequest {
            listener,
            id: h,
            peer,
        });
    }

    /// Answers `req` with a REJ for `reason` and makes no connection (local
    /// communication ID 0: there is none).
    fn refuse_req(&mut self, dest: SocketAddr, tid: u64, req: &ReqRepr, reason: RejReason) {
        let rej = RejRepr {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: MessageKind::Req,
            reject_info_length: 0,
            reason,
            ari: [0; 72],
            private_data: [0; 148],
        };
        self.send(dest, CmMadRepr::new(tid, CmMessage::Rej(rej)));
    }

    /// A new id for a request that reached `listener`, in `state`, if the listener's
    /// backlog has room. A full backlog leaves the request unanswered — the active side
    /// resends, and there may be room then (as Linux's CM does) — and counts the drop.
    pub(super) fn new_request(
        &mut self,
        listener: IdHandle,
        state: CmState,
        tid: u64,
        peer: SocketAddr,
    ) -> Option<CmId> {
        let l = self.ids.get_mut(&listener)?;
        if l.pending >= l.backlog {
            self.counters.rx_drop_backlog += 1;
            return None;
        }
        l.pending += 1;
        let mut c = CmId::new(self.alloc_handle());
        c.state = state;
        c.tid = tid;
        c.peer = Some(peer);
        c.listener = Some(listener);
        Some(c)
    }

    /// Takes a connection request (`rdma_accept`): moves `params.qpn` to RTR and RTS
    /// against the requester and sends the REP; `Established` follows the RTU.
    pub fn accept(&mut self, now: Instant, h: IdHandle, params: ConnParams) -> Result<(), CmError> {
        if params.private_data.len() > wire::cm::REP_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let c = self.ids.get(&h).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        if self.by_qpn.contains_key(&params.qpn) {
            return Err(CmError::QpInUse);
        }
        if params.transport != c.theirs.transport {
            return Err(CmError::WrongTransport);
        }
        let Some(dest) = c.peer else {
            return Err(CmError::InvalidState(c.state));
        };
        let steps = self.passive_steps(&c.theirs, &params, dest, c.traffic_class);
        let qpn = params.qpn & 0xFF_FFFF;
        // An XRC target's REP (Linux `cm_format_rep`): its QP number in the Local EE
        // Context Number field, the SRQ bit set (it receives only through XRC SRQs),
        // no initiator depth or flow control (it sends no requests).
        let rc = params.transport == CmTransport::Rc;
        let rep = RepRepr {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id.unwrap_or(0),
            local_qkey: 0,
            local_qpn: if rc { qpn } else { 0 },
            local_eecn: if rc { 0 } else { qpn },
            starting_psn: params.psn & 0xFF_FFFF,
            vendor_id: 0,
            responder_resources: params.responder_resources,
            initiator_depth: if rc { params.initiator_depth } else { 0 },
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: rc && params.flow_control,
            rnr_retry_count: params.rnr_retry_count & 7,
            srq: params.srq || !rc,
            local_ca_guid: self.cfg.ca_guid,
            private_data: padded(&params.private_data),
        };
        let mad = CmMadRepr::new(c.tid, CmMessage::Rep(rep));
        let listener = c.listener;
        let (exp, retries) = (self.cfg.cm_response_timeout, self.cfg.max_cm_retries);
        for step in steps {
            self.qp_actions.push_back(QpAction {
                id: h,
                qpn: params.qpn,
                step,
            });
        }
        self.by_qpn.insert(params.qpn, h);
        self.release_backlog(listener);
        if let Some(c) = self.ids.get_mut(&h) {
            c.state = CmState::RepSent;
            c.qpn = Some(params.qpn);
            c.ours = params;
            c.retry = Some(Retry::new(now, mad, exp, retries));
        }
        self.send(dest, mad);
        Ok(())
    }

    /// Refuses a connection request (`rdma_reject`) with a REJ "consumer reject"
    /// carrying `private_data` (≤ 148 bytes).
    pub fn reject(&mut self, h: IdHandle, private_data: &[u8]) -> Result<(), CmError> {
        if private_data.len() > wire::cm::REJ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let c = self.ids.get(&h).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        let rej = RejRepr {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id.unwrap_or(0),
            message_rejected: MessageKind::Req,
            reject_info_length: 0,
            reason: RejReason::CONSUMER_DEFINED,
            ari: [0; 72],
            private_data: padded(private_data),
        };
        let (dest, tid, listener) = (c.peer, c.tid, c.listener);
        self.release_backlog(listener);
        self.close(h);
        if let Some(d) = dest {
            self.send(d, CmMadRepr::new(tid, CmMessage::Rej(rej)));
        }
        Ok(())
    }

    /// A request of `listener` was answered (or given up): its backlog slot is free.
    pub(super) fn release_backlog(&mut self, listener: Option<IdHandle>) {
        if let Some(l) = listener.and_then(|l| self.ids.get_mut(&l)) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    pub(super) fn on_rtu(&mut self, peer: SocketAddr, rtu: &RtuRepr) {
        let Some(h) = self.lookup(peer, rtu.remote_comm_id, Some(rtu.local_comm_id)) else {
            return;
        };
        let Some(c) = self.ids.get_mut(&h) else {
            return;
        };
        match c.state {
            CmState::RepSent => {
                c.state = CmState::Established;
                c.retry = None;
                // The passive side's ESTABLISHED carries no parameters and no private
                // data: Linux's CM reports the RTU so (`cma_ib_handler`), the REQ's came
                // with CONNECT_REQUEST, and programs tell the two sides' ESTABLISHED
                // apart by it (libfabric's XRC endpoints do).
                let peer = PeerParams::default();
                self.events.push_back(Event::Established { id: h, peer });
            }
            CmState::Established => self.counters.rx_duplicates += 1,
            _ => self.counters.rx_drop_unexpected += 1,
        }
    }
}
