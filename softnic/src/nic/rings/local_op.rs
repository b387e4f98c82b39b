//! Send-queue entries the NIC completes itself: a memory-window bind (`IBV_WR_BIND_MW`,
//! `ibv_bind_mw`) or invalidation (`IBV_WR_LOCAL_INV`). The client library carried out
//! the operation with a control request when it posted (`super::super::mw`); the entry
//! only gives it its place in the send queue's completion order (IBTA 10.8.3:
//! completions of one work queue come in posting order). It is taken once every work
//! request before it has completed, and completes at once — `IBV_WC_WR_FLUSH_ERR` on a
//! QP in error, as every WR posted there.

use softnic_transport::qp::QpState;
use softnic_transport::wr::{Completion, Queue, WcOpcode, WcStatus};
use verbs_api::abi::slots::{send_flags, wr_opcode};
use verbs_api::abi::SendWqe;

use super::QpEntry;

/// What the head of the send ring is.
pub(super) enum Head {
    /// Empty, or a work request for the transport.
    Transport,
    /// A local operation that must wait for the work requests before it (the ring
    /// stays marked as having more, so the runtime drains the QP again).
    Waiting,
    /// A local operation, just completed (taken from the ring).
    Done,
}

impl QpEntry {
    /// The local operation at the head of the send ring, with its completion opcode.
    fn local_head(&mut self) -> Option<(SendWqe, WcOpcode)> {
        let w = self.sq.peek().ok()??;
        match w.opcode {
            wr_opcode::BIND_MW => Some((w, WcOpcode::BindMw)),
            wr_opcode::LOCAL_INV => Some((w, WcOpcode::LocalInv)),
            _ => None,
        }
    }

    fn earlier_work_outstanding(&self) -> bool {
        self.qp.send_queue_len() > 0 || !self.pending.is_empty()
    }

    /// Takes a local operation at the head of the send ring if its turn has come.
    pub(super) fn take_local_op(&mut self) -> Head {
        let Some((w, opcode)) = self.local_head() else {
            return Head::Transport;
        };
        if self.earlier_work_outstanding() {
            return Head::Waiting;
        }
        let _ = self.sq.pop();
        let flushed = self.qp.state() == QpState::Err;
        if flushed || w.flags & send_flags::SIGNALED != 0 {
            let c = Completion {
                queue: Queue::Send,
                wr_id: w.wr_id,
                status: if flushed {
                    WcStatus::WrFlushErr
                } else {
                    WcStatus::Success
                },
                opcode,
                byte_len: 0,
                imm: None,
                qp_num: self.qp.qpn(),
                src_qp: 0,
            };
            self.pending.push_back((c, 0));
        }
        Head::Done
    }
}
