//! `ibv_reg_mr` of a program's own memory: the pages are remapped in place onto a memfd.
//! (A registration with `IBV_ACCESS_ON_DEMAND` converts nothing: [`crate::odp`].)
//!
//! The NIC is another process, so it can reach a buffer only through shared memory.
//! This mechanism (abi-facts §4 (a)) copies the pages that hold the buffer into a
//! fresh memfd and maps the memfd `MAP_SHARED | MAP_FIXED` over the same addresses: the
//! program keeps its pointers and contents, and the NIC maps the same memfd. It is
//! zero-copy from then on. What is supported, and what is refused (never silently
//! mishandled):
//!
//! * Any start and length (struct fields, `malloc` buffers, sub-page buffers): the
//!   containing page range — start rounded down, end rounded up — is converted, and the
//!   MR is a window onto it at the buffer's offset. Its `addr`/`length` and keys cover
//!   exactly the caller's bytes: the NIC checks every access against them, so the heap
//!   neighbours that share the edge pages are unreachable through the MR.
//! * Pages already converted by a live registration are not converted again (that
//!   would detach the earlier MR from the program's memory): a registration that lies
//!   inside them — the same buffer twice, two buffers on one page, nested or
//!   overlapping buffers within those pages — is another window onto the same memfd,
//!   which the NIC maps once and shares between the MRs
//!   ([`verbs_api::ProtectionDomain::reg_fd_window`]). The
//!   table [`LIVE`] is the process's record of which page ranges are converted; a
//!   range stays there while any MR on it lives.
//! * A registration that *extends* a live converted range (starts inside it and ends
//!   past it, e.g. a second heap buffer whose first page is the last page of a
//!   registered one, but which runs on into pages never converted) is refused with
//!   EOPNOTSUPP: its bytes would span two memfds, and a region is one mapping in the
//!   NIC.
//! * Only private memory is converted, per `/proc/self/maps`: anonymous (heap,
//!   `mmap(MAP_ANONYMOUS|MAP_PRIVATE)`) and private file mappings (a program's
//!   `.data`/`.bss`, copy-on-write, so no one else sees them). Remapping shared memory
//!   would silently un-share it from its other users, so SysV shm, `/dev/shm`, shared
//!   file mappings, hugetlbfs and the stack (it grows down; never remapped) — and a
//!   range of more than [`MAX_MR_SEGMENTS`] pieces — are registered without remapping
//!   ([`crate::mr_backing`]: the NIC attaches SysV segments, and copies through
//!   `/proc/self/mem` for the rest). Pages of a registration since deregistered can be
//!   registered again (they move to a fresh memfd).
//! * Another thread writing those pages *during* `ibv_reg_mr` (a heap neighbour on an
//!   edge page) waits until the remap is done and its write lands in the shared page
//!   ([`crate::write_fence`]: Linux has no atomic "make this range shared").
//! * The converted pages are `MADV_DONTFORK`: a child after `fork()` has no mapping
//!   there (it faults if it touches them) instead of sharing the parent's pages — what
//!   rdma-core does after `ibv_fork_init()`, hence `ibv_is_fork_initialized()` =
//!   ENABLED. With unaligned buffers this includes the heap neighbours on the edge
//!   pages. Pages no live MR holds any more are made private anonymous again at
//!   `ibv_dereg_mr` (same bytes; [`privatise`]), so `fork()`, `MADV_DONTNEED`, `free`
//!   and `malloc` behave as before registration.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use verbs_api::abi::control::{MrSegment, MAX_MR_SEGMENTS};
use verbs_api::{AccessFlags, FdMemoryRegion, ProtectionDomain};

use crate::abi::*;
use crate::errno;
use crate::objects::{last_errno, softnic_pd, SoftnicPd};
use crate::odp;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a provider may ignore (rdma-core masks
/// those it does not support before they reach the kernel).
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// A live registration: the converted page range `[start, end)` it is a window onto
/// (one memfd; every live MR on it names the same range), its lkey.
struct Live {
    range: (usize, usize),
    lkey: u32,
    /// The NIC's handle, named when a later registration shares the memfd.
    handle: u32,
}

/// Live registrations of this process, hence its converted page ranges.
static LIVE: Mutex<Vec<Live>> = Mutex::new(Vec::new());

/// An MR: `ibv_mr`, then the verbs-api registration.
#[repr(C)]
pub struct SoftnicMr {
    /// Public part.
    pub mr: ibv_mr,
    reg: FdMemoryRegion,
    /// Its `ibv_access_flags`, for a re-registration that keeps them.
    access: u32,
    /// For a region on device memory: that allocation's count of regions.
    dm: Option<Arc<AtomicU32>>,
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// True when every byte of `[start, end)` lies in private read-write mappings
/// (anonymous, `[heap]`, or of a regular file) or in pages this library converted
/// earlier, per `/proc/self/maps`.
fn private_memory(start: usize, end: usize) -> bool {
    let Some(maps) = crate::mr_backing::covering(start, end) else {
        return false; // a hole, or the maps could not be read
    };
    maps.iter().all(|m| {
        let (path, perms) = (m.path.as_str(), m.perms.as_str());
        // Private file mappings (a program's `.data`/`.bss`, where rdma_client keeps its
        // static buffers) are copy-on-write: nobody else sees their pages, so moving
        // them to a memfd un-shares nothing. Not hugetlbfs, devices or SysV shm.
        let private_file = path.starts_with('/')
            && !path.starts_with("/anon_hugepage")
            && !path.starts_with("/dev/")
            && !m.is_sysv()
            && !path.starts_with("/memfd:");
        let anonymous = path.is_empty() || path == "[heap]" || private_file;
        // Pages this library converted before (a registration since deregistered):
        // converting them again only moves them to a fresh memfd.
        let ours = path.starts_with("/memfd:softnic-ibv-mr");
        perms.starts_with("rw")
            && ((anonymous && perms.ends_with('p')) || (ours && perms.ends_with('s')))
    })
}

/// Copies each gap `[a, b)` (client addresses, page-aligned, in order) into a new
/// memfd, one after the other, and maps the memfd's part over each gap, with writers
/// from other threads held off meanwhile across the whole `[start, end)`
/// ([`crate::write_fence`]). verbs-api's memfd is sealed against shrinking, as the NIC
/// requires. The copy is a `pwrite` from the range itself: the kernel fills the
/// memfd's pages directly, about ten times faster here than faulting them in through
/// a second mapping.
///
/// # Safety
/// Every gap is mapped private read-write memory of this process inside
/// `[start, end)`.
unsafe fn remap_onto_memfd(
    start: usize,
    end: usize,
    gaps: &[(usize, usize)],
) -> Result<OwnedFd, c_int> {
    let total: usize = gaps.iter().map(|(a, b)| b - a).sum();
    let fd = verbs_api::os::memfd("softnic-ibv-mr", total)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    let raw = fd.as_raw_fd();
    // Other threads' writes to these pages wait until the remap is done (write_fence).
    crate::write_fence::fenced(start, end - start, || {
        let mut file_off = 0usize;
        for &(a, b) in gaps {
            let len = b - a;
            let mut done = 0usize;
            while done < len {
                // SAFETY: reads [a + done, b) of the caller's mapped gap.
                let n = unsafe {
                    libc::pwrite(
                        raw,
                        (a + done) as *const c_void,
                        len - done,
                        (file_off + done) as libc::off_t,
                    )
                };
                if n < 0 {
                    let e = last_errno();
                    if e == libc::EINTR {
                        continue;
                    }
                    return Err(e);
                }
                if n == 0 {
                    return Err(libc::EIO);
                }
                done += n as usize;
            }
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            // SAFETY: MAP_FIXED replaces exactly the gap (private memory, checked by the
            // caller) with a mapping that holds the same bytes.
            unsafe {
                let fixed = libc::mmap(
                    a as *mut c_void,
                    len,
                    rw,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    raw,
                    file_off as libc::off_t,
                );
                if fixed == libc::MAP_FAILED {
                    return Err(last_errno());
                }
                libc::madvise(a as *mut c_void, len, libc::MADV_DONTFORK);
            }
            file_off += len;
        }
        Ok(())
    })?;
    Ok(fd)
}

/// Undoes [`remap_onto_memfd`] (when the NIC refuses the registration, or after the
/// last MR on the pages is deregistered): the range becomes private anonymous memory
/// again, with the same bytes, so `fork()` children, `MADV_DONTNEED` and heap
/// neighbours behave as before registration. The bytes are copied to a fresh private
/// mapping that `mremap` then moves over the range in one step, writers waiting
/// meanwhile ([`crate::write_fence`]); readers see the same bytes throughout. On any
/// failure the range keeps its memfd mapping, which still holds the program's bytes.
///
/// # Safety
/// `[start, start + len)` is a range [`remap_onto_memfd`] converted, no longer
/// registered with the NIC.
unsafe fn privatise(start: usize, len: usize) {
    let _ = crate::write_fence::fenced(start, len, || {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh private mapping of len bytes; the copy reads the (read-only
        // for now, still mapped) range; mremap moves the copy over exactly that range.
        unsafe {
            let tmp = libc::mmap(
                std::ptr::null_mut(),
                len,
                rw,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if tmp == libc::MAP_FAILED {
                return Err(last_errno());
            }
            std::ptr::copy_nonoverlapping(start as *const u8, tmp as *mut u8, len);
            let moved = libc::mremap(
                tmp,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                start as *mut c_void,
            );
            if moved == libc::MAP_FAILED {
                let e = last_errno();
                libc::munmap(tmp, len);
                return Err(e);
            }
        }
        Ok(())
    });
}

/// Registers `[addr, addr + length)` with iova = `addr`.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `addr..addr+length` is the program's memory.
unsafe fn reg(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: u32) -> *mut ibv_mr {
    if pd.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    match unsafe { register(&softnic_pd(pd).api, addr, length, access) } {
        // SAFETY: pd is live (caller contract).
        Ok(reg) => unsafe { boxed(pd, addr, length, reg, access) },
        Err(e) => errno::null(e),
    }
}

/// The registration of `[addr, addr + length)` on `p`, iova = `addr`, or an errno:
/// the program's private pages are moved onto a memfd the NIC maps (pages a live
/// registration holds are shared from it), and memory that cannot be (SysV, shared
/// files, the stack, hugepages) goes by `mr_backing`.
///
/// # Safety
/// `addr..addr+length` is the program's memory.
unsafe fn register(
    pd: &ProtectionDomain,
    addr: *mut c_void,
    length: usize,
    access: u32,
) -> Result<FdMemoryRegion, c_int> {
    let on_demand = access & odp::ACCESS_ON_DEMAND != 0;
    let access = AccessFlags(
        access & !(ACCESS_OPTIONAL_RANGE | odp::ACCESS_ON_DEMAND | odp::ACCESS_HUGETLB),
    );
    if access.validate().is_err() {
        return Err(libc::EINVAL);
    }
    if on_demand {
        return odp::register(pd, addr, length, access);
    }
    if addr.is_null() || length == 0 {
        return Err(libc::EINVAL);
    }
    let page = page_size();
    let first = addr as usize;
    let start = first & !(page - 1);
    let Some(end) = first
        .checked_add(length)
        .and_then(|e| e.checked_add(page - 1))
        .map(|e| e & !(page - 1))
    else {
        return Err(libc::EINVAL);
    };
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    // The pages as runs: those a live MR's mapping holds are shared from it, the rest
    // (gaps) are converted now into one new memfd.
    let mut segments = Vec::new();
    let mut gaps = Vec::new();
    let mut gap_bytes = 0usize;
    let mut a = start;
    while a < end {
        if let Some(m) = live.iter().find(|m| m.range.0 <= a && a < m.range.1) {
            let b = m.range.1.min(end);
            segments.push(MrSegment {
                share: Some(m.handle),
                offset: (a - m.range.0) as u64,
                len: (b - a) as u64,
            });
            a = b;
        } else {
            let next = live.iter().map(|m| m.range.0).filter(|&s| s > a).min();
            let b = next.unwrap_or(end).min(end);
            segments.push(MrSegment {
                share: None,
                offset: gap_bytes as u64,
                len: (b - a) as u64,
            });
            gaps.push((a, b));
            gap_bytes += b - a;
            a = b;
        }
    }
    if segments.len() > MAX_MR_SEGMENTS || !gaps.iter().all(|&(a, b)| private_memory(a, b)) {
        // Not remappable: SysV shm, shared files, hugetlb, the stack (mr_backing).
        return crate::mr_backing::register(pd, first, length, access);
    }
    let fd = if gaps.is_empty() {
        None
    } else {
        // SAFETY: checked just above: private read-write memory.
        match unsafe { remap_onto_memfd(start, end, &gaps) } {
            Ok(fd) => Some(fd),
            Err(e) => return Err(e),
        }
    };
    let offset = (first - start) as u64;
    let registered = pd.reg_fd_window(
        fd.as_ref().map(|f| f.as_fd()),
        segments,
        offset,
        first as u64,
        length,
        access,
    );
    if registered.is_err() {
        for &(a, b) in &gaps {
            // SAFETY: converted just now; the NIC refused the registration.
            unsafe { privatise(a, b - a) };
        }
    }
    let range = (start, end);
    let reg = registered.map_err(|e| errno::of(&e))?;
    live.push(Live {
        range,
        lkey: reg.lkey(),
        handle: reg.handle(),
    });
    Ok(reg)
}

/// Drops registration `reg` (the NIC's DeregMr: it no longer touches these bytes
/// through it), then makes the pages no other live registration holds private again,
/// run by run.
///
/// # Safety
/// `reg` came from [`register`].
unsafe fn unregister(reg: FdMemoryRegion) {
    odp::forget(reg.lkey());
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = live.iter().position(|m| m.lkey == reg.lkey()) else {
        return; // a SysV or copied region: nothing was converted
    };
    let range = live.swap_remove(i).range;
    drop(reg);
    let page = page_size();
    let held = |a: usize| live.iter().any(|m| m.range.0 <= a && a < m.range.1);
    let mut a = range.0;
    while a < range.1 {
        if held(a) {
            a += page;
            continue;
        }
        let mut b = a + page;
        while b < range.1 && !held(b) {
            b += page;
        }
        // SAFETY: converted by `register`; no live registration is left on [a, b).
        unsafe { privatise(a, b - a) };
        a = b;
    }
}

/// A registration of the program's own memory made by softnic's other libraries
/// (rsockets' `riomap`), with the same mechanism as `ibv_reg_mr` (the module doc)
/// and the same process-wide record of converted pages, so it and the program's own
/// `ibv_reg_mr`s of neighbouring or the same pages never detach each other. Dropping
/// it deregisters it (and makes pages no other registration holds private again).
#[derive(Debug)]
pub struct ProgramMr {
    reg: Option<FdMemoryRegion>,
    addr: usize,
    len: usize,
}

impl ProgramMr {
    /// Registers the program's `[addr, addr + len)` on `pd` with `access`, iova =
    /// `addr`; an errno as `ibv_reg_mr` sets it on failure.
    ///
    /// # Safety
    /// `addr..addr + len` is the program's memory (as for `ibv_reg_mr`).
    pub unsafe fn register(
        pd: &ProtectionDomain,
        addr: *mut c_void,
        len: usize,
        access: AccessFlags,
    ) -> Result<ProgramMr, c_int> {
        // SAFETY: caller contract.
        let reg = unsafe { register(pd, addr, len, access.bits()) }?;
        Ok(ProgramMr {
            reg: Some(reg),
            addr: addr as usize,
            len,
        })
    }

    /// The registered bytes' first address (= iova).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The registered length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the registration is empty (never: `register` refuses a zero length).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The R_Key a peer writes with.
    pub fn rkey(&self) -> u32 {
        self.reg.as_ref().map_or(0, FdMemoryRegion::rkey)
    }
}

impl Drop for ProgramMr {
    fn drop(&mut self) {
        if let Some(reg) = self.reg.take() {
            // SAFETY: made by `register`.
            unsafe { unregister(reg) };
        }
    }
}

/// The `ibv_mr` of registration `reg` of `[addr, addr + length)` on `pd` (counted
/// as a user of the PD).
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` and is live.
unsafe fn boxed(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    reg: FdMemoryRegion,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: caller contract.
    unsafe { softnic_pd(pd) }
        .users
        .fetch_add(1, Ordering::AcqRel);
    let b = Box::new(SoftnicMr {
        mr: ibv_mr {
            // SAFETY: pd is live.
            context: unsafe { (*pd).context },
            pd,
            addr,
            length,
            handle: reg.handle(),
            lkey: reg.lkey(),
            rkey: reg.rkey(),
        },
        reg,
        access,
        dm: None,
    });
    Box::into_raw(b) as *mut ibv_mr
}

/// The `ibv_mr` of a zero-based region `reg` of `length` bytes on device memory
/// (`crate::dm`): `addr` NULL, as the kernel reports; counted as a user of the PD and
/// of the allocation (`dm_users`).
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` and is live.
pub(crate) unsafe fn boxed_dm(
    pd: *mut ibv_pd,
    reg: FdMemoryRegion,
    length: usize,
    access: u32,
    dm_users: Arc<AtomicU32>,
) -> *mut ibv_mr {
    // SAFETY: caller contract.
    let mr = unsafe { boxed(pd, std::ptr::null_mut(), length, reg, access) };
    dm_users.fetch_add(1, Ordering::AcqRel);
    // SAFETY: just made by `boxed`: the first field of a boxed SoftnicMr.
    unsafe { (*(mr as *mut SoftnicMr)).dm = Some(dm_users) };
    mr
}

/// `ibv_reg_mr` (see the module doc for what is supported).
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; the buffer is the program's memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg(pd, addr, length, access as u32) }
}

/// `ibv_reg_mr_iova2`: only `iova == addr` (softnic's NIC addresses regions by the
/// program's virtual address); another iova is EOPNOTSUPP.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    if iova != addr as u64 {
        return errno::null(libc::EOPNOTSUPP);
    }
    // SAFETY: forwarded caller contract.
    unsafe { reg(pd, addr, length, access) }
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// `mr` came from [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: reverses reg's Box::into_raw (caller contract: once).
    let b = unsafe { Box::from_raw(mr as *mut SoftnicMr) };
    // SAFETY: the PD outlives its MRs (dealloc is EBUSY while users != 0).
    unsafe { softnic_pd(b.mr.pd) }
        .users
        .fetch_sub(1, Ordering::AcqRel);
    if let Some(d) = &b.dm {
        d.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: made by `register` (or `reg_fd_window`, which converted nothing).
    unsafe { unregister(b.reg) };
    0
}

/// `IBV_REREG_MR_ERR_INPUT` of `<infiniband/verbs.h>`: an input error, the MR is as it was.
const REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the provider's command failed.
const REREG_MR_ERR_CMD: c_int = -4;
/// `IBV_REREG_MR_CHANGE_TRANSLATION`.
const REREG_MR_CHANGE_TRANSLATION: c_int = 1;
/// `IBV_REREG_MR_CHANGE_PD`.
const REREG_MR_CHANGE_PD: c_int = 2;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
const REREG_MR_CHANGE_ACCESS: c_int = 4;

/// `ibv_rereg_mr`: libibverbs' input checks (`IBV_REREG_MR_ERR_INPUT`, EINVAL), then
/// the provider's part. A new PD (`IBV_REREG_MR_CHANGE_PD`) and new access flags
/// (`IBV_REREG_MR_CHANGE_ACCESS`) alone are applied by the NIC to the same memory
/// under the same keys ([`FdMemoryRegion::rereg`]), so the R_Key a peer holds stays
/// valid. A new translation (`IBV_REREG_MR_CHANGE_TRANSLATION`, with or without the
/// others) registers the new range and then drops the old registration, as
/// `ibv_rereg_mr(3)` describes a re-registration: the MR gets new keys (the kernel's
/// rereg command may return new ones too, and libibverbs stores them in the `ibv_mr`).
/// A refused change is `IBV_REREG_MR_ERR_CMD`, as libibverbs reports a provider's
/// failure, with `errno` set; the MR is then as it was.
///
/// # Safety
/// `mr` came from [`ibv_reg_mr`] and is live; with `IBV_REREG_MR_CHANGE_PD`, `pd` came
/// from `ibv_alloc_pd` and is live.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let input = |e: c_int| {
        errno::set(e);
        REREG_MR_ERR_INPUT
    };
    let known = REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_PD | REREG_MR_CHANGE_ACCESS;
    if mr.is_null()
        || flags & !known != 0
        || (flags & REREG_MR_CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()))
        || (access != 0 && flags & REREG_MR_CHANGE_ACCESS == 0)
    {
        return input(libc::EINVAL);
    }
    let change_pd = flags & REREG_MR_CHANGE_PD != 0;
    // SAFETY: caller contract: a live MR of this library.
    let m = unsafe { &mut *(mr as *mut SoftnicMr) };
    let cmd = |e: c_int| {
        errno::set(e);
        REREG_MR_ERR_CMD
    };
    // SAFETY: a non-null `pd` with CHANGE_PD is a live PD (caller contract).
    if change_pd && (pd.is_null() || unsafe { (*pd).context } != m.mr.context) {
        return cmd(libc::EINVAL);
    }
    // SAFETY: caller contract (a live PD when CHANGE_PD is set; not used otherwise).
    let new_pd: Option<&SoftnicPd> = change_pd.then(|| unsafe { softnic_pd(pd) });
    let new_access = (flags & REREG_MR_CHANGE_ACCESS != 0)
        .then_some(AccessFlags(access as u32 & !ACCESS_OPTIONAL_RANGE));
    if flags & REREG_MR_CHANGE_TRANSLATION != 0 {
        // New memory: a registration of it (on the new PD, with the new rights, if
        // asked), then the old one dropped — new keys, as the kernel's rereg may give.
        let on = new_pd.unwrap_or_else(|| {
            // SAFETY: the MR's PD is live while the MR is.
            unsafe { softnic_pd(m.mr.pd) }
        });
        let bits = new_access.map_or(m.access, AccessFlags::bits);
        // SAFETY: the caller's new range is its memory (as for `ibv_reg_mr`).
        let new = match unsafe { register(&on.api, addr, length, bits) } {
            Ok(r) => r,
            Err(e) => return cmd(e),
        };
        let old = std::mem::replace(&mut m.reg, new);
        // SAFETY: made by `register`.
        unsafe { unregister(old) };
        m.mr.addr = addr;
        m.mr.length = length;
        m.mr.handle = m.reg.handle();
        m.mr.lkey = m.reg.lkey();
        m.mr.rkey = m.reg.rkey();
        m.access = bits;
    } else if let Err(e) = m.reg.rereg(new_pd.map(|p| &p.api), new_access) {
        return cmd(errno::of(&e));
    } else if let Some(a) = new_access {
        m.access = a.bits();
    }
    if let Some(p) = new_pd {
        // SAFETY: the old PD outlives its MRs (dealloc is EBUSY while it has users).
        unsafe { softnic_pd(m.mr.pd) }
            .users
            .fetch_sub(1, Ordering::AcqRel);
        p.users.fetch_add(1, Ordering::AcqRel);
        m.mr.pd = pd;
    }
    0
}
