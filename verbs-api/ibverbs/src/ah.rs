//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`) for UD sends.
//!
//! On RoCE an address is a GID: the handle keeps the destination GID of a global
//! (`is_global`) address; a LID-only address cannot be routed (EINVAL), and the source
//! GID must be the NIC's address, index 1 (EINVAL otherwise), as for connected QPs.
//! The peer NIC is reached at the RoCEv2 port 4791.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use verbs_api::Gid;

use crate::abi::*;
use crate::errno;
use crate::objects::softnic_pd;

/// An AH: `ibv_ah`, then the destination.
#[repr(C)]
pub struct SoftnicAh {
    /// Public part.
    pub ah: ibv_ah,
    /// Destination GID.
    pub dgid: Gid,
}

/// The destination of an AH this library created.
///
/// # Safety
/// `ah` came from [`ibv_create_ah`] and is live.
pub(crate) unsafe fn dest_of(ah: *mut ibv_ah) -> Gid {
    // SAFETY: `ah` is the first field of a boxed SoftnicAh.
    unsafe { (*(ah as *const SoftnicAh)).dgid }
}

/// `ibv_create_ah`.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `attr` is readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let a = unsafe { &*attr };
    if a.is_global == 0
        || u32::from(a.grh.sgid_index) != verbs_api::gid::ADDRESS_GID_INDEX
        || a.port_num > 1
    {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let p = unsafe { softnic_pd(pd) };
    p.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::new(SoftnicAh {
        ah: ibv_ah {
            // SAFETY: pd is live.
            context: unsafe { (*pd).context },
            pd,
            handle: 0,
        },
        dgid: Gid(a.grh.dgid.raw),
    });
    Box::into_raw(b) as *mut ibv_ah
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` came from [`ibv_create_ah`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: reverses ibv_create_ah's Box::into_raw (caller contract: once).
    let b = unsafe { Box::from_raw(ah as *mut SoftnicAh) };
    // SAFETY: the PD outlives its AHs (dealloc is EBUSY meanwhile).
    unsafe { softnic_pd(b.ah.pd) }
        .users
        .fetch_sub(1, Ordering::AcqRel);
    0
}
