//! What softnic's `librdmacm.so.1` (crate `softnic-rdmacm`) needs from this library.
//!
//! Stock librdmacm hands programs the `ibv_context *`, `ibv_pd *` and `ibv_qp *` of the
//! libibverbs they link, and moves QPs through the kernel. softnic's librdmacm is a Rust
//! crate on top of this one, linked into the same shared object (`libibverbs.so.1`;
//! `librdmacm.so.1` only forwards to it), so that a connection id's verbs-api context
//! and the program's `ibv_*` objects are the very same objects, not two copies that
//! would each hold their own connection to the NIC.

use std::ffi::c_int;
use std::sync::Mutex;

use verbs_api::{Context, Device, QueuePair};

use crate::abi::{ibv_context, ibv_qp};

/// An `ibv_context *` around `api` (a context a connection id opened on its NIC), as
/// [`crate::device::ibv_open_device`] would return for that NIC's device; closed with
/// `ibv_close_device`. The device is the one `ibv_get_device_list` lists for the NIC.
pub fn wrap_context(api: Context) -> *mut ibv_context {
    let path = Device::named(api.name()).path().to_path_buf();
    crate::device::context_for_path(path, api)
}

/// The verbs-api context behind an `ibv_context *`.
///
/// # Safety
/// `ctx` came from this library (`ibv_open_device` or [`wrap_context`]) and is open.
pub unsafe fn api_context<'a>(ctx: *mut ibv_context) -> &'a Context {
    // SAFETY: forwarded caller contract.
    &unsafe { crate::device::softnic_context(ctx) }.api
}

/// The verbs-api QP behind an `ibv_qp *` (locked while a post or a CM call uses it).
///
/// # Safety
/// `qp` came from this library's `ibv_create_qp` / `ibv_create_qp_ex` and is live.
pub unsafe fn queue_pair<'a>(qp: *mut ibv_qp) -> &'a Mutex<QueuePair> {
    // SAFETY: forwarded caller contract.
    &unsafe { crate::qp::softnic_qp(qp) }.api
}

/// Refreshes `qp->state` and verbs-api's cached state from the NIC, after the CM moved
/// the QP (connect, accept, disconnect): returns 0 or the errno.
///
/// # Safety
/// As [`queue_pair`].
pub unsafe fn refresh_qp(qp: *mut ibv_qp) -> c_int {
    let mut attr = crate::abi::ibv_qp_attr::default();
    // SAFETY: ibv_qp_init_attr is pointers and integers: all-zero is valid.
    let mut init: crate::abi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    // SAFETY: forwarded caller contract; both out-structs are writable.
    unsafe { crate::qp::ibv_query_qp(qp, &mut attr, 0, &mut init) }
}
