//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`) for UD sends.
//!
//! On RoCE an address is a GID: the handle keeps the destination GID of a global
//! (`is_global`) address; a LID-only address cannot be routed (EINVAL), and the source
//! GID must be the NIC's address, index 1 (EINVAL otherwise), as for connected QPs.
//! The peer NIC is reached at the RoCEv2 port 4791.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use verbs_api::Gid;

use crate::abi::*;
use crate::errno;
use crate::objects::softnic_pd;

/// An AH: `ibv_ah`, then the destination.
#[repr(C)]
pub struct SoftnicAh {
    /// Public part.
    pub ah: ibv_ah,
    /// Destination GID.
    pub dgid: Gid,
    /// `grh.traffic_class`: the datagrams' IP TOS / IPv6 traffic class.
    pub traffic_class: u8,
}

/// The destination GID and traffic class of an AH this library created.
///
/// # Safety
/// `ah` came from [`ibv_create_ah`] and is live.
pub(crate) unsafe fn dest_of(ah: *mut ibv_ah) -> (Gid, u8) {
    // SAFETY: `ah` is the first field of a boxed SoftnicAh.
    let a = unsafe { &*(ah as *const SoftnicAh) };
    (a.dgid, a.traffic_class)
}

/// `ibv_create_ah`.
///
/// # Safety
/// `pd` came from `ibv_alloc_pd`; `attr` is readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let a = unsafe { &*attr };
    if a.is_global == 0
        || u32::from(a.grh.sgid_index) != verbs_api::gid::ADDRESS_GID_INDEX
        || a.port_num > 1
    {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let p = unsafe { softnic_pd(pd) };
    p.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::new(SoftnicAh {
        ah: ibv_ah {
            // SAFETY: pd is live.
            context: unsafe { (*pd).context },
            pd,
            handle: 0,
        },
        dgid: Gid(a.grh.dgid.raw),
        traffic_class: a.grh.traffic_class,
    });
    Box::into_raw(b) as *mut ibv_ah
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` came from [`ibv_create_ah`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: reverses ibv_create_ah's Box::into_raw (caller contract: once).
    let b = unsafe { Box::from_raw(ah as *mut SoftnicAh) };
    // SAFETY: the PD outlives its AHs (dealloc is EBUSY meanwhile).
    unsafe { softnic_pd(b.ah.pd) }
        .users
        .fetch_sub(1, Ordering::AcqRel);
    0
}

/// Size of the GRH at the start of a UD receive buffer.
const GRH_LEN: usize = 40;

/// `ibv_init_ah_from_wc`: the address that answers the sender of a UD receive
/// completion, from the 40 bytes before the payload (`grh`). On RoCEv2 every UD
/// datagram came over IP, so the address is always global: softnic (like rxe) writes
/// the received IP header there — for IPv4 bytes 20..40 hold an IPv4 header (version 4
/// in byte 20), for IPv6 the 40 bytes are an IPv6 header. As libibverbs reads them: the
/// destination is the packet's source address, the hop limit its TTL / hop limit, the
/// traffic class its TOS / traffic class (and over IPv6 the flow label); the source GID
/// index is 1 (the NIC's address, the only one that can send). A datagram that was sent
/// to a multicast group has no unicast address to answer from: EINVAL, as libibverbs
/// (which looks the group up among the port's GIDs and finds none). softnic sets
/// `IBV_WC_GRH` on every UD receive, but unlike libibverbs (which then answers a
/// non-global address) the flag is not required: the GRH is always parsed. Returns 0,
/// or -1 with `errno` (EINVAL for a NULL argument, a multicast destination or a header
/// that is neither IPv4 nor IPv6).
///
/// # Safety
/// `wc` and `grh` are readable (`grh` for 40 bytes); `ah_attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    if context.is_null() || wc.is_null() || grh.is_null() || ah_attr.is_null() {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: 40 readable bytes (caller contract).
    let g = unsafe { std::slice::from_raw_parts(grh as *const u8, GRH_LEN) };
    let mut a = ibv_ah_attr {
        port_num,
        is_global: 1,
        ..ibv_ah_attr::default()
    };
    a.grh.sgid_index = verbs_api::gid::ADDRESS_GID_INDEX as u8;
    if g[20] >> 4 == 4 {
        let h = &g[20..40];
        if std::net::Ipv4Addr::new(h[16], h[17], h[18], h[19]).is_multicast() {
            errno::set(libc::EINVAL);
            return -1;
        }
        let src = std::net::Ipv4Addr::new(h[12], h[13], h[14], h[15]);
        a.grh.dgid.raw = src.to_ipv6_mapped().octets();
        a.grh.traffic_class = h[1];
        a.grh.hop_limit = h[8];
    } else if g[0] >> 4 == 6 {
        if g[24] == 0xff {
            errno::set(libc::EINVAL);
            return -1;
        }
        let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        a.grh.traffic_class = (flow >> 20) as u8;
        a.grh.flow_label = flow & 0xf_ffff;
        a.grh.hop_limit = g[7];
        a.grh.dgid.raw.copy_from_slice(&g[8..24]);
    } else {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: writable (caller contract).
    unsafe { ah_attr.write(a) };
    0
}

/// `ibv_create_ah_from_wc`: [`ibv_init_ah_from_wc`], then [`ibv_create_ah`].
///
/// # Safety
/// As [`ibv_init_ah_from_wc`]; `pd` came from `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port_num: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return errno::null(libc::EINVAL);
    }
    let mut a = ibv_ah_attr::default();
    // SAFETY: forwarded caller contract; pd is live.
    if unsafe { ibv_init_ah_from_wc((*pd).context, port_num, wc, grh, &mut a) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    unsafe { ibv_create_ah(pd, &mut a) }
}
