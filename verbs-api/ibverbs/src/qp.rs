//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp` and
//! the `post_send` / `post_recv` ops behind the inline `ibv_post_send` /
//! `ibv_post_recv` (loads and stores on the shared rings, no syscall unless the NIC
//! sleeps).
//!
//! RC, UC and UD QPs are supported (a UD receive buffer starts with the 40-byte GRH, as
//! on rxe; the NIC writes it), and through `ibv_create_qp_ex` the XRC initiator and
//! target types ([`crate::xrc`]). Every QP is allocated as a `struct ibv_qp_ex`; QPs
//! made by `ibv_create_qp_ex` with send-ops flags also get the `ibv_wr_*` API
//! ([`crate::wr`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use verbs_api::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr,
    SendFlags, SendWr, Sge, WrOpcode, XrcSendQpInitAttr,
};

use crate::abi::*;
use crate::errno;
use crate::objects::{softnic_cq, softnic_pd};

/// A QP: `ibv_qp_ex` (whose first member is `ibv_qp`), then the verbs-api QP.
#[repr(C)]
pub struct SoftnicQp {
    /// Public part.
    pub qpx: ibv_qp_ex,
    /// The verbs-api QP (one poster at a time; uncontended lock = no syscall).
    pub(crate) api: Mutex<QueuePair>,
    sq_sig_all: bool,
    /// The `ibv_wr_*` batch being built (QPs from `ibv_create_qp_ex` only).
    pub(crate) batch: Mutex<crate::wr::Batch>,
    /// Created with send-ops flags: `ibv_qp_to_qp_ex` returns it.
    pub(crate) extended: bool,
    /// What it counts as a user of.
    held: Held,
}

/// The objects a QP counts as a user of while it lives (their destroy is EBUSY
/// meanwhile), released by `ibv_destroy_qp`. For RC, UC and UD these are the public
/// `ibv_qp`'s; the public fields of an XRC QP mirror its `ibv_qp_init_attr_ex` as
/// rdma-core's do, including a receive CQ or SRQ the QP does not use, so they are kept
/// apart: an XRC initiator holds its PD and send CQ, a target only its XRC domain.
struct Held {
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    xrcd: *mut ibv_xrcd,
}

impl Held {
    /// Counts the QP as a user of each object.
    ///
    /// # Safety
    /// Every non-NULL pointer is a live object of this library.
    unsafe fn take(&self) {
        // SAFETY: caller contract.
        unsafe { self.count(1) }
    }

    /// Stops counting the QP as their user.
    ///
    /// # Safety
    /// As [`Held::take`], after it.
    unsafe fn release(&self) {
        // SAFETY: caller contract.
        unsafe { self.count(u32::MAX) }
    }

    /// Adds `delta` (wrapping: `u32::MAX` subtracts one) to each object's user count.
    ///
    /// # Safety
    /// As [`Held::take`].
    unsafe fn count(&self, delta: u32) {
        let add = |users: &std::sync::atomic::AtomicU32| {
            users.fetch_add(delta, Ordering::AcqRel);
        };
        // SAFETY: live objects of this library (caller contract).
        unsafe {
            if !self.pd.is_null() {
                add(&softnic_pd(self.pd).users);
            }
            for cq in [self.send_cq, self.recv_cq] {
                if !cq.is_null() {
                    add(&softnic_cq(cq).users);
                }
            }
            if !self.srq.is_null() {
                add(&crate::srq::softnic_srq(self.srq).users);
            }
            if !self.xrcd.is_null() {
                add(&crate::xrc::softnic_xrcd(self.xrcd).users);
            }
        }
    }
}

// enum ibv_qp_type
const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UC: c_int = 3;
const IBV_QPT_UD: c_int = 4;
const IBV_QPT_XRC_SEND: c_int = 9;
const IBV_QPT_XRC_RECV: c_int = 10;

/// `IBV_SEND_INLINE` (enum ibv_send_flags).
pub(crate) const IBV_SEND_INLINE: u32 = 8;
/// Most SGEs per WR (verbs-api's slot).
const MAX_SGE: usize = verbs_api::abi::MAX_SGE;

// enum ibv_qp_attr_mask
const QP_STATE: c_int = 1 << 0;
const QP_CUR_STATE: c_int = 1 << 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_QKEY: c_int = 1 << 6;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
/// Every mask bit this library implements.
const QP_SUPPORTED: c_int = QP_STATE
    | QP_CUR_STATE
    | QP_ACCESS_FLAGS
    | QP_PKEY_INDEX
    | QP_PORT
    | QP_QKEY
    | QP_AV
    | QP_PATH_MTU
    | QP_TIMEOUT
    | QP_RETRY_CNT
    | QP_RNR_RETRY
    | QP_RQ_PSN
    | QP_MAX_QP_RD_ATOMIC
    | QP_MIN_RNR_TIMER
    | QP_SQ_PSN
    | QP_MAX_DEST_RD_ATOMIC
    | QP_DEST_QPN;

fn state_num(s: QpState) -> c_int {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn state_of(n: c_int) -> Option<QpState> {
    Some(match n {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn mtu_of(n: c_int) -> Option<Mtu> {
    Some(match n {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn mtu_num(bytes: u32) -> c_int {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => 0,
    }
}

/// The capabilities a QP really has, as `ibv_create_qp` / `ibv_query_qp` report them
/// (the verbs allow more than was asked for; rxe reports its rounded-up queues too).
/// Each work queue is a ring of `max_*_wr` rounded up to a power of two, and that many
/// WRs can be outstanding: the next post is ENOMEM (pyverbs' `test_full_rq_bad_flow`
/// posts one more than reported and expects that).
fn cap_out(c: QpCap) -> ibv_qp_cap {
    let ring = |wr: u32| verbs_api::abi::layout::wq_capacity(wr).unwrap_or(wr);
    ibv_qp_cap {
        max_send_wr: ring(c.max_send_wr),
        max_recv_wr: ring(c.max_recv_wr),
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`cap_out`] for `q`: an XRC initiator has no receive queue and an XRC target no
/// queue at all, so those report 0 (their rings exist only for the segment's layout).
fn cap_of(q: &QueuePair) -> ibv_qp_cap {
    let c = cap_out(q.cap());
    match q.qp_type() {
        QpType::XrcSend => ibv_qp_cap {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..c
        },
        QpType::XrcRecv => ibv_qp_cap::default(),
        _ => c,
    }
}

/// `ibv_create_qp`: RC, UC, UD or XRC_SEND on `pd`, with the CQs given; writes the
/// granted sizes back into `init_attr->cap`. XRC_RECV needs `ibv_create_qp_ex` (its
/// XRC domain): EINVAL here; other types are EOPNOTSUPP.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `init_attr` is a valid `ibv_qp_init_attr` whose CQs
/// came from `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: forwarded caller contract.
    unsafe { create(pd, init_attr, None) }
}

// enum ibv_qp_init_attr_mask
const QP_INIT_ATTR_PD: u32 = 1 << 0;
const QP_INIT_ATTR_XRCD: u32 = 1 << 1;
const QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// The `create_qp_ex` op behind the inline `ibv_create_qp_ex` (used when the caller
/// sets more than `IBV_QP_INIT_ATTR_PD`): with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, the
/// QP gets the `ibv_wr_*` API; `IBV_QP_INIT_ATTR_CREATE_FLAGS` with no flag set is
/// accepted. `IBV_QPT_XRC_SEND` needs `IBV_QP_INIT_ATTR_PD` and a send CQ (its receive
/// CQ, SRQ and receive sizes are ignored, as the kernel ignores them), and
/// `IBV_QPT_XRC_RECV` needs `IBV_QP_INIT_ATTR_XRCD` (it uses no PD, CQ or SRQ, and
/// takes no send-ops flags): EINVAL without them. Other extensions (RSS, any create
/// flag, TSO, source QPN) are EOPNOTSUPP.
///
/// # Safety
/// `attr` is a valid `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn create_qp_ex_op(
    context: *mut ibv_context,
    attr: *mut c_void,
) -> *mut c_void {
    if attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let ax = unsafe { &mut *(attr as *mut ibv_qp_init_attr_ex) };
    // `create_flags` counts only under its mask bit; with it, no flag is supported (as
    // rxe: the mask with flags 0 is accepted, which pyverbs' random QP tests rely on).
    let known = QP_INIT_ATTR_PD
        | QP_INIT_ATTR_XRCD
        | QP_INIT_ATTR_CREATE_FLAGS
        | QP_INIT_ATTR_SEND_OPS_FLAGS;
    if ax.comp_mask & !known != 0
        || (ax.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && ax.create_flags != 0)
    {
        return errno::null(libc::EOPNOTSUPP);
    }
    let send_ops = (ax.comp_mask & QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(ax.send_ops_flags);
    if send_ops.is_some_and(|o| o & !crate::wr::SUPPORTED_SEND_OPS != 0) {
        return errno::null(libc::EOPNOTSUPP);
    }
    if ax.qp_type == IBV_QPT_XRC_RECV {
        if ax.comp_mask & QP_INIT_ATTR_XRCD == 0 || ax.xrcd.is_null() {
            return errno::null(libc::EINVAL);
        }
        if send_ops.is_some() {
            // A target has no send queue to post to.
            return errno::null(libc::EOPNOTSUPP);
        }
        // SAFETY: forwarded caller contract.
        return unsafe { create_xrc_recv(context, ax) } as *mut c_void;
    }
    if ax.comp_mask & QP_INIT_ATTR_PD == 0 || ax.pd.is_null() {
        return errno::null(libc::EINVAL);
    }
    if ax.qp_type == IBV_QPT_XRC_SEND {
        // SAFETY: forwarded caller contract.
        return unsafe { create_xrc_send(ax, send_ops) } as *mut c_void;
    }
    let mut ia = ibv_qp_init_attr {
        qp_context: ax.qp_context,
        send_cq: ax.send_cq,
        recv_cq: ax.recv_cq,
        srq: ax.srq,
        cap: ax.cap,
        qp_type: ax.qp_type,
        sq_sig_all: ax.sq_sig_all,
    };
    // SAFETY: forwarded caller contract.
    let qp = unsafe { create(ax.pd, &mut ia, send_ops) };
    ax.cap = ia.cap;
    qp as *mut c_void
}

/// `ibv_create_qp` and the `create_qp_ex` op; `send_ops` = the `ibv_wr_*` operations
/// to enable.
///
/// # Safety
/// As [`ibv_create_qp`].
unsafe fn create(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    if pd.is_null() || init_attr.is_null() {
        return errno::null(libc::EINVAL);
    }

    // SAFETY: caller contract.
    let ia = unsafe { &mut *init_attr };
    let qp_type = match ia.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        IBV_QPT_XRC_SEND => {
            // `ibv_create_qp` makes XRC initiators too (and the inline
            // `ibv_create_qp_ex` calls it when only IBV_QP_INIT_ATTR_PD is set).
            // SAFETY: ibv_qp_init_attr_ex is plain data: all-zero is valid.
            let mut ax: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            ax.qp_context = ia.qp_context;
            ax.send_cq = ia.send_cq;
            ax.recv_cq = ia.recv_cq;
            ax.srq = ia.srq;
            ax.cap = ia.cap;
            ax.qp_type = ia.qp_type;
            ax.sq_sig_all = ia.sq_sig_all;
            ax.comp_mask = QP_INIT_ATTR_PD;
            ax.pd = pd;
            // SAFETY: forwarded caller contract.
            let qp = unsafe { create_xrc_send(&mut ax, send_ops) };
            ia.cap = ax.cap;
            return qp;
        }
        // A target needs its XRC domain, which only `ibv_create_qp_ex` can give.
        IBV_QPT_XRC_RECV => return errno::null(libc::EINVAL),
        _ => return errno::null(libc::EOPNOTSUPP),
    };
    if ia.send_cq.is_null() || ia.recv_cq.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract (CQs and PD from this library).
    let (p, scq, rcq) = unsafe {
        (
            softnic_pd(pd),
            softnic_cq(ia.send_cq),
            softnic_cq(ia.recv_cq),
        )
    };
    let cap = QpCap {
        max_send_wr: ia.cap.max_send_wr,
        max_recv_wr: ia.cap.max_recv_wr,
        max_send_sge: ia.cap.max_send_sge,
        max_recv_sge: ia.cap.max_recv_sge,
        max_inline_data: ia.cap.max_inline_data,
    };
    let srq = (!ia.srq.is_null()).then(|| {
        // SAFETY: an SRQ from ibv_create_srq (caller contract).
        unsafe { crate::srq::softnic_srq(ia.srq as *mut ibv_srq) }
    });
    let created = {
        let s = scq.api.lock().unwrap_or_else(|e| e.into_inner());
        let r =
            (!std::ptr::eq(scq, rcq)).then(|| rcq.api.lock().unwrap_or_else(|e| e.into_inner()));
        let attr = QpInitAttr {
            qp_type,
            send_cq: &s,
            recv_cq: r.as_deref().unwrap_or(&s),
            cap,
            sq_sig_all: ia.sq_sig_all != 0,
        };
        match srq {
            Some(q) => p
                .api
                .create_qp_with_srq(&attr, &q.api.lock().unwrap_or_else(|e| e.into_inner())),
            None => p.api.create_qp(&attr),
        }
    };
    let api = match created {
        Ok(q) => q,
        Err(e) => return errno::null(errno::of(&e)),
    };
    ia.cap = cap_of(&api);
    // SAFETY: ibv_qp is pointers, integers, a mutex and a condvar: all-zero is valid
    // before `finish` initialises them.
    let mut pub_qp: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: pd is live.
    pub_qp.context = unsafe { (*pd).context };
    pub_qp.qp_context = ia.qp_context;
    pub_qp.pd = pd;
    pub_qp.send_cq = ia.send_cq;
    pub_qp.recv_cq = ia.recv_cq;
    pub_qp.srq = ia.srq;
    pub_qp.qp_type = ia.qp_type;
    let held = Held {
        pd,
        send_cq: ia.send_cq,
        recv_cq: ia.recv_cq,
        srq: ia.srq as *mut ibv_srq,
        xrcd: std::ptr::null_mut(),
    };
    // SAFETY: the held objects are live (caller contract).
    unsafe { finish(pub_qp, api, held, ia.sq_sig_all != 0, send_ops) }
}

/// An `IBV_QPT_XRC_SEND` QP from `ibv_create_qp_ex` (`create_qp_ex_op` checked the
/// mask and the PD).
///
/// # Safety
/// `ax.pd` and `ax.send_cq` are NULL or live objects of this library.
unsafe fn create_xrc_send(ax: &mut ibv_qp_init_attr_ex, send_ops: Option<u64>) -> *mut ibv_qp {
    if ax.send_cq.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let (p, scq) = unsafe { (softnic_pd(ax.pd), softnic_cq(ax.send_cq)) };
    let cap = QpCap {
        max_send_wr: ax.cap.max_send_wr,
        max_recv_wr: 0,
        max_send_sge: ax.cap.max_send_sge,
        max_recv_sge: 0,
        max_inline_data: ax.cap.max_inline_data,
    };
    let created = {
        let s = scq.api.lock().unwrap_or_else(|e| e.into_inner());
        p.api.create_xrc_send_qp(&XrcSendQpInitAttr {
            send_cq: &s,
            cap,
            sq_sig_all: ax.sq_sig_all != 0,
        })
    };
    let api = match created {
        Ok(q) => q,
        Err(e) => return errno::null(errno::of(&e)),
    };
    ax.cap = cap_of(&api);
    // SAFETY: see `create`.
    let mut pub_qp: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: the PD is live (caller contract).
    pub_qp.context = unsafe { (*ax.pd).context };
    pub_qp.qp_context = ax.qp_context;
    pub_qp.pd = ax.pd;
    pub_qp.send_cq = ax.send_cq;
    pub_qp.recv_cq = ax.recv_cq;
    pub_qp.srq = ax.srq;
    pub_qp.qp_type = IBV_QPT_XRC_SEND;
    let held = Held {
        pd: ax.pd,
        send_cq: ax.send_cq,
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        xrcd: std::ptr::null_mut(),
    };
    // SAFETY: the held objects are live (caller contract).
    unsafe { finish(pub_qp, api, held, ax.sq_sig_all != 0, send_ops) }
}

/// An `IBV_QPT_XRC_RECV` QP from `ibv_create_qp_ex` in `ax.xrcd` (checked non-NULL).
///
/// # Safety
/// `ax.xrcd` is a live XRC domain open of this library.
unsafe fn create_xrc_recv(context: *mut ibv_context, ax: &mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    // SAFETY: caller contract.
    let x = unsafe { crate::xrc::softnic_xrcd(ax.xrcd) };
    if x.xrcd.context != context {
        return errno::null(libc::EINVAL);
    }
    let created = match x.api.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(xrcd) => xrcd.create_recv_qp(),
        None => return errno::null(libc::EINVAL),
    };
    let api = match created {
        Ok(q) => q,
        Err(e) => return errno::null(errno::of(&e)),
    };
    ax.cap = cap_of(&api);
    // SAFETY: see `create`.
    let mut pub_qp: ibv_qp = unsafe { std::mem::zeroed() };
    pub_qp.context = context;
    pub_qp.qp_context = ax.qp_context;
    if ax.comp_mask & QP_INIT_ATTR_PD != 0 {
        pub_qp.pd = ax.pd;
    }
    pub_qp.send_cq = ax.send_cq;
    pub_qp.recv_cq = ax.recv_cq;
    pub_qp.srq = ax.srq;
    pub_qp.qp_type = IBV_QPT_XRC_RECV;
    let held = Held {
        pd: std::ptr::null_mut(),
        send_cq: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        xrcd: ax.xrcd,
    };
    // SAFETY: the held XRC domain is live (caller contract).
    unsafe { finish(pub_qp, api, held, false, None) }
}

/// Boxes `api` behind `pub_qp` (its context, cookie, objects and type already set),
/// counts the QP as a user of `held`, and registers it for asynchronous events.
///
/// # Safety
/// `pub_qp.context` is a live context of this library; `held`'s objects are live.
unsafe fn finish(
    mut pub_qp: ibv_qp,
    api: QueuePair,
    held: Held,
    sq_sig_all: bool,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    pub_qp.handle = api.qp_num();
    pub_qp.qp_num = api.qp_num();
    pub_qp.state = state_num(api.state());
    // SAFETY: ibv_qp_ex is an ibv_qp, integers and Option<fn>s: all-zero is valid.
    let mut qpx: ibv_qp_ex = unsafe { std::mem::zeroed() };
    qpx.qp_base = pub_qp;
    if let Some(ops) = send_ops {
        crate::wr::install(&mut qpx, ops);
    }
    let context = qpx.qp_base.context;
    let b = Box::into_raw(Box::new(SoftnicQp {
        qpx,
        api: Mutex::new(api),
        sq_sig_all,
        batch: Mutex::new(crate::wr::Batch::default()),
        extended: send_ops.is_some(),
        held,
    }));
    // SAFETY: b is a fresh box; the mutex and condvar are at their final addresses.
    unsafe {
        libc::pthread_mutex_init(
            std::ptr::addr_of_mut!((*b).qpx.qp_base.mutex),
            std::ptr::null(),
        );
        libc::pthread_cond_init(
            std::ptr::addr_of_mut!((*b).qpx.qp_base.cond),
            std::ptr::null(),
        );
        (*b).held.take();
    }
    // Every QP may raise affiliated events (`async_event`).
    // SAFETY: the context is live (caller contract).
    let ctx = unsafe { crate::device::softnic_context(context) };
    // SAFETY: b is live.
    ctx.events
        .register_qp(unsafe { (*b).qpx.qp_base.qp_num }, b as usize);
    ctx.events.start(&ctx.api, ctx.async_fd());
    b as *mut ibv_qp
}

/// # Safety
/// `qp` came from [`ibv_create_qp`] and is live.
pub unsafe fn softnic_qp<'a>(qp: *mut ibv_qp) -> &'a SoftnicQp {
    // SAFETY: `qp` is the first field of a boxed SoftnicQp.
    unsafe { &*(qp as *const SoftnicQp) }
}

/// `ibv_attach_mcast`: the UD QP receives the datagrams sent to the group `gid`
/// (`QueuePair::attach_mcast`). `lid` is unused: RoCE has no LIDs (rxe ignores it too).
/// 0, or the errno: EINVAL for a QP that is not UD or a GID that is no IP multicast
/// group of the NIC's family, ENOMEM past the NIC's group limits.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; `gid` points at 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: caller contract.
    unsafe { mcast(qp, gid, lid, true) }
}

/// `ibv_detach_mcast`: undoes [`ibv_attach_mcast`]; EINVAL when the QP is not attached
/// to the group.
///
/// # Safety
/// As [`ibv_attach_mcast`].
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: caller contract.
    unsafe { mcast(qp, gid, lid, false) }
}

/// The body of [`ibv_attach_mcast`] (`attach`) and [`ibv_detach_mcast`].
///
/// # Safety
/// As [`ibv_attach_mcast`].
unsafe fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16, attach: bool) -> c_int {
    if qp.is_null() || gid.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract: a live QP of this library and 16 readable bytes.
    let (q, g) = unsafe { (softnic_qp(qp), (*gid).raw) };
    let api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    let done = if attach {
        api.attach_mcast(verbs_api::Gid(g))
    } else {
        api.detach_mcast(verbs_api::Gid(g))
    };
    match done {
        Ok(()) => 0,
        Err(e) => errno::of(&e),
    }
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the context outlives its QPs (caller contract).
    let retired = unsafe {
        let ctx = crate::device::softnic_context((*qp).context);
        ctx.events
            .forget_qp((*qp).qp_num, qp as usize, ctx.async_fd())
    };
    // SAFETY: reverses ibv_create_qp's Box::into_raw (caller contract: once).
    let b = unsafe { Box::from_raw(qp as *mut SoftnicQp) };
    // SAFETY: the objects a QP holds outlive it (their destroy is EBUSY meanwhile).
    unsafe {
        b.held.release();
        if !retired {
            // An event of it is still out after the wait: the QP goes in the NIC (its
            // handle dropped) but its memory stays for the late acknowledgement
            // (`Events::retire`). `api` is initialised and dropped only here; the rest
            // is leaked, never read as a QP again (it left the live maps above).
            let b = Box::into_raw(b);
            std::ptr::drop_in_place(std::ptr::addr_of_mut!((*b).api));
            return 0;
        }
        libc::pthread_cond_destroy(std::ptr::addr_of!(b.qpx.qp_base.cond).cast_mut());
        libc::pthread_mutex_destroy(std::ptr::addr_of!(b.qpx.qp_base.mutex).cast_mut());
    }
    drop(b);
    0
}

/// The verbs-api attributes of `(attr, mask)`, or the errno: EOPNOTSUPP for a mask bit
/// softnic does not implement (SQD notification, alternate paths, path migration, cap
/// changes, rate limits), EINVAL for an out-of-range value.
fn attrs_of(attr: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    if mask & !QP_SUPPORTED != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let has = |b: c_int| mask & b != 0;
    let mut a = QpAttr::default();
    if has(QP_STATE) {
        a.qp_state = Some(state_of(attr.qp_state).ok_or(libc::EINVAL)?);
    }
    if has(QP_PATH_MTU) {
        a.path_mtu = Some(mtu_of(attr.path_mtu).ok_or(libc::EINVAL)?);
    }
    if has(QP_DEST_QPN) {
        a.dest_qp_num = Some(attr.dest_qp_num);
    }
    if has(QP_RQ_PSN) {
        a.rq_psn = Some(attr.rq_psn);
    }
    if has(QP_SQ_PSN) {
        a.sq_psn = Some(attr.sq_psn);
    }
    if has(QP_AV) {
        let ah = &attr.ah_attr;
        // RoCE addresses by GID: a LID-only (non-global) address cannot be routed.
        if ah.is_global == 0 {
            return Err(libc::EINVAL);
        }
        a.ah_attr = Some(AhAttr {
            dgid: Gid(ah.grh.dgid.raw),
            sgid_index: ah.grh.sgid_index,
            hop_limit: ah.grh.hop_limit,
            traffic_class: ah.grh.traffic_class,
            udp_port: 0,
        });
    }
    if has(QP_TIMEOUT) {
        a.timeout = Some(attr.timeout);
    }
    if has(QP_RETRY_CNT) {
        a.retry_cnt = Some(attr.retry_cnt);
    }
    if has(QP_RNR_RETRY) {
        a.rnr_retry = Some(attr.rnr_retry);
    }
    if has(QP_MIN_RNR_TIMER) {
        a.min_rnr_timer = Some(attr.min_rnr_timer);
    }
    if has(QP_MAX_QP_RD_ATOMIC) {
        a.max_rd_atomic = Some(attr.max_rd_atomic);
    }
    if has(QP_MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = Some(attr.max_dest_rd_atomic);
    }
    if has(QP_ACCESS_FLAGS) {
        // A QP acts on the access bits of remote operations only. The kernel (rxe,
        // mlx5) takes any other bits without complaint, and programs pass their MRs'
        // flags here (pyverbs' ODP tests pass IBV_ACCESS_ON_DEMAND), so they are
        // dropped rather than refused.
        a.qp_access_flags = Some(AccessFlags(attr.qp_access_flags & AccessFlags::ALL.bits()));
    }
    if has(QP_QKEY) {
        a.qkey = Some(attr.qkey);
    }
    if has(QP_PKEY_INDEX) {
        a.pkey_index = Some(attr.pkey_index);
    }
    if has(QP_PORT) {
        a.port_num = Some(attr.port_num);
    }
    Ok(a)
}

/// The inverse of [`attrs_of`]: `(attr, mask)` for verbs-api attributes, as
/// `rdma_init_qp_attr` hands them to a program that moves its QP itself.
pub fn ibv_attr_of(a: &QpAttr) -> (ibv_qp_attr, c_int) {
    let mut out = ibv_qp_attr::default();
    let mut mask = 0;
    let mut set = |bit: c_int, present: bool| {
        if present {
            mask |= bit;
        }
    };
    set(QP_STATE, a.qp_state.is_some());
    set(QP_PATH_MTU, a.path_mtu.is_some());
    set(QP_DEST_QPN, a.dest_qp_num.is_some());
    set(QP_RQ_PSN, a.rq_psn.is_some());
    set(QP_SQ_PSN, a.sq_psn.is_some());
    set(QP_AV, a.ah_attr.is_some());
    set(QP_TIMEOUT, a.timeout.is_some());
    set(QP_RETRY_CNT, a.retry_cnt.is_some());
    set(QP_RNR_RETRY, a.rnr_retry.is_some());
    set(QP_MIN_RNR_TIMER, a.min_rnr_timer.is_some());
    set(QP_MAX_QP_RD_ATOMIC, a.max_rd_atomic.is_some());
    set(QP_MAX_DEST_RD_ATOMIC, a.max_dest_rd_atomic.is_some());
    set(QP_ACCESS_FLAGS, a.qp_access_flags.is_some());
    set(QP_QKEY, a.qkey.is_some());
    set(QP_PKEY_INDEX, a.pkey_index.is_some());
    set(QP_PORT, a.port_num.is_some());
    out.qp_state = a.qp_state.map_or(0, state_num);
    out.path_mtu = a.path_mtu.map_or(0, |m| mtu_num(m.bytes()));
    out.dest_qp_num = a.dest_qp_num.unwrap_or(0);
    out.rq_psn = a.rq_psn.unwrap_or(0);
    out.sq_psn = a.sq_psn.unwrap_or(0);
    if let Some(ah) = &a.ah_attr {
        out.ah_attr = ibv_ah_attr_of(ah);
    }
    out.timeout = a.timeout.unwrap_or(0);
    out.retry_cnt = a.retry_cnt.unwrap_or(0);
    out.rnr_retry = a.rnr_retry.unwrap_or(0);
    out.min_rnr_timer = a.min_rnr_timer.unwrap_or(0);
    out.max_rd_atomic = a.max_rd_atomic.unwrap_or(0);
    out.max_dest_rd_atomic = a.max_dest_rd_atomic.unwrap_or(0);
    out.qp_access_flags = a.qp_access_flags.map_or(0, |f| f.0);
    out.qkey = a.qkey.unwrap_or(0);
    out.pkey_index = a.pkey_index.unwrap_or(0);
    out.port_num = a.port_num.unwrap_or(0);
    (out, mask)
}

/// A verbs-api address as `struct ibv_ah_attr`: global (RoCE), port 1.
pub fn ibv_ah_attr_of(ah: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: ah.dgid.0 },
            sgid_index: ah.sgid_index,
            hop_limit: ah.hop_limit,
            traffic_class: ah.traffic_class,
            ..Default::default()
        },
        is_global: 1,
        port_num: 1,
        ..Default::default()
    }
}

/// `ibv_modify_qp`.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; `attr` is readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let (q, attr) = unsafe { (softnic_qp(qp), &*attr) };
    let a = match attrs_of(attr, attr_mask) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    if attr_mask & QP_CUR_STATE != 0 && state_of(attr.cur_qp_state) != Some(api.state()) {
        return libc::EINVAL;
    }
    let r = api.modify(&a);
    // SAFETY: the public state mirrors ours; written under the QP's lock.
    unsafe { (*qp).state = state_num(api.state()) };
    let qpn = api.qp_num();
    drop(api);
    match r {
        Ok(()) if a.qp_state == Some(QpState::Reset) => {
            // SAFETY: the QP's CQs outlive it (destroy_cq is EBUSY while it has users).
            unsafe { purge_cqs(qp, qpn) };
            0
        }
        Ok(()) => 0,
        Err(e) => errno::of(&e),
    }
}

/// Removes QP `qpn`'s unpolled completions from its CQs after its move to RESET, as
/// rdma-core's mlx5 provider does in `mlx5_modify_qp` (`mlx5_cq_clean`): a program that
/// resets a QP after an error and uses it again (pyverbs' `restate_qps`) must not poll
/// the flushes of before the reset. A QP on an SRQ keeps its receive completions: their
/// WQEs are the SRQ's (`CompletionQueue::purge_qp`). The CQ's lock is the one
/// `ibv_poll_cq` takes.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`] and its CQs are live.
unsafe fn purge_cqs(qp: *mut ibv_qp, qpn: u32) {
    // SAFETY: caller contract. The CQs the QP holds: an XRC initiator's send CQ only,
    // none for an XRC target (whose completions are its XRC SRQs', kept as an SRQ's).
    let held = unsafe { &softnic_qp(qp).held };
    let (send, recv, srq) = (held.send_cq, held.recv_cq, held.srq);
    let purge = |cq: *mut ibv_cq| {
        if cq.is_null() {
            return;
        }
        // SAFETY: a live CQ of this library (caller contract).
        let c = unsafe { softnic_cq(cq) };
        let mut api = c.api.lock().unwrap_or_else(|e| e.into_inner());
        let _ = api.purge_qp(qpn, !srq.is_null());
    };
    purge(send);
    if recv != send {
        purge(recv);
    }
}

/// `ibv_query_qp`: asks the NIC; fills `attr` and `init_attr` (every field softnic
/// knows, whatever the mask, as providers do).
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; `attr` and `init_attr` are writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if qp.is_null() || attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let q = unsafe { softnic_qp(qp) };
    let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    let (state, c) = match api.query() {
        Ok(x) => x,
        Err(e) => return errno::of(&e),
    };
    let cap = cap_of(&api);
    let mut out = ibv_qp_attr {
        qp_state: state_num(state),
        cur_qp_state: state_num(state),
        path_mtu: c.path_mtu.map_or(0, mtu_num),
        qkey: c.qkey.unwrap_or(0),
        rq_psn: c.rq_psn.unwrap_or(0),
        sq_psn: c.sq_psn.unwrap_or(0),
        dest_qp_num: c.dest_qpn.unwrap_or(0),
        qp_access_flags: c.access.unwrap_or(0),
        cap,
        pkey_index: c.pkey_index.unwrap_or(0),
        max_rd_atomic: c.max_rd_atomic.unwrap_or(0),
        max_dest_rd_atomic: c.max_dest_rd_atomic.unwrap_or(0),
        min_rnr_timer: c.min_rnr_timer.unwrap_or(0),
        port_num: c.port_num.unwrap_or(1),
        timeout: c.timeout.unwrap_or(0),
        retry_cnt: c.retry_cnt.unwrap_or(0),
        rnr_retry: c.rnr_retry.unwrap_or(0),
        ..ibv_qp_attr::default()
    };
    if let Some(remote) = c.remote {
        out.ah_attr.is_global = 1;
        out.ah_attr.port_num = 1;
        out.ah_attr.grh.dgid = ibv_gid {
            raw: Gid::from_ip(remote.ip()).0,
        };
        out.ah_attr.grh.sgid_index = verbs_api::gid::ADDRESS_GID_INDEX as u8;
    }
    // SAFETY: writable (caller contract).
    unsafe {
        attr.write(out);
        (*init_attr).qp_context = (*qp).qp_context;
        (*init_attr).send_cq = (*qp).send_cq;
        (*init_attr).recv_cq = (*qp).recv_cq;
        (*init_attr).srq = (*qp).srq;
        (*init_attr).cap = cap;
        (*init_attr).qp_type = (*qp).qp_type;
        (*init_attr).sq_sig_all = c_int::from(q.sq_sig_all);
        (*qp).state = state_num(state);
    }
    0
}

/// The errno of a refused post: ENOMEM for a full queue (what providers answer),
/// EINVAL for anything malformed.
pub(crate) fn post_errno(e: &verbs_api::Error) -> c_int {
    match e {
        verbs_api::Error::Post {
            reason: verbs_api::PostError::QueueFull { .. },
            ..
        } => libc::ENOMEM,
        verbs_api::Error::Post { .. } | verbs_api::Error::InvalidState { .. } => libc::EINVAL,
        other => errno::of(other),
    }
}

/// The SGE list of a WR as a slice (`ibv_sge` and verbs-api's `Sge` share a layout,
/// checked by the layout test).
///
/// # Safety
/// `sg` is readable for `n` entries when `n > 0`.
unsafe fn sges<'a>(sg: *const Sge, n: c_int) -> Option<&'a [Sge]> {
    match n {
        0 => Some(&[]),
        n if n > 0 && !sg.is_null() => {
            // SAFETY: caller contract.
            Some(unsafe { std::slice::from_raw_parts(sg, n as usize) })
        }
        _ => None,
    }
}

/// Empty inline pieces, one set per WR of a chunk (see [`send_wr`]).
pub(crate) type InlinePieces<'a> = [&'a [u8]; MAX_SGE];

/// The SGEs of an IBV_SEND_INLINE WR as byte slices of the caller's memory, in
/// `store`: like every provider, the payload is read from the raw addresses and the
/// lkeys are ignored (rdma_client sends from an unregistered static buffer).
///
/// # Safety
/// Each SGE's `addr .. addr + length` is readable for the duration of the post (the C
/// program vouches for it, as it does to a provider's memcpy).
unsafe fn inline_pieces<'a>(
    sg: &[Sge],
    store: &'a mut InlinePieces<'a>,
) -> Result<&'a [&'a [u8]], c_int> {
    if sg.len() > MAX_SGE {
        return Err(libc::EINVAL);
    }
    for (piece, sge) in store.iter_mut().zip(sg) {
        *piece = match sge.length {
            0 => &[],
            _ if sge.addr == 0 => return Err(libc::EFAULT),
            // SAFETY: caller contract (a non-null address, `length` readable bytes).
            len => unsafe { std::slice::from_raw_parts(sge.addr as *const u8, len as usize) },
        };
    }
    Ok(&store[..sg.len()])
}

/// One `ibv_send_wr` as a verbs-api WR, or the errno refusing it; an inline WR's
/// payload pieces go to `store`.
///
/// # Safety
/// `w` is a valid `ibv_send_wr` (its SGE array readable; on a UD QP (`qp_type`), its
/// AH from `ibv_create_ah`; with IBV_SEND_INLINE, its SGEs' bytes readable).
unsafe fn send_wr<'a>(
    w: &'a ibv_send_wr,
    qp_type: c_int,
    store: &'a mut InlinePieces<'a>,
) -> Result<SendWr<'a>, c_int> {
    // SAFETY: caller contract.
    let mut sg = unsafe { sges(w.sg_list, w.num_sge) }.ok_or(libc::EINVAL)?;
    let mut inline_data: &[&[u8]] = &[];
    if w.send_flags & IBV_SEND_INLINE != 0 && !sg.is_empty() {
        // SAFETY: caller contract.
        inline_data = unsafe { inline_pieces(sg, store) }?;
        sg = &[];
    }
    // SAFETY: the union member read is the one the opcode selects.
    let opcode = unsafe {
        match w.opcode {
            0 => WrOpcode::RdmaWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            1 => WrOpcode::RdmaWriteWithImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
                imm: u32::from_be(w.imm_data),
            },
            2 => WrOpcode::Send,
            3 => WrOpcode::SendWithImm(u32::from_be(w.imm_data)),
            // `invalidate_rkey` shares the union with `imm_data`, in host order.
            9 => WrOpcode::SendWithInv(w.imm_data),
            4 => WrOpcode::RdmaRead {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            5 => WrOpcode::AtomicCmpAndSwp {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            6 => WrOpcode::AtomicFetchAndAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                add: w.wr.atomic.compare_add,
            },
            // TSO, DRIVER1, ATOMIC_WRITE, FLUSH (LOCAL_INV and BIND_MW: `crate::mw`).
            _ => return Err(libc::EOPNOTSUPP),
        }
    };
    if w.send_flags & !0xf != 0 {
        // IBV_SEND_IP_CSUM and beyond.
        return Err(libc::EOPNOTSUPP);
    }
    let ud = if qp_type == IBV_QPT_UD {
        // SAFETY: UD WRs carry `wr.ud` (the caller's QP is UD).
        let u = unsafe { w.wr.ud };
        if u.ah.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an AH from ibv_create_ah (caller contract).
        let (gid, traffic_class) = unsafe { crate::ah::dest_of(u.ah as *mut ibv_ah) };
        Some(verbs_api::UdAddress {
            gid,
            udp_port: 0,
            qpn: u.remote_qpn,
            qkey: u.remote_qkey,
            traffic_class,
        })
    } else {
        None
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        opcode,
        sg_list: sg,
        send_flags: SendFlags(w.send_flags as u8),
        ud,
        // An XRC initiator's WRs name the remote XRC SRQ; libibverbs reads
        // `qp_type.xrc` on no other QP type.
        xrc_srqn: (qp_type == IBV_QPT_XRC_SEND).then_some(w.qp_type),
        inline_data,
    })
}

/// WRs converted per call to verbs-api: a list is posted in chunks of this many, kept on
/// the stack, so that posting allocates nothing (no `malloc`, which may make a system
/// call in a thread's first use).
pub(crate) const CHUNK: usize = 16;

/// Posts one chunk on a QP or SRQ; on refusal returns the index in the chunk and the
/// errno.
pub(crate) fn post_chunk<A, W>(
    api: &mut A,
    wrs: &[W],
    post: fn(&mut A, &[W]) -> verbs_api::Result<()>,
) -> Result<(), (usize, c_int)> {
    match post(api, wrs) {
        Ok(()) => Ok(()),
        Err(e) => {
            let i = match &e {
                verbs_api::Error::Post { index, .. } => *index,
                _ => 0,
            };
            Err((i, post_errno(&e)))
        }
    }
}

/// The `post_send` op behind the inline `ibv_post_send`: on error, `*bad_wr` is the
/// first WR not posted (those before it are posted) and the errno is returned.
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; `wr` is a valid NULL-terminated WR list.
pub unsafe extern "C" fn post_send(
    qp: *mut c_void,
    wr: *mut c_void,
    bad: *mut *mut c_void,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let q = unsafe { softnic_qp(qp as *mut ibv_qp) };
    let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    let mut cur = wr as *mut ibv_send_wr;
    // SAFETY: a valid WR list (caller contract), alive during this call.
    let first = unsafe { cur.as_ref() };
    if let Some(one) = first.filter(|w| w.next.is_null() && !crate::mw::is_local(w)) {
        // One WR, the common case (a ping-pong posts one per call): converted alone,
        // without the chunk's arrays, which cost more to fill than the WR to convert.
        let mut store: InlinePieces<'_> = [&[]; MAX_SGE];
        // SAFETY: as above.
        let posted = unsafe { send_wr(one, q.qpx.qp_base.qp_type, &mut store) }.and_then(|w| {
            post_chunk(&mut *api, std::slice::from_ref(&w), QueuePair::post_send)
                .map_err(|(_, e)| e)
        });
        return match posted {
            Ok(()) => 0,
            Err(e) => {
                if !bad.is_null() {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *bad = wr };
                }
                e
            }
        };
    }
    let filler = SendWr::new(0, WrOpcode::Send, &[]);
    while !cur.is_null() {
        let mut ptrs = [std::ptr::null_mut::<ibv_send_wr>(); CHUNK];
        let mut pieces: [InlinePieces<'_>; CHUNK] = [[&[]; MAX_SGE]; CHUNK];
        let mut stores = pieces.iter_mut();
        let mut wrs = [filler; CHUNK];
        let mut n = 0;
        let mut refused = None;
        let mut local = false;
        while n < CHUNK && !cur.is_null() {
            let store = stores.next().expect("one store per WR of the chunk");
            // SAFETY: a valid WR list (caller contract), alive during this call.
            if crate::mw::is_local(unsafe { &*cur }) {
                // A bind or invalidation: after the WRs before it are posted.
                local = true;
                break;
            }
            // SAFETY: as above.
            match unsafe { send_wr(&*cur, q.qpx.qp_base.qp_type, store) } {
                Ok(w) => {
                    ptrs[n] = cur;
                    wrs[n] = w;
                    n += 1;
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            // SAFETY: as above.
            cur = unsafe { (*cur).next };
        }
        let mut failed = match post_chunk(&mut *api, &wrs[..n], QueuePair::post_send) {
            Err((i, e)) => Some((ptrs[i.min(n.saturating_sub(1))], e)),
            Ok(()) => refused.map(|e| (cur, e)),
        };
        if failed.is_none() && local {
            // SAFETY: a valid WR list (caller contract); its window and MR are live.
            match unsafe { crate::mw::post_local(&mut api, &*cur) } {
                // SAFETY: as above.
                Ok(()) => cur = unsafe { (*cur).next },
                Err(e) => failed = Some((cur, e)),
            }
        }
        if let Some((w, e)) = failed {
            if !bad.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad = w as *mut c_void };
            }
            return e;
        }
    }
    0
}

/// The `post_recv` op behind the inline `ibv_post_recv` (conventions of
/// [`post_send`]).
///
/// # Safety
/// `qp` came from [`ibv_create_qp`]; `wr` is a valid NULL-terminated WR list.
pub unsafe extern "C" fn post_recv(
    qp: *mut c_void,
    wr: *mut c_void,
    bad: *mut *mut c_void,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let q = unsafe { softnic_qp(qp as *mut ibv_qp) };
    let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: forwarded caller contract.
    unsafe {
        post_recv_list(wr, bad, |wrs| {
            post_chunk(&mut *api, wrs, QueuePair::post_recv)
        })
    }
}

/// Converts a NULL-terminated `ibv_recv_wr` list in chunks of [`CHUNK`] on the stack
/// and hands each to `post` (a QP's or an SRQ's); on error, `*bad` is the first WR not
/// posted and the errno is returned.
///
/// # Safety
/// `wr` is a valid NULL-terminated WR list; `bad` is NULL or writable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut c_void,
    bad: *mut *mut c_void,
    mut post: impl FnMut(&[RecvWr<'_>]) -> Result<(), (usize, c_int)>,
) -> c_int {
    let mut cur = wr as *mut ibv_recv_wr;
    // SAFETY: a valid WR list (caller contract).
    if let Some(one) = unsafe { cur.as_ref() }.filter(|w| w.next.is_null()) {
        // One WR (a ping-pong reposts one per message): no chunk arrays to fill.
        // SAFETY: its SGE array is readable (caller contract).
        let posted = match unsafe { sges(one.sg_list, one.num_sge) } {
            Some(sg) => post(&[RecvWr::new(one.wr_id, sg)]).map_err(|(_, e)| e),
            None => Err(libc::EINVAL),
        };
        return match posted {
            Ok(()) => 0,
            Err(e) => {
                if !bad.is_null() {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *bad = wr };
                }
                e
            }
        };
    }
    let filler = RecvWr::new(0, &[]);
    while !cur.is_null() {
        let mut ptrs = [std::ptr::null_mut::<ibv_recv_wr>(); CHUNK];
        let mut wrs = [filler; CHUNK];
        let mut n = 0;
        let mut refused = None;
        while n < CHUNK && !cur.is_null() {
            // SAFETY: a valid WR list (caller contract).
            let w = unsafe { &*cur };
            // SAFETY: its SGE array is readable (caller contract).
            match unsafe { sges(w.sg_list, w.num_sge) } {
                Some(sg) => {
                    ptrs[n] = cur;
                    wrs[n] = RecvWr::new(w.wr_id, sg);
                    n += 1;
                }
                None => {
                    refused = Some(libc::EINVAL);
                    break;
                }
            }
            cur = w.next;
        }
        let failed = match post(&wrs[..n]) {
            Err((i, e)) => Some((ptrs[i.min(n.saturating_sub(1))], e)),
            Ok(()) => refused.map(|e| (cur, e)),
        };
        if let Some((w, e)) = failed {
            if !bad.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad = w as *mut c_void };
            }
            return e;
        }
    }
    0
}
