//! What the CM asks of the NIC after each input: QP transitions applied to the owner's
//! QP (a refused one makes the CM give the connection up), events routed to channels,
//! MADs sent on QP1.

use std::net::SocketAddr;

use softnic_transport::cm::{QpAction, QpStep};
use softnic_transport::time::Instant;
use verbs_api::abi::control::{QpAttr, QpState, Response};

use crate::nic::state::Nic;

/// Bytes of a QP1 packet: BTH 12 + DETH 8 + MAD 256 + ICRC 4.
const QP1_PACKET_LEN: usize = 12 + 8 + wire::cm::MAD_LEN + wire::ICRC_LEN;

/// Bytes of an IBTA MTU code (1 = 256 … 5 = 4096).
fn mtu_bytes(code: u8) -> u32 {
    256 << (code.clamp(1, 5) - 1)
}

/// The control form of a CM transition (also what `rdma_init_qp_attr` answers), with
/// the id's own ACK timeout, if the program set one, in place of the peer's offer.
pub(super) fn attr(step: QpStep, ack_timeout: Option<u8>) -> QpAttr {
    match step {
        QpStep::Rtr {
            dest_qpn,
            rq_psn,
            path_mtu,
            dest,
            traffic_class,
            max_dest_rd_atomic,
            min_rnr_timer,
        } => QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(mtu_bytes(path_mtu)),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(rq_psn),
            remote: Some(dest),
            traffic_class,
            max_dest_rd_atomic: Some(max_dest_rd_atomic),
            min_rnr_timer: Some(min_rnr_timer),
            ..QpAttr::default()
        },
        QpStep::Rts {
            sq_psn,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic,
        } => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: Some(ack_timeout.unwrap_or(timeout)),
            retry_cnt: Some(retry_cnt),
            rnr_retry: Some(rnr_retry),
            max_rd_atomic: Some(max_rd_atomic),
            ..QpAttr::default()
        },
        QpStep::Err => QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        },
    }
}

impl Nic {
    /// Runs the CM's timers and drains what it produced; `send` transmits one packet
    /// (BTH … ICRC space) to a peer NIC. Returns a measure of the work done.
    pub fn cm_poll(&mut self, now: Instant, send: &mut dyn FnMut(&mut [u8], SocketAddr)) -> usize {
        let mut work = 0;
        if self.cm.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.cm.handle_timeout(now);
            work += 1;
        }
        // Applying an action can produce more (a refused QP makes the CM send a REJ).
        for _ in 0..64 {
            let mut any = false;
            while let Some(a) = self.cm.cm.poll_qp_action() {
                any = true;
                self.cm_apply(now, a);
            }
            while let Some(ev) = self.cm.cm.poll_event() {
                any = true;
                self.cm.route_event(ev);
            }
            while let Some(t) = self.cm.cm.poll_transmit() {
                any = true;
                let mut buf = [0u8; QP1_PACKET_LEN];
                if let Some(n) = self.cm.qp1_packet(&t.mad, &mut buf) {
                    send(&mut buf[..n], t.dest);
                }
            }
            if !any {
                break;
            }
            work += 1;
        }
        work
    }

    fn cm_apply(&mut self, now: Instant, a: QpAction) {
        let Some(owner) = self.cm.ids.get(&a.id).copied() else {
            return; // destroyed id: leave the QP alone
        };
        if owner.own_qp {
            return; // the program moves this QP itself (rdma_init_qp_attr)
        }
        // The QP's own connection (the same user's, checked at connect/accept and
        // again here: the QP may have been destroyed and its number reused).
        let client = self
            .cm_qp_client(owner.client, a.qpn)
            .unwrap_or(owner.client);
        let answer = self.modify_qp(now, client, a.qpn, &attr(a.step, owner.ack_timeout));
        if !matches!(answer.0, Response::Ok(_)) && a.step != QpStep::Err {
            self.cm.counters.qp_action_failures += 1;
            tracing::debug!(qpn = a.qpn, answer = ?answer.0, "rdma_cm: QP transition refused");
            self.cm.cm.qp_failed(now, a.id);
        }
    }
}
