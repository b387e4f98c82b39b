//! Multicast on UD ids: `rdma_join_multicast`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`, done the way rdma-core's librdmacm does them over the
//! kernel CM (`librdmacm/cma.c`):
//!
//! * a join records the group on the id and the CM raises MULTICAST_JOIN
//!   ([`verbs_api::cm::CmId::join_multicast`]: the group's address vector, QPN
//!   0xFFFFFF, Q_Key `RDMA_UDP_QKEY`);
//! * when the program *takes* that event, the id's QP (if it has one by then, and the
//!   join was not send-only) is attached to the group with `ibv_attach_mcast`
//!   (librdmacm's `ucma_process_join`); if that fails the event becomes
//!   MULTICAST_ERROR with status -1. The event's `param.ud.private_data` is the
//!   context the program gave the join, its length 0;
//! * a leave finds the group by address (EADDRNOTAVAIL if it was never joined) and
//!   detaches the id's QP, ignoring the outcome, as librdmacm does.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::MutexGuard;

use verbs_api::cm::CmEventKind;
use verbs_api::Gid;

use crate::abi::*;
use crate::addr::from_sockaddr;
use crate::channel::fail;
use crate::id::{self, Id};

/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`: send and receive.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`: send only (the QP is not attached).
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_CM_JOIN_MC_ATTR_RESERVED`: the first comp_mask bit librdmacm does not know.
const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 4;

/// A group an id joined.
#[derive(Debug, Clone, Copy)]
pub struct Joined {
    /// The address the program joined (compared whole by a leave).
    pub addr: SocketAddr,
    /// Its MGID (`::ffff:a.b.c.d`).
    pub mgid: Gid,
    /// The program's context for the join (`param.ud.private_data` of its events).
    pub context: usize,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub flags: u32,
}

/// The joins of `i`, locked.
fn joins(i: &Id) -> MutexGuard<'_, Vec<Joined>> {
    i.joined.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records the join and asks the CM for its event; waits for it on a synchronous id.
/// Recorded first: another thread may take the event as soon as it is raised.
fn join(i: &mut Id, addr: SocketAddr, flags: u32, context: *mut c_void) -> c_int {
    joins(i).push(Joined {
        addr,
        mgid: Gid::from_ip(addr.ip()),
        context: context as usize,
        flags,
    });
    let r = i.with_api(|api| api.join_multicast(addr));
    if r != 0 {
        let mut j = joins(i);
        if let Some(k) = j.iter().rposition(|j| j.addr == addr) {
            j.remove(k);
        }
        return r;
    }
    id::finish(i, 0, CmEventKind::MulticastJoin)
}

/// `rdma_join_multicast`: joins `addr` as a full member (send and receive).
///
/// # Safety
/// `id` is live; `addr` is a sockaddr.
#[export_name = "softnic_rdma_join_multicast"]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(i), Some(a)) = (unsafe { id::id(id) }, unsafe { from_sockaddr(addr) }) else {
        return fail(libc::EINVAL);
    };
    join(i, a, RDMA_MC_JOIN_FLAG_FULLMEMBER, context)
}

/// `rdma_join_multicast_ex`: as [`rdma_join_multicast`] with the join flags of
/// `mc_join_attr` (ENOTSUP for comp_mask bits librdmacm does not know, EINVAL without
/// an address or flags, or for unknown flags).
///
/// # Safety
/// `id` is live; `attr` points at a `struct rdma_cm_join_mc_attr_ex`.
#[export_name = "softnic_rdma_join_multicast_ex"]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { id::id(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract: a readable attribute struct.
    let at = unsafe { &*attr };
    if at.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
        return fail(libc::ENOTSUP);
    }
    let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if at.comp_mask & need != need || at.join_flags > RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract: `addr` is a sockaddr of its family's size.
    let Some(a) = (unsafe { from_sockaddr(at.addr) }) else {
        return fail(libc::EINVAL);
    };
    join(i, a, at.join_flags, context)
}

/// `rdma_leave_multicast`: forgets the group joined at `addr` and detaches the id's
/// QP from it. EADDRNOTAVAIL when the id never joined `addr`.
///
/// # Safety
/// `id` is live; `addr` is a sockaddr.
#[export_name = "softnic_rdma_leave_multicast"]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: caller contract.
    let (Some(i), Some(a)) = (unsafe { id::id(id) }, unsafe { from_sockaddr(addr) }) else {
        return fail(libc::EINVAL);
    };
    let j = {
        let mut joined = joins(i);
        let Some(k) = joined.iter().position(|j| j.addr == a) else {
            return fail(libc::EADDRNOTAVAIL);
        };
        joined.remove(k)
    };
    if !i.id.qp.is_null() && j.flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        let gid = softnic_ibverbs::abi::ibv_gid { raw: j.mgid.0 };
        // SAFETY: the id's live QP; a 16-byte GID.
        let _ = unsafe { softnic_ibverbs::qp::ibv_detach_mcast(i.id.qp, &gid, 0) };
    }
    0
}

/// librdmacm's `ucma_process_join` for a MULTICAST_JOIN event of `id` about `mgid`
/// being handed to the program: the join's context (for `param.ud.private_data`),
/// and the event's kind and status after attaching the id's QP. `None` when the id
/// left the group before taking the event (it is dropped, as the kernel cancels it).
///
/// # Safety
/// `id` is a live id of the registry.
pub(crate) unsafe fn process_join(id: *mut Id, mgid: Gid) -> Option<(usize, CmEventKind, i32)> {
    // SAFETY: caller contract.
    let i = unsafe { &*id };
    let j = *joins(i).iter().find(|j| j.mgid == mgid)?;
    if i.id.qp.is_null() || j.flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return Some((j.context, CmEventKind::MulticastJoin, 0));
    }
    let gid = softnic_ibverbs::abi::ibv_gid { raw: mgid.0 };
    // SAFETY: the id's live QP; a 16-byte GID.
    let r = unsafe { softnic_ibverbs::qp::ibv_attach_mcast(i.id.qp, &gid, 0) };
    Some(if r == 0 {
        (j.context, CmEventKind::MulticastJoin, 0)
    } else {
        softnic_ibverbs::errno::set(r);
        (j.context, CmEventKind::MulticastError, -1)
    })
}
