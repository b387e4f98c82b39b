//! XRC: `ibv_open_xrcd`, `ibv_close_xrcd`, `ibv_create_srq_ex` and `ibv_get_srq_num`
//! (the `open_xrcd`, `close_xrcd`, `create_srq_ex` and `get_srq_num` ops behind
//! rdma-core's inline wrappers), over verbs-api's [`Xrcd`] and XRC SRQs
//! ([`verbs_api::xrc`]). The XRC QP types are created by `ibv_create_qp_ex`
//! ([`crate::qp::create_qp_ex_op`]); an XRC SRQ is an ordinary [`SoftnicSrq`] for every
//! other SRQ verb.
//!
//! Errno values are the kernel's (`ib_uverbs_open_xrcd`, which rdma-core passes on):
//! EBADF for a descriptor that is neither open nor −1, EAGAIN for a file without a
//! domain opened without `O_CREAT`, EINVAL for `O_CREAT|O_EXCL` on a file that has
//! one; `ibv_close_xrcd` is EBUSY while SRQs or QPs created through that open live.
//! `ibv_open_qp` (opening a shareable XRC target QP by number) stays EOPNOTSUPP: its op
//! is NULL.

use std::ffi::c_int;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use verbs_api::abi::control::ErrorCode;
use verbs_api::{Xrcd, XrcdFlags};

use crate::abi::*;
use crate::device::softnic_context;
use crate::errno;
use crate::objects::{softnic_cq, softnic_pd};
use crate::srq::{softnic_srq, SoftnicSrq};

// enum ibv_xrcd_init_attr_mask
const XRCD_INIT_ATTR_FD: u32 = 1 << 0;
const XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
const XRCD_INIT_ATTR_RESERVED: u32 = 1 << 2;

// enum ibv_srq_init_attr_mask and enum ibv_srq_type
const SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
const SRQ_INIT_ATTR_PD: u32 = 1 << 1;
const SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
const SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
const SRQ_INIT_ATTR_RESERVED: u32 = 1 << 5;
const SRQT_BASIC: u32 = 0;
const SRQT_XRC: u32 = 1;
const SRQT_TM: u32 = 2;

/// An XRC domain open: `ibv_xrcd`, then the verbs-api open (taken out by a successful
/// close, put back by a refused one: the program keeps its pointer either way).
#[repr(C)]
pub struct SoftnicXrcd {
    /// Public part.
    pub xrcd: ibv_xrcd,
    pub(crate) api: Mutex<Option<Xrcd>>,
    /// XRC SRQs and XRC receive QPs created through this open (`ibv_close_xrcd`: EBUSY
    /// while any lives, as the kernel counts them per open).
    pub(crate) users: AtomicU32,
}

/// The [`SoftnicXrcd`] around `xrcd`.
///
/// # Safety
/// `xrcd` came from [`open_xrcd_op`] and is live.
pub(crate) unsafe fn softnic_xrcd<'a>(xrcd: *mut ibv_xrcd) -> &'a SoftnicXrcd {
    // SAFETY: `xrcd` is the first field of a boxed SoftnicXrcd (repr(C)).
    unsafe { &*(xrcd as *const SoftnicXrcd) }
}

/// The `open_xrcd` op behind the inline `ibv_open_xrcd`: both `IBV_XRCD_INIT_ATTR_FD`
/// and `IBV_XRCD_INIT_ATTR_OFLAGS` are required (EINVAL), an unknown mask bit is
/// EOPNOTSUPP, as `ibv_cmd_open_xrcd` answers; `fd` −1 opens a new private domain,
/// another descriptor the domain of its file (see the module doc for the errno values).
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is NULL or a valid
/// `ibv_xrcd_init_attr`.
pub unsafe extern "C" fn open_xrcd_op(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    // SAFETY: caller contract.
    let Some(a) = (unsafe { attr.as_ref() }).copied() else {
        return errno::null(libc::EINVAL);
    };
    if context.is_null() {
        return errno::null(libc::EINVAL);
    }
    if a.comp_mask >= XRCD_INIT_ATTR_RESERVED {
        return errno::null(libc::EOPNOTSUPP);
    }
    if a.comp_mask & XRCD_INIT_ATTR_FD == 0 || a.comp_mask & XRCD_INIT_ATTR_OFLAGS == 0 {
        return errno::null(libc::EINVAL);
    }
    let file = match a.fd {
        -1 => None,
        fd if fd < 0 => return errno::null(libc::EBADF),
        // SAFETY: a descriptor of the caller's, used only for this call's fstat (a
        // closed one fails there with EBADF, as the kernel's fdget answers).
        fd => Some(unsafe { BorrowedFd::borrow_raw(fd) }),
    };
    let flags = XrcdFlags {
        create: a.oflags & libc::O_CREAT != 0,
        exclusive: a.oflags & libc::O_EXCL != 0,
    };
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    let api = match ctx.api.open_xrcd(file, flags) {
        Ok(x) => x,
        Err(verbs_api::Error::Nic {
            code: ErrorCode::NotFound,
            ..
        }) => return errno::null(libc::EAGAIN),
        Err(e) => return errno::null(errno::of(&e)),
    };
    let b = Box::new(SoftnicXrcd {
        xrcd: ibv_xrcd { context },
        api: Mutex::new(Some(api)),
        users: AtomicU32::new(0),
    });
    Box::into_raw(b) as *mut ibv_xrcd
}

/// The `close_xrcd` op behind the inline `ibv_close_xrcd`: EBUSY while XRC SRQs or
/// XRC receive QPs created through this open live (the open stays usable then);
/// otherwise the open is closed and freed.
///
/// # Safety
/// `xrcd` came from [`open_xrcd_op`] and is not used again when this returns 0.
pub unsafe extern "C" fn close_xrcd_op(xrcd: *mut ibv_xrcd) -> c_int {
    if xrcd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let x = unsafe { softnic_xrcd(xrcd) };
    if x.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    let mut slot = x.api.lock().unwrap_or_else(|e| e.into_inner());
    let Some(api) = slot.take() else {
        return libc::EINVAL;
    };
    if let Err((api, e)) = api.close() {
        *slot = Some(api);
        return errno::of(&e);
    }
    drop(slot);
    // SAFETY: reverses open_xrcd_op's Box::into_raw (caller contract: once).
    drop(unsafe { Box::from_raw(xrcd as *mut SoftnicXrcd) });
    0
}

/// The `create_srq_ex` op behind the inline `ibv_create_srq_ex` (which calls
/// `ibv_create_srq` itself for a basic SRQ with only `PD` and `TYPE` in the mask):
///
/// * a basic SRQ (no `TYPE`, or `IBV_SRQT_BASIC`) is `ibv_create_srq` on `attr.pd`,
///   whatever else the mask holds, as mlx5 does;
/// * an XRC SRQ needs `PD`, `XRCD` and `CQ` in the mask and non-NULL (EINVAL
///   otherwise, as `ibv_cmd_create_srq_ex` and the kernel answer), all of `context`;
/// * a tag-matching SRQ is EOPNOTSUPP, another type or an unknown mask bit EINVAL.
///
/// Writes the granted `max_wr` and `max_sge` back into `attr.attr`.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is NULL or a valid
/// `ibv_srq_init_attr_ex` whose objects are NULL or live objects of this library.
pub unsafe extern "C" fn create_srq_ex_op(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: caller contract.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return errno::null(libc::EINVAL);
    };
    if context.is_null() || a.comp_mask >= SRQ_INIT_ATTR_RESERVED {
        return errno::null(libc::EINVAL);
    }
    let has = |bit: u32| a.comp_mask & bit != 0;
    let srq_type = if has(SRQ_INIT_ATTR_TYPE) {
        a.srq_type
    } else {
        SRQT_BASIC
    };
    let pd = if has(SRQ_INIT_ATTR_PD) {
        a.pd
    } else {
        std::ptr::null_mut()
    };
    match srq_type {
        SRQT_BASIC => {
            // `ibv_srq_init_attr_ex` begins with an `ibv_srq_init_attr` (the inline
            // wrapper makes the same cast).
            // SAFETY: forwarded caller contract; ibv_create_srq checks for NULL.
            return unsafe { crate::srq::ibv_create_srq(pd, attr as *mut ibv_srq_init_attr) };
        }
        SRQT_XRC => {}
        SRQT_TM => return errno::null(libc::EOPNOTSUPP),
        _ => return errno::null(libc::EINVAL),
    }
    if pd.is_null() || !has(SRQ_INIT_ATTR_XRCD) || !has(SRQ_INIT_ATTR_CQ) {
        return errno::null(libc::EINVAL);
    }
    let (xrcd, cq) = (a.xrcd, a.cq);
    if xrcd.is_null() || cq.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: live objects of this library (caller contract).
    let (p, x, c) = unsafe { (softnic_pd(pd), softnic_xrcd(xrcd), softnic_cq(cq)) };
    // SAFETY: as above.
    let contexts = unsafe { [(*pd).context, x.xrcd.context, (*cq).context] };
    if contexts.iter().any(|&k| k != context) {
        return errno::null(libc::EINVAL);
    }
    let created = {
        let xa = x.api.lock().unwrap_or_else(|e| e.into_inner());
        let Some(xrcd_api) = xa.as_ref() else {
            return errno::null(libc::EINVAL);
        };
        let ca = c.api.lock().unwrap_or_else(|e| e.into_inner());
        p.api
            .create_xrc_srq(xrcd_api, &ca, &crate::srq::init_of(&a.attr))
    };
    let api = match created {
        Ok(s) => s,
        Err(e) => return errno::null(errno::of(&e)),
    };
    let mut ia = ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: a.attr,
    };
    // SAFETY: the PD, CQ and XRC domain are live objects of this context (checked).
    let srq = unsafe { crate::srq::wrap(pd, &mut ia, api, cq, xrcd) };
    a.attr = ia.attr;
    srq
}

/// The `get_srq_num` op behind the inline `ibv_get_srq_num`: an XRC SRQ's number.
/// EINVAL for a basic SRQ, which has none (mlx5 reports its hardware SRQ number there,
/// which nothing but XRC and mlx5's DC can use).
///
/// # Safety
/// `srq` came from `ibv_create_srq(_ex)`; `srq_num` is writable.
pub unsafe extern "C" fn get_srq_num_op(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    if srq.is_null() || srq_num.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let s: &SoftnicSrq = unsafe { softnic_srq(srq) };
    let n = s.api.lock().unwrap_or_else(|e| e.into_inner()).srq_num();
    if n == 0 {
        return libc::EINVAL;
    }
    // SAFETY: writable (caller contract).
    unsafe { srq_num.write(n) };
    0
}
