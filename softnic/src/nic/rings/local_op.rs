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

/// What an entry popped from the send ring is.
pub(super) enum Head {
    /// A work request for the transport.
    Transport,
    /// A local operation that must wait for the work requests before it (the ring
    /// stays marked as having more, so the runtime drains the QP again).
    Waiting,
    /// A local operation, just completed.
    Done,
}

impl QpEntry {
    /// `w`, just popped from the send ring: a local operation is completed now if its
    /// turn has come ([`Head::Done`]); [`Head::Waiting`] asks the caller to put it back.
    pub(super) fn local_op(&mut self, w: &SendWqe) -> Head {
        let opcode = match w.opcode {
            wr_opcode::BIND_MW => WcOpcode::BindMw,
            wr_opcode::LOCAL_INV => WcOpcode::LocalInv,
            _ => return Head::Transport,
        };
        if self.qp.send_queue_len() > 0 || !self.pending.is_empty() {
            return Head::Waiting;
        }
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
                src_qp: 0,
                srqn: 0,
            };
            self.pending.push_back((c, 0));
        }
        Head::Done
    }
}
