//! Verbs the stock tools import that softnic's C ABI does not implement yet.
//!
//! Each answers exactly as rdma-core does for a provider that lacks the verb (its
//! `dummy_ops.c`): a pointer-returning verb sets `errno` to EOPNOTSUPP and returns
//! NULL; an `int`-returning verb returns EOPNOTSUPP. Nothing crashes and nothing
//! pretends to succeed. The binaries are BIND_NOW, so every symbol they import must
//! exist for them to start at all (`ibv_devinfo` imports `ibv_query_gid_type`, perftest
//! imports the QP verbs even for a device query).

use std::ffi::{c_int, c_void};

use crate::abi::ibv_context_ops;
use crate::errno;

const E: c_int = libc::EOPNOTSUPP;

/// The ops of every context, called by the inline `ibv_poll_cq`, `ibv_req_notify_cq`,
/// `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` and the memory-window verbs
/// (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`) through `ctx->ops`.
pub fn context_ops() -> ibv_context_ops {
    // SAFETY: all fields are Option<fn>: all-zero is all-None.
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(crate::objects::poll_cq);
    ops.req_notify_cq = Some(crate::objects::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    ops.alloc_mw = Some(crate::mw::alloc_mw);
    ops.bind_mw = Some(crate::mw::bind_mw);
    ops.dealloc_mw = Some(crate::mw::dealloc_mw);
    ops
}

macro_rules! null_verb {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* )) => {
        $(#[$m])*
        ///
        /// Not implemented yet: NULL with `errno` = EOPNOTSUPP.
        ///
        /// # Safety
        /// Arguments are not dereferenced.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> *mut c_void {
            $(let _ = $a;)*
            errno::null(E)
        }
    };
}

macro_rules! int_verb {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* )) => {
        $(#[$m])*
        ///
        /// Not implemented yet: returns EOPNOTSUPP.
        ///
        /// # Safety
        /// Arguments are not dereferenced.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            $(let _ = $a;)*
            E
        }
    };
}

type P = *mut c_void;

int_verb!(
    /// `ibv_query_ece`.
    ibv_query_ece(qp: P, ece: P)
);
int_verb!(
    /// `ibv_set_ece`.
    ibv_set_ece(qp: P, ece: P)
);

/// `ibv_copy_ah_attr_from_kern`, `ibv_copy_qp_attr_from_kern`,
/// `ibv_copy_path_rec_from_kern`: converters from kernel uverbs structs that only
/// rdma-core's own librdmacm calls, after a reply of the kernel's rdma_cm — which does
/// not exist here (its `rdma_create_event_channel` fails first, on
/// `/dev/infiniband/rdma_cm`). They are exported so that librdmacm loads; they leave
/// `dst` untouched (they return nothing, so they cannot report it).
///
/// # Safety
/// Arguments are not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: P, src: P) {
    let _ = (dst, src);
}

/// See [`ibv_copy_ah_attr_from_kern`].
///
/// # Safety
/// Arguments are not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: P, src: P) {
    let _ = (dst, src);
}

/// See [`ibv_copy_ah_attr_from_kern`].
///
/// # Safety
/// Arguments are not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: P, src: P) {
    let _ = (dst, src);
}

// Verbs pyverbs (Debian's python3-pyverbs) imports; the extension modules are BIND_NOW
// too, so `import pyverbs.qp` fails without them. Each answers as rdma-core's
// `dummy_ops.c` does for a provider that lacks the op.

null_verb!(
    /// `ibv_reg_dmabuf_mr`: no dma-buf importer in a userspace NIC.
    ibv_reg_dmabuf_mr(pd: P, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int)
);
null_verb!(
    /// `ibv_import_device`: it shares a kernel uverbs command fd, which softnic has not.
    ibv_import_device(cmd_fd: c_int)
);
null_verb!(
    /// `ibv_import_pd`: only a context from `ibv_import_device` could share a PD.
    ibv_import_pd(ctx: P, handle: u32)
);
null_verb!(
    /// `ibv_import_mr`: see [`ibv_import_pd`].
    ibv_import_mr(pd: P, handle: u32)
);
null_verb!(
    /// `ibv_import_dm`: device memory does not exist here.
    ibv_import_dm(ctx: P, handle: u32)
);

/// `ibv_unimport_pd`, `ibv_unimport_mr`, `ibv_unimport_dm`: release an imported
/// object. Nothing can be imported (the `ibv_import_*` verbs fail), so they can only see
/// a pointer this library never handed out; they return nothing, so they touch nothing.
///
/// # Safety
/// The argument is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: P) {
    let _ = pd;
}

/// See [`ibv_unimport_pd`].
///
/// # Safety
/// The argument is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: P) {
    let _ = mr;
}

/// See [`ibv_unimport_pd`].
///
/// # Safety
/// The argument is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(dm: P) {
    let _ = dm;
}

/// `ibv_query_qp_data_in_order`: 0, "in-order placement not guaranteed" — what
/// rdma-core answers for a provider without the op (and on every non-x86 build). It
/// promises nothing, which is always true.
///
/// # Safety
/// Arguments are not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(qp: P, op: c_int, flags: u32) -> c_int {
    let _ = (qp, op, flags);
    0
}
