//! The synchronous endpoint calls of `<rdma/rdma_verbs.h>` programs (rdma_server,
//! rdma_client): `rdma_create_ep`, `rdma_get_request`, `rdma_destroy_ep`.
//!
//! An endpoint is an id on a channel of its own, so each call waits for its outcome
//! ([`crate::id`]'s synchronous mode). A passive endpoint keeps the QP attributes it
//! was made with, and `rdma_get_request` creates each new connection's QP with them.

use std::ffi::c_int;

use softnic_ibverbs::abi::{ibv_pd, ibv_qp_init_attr};
use verbs_api::cm::CmEventKind;

use crate::abi::*;
use crate::channel::{self, fail};
use crate::id::{self, id as id_of};
use crate::qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq};

/// `rdma_create_ep`: a synchronous id for `res` — bound to its source address when
/// `RAI_PASSIVE`, else with the destination's address and route resolved — and, with
/// `qp_init_attr`, a QP (passive: kept for `rdma_get_request`).
///
/// # Safety
/// `id` writable; `res` from `rdma_getaddrinfo`; `pd` NULL or live; `qp_init_attr`
/// NULL or valid.
#[export_name = "softnic_rdma_create_ep"]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let r = unsafe { &*res };
    let mut cm: *mut rdma_cm_id = std::ptr::null_mut();
    // SAFETY: NULL channel = a synchronous id with its own channel.
    if unsafe {
        id::create_id(
            std::ptr::null_mut(),
            &mut cm,
            std::ptr::null_mut(),
            r.ai_port_space,
            Some(r.ai_qp_type).filter(|&t| t != 0),
        )
    } != 0
    {
        return -1;
    }
    let ok = if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: a fresh id; the source address from rdma_getaddrinfo.
        unsafe { id::rdma_bind_addr(cm, r.ai_src_addr) == 0 }
    } else {
        // SAFETY: a fresh id; addresses from rdma_getaddrinfo.
        unsafe {
            id::rdma_resolve_addr(cm, r.ai_src_addr, r.ai_dst_addr, 2000) == 0
                && id::rdma_resolve_route(cm, 2000) == 0
        }
    };
    if !qp_init_attr.is_null() {
        // As librdmacm: the QP type comes from the address info (rdma_client leaves
        // its attributes' qp_type 0).
        // SAFETY: writable attributes (caller contract).
        unsafe { (*qp_init_attr).qp_type = r.ai_qp_type };
    }
    let ok = ok
        && (qp_init_attr.is_null()
            || if r.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: a fresh id; the attributes (plain data) are copied.
                unsafe {
                    if let Some(i) = id_of(cm) {
                        i.ep_qp = Some((std::ptr::read(qp_init_attr), pd));
                    }
                }
                true
            } else {
                // SAFETY: a bound id; caller contract for pd and the attributes.
                unsafe { rdma_create_qp(cm, pd, qp_init_attr) == 0 }
            });
    if !ok {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        // SAFETY: the id made above, not handed out.
        unsafe { id::rdma_destroy_id(cm) };
        return fail(e);
    }
    // SAFETY: writable (caller contract).
    unsafe { *id = cm };
    0
}

/// `rdma_destroy_ep`: the id's QP (and the CQs made for it), its SRQ and the id.
///
/// # Safety
/// `id` is live and not used again.
#[export_name = "softnic_rdma_destroy_ep"]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    if id.is_null() {
        return;
    }
    // SAFETY: caller contract.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        id::rdma_destroy_id(id);
    }
}

/// `rdma_get_request`: waits on a listening endpoint for the next connection request
/// and returns its id (with a QP made from the endpoint's QP attributes, if it has
/// some, and the request as its `id->event`). The id is synchronous like its listener; its events come on the listener's
/// channel, so the listener must outlive it.
///
/// # Safety
/// `listen` is a listening endpoint; `id` writable.
#[export_name = "softnic_rdma_get_request"]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    // SAFETY: caller contract.
    let Some(l) = (unsafe { id_of(listen) }) else {
        return fail(libc::EINVAL);
    };
    if id.is_null() || !l.sync {
        return fail(libc::EINVAL);
    }
    // SAFETY: the listener's channel lives as long as it.
    let Some(ch) = (unsafe { channel::channel(l.id.channel) }) else {
        return fail(libc::EINVAL);
    };
    l.ack_event();
    let mut others = Vec::new();
    let got = loop {
        match channel::next_event(ch) {
            Ok(e)
                if e.ev.listen_id == listen
                    && e.ev.event == CmEventKind::ConnectRequest as c_int =>
            {
                break Ok(e)
            }
            Ok(e) => others.push(e),
            Err(e) => break Err(e),
        }
    };
    channel::restash(ch, others);
    let (new, event) = match got {
        Ok(e) => (e.ev.id, e),
        Err(e) => return fail(e),
    };
    // The request stays as the new id's `id->event` (rdma-core's rule), with its
    // private data.
    // SAFETY: the new connection's id, live.
    if let Some(n) = unsafe { id_of(new) } {
        n.keep_event(event);
    }
    if let Some((attr, pd)) = &l.ep_qp {
        // SAFETY: plain data (pointers and integers), copied for the call to fill.
        let mut attr = unsafe { std::ptr::read(attr) };
        // SAFETY: the new connection's id, bound to the listener's NIC.
        if unsafe { rdma_create_qp(new, *pd, &mut attr) } != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            // SAFETY: not handed out; destroying it rejects the request.
            unsafe { id::rdma_destroy_id(new) };
            return fail(e);
        }
    }
    // SAFETY: writable (caller contract).
    unsafe { *id = new };
    0
}
