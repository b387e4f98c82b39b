//! Thread domains and parent domains: `ibv_alloc_td`, `ibv_dealloc_td`,
//! `ibv_alloc_parent_domain` (the `alloc_td`, `dealloc_td` and `alloc_parent_domain`
//! ops), and `ibv_dealloc_pd` of a parent domain.
//!
//! A parent domain is rdma-core's extension of a PD: a protection domain, optionally a
//! thread domain, and optionally the program's allocator for the provider's buffers,
//! usable wherever a PD is (`ibv_reg_mr`, `ibv_create_qp`, `ibv_create_srq`,
//! `ibv_create_ah`, `ibv_alloc_mw`, `ibv_create_cq_ex` with
//! `IBV_CQ_INIT_ATTR_MASK_PD`). Here it is a [`SoftnicPd`] whose verbs-api PD is its
//! protection domain's, so every verb acts on that protection domain through it: an
//! MR registered on the parent domain serves a QP created on the protection domain,
//! and the other way round, as on mlx5. It counts as a user of its protection and
//! thread domains (`ibv_dealloc_pd` / `ibv_dealloc_td` of those: EBUSY while it
//! lives), and objects made on it count as its users.
//!
//! What the two hints buy on an mlx5 is not needed here, so they change nothing:
//! * a thread domain gives the QPs under it a doorbell of their own that needs no
//!   lock; softnic's doorbell is a shared-memory ring per queue already, whose
//!   post path takes only the queue's own uncontended lock;
//! * the allocators supply the memory of QP and CQ buffers; softnic's queues live in
//!   memory the NIC maps too (memfds this library creates and hands it), which
//!   memory from a program's allocator cannot be, so they are accepted and not
//!   called, as rdma-core lets a provider do (an allocator may itself answer
//!   `IBV_ALLOCATOR_USE_DEFAULT`).

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::*;
use crate::errno;
use crate::objects::{softnic_pd, SoftnicPd};

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`.
const KNOWN_COMP_MASK: u32 = (1 << 0) | (1 << 1);

/// What makes a [`SoftnicPd`] a parent domain: the protection domain and thread
/// domain (NULL if none) it was made of. Both NULL for a plain PD.
#[derive(Debug)]
pub(crate) struct Parent {
    pd: *mut ibv_pd,
    td: *mut ibv_td,
}

impl Default for Parent {
    fn default() -> Parent {
        Parent {
            pd: std::ptr::null_mut(),
            td: std::ptr::null_mut(),
        }
    }
}

impl Parent {
    /// Whether the PD holding this is a parent domain.
    pub(crate) fn is_parent_domain(&self) -> bool {
        !self.pd.is_null()
    }

    /// Stops counting as a user of the protection and thread domains (the parent
    /// domain is being deallocated).
    ///
    /// # Safety
    /// The PD and TD are live (they are while a parent domain uses them).
    pub(crate) unsafe fn release(&self) {
        if !self.pd.is_null() {
            // SAFETY: caller contract.
            unsafe { softnic_pd(self.pd) }
                .users
                .fetch_sub(1, Ordering::AcqRel);
        }
        if !self.td.is_null() {
            // SAFETY: caller contract.
            unsafe { softnic_td(self.td) }
                .users
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A thread domain: `ibv_td`, then the count of parent domains using it.
#[repr(C)]
pub struct SoftnicTd {
    /// Public part.
    pub td: ibv_td,
    /// Parent domains made with it (`ibv_dealloc_td`: EBUSY while any lives).
    users: AtomicU32,
}

/// The [`SoftnicTd`] around `td`.
///
/// # Safety
/// `td` came from [`alloc_td_op`] and is live.
unsafe fn softnic_td<'a>(td: *mut ibv_td) -> &'a SoftnicTd {
    // SAFETY: `td` is the first field of a boxed SoftnicTd (repr(C)).
    unsafe { &*(td as *const SoftnicTd) }
}

/// The `alloc_td` op behind the inline `ibv_alloc_td`: EINVAL for a NULL attribute or
/// an unknown `comp_mask` bit (none is defined), as mlx5 answers.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is NULL or a valid `ibv_td_init_attr`.
pub unsafe extern "C" fn alloc_td_op(
    context: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    // SAFETY: caller contract.
    match unsafe { attr.as_ref() } {
        Some(a) if a.comp_mask == 0 && !context.is_null() => {}
        _ => return errno::null(libc::EINVAL),
    }
    let b = Box::new(SoftnicTd {
        td: ibv_td { context },
        users: AtomicU32::new(0),
    });
    Box::into_raw(b) as *mut ibv_td
}

/// The `dealloc_td` op behind the inline `ibv_dealloc_td`: EBUSY while a parent
/// domain uses it.
///
/// # Safety
/// `td` came from [`alloc_td_op`] and is not used again when this returns 0.
pub unsafe extern "C" fn dealloc_td_op(td: *mut ibv_td) -> c_int {
    if td.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    if unsafe { softnic_td(td) }.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: reverses alloc_td_op's Box::into_raw.
    drop(unsafe { Box::from_raw(td as *mut SoftnicTd) });
    0
}

/// The `alloc_parent_domain` op behind the inline `ibv_alloc_parent_domain`: a parent
/// domain over `attr.pd` (and `attr.td`). EINVAL, as mlx5 answers, for a NULL `attr`
/// or `attr.pd`, an unknown `comp_mask` bit, a `pd` that is itself a parent domain,
/// or a `pd` or `td` of another context.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is NULL or a valid
/// `ibv_parent_domain_init_attr` whose `pd` and `td` are NULL or live.
pub unsafe extern "C" fn alloc_parent_domain_op(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: caller contract.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return errno::null(libc::EINVAL);
    };
    if a.pd.is_null() || a.comp_mask & !KNOWN_COMP_MASK != 0 {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: a live PD (caller contract).
    let pd = unsafe { softnic_pd(a.pd) };
    // SAFETY: a live TD or NULL (caller contract).
    let td = (!a.td.is_null()).then(|| unsafe { softnic_td(a.td) });
    if pd.parent.is_parent_domain()
        || pd.pd.context != context
        || td.is_some_and(|t| t.td.context != context)
    {
        return errno::null(libc::EINVAL);
    }
    pd.users.fetch_add(1, Ordering::AcqRel);
    if let Some(t) = td {
        t.users.fetch_add(1, Ordering::AcqRel);
    }
    let b = Box::new(SoftnicPd {
        pd: ibv_pd {
            context,
            handle: pd.pd.handle,
        },
        api: pd.api.clone(),
        users: AtomicU32::new(0),
        parent: Parent { pd: a.pd, td: a.td },
    });
    Box::into_raw(b) as *mut ibv_pd
}

/// Whether `pd` (live, of this library) is a parent domain.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd` or [`alloc_parent_domain_op`] and is live.
pub(crate) unsafe fn is_parent_domain(pd: *mut ibv_pd) -> bool {
    // SAFETY: caller contract.
    unsafe { softnic_pd(pd) }.parent.is_parent_domain()
}
