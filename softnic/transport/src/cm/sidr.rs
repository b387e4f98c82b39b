//! Service ID resolution for UD (IBTA 12.11), what `rdma_cm` uses in `RDMA_PS_UDP`: the
//! active side sends a SIDR REQ for a service ID; the passive side's consumer answers
//! with its UD QP and Q_Key in a SIDR REP (or refuses). No QP changes state: UD QPs
//! are ready on their own.

use std::net::SocketAddr;

use wire::cm::{CmMadRepr, CmMessage, SidrRepRepr, SidrReqRepr, SidrStatus};

use super::id::{padded, CmState, PeerParams};
use super::timer::Retry;
use super::{roce_dest, Cm, CmError, Event, IdHandle, Route};
use crate::time::Instant;

impl Cm {
    /// Sends a SIDR REQ for `service_id` (`rdma_connect` on a UD id);
    /// `private_data` (≤ 216 bytes) already holds the IP CM header. Outcome:
    /// `UdResolved`, `Rejected` (the SIDR REP status) or `Unreachable`.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        h: IdHandle,
        route: Route,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > wire::cm::SIDR_REQ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let state = self.ids.get(&h).ok_or(CmError::NoSuchId)?.state;
        if state != CmState::Idle {
            return Err(CmError::InvalidState(state));
        }
        let request_id = self.new_comm_id();
        let tid = u64::from(self.random()) << 32 | u64::from(request_id);
        let req = SidrReqRepr {
            request_id,
            pkey: 0xFFFF,
            service_id,
            private_data: padded(private_data),
        };
        let mad = CmMadRepr::new(tid, CmMessage::SidrReq(req));
        let (exp, retries) = (self.cfg.cm_response_timeout, self.cfg.max_cm_retries);
        if let Some(c) = self.ids.get_mut(&h) {
            c.state = CmState::SidrReqSent;
            c.local_comm_id = request_id;
            c.tid = tid;
            c.peer = Some(route.dest);
            c.retry = Some(Retry::new(now, mad, exp, retries));
        }
        self.by_comm_id.insert(request_id, h);
        self.send(route.dest, mad);
        Ok(())
    }

    pub(super) fn on_sidr_req(&mut self, src: SocketAddr, tid: u64, req: &SidrReqRepr) {
        let dest = roce_dest(src, self.cfg.local);
        let answer = |status: SidrStatus| SidrRepRepr {
            request_id: req.request_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: req.service_id,
            qkey: 0,
            additional_info: [0; 72],
            private_data: [0; 136],
        };
        // A request being answered already (the peer resent it): the consumer's answer
        // will go out once.
        let dup = self.ids.values().any(|c| {
            c.state == CmState::SidrReqRcvd
                && c.remote_comm_id == Some(req.request_id)
                && c.peer.map(|p| p.ip()) == Some(src.ip())
        });
        if dup {
            self.counters.rx_duplicates += 1;
            return;
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.counters.rej_no_listener += 1;
            let rep = answer(SidrStatus::UNSUPPORTED);
            self.send(dest, CmMadRepr::new(tid, CmMessage::SidrRep(rep)));
            return;
        };
        let Some(mut c) = self.new_request(listener, CmState::SidrReqRcvd, tid, dest) else {
            return;
        };
        let h = c.handle;
        c.remote_comm_id = Some(req.request_id);
        c.theirs = PeerParams {
            service_id: req.service_id,
            private_data: req.private_data.to_vec(),
            ..PeerParams::default()
        };
        let peer = c.theirs.clone();
        self.ids.insert(h, c);
        self.events.push_back(Event::ConnectRequest {
            listener,
            id: h,
            peer,
        });
    }

    /// Answers a SIDR REQ (`rdma_accept` on a UD id): `qpn` and `qkey` serve it.
    /// `None` refuses it (`rdma_reject`: status "reject").
    pub fn sidr_reply(
        &mut self,
        h: IdHandle,
        answer: Option<(u32, u32)>,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > wire::cm::SIDR_REP_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let c = self.ids.get(&h).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        let (qpn, qkey) = answer.unwrap_or((0, 0));
        let rep = SidrRepRepr {
            request_id: c.remote_comm_id.unwrap_or(0),
            status: if answer.is_some() {
                SidrStatus::OK
            } else {
                SidrStatus::REJECT
            },
            additional_info_length: 0,
            vendor_id: 0,
            qpn: qpn & 0xFF_FFFF,
            service_id: c.theirs.service_id,
            qkey,
            additional_info: [0; 72],
            private_data: padded(private_data),
        };
        let (dest, tid, listener) = (c.peer, c.tid, c.listener);
        if let Some(l) = listener.and_then(|l| self.ids.get_mut(&l)) {
            l.pending = l.pending.saturating_sub(1);
        }
        self.close(h);
        if let Some(d) = dest {
            self.send(d, CmMadRepr::new(tid, CmMessage::SidrRep(rep)));
        }
        Ok(())
    }

    pub(super) fn on_sidr_rep(&mut self, peer: SocketAddr, rep: &SidrRepRepr) {
        let Some(h) = self.lookup(peer, rep.request_id, None) else {
            return;
        };
        if self.ids.get(&h).map(|c| c.state) != Some(CmState::SidrReqSent) {
            self.counters.rx_drop_unexpected += 1;
            return;
        }
        let dest = self.ids.get(&h).and_then(|c| c.peer);
        let event = if rep.status == SidrStatus::OK {
            Event::UdResolved {
                id: h,
                qpn: rep.qpn,
                qkey: rep.qkey,
                dest: dest.unwrap_or(peer),
                private_data: rep.private_data.to_vec(),
            }
        } else {
            Event::Rejected {
                id: h,
                reason: u16::from(rep.status.0),
                private_data: rep.private_data.to_vec(),
            }
        };
        self.events.push_back(event);
        self.close(h);
    }
}
