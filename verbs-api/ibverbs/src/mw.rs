//! Memory windows through the C ABI: the `alloc_mw`, `dealloc_mw` and `bind_mw`
//! context ops behind the inline `ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`, and
//! the `IBV_WR_BIND_MW` / `IBV_WR_LOCAL_INV` work requests of `ibv_post_send` and the
//! `ibv_wr_bind_mw` / `ibv_wr_local_inv` builders. Each bind or invalidation is a
//! control request to the NIC (one system call, as every post costs on rxe) followed
//! by a WQE that orders its completion ([`verbs_api::mw`]).

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use verbs_api::{MemoryWindow, MwBindInfo, QueuePair};

use crate::abi::*;
use crate::errno;
use crate::objects::softnic_pd;
use crate::qp::{post_errno, softnic_qp};

/// `IBV_SEND_SIGNALED`.
const SIGNALED: u32 = 2;

/// A window: `ibv_mw`, then the verbs-api window.
#[repr(C)]
pub struct SoftnicMw {
    /// Public part.
    pub mw: ibv_mw,
    api: MemoryWindow,
}

/// The `alloc_mw` op: a type 1 or type 2 window (anything else is EINVAL, as rxe).
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    if pd.is_null() {
        return errno::null(libc::EINVAL);
    }
    let Ok(t @ 1..=2) = u8::try_from(mw_type) else {
        return errno::null(libc::EINVAL);
    };
    // SAFETY: caller contract.
    let p = unsafe { softnic_pd(pd) };
    let api = match p.api.alloc_mw(t) {
        Ok(w) => w,
        Err(e) => return errno::null(errno::of(&e)),
    };
    p.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::new(SoftnicMw {
        mw: ibv_mw {
            // SAFETY: pd is live.
            context: unsafe { (*pd).context },
            pd,
            rkey: api.rkey(),
            handle: api.handle(),
            mw_type,
        },
        api,
    });
    Box::into_raw(b) as *mut ibv_mw
}

/// The `dealloc_mw` op: the window's R_Key stops working at once.
///
/// # Safety
/// `mw` came from [`alloc_mw`] and is not used again.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: `mw` is the first field of a boxed SoftnicMw (caller contract).
    let b = unsafe { Box::from_raw(mw as *mut SoftnicMw) };
    // SAFETY: the PD outlives its windows (dealloc is EBUSY while users != 0).
    unsafe { softnic_pd(b.mw.pd) }
        .users
        .fetch_sub(1, Ordering::AcqRel);
    drop(b);
    0
}

/// The verbs-api form of a bind: the region's NIC handle (none for length 0).
///
/// # Safety
/// `info.mr` is NULL or an MR from `ibv_reg_mr`.
unsafe fn bind_info(info: &ibv_mw_bind_info) -> Result<MwBindInfo, c_int> {
    let mr = if info.mr.is_null() {
        if info.length != 0 {
            return Err(libc::EINVAL);
        }
        0
    } else {
        // SAFETY: caller contract.
        unsafe { (*info.mr).handle }
    };
    Ok(MwBindInfo {
        mr,
        addr: info.addr,
        len: info.length,
        access: info.mw_access_flags,
    })
}

/// The `bind_mw` op (`ibv_bind_mw`, type 1 windows): binds under the next R_Key,
/// which it stores in `mw->rkey`, and posts the bind's WQE.
///
/// # Safety
/// `qp`, `mw` and `mw_bind` are live objects of this library (the caller's contract).
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    if qp.is_null() || mw.is_null() || mw_bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let (m, b) = unsafe { (&mut *(mw as *mut SoftnicMw), &*mw_bind) };
    if m.mw.mw_type != 1 {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let info = match unsafe { bind_info(&b.bind_info) } {
        Ok(i) => i,
        Err(e) => return e,
    };
    // SAFETY: caller contract.
    let q = unsafe { softnic_qp(qp) };
    let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    let signaled = b.send_flags & SIGNALED != 0;
    match api.bind_mw(b.wr_id, signaled, &mut m.api, &info) {
        Ok(rkey) => {
            m.mw.rkey = rkey;
            0
        }
        Err(e) => post_errno(&e),
    }
}

/// True for the work requests [`post_local`] carries out.
pub(crate) fn is_local(w: &ibv_send_wr) -> bool {
    matches!(w.opcode, IBV_WR_LOCAL_INV | IBV_WR_BIND_MW)
}

/// `IBV_WR_LOCAL_INV`.
pub(crate) const IBV_WR_LOCAL_INV: c_int = 7;
/// `IBV_WR_BIND_MW`.
pub(crate) const IBV_WR_BIND_MW: c_int = 8;

/// A bind or invalidation, decoded from a WR or a builder call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LocalWr {
    /// `IBV_WR_BIND_MW` / `ibv_wr_bind_mw`.
    Bind {
        /// The window's handle.
        mw: u32,
        /// Its R_Key after the bind.
        rkey: u32,
        /// What to bind.
        info: MwBindInfo,
    },
    /// `IBV_WR_LOCAL_INV` / `ibv_wr_local_inv`.
    Invalidate {
        /// The R_Key to invalidate.
        rkey: u32,
    },
}

/// The [`LocalWr::Bind`] of window `mw` under `rkey` with `info`.
///
/// # Safety
/// `mw` is NULL or from [`alloc_mw`]; `info` is NULL or a valid bind info whose MR is
/// NULL or from `ibv_reg_mr`.
pub(crate) unsafe fn bind_wr(
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) -> Result<LocalWr, c_int> {
    if mw.is_null() || info.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let (mw, info) = unsafe { ((*mw).handle, bind_info(&*info)?) };
    Ok(LocalWr::Bind { mw, rkey, info })
}

/// Posts `l` (with the WR's `wr_id` and send flags) on `qp`; the errno on refusal.
pub(crate) fn post_local_wr(
    qp: &mut QueuePair,
    (wr_id, flags, l): (u64, u32, LocalWr),
) -> Result<(), c_int> {
    let signaled = flags & SIGNALED != 0;
    match l {
        LocalWr::Bind { mw, rkey, info } => qp.post_bind_mw(wr_id, signaled, mw, rkey, &info),
        LocalWr::Invalidate { rkey } => qp.post_local_inv(wr_id, signaled, rkey),
    }
    .map_err(|e| post_errno(&e))
}

/// Posts an `IBV_WR_BIND_MW` or `IBV_WR_LOCAL_INV` work request on `qp`.
///
/// # Safety
/// `w` is a valid WR; for a bind, `w.bind_mw.mw` came from [`alloc_mw`] and its MR
/// from `ibv_reg_mr`.
pub(crate) unsafe fn post_local(qp: &mut QueuePair, w: &ibv_send_wr) -> Result<(), c_int> {
    let l = match w.opcode {
        // SAFETY: caller contract.
        IBV_WR_BIND_MW => unsafe { bind_wr(w.bind_mw.mw, w.bind_mw.rkey, &w.bind_mw.bind_info) }?,
        // `invalidate_rkey` shares the union with `imm_data`, in host order.
        IBV_WR_LOCAL_INV => LocalWr::Invalidate { rkey: w.imm_data },
        _ => return Err(libc::EINVAL),
    };
    post_local_wr(qp, (w.wr_id, w.send_flags, l))
}
