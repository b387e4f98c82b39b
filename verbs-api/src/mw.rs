//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`;
//! IBTA 10.6.7).
//!
//! A window gives a peer remote access to part of a memory region through an R_Key of
//! its own, which the owner can move, narrow or revoke without re-registering the
//! region. The NIC keeps every window (`softnic/src/nic/mw.rs`) and checks an incoming
//! R_Key against the window's range and rights and the region under it. A bind or
//! invalidation is a control request the NIC carries out at post time, followed by a
//! data-less WQE on the send queue that the NIC completes in order with the queue's
//! other work requests (`IBV_WC_BIND_MW`, `IBV_WC_LOCAL_INV`).

use std::sync::Arc;

use crate::abi::control::{Handle, Reply, Request};
use crate::abi::slots::wr_opcode;
use crate::error::{Error, Result};
use crate::pd::{PdShared, ProtectionDomain};
use crate::qp::QueuePair;

/// Windows one client may hold at once (`ibv_device_attr.max_mw`; the NIC refuses
/// more).
pub const MAX_MW: u32 = 4096;

/// A memory window (`struct ibv_mw`).
pub struct MemoryWindow {
    handle: Handle,
    mw_type: u8,
    rkey: u32,
    pd: Arc<PdShared>,
}

/// What a bind attaches the window to (`struct ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindInfo {
    /// The region's handle ([`crate::MemoryRegion::handle`]).
    pub mr: Handle,
    /// First byte (client virtual address, inside the region).
    pub addr: u64,
    /// Length in bytes (0 unbinds a type 1 window).
    pub len: u64,
    /// `ibv_access_flags`: remote read, write and atomic only.
    pub access: u32,
}

/// `ibv_inc_rkey`: the same window index with the next key byte, the R_Key a rebind
/// gives a window so that the old one stops working (IBTA 10.6.7.2.1).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

impl ProtectionDomain {
    /// Allocates a memory window of type 1 or 2 (`ibv_alloc_mw`), unbound.
    pub fn alloc_mw(&self, mw_type: u8) -> Result<MemoryWindow> {
        let req = Request::AllocMw {
            pd: self.inner.handle,
            mw_type,
        };
        match self.inner.ctx.inner.call("ibv_alloc_mw", &req, &[])?.0 {
            Reply::Mw { mw, rkey } => Ok(MemoryWindow {
                handle: mw,
                mw_type,
                rkey,
                pd: self.inner.clone(),
            }),
            other => Err(Error::Protocol(format!("AllocMw answered with {other:?}"))),
        }
    }
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("handle", &self.handle)
            .field("mw_type", &self.mw_type)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryWindow {
    /// The NIC's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// 1 or 2.
    pub fn mw_type(&self) -> u8 {
        self.mw_type
    }

    /// The R_Key of the window's last type 1 bind (or its initial one).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let _ = self.pd.ctx.inner.call(
            "ibv_dealloc_mw",
            &Request::DeallocMw { mw: self.handle },
            &[],
        );
    }
}

impl QueuePair {
    /// `ibv_bind_mw` for a type 1 window: binds it under the next R_Key
    /// ([`inc_rkey`]), which it returns and [`MemoryWindow::rkey`] reports from then
    /// on, and posts the bind's WQE (`IBV_WC_BIND_MW` when `signaled`).
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        signaled: bool,
        mw: &mut MemoryWindow,
        info: &MwBindInfo,
    ) -> Result<u32> {
        let rkey = inc_rkey(mw.rkey);
        self.post_bind_mw(wr_id, signaled, mw.handle, rkey, info)?;
        mw.rkey = rkey;
        Ok(rkey)
    }

    /// An `IBV_WR_BIND_MW` work request: binds window `mw` (type 2, or type 1) under
    /// `rkey` (the window's index, a key byte of the caller's choice).
    pub fn post_bind_mw(
        &mut self,
        wr_id: u64,
        signaled: bool,
        mw: Handle,
        rkey: u32,
        info: &MwBindInfo,
    ) -> Result<()> {
        let req = Request::BindMw {
            qpn: self.qp_num(),
            mw,
            mr: info.mr,
            rkey,
            addr: info.addr,
            len: info.len,
            access: info.access,
        };
        self.post_local("ibv_bind_mw", &req, wr_id, wr_opcode::BIND_MW, signaled)
    }

    /// An `IBV_WR_LOCAL_INV` work request: invalidates the type 2 window whose R_Key
    /// is `rkey`.
    pub fn post_local_inv(&mut self, wr_id: u64, signaled: bool, rkey: u32) -> Result<()> {
        let req = Request::InvalidateMw {
            qpn: self.qp_num(),
            rkey,
        };
        self.post_local(
            "ibv_post_send(IBV_WR_LOCAL_INV)",
            &req,
            wr_id,
            wr_opcode::LOCAL_INV,
            signaled,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_changes_only_the_key_byte() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
    }
}
