//! Protection domains (`ibv_alloc_pd`).
//!
//! A PD groups memory regions and queue pairs: a QP may only use regions of its own
//! PD (IBTA 10.6.3.1). The client keeps a small table of its PD's regions so that
//! `post_send`/`post_recv` can say which SGE names a wrong key *before* the NIC fails
//! the work request; the NIC still checks every key on every use.

use std::sync::{Arc, RwLock};

use crate::abi::control::{Handle, Reply, Request};
use crate::device::Context;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion};
use crate::qp::{QpInitAttr, QueuePair, XrcSendQpInitAttr};

/// A region of the PD as the library knows it: enough to read an inline send's bytes
/// from it (`wr::check_inline_sge`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrEntry {
    pub lkey: u32,
    pub addr: u64,
    pub len: u64,
}

pub(crate) struct PdShared {
    pub ctx: Context,
    pub handle: Handle,
    /// Regions of this PD. Read-locked by every send post (uncontended: no syscall),
    /// for its inline copies; write-locked only by registration and deregistration.
    pub mrs: RwLock<Vec<MrEntry>>,
}

impl PdShared {
    /// Lists region `entry` under this PD (registration, or a region moved here).
    pub fn add_mr(&self, entry: MrEntry) {
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(entry);
    }

    /// Unlists the region whose L_Key is `lkey` (deregistration, or a region moved
    /// away).
    pub fn remove_mr(&self, lkey: u32) {
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| m.lkey != lkey);
    }
}

impl Drop for PdShared {
    fn drop(&mut self) {
        // Best effort: if the NIC is gone, everything is gone with the connection.
        let _ = self.ctx.inner.call(
            "ibv_dealloc_pd",
            &Request::DeallocPd { pd: self.handle },
            &[],
        );
    }
}

/// A protection domain (`struct ibv_pd`). Cheap to clone; regions and QPs keep it alive,
/// and it is deallocated when the last of them is dropped.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdShared>,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

impl ProtectionDomain {
    pub(crate) fn alloc(ctx: &Context) -> Result<Self> {
        match ctx.inner.call("ibv_alloc_pd", &Request::AllocPd, &[])?.0 {
            Reply::Pd { pd } => Ok(ProtectionDomain {
                inner: Arc::new(PdShared {
                    ctx: ctx.clone(),
                    handle: pd,
                    mrs: RwLock::new(Vec::new()),
                }),
            }),
            other => Err(Error::Protocol(format!("AllocPd answered with {other:?}"))),
        }
    }

    /// The NIC's handle of this PD.
    pub fn handle(&self) -> Handle {
        self.inner.handle
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Allocates and registers `len` bytes of shared memory (`ibv_reg_mr` on a fresh
    /// buffer); see [`MemoryRegion`] for why softnic allocates the memory itself.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::alloc(self, len, access)
    }

    /// Creates a queue pair (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, attr, None)
    }

    /// Creates a queue pair that takes its receive WQEs from `srq`
    /// (`ibv_create_qp` with `ibv_qp_init_attr.srq`); `attr.cap.max_recv_wr` and
    /// `max_recv_sge` are ignored, and the QP's `post_recv` is refused.
    pub fn create_qp_with_srq(
        &self,
        attr: &QpInitAttr<'_>,
        srq: &crate::srq::SharedReceiveQueue,
    ) -> Result<QueuePair> {
        QueuePair::create(self, attr, Some(srq))
    }

    /// Creates an XRC initiator QP (`ibv_create_qp_ex` with `IBV_QPT_XRC_SEND`): an RC
    /// requester whose every work request names the remote XRC SRQ it is for
    /// ([`crate::SendWr::to_xrc_srq`]). It has no receive queue: `post_recv` is
    /// refused. See [`crate::xrc`].
    pub fn create_xrc_send_qp(&self, attr: &XrcSendQpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create_xrc_send(self, attr)
    }
}
