//! `ibv_resize_cq`: the CQ moves to a new ring of at least `cqe` entries, with the
//! completions not yet polled ([`verbs_api::CompletionQueue::resize`]). The CQ's poll
//! lock is held throughout, so no `ibv_poll_cq` reads the ring being replaced.

use std::ffi::c_int;

use crate::abi::ibv_cq;
use crate::errno;
use crate::objects::softnic_cq;

/// `ibv_resize_cq`: 0, or an errno value (EINVAL when more than `cqe` completions
/// wait, as rxe answers). `cq->cqe` becomes the new ring's capacity.
///
/// # Safety
/// `cq` came from `ibv_create_cq` / `ibv_create_cq_ex` and is live.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() || cqe <= 0 {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let c = unsafe { softnic_cq(cq) };
    let mut api = c.api.lock().unwrap_or_else(|e| e.into_inner());
    match api.resize(cqe as u32) {
        Ok(capacity) => {
            // SAFETY: caller contract (a live CQ); written under the poll lock.
            unsafe { (*cq).cqe = capacity.min(c_int::MAX as u32) as c_int };
            0
        }
        Err(e) => errno::of(&e),
    }
}
