//! Leaving a connection (IBTA 12.9.8): DREQ out → DREP in (or timeout) → TimeWait;
//! DREQ in → QP to ERR, DREP out → TimeWait; timeouts of every state; giving a
//! connection up.

use std::net::SocketAddr;

use wire::cm::{CmMadRepr, CmMessage, DrepRepr, DreqRepr, MessageKind, RejReason, RejRepr};

use super::id::{padded, CmState};
use super::timer::Retry;
use super::{Cm, CmError, Event, IdHandle, QpAction, QpStep};
use crate::time::Instant;

impl Cm {
    /// Leaves an established connection (`rdma_disconnect`): the QP goes to ERR, a
    /// DREQ goes out; `Disconnected` follows the DREP (or Max CM Retries timeouts).
    ///
    /// A connection already being left or gone — the peer's DREQ came first (the QP
    /// went to ERR and the DREP out then), or this side asked before — is left
    /// successfully with nothing to send, as Linux's `rdma_disconnect` returns 0 when
    /// neither a DREQ nor a DREP can be sent: both ends of perftest `-R` disconnect
    /// every QP at the end, and whichever asks second must not fail.
    pub fn disconnect(
        &mut self,
        now: Instant,
        h: IdHandle,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > wire::cm::DREQ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let c = self.ids.get(&h).ok_or(CmError::NoSuchId)?;
        match c.state {
            CmState::Established => {}
            CmState::DreqSent | CmState::TimeWait | CmState::Closed => return Ok(()),
            s => return Err(CmError::InvalidState(s)),
        }
        let dreq = DreqRepr {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id.unwrap_or(0),
            remote_qpn: c.theirs.qpn,
            private_data: padded(private_data),
        };
        let mad = CmMadRepr::new(c.tid, CmMessage::Dreq(dreq));
        let (dest, qpn) = (c.peer, c.qpn);
        let (exp, retries) = (self.cfg.cm_response_timeout, self.cfg.max_cm_retries);
        self.qp_err(h, qpn);
        if let Some(c) = self.ids.get_mut(&h) {
            c.state = CmState::DreqSent;
            c.retry = Some(Retry::new(now, mad, exp, retries));
        }
        if let Some(d) = dest {
            self.send(d, mad);
        }
        Ok(())
    }

    fn qp_err(&mut self, id: IdHandle, qpn: Option<u32>) {
        if let Some(qpn) = qpn {
            self.qp_actions.push_back(QpAction {
                id,
                qpn,
                step: QpStep::Err,
            });
        }
    }

    fn drep(tid: u64, local: u32, remote: u32) -> CmMadRepr {
        CmMadRepr::new(
            tid,
            CmMessage::Drep(DrepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: [0; wire::cm::RTU_PRIVATE_DATA_LEN],
            }),
        )
    }

    pub(super) fn on_dreq(&mut self, now: Instant, peer: SocketAddr, tid: u64, dreq: &DreqRepr) {
        let Some(h) = self.lookup(peer, dreq.remote_comm_id, Some(dreq.local_comm_id)) else {
            return;
        };
        let Some(c) = self.ids.get(&h) else {
            return;
        };
        if c.qpn != Some(dreq.remote_qpn) {
            self.counters.rx_drop_unexpected += 1;
            return;
        }
        let mad = Self::drep(tid, c.local_comm_id, dreq.local_comm_id);
        let (state, dest, qpn) = (c.state, c.peer, c.qpn);
        match state {
            CmState::Established | CmState::DreqSent => {
                if state == CmState::Established {
                    self.qp_err(h, qpn);
                }
                self.events.push_back(Event::Disconnected { id: h });
                self.enter_timewait(now, h);
            }
            CmState::TimeWait => self.counters.rx_duplicates += 1,
            _ => {
                self.counters.rx_drop_unexpected += 1;
                return;
            }
        }
        if let Some(d) = dest {
            self.send(d, mad);
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, peer: SocketAddr, drep: &DrepRepr) {
        let Some(h) = self.lookup(peer, drep.remote_comm_id, Some(drep.local_comm_id)) else {
            return;
        };
        if self.ids.get(&h).map(|c| c.state) != Some(CmState::DreqSent) {
            self.counters.rx_drop_unexpected += 1;
            return;
        }
        self.events.push_back(Event::Disconnected { id: h });
        self.enter_timewait(now, h);
    }

    fn enter_timewait(&mut self, now: Instant, h: IdHandle) {
        let d = self.cfg.timewait;
        if let Some(c) = self.ids.get_mut(&h) {
            c.state = CmState::TimeWait;
            c.retry = Some(Retry::wait(now, d));
        }
    }

    /// Ends a connection for good: its comm ID and QP are free again; the id stays
    /// (Closed) until the consumer destroys it.
    pub(super) fn close(&mut self, h: IdHandle) {
        if let Some(c) = self.ids.get_mut(&h) {
            c.state = CmState::Closed;
            c.retry = None;
            let (comm, qpn) = (c.local_comm_id, c.qpn.take());
            if self.by_comm_id.get(&comm) == Some(&h) {
                self.by_comm_id.remove(&comm);
            }
            if let Some(q) = qpn {
                if self.by_qpn.get(&q) == Some(&h) {
                    self.by_qpn.remove(&q);
                }
            }
        }
    }

    /// The earliest instant [`Cm::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ids
            .values()
            .filter_map(|c| c.retry.map(|r| r.deadline))
            .min()
    }

    /// Resends what is due, gives up what has no retries left, ends TimeWaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<IdHandle> = self
            .ids
            .values()
            .filter(|c| c.retry.is_some_and(|r| r.deadline <= now))
            .map(|c| c.handle)
            .collect();
        let exp = self.cfg.cm_response_timeout;
        for h in due {
            let Some(c) = self.ids.get_mut(&h) else {
                continue;
            };
            let Some(r) = c.retry else {
                continue;
            };
            let dest = c.peer;
            match r.mad {
                Some(mad) if r.left > 0 => {
                    c.retry = Some(Retry {
                        left: r.left - 1,
                        ..Retry::new(now, mad, exp, 0)
                    });
                    self.counters.tx_retries += 1;
                    if let Some(d) = dest {
                        self.send(d, mad);
                    }
                }
                Some(_) => {
                    self.counters.timeouts += 1;
                    self.give_up(now, h);
                }
                None => {
                    self.close(h);
                    self.events.push_back(Event::TimewaitExit { id: h });
                }
            }
        }
    }

    /// Max CM Retries ran out: REQ/REP → REJ "timeout" and `Unreachable`; SIDR REQ →
    /// `Unreachable`; DREQ → `Disconnected` without the DREP.
    fn give_up(&mut self, now: Instant, h: IdHandle) {
        let Some(c) = self.ids.get(&h) else {
            return;
        };
        match c.state {
            CmState::ReqSent | CmState::RepSent => {
                let kind = if c.state == CmState::ReqSent {
                    MessageKind::Req
                } else {
                    MessageKind::Rep
                };
                self.reject_and_close(h, kind, RejReason::TIMEOUT);
                self.events.push_back(Event::Unreachable { id: h });
            }
            CmState::DreqSent => {
                self.events.push_back(Event::Disconnected { id: h });
                self.enter_timewait(now, h);
            }
            CmState::SidrReqSent => {
                self.close(h);
                self.events.push_back(Event::Unreachable { id: h });
            }
            _ => self.close(h),
        }
    }

    /// Sends a REJ for connection `h` (not yet established), moves its QP to ERR if it
    /// has one, and closes it.
    fn reject_and_close(&mut self, h: IdHandle, kind: MessageKind, reason: RejReason) {
        let Some(c) = self.ids.get(&h) else {
            return;
        };
        let rej = RejRepr {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id.unwrap_or(0),
            message_rejected: kind,
            reject_info_length: 0,
            reason,
            ari: [0; 72],
            private_data: [0; 148],
        };
        let (dest, tid, qpn, state) = (c.peer, c.tid, c.qpn, c.state);
        if state == CmState::RepSent {
            self.qp_err(h, qpn);
        }
        self.close(h);
        if let Some(d) = dest {
            self.send(d, CmMadRepr::new(tid, CmMessage::Rej(rej)));
        }
    }

    /// A connection whose QP could not be moved: REJ (not yet established) or DREQ
    /// (established); the consumer sees `ConnectError`/`Disconnected`.
    pub(super) fn fail_connection(&mut self, now: Instant, h: IdHandle) {
        let Some(state) = self.ids.get(&h).map(|c| c.state) else {
            return;
        };
        match state {
            CmState::ReqSent | CmState::ReqRcvd | CmState::RepSent => {
                if state == CmState::ReqRcvd {
                    // Not accepted yet: it still holds a slot of its listener's backlog.
                    let listener = self.ids.get(&h).and_then(|c| c.listener);
                    self.release_backlog(listener);
                }
                let kind = if state == CmState::ReqSent {
                    MessageKind::Rep
                } else {
                    MessageKind::Req
                };
                self.reject_and_close(h, kind, RejReason::NO_QP);
                self.events.push_back(Event::ConnectError { id: h });
            }
            CmState::Established => {
                let _ = self.disconnect(now, h, &[]);
            }
            _ => {}
        }
    }
}
