//! `struct sockaddr` ↔ [`SocketAddr`], and `rdma_getaddrinfo` / `rdma_freeaddrinfo`.

use std::ffi::{c_char, c_int};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use softnic_ibverbs::errno;

use crate::abi::*;

/// The address at `sa` (IPv4 or IPv6), or `None` for NULL / another family.
///
/// # Safety
/// `sa` is NULL or points at a `sockaddr` of its family's full size.
pub unsafe fn from_sockaddr(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: caller contract: the family field is readable, and the struct is as
    // large as its family says.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const sockaddr_in);
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// `a` as a `sockaddr_storage` and its length.
pub fn to_storage(a: SocketAddr) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain bytes: all-zero is valid.
    let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let s = unsafe { &mut *(&mut st as *mut sockaddr_storage as *mut sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let s = unsafe { &mut *(&mut st as *mut sockaddr_storage as *mut sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<sockaddr_in6>()
        }
    };
    (st, len as socklen_t)
}

/// The port of a `sockaddr_storage` we filled (network order, as
/// `rdma_get_src_port` returns it), 0 when unset.
pub fn port_be(st: &sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage we wrote with to_storage (or zero).
    unsafe { from_sockaddr(st as *const sockaddr_storage as *const sockaddr) }
        .map_or(0, |a| a.port().to_be())
}

/// The unspecified address of `a`'s family.
pub fn unspecified_like(a: Option<SocketAddr>) -> IpAddr {
    match a {
        Some(SocketAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

/// A `malloc`ed copy of `a` (freed by [`rdma_freeaddrinfo`]).
fn malloc_sockaddr(a: SocketAddr) -> Option<(*mut sockaddr, socklen_t)> {
    let (st, len) = to_storage(a);
    // SAFETY: plain allocation, checked below.
    let p = unsafe { libc::malloc(len as usize) } as *mut sockaddr;
    if p.is_null() {
        return None;
    }
    // SAFETY: p has len bytes; st has at least len.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &st as *const sockaddr_storage as *const u8,
            p as *mut u8,
            len as usize,
        )
    };
    Some((p, len))
}

/// Resolves `node`/`service` with the C library (numeric or by name).
///
/// # Safety
/// `node` and `service` are NULL or C strings.
unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    passive: bool,
    numeric: bool,
    family: c_int,
) -> Result<Vec<SocketAddr>, c_int> {
    // SAFETY: addrinfo is plain data: all-zero is the documented "no hints" value.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags =
        if passive { libc::AI_PASSIVE } else { 0 } | if numeric { libc::AI_NUMERICHOST } else { 0 };
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: valid hints; node/service per caller contract; res is written on success.
    let r = unsafe { libc::getaddrinfo(node, service, &hints, &mut res) };
    if r != 0 {
        // rdma-core passes getaddrinfo's EAI_* code through as the return value.
        return Err(r);
    }
    let mut out = Vec::new();
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list getaddrinfo returned, freed below.
        unsafe {
            if let Some(a) = from_sockaddr((*p).ai_addr) {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
            p = (*p).ai_next;
        }
    }
    // SAFETY: res came from getaddrinfo.
    unsafe { libc::freeaddrinfo(res) };
    Ok(out)
}

/// `rdma_getaddrinfo`: resolves `node`/`service` (names through the C library) into
/// RDMA addresses: with `RAI_PASSIVE` a source address to bind and listen on, otherwise
/// a destination (and the hints' source address, if any). Port space: the hints'
/// (`RDMA_PS_TCP` by default; `RDMA_PS_UDP` gives UD; `RDMA_PS_IB` the hints' QP
/// type, RC by default), as librdmacm does.
/// Returns 0, or an `EAI_*` code / -1 with `errno`, as rdma-core.
///
/// # Safety
/// Pointers as `getaddrinfo(3)`; `res` is writable.
#[export_name = "softnic_rdma_getaddrinfo"]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    // SAFETY: hints is NULL or readable (caller contract).
    let h = unsafe { hints.as_ref() };
    if res.is_null() || (node.is_null() && service.is_null() && h.is_none()) {
        errno::set(libc::EINVAL);
        return -1;
    }
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    let family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let ps = h
        .map(|h| h.ai_port_space)
        .filter(|&p| p != 0)
        .unwrap_or(RDMA_PS_TCP);
    let qp_type = h
        .map(|h| h.ai_qp_type)
        .filter(|&t| t != 0)
        .unwrap_or(if ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        });
    if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB {
        errno::set(libc::ENOSYS);
        return -1;
    }
    // SAFETY: hint addresses are NULL or valid sockaddrs (caller contract).
    let hint_src = h.and_then(|h| unsafe { from_sockaddr(h.ai_src_addr) });
    if node.is_null() && service.is_null() {
        // No name to resolve: one entry made of the hints (rdma-core does the same;
        // pyverbs asks this way for a multicast group's address as a source).
        // SAFETY: hint addresses are NULL or valid sockaddrs (caller contract).
        let hint_dst = h.and_then(|h| unsafe { from_sockaddr(h.ai_dst_addr) });
        let ai = addrinfo_node(flags, family, qp_type, ps, hint_src, hint_dst);
        // SAFETY: res is writable (checked non-NULL).
        unsafe { *res = ai };
        return 0;
    }
    // SAFETY: forwarded caller contract.
    let addrs =
        match unsafe { resolve(node, service, passive, flags & RAI_NUMERICHOST != 0, family) } {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => return libc::EAI_NONAME,
            Err(e) => return e,
        };
    let mut head: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut tail: *mut *mut rdma_addrinfo = &mut head;
    for a in addrs {
        let (src, dst) = if passive {
            (Some(a), None)
        } else {
            (hint_src, Some(a))
        };
        let family = if a.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let ai = addrinfo_node(flags, family, qp_type, ps, src, dst);
        // SAFETY: tail points at `head` or at the previous node's ai_next.
        unsafe {
            *tail = ai;
            tail = &mut (*ai).ai_next;
        }
    }
    // SAFETY: res is writable (checked non-NULL).
    unsafe { *res = head };
    0
}

/// One `rdma_addrinfo` (freed by [`rdma_freeaddrinfo`]) with `malloc`ed copies of
/// `src` and `dst`.
fn addrinfo_node(
    flags: c_int,
    family: c_int,
    qp_type: c_int,
    ps: c_int,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
) -> *mut rdma_addrinfo {
    let (src_addr, src_len) = src
        .and_then(malloc_sockaddr)
        .unwrap_or((std::ptr::null_mut(), 0));
    let (dst_addr, dst_len) = dst
        .and_then(malloc_sockaddr)
        .unwrap_or((std::ptr::null_mut(), 0));
    Box::into_raw(Box::new(rdma_addrinfo {
        ai_flags: flags,
        ai_family: family,
        ai_qp_type: qp_type,
        ai_port_space: ps,
        ai_src_len: src_len,
        ai_dst_len: dst_len,
        ai_src_addr: src_addr,
        ai_dst_addr: dst_addr,
        ai_src_canonname: std::ptr::null_mut(),
        ai_dst_canonname: std::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: std::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: std::ptr::null_mut(),
        ai_next: std::ptr::null_mut(),
    }))
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` is NULL or came from [`rdma_getaddrinfo`].
#[export_name = "softnic_rdma_freeaddrinfo"]
pub unsafe extern "C" fn rdma_freeaddrinfo(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: reverses the Box::into_raw / malloc of rdma_getaddrinfo.
        let ai = unsafe { Box::from_raw(res) };
        // SAFETY: malloc'ed (or NULL).
        unsafe {
            libc::free(ai.ai_src_addr.cast());
            libc::free(ai.ai_dst_addr.cast());
        }
        res = ai.ai_next;
    }
}
