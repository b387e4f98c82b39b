//! Memory regions (`ibv_reg_mr`).
//!
//! # Why softnic allocates the memory
//! On hardware, `ibv_reg_mr` pins arbitrary user pages and the RNIC DMAs into them. The
//! softnic NIC is another *process*: it can only reach memory the client shares with it.
//! Copying through the kernel (`process_vm_writev`, a socket) would put a syscall and a
//! copy on every transfer, which defeats the purpose. So a region is a memfd that the
//! client maps and passes to the NIC, which maps it too: the NIC's writes land directly
//! in the client's pages (zero copy), and heap memory (`Vec`, `Box`) cannot be
//! registered. Allocate with [`crate::ProtectionDomain::alloc_mr`] and work in
//! [`MemoryRegion::as_mut_slice`].
//!
//! The region's address ([`MemoryRegion::addr`], its iova) is the client's mapping
//! address, as in real verbs: SGEs and remote addresses (RETH VA) are client virtual
//! addresses, and the NIC translates `offset = va − iova`.

use std::fmt;
use std::ops::BitOr;
use std::os::fd::AsFd;
use std::sync::Arc;

use memmap2::MmapRaw;

use crate::abi::control::{Handle, Reply, Request};
use crate::abi::layout::mr_segment_len;
use crate::abi::Sge;
use crate::error::{io, Error, Result};
use crate::os;
use crate::pd::{MrEntry, PdShared, ProtectionDomain};

/// Memory access rights (`enum ibv_access_flags`, same bit values).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// Local read only.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// IBV_ACCESS_LOCAL_WRITE: the NIC may write (receives, READ responses, atomics' results).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// IBV_ACCESS_REMOTE_WRITE (requires LOCAL_WRITE).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// IBV_ACCESS_REMOTE_ATOMIC (requires LOCAL_WRITE).
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(8);
    /// Every right.
    pub const ALL: AccessFlags = AccessFlags(0xF);

    /// True when every right in `other` is in `self`.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Checks the verbs rules: only known bits, and remote write/atomic need local write
    /// (`ibv_reg_mr(3)`: "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set,
    /// then IBV_ACCESS_LOCAL_WRITE must be set too").
    pub fn validate(self) -> Result<()> {
        if self.0 & !Self::ALL.0 != 0 {
            return Err(Error::InvalidArgument(format!(
                "access flags {:#x} contain bits softnic does not know (known: {:#x})",
                self.0,
                Self::ALL.0
            )));
        }
        if (self.contains(Self::REMOTE_WRITE) || self.contains(Self::REMOTE_ATOMIC))
            && !self.contains(Self::LOCAL_WRITE)
        {
            return Err(Error::InvalidArgument(format!(
                "access {self:?}: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"
            )));
        }
        Ok(())
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            write!(f, "NONE")
        } else {
            write!(f, "{}", set.join("|"))
        }
    }
}

/// A registered memory region (`struct ibv_mr`) backed by shared memory.
///
/// The NIC may write into it at any time the access flags allow (receives, READ
/// responses, remote WRITEs and atomics): read the bytes after the completion that
/// tells you they arrived (the CQ's acquire orders them). `Send + Sync`.
pub struct MemoryRegion {
    map: MmapRaw,
    len: usize,
    handle: Handle,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    pd: Arc<PdShared>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    pub(crate) fn alloc(pd: &ProtectionDomain, len: usize, access: AccessFlags) -> Result<Self> {
        access.validate()?;
        let max = pd.inner.ctx.inner.attr().max_mr_size;
        if len as u64 > max {
            return Err(Error::InvalidArgument(format!(
                "memory region of {len} bytes exceeds the device's max_mr_size {max}"
            )));
        }
        let seg_len = mr_segment_len(len)?;
        let fd = os::memfd("softnic-mr", seg_len).map_err(io("creating the region's memfd"))?;
        let map = os::map_shared(fd.as_fd(), seg_len).map_err(io("mapping the region"))?;
        let iova = map.as_ptr() as u64;
        let req = Request::RegMr {
            pd: pd.inner.handle,
            len: len as u64,
            access: access.0,
            iova,
        };
        let (reply, _) = pd.inner.ctx.inner.call("ibv_reg_mr", &req, &[fd.as_fd()])?;
        let (handle, lkey, rkey) = match reply {
            Reply::Mr { mr, lkey, rkey } => (mr, lkey, rkey),
            other => return Err(Error::Protocol(format!("RegMr answered with {other:?}"))),
        };
        pd.inner
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(MrEntry {
                lkey,
                addr: iova,
                len: len as u64,
                access,
            });
        Ok(MemoryRegion {
            map,
            len,
            handle,
            lkey,
            rkey,
            access,
            pd: pd.inner.clone(),
        })
    }

    /// Address of the first byte (the region's iova; use it in SGEs and give it to the
    /// peer for RDMA WRITE/READ/atomics).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// Length in bytes (as registered; the mapping may be page-rounded beyond it).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The NIC's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// An SGE covering `len` bytes at `offset` of this region. Panics if the range is
    /// outside the region (a programming error, like slice indexing).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset
                .checked_add(len as usize)
                .is_some_and(|e| e <= self.len),
            "SGE [{offset}, +{len}) is outside the {}-byte region",
            self.len
        );
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey,
        }
    }

    /// The region's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `len` bytes (page-rounded) and lives as long as
        // `self`. Its bytes may be written by the NIC process when this region grants it
        // rights; like every verbs binding, we rely on the application reading only
        // bytes whose completion it has seen (the CQ acquire orders the NIC's writes).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }

    /// The region's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes other borrows in this process.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr(), self.len) }
    }

    /// The 8-byte word at `offset` as an atomic (an atomics target): reading it with
    /// `load` sees remote FETCH_ADD/CMP_SWAP results without tearing. `offset` must be
    /// 8-byte aligned and inside the region.
    pub fn atomic_u64(&self, offset: usize) -> Result<&std::sync::atomic::AtomicU64> {
        if offset % 8 != 0 || offset.checked_add(8).map_or(true, |e| e > self.len) {
            return Err(Error::InvalidArgument(format!(
                "atomic word at offset {offset} must be 8-byte aligned and inside the {}-byte region",
                self.len
            )));
        }
        // SAFETY: in bounds (checked), 8-byte aligned (mapping is page aligned, offset
        // multiple of 8), lives as long as `&self`; AtomicU64 tolerates concurrent
        // access by the NIC.
        Ok(unsafe { &*(self.map.as_ptr().add(offset) as *const std::sync::atomic::AtomicU64) })
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.pd
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| m.lkey != self.lkey);
        let _ = self
            .pd
            .ctx
            .inner
            .call("ibv_dereg_mr", &Request::DeregMr { mr: self.handle }, &[]);
    }
}
