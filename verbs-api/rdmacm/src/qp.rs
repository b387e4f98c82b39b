//! QPs and SRQs on ids: `rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`,
//! `rdma_create_srq(_ex)`, `rdma_destroy_srq`, `rdma_init_qp_attr`.
//!
//! The QP is made by softnic's libibverbs on `id->verbs` and moved to INIT by the CM
//! (`CmId::init_qp`: RC and XRC with local write and remote read/write access; UD with
//! the CM's Q_Key 0x01234567), so receives can be posted before connecting; the NIC
//! moves it to RTR/RTS during connect/accept and to ERR on disconnect.
//!
//! XRC (`RDMA_PS_IB` ids of QP type XRC_SEND / XRC_RECV, as stock `rdma_xclient` /
//! `rdma_xserver -c x` make them): an XRC_SEND QP gets a send CQ only; an XRC_RECV QP
//! is made in the device's XRC domain, one per device that librdmacm opens on first
//! use (`ibv_open_xrcd` with no file), and gets no CQ; the id's XRC SRQ
//! (`rdma_create_srq` on an XRC_RECV id) is made in that domain with a receive CQ of
//! its own, which becomes `id->recv_cq` — where `rdma_get_recv_comp` looks — as
//! rdma-core's librdmacm does.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use softnic_ibverbs::abi::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    ibv_qp_init_attr_ex, ibv_srq_attr, ibv_srq_init_attr, ibv_srq_init_attr_ex,
};
use softnic_ibverbs::abi::{ibv_xrcd, ibv_xrcd_init_attr};
use softnic_ibverbs::{internal, objects, qp as ibv_qp_mod, srq, xrc};
use verbs_api::QpState;

use crate::abi::*;
use crate::channel::{errno_of, fail};
use crate::id::{id as id_of, Id};

/// `IBV_QP_INIT_ATTR_PD`.
const QP_INIT_ATTR_PD: u32 = 1;

/// The PD of an id bound to a device (`id->pd`), which `rdma_create_qp` uses when
/// given none: one per context, kept (rdma-core's librdmacm likewise keeps one per
/// device).
static DEFAULT_PDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// The XRC domain of each device context (`ucma_get_xrcd` in rdma-core): opened with
/// no file (a domain of this process's own) the first time an XRC_RECV QP or an XRC
/// SRQ is made through an id there, and kept.
static XRCDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

fn device_xrcd(ctx: *mut ibv_context) -> *mut ibv_xrcd {
    let mut m = XRCDS.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    if let Some(&x) = m.get(&(ctx as usize)) {
        return x as *mut ibv_xrcd;
    }
    let mut attr = ibv_xrcd_init_attr {
        comp_mask: XRCD_INIT_ATTR_FD | XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: ctx is a live context of ours; attr is valid.
    let x = unsafe { xrc::open_xrcd_op(ctx, &mut attr) };
    if !x.is_null() {
        m.insert(ctx as usize, x as usize);
    }
    x
}

/// `IBV_XRCD_INIT_ATTR_FD`.
const XRCD_INIT_ATTR_FD: u32 = 1 << 0;
/// `IBV_XRCD_INIT_ATTR_OFLAGS`.
const XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;

pub(crate) fn default_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let mut m = DEFAULT_PDS.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    if let Some(&pd) = m.get(&(ctx as usize)) {
        return pd as *mut ibv_pd;
    }
    // SAFETY: ctx is a live context of ours.
    let pd = unsafe { objects::ibv_alloc_pd(ctx) };
    if !pd.is_null() {
        m.insert(ctx as usize, pd as usize);
    }
    pd
}

/// A CQ of `depth` entries with its own completion channel, as librdmacm makes when
/// the program gives none.
///
/// # Safety
/// `ctx` is live.
unsafe fn cq_with_channel(
    ctx: *mut ibv_context,
    depth: u32,
    owner: *mut rdma_cm_id,
) -> Option<(*mut ibv_comp_channel, *mut ibv_cq)> {
    // SAFETY: caller contract.
    let ch = unsafe { objects::ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return None;
    }
    // SAFETY: live context and channel.
    let cq = unsafe { objects::ibv_create_cq(ctx, depth.max(1) as c_int, owner.cast(), ch, 0) };
    if cq.is_null() {
        // SAFETY: made above, unused.
        unsafe { objects::ibv_destroy_comp_channel(ch) };
        return None;
    }
    Some((ch, cq))
}

/// Destroys the CQs and channels `rdma_create_qp` made for `i` (not the receive CQ
/// of an XRC SRQ, which [`rdma_destroy_srq`] destroys after the SRQ).
///
/// # Safety
/// Their QP is gone.
unsafe fn destroy_own_cqs(i: &mut Id) {
    if !i.own_cqs {
        return;
    }
    let srq_cq = i.srq_cq;
    let r = &mut i.id;
    let recv = (!srq_cq).then_some((&mut r.recv_cq, &mut r.recv_cq_channel));
    for (cq, ch) in [Some((&mut r.send_cq, &mut r.send_cq_channel)), recv]
        .into_iter()
        .flatten()
    {
        // SAFETY: made by create_qp_ex below, no QP uses them any more.
        unsafe { destroy_cq_and_channel(cq, ch) };
    }
    i.own_cqs = false;
}

/// `rdma_create_qp`: a QP on `pd` (NULL: a default PD of `id->verbs`) in INIT. With no
/// CQs in `qp_init_attr`, a send and a receive CQ (each on its own completion channel)
/// are made and set in the id, as librdmacm does.
///
/// # Safety
/// `id` is live and bound; `pd` NULL or a PD of `id->verbs`; `qp_init_attr` valid.
#[export_name = "softnic_rdma_create_qp"]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || qp_init_attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let a = unsafe { &mut *qp_init_attr };
    // SAFETY: ibv_qp_init_attr_ex is pointers and integers: all-zero is valid.
    let mut ax: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ax.qp_context = a.qp_context;
    ax.send_cq = a.send_cq;
    ax.recv_cq = a.recv_cq;
    ax.srq = a.srq;
    ax.cap = a.cap;
    ax.qp_type = a.qp_type;
    ax.sq_sig_all = a.sq_sig_all;
    ax.comp_mask = QP_INIT_ATTR_PD;
    ax.pd = pd;
    // SAFETY: forwarded caller contract.
    let r = unsafe { rdma_create_qp_ex(id, &mut ax) };
    a.cap = ax.cap;
    r
}

/// `rdma_create_qp_ex`: as [`rdma_create_qp`], with `ibv_create_qp_ex`'s attributes
/// (the PD from `attr->pd`, or the default PD when the PD bit is clear).
///
/// # Safety
/// As [`rdma_create_qp`].
#[export_name = "softnic_rdma_create_qp_ex"]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(i), Some(ax)) = (unsafe { (id_of(id), attr.as_mut()) }) else {
        return fail(libc::EINVAL);
    };
    let ctx = i.id.verbs;
    if ctx.is_null() || !i.id.qp.is_null() {
        return fail(libc::EINVAL);
    }
    if ax.comp_mask & QP_INIT_ATTR_PD == 0 || ax.pd.is_null() {
        ax.pd = default_pd(ctx);
        ax.comp_mask |= QP_INIT_ATTR_PD;
        if ax.pd.is_null() {
            return -1;
        }
    }
    // SAFETY: pd is live (caller contract or ours).
    if unsafe { (*ax.pd).context } != ctx {
        return fail(libc::EINVAL);
    }
    // rdma-core's rule: the id's SRQ (`rdma_create_srq`) unless the program names one.
    if ax.srq.is_null() {
        ax.srq = i.id.srq.cast();
    }
    // An XRC target lives in an XRC domain (the device's unless the program names
    // one) and uses no CQ; an XRC initiator has no receive queue, so no receive CQ.
    let (want_send_cq, want_recv_cq) = match ax.qp_type {
        IBV_QPT_XRC_RECV => {
            if ax.comp_mask & QP_INIT_ATTR_XRCD == 0 || ax.xrcd.is_null() {
                ax.xrcd = device_xrcd(ctx);
                ax.comp_mask |= QP_INIT_ATTR_XRCD;
                if ax.xrcd.is_null() {
                    return -1;
                }
            }
            (false, false)
        }
        IBV_QPT_XRC_SEND => (true, false),
        _ => (true, true),
    };
    let (send_cq, recv_cq) = (
        want_send_cq && ax.send_cq.is_null(),
        want_recv_cq && ax.recv_cq.is_null(),
    );
    if send_cq || recv_cq {
        i.own_cqs = true;
        if send_cq {
            // SAFETY: live context.
            let Some((ch, cq)) = (unsafe { cq_with_channel(ctx, ax.cap.max_send_wr, id) }) else {
                // SAFETY: nothing uses what was made.
                unsafe { destroy_own_cqs(i) };
                return -1;
            };
            (i.id.send_cq_channel, i.id.send_cq, ax.send_cq) = (ch, cq, cq);
        }
        if recv_cq {
            // SAFETY: live context.
            let Some((ch, cq)) = (unsafe { cq_with_channel(ctx, ax.cap.max_recv_wr, id) }) else {
                // SAFETY: nothing uses what was made.
                unsafe { destroy_own_cqs(i) };
                return -1;
            };
            (i.id.recv_cq_channel, i.id.recv_cq, ax.recv_cq) = (ch, cq, cq);
        }
    }
    // SAFETY: a valid ibv_qp_init_attr_ex with PD and CQs of ctx.
    let qp = unsafe { ibv_qp_mod::create_qp_ex_op(ctx, (ax as *mut ibv_qp_init_attr_ex).cast()) }
        as *mut ibv_qp;
    if qp.is_null() {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: nothing uses them.
        unsafe { destroy_own_cqs(i) };
        return fail(e);
    }
    let init = {
        // SAFETY: the QP just made.
        let mut q = unsafe { internal::queue_pair(qp) }
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let api = i.api.lock().unwrap_or_else(|e| e.into_inner());
        api.init_qp(&mut q)
    };
    if let Err(e) = init {
        // SAFETY: the QP and CQs just made, not handed out.
        unsafe {
            ibv_qp_mod::ibv_destroy_qp(qp);
            destroy_own_cqs(i);
        }
        return fail(errno_of(&e));
    }
    // SAFETY: the QP just made.
    unsafe { internal::refresh_qp(qp) };
    i.id.qp = qp;
    i.id.qp_type = ax.qp_type;
    0
}

/// `IBV_SRQ_INIT_ATTR_TYPE`.
const SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
/// `IBV_SRQ_INIT_ATTR_PD`.
const SRQ_INIT_ATTR_PD: u32 = 1 << 1;
/// `IBV_SRQ_INIT_ATTR_XRCD`.
const SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
/// `IBV_SRQ_INIT_ATTR_CQ`.
const SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
/// `IBV_SRQT_BASIC`.
const SRQT_BASIC: u32 = 0;
/// `IBV_SRQT_XRC`.
const SRQT_XRC: u32 = 1;
/// `IBV_QP_INIT_ATTR_XRCD`.
const QP_INIT_ATTR_XRCD: u32 = 1 << 1;

/// `rdma_create_srq_ex`: an SRQ on the id's device, kept as `id->srq`, which
/// `rdma_create_qp` then gives a QP created without one, as librdmacm does. The PD is
/// the attribute's or, without one, `id->pd`. `IBV_SRQ_INIT_ATTR_TYPE` is required
/// (EINVAL without, as rdma-core). A basic SRQ, or an XRC SRQ: in the attribute's XRC
/// domain or the device's, with the attribute's CQ or else a receive CQ (on its own
/// completion channel) made for it and kept as `id->recv_cq`, as rdma-core does.
/// Tag-matching SRQs are EOPNOTSUPP. An unbound id (no device yet) is EINVAL.
///
/// # Safety
/// `id` is live; `attr` is a valid `ibv_srq_init_attr_ex`.
#[export_name = "softnic_rdma_create_srq_ex"]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(i), Some(a)) = (unsafe { (id_of(id), attr.as_mut()) }) else {
        return fail(libc::EINVAL);
    };
    if a.comp_mask & SRQ_INIT_ATTR_TYPE == 0 || i.id.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    let known = SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD | SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ;
    if !matches!(a.srq_type, SRQT_BASIC | SRQT_XRC) || a.comp_mask & !known != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    if !i.id.srq.is_null() {
        return fail(libc::EINVAL);
    }
    let ctx = i.id.verbs;
    if a.comp_mask & SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = i.id.pd;
        a.comp_mask |= SRQ_INIT_ATTR_PD;
    }
    let mut made_cq = false;
    if a.srq_type == SRQT_XRC {
        if a.comp_mask & SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            a.xrcd = device_xrcd(ctx);
            if a.xrcd.is_null() {
                return -1;
            }
        }
        if a.comp_mask & SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
            if i.id.recv_cq.is_null() {
                // SAFETY: live context.
                let Some((ch, cq)) = (unsafe { cq_with_channel(ctx, a.attr.max_wr, id) }) else {
                    return -1;
                };
                (i.id.recv_cq_channel, i.id.recv_cq) = (ch, cq);
                made_cq = true;
            }
            a.cq = i.id.recv_cq;
        }
        a.comp_mask |= SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ;
    }
    // SAFETY: the PD, XRC domain and CQ are the program's or the id's, live objects of
    // the id's context.
    let srq = unsafe { xrc::create_srq_ex_op(ctx, a) };
    if srq.is_null() {
        if made_cq {
            // SAFETY: made above, used by nothing.
            unsafe { destroy_srq_cq(i) };
        }
        return -1;
    }
    i.id.srq = srq.cast();
    i.srq_cq = made_cq;
    0
}

/// Destroys the receive CQ and channel [`rdma_create_srq_ex`] made for an XRC SRQ.
///
/// # Safety
/// No SRQ or QP uses them any more.
unsafe fn destroy_srq_cq(i: &mut Id) {
    let r = &mut i.id;
    // SAFETY: made by rdma_create_srq_ex, unused (caller contract).
    unsafe { destroy_cq_and_channel(&mut r.recv_cq, &mut r.recv_cq_channel) };
    i.srq_cq = false;
}

/// Destroys `cq` then `ch` (each if non-null) and nulls both, so the `rdma_cm_id`
/// never points at a destroyed object.
///
/// # Safety
/// Both are ours or null, and nothing uses them any more.
unsafe fn destroy_cq_and_channel(cq: &mut *mut ibv_cq, ch: &mut *mut ibv_comp_channel) {
    // SAFETY: caller contract.
    unsafe {
        if !cq.is_null() {
            objects::ibv_destroy_cq(*cq);
        }
        if !ch.is_null() {
            objects::ibv_destroy_comp_channel(*ch);
        }
    }
    *cq = std::ptr::null_mut();
    *ch = std::ptr::null_mut();
}

/// `rdma_create_srq`: [`rdma_create_srq_ex`] on `pd` (NULL: `id->pd`) — an XRC SRQ for
/// an XRC_RECV id, else a basic one — the granted sizes written back into `attr`.
///
/// # Safety
/// `id` is live; `pd` NULL or live; `attr` is a valid `ibv_srq_init_attr`.
#[export_name = "softnic_rdma_create_srq"]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: caller contract.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: forwarded caller contract.
    let xrc_target = unsafe { id_of(id) }.is_some_and(|i| i.id.qp_type == IBV_QPT_XRC_RECV);
    let mut ex = ibv_srq_init_attr_ex {
        srq_context: a.srq_context,
        attr: ibv_srq_attr { ..a.attr },
        comp_mask: SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD,
        // An XRC target's id gets an XRC SRQ (rdma-core's rule).
        srq_type: if xrc_target { SRQT_XRC } else { SRQT_BASIC },
        pd,
        xrcd: std::ptr::null_mut(),
        cq: std::ptr::null_mut(),
        tm_cap: [0; 2],
    };
    // SAFETY: forwarded caller contract; `ex` is a valid attribute.
    let r = unsafe { rdma_create_srq_ex(id, &mut ex) };
    a.attr = ibv_srq_attr { ..ex.attr };
    r
}

/// `rdma_destroy_srq`: destroys `id->srq` (the program has destroyed the QPs using
/// it) and clears it, then the receive CQ made for it, if any (an XRC SRQ's).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_destroy_srq"]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    if let Some(i) = unsafe { id_of(id) } {
        if !i.id.srq.is_null() {
            // SAFETY: the SRQ rdma_create_srq made, live until now.
            unsafe { srq::ibv_destroy_srq(i.id.srq.cast()) };
            i.id.srq = std::ptr::null_mut();
        }
        if i.srq_cq {
            // SAFETY: its SRQ is gone.
            unsafe { destroy_srq_cq(i) };
        }
    }
}

/// `rdma_destroy_qp`: the QP, and the CQs `rdma_create_qp` made for it.
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_destroy_qp"]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { id_of(id) }) else {
        return;
    };
    if !i.id.qp.is_null() {
        // SAFETY: the id's QP; the program stops using it (librdmacm's rule).
        unsafe { ibv_qp_mod::ibv_destroy_qp(i.id.qp) };
        i.id.qp = std::ptr::null_mut();
    }
    // SAFETY: their QP is gone.
    unsafe { destroy_own_cqs(i) };
}

/// `rdma_init_qp_attr`: the attributes and mask for moving a QP of this connection to
/// `qp_attr->qp_state`, as `verbs_api::cm::CmId::init_qp_attr` gives them: INIT for a
/// bound id; RTR and RTS once the peer's REQ (passive) or REP (active) is known —
/// exactly what the NIC applies to an `rdma_create_qp` QP. Other states, and RTR/RTS
/// with no connection yet, are EINVAL.
///
/// # Safety
/// `id` is live; `qp_attr` readable and writable; `qp_attr_mask` writable.
#[export_name = "softnic_rdma_init_qp_attr"]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { id_of(id) }) else {
        return fail(libc::EINVAL);
    };
    if qp_attr.is_null() || qp_attr_mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let want = unsafe { (*qp_attr).qp_state };
    let state = match want {
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => return fail(libc::EINVAL),
    };
    let r = i
        .api
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .init_qp_attr(state);
    match r {
        Ok(a) => {
            let (attr, mask) = ibv_qp_mod::ibv_attr_of(&a);
            // SAFETY: writable (caller contract).
            unsafe {
                *qp_attr = attr;
                *qp_attr_mask = mask;
            }
            0
        }
        Err(e) => fail(errno_of(&e)),
    }
}
