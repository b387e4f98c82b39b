//! rsockets (`<rdma/rsocket.h>`): stream sockets over RC connections, the calls
//! rdma-core's librdmacm exports (`rsocket`, `rbind`, `rlisten`, `raccept`,
//! `rconnect`, `rsend`/`rrecv` and their variants, `rpoll`, `rselect`, `rshutdown`,
//! `rclose`, `rsetsockopt`/`rgetsockopt`, `rfcntl`, `rgetpeername`/`rgetsockname`),
//! speaking rdma-core's protocol ([`proto`]) so either end may be rdma-core's.
//!
//! Layers: [`proto`] (the bytes), [`stream`] (a connected stream over `verbs_api`),
//! [`socket`] (a socket's states and the socket table), [`poll`] (`rpoll`, `rselect`),
//! and this file: the C entry points, each a thin conversion of pointers and errno.
//!
//! Not served yet, each answering -1 with an errno: datagram rsockets
//! (`SOCK_DGRAM`: EOPNOTSUPP), `riomap`/`riounmap`/`riowrite` (ENOSYS), `AF_IB`.
//! Keepalive is recorded (`SO_KEEPALIVE`, `TCP_KEEPIDLE` read back what was set) but
//! no keepalive messages are sent. A socket is one lock: a call that blocks on it
//! (a blocking `rrecv`) holds it, so another thread's call on the same socket waits
//! for it.

pub mod poll;
pub mod proto;
pub mod socket;
pub mod stream;

use std::ffi::{c_int, c_long, c_void};

use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use softnic_ibverbs::errno;

use crate::addr::{from_sockaddr, to_storage};
use socket::{Socket, SocketRef, State};

/// `SOL_RDMA` (`<rdma/rsocket.h>`).
pub const SOL_RDMA: c_int = 0x10000;
/// `RDMA_SQSIZE`.
pub const RDMA_SQSIZE: c_int = 0;
/// `RDMA_RQSIZE`.
pub const RDMA_RQSIZE: c_int = 1;
/// `RDMA_INLINE`.
pub const RDMA_INLINE: c_int = 2;
/// `RDMA_IOMAPSIZE`.
pub const RDMA_IOMAPSIZE: c_int = 3;
/// `RDMA_ROUTE`.
pub const RDMA_ROUTE: c_int = 4;

fn fail<T: From<i8>>(e: c_int) -> T {
    errno::set(e);
    T::from(-1)
}

fn with_socket<T: From<i8>>(fd: c_int, f: impl FnOnce(&mut Socket) -> Result<T, c_int>) -> T {
    let Some(s) = socket::lookup(fd) else {
        return fail(libc::EBADF);
    };
    let mut s = lock(&s);
    match f(&mut s) {
        Ok(v) => v,
        Err(e) => fail(e),
    }
}

fn lock(s: &SocketRef) -> std::sync::MutexGuard<'_, Socket> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// `rsocket`: AF_INET or AF_INET6, SOCK_STREAM (with `SOCK_NONBLOCK`, `SOCK_CLOEXEC`),
/// protocol 0 or IPPROTO_TCP; datagram rsockets are EOPNOTSUPP, other arguments
/// ENOTSUP as rdma-core answers.
#[export_name = "softnic_rsocket"]
pub extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if base == libc::SOCK_DGRAM && (domain == libc::AF_INET || domain == libc::AF_INET6) {
        return fail(libc::EOPNOTSUPP);
    }
    if (domain != libc::AF_INET && domain != libc::AF_INET6)
        || base != libc::SOCK_STREAM
        || (protocol != 0 && protocol != libc::IPPROTO_TCP)
    {
        return fail(libc::ENOTSUP);
    }
    match Socket::create(ty & libc::SOCK_NONBLOCK != 0, ty & libc::SOCK_CLOEXEC != 0) {
        Ok(n) => n,
        Err(e) => fail(e),
    }
}

/// `rbind`.
///
/// # Safety
/// `addr` points at a sockaddr of `addrlen` bytes.
#[export_name = "softnic_rbind"]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
    // SAFETY: caller contract.
    let a = unsafe { sockaddr_arg(addr, addrlen) };
    with_socket(socket, |s| s.bind(a?).map(|()| 0))
}

/// A sockaddr argument: EINVAL for NULL or short, EAFNOSUPPORT for another family.
///
/// # Safety
/// `addr` is NULL or readable for `len` bytes.
unsafe fn sockaddr_arg(
    addr: *const sockaddr,
    len: socklen_t,
) -> Result<std::net::SocketAddr, c_int> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller contract; the family says how much `from_sockaddr` reads, and an
    // IPv6 one must be as long as a sockaddr_in6.
    let family = c_int::from(unsafe { (*addr).sa_family });
    if family == libc::AF_INET6 && (len as usize) < std::mem::size_of::<libc::sockaddr_in6>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: as above.
    unsafe { from_sockaddr(addr) }.ok_or(libc::EAFNOSUPPORT)
}

/// `rlisten`.
#[export_name = "softnic_rlisten"]
pub extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    with_socket(socket, |s| s.listen(backlog).map(|()| 0))
}

/// Copies `a` into the caller's `addr`/`addrlen` (truncated, with the full length
/// written back, as `getpeername(2)`).
///
/// # Safety
/// `addr` is writable for `*addrlen` bytes; `addrlen` is valid.
unsafe fn put_addr(a: std::net::SocketAddr, addr: *mut sockaddr, addrlen: *mut socklen_t) {
    if addr.is_null() || addrlen.is_null() {
        return;
    }
    let (st, len) = to_storage(a);
    // SAFETY: caller contract.
    unsafe {
        let n = (*addrlen).min(len) as usize;
        std::ptr::copy_nonoverlapping(&st as *const _ as *const u8, addr as *mut u8, n);
        *addrlen = len;
    }
}

/// `raccept`: the next connection (EAGAIN on a non-blocking listener with none);
/// `addr` gets the peer's address.
///
/// # Safety
/// `addr`/`addrlen` as for `accept(2)`.
#[export_name = "softnic_raccept"]
pub unsafe extern "C" fn raccept(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    let n = with_socket(socket, |s| s.accept());
    if n >= 0 {
        if let Some(peer) =
            socket::lookup(n).and_then(|s| lock(&s).id().and_then(|i| i.peer_addr()))
        {
            // SAFETY: caller contract.
            unsafe { put_addr(peer, addr, addrlen) };
        }
    }
    n
}

/// `rconnect`: 0 when connected, or -1 with EINPROGRESS on a non-blocking socket (the
/// outcome comes with `rpoll` POLLOUT and `SO_ERROR`, or the next send or receive).
///
/// # Safety
/// `addr` points at a sockaddr of `addrlen` bytes.
#[export_name = "softnic_rconnect"]
pub unsafe extern "C" fn rconnect(
    socket: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> c_int {
    // SAFETY: caller contract.
    let a = unsafe { sockaddr_arg(addr, addrlen) };
    with_socket(socket, |s| s.connect(a?).map(|()| 0))
}

fn connecting_errno(e: c_int) -> c_int {
    if e == libc::EINPROGRESS {
        libc::EAGAIN
    } else {
        e
    }
}

fn recv_into(socket: c_int, buf: &mut [u8], flags: c_int) -> ssize_t {
    with_socket(socket, |s| {
        let nonblock = s.nonblocking(flags);
        let st = s.stream(nonblock).map_err(connecting_errno)?;
        st.recv(
            buf,
            nonblock,
            flags & libc::MSG_PEEK != 0,
            flags & libc::MSG_WAITALL != 0,
        )
        .map(|n| n as ssize_t)
    })
}

fn send_from(socket: c_int, data: &[u8], flags: c_int) -> ssize_t {
    with_socket(socket, |s| {
        let nonblock = s.nonblocking(flags);
        let st = s.stream(nonblock).map_err(connecting_errno)?;
        st.send(data, nonblock).map(|n| n as ssize_t)
    })
}

/// `rrecv`: bytes received (0 at the end of the stream); `MSG_DONTWAIT`, `MSG_PEEK`,
/// `MSG_WAITALL`.
///
/// # Safety
/// `buf` is writable for `len` bytes.
#[export_name = "softnic_rrecv"]
pub unsafe extern "C" fn rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    if buf.is_null() && len > 0 {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller contract (a zero-length slice may come from any pointer).
    let b = unsafe { slice_mut(buf, len) };
    recv_into(socket, b, flags)
}

/// # Safety
/// `p` is writable for `len` bytes, or `len` is 0.
unsafe fn slice_mut<'a>(p: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) }
}

/// # Safety
/// `p` is readable for `len` bytes, or `len` is 0.
unsafe fn slice<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }
}

/// `rread`: `rrecv` with no flags.
///
/// # Safety
/// As [`rrecv`].
#[export_name = "softnic_rread"]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rrecvfrom`: `rrecv`, and the peer's address in `src_addr`.
///
/// # Safety
/// As [`rrecv`]; `src_addr`/`addrlen` as for `recvfrom(2)`.
#[export_name = "softnic_rrecvfrom"]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src_addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: forwarded.
    let n = unsafe { rrecv(socket, buf, len, flags) };
    if n > 0 {
        // SAFETY: forwarded.
        unsafe { rgetpeername(socket, src_addr, addrlen) };
    }
    n
}

/// Reads into each of `iov` in turn: one receive into a staging buffer, scattered.
///
/// # Safety
/// `iov` holds `iovcnt` valid, writable entries.
unsafe fn recv_iov(socket: c_int, iov: *const iovec, iovcnt: c_int, flags: c_int) -> ssize_t {
    if iovcnt < 0 || (iov.is_null() && iovcnt > 0) {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let iovs = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let total: usize = iovs.iter().map(|v| v.iov_len).sum();
    let mut staging = vec![0u8; total];
    let n = recv_into(socket, &mut staging, flags);
    if n > 0 {
        let mut at = 0usize;
        for v in iovs {
            let k = v.iov_len.min(n as usize - at);
            // SAFETY: caller contract: each entry is writable for its length.
            unsafe { slice_mut(v.iov_base, k) }.copy_from_slice(&staging[at..at + k]);
            at += k;
        }
    }
    n
}

/// `rreadv`.
///
/// # Safety
/// As `readv(2)`.
#[export_name = "softnic_rreadv"]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { recv_iov(socket, iov, iovcnt, 0) }
}

/// `rrecvmsg`: the message's iovecs (no control data, no address).
///
/// # Safety
/// As `recvmsg(2)`.
#[export_name = "softnic_rrecvmsg"]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let m = unsafe { &mut *msg };
    m.msg_controllen = 0;
    m.msg_flags = 0;
    // SAFETY: forwarded.
    unsafe { recv_iov(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
}

/// `rsend`: bytes queued; with `MSG_DONTWAIT` or `O_NONBLOCK` possibly fewer than
/// `len`, or -1/EAGAIN when none fit.
///
/// # Safety
/// `buf` is readable for `len` bytes.
#[export_name = "softnic_rsend"]
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    if buf.is_null() && len > 0 {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller contract.
    send_from(socket, unsafe { slice(buf, len) }, flags)
}

/// `rwrite`.
///
/// # Safety
/// As [`rsend`].
#[export_name = "softnic_rwrite"]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rsendto` on a stream: the address is ignored, as for a connected TCP socket.
///
/// # Safety
/// As [`rsend`].
#[export_name = "softnic_rsendto"]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    _dest_addr: *const sockaddr,
    _addrlen: socklen_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { rsend(socket, buf, len, flags) }
}

/// Gathers `iov` and sends it.
///
/// # Safety
/// `iov` holds `iovcnt` valid, readable entries.
unsafe fn send_iov(socket: c_int, iov: *const iovec, iovcnt: c_int, flags: c_int) -> ssize_t {
    if iovcnt < 0 || (iov.is_null() && iovcnt > 0) {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let iovs = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let mut staging = Vec::with_capacity(iovs.iter().map(|v| v.iov_len).sum());
    for v in iovs {
        // SAFETY: caller contract.
        staging.extend_from_slice(unsafe { slice(v.iov_base, v.iov_len) });
    }
    send_from(socket, &staging, flags)
}

/// `rwritev`.
///
/// # Safety
/// As `writev(2)`.
#[export_name = "softnic_rwritev"]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { send_iov(socket, iov, iovcnt, 0) }
}

/// `rsendmsg`: the message's iovecs (control data and address ignored).
///
/// # Safety
/// As `sendmsg(2)`.
#[export_name = "softnic_rsendmsg"]
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let m = unsafe { &*msg };
    // SAFETY: forwarded.
    unsafe { send_iov(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
}

/// `rshutdown`.
#[export_name = "softnic_rshutdown"]
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    with_socket(socket, |s| s.shutdown(how).map(|()| 0))
}

/// `rclose`: shuts a connected stream down both ways, then frees the socket and its
/// number.
#[export_name = "softnic_rclose"]
pub extern "C" fn rclose(socket: c_int) -> c_int {
    let Some(s) = socket::remove(socket) else {
        return fail(libc::EBADF);
    };
    // Another thread inside a call on it keeps the last reference, and frees it.
    if let Ok(m) = std::sync::Arc::try_unwrap(s) {
        m.into_inner().unwrap_or_else(|e| e.into_inner()).close();
    }
    0
}

/// `rgetpeername`.
///
/// # Safety
/// As `getpeername(2)`.
#[export_name = "softnic_rgetpeername"]
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    with_socket(socket, |s| {
        let a = s.id().and_then(|i| i.peer_addr()).ok_or(libc::ENOTCONN)?;
        // SAFETY: caller contract.
        unsafe { put_addr(a, addr, addrlen) };
        Ok(0)
    })
}

/// `rgetsockname`.
///
/// # Safety
/// As `getsockname(2)`.
#[export_name = "softnic_rgetsockname"]
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    with_socket(socket, |s| {
        let a = s
            .id()
            .and_then(|i| i.local_addr())
            .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        // SAFETY: caller contract.
        unsafe { put_addr(a, addr, addrlen) };
        Ok(0)
    })
}

/// Reads an `int` option value.
///
/// # Safety
/// `optval` is readable for `optlen` bytes.
unsafe fn int_opt(optval: *const c_void, optlen: socklen_t) -> Result<c_int, c_int> {
    if optval.is_null() || (optlen as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller contract; unaligned read.
    Ok(unsafe { (optval as *const c_int).read_unaligned() })
}

fn set_bit(opts: &mut u64, name: c_int, on: bool) {
    let bit = 1u64 << (name as u32 & 63);
    if on {
        *opts |= bit;
    } else {
        *opts &= !bit;
    }
}

/// `rsetsockopt`: rdma-core's set — `SO_REUSEADDR`, `SO_RCVBUF`, `SO_SNDBUF` (doubled,
/// as Linux does; they size the connection to come), `SO_LINGER`, `SO_KEEPALIVE`,
/// `SO_OOBINLINE`, `IP_TOS` (the connection's traffic class), `TCP_NODELAY`,
/// `TCP_MAXSEG`, `TCP_CONGESTION`, `TCP_KEEPCNT`/`TCP_KEEPINTVL`/`TCP_KEEPIDLE`,
/// `IPV6_V6ONLY`, and `SOL_RDMA`'s queue sizes and inline size before connecting.
/// Others: ENOTSUP.
///
/// # Safety
/// `optval` is readable for `optlen` bytes.
#[export_name = "softnic_rsetsockopt"]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: socklen_t,
) -> c_int {
    // SAFETY: caller contract, for every read below.
    let v = || unsafe { int_opt(optval, optlen) };
    with_socket(socket, |s| {
        let unconnected = matches!(s.state, State::Idle { .. } | State::Listening { .. });
        match (level, optname) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
                set_bit(&mut s.so_opts, optname, v()? != 0)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                if unconnected {
                    s.sizes.rbuf_size = (v()? as u32).saturating_mul(2);
                }
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                if unconnected {
                    s.sizes.sbuf_size = (v()? as u32).saturating_mul(2).max(proto::SNDLOWAT << 1);
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if optval.is_null() || (optlen as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: caller contract; checked length.
                let l = unsafe { (optval as *const libc::linger).read_unaligned() };
                // Inverted, as rdma-core keeps it: the default (bit clear) is on.
                set_bit(&mut s.so_opts, optname, l.l_onoff == 0);
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                let tos = v()?;
                s.ip_tos = tos;
                if let Some(id) = s.id_mut() {
                    id.set_tos(tos as u8)
                        .map_err(|e| crate::channel::errno_of(&e))?;
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => set_bit(&mut s.tcp_opts, optname, v()? != 0),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                let t = v()?;
                if t <= 0 {
                    return Err(libc::EINVAL);
                }
                s.keepalive_time = t;
            }
            (
                libc::IPPROTO_TCP,
                libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION,
            ) => {}
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                set_bit(&mut s.ipv6_opts, optname, v()? != 0)
            }
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE | RDMA_ROUTE) => {
                if !unconnected {
                    return Err(libc::EINVAL);
                }
                let n = || v().map(|x| (x as u32).min(proto::QP_MAX_SIZE));
                match optname {
                    RDMA_SQSIZE => s.sizes.sq_size = n()?,
                    RDMA_RQSIZE => s.sizes.rq_size = n()?,
                    RDMA_INLINE => s.sizes.sq_inline = n()?,
                    // softnic grants no iomap (riomap is not served), and RoCE needs
                    // no path record.
                    _ => return Err(libc::ENOTSUP),
                }
            }
            _ => return Err(libc::ENOTSUP),
        }
        Ok(0)
    })
}

/// `rgetsockopt`: what `rsetsockopt` recorded, the buffer and queue sizes,
/// `SO_ERROR` (read once, then cleared; a pending non-blocking connect's outcome is
/// collected first) and `TCP_INFO` (zeros but the state and window, as rdma-core).
///
/// # Safety
/// `optval` is writable for `*optlen` bytes.
#[export_name = "softnic_rgetsockopt"]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut socklen_t,
) -> c_int {
    if optval.is_null() || optlen.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller contract.
    let room = unsafe { *optlen } as usize;
    let put = |x: c_int| -> Result<c_int, c_int> {
        if room < std::mem::size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: caller contract; checked length; unaligned write.
        unsafe {
            (optval as *mut c_int).write_unaligned(x);
            *optlen = std::mem::size_of::<c_int>() as socklen_t;
        }
        Ok(0)
    };
    let bit = |opts: u64| c_int::from(opts & (1u64 << (optname as u32 & 63)) != 0);
    with_socket(socket, |s| {
        let sizes = match &s.state {
            State::Connected { stream, .. } => stream.sizes(),
            _ => s.sizes,
        };
        match (level, optname) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
                put(bit(s.so_opts))
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => put(sizes.rbuf_size as c_int),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => put(sizes.sbuf_size as c_int),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if room < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                let l = libc::linger {
                    l_onoff: 1 - bit(s.so_opts),
                    l_linger: 0,
                };
                // SAFETY: caller contract; checked length.
                unsafe {
                    (optval as *mut libc::linger).write_unaligned(l);
                    *optlen = std::mem::size_of::<libc::linger>() as socklen_t;
                }
                Ok(0)
            }
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                if matches!(s.state, State::Connecting { .. }) {
                    let _ = s.drive(true);
                }
                let e = std::mem::take(&mut s.err);
                put(e)
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => put(s.ip_tos),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => put(bit(s.tcp_opts)),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => put(s.keepalive_time),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_CONGESTION) => {
                put(1)
            }
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => put(2048),
            (libc::IPPROTO_TCP, libc::TCP_INFO) => {
                // As rdma-core: zeros but the state and the send queue as the window
                // (iperf3 prints these through librspreload).
                // SAFETY: tcp_info is plain integers: all-zero is valid.
                let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
                let connected =
                    matches!(&s.state, State::Connected { stream, .. } if stream.connected);
                info.tcpi_state = if connected { 1 } else { 7 }; // TCP_ESTABLISHED, TCP_CLOSE
                info.tcpi_snd_cwnd = sizes.sq_size;
                let n = room.min(std::mem::size_of::<libc::tcp_info>());
                // SAFETY: caller contract: `optval` is writable for `room` ≥ n bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        &info as *const libc::tcp_info as *const u8,
                        optval as *mut u8,
                        n,
                    );
                    *optlen = n as socklen_t;
                }
                Ok(0)
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => put(bit(s.ipv6_opts)),
            (SOL_RDMA, RDMA_SQSIZE) => put(sizes.sq_size as c_int),
            (SOL_RDMA, RDMA_RQSIZE) => put(sizes.rq_size as c_int),
            (SOL_RDMA, RDMA_INLINE) => put(sizes.sq_inline as c_int),
            (SOL_RDMA, RDMA_IOMAPSIZE) => put(0),
            _ => Err(libc::ENOTSUP),
        }
    })
}

/// `rfcntl`: `F_GETFL`/`F_SETFL` (`O_NONBLOCK`), `F_GETFD`/`F_SETFD`; others ENOTSUP.
/// rdma-core's is variadic; the argument is read from where an `int` third argument
/// is passed (the C calling convention passes it there for a variadic call too).
#[export_name = "softnic_rfcntl"]
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int {
    with_socket(socket, |s| match cmd {
        libc::F_GETFL => Ok(s.fs_flags),
        libc::F_SETFL => {
            s.fs_flags = arg as c_int;
            Ok(0)
        }
        libc::F_GETFD => Ok(s.fd_flags),
        libc::F_SETFD => {
            s.fd_flags = arg as c_int;
            Ok(0)
        }
        _ => Err(libc::ENOTSUP),
    })
}

/// `riomap`, `riounmap`, `riowrite`: not served (softnic's rsockets grant no iomap).
#[export_name = "softnic_riomap_unsupported"]
pub extern "C" fn riomap_unsupported() -> isize {
    errno::set(libc::ENOSYS);
    -1
}
