//! Registering memory the caller already shares through a memfd (`ibv_reg_mr` on a
//! buffer the caller mapped itself): the building block of softnic's drop-in
//! libibverbs, which remaps a program's pages onto a memfd in place and registers that.
//!
//! Unlike [`crate::MemoryRegion`], the region's mapping belongs to the caller: this
//! type only holds the registration (keys, the PD's local key table entry) and undoes
//! it on drop. With [`ProtectionDomain::reg_fd`] the NIC maps the memfd itself, from
//! offset 0, for `len` bytes rounded up to a page, and translates `iova` .. `iova +
//! len` onto it. With [`ProtectionDomain::reg_fd_window`] the NIC assembles the mapping
//! from page ranges of a memfd and of live registrations' mappings, and `iova` is the
//! byte at `offset` in it: a buffer that does not start on a page, and several
//! registrations on the same pages. Memory that cannot become a memfd goes by
//! [`ProtectionDomain::reg_sysv`] (a SysV segment the NIC attaches itself) or
//! [`ProtectionDomain::reg_copy`] (the NIC copies through the caller's
//! `/proc/self/mem`).

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::abi::control::{Handle, MrSegment, Reply, Request};
use crate::error::{Error, Result};
use crate::mr::AccessFlags;
use crate::pd::{MrEntry, PdShared, ProtectionDomain};

/// A registration of caller-mapped, memfd-backed memory. `Send + Sync`.
pub struct FdMemoryRegion {
    iova: u64,
    len: u64,
    handle: Handle,
    lkey: u32,
    rkey: u32,
    pd: Arc<PdShared>,
}

impl std::fmt::Debug for FdMemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdMemoryRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .finish()
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes of `fd` (from its offset 0) at client address `iova`, where
    /// the caller has mapped the same memfd `MAP_SHARED` and keeps it mapped while the
    /// registration lives (local SGEs and inline sends are read from that mapping).
    pub fn reg_fd(
        &self,
        fd: BorrowedFd<'_>,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<FdMemoryRegion> {
        self.register(iova, len, access, &[fd], |pd, len, access| Request::RegMr {
            pd,
            len,
            access,
            iova,
        })
    }

    /// Registers `len` bytes from byte `offset` of a mapping the NIC assembles from
    /// `segments` at client address `iova` (see `Request::RegMrWindow`): pages of `fd`
    /// (mapped by the caller as for [`ProtectionDomain::reg_fd`]) and pages that a
    /// live registration of this context already gave the NIC (a memfd is mapped by
    /// the NIC only once). Several registrations can so cover the same pages, each
    /// bounded to exactly its own bytes.
    pub fn reg_fd_window(
        &self,
        fd: Option<BorrowedFd<'_>>,
        segments: Vec<MrSegment>,
        offset: u64,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<FdMemoryRegion> {
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        self.register(iova, len, access, &fds, |pd, len, access| {
            Request::RegMrWindow {
                pd,
                len,
                access,
                iova,
                offset,
                segments,
            }
        })
    }

    /// Registers `len` bytes from byte `offset` of the SysV segment `shmid`, which the
    /// caller has attached read-write with that byte at `iova` (see
    /// `Request::RegMrSysv`: the NIC attaches the segment too; zero-copy). Refused for
    /// hugetlb segments and segments the caller's uid does not own.
    pub fn reg_sysv(
        &self,
        shmid: i32,
        offset: u64,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<FdMemoryRegion> {
        self.register(iova, len, access, &[], |pd, len, access| {
            Request::RegMrSysv {
                pd,
                len,
                access,
                iova,
                shmid,
                offset,
            }
        })
    }

    /// Registers `[iova, iova + len)` of this process's memory, whatever backs it: the
    /// NIC copies through `proc_mem` (this process's `/proc/self/mem`, opened
    /// read-write) on every access (see `Request::RegMrCopy`). Nothing is mapped or
    /// pinned, so the range need not be mapped yet, and the device's `max_mr_size`
    /// (a bound on what the NIC maps) does not apply: an access to bytes that are not
    /// mapped when it happens fails as an access outside the region would (this is
    /// what on-demand paging registrations rely on). Atomics on it are refused.
    pub fn reg_copy(
        &self,
        proc_mem: BorrowedFd<'_>,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<FdMemoryRegion> {
        access.validate()?;
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(format!(
                "memory region of {len} bytes at {iova:#x} exceeds the address space"
            )));
        }
        let req = Request::RegMrCopy {
            pd: self.inner.handle,
            len: len as u64,
            access: access.0,
            iova,
        };
        self.finish_fd_region(&req, &[proc_mem], iova, len)
    }

    /// Checks the region, then sends the request `make(pd, len, access bits)` with
    /// `fds` and records the registration.
    fn register(
        &self,
        iova: u64,
        len: usize,
        access: AccessFlags,
        fds: &[BorrowedFd<'_>],
        make: impl FnOnce(Handle, u64, u32) -> Request,
    ) -> Result<FdMemoryRegion> {
        self.check_fd_region(iova, len, access)?;
        let req = make(self.inner.handle, len as u64, access.0);
        self.finish_fd_region(&req, fds, iova, len)
    }

    fn check_fd_region(&self, iova: u64, len: usize, access: AccessFlags) -> Result<()> {
        access.validate()?;
        let max = self.inner.ctx.inner.attr().max_mr_size;
        if len as u64 > max || iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(format!(
                "memory region of {len} bytes at {iova:#x} exceeds the device's max_mr_size \
                 {max} or the address space"
            )));
        }
        Ok(())
    }

    fn finish_fd_region(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
        iova: u64,
        len: usize,
    ) -> Result<FdMemoryRegion> {
        let (reply, _) = self.inner.ctx.inner.call("ibv_reg_mr", req, fds)?;
        let (handle, lkey, rkey) = match reply {
            Reply::Mr { mr, lkey, rkey } => (mr, lkey, rkey),
            other => return Err(Error::Protocol(format!("RegMr answered with {other:?}"))),
        };
        self.inner.add_mr(MrEntry {
            lkey,
            addr: iova,
            len: len as u64,
        });
        Ok(FdMemoryRegion {
            iova,
            len: len as u64,
            handle,
            lkey,
            rkey,
            pd: self.inner.clone(),
        })
    }
}

impl FdMemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// First byte's client address.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The NIC's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_PD` (`pd`, of the same context) and/or
    /// `IBV_REREG_MR_CHANGE_ACCESS` (`access`): the region keeps its memory, address
    /// and keys, so the keys a program has already handed to its peer stay valid (a
    /// moved region answers only QPs of its new PD; an R_Key whose remote rights were
    /// taken away reaches nothing). Memory windows bound to it are unbound, as
    /// `ibv_rereg_mr(3)` defines re-registration as a deregistration followed by a
    /// registration. On an error the region is as it was.
    pub fn rereg(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        if let Some(a) = access {
            a.validate()?;
        }
        if pd.is_some_and(|p| !Arc::ptr_eq(&p.inner.ctx.inner, &self.pd.ctx.inner)) {
            return Err(Error::InvalidArgument(
                "the new protection domain belongs to another device context".into(),
            ));
        }
        let req = Request::ReregMr {
            mr: self.handle,
            pd: pd.map(|p| p.inner.handle),
            access: access.map(AccessFlags::bits),
        };
        match self.pd.ctx.inner.call("ibv_rereg_mr", &req, &[])?.0 {
            Reply::Done => {}
            other => return Err(Error::Protocol(format!("ReregMr answered with {other:?}"))),
        }
        if let Some(p) = pd.filter(|p| !Arc::ptr_eq(&p.inner, &self.pd)) {
            // The PD's table of regions (its posts' inline copies look keys up there).
            self.pd.remove_mr(self.lkey);
            p.inner.add_mr(MrEntry {
                lkey: self.lkey,
                addr: self.iova,
                len: self.len,
            });
            self.pd = p.inner.clone();
        }
        Ok(())
    }
}

impl Drop for FdMemoryRegion {
    fn drop(&mut self) {
        self.pd.remove_mr(self.lkey);
        let _ = self
            .pd
            .ctx
            .inner
            .call("ibv_dereg_mr", &Request::DeregMr { mr: self.handle }, &[]);
    }
}
