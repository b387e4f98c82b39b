//! Device memory: `ibv_alloc_dm`, `ibv_free_dm`, `ibv_memcpy_to_dm`,
//! `ibv_memcpy_from_dm` and `ibv_reg_dm_mr` (the `alloc_dm`, `free_dm` and `reg_dm_mr`
//! ops, and the two copy functions of `struct ibv_dm`).
//!
//! On an RNIC, device memory is a small memory on the adapter (mlx5's MEMIC) that the
//! program reaches only by copying in and out, and that its QPs use through zero-based
//! memory regions. softnic's NIC is a process, so its "device memory" is a memfd this
//! library allocates (at most [`MAX_DM_SIZE`] bytes), maps for the copies and, at
//! `ibv_reg_dm_mr`, lets the NIC map as a window: the region starts at address 0 at the
//! requested offset (`IBV_ACCESS_ZERO_BASED`, required, as rdma-core requires it), and
//! `ibv_mr.addr` is NULL, as the kernel reports. The copies are plain memory copies
//! with the checks an RNIC makes: offset and length multiples of 4 bytes, inside the
//! allocation (EINVAL otherwise). `ibv_free_dm` is EBUSY while a region uses it.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;
use verbs_api::abi::control::MrSegment;
use verbs_api::AccessFlags;

use crate::abi::*;
use crate::errno;
use crate::objects::softnic_pd;

/// The largest allocation (`max_dm_size`): 256 KiB, a ConnectX's MEMIC size.
pub const MAX_DM_SIZE: u64 = 256 << 10;
/// `IBV_ACCESS_ZERO_BASED`.
pub const ACCESS_ZERO_BASED: u32 = 1 << 5;
/// Copies move whole 4-byte words, as on an RNIC's device memory.
const DM_ALIGN: u64 = 4;

/// A device-memory allocation: `ibv_dm`, then the memfd, its mapping here and its
/// length.
#[repr(C)]
pub struct SoftnicDm {
    /// Public part.
    pub dm: ibv_dm,
    fd: OwnedFd,
    map: MmapRaw,
    len: u64,
    /// Memory regions on it (`ibv_free_dm` is EBUSY while any lives).
    pub(crate) users: Arc<AtomicU32>,
}

/// Handles for `ibv_dm.handle` (unique per process; the NIC never sees them).
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// The `alloc_dm` op behind the inline `ibv_alloc_dm`: `attr.length` bytes (1 to
/// [`MAX_DM_SIZE`]), zero-filled; EINVAL for another length, a `comp_mask` or an
/// alignment request beyond a page.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is a valid `ibv_alloc_dm_attr`.
pub unsafe extern "C" fn alloc_dm_op(
    context: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    if context.is_null() || attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let a = unsafe { &*attr };
    if a.comp_mask != 0 || a.length == 0 || a.length as u64 > MAX_DM_SIZE || a.log_align_req > 12 {
        return errno::null(libc::EINVAL);
    }
    let map_len = (a.length as u64).next_multiple_of(4096) as usize;
    let made = verbs_api::os::memfd("softnic-dm", map_len).and_then(|fd| {
        let map = verbs_api::os::map_shared(fd.as_fd(), map_len)?;
        Ok((fd, map))
    });
    let (fd, map) = match made {
        Ok(v) => v,
        Err(e) => return errno::null(e.raw_os_error().unwrap_or(libc::ENOMEM)),
    };
    let b = Box::new(SoftnicDm {
        dm: ibv_dm {
            context,
            memcpy_to_dm: Some(memcpy_to_dm),
            memcpy_from_dm: Some(memcpy_from_dm),
            comp_mask: 0,
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
        },
        fd,
        map,
        len: a.length as u64,
        users: Arc::new(AtomicU32::new(0)),
    });
    Box::into_raw(b) as *mut ibv_dm
}

/// The `free_dm` op behind the inline `ibv_free_dm`: EBUSY while a region uses it.
///
/// # Safety
/// `dm` came from [`alloc_dm_op`] and is not used after a successful call.
pub unsafe extern "C" fn free_dm_op(dm: *mut ibv_dm) -> c_int {
    if dm.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract: `dm` is the first field of a boxed SoftnicDm.
    if unsafe { &*(dm as *const SoftnicDm) }
        .users
        .load(Ordering::Acquire)
        != 0
    {
        return libc::EBUSY;
    }
    // SAFETY: reverses alloc_dm_op's Box::into_raw (caller contract: once).
    drop(unsafe { Box::from_raw(dm as *mut SoftnicDm) });
    0
}

/// The allocation's bytes `[offset, offset + length)` in this process, or EINVAL.
///
/// # Safety
/// `dm` came from [`alloc_dm_op`] and is live.
unsafe fn span(dm: *mut ibv_dm, offset: u64, length: usize) -> Result<*mut u8, c_int> {
    // SAFETY: caller contract.
    let d = unsafe { &*(dm as *const SoftnicDm) };
    let len = length as u64;
    let inside = offset.checked_add(len).is_some_and(|end| end <= d.len);
    if !offset.is_multiple_of(DM_ALIGN) || !len.is_multiple_of(DM_ALIGN) || !inside {
        return Err(libc::EINVAL);
    }
    // SAFETY: offset + len ≤ d.len ≤ the mapping's length.
    Ok(unsafe { d.map.as_mut_ptr().add(offset as usize) })
}

/// A copy's checks (EINVAL for a NULL allocation or host buffer, or a range
/// [`span`] refuses), then `copy(p)` with the allocation's bytes at `offset`.
///
/// # Safety
/// `dm` is NULL or live.
unsafe fn dm_copy(
    dm: *mut ibv_dm,
    offset: u64,
    host_null: bool,
    length: usize,
    copy: impl FnOnce(*mut u8),
) -> c_int {
    if dm.is_null() || (host_null && length > 0) {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    match unsafe { span(dm, offset, length) } {
        Ok(p) => {
            copy(p);
            0
        }
        Err(e) => e,
    }
}

/// `ibv_dm.memcpy_to_dm`.
///
/// # Safety
/// `dm` is live; `host` is readable for `length` bytes.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    length: usize,
) -> c_int {
    // SAFETY: caller contract; `p` holds `length` bytes of the mapping.
    unsafe {
        dm_copy(dm, offset, host.is_null(), length, |p| {
            std::ptr::copy_nonoverlapping(host as *const u8, p, length)
        })
    }
}

/// `ibv_dm.memcpy_from_dm`.
///
/// # Safety
/// `dm` is live; `host` is writable for `length` bytes.
unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
) -> c_int {
    // SAFETY: as memcpy_to_dm.
    unsafe {
        dm_copy(dm, offset, host.is_null(), length, |p| {
            std::ptr::copy_nonoverlapping(p, host as *mut u8, length)
        })
    }
}

/// The `reg_dm_mr` op behind the inline `ibv_reg_dm_mr`: a zero-based region of
/// `length` bytes from byte `offset` of `dm` (EINVAL without `IBV_ACCESS_ZERO_BASED`,
/// for other unknown access bits, or past the allocation).
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `dm` from [`alloc_dm_op`]; both live.
pub unsafe extern "C" fn reg_dm_mr_op(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() || dm.is_null() || access & ACCESS_ZERO_BASED == 0 {
        return errno::null(libc::EINVAL);
    }
    let rights = AccessFlags(access & !ACCESS_ZERO_BASED);
    // SAFETY: caller contract.
    let d = unsafe { &*(dm as *const SoftnicDm) };
    let inside = offset
        .checked_add(length as u64)
        .is_some_and(|end| end <= d.len);
    if rights.validate().is_err() || !inside {
        return errno::null(libc::EINVAL);
    }
    let pages = MrSegment {
        share: None,
        offset: 0,
        len: d.map.len() as u64,
    };
    // SAFETY: caller contract.
    let reg = match unsafe { softnic_pd(pd) }.api.reg_fd_window(
        Some(d.fd.as_fd()),
        vec![pages],
        offset,
        0,
        length,
        rights,
    ) {
        Ok(r) => r,
        Err(e) => return errno::null(errno::of(&e)),
    };
    // SAFETY: pd is live (caller contract).
    unsafe { crate::mr::boxed_dm(pd, reg, length, access, d.users.clone()) }
}
