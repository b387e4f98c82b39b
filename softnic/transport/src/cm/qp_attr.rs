//! The QP attributes of a connection (`ib_cm_init_qp_attr` in Linux): the RTR and RTS
//! transitions the CM applies to a bound QP, and that `rdma_init_qp_attr` hands to a
//! program moving its own QP. One function builds them for both uses, so a program's
//! own QP gets exactly what the CM would have applied.

use std::net::SocketAddr;

use super::active::MIN_RNR_TIMER;
use super::id::{CmState, ConnParams, PeerParams};
use super::{Cm, IdHandle, QpStep};

/// RTR and RTS for a connection where we offered `ours` and the peer `theirs`
/// (IBTA 12.9.6 / 12.9.5). `path_mtu` and `retry_cnt` differ by side: the active side
/// uses its own MTU and retry count, the passive side the REQ's (capped by its MTU).
/// Starting PSNs name what the *sender of the MAD* expects to receive (see
/// [`ConnParams::psn`]): `rq_psn` is ours, `sq_psn` the peer's.
pub(super) fn steps(
    ours: &ConnParams,
    theirs: &PeerParams,
    path_mtu: u8,
    retry_cnt: u8,
    dest: SocketAddr,
    traffic_class: u8,
) -> [QpStep; 2] {
    [
        QpStep::Rtr {
            dest_qpn: theirs.qpn,
            rq_psn: ours.psn,
            path_mtu,
            dest,
            traffic_class,
            max_dest_rd_atomic: ours.responder_resources,
            min_rnr_timer: MIN_RNR_TIMER,
        },
        QpStep::Rts {
            sq_psn: theirs.psn,
            timeout: theirs.local_ack_timeout,
            retry_cnt,
            rnr_retry: theirs.rnr_retry_count,
            max_rd_atomic: ours.initiator_depth.min(theirs.responder_resources),
        },
    ]
}

impl Cm {
    /// The passive side's steps for accepting with `params`.
    pub(super) fn passive_steps(
        &self,
        theirs: &PeerParams,
        params: &ConnParams,
        dest: SocketAddr,
        traffic_class: u8,
    ) -> [QpStep; 2] {
        let mtu = theirs.path_mtu.clamp(1, self.cfg.path_mtu.max(1));
        steps(params, theirs, mtu, theirs.retry_count, dest, traffic_class)
    }

    /// The RTR and RTS transitions of connection `h` (`rdma_init_qp_attr`), or `None`
    /// before the peer's REQ or REP is known. A passive connection not yet accepted
    /// answers for an accept with starting PSN `accept_psn` and the resources Linux's CM
    /// assumes before the accept (responder resources = the REQ's initiator depth,
    /// initiator depth = its responder resources); once accepted, with what it offered.
    pub fn qp_steps(&self, h: IdHandle, accept_psn: u32) -> Option<[QpStep; 2]> {
        let c = self.ids.get(&h)?;
        let dest = c.peer?;
        let passive = c.listener.is_some();
        match c.state {
            CmState::ReqRcvd => {
                let t = &c.theirs;
                let pending = ConnParams {
                    psn: accept_psn & 0xFF_FFFF,
                    responder_resources: t.initiator_depth,
                    initiator_depth: t.responder_resources,
                    ..ConnParams::default()
                };
                Some(self.passive_steps(t, &pending, dest, c.traffic_class))
            }
            CmState::RepSent | CmState::Established if passive => {
                Some(self.passive_steps(&c.theirs, &c.ours, dest, c.traffic_class))
            }
            CmState::Established => Some(steps(
                &c.ours,
                &c.theirs,
                c.theirs.path_mtu,
                c.ours.retry_count,
                dest,
                c.traffic_class,
            )),
            _ => None,
        }
    }
}
