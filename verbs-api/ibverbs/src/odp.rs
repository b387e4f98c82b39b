//! On-demand paging (ODP): `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`, implicit ODP
//! (`ibv_reg_mr(pd, NULL, SIZE_MAX, … | IBV_ACCESS_ON_DEMAND)`), `ibv_advise_mr`, and
//! the capabilities `ibv_query_device_ex` reports for them.
//!
//! An ODP registration pins and converts nothing: the NIC reaches the bytes through
//! this process's `/proc/self/mem` at the moment of each access (the copy path of
//! [`crate::mr_backing`], `RegMrCopy`), so the kernel's page tables resolve every
//! access then, as an ODP-capable RNIC resolves its page faults. Hence the range need
//! not be mapped, or even exist, when it is registered; `fork()`, `munmap`, `mremap`
//! and `madvise(MADV_DONTNEED)` on it behave as without registration; and an access to
//! a page that is not mapped when it happens fails like an access outside the region
//! (a local protection error, or a remote access error toward the peer). An implicit
//! registration is the whole address space: iova 0, length `SIZE_MAX` (what the
//! kernel reports for one too), every address under its keys. The price is one system
//! call per access (a packet's payload), and no atomics (the NIC refuses them on
//! copied regions: a read-modify-write through the file is not atomic against the
//! program's own CPU), so [`RC_CAPS`] leaves out `IBV_ODP_SUPPORT_ATOMIC`.
//!
//! `ibv_advise_mr` prefetches by faulting the range's pages in now
//! (`madvise(MADV_POPULATE_READ/WRITE)`, contents unchanged), so the NIC's accesses
//! find them mapped; `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT` asks for pages already
//! present only, which the NIC's accesses find anyway, so it does nothing.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use verbs_api::{AccessFlags, FdMemoryRegion, ProtectionDomain};

use crate::abi::{ibv_pd, ibv_sge};
use crate::objects::softnic_pd;

/// `IBV_ACCESS_ON_DEMAND`.
pub const ACCESS_ON_DEMAND: u32 = 1 << 6;
/// `IBV_ACCESS_HUGETLB`: the program says the buffer is hugepage memory (a hint for
/// ODP page handling; nothing here depends on page size).
pub const ACCESS_HUGETLB: u32 = 1 << 7;

/// `IBV_ODP_SUPPORT` | `IBV_ODP_SUPPORT_IMPLICIT` (`ibv_odp_caps.general_caps`).
pub const GENERAL_CAPS: u64 = (1 << 0) | (1 << 1);
/// `IBV_ODP_SUPPORT_SEND` … as `ibv_odp_transport_cap_bits` numbers them.
const SEND: u32 = 1 << 0;
const RECV: u32 = 1 << 1;
const WRITE: u32 = 1 << 2;
const READ: u32 = 1 << 3;
const SRQ_RECV: u32 = 1 << 5;
/// RC: every operation but atomics (see the module doc).
pub const RC_CAPS: u32 = SEND | RECV | WRITE | READ | SRQ_RECV;
/// UC: SEND and RDMA WRITE (UC has no READ or atomics).
pub const UC_CAPS: u32 = SEND | RECV | WRITE | SRQ_RECV;
/// UD: SEND only.
pub const UD_CAPS: u32 = SEND | RECV | SRQ_RECV;
/// XRC: what RC does, an XRC target receiving through its XRC SRQs only (an XRC QP has
/// no receive queue of its own, so no `IBV_ODP_SUPPORT_RECV`).
pub const XRC_CAPS: u32 = SEND | WRITE | READ | SRQ_RECV;

/// `IBV_ADVISE_MR_ADVICE_PREFETCH`, `…_PREFETCH_WRITE`, `…_PREFETCH_NO_FAULT`.
const ADVICE_PREFETCH: c_int = 0;
const ADVICE_PREFETCH_WRITE: c_int = 1;
const ADVICE_PREFETCH_NO_FAULT: c_int = 2;
/// `IBV_ADVISE_MR_FLAG_FLUSH`: return when the advice has been acted on (it always
/// has here).
const ADVISE_FLAG_FLUSH: u32 = 1;

/// `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_READ: c_int = 22;
const MADV_POPULATE_WRITE: c_int = 23;

/// A live ODP registration, for `ibv_advise_mr`'s checks.
struct OdpMr {
    lkey: u32,
    pd: verbs_api::abi::control::Handle,
    iova: u64,
    len: u64,
    writable: bool,
}

/// Live ODP registrations of this process.
static LIVE: Mutex<Vec<OdpMr>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<OdpMr>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `[addr, addr + length)` on demand (implicit for `NULL`, `SIZE_MAX`).
/// EINVAL for a NULL address or zero length otherwise.
pub(crate) fn register(
    pd: &ProtectionDomain,
    addr: *mut c_void,
    length: usize,
    access: AccessFlags,
) -> Result<FdMemoryRegion, c_int> {
    let iova = addr as u64;
    if (addr.is_null() && length != usize::MAX) || length == 0 {
        return Err(libc::EINVAL);
    }
    // A range past the address space is EINVAL there (`ProtectionDomain::reg_copy`).
    let reg = crate::mr_backing::register_copy(pd, iova, length, access)?;
    live().push(OdpMr {
        lkey: reg.lkey(),
        pd: pd.handle(),
        iova,
        len: length as u64,
        writable: access.contains(AccessFlags::LOCAL_WRITE),
    });
    Ok(reg)
}

/// Forgets registration `lkey` (at its deregistration); nothing if it was not ODP.
pub(crate) fn forget(lkey: u32) {
    live().retain(|m| m.lkey != lkey);
}

/// The `advise_mr` op behind the inline `ibv_advise_mr`: checks every SGE against the
/// ODP registrations of `pd` (EFAULT for an unknown L_Key, a range outside its region
/// or, for PREFETCH_WRITE, a region without local write), then faults the pages in.
/// EINVAL for unknown flags or no SGEs, EOPNOTSUPP for an unknown advice.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `sg_list` holds `num_sge` entries.
pub unsafe extern "C" fn advise_mr_op(
    pd: *mut ibv_pd,
    advice: c_int,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    if pd.is_null() || sg_list.is_null() || num_sge == 0 || flags & !ADVISE_FLAG_FLUSH != 0 {
        return libc::EINVAL;
    }
    if ![
        ADVICE_PREFETCH,
        ADVICE_PREFETCH_WRITE,
        ADVICE_PREFETCH_NO_FAULT,
    ]
    .contains(&advice)
    {
        return libc::EOPNOTSUPP;
    }
    // SAFETY: caller contract.
    let handle = unsafe { softnic_pd(pd) }.api.handle();
    // SAFETY: caller contract.
    let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    let write = advice == ADVICE_PREFETCH_WRITE;
    {
        let live = live();
        for s in sges {
            let ok = live.iter().any(|m| {
                m.lkey == s.lkey
                    && m.pd == handle
                    && (m.writable || !write)
                    && s.addr >= m.iova
                    && s.addr - m.iova <= m.len
                    && u64::from(s.length) <= m.len - (s.addr - m.iova)
            });
            if !ok {
                return libc::EFAULT;
            }
        }
    }
    if advice == ADVICE_PREFETCH_NO_FAULT {
        return 0;
    }
    let how = if write {
        MADV_POPULATE_WRITE
    } else {
        MADV_POPULATE_READ
    };
    for s in sges.iter().filter(|s| s.length > 0) {
        if let Err(e) = populate(s.addr, u64::from(s.length), how) {
            return e;
        }
    }
    0
}

/// Faults in the pages under `[addr, addr + len)` (`madvise` `how`); EFAULT when some
/// are not mapped (or not writable, for a write prefetch). A kernel without
/// `MADV_POPULATE_*` (EINVAL; before 5.14) leaves the prefetch undone: it is advice.
fn populate(addr: u64, len: u64, how: c_int) -> Result<(), c_int> {
    let page = crate::mr::page_size() as u64;
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or(libc::EFAULT)?
        & !(page - 1);
    // SAFETY: MADV_POPULATE_READ/WRITE only fault pages in, as the program's own reads
    // or writes of them would, without changing their contents or mappings; a range
    // that is not mapped is an error return, not a fault.
    let r = unsafe { libc::madvise(start as *mut c_void, (end - start) as usize, how) };
    if r == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EINVAL) => Ok(()),
        _ => Err(libc::EFAULT),
    }
}
