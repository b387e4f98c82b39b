//! The NIC's packet I/O: RoCEv2 datagrams over one UDP socket.
//!
//! [`PacketIo`] is the seam: the runtime only asks for a batch of received datagrams and
//! hands over datagrams to send, so a UDP GSO/GRO path or an AF_PACKET path can replace
//! [`UdpIo`] without reshaping the runtime.
//!
//! # The IPv4 Identification policy (why the socket is set up this way)
//! The ICRC covers the IPv4 Identification, so a sender must know the ID its packet will
//! carry. [`UdpIo`] is an **unconnected** socket with **DF set**
//! (`IP_MTU_DISCOVER = IP_PMTUDISC_DO`): for exactly that combination Linux
//! (`ip_select_ident_segs`) uses ID 0 on every packet, so [`UdpIo::IPV4_ID`] is 0 and the
//! NIC computes every ICRC with ID 0. (A connected socket would use a per-socket counter,
//! a socket without DF a hashed ID.) With DF set the kernel never fragments: a datagram
//! larger than the path MTU fails with `EMSGSIZE` instead.
//!
//! Every packet leaves from the bound port, so the UDP source port — which the ICRC also
//! covers — is the NIC's port, not the per-QP port of rxe's formula (one unconnected
//! socket cannot choose a source port per packet). Receivers accept any source port; it
//! only spreads flows over ECMP paths.
//!
//! On receive the IPv4 header is not visible; see `rx_icrc.rs` for how the ICRC is
//! checked anyway.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Bytes per receive slot: a 4096-byte-MTU packet with every header is below 4200;
/// larger datagrams are truncated by the kernel and dropped (counted).
pub const RECV_SLOT: usize = 8192;

/// Datagrams received per `recvmmsg` call.
pub const RECV_BATCH: usize = 32;

/// Socket buffer size requested (capped by `net.core.{r,w}mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;

/// What happened to a datagram handed to [`PacketIo::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// The kernel took it.
    Sent,
    /// The socket buffer stayed full; the datagram was dropped (RC retransmits it).
    DroppedFull,
    /// The kernel refused it (e.g. no route); the datagram was dropped.
    Failed,
}

/// A batch of received datagrams.
pub struct RecvBatch {
    storage: Vec<u8>,
    lens: [usize; RECV_BATCH],
    truncated: [bool; RECV_BATCH],
    peers: [Option<SocketAddr>; RECV_BATCH],
    count: usize,
}

impl RecvBatch {
    /// An empty batch with its buffers allocated (once).
    pub fn new() -> Self {
        RecvBatch {
            storage: vec![0u8; RECV_SLOT * RECV_BATCH],
            lens: [0; RECV_BATCH],
            truncated: [false; RECV_BATCH],
            peers: [None; RECV_BATCH],
            count: 0,
        }
    }

    /// Datagrams in the batch.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Datagram `i`: its bytes, its sender, and whether the kernel truncated it.
    pub fn get(&self, i: usize) -> Option<(&[u8], Option<SocketAddr>, bool)> {
        if i >= self.count {
            return None;
        }
        let start = i * RECV_SLOT;
        let bytes = self
            .storage
            .get(start..start + self.lens[i].min(RECV_SLOT))?;
        Some((bytes, self.peers[i], self.truncated[i]))
    }
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch::new()
    }
}

/// Datagram I/O as the runtime uses it.
pub trait PacketIo {
    /// The bound address.
    fn local_addr(&self) -> SocketAddr;
    /// A descriptor that polls readable when datagrams are waiting.
    fn poll_fd(&self) -> RawFd;
    /// Receives up to [`RECV_BATCH`] datagrams without blocking; 0 when none waits.
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<usize>;
    /// Sends one datagram to `dest`.
    fn send(&mut self, pkt: &[u8], dest: SocketAddr) -> SendOutcome;
    /// The IPv4 Identification the k-th datagram of one send carries (what the ICRC
    /// must be computed with).
    fn ipv4_id(&self, _segment: usize) -> u16 {
        0
    }
}

/// One unconnected, non-blocking UDP socket with DF set. See the module documentation.
pub struct UdpIo {
    socket: Socket,
    local: SocketAddr,
}

fn set_int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: `v` is a live c_int and its size is passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Converts a kernel-written socket address to a `SocketAddr` (IPv4 or IPv6 only).
fn sockaddr_to_std(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, which is smaller
            // than sockaddr_storage and has no stricter alignment.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

impl UdpIo {
    /// The IPv4 Identification Linux puts on this socket's datagrams.
    pub const IPV4_ID: u16 = 0;

    /// Binds `addr` (IPv4 or IPv6).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let domain = Domain::for_address(addr);
        let socket = Socket::new(domain, Type::DGRAM.nonblocking(), Some(Protocol::UDP))?;
        let fd = socket.as_raw_fd();
        if addr.is_ipv4() {
            set_int_opt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
        } else {
            socket.set_only_v6(true)?;
            set_int_opt(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
        }
        // Best effort: larger buffers absorb bursts (a 64 KiB WRITE is 16 packets).
        let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
        socket.bind(&SockAddr::from(addr))?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not IP"))?;
        Ok(UdpIo { socket, local })
    }

    fn wait_writable(&self, timeout_ms: i32) {
        let mut p = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
    }
}

impl PacketIo for UdpIo {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn poll_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.count = 0;
        // SAFETY: zeroed iovec/mmsghdr/sockaddr_storage are valid "empty" values.
        let mut iov: [libc::iovec; RECV_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_storage; RECV_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        let base = batch.storage.as_mut_ptr();
        for i in 0..RECV_BATCH {
            // SAFETY: slot i lies inside `storage` (RECV_SLOT * RECV_BATCH bytes).
            iov[i].iov_base = unsafe { base.add(i * RECV_SLOT) }.cast();
            iov[i].iov_len = RECV_SLOT;
            hdrs[i].msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            hdrs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdrs[i].msg_hdr.msg_iov = &mut iov[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at live buffers of the stated sizes that outlive
        // the call; MSG_DONTWAIT makes it non-blocking regardless of the socket mode.
        let n = unsafe {
            libc::recvmmsg(
                self.socket.as_raw_fd(),
                hdrs.as_mut_ptr(),
                RECV_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = (n as usize).min(RECV_BATCH);
        for i in 0..n {
            batch.lens[i] = hdrs[i].msg_len as usize;
            batch.truncated[i] = hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            batch.peers[i] = sockaddr_to_std(&names[i], hdrs[i].msg_hdr.msg_namelen);
        }
        batch.count = n;
        Ok(n)
    }

    fn send(&mut self, pkt: &[u8], dest: SocketAddr) -> SendOutcome {
        let to = SockAddr::from(dest);
        // A full socket buffer clears within microseconds on loopback; wait a little,
        // a bounded number of times, then drop (RC recovers by retransmission).
        for attempt in 0..4 {
            match self.socket.send_to(pkt, &to) {
                Ok(_) => return SendOutcome::Sent,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if attempt < 3 {
                        self.wait_writable(1);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(%dest, error = %e, "send failed");
                    return SendOutcome::Failed;
                }
            }
        }
        SendOutcome::DroppedFull
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_and_receive_a_batch_on_loopback() {
        let mut a = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        for i in 0..5u8 {
            assert_eq!(a.send(&[i; 100], b.local_addr()), SendOutcome::Sent);
        }
        let mut batch = RecvBatch::new();
        let mut got = Vec::new();
        for _ in 0..1000 {
            b.recv_batch(&mut batch).unwrap();
            for i in 0..batch.len() {
                let (bytes, peer, trunc) = batch.get(i).unwrap();
                assert_eq!(peer, Some(a.local_addr()));
                assert!(!trunc);
                got.push(bytes.to_vec());
            }
            if got.len() == 5 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got.len(), 5);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g, &vec![i as u8; 100]);
        }
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 0);
    }

    #[test]
    fn oversize_datagram_is_reported_truncated() {
        let mut a = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(
            a.send(&vec![7u8; RECV_SLOT + 10], b.local_addr()),
            SendOutcome::Sent
        );
        let mut batch = RecvBatch::new();
        for _ in 0..1000 {
            if b.recv_batch(&mut batch).unwrap() > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (bytes, _, trunc) = batch.get(0).unwrap();
        assert!(trunc);
        assert_eq!(bytes.len(), RECV_SLOT);
    }
}
