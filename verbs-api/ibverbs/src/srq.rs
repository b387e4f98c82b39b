//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq`, and the `post_srq_recv` op behind the inline
//! `ibv_post_srq_recv` (loads and stores on the shared ring, no syscall unless the NIC
//! sleeps), over verbs-api's [`SharedReceiveQueue`]. QPs created with
//! `init_attr->srq` take their receive WQEs from it (`crate::qp`).
//!
//! The SRQ limit (`ibv_modify_srq` with IBV_SRQ_LIMIT) is armed in the NIC, which
//! raises IBV_EVENT_SRQ_LIMIT_REACHED once fewer WQEs remain and disarms it; the event
//! reaches `ibv_get_async_event` through [`crate::async_event`]. Resizing
//! (IBV_SRQ_MAX_WR) is EOPNOTSUPP: the ring is sized at creation. XRC SRQs
//! (`ibv_create_srq_ex` with `IBV_SRQT_XRC`, [`crate::xrc`]) are this same object,
//! holding their XRC domain and CQ as well; every verb here serves both.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use verbs_api::{SharedReceiveQueue, SrqInitAttr};

use crate::abi::*;
use crate::errno;
use crate::objects::{softnic_cq, softnic_pd};

/// An SRQ: `ibv_srq`, then the verbs-api SRQ.
#[repr(C)]
pub struct SoftnicSrq {
    /// Public part.
    pub srq: ibv_srq,
    /// The verbs-api SRQ (one poster at a time; uncontended lock = no syscall).
    pub(crate) api: Mutex<SharedReceiveQueue>,
    /// QPs using this SRQ (EBUSY on destroy while non-zero, as the kernel answers).
    pub(crate) users: AtomicU32,
    /// An XRC SRQ's CQ and XRC domain, each counting it as a user while it lives
    /// (their destroy and close are EBUSY meanwhile); NULL for a basic SRQ.
    pub(crate) cq: *mut ibv_cq,
    pub(crate) xrcd: *mut ibv_xrcd,
}

/// # Safety
/// `srq` came from [`ibv_create_srq`] and is live.
pub(crate) unsafe fn softnic_srq<'a>(srq: *mut ibv_srq) -> &'a SoftnicSrq {
    // SAFETY: `srq` is the first field of a boxed SoftnicSrq.
    unsafe { &*(srq as *const SoftnicSrq) }
}

// enum ibv_srq_attr_mask
const SRQ_MAX_WR: c_int = 1 << 0;
const SRQ_LIMIT: c_int = 1 << 1;

/// `ibv_create_srq`: writes the granted `max_wr` (the ring's power-of-two capacity)
/// and `max_sge` back into `init_attr->attr`.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `init_attr` is a valid `ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || init_attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let (p, ia) = unsafe { (softnic_pd(pd), &mut *init_attr) };
    let api = match p.api.create_srq(&init_of(&ia.attr)) {
        Ok(s) => s,
        Err(e) => return errno::null(errno::of(&e)),
    };
    // SAFETY: forwarded caller contract; a basic SRQ holds no CQ or domain.
    unsafe { wrap(pd, ia, api, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// The verbs-api attributes of `a`.
pub(crate) fn init_of(a: &ibv_srq_attr) -> SrqInitAttr {
    SrqInitAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// Writes the granted `max_wr` and `max_sge` back into `ia`, wraps `api` as the
/// `ibv_srq` the program gets, counts it as a user of its PD (and of `cq` and `xrcd`,
/// an XRC SRQ's, when not NULL) and registers it for asynchronous events.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` (the PD `api` was created on); `cq` and `xrcd` are
/// NULL or live objects of this library of the same context.
pub(crate) unsafe fn wrap(
    pd: *mut ibv_pd,
    ia: &mut ibv_srq_init_attr,
    api: SharedReceiveQueue,
    cq: *mut ibv_cq,
    xrcd: *mut ibv_xrcd,
) -> *mut ibv_srq {
    // SAFETY: caller contract.
    let p = unsafe { softnic_pd(pd) };
    let granted = api.attr();
    ia.attr.max_wr = granted.max_wr;
    ia.attr.max_sge = granted.max_sge;
    // SAFETY: ibv_srq is pointers, integers, a mutex and a condvar: all-zero is valid
    // before pthread_*_init below.
    let mut pub_srq: ibv_srq = unsafe { std::mem::zeroed() };
    // SAFETY: pd is live.
    pub_srq.context = unsafe { (*pd).context };
    pub_srq.srq_context = ia.srq_context;
    pub_srq.pd = pd;
    pub_srq.handle = api.handle();
    let handle = api.handle();
    let b = Box::into_raw(Box::new(SoftnicSrq {
        srq: pub_srq,
        api: Mutex::new(api),
        users: AtomicU32::new(0),
        cq,
        xrcd,
    }));
    // SAFETY: b is a fresh box; the mutex and condvar are at their final addresses.
    unsafe {
        libc::pthread_mutex_init(std::ptr::addr_of_mut!((*b).srq.mutex), std::ptr::null());
        libc::pthread_cond_init(std::ptr::addr_of_mut!((*b).srq.cond), std::ptr::null());
    }
    p.users.fetch_add(1, Ordering::AcqRel);
    if !cq.is_null() {
        // SAFETY: a live CQ (caller contract).
        unsafe { softnic_cq(cq) }
            .users
            .fetch_add(1, Ordering::AcqRel);
    }
    if !xrcd.is_null() {
        // SAFETY: a live XRC domain (caller contract).
        unsafe { crate::xrc::softnic_xrcd(xrcd) }
            .users
            .fetch_add(1, Ordering::AcqRel);
    }
    // SAFETY: the context is live (the PD's).
    let ctx = unsafe { crate::device::softnic_context((*pd).context) };
    ctx.events.register_srq(handle, b as usize);
    ctx.events.start(&ctx.api, ctx.async_fd());
    b as *mut ibv_srq
}

/// `ibv_destroy_srq`: EBUSY while a QP uses it.
///
/// # Safety
/// `srq` came from [`ibv_create_srq`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    if unsafe { softnic_srq(srq) }.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: the context outlives its SRQs (caller contract).
    let retired = unsafe {
        let ctx = crate::device::softnic_context((*srq).context);
        ctx.events
            .forget((*srq).handle, srq as usize, ctx.async_fd())
    };
    // SAFETY: reverses ibv_create_srq's Box::into_raw (caller contract: once).
    let b = unsafe { Box::from_raw(srq as *mut SoftnicSrq) };
    // SAFETY: the context, PD, CQ and XRC domain outlive the SRQ (their destroy and
    // close are EBUSY meanwhile).
    unsafe {
        softnic_pd(b.srq.pd).users.fetch_sub(1, Ordering::AcqRel);
        if !b.cq.is_null() {
            softnic_cq(b.cq).users.fetch_sub(1, Ordering::AcqRel);
        }
        if !b.xrcd.is_null() {
            crate::xrc::softnic_xrcd(b.xrcd)
                .users
                .fetch_sub(1, Ordering::AcqRel);
        }
        if !retired {
            // As `ibv_destroy_qp`: an event of it is still out after the wait, so the
            // SRQ goes in the NIC but its memory stays for the late acknowledgement.
            // `api` is initialised and dropped only here; the rest is leaked.
            let b = Box::into_raw(b);
            std::ptr::drop_in_place(std::ptr::addr_of_mut!((*b).api));
            return 0;
        }
        libc::pthread_cond_destroy(std::ptr::addr_of!(b.srq.cond).cast_mut());
        libc::pthread_mutex_destroy(std::ptr::addr_of!(b.srq.mutex).cast_mut());
    }
    drop(b);
    0
}

/// `ibv_modify_srq`: IBV_SRQ_LIMIT arms (or, with 0, disarms) the limit event;
/// IBV_SRQ_MAX_WR (resizing) is EOPNOTSUPP.
///
/// # Safety
/// `srq` came from [`ibv_create_srq`]; `attr` is readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    if mask & SRQ_MAX_WR != 0 {
        return libc::EOPNOTSUPP;
    }
    if mask & !SRQ_LIMIT != 0 {
        return libc::EINVAL;
    }
    if mask & SRQ_LIMIT == 0 {
        return 0;
    }
    // SAFETY: caller contract.
    let (s, a) = unsafe { (softnic_srq(srq), &*attr) };
    let mut api = s.api.lock().unwrap_or_else(|e| e.into_inner());
    match api.modify_limit(a.srq_limit) {
        Ok(()) => 0,
        Err(e) => errno::of(&e),
    }
}

/// `ibv_query_srq`: `max_wr`, `max_sge` and the armed limit (0 once the limit event
/// has fired).
///
/// # Safety
/// `srq` came from [`ibv_create_srq`]; `attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let s = unsafe { softnic_srq(srq) };
    let q = match s.api.lock().unwrap_or_else(|e| e.into_inner()).query() {
        Ok(q) => q,
        Err(e) => return errno::of(&e),
    };
    // SAFETY: writable (caller contract).
    unsafe {
        attr.write(ibv_srq_attr {
            max_wr: q.max_wr,
            max_sge: q.max_sge,
            srq_limit: q.srq_limit,
        })
    };
    0
}

/// The `post_srq_recv` op behind the inline `ibv_post_srq_recv` (conventions of
/// [`crate::qp::post_recv`]).
///
/// # Safety
/// `srq` came from [`ibv_create_srq`]; `wr` is a valid NULL-terminated WR list.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut c_void,
    wr: *mut c_void,
    bad: *mut *mut c_void,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let s = unsafe { softnic_srq(srq as *mut ibv_srq) };
    let mut api = s.api.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: forwarded caller contract.
    unsafe {
        crate::qp::post_recv_list(wr, bad, |wrs| {
            crate::qp::post_chunk(&mut *api, wrs, SharedReceiveQueue::post_recv)
        })
    }
}
