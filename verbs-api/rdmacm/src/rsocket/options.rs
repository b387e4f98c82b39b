//! `rsetsockopt`, `rgetsockopt` and `rfcntl`: the options rdma-core's rsockets know,
//! recorded and read back as it does, the buffer and queue sizes they set for the
//! connection to come, and `SO_ERROR`.

use std::ffi::{c_int, c_long, c_void};

use libc::socklen_t;

use super::socket::State;
use super::{
    fail, proto, with_socket, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE, RDMA_RQSIZE, RDMA_SQSIZE,
    SOL_RDMA,
};

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
                    // Rounded as the connection data's 8-bit scale carries it.
                    RDMA_IOMAPSIZE => {
                        s.sizes.iomap_size = proto::scale_to_value(proto::value_to_scale(n()?))
                    }
                    // RoCE needs no path record.
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
                    let _ = s.drive();
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
            (SOL_RDMA, RDMA_IOMAPSIZE) => put(sizes.iomap_size as c_int),
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
