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
//! Each send may carry its own IP TOS / traffic class (a QP's traffic class) as a
//! control message; the ICRC masks it.
//!
//! On receive the IPv4 header is not visible, except its TOS and TTL, which the kernel
//! reports as control messages while the NIC has UD QPs (their receive buffers' GRH
//! shows them); see `rx_icrc.rs` for how the ICRC is checked anyway (the IPv4 ID it
//! covers is solved).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Bytes per receive slot: a 4096-byte-MTU packet with every header is below 4200;
/// larger datagrams are truncated by the kernel and dropped (counted).
pub const RECV_SLOT: usize = 8192;

/// Bytes per receive slot with GRO: one coalesced buffer holds up to 64 KiB.
pub const GRO_SLOT: usize = 65_536;

/// `UDP_GRO` from `linux/udp.h`.
const UDP_GRO: libc::c_int = 104;
/// `UDP_NO_CHECK6_RX` from `linux/udp.h`: accept IPv6 datagrams with UDP checksum 0.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// Datagrams received per `recvmmsg` call.
pub const RECV_BATCH: usize = 32;

/// Most datagrams in one GSO send: the kernel's `UDP_MAX_SEGMENTS` (64 since Linux
/// 4.18; later kernels accept more) and, on receive, `UDP_GRO_CNT_MAX`, the most
/// segments GRO merges. For full-sized packets the 64 KiB datagram limit binds first
/// ([`GSO_MAX_BYTES`]: 15 segments of a 4096-byte-MTU packet); small packets fill runs
/// of 64, so an 8 B WRITE pays a quarter of a `sendmsg` of 16 (≈ 3 µs on loopback,
/// nearly all of it per call, not per segment: docs/perf.md, issue 12).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes in one GSO send: the largest IPv4 UDP payload (65,535 − 20 − 8), rounded
/// down a little for safety.
pub const GSO_MAX_BYTES: usize = 65_000;

/// `UDP_SEGMENT` and `SOL_UDP` from `linux/udp.h` (cmsg carrying the GSO segment size;
/// the libc crate defines `UDP_SEGMENT` only for uclibc and Android).
pub const UDP_SEGMENT: libc::c_int = 103;
const SOL_UDP: libc::c_int = 17;

/// Socket buffer size requested (capped by `net.core.{r,w}mem_max`).
pub const SOCKET_BUFFER: usize = 4 << 20;

/// IP TTL / hop limit of multicast datagrams (unicast ones get the kernel's default,
/// 64, too).
const MULTICAST_HOPS: u32 = 64;

/// The TTL / hop limit a received datagram is reported with when the socket did not
/// say: Linux's default for unicast and this NIC's for multicast.
const DEFAULT_TTL: u8 = 64;

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

/// Where in a 4 KiB span the NIC's packet buffers start ([`PhasedBuf`]): the transmit
/// buffer and the receive batch's storage. A 4096-byte-MTU run lays packet j out at
/// 4112 j (12-byte BTH, 4096 bytes of payload, the ICRC), so its payload lies at
/// 1932 + 16 j mod 4096 — about 2 KiB from a page-aligned memory region, before it and
/// after it. Both single passes copy between such a region and these buffers (the
/// sender from the region into the run, the receiver from the GRO buffer into the
/// region), and a load whose address matches an older in-flight store's in its low 12
/// bits waits for it ("4 KiB aliasing"). Where the allocator put these buffers (16
/// bytes into a page) the sender's stores lay 28 + 16 j bytes after its loads mod 4096:
/// on a Zen 4, fused copies of 4 KiB laid out so took 107–117 ns each against 88–92
/// with the payloads ≈ 2 KiB away (the receiver's direction, stores before loads,
/// 90–100). docs/perf.md, "Session 12: 4 KiB aliasing in the sender's fused copy".
pub const BUF_PHASE: usize = 1920;

/// The span [`BUF_PHASE`] is counted in: the low address bits a load and an older store
/// are compared by before their full addresses are.
const ALIAS_SPAN: usize = 4096;

/// A zeroed byte buffer of fixed length whose first byte lies at a chosen offset mod
/// 4096 in memory ([`BUF_PHASE`]); it dereferences to its bytes. Never reallocated, so
/// pointers into it stay valid while it lives (the receive batch's iovecs).
pub struct PhasedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl PhasedBuf {
    /// `len` zero bytes starting at `phase` mod 4096.
    pub fn new(len: usize, phase: usize) -> PhasedBuf {
        let storage = vec![0u8; len + ALIAS_SPAN];
        let at = storage.as_ptr() as usize % ALIAS_SPAN;
        let start = (phase % ALIAS_SPAN + ALIAS_SPAN - at) % ALIAS_SPAN;
        PhasedBuf {
            storage,
            start,
            len,
        }
    }
}

impl std::ops::Deref for PhasedBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for PhasedBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// A batch of received datagrams.
pub struct RecvBatch {
    storage: PhasedBuf,
    slot: usize,
    segs: [usize; RECV_BATCH],
    /// Each entry's IP TOS / traffic class and TTL / hop limit (`IP_RECVTOS`, ...).
    ip: [(u8, u8); RECV_BATCH],
    lens: [usize; RECV_BATCH],
    truncated: [bool; RECV_BATCH],
    peers: [Option<SocketAddr>; RECV_BATCH],
    count: usize,
    /// The senders' addresses as the kernel writes them, and the control buffers for
    /// the UDP_GRO segment size, the TOS and the TTL (u64 storage aligns cmsghdr; three
    /// cmsgs of at most 4 data bytes take 72 bytes on LP64): kept, not zeroed for every
    /// `recvmmsg` (5 KiB of memset a call). Only what a call's header says the kernel
    /// wrote is read (`msg_namelen`, `msg_controllen`).
    names: Box<[libc::sockaddr_storage; RECV_BATCH]>,
    ctrl: Box<[[u64; 12]; RECV_BATCH]>,
    /// The `recvmmsg` headers and their iovecs, pointing into `storage`, `names` and
    /// `ctrl` (heap buffers that stay put when the batch moves and are never
    /// reallocated): built once, for a socket with or without GRO (`wired`), and after
    /// each call only the lengths the kernel rewrote are reset — rebuilding all 32 for
    /// every call was ≈ 2 % of a 64 KiB WRITE receiver's samples (issue 12).
    hdrs: Box<[libc::mmsghdr; RECV_BATCH]>,
    iov: Box<[libc::iovec; RECV_BATCH]>,
    wired: Option<bool>,
}

impl RecvBatch {
    /// An empty batch with its buffers allocated (once).
    pub fn new() -> Self {
        RecvBatch::with_slot(RECV_SLOT)
    }

    /// An empty batch of `slot`-byte slots ([`GRO_SLOT`] when GRO is on).
    pub fn with_slot(slot: usize) -> Self {
        RecvBatch {
            storage: PhasedBuf::new(slot * RECV_BATCH, BUF_PHASE),
            slot,
            segs: [0; RECV_BATCH],
            ip: [(0, DEFAULT_TTL); RECV_BATCH],
            lens: [0; RECV_BATCH],
            truncated: [false; RECV_BATCH],
            peers: [None; RECV_BATCH],
            count: 0,
            // SAFETY: an all-zero sockaddr_storage is a valid value (family AF_UNSPEC).
            names: Box::new(unsafe { std::mem::zeroed() }),
            ctrl: Box::new([[0u64; 12]; RECV_BATCH]),
            // SAFETY: zeroed iovec/mmsghdr are valid "empty" values.
            hdrs: Box::new(unsafe { std::mem::zeroed() }),
            // SAFETY: as above.
            iov: Box::new(unsafe { std::mem::zeroed() }),
            wired: None,
        }
    }

    /// Points header i at slot i, its address buffer and (with GRO or the IP header
    /// fields asked for) its control buffer, with the lengths the kernel is to fill
    /// reset to the full buffers.
    fn wire(&mut self, ctl: bool) -> io::Result<()> {
        let slot = self.slot;
        if self.storage.len() < slot * RECV_BATCH {
            return Err(io::Error::other("receive batch smaller than its slots"));
        }
        let base = self.storage.as_mut_ptr();
        for i in 0..RECV_BATCH {
            // SAFETY: slot i lies inside `storage` (slot * RECV_BATCH bytes, checked).
            self.iov[i].iov_base = unsafe { base.add(i * slot) }.cast();
            self.iov[i].iov_len = slot;
            let h = &mut self.hdrs[i].msg_hdr;
            (h.msg_control, h.msg_controllen) = if ctl {
                (self.ctrl[i].as_mut_ptr().cast(), 0)
            } else {
                (std::ptr::null_mut(), 0)
            };
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut self.iov[i];
            h.msg_iovlen = 1;
            self.reset(i, ctl);
        }
        self.wired = Some(ctl);
        Ok(())
    }

    /// Resets the lengths of header i that `recvmmsg` rewrites.
    fn reset(&mut self, i: usize, ctl: bool) {
        let h = &mut self.hdrs[i].msg_hdr;
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if ctl {
            h.msg_controllen = std::mem::size_of_val(&self.ctrl[i]) as _;
        }
        h.msg_flags = 0;
    }

    /// Datagrams in the batch.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Entry `i`: its bytes, its sender, whether the kernel truncated it, and the
    /// datagram size — with GRO one entry holds several datagrams of that size (the
    /// last may be shorter), to be split by the caller.
    pub fn get(&self, i: usize) -> Option<(&[u8], Option<SocketAddr>, bool, usize)> {
        if i >= self.count {
            return None;
        }
        let start = i * self.slot;
        let len = self.lens[i].min(self.slot);
        let bytes = self.storage.get(start..start + len)?;
        let seg = if self.segs[i] == 0 { len } else { self.segs[i] };
        Some((bytes, self.peers[i], self.truncated[i], seg))
    }

    /// Entry `i`'s IP TOS / traffic class and TTL / hop limit (0 and 64 where the
    /// socket did not report them).
    pub fn ip_fields(&self, i: usize) -> (u8, u8) {
        self.ip.get(i).copied().unwrap_or((0, DEFAULT_TTL))
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
    fn poll_fd(&self) -> BorrowedFd<'_>;
    /// Receives up to [`RECV_BATCH`] datagrams without blocking; 0 when none waits.
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<usize>;
    /// Sends one datagram to `dest` with IP TOS / traffic class `tos`.
    fn send(&mut self, pkt: &[u8], dest: SocketAddr, tos: u8) -> SendOutcome;
    /// The IPv4 Identification the k-th datagram of one send carries (what the ICRC
    /// must be computed with).
    fn ipv4_id(&self, _segment: usize) -> u16 {
        0
    }
    /// Most datagrams one [`PacketIo::send_segments`] call takes (1 = no segmentation
    /// offload).
    fn max_segments(&self) -> usize {
        1
    }
    /// Sends `buf` as consecutive datagrams of `seg_len` bytes each (the last may be
    /// shorter) to `dest`, all with IP TOS / traffic class `tos`. Without offload: one
    /// send per datagram.
    fn send_segments(
        &mut self,
        buf: &[u8],
        seg_len: usize,
        dest: SocketAddr,
        tos: u8,
    ) -> SendOutcome {
        send_one_by_one(self, buf, seg_len, dest, tos)
    }
}

/// [`PacketIo::send_segments`] without offload: each `seg_len`-byte datagram of `buf`
/// sent on its own; the outcome is the last that was not `Sent`, if any.
fn send_one_by_one<I: PacketIo + ?Sized>(
    io: &mut I,
    buf: &[u8],
    seg_len: usize,
    dest: SocketAddr,
    tos: u8,
) -> SendOutcome {
    let mut out = SendOutcome::Sent;
    for seg in buf.chunks(seg_len.max(1)) {
        let r = io.send(seg, dest, tos);
        if r != SendOutcome::Sent {
            out = r;
        }
    }
    out
}

/// Which UDP offloads to use: asked for by the configuration, or in use on a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offloads {
    /// Segmentation on send (`UDP_SEGMENT`): up to [`GSO_MAX_SEGMENTS`] packets per
    /// `sendmsg`.
    pub gso: bool,
    /// Coalescing on receive (`UDP_GRO`): runs of datagrams from one sender in one buffer.
    pub gro: bool,
}

/// One unconnected, non-blocking UDP socket with DF set. See the module documentation.
pub struct UdpIo {
    socket: Socket,
    local: SocketAddr,
    gso: bool,
    gro: bool,
    /// The kernel reports each datagram's TOS and TTL ([`RecvBatch::ip_fields`]):
    /// always on a group's socket, on the NIC's while it has UD QPs
    /// ([`UdpIo::report_ip_fields`]).
    ip_fields: bool,
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

/// What a received message's control data says: the UDP_GRO segment size (0 = not
/// coalesced), and the IP TOS / traffic class and TTL / hop limit (0 and 64 when absent).
fn received_cmsgs(msg: &libc::msghdr) -> (usize, u8, u8) {
    let (mut seg, mut tos, mut ttl) = (0, 0, DEFAULT_TTL);
    if msg.msg_control.is_null() || msg.msg_controllen == 0 {
        return (seg, tos, ttl);
    }
    // SAFETY: pure computation.
    let (one, int) = unsafe {
        (
            libc::CMSG_LEN(1) as usize,
            libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize,
        )
    };
    // SAFETY: msg_control/msg_controllen describe the control buffer the kernel filled
    // for this message; CMSG_FIRSTHDR/NXTHDR stay inside it.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        // SAFETY: c is a valid cmsghdr inside the buffer.
        let (level, ty, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
        // SAFETY: the cmsg holds `len - CMSG_LEN(0)` data bytes; each read below is
        // guarded by a length check of at least its size.
        let int_data =
            || unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>()) };
        // SAFETY: as above, one byte.
        let byte_data = || unsafe { *libc::CMSG_DATA(c) };
        match (level, ty) {
            (SOL_UDP, UDP_GRO) if len >= int => seg = usize::try_from(int_data()).unwrap_or(0),
            // IPv4 reports its TOS as one byte, everything else as an int.
            (libc::IPPROTO_IP, libc::IP_TOS) if len >= one => tos = byte_data(),
            (libc::IPPROTO_IP, libc::IP_TTL) if len >= int => ttl = int_data() as u8,
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if len >= int => tos = int_data() as u8,
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) if len >= int => ttl = int_data() as u8,
            _ => {}
        }
        // SAFETY: msg and c are valid as above.
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
    (seg, tos, ttl)
}

/// Asks the kernel to report (`on` 1) or no longer report (0) each received datagram's
/// IP TOS / traffic class and TTL / hop limit in its control data (what a UD receive's
/// GRH carries). Best effort: a kernel that refuses leaves the defaults (0 and 64) in
/// the GRH. True when both options were set.
fn ask_ip_fields(fd: RawFd, v4: bool, on: libc::c_int) -> bool {
    let asks = if v4 {
        [
            (libc::IPPROTO_IP, libc::IP_RECVTOS),
            (libc::IPPROTO_IP, libc::IP_RECVTTL),
        ]
    } else {
        [
            (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS),
            (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT),
        ]
    };
    asks.iter()
        .all(|&(level, name)| set_int_opt(fd, level, name, on).is_ok())
}

/// The index of network interface `name` (`if_nametoindex(3)`), if it exists.
pub fn interface_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// The index of the network interface that has the address `ip` (`getifaddrs(3)`).
pub fn interface_of(ip: IpAddr) -> Option<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a live out-pointer; on success the kernel-built list is freed
    // below with freeifaddrs and not used after.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freed.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points at a sockaddr of its family's size
            // (sockaddr_in / sockaddr_in6 for the families read here).
            let sa = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_storage>() };
            let len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            let addr = match libc::c_int::from(sa.ss_family) {
                libc::AF_INET => sockaddr_to_std(
                    sa,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ),
                libc::AF_INET6 => sockaddr_to_std(sa, len),
                _ => None,
            };
            if addr.is_some_and(|a| a.ip() == ip) {
                // SAFETY: ifa_name is the node's NUL-terminated interface name.
                let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
                found = (index != 0).then_some(index);
                break;
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
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

    /// Binds `addr` (IPv4 or IPv6), without offloads.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::bind_with(addr, Offloads::default())
    }

    /// Binds `addr` and turns on the offloads in `want` that the kernel has, probed with
    /// `setsockopt` (`UDP_SEGMENT` since Linux 4.18, `UDP_GRO` since 5.0); one it
    /// refuses is left off, and [`UdpIo::offloads`] says what is in use.
    ///
    /// With GSO [`PacketIo::send_segments`] hands the kernel up to
    /// [`GSO_MAX_SEGMENTS`] datagrams per `sendmsg`. The kernel gives the segments of
    /// one such send IPv4 IDs 0, 1, 2, … (checked through software segmentation on a
    /// tap device, see the shared RoCE README, and on a veth by `tests/nic_gso_wire.rs`),
    /// so segment k's ICRC is computed with ID k ([`PacketIo::ipv4_id`]); receivers find
    /// that ID (`rx_icrc.rs`). A NIC whose hardware segments UDP might number them
    /// differently: `softnic run --no-gso`.
    pub fn bind_with(addr: SocketAddr, want: Offloads) -> io::Result<Self> {
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
            // Linux rxe sends UDP checksum 0 over IPv6 as over IPv4: the ICRC protects
            // the packet (RFC 6935/6936 allow zero UDP checksums over IPv6 for such
            // tunnel protocols). Linux drops zero-checksum IPv6 datagrams unless the
            // socket opts in; without this not one rxe packet arrives over IPv6.
            set_int_opt(fd, SOL_UDP, UDP_NO_CHECK6_RX, 1)?;
        }
        // Best effort: larger buffers absorb bursts (a 64 KiB WRITE is 16 packets).
        let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
        socket.bind(&SockAddr::from(addr))?;
        // UD multicast sends (`mcast.rs`) leave through this NIC's own interface, not
        // the one the routing table gives the group (which would put loopback-sourced
        // datagrams on a real link), with the hop limit of unicast ones, 64: what the
        // CM's MULTICAST_JOIN reports and what rxe sends (the socket default is 1).
        // Best effort: a failure only costs multicast.
        match addr.ip() {
            IpAddr::V4(a) => {
                let _ = socket.set_multicast_if_v4(&a);
                let _ = socket.set_multicast_ttl_v4(MULTICAST_HOPS);
            }
            IpAddr::V6(a) => {
                if let Some(i) = interface_of(IpAddr::V6(a)) {
                    let _ = socket.set_multicast_if_v6(i);
                }
                let _ = socket.set_multicast_hops_v6(MULTICAST_HOPS);
            }
        }
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not IP"))?;
        // GSO probe: a per-socket segment size of 0 changes nothing (each send still
        // chooses its own with a cmsg) but fails with ENOPROTOOPT where the kernel has
        // no UDP segmentation.
        let gso = want.gso && set_int_opt(fd, SOL_UDP, UDP_SEGMENT, 0).is_ok();
        // GRO: the kernel hands over runs of datagrams from one sender as one buffer
        // (up to 64 KiB) with their size in a UDP_GRO cmsg; on loopback a GSO send
        // arrives whole.
        let gro = want.gro && set_int_opt(fd, SOL_UDP, UDP_GRO, 1).is_ok();
        Ok(UdpIo {
            socket,
            local,
            gso,
            gro,
            ip_fields: false,
        })
    }

    /// A socket that receives the datagrams sent to the multicast `group` (address and
    /// port): bound to the group with `SO_REUSEADDR`, so that every NIC of the host
    /// (and rxe's kernel socket) receives them too, and joined on the interface that
    /// has the address `on`. It only receives: with `gro` (asked for, and the kernel
    /// has it) the segments of one GSO send arrive together, numbered, as on the
    /// unicast socket. Dropping it leaves the group.
    pub fn join_group(group: SocketAddr, on: IpAddr, gro: bool) -> io::Result<Self> {
        let socket = Socket::new(
            Domain::for_address(group),
            Type::DGRAM.nonblocking(),
            Some(Protocol::UDP),
        )?;
        socket.set_reuse_address(true)?;
        let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
        match (group.ip(), on) {
            (IpAddr::V4(g), IpAddr::V4(on)) => {
                socket.bind(&SockAddr::from(group))?;
                socket.join_multicast_v4(&g, &on)?;
            }
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                socket.set_only_v6(true)?;
                set_int_opt(socket.as_raw_fd(), SOL_UDP, UDP_NO_CHECK6_RX, 1)?;
                socket.bind(&SockAddr::from(group))?;
                let index = interface_of(on).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("no interface has {on}"))
                })?;
                socket.join_multicast_v6(&g, index)?;
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "group and interface address of different families",
                ))
            }
        }
        let gro = gro && set_int_opt(socket.as_raw_fd(), SOL_UDP, UDP_GRO, 1).is_ok();
        let ip_fields = ask_ip_fields(socket.as_raw_fd(), group.is_ipv4(), 1);
        Ok(UdpIo {
            socket,
            local: group,
            gso: false,
            gro,
            ip_fields,
        })
    }

    /// Whether the kernel reports each received datagram's IP TOS / traffic class and
    /// TTL / hop limit ([`RecvBatch::ip_fields`]; without, 0 and 64). Off at bind: the
    /// two control messages cost every receive a little, for what only a UD receive's
    /// GRH shows (in session 28's A/B with them always on, the minimum one-way time of
    /// an 8 B `send_lat` went from 10.2 to 10.6 µs, medians of ten alternating runs; the
    /// typical time and the rates did not move beyond the noise). Asked again only when
    /// `on` differs from the current state; a refusal leaves it off.
    pub fn report_ip_fields(&mut self, on: bool) {
        if on == self.ip_fields {
            return;
        }
        let fd = self.socket.as_raw_fd();
        self.ip_fields = if on {
            ask_ip_fields(fd, self.local.is_ipv4(), 1)
        } else {
            !ask_ip_fields(fd, self.local.is_ipv4(), 0)
        };
    }

    /// The receive buffer the kernel granted, in the bytes of payload it holds: Linux
    /// reports twice what it grants (`socket(7)`, `SO_RCVBUF`: the other half is its
    /// bookkeeping), and caps the request at `net.core.rmem_max`.
    pub fn recv_buffer(&self) -> usize {
        self.socket.recv_buffer_size().map_or(0, |b| b / 2)
    }

    /// Bytes per receive slot this socket needs ([`GRO_SLOT`] with GRO).
    pub fn recv_slot(&self) -> usize {
        if self.gro {
            GRO_SLOT
        } else {
            RECV_SLOT
        }
    }

    /// True when received datagrams may come coalesced (UDP_GRO).
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// True while GSO is in use (it is turned off if the kernel refuses it).
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// The offloads in use.
    pub fn offloads(&self) -> Offloads {
        Offloads {
            gso: self.gso,
            gro: self.gro,
        }
    }

    /// One `sendmsg` of `buf` to `dest`, cut into `seg`-byte datagrams by the kernel
    /// when `seg` is given (a `UDP_SEGMENT` cmsg), with IP TOS / traffic class `tos`
    /// when it is not 0 (an `IP_TOS` or `IPV6_TCLASS` cmsg: per datagram, so that one
    /// socket serves QPs of every traffic class; the socket's own is 0).
    fn sendmsg_with(
        &self,
        buf: &[u8],
        dest: SocketAddr,
        seg: Option<u16>,
        tos: u8,
    ) -> io::Result<()> {
        let to = SockAddr::from(dest);
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // u64 storage aligns the control buffer for cmsghdr; 64 bytes hold both cmsgs
        // (CMSG_SPACE of 2 and of 4 bytes: 24 each on LP64, at most 32 each anywhere).
        let mut cbuf = [0u64; 8];
        // SAFETY: pure computation.
        let (seg_space, tos_space) = unsafe {
            (
                libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize,
                libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize,
            )
        };
        let space =
            if seg.is_some() { seg_space } else { 0 } + if tos != 0 { tos_space } else { 0 };
        // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = to.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = to.len();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if space > 0 {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
        }
        // SAFETY: msg_control points to 64 bytes and `space` (at most 64) of them are
        // declared, so CMSG_FIRSTHDR / CMSG_NXTHDR return headers whose data lie inside
        // the declared length (each header was counted with its CMSG_SPACE).
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            if let Some(seg) = seg {
                (*c).cmsg_level = SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            if tos != 0 && !c.is_null() {
                let (level, ty) = match self.local {
                    SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_TOS),
                    SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
                };
                (*c).cmsg_level = level;
                (*c).cmsg_type = ty;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c).cast::<libc::c_int>(),
                    libc::c_int::from(tos),
                );
            }
        }
        // The system call itself, not glibc's `sendmsg`: that one is a thread
        // cancellation point and brackets every call with `__pthread_enable_asynccancel`
        // / `__pthread_disable_asynccancel` (≈ 0.6 % of a 64 KiB sender's samples,
        // issue 12); the NIC's threads are never cancelled.
        // SAFETY: msg points to live iovec, address and control buffers; SYS_sendmsg
        // takes (fd, const struct msghdr *, flags), as sendmsg(2).
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendmsg,
                libc::c_long::from(self.socket.as_raw_fd()),
                &msg as *const libc::msghdr,
                0 as libc::c_long,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
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

    fn ipv4_id(&self, segment: usize) -> u16 {
        if self.gso {
            segment as u16
        } else {
            0
        }
    }

    fn max_segments(&self) -> usize {
        if self.gso {
            GSO_MAX_SEGMENTS
        } else {
            1
        }
    }

    fn send_segments(
        &mut self,
        buf: &[u8],
        seg_len: usize,
        dest: SocketAddr,
        tos: u8,
    ) -> SendOutcome {
        let n = buf.len().div_ceil(seg_len.max(1));
        if !self.gso || n <= 1 || buf.len() > GSO_MAX_BYTES || seg_len > usize::from(u16::MAX) {
            return send_one_by_one(self, buf, seg_len, dest, tos);
        }
        for attempt in 0..4 {
            match self.sendmsg_with(buf, dest, Some(seg_len as u16), tos) {
                Ok(()) => return SendOutcome::Sent,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if attempt < 3 {
                        self.wait_writable(1);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EIO/EINVAL/ENOPROTOOPT: no GSO on this path. The segments' ICRCs
                    // were computed for IDs 0, 1, …, which plain sends would not carry,
                    // so these are dropped (RC retransmits them) and GSO is turned off.
                    tracing::warn!(error = %e, "UDP GSO refused; falling back to one send per packet");
                    self.gso = false;
                    return SendOutcome::Failed;
                }
            }
        }
        SendOutcome::DroppedFull
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.count = 0;
        let ctl = self.gro || self.ip_fields;
        if batch.wired != Some(ctl) {
            batch.wire(ctl)?;
        }
        // SAFETY: every header points at live buffers of the stated sizes owned by
        // `batch`, which outlives the call (`RecvBatch::wire`); MSG_DONTWAIT makes it
        // non-blocking regardless of the socket mode.
        // The system call itself, as in `sendmsg_gso` (no cancellation-point wrapper);
        // SYS_recvmmsg takes (fd, struct mmsghdr *, vlen, flags, struct timespec *).
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                libc::c_long::from(self.socket.as_raw_fd()),
                batch.hdrs.as_mut_ptr(),
                RECV_BATCH as libc::c_long,
                libc::c_long::from(libc::MSG_DONTWAIT),
                std::ptr::null_mut::<libc::timespec>(),
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
            let h = &batch.hdrs[i];
            batch.lens[i] = h.msg_len as usize;
            batch.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            batch.peers[i] = sockaddr_to_std(&batch.names[i], h.msg_hdr.msg_namelen);
            let (seg, tos, ttl) = received_cmsgs(&h.msg_hdr);
            batch.segs[i] = if self.gro { seg } else { 0 };
            batch.ip[i] = (tos, ttl);
            batch.reset(i, ctl);
        }
        // The entry that ended the call is not written back, but reset it anyway: a
        // shorter address length left there would truncate the next sender's address.
        if n < RECV_BATCH {
            batch.reset(n, ctl);
        }
        batch.count = n;
        Ok(n)
    }

    fn send(&mut self, pkt: &[u8], dest: SocketAddr, tos: u8) -> SendOutcome {
        // A full socket buffer clears within microseconds on loopback; wait a little,
        // a bounded number of times, then drop (RC recovers by retransmission).
        for attempt in 0..4 {
            match self.sendmsg_with(pkt, dest, None, tos) {
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

    const BOTH: Offloads = Offloads {
        gso: true,
        gro: true,
    };

    /// Receives on `b` until `want` datagrams from `from` came (GRO runs split by their
    /// segment size), waiting up to a second.
    /// Receives on `b` until a datagram came (up to a second): its IP TOS and TTL as
    /// the batch reports them, and its segment count.
    fn receive_ip_fields(b: &mut UdpIo) -> ((u8, u8), usize) {
        let mut batch = RecvBatch::with_slot(b.recv_slot());
        for _ in 0..1000 {
            if b.recv_batch(&mut batch).unwrap() > 0 {
                let (bytes, _, _, seg) = batch.get(0).unwrap();
                return (batch.ip_fields(0), bytes.len().div_ceil(seg));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("nothing received");
    }

    /// Each send's TOS / traffic class reaches the wire (what the receiving socket's
    /// `IP_RECVTOS` / `IPV6_RECVTCLASS` reports once asked), ECN bits included, per send
    /// on one socket, with and without GSO, and 0 leaves the default; the TTL / hop
    /// limit is reported too (64, Linux's default). Not asked, or no longer, the batch
    /// says 0 and 64.
    #[test]
    fn each_send_carries_its_tos_and_the_receiver_sees_tos_and_ttl() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr = addr.parse().unwrap();
            let mut a = UdpIo::bind_with(addr, BOTH).unwrap();
            let mut b = UdpIo::bind_with(addr, BOTH).unwrap();
            assert!(!b.ip_fields, "off at bind");
            assert_eq!(a.send(&[1; 100], b.local_addr(), 0xB8), SendOutcome::Sent);
            assert_eq!(receive_ip_fields(&mut b), ((0, 64), 1), "{addr}: not asked");
            b.report_ip_fields(true);
            assert!(b.ip_fields, "{addr}: IP_RECVTOS/TTL refused");
            for tos in [0xB8u8, 0, 0x03, 0x60] {
                assert_eq!(a.send(&[1; 100], b.local_addr(), tos), SendOutcome::Sent);
                assert_eq!(
                    receive_ip_fields(&mut b),
                    ((tos, 64), 1),
                    "{addr} plain {tos:#x}"
                );
                let run = vec![2u8; 3 * 1000];
                assert_eq!(
                    a.send_segments(&run, 1000, b.local_addr(), tos),
                    SendOutcome::Sent
                );
                assert_eq!(
                    receive_ip_fields(&mut b),
                    ((tos, 64), 3),
                    "{addr} GSO {tos:#x}"
                );
            }
            b.report_ip_fields(false);
            assert_eq!(a.send(&[1; 100], b.local_addr(), 0xB8), SendOutcome::Sent);
            assert_eq!(receive_ip_fields(&mut b), ((0, 64), 1), "{addr}: no longer");
        }
    }

    fn receive_split(b: &mut UdpIo, from: SocketAddr, want: usize) -> Vec<Vec<u8>> {
        let mut batch = RecvBatch::with_slot(b.recv_slot());
        let mut got = Vec::new();
        for _ in 0..1000 {
            b.recv_batch(&mut batch).unwrap();
            for i in 0..batch.len() {
                let (bytes, peer, trunc, seg) = batch.get(i).unwrap();
                assert!(!trunc);
                assert_eq!(peer, Some(from));
                got.extend(bytes.chunks(seg).map(|c| c.to_vec()));
            }
            if got.len() >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        got
    }

    #[test]
    fn phased_buffers_start_where_asked() {
        for (len, phase) in [
            (1, 0),
            (4096, 16),
            (300_000, BUF_PHASE),
            (10, 4095),
            (5, 8193),
        ] {
            let mut b = PhasedBuf::new(len, phase);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % 4096, phase % 4096);
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            assert_eq!(b.last(), Some(&7));
        }
        let batch = RecvBatch::with_slot(GRO_SLOT);
        assert_eq!(batch.storage.as_ptr() as usize % 4096, BUF_PHASE);
        assert_eq!(batch.storage.len(), GRO_SLOT * RECV_BATCH);
    }

    #[test]
    fn send_and_receive_a_batch_on_loopback() {
        let mut a = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        for i in 0..5u8 {
            assert_eq!(a.send(&[i; 100], b.local_addr(), 0), SendOutcome::Sent);
        }
        let mut batch = RecvBatch::new();
        let mut got = Vec::new();
        for _ in 0..1000 {
            b.recv_batch(&mut batch).unwrap();
            for i in 0..batch.len() {
                let (bytes, peer, trunc, _) = batch.get(i).unwrap();
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

    /// rxe's IPv6 RoCEv2 packets carry UDP checksum 0 (see `bind_with`).
    #[test]
    fn ipv6_datagrams_with_udp_checksum_zero_are_received() {
        let mut b = UdpIo::bind("[::1]:0".parse().unwrap()).unwrap();
        let tx = std::net::UdpSocket::bind("[::1]:0").unwrap();
        // UDP_NO_CHECK6_TX (linux/udp.h): send with checksum 0, as rxe does.
        set_int_opt(tx.as_raw_fd(), SOL_UDP, 101, 1).unwrap();
        tx.send_to(&[9u8; 64], b.local_addr()).unwrap();
        let mut batch = RecvBatch::new();
        for _ in 0..1000 {
            if b.recv_batch(&mut batch).unwrap() > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (bytes, peer, _, _) = batch.get(0).expect("the datagram arrived");
        assert_eq!(
            (bytes, peer),
            (&[9u8; 64][..], Some(tx.local_addr().unwrap()))
        );
    }

    #[test]
    fn gso_send_arrives_as_separate_datagrams() {
        let mut a = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        let mut b = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let buf: Vec<u8> = (0..3 * 1000 + 10).map(|i| (i / 1000) as u8).collect();
        assert_eq!(
            a.send_segments(&buf, 1000, b.local_addr(), 0),
            SendOutcome::Sent
        );
        assert!(a.gso(), "GSO works on loopback");
        assert_eq!(a.ipv4_id(2), 2);
        let mut batch = RecvBatch::new();
        let mut got = Vec::new();
        for _ in 0..1000 {
            b.recv_batch(&mut batch).unwrap();
            for i in 0..batch.len() {
                got.push(batch.get(i).unwrap().0.to_vec());
            }
            if got.len() == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let lens: Vec<usize> = got.iter().map(|g| g.len()).collect();
        assert_eq!(lens, vec![1000, 1000, 1000, 10]);
        for (k, g) in got.iter().enumerate() {
            assert!(g.iter().all(|&v| v == k as u8));
        }
    }

    #[test]
    fn gro_receives_a_gso_send_whole_with_its_segment_size() {
        let mut a = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        let mut b = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        assert!(b.gro());
        let buf: Vec<u8> = (0..3 * 1000 + 10).map(|i| (i / 1000) as u8).collect();
        assert_eq!(
            a.send_segments(&buf, 1000, b.local_addr(), 0),
            SendOutcome::Sent
        );
        let got = receive_split(&mut b, a.local_addr(), 4);
        let lens: Vec<usize> = got.iter().map(|g| g.len()).collect();
        assert_eq!(lens, vec![1000, 1000, 1000, 10]);
        for (k, g) in got.iter().enumerate() {
            assert!(g.iter().all(|&v| v == k as u8));
        }
    }

    /// The batch's headers are built once and reused: after a call in which the kernel
    /// wrote no control message (a plain datagram) or a sender's address, the next call
    /// still gets a GSO run's segment size and its own sender (the lengths the kernel
    /// rewrites are reset after every call).
    #[test]
    fn a_reused_batch_sees_each_calls_segment_size_and_sender() {
        let mut a = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        let mut c = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        let mut b = UdpIo::bind_with("127.0.0.1:0".parse().unwrap(), BOTH).unwrap();
        let mut batch = RecvBatch::with_slot(b.recv_slot());
        let run: Vec<u8> = (0..3 * 1000 + 10).map(|i| (i / 1000) as u8).collect();
        let mut next = |b: &mut UdpIo| {
            for _ in 0..1000 {
                if b.recv_batch(&mut batch).unwrap() > 0 {
                    let (bytes, peer, trunc, seg) = batch.get(0).unwrap();
                    assert_eq!(batch.len(), 1);
                    return (bytes.len(), peer, trunc, seg);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            panic!("nothing arrived");
        };
        for round in 0..3 {
            assert_eq!(a.send(&[7; 100], b.local_addr(), 0), SendOutcome::Sent);
            let got = next(&mut b);
            assert_eq!(
                got,
                (100, Some(a.local_addr()), false, 100),
                "round {round}"
            );
            assert_eq!(
                c.send_segments(&run, 1000, b.local_addr(), 0),
                SendOutcome::Sent
            );
            let got = next(&mut b);
            assert_eq!(
                got,
                (3010, Some(c.local_addr()), false, 1000),
                "round {round}"
            );
        }
    }

    #[test]
    fn offloads_are_probed_and_each_can_be_left_off() {
        let addr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(UdpIo::bind(addr).unwrap().offloads(), Offloads::default());
        // The kernels this runs on (≥ 5.0) have both.
        assert_eq!(UdpIo::bind_with(addr, BOTH).unwrap().offloads(), BOTH);
        for want in [
            Offloads {
                gso: true,
                gro: false,
            },
            Offloads {
                gso: false,
                gro: true,
            },
        ] {
            let io = UdpIo::bind_with(addr, want).unwrap();
            assert_eq!(io.offloads(), want);
            assert_eq!(io.recv_slot(), if want.gro { GRO_SLOT } else { RECV_SLOT });
            assert_eq!(io.max_segments() > 1, want.gso);
        }
    }

    #[test]
    fn gso_and_gro_work_over_ipv6() {
        let addr = "[::1]:0".parse().unwrap();
        let mut a = UdpIo::bind_with(addr, BOTH).unwrap();
        let mut b = UdpIo::bind_with(addr, BOTH).unwrap();
        let buf: Vec<u8> = (0..5 * 1200).map(|i| (i / 1200) as u8).collect();
        assert_eq!(
            a.send_segments(&buf, 1200, b.local_addr(), 0),
            SendOutcome::Sent
        );
        assert!(a.gso(), "GSO still on after an IPv6 send");
        let got = receive_split(&mut b, a.local_addr(), 5);
        assert_eq!(got.len(), 5);
        for (k, g) in got.iter().enumerate() {
            assert_eq!(g, &vec![k as u8; 1200]);
        }
    }

    #[test]
    fn multicast_leaves_with_the_unicast_hop_limit_through_the_nics_interface() {
        let io = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(io.socket.multicast_ttl_v4().unwrap(), MULTICAST_HOPS);
        assert_eq!(
            io.socket.multicast_if_v4().unwrap(),
            std::net::Ipv4Addr::LOCALHOST
        );
        let io = UdpIo::bind("[::1]:0".parse().unwrap()).unwrap();
        assert_eq!(io.socket.multicast_hops_v6().unwrap(), MULTICAST_HOPS);
    }

    #[test]
    fn oversize_datagram_is_reported_truncated() {
        let mut a = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(
            a.send(&vec![7u8; RECV_SLOT + 10], b.local_addr(), 0),
            SendOutcome::Sent
        );
        let mut batch = RecvBatch::new();
        for _ in 0..1000 {
            if b.recv_batch(&mut batch).unwrap() > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (bytes, _, trunc, _) = batch.get(0).unwrap();
        assert!(trunc);
        assert_eq!(bytes.len(), RECV_SLOT);
    }
}
