//! rsockets (`<rdma/rsocket.h>`): stream sockets over RC connections, the calls
//! rdma-core's librdmacm exports (`rsocket`, `rbind`, `rlisten`, `raccept`,
//! `rconnect`, `rsend`/`rrecv` and their variants, `rpoll`, `rselect`, `rshutdown`,
//! `rclose`, `rsetsockopt`/`rgetsockopt`, `rfcntl`, `rgetpeername`/`rgetsockname`,
//! and `riomap`/`riounmap`/`riowrite`: direct RDMA WRITEs into a peer's mapped memory),
//! speaking rdma-core's protocol ([`proto`]) so either end may be rdma-core's.
//!
//! Layers: [`proto`] (the bytes), [`endpoint`] (a connection's verbs objects),
//! [`stream`] (a connected stream over them),
//! [`socket`] (a socket's states and the socket table), [`poll`] (`rpoll`, `rselect`),
//! [`options`] (`rsetsockopt`, `rgetsockopt`, `rfcntl`), and this file: the other C
//! entry points, each a thin conversion of pointers and errno, and the loop that lets
//! a blocking call sleep without holding its socket.
//!
//! Not served yet, each answering -1 with an errno: datagram rsockets
//! (`SOCK_DGRAM`: EOPNOTSUPP), `AF_IB`.
//! Keepalive is recorded (`SO_KEEPALIVE`, `TCP_KEEPIDLE` read back what was set) but
//! no keepalive messages are sent. A socket is one lock, held for each attempt of a
//! call, never while it sleeps ([`blocking`]): a writer beside a blocked reader goes on.

pub mod endpoint;
pub mod options;
pub mod poll;
pub mod proto;
pub mod socket;
pub mod stream;

use std::ffi::{c_int, c_void};

use libc::{iovec, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t};
use softnic_ibverbs::errno;
use softnic_ibverbs::mr::ProgramMr;

use crate::addr::{from_sockaddr, to_storage};
use socket::{Socket, SocketRef};

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
    let n = blocking(socket, 0, libc::POLLIN, |s| match s.accept() {
        Err(libc::EAGAIN) => Step::Again,
        r => Step::Done(r),
    });
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
    let sent: c_int = with_socket(socket, |s| match s.connect(a?) {
        Err(libc::EINPROGRESS) if !s.nonblocking(0) => Ok(0),
        r => r.map(|()| 0),
    });
    if sent != 0 {
        return sent;
    }
    blocking(socket, 0, libc::POLLOUT, |s| match s.drive() {
        Err(libc::EAGAIN) => Step::Again,
        r => Step::Done(r.map(|()| 0)),
    })
}

/// What one attempt of a call that may block came to.
enum Step<T> {
    /// Finished (value or errno).
    Done(Result<T, c_int>),
    /// Would block: wait for the socket's next event and try again.
    Again,
}

/// Runs `attempt` — which never blocks — under the socket's lock until it is done. When
/// it would block, a non-blocking call (`O_NONBLOCK`, or `MSG_DONTWAIT` in `flags`)
/// answers EAGAIN; a blocking one polls a moment, then sleeps on the socket's next
/// event ([`Socket::poll_state`] for `events`: the armed CQ, or the CM channel)
/// *without* the lock, so that another thread's call on the same socket (a writer
/// beside a blocked reader) goes on meanwhile, and tries again. Each sleep is bounded
/// (100 ms), because another thread may take the wake-up this one waits for.
fn blocking<T: From<i8>>(
    fd: c_int,
    flags: c_int,
    events: i16,
    mut attempt: impl FnMut(&mut Socket) -> Step<T>,
) -> T {
    let Some(sref) = socket::lookup(fd) else {
        return fail(libc::EBADF);
    };
    let start = std::time::Instant::now();
    // Bounded per pass (a short spin, or one bounded sleep); the call ends when the
    // attempt is done, as a blocking socket call does.
    loop {
        let wait = {
            let mut s = lock(&sref);
            match attempt(&mut s) {
                Step::Done(Ok(v)) => return v,
                Step::Done(Err(e)) => return fail(e),
                Step::Again if s.nonblocking(flags) => return fail(libc::EAGAIN),
                Step::Again => {}
            }
            if start.elapsed() < stream::POLLING_TIME {
                continue;
            }
            match s.poll_state(events) {
                (0, Some(w)) => w,
                _ => continue,
            }
        };
        let mut p = libc::pollfd {
            fd: wait,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd of our own.
        if unsafe { libc::poll(&mut p, 1, 100) } == 1 {
            lock(&sref).woke();
        }
    }
}

/// The loop of the calls that move bytes: `one` moves what it can, from byte `done` of
/// the caller's buffer on, without waiting; `finished(n, done)` says whether the call is
/// over after a pass that moved `n` (a non-blocking call is over after any pass that
/// moved bytes). An error after some bytes moved returns the count, as `send(2)` does.
fn stream_io(
    socket: c_int,
    flags: c_int,
    events: i16,
    mut one: impl FnMut(&mut stream::Stream, usize) -> Result<usize, c_int>,
    finished: impl Fn(usize, usize) -> bool,
) -> ssize_t {
    let mut done = 0usize;
    blocking(socket, flags, events, |s| {
        let nonblock = s.nonblocking(flags);
        let st = match s.stream() {
            Ok(st) => st,
            Err(libc::EAGAIN) => return Step::Again,
            Err(e) => return Step::Done(Err(e)),
        };
        match one(st, done) {
            Ok(n) => {
                done += n;
                if nonblock || finished(n, done) {
                    Step::Done(Ok(done as ssize_t))
                } else {
                    Step::Again
                }
            }
            Err(libc::EWOULDBLOCK) if done == 0 || !nonblock => Step::Again,
            Err(_) if done > 0 => Step::Done(Ok(done as ssize_t)),
            Err(e) => Step::Done(Err(e)),
        }
    })
}

fn recv_into(socket: c_int, buf: &mut [u8], flags: c_int) -> ssize_t {
    let (peek, waitall) = (flags & libc::MSG_PEEK != 0, flags & libc::MSG_WAITALL != 0);
    let len = buf.len();
    stream_io(
        socket,
        flags,
        libc::POLLIN,
        |st, done| st.recv(&mut buf[done..], peek),
        |n, done| n == 0 || !waitall || peek || done == len,
    )
}

fn send_from(socket: c_int, data: &[u8], flags: c_int) -> ssize_t {
    stream_io(
        socket,
        flags,
        libc::POLLOUT,
        |st, done| st.send(&data[done..]),
        |_, done| done == data.len(),
    )
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

/// A caller's iovec array: EINVAL for a negative count or a NULL array with entries.
///
/// # Safety
/// `iov` holds `iovcnt` valid entries (when not NULL).
unsafe fn iov_slice<'a>(iov: *const iovec, iovcnt: c_int) -> Result<&'a [iovec], c_int> {
    if iovcnt < 0 || (iov.is_null() && iovcnt > 0) {
        return Err(libc::EINVAL);
    }
    if iovcnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: caller contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) })
}

/// Reads into each of `iov` in turn: one receive into a staging buffer, scattered.
///
/// # Safety
/// `iov` holds `iovcnt` valid, writable entries.
unsafe fn recv_iov(socket: c_int, iov: *const iovec, iovcnt: c_int, flags: c_int) -> ssize_t {
    // SAFETY: caller contract.
    let iovs = match unsafe { iov_slice(iov, iovcnt) } {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
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
    // SAFETY: caller contract.
    let iovs = match unsafe { iov_slice(iov, iovcnt) } {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
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

/// `riomap`: registers the program's `[buf, buf + len)` on a connected stream as the
/// window answering to `offset` (-1: the buffer's address) and returns that offset.
/// With `PROT_WRITE` the window is sent to the peer (before this side's next data),
/// whose `riowrite`s then land in it directly; that takes a free entry of the peer's
/// iomap array (`RDMA_IOMAPSIZE` on the peer's socket), ENOMEM when none is left.
/// EINVAL for other `prot` bits, a writable window of 4 GiB or more, or a socket that
/// is not connected.
///
/// # Safety
/// `buf` is the program's memory for `len` bytes (as for `ibv_reg_mr`), and stays so
/// until `riounmap` or `rclose`.
#[export_name = "softnic_riomap"]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    _flags: c_int,
    offset: off_t,
) -> off_t {
    let writable = prot & libc::PROT_WRITE != 0;
    // An iomap entry's length is 32 bits.
    if prot & !libc::PROT_WRITE != 0 || (writable && len > u32::MAX as usize) {
        return fail(libc::EINVAL);
    }
    with_socket(socket, |s| {
        let st = s.stream().map_err(|_| libc::EINVAL)?;
        let access = stream::Stream::map_access(writable);
        // SAFETY: caller contract.
        let mr = unsafe { ProgramMr::register(st.pd(), buf, len, access) }?;
        let at = if offset == -1 {
            buf as u64
        } else {
            offset as u64
        };
        st.map(mr, at, writable)?;
        Ok(at as off_t)
    })
}

/// `riounmap`: deregisters the window `riomap` made of exactly `[buf, buf + len)`
/// (EINVAL when there is none). As with rdma-core the peer is not told: its later
/// `riowrite`s there fail at this NIC's key check.
#[export_name = "softnic_riounmap"]
pub extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int {
    with_socket(socket, |s| {
        let st = s.stream().map_err(|_| libc::EINVAL)?;
        st.unmap(buf as usize, len).map(|()| 0)
    })
}

/// `riowrite`: writes `buf` into the peer's mapped windows from `offset` on (RDMA
/// WRITEs straight into the peer program's memory, through this side's send ring as
/// rdma-core does); bytes queued, or -1 (EINVAL when `offset` is in no window the
/// peer mapped, EAGAIN as `rsend`). Returns `size_t`, as rdma-core declares it.
///
/// # Safety
/// `buf` is readable for `count` bytes.
#[export_name = "softnic_riowrite"]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> size_t {
    if buf.is_null() && count > 0 {
        return fail::<ssize_t>(libc::EFAULT) as size_t;
    }
    // SAFETY: caller contract.
    let data = unsafe { slice(buf, count) };
    let at = offset as u64;
    stream_io(
        socket,
        flags,
        libc::POLLOUT,
        |st, done| st.iowrite(&data[done..], at.wrapping_add(done as u64)),
        |_, done| done == data.len(),
    ) as size_t
}
