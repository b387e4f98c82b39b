//! The control protocol between a client and the NIC (the slow path; syscalls allowed).
//!
//! Transport: a Unix stream socket at [`socket_path`]`(name)` =
//! `$SOFTNIC_DIR/<name>.sock` (default `/tmp/softnic`; the NIC creates the directory).
//!
//! Framing: each message is a frame `[len: u32 LE][len bytes of serde_json]`, sent with
//! one `sendmsg`; file descriptors travel as `SCM_RIGHTS` on that `sendmsg`, so they
//! arrive with the frame's first bytes. The receiver ([`FrameReader`]) reads exactly one
//! frame at a time, never past its end, so descriptors can't be attributed to the wrong
//! frame. Limits, so a hostile client cannot make the NIC allocate without bound or
//! hoard descriptors: a frame is at most [`MAX_FRAME`] bytes (checked before any
//! allocation), carries at most [`MAX_FDS`] descriptors (more → the frame is refused and
//! every descriptor is closed); the receiver should drop the connection on any error.
//!
//! Exchange: the client sends a [`Request`], the NIC answers with exactly one
//! [`Response`]. Descriptors per message:
//!
//! | request            | fds sent by the client | fds in the reply       |
//! |--------------------|------------------------|------------------------|
//! | `OpenDevice`       | –                      | wake pipe (1)          |
//! | `RegMr`            | region memfd (1)       | –                      |
//! | `RegMrWindow`      | memfd (1) if a segment has no `share`, else – | – |
//! | `RegMrSysv`        | –                      | –                      |
//! | `RegMrCopy`        | `/proc/self/mem` (1)   | –                      |
//! | `CreateCq`         | CQ segment memfd (1)   | CQ pipe read end (1)   |
//! | `CreateQp`         | QP segment memfd (1)   | –                      |
//! | `CreateSrq`        | SRQ segment memfd (1)  | –                      |
//! | `AsyncEventChannel`| –                      | pipe read end (1)      |
//! | `Cm(OpenChannel)`  | –                      | pipe read end (1)      |
//! | everything else    | –                      | –                      |
//!
//! Segment sizes and ring offsets are never sent: both sides compute them from the
//! numbers in the request with [`super::layout`].
//!
//! When the connection closes (client exit or crash) the NIC destroys everything the
//! client created and unmaps its segments.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::os;

/// Largest frame payload accepted (bytes of JSON).
pub const MAX_FRAME: usize = 64 * 1024;

/// Most descriptors accepted with one frame.
pub const MAX_FDS: usize = 4;

/// Environment variable naming the directory of NIC sockets.
pub const SOFTNIC_DIR_ENV: &str = "SOFTNIC_DIR";

/// Directory of NIC sockets when [`SOFTNIC_DIR_ENV`] is unset.
pub const DEFAULT_SOFTNIC_DIR: &str = "/tmp/softnic";

/// `$SOFTNIC_DIR`, or [`DEFAULT_SOFTNIC_DIR`].
pub fn softnic_dir() -> PathBuf {
    match std::env::var_os(SOFTNIC_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_SOFTNIC_DIR),
    }
}

/// The control socket of device `name`: `$SOFTNIC_DIR/<name>.sock`. Both the NIC (bind)
/// and clients (connect) call this.
pub fn socket_path(name: &str) -> PathBuf {
    softnic_dir().join(format!("{name}.sock"))
}

/// A NIC-side object handle (PD, MR, CQ); QPs are named by their QPN.
pub type Handle = u32;

/// Transport service type (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QpType {
    /// Reliable connection (IBV_QPT_RC).
    Rc,
    /// Unreliable connection (IBV_QPT_UC).
    Uc,
    /// Unreliable datagram (IBV_QPT_UD).
    Ud,
    /// XRC initiator (IBV_QPT_XRC_SEND): RC requests to a target's XRC SRQs, named
    /// per work request ([`super::slots::send_flags::XRC_SRQN`]). No receive queue.
    XrcSend,
    /// XRC target (IBV_QPT_XRC_RECV), created in an XRC domain
    /// (`CreateQp::xrcd`): no send queue, no receive queue, no CQs; each request
    /// is received through the XRC SRQ (of its domain) that its XRCETH names.
    XrcRecv,
}

/// QP state (`enum ibv_qp_state`, IBTA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QpState {
    /// IBV_QPS_RESET.
    Reset,
    /// IBV_QPS_INIT.
    Init,
    /// IBV_QPS_RTR.
    Rtr,
    /// IBV_QPS_RTS.
    Rts,
    /// IBV_QPS_SQD.
    Sqd,
    /// IBV_QPS_SQE.
    Sqe,
    /// IBV_QPS_ERR.
    Err,
}

/// QP capabilities (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// SGEs per work request (≤ [`super::MAX_SGE`]).
    pub max_sge: u32,
    /// Inline bytes per send (≤ [`super::MAX_INLINE`]).
    pub max_inline: u32,
}

impl QpCaps {
    /// What the QP's send WQEs can carry, hence its send ring's stride: computed here,
    /// from the CreateQp request, by the client and by the NIC alike.
    pub fn sq_shape(&self, qp_type: QpType) -> super::SqShape {
        super::SqShape {
            max_sge: self.max_sge,
            max_inline: self.max_inline,
            ud: matches!(qp_type, QpType::Ud | QpType::XrcSend),
        }
    }
}

/// QP attributes for ModifyQp: `None` = not in the attribute mask (`ibv_modify_qp`).
/// The same shape as `softnic_transport::qp::QpAttr`; the NIC converts field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QpAttr {
    /// IBV_QP_STATE.
    pub state: Option<QpState>,
    /// IBV_QP_PATH_MTU, in bytes (256, 512, 1024, 2048, 4096).
    pub path_mtu: Option<u32>,
    /// IBV_QP_DEST_QPN.
    pub dest_qpn: Option<u32>,
    /// IBV_QP_RQ_PSN.
    pub rq_psn: Option<u32>,
    /// IBV_QP_SQ_PSN.
    pub sq_psn: Option<u32>,
    /// IBV_QP_AV: the peer NIC's UDP endpoint (from its GID; port 4791 unless the
    /// peer is a softnic on another port).
    pub remote: Option<SocketAddr>,
    /// IBV_QP_AV's `grh.traffic_class`: the IP TOS / IPv6 traffic class of the QP's
    /// packets (taken with `remote`, ignored without it).
    pub traffic_class: u8,
    /// IBV_QP_TIMEOUT (4.096 µs × 2^timeout).
    pub timeout: Option<u8>,
    /// IBV_QP_RETRY_CNT.
    pub retry_cnt: Option<u8>,
    /// IBV_QP_RNR_RETRY (7 = infinite).
    pub rnr_retry: Option<u8>,
    /// IBV_QP_MIN_RNR_TIMER (encoded, IBTA table 45).
    pub min_rnr_timer: Option<u8>,
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub max_rd_atomic: Option<u8>,
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub max_dest_rd_atomic: Option<u8>,
    /// IBV_QP_ACCESS_FLAGS (`ibv_access_flags` bits).
    pub access: Option<u32>,
    /// IBV_QP_QKEY.
    pub qkey: Option<u32>,
    /// IBV_QP_PKEY_INDEX.
    pub pkey_index: Option<u16>,
    /// IBV_QP_PORT.
    pub port_num: Option<u8>,
}

/// Device attributes (`ibv_query_device` + `ibv_query_port` + GID 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAttr {
    /// Device name (what clients open).
    pub name: String,
    /// GID index 0: the IPv4-mapped (`::ffff:a.b.c.d`) or IPv6 address, 16 bytes.
    pub gid: [u8; 16],
    /// Address the NIC's UDP socket is bound to.
    pub addr: IpAddr,
    /// UDP port of the NIC (4791 by default).
    pub port: u16,
    /// Largest path MTU (active MTU of the port), bytes.
    pub mtu: u32,
    /// Most QPs per user (over all its connections).
    pub max_qp: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per work request.
    pub max_sge: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Most inline bytes.
    pub max_inline: u32,
    /// Most memory regions per user (over all its connections).
    pub max_mr: u32,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Most outstanding RDMA READ/atomic requests per QP.
    pub max_qp_rd_atom: u32,
    /// Longest message, bytes (`ibv_port_attr.max_msg_sz`): what a connected QP
    /// carries at every path MTU. 2^31 − 256: at MTU 256 a 2^31-byte message would
    /// take 2^23 PSNs, more than a PSN window can order (from MTU 512 up a QP carries
    /// 2^31; the NIC refuses longer posts with vendor_err 0x188).
    pub max_msg_sz: u32,
}

/// Most pieces in one [`Request::RegMrWindow`].
pub const MAX_MR_SEGMENTS: usize = 64;

/// One piece of a [`Request::RegMrWindow`] mapping: `len` bytes (a multiple of 4096)
/// from byte `offset` (a multiple of 4096) of the memfd sent with the request
/// (`share: None`) or of the mapping of the client's live MR `share`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrSegment {
    /// The live MR whose mapping holds these pages, or `None` for the frame's memfd.
    pub share: Option<Handle>,
    /// Byte offset in that memfd or mapping.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Client → NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message on a connection; carries the client's doorbell memfd
    /// ([`super::doorbell::DOORBELL_SEGMENT_LEN`] bytes, zeroed). Reply:
    /// [`Reply::Opened`] + the wake pipe's write end and the NIC's life sign
    /// (`os::life_sign`, mapped read-only).
    OpenDevice {
        /// Must equal [`super::ABI_VERSION`].
        abi_version: u32,
        /// Client process id (for logs and stats).
        pid: u32,
        /// Client program name (for logs).
        program: String,
    },
    /// Reply: [`Reply::Device`].
    QueryDevice,
    /// Reply: [`Reply::Pd`].
    AllocPd,
    /// Reply: [`Reply::Done`].
    DeallocPd {
        /// PD handle.
        pd: Handle,
    },
    /// Registers the memfd sent with this frame (size ≥ `len`, sealed against
    /// shrinking), whose first byte the client addresses as `iova`.
    /// Reply: [`Reply::Mr`].
    RegMr {
        /// PD handle.
        pd: Handle,
        /// Region length in bytes.
        len: u64,
        /// `ibv_access_flags` bits.
        access: u32,
        /// Client virtual address of the region's first byte.
        iova: u64,
    },
    /// Registers `len` bytes from byte `offset` of a mapping the NIC assembles from
    /// `segments`, in order, addressed by the client as `iova`: an MR that need not
    /// start on a page (`ibv_reg_mr` of a struct field) and MRs that share pages. A
    /// memfd can be mapped writable by the NIC only once (its seal), so pages that a
    /// live MR already maps are named by that MR ([`MrSegment::share`]); new pages come
    /// in the memfd sent with this frame (at most one; sealed against shrinking).
    /// Reply: [`Reply::Mr`].
    RegMrWindow {
        /// PD handle.
        pd: Handle,
        /// Region length in bytes.
        len: u64,
        /// `ibv_access_flags` bits.
        access: u32,
        /// Client virtual address of the region's first byte.
        iova: u64,
        /// Offset of the region's first byte in the assembled mapping.
        offset: u64,
        /// The mapping's pieces, in order (at most [`MAX_MR_SEGMENTS`]).
        segments: Vec<MrSegment>,
    },
    /// Reply: [`Reply::Done`].
    DeregMr {
        /// MR handle.
        mr: Handle,
    },
    /// `ibv_rereg_mr` without a new translation: region `mr` moves to PD `pd` and/or
    /// takes the access flags `access` (`None`: unchanged), keeping its memory, address
    /// and keys. Memory windows bound to it are unbound, as by a deregistration.
    /// Reply: [`Reply::Done`].
    ReregMr {
        /// MR handle.
        mr: Handle,
        /// The new PD.
        pd: Option<Handle>,
        /// The new `ibv_access_flags` bits.
        access: Option<u32>,
    },
    /// Attaches the CQ segment sent with this frame (layout
    /// [`super::CqLayout::new`]`(depth)`, header initialised by the client).
    /// Reply: [`Reply::Cq`] + the read end of the CQ's event pipe, to which the NIC
    /// writes a byte when it publishes a completion to the armed CQ (CQ_ARMED). The
    /// NIC keeps the write end (non-blocking, an open file of its own: no client can
    /// make the NIC block on it); a full pipe is skipped.
    CreateCq {
        /// Requested depth.
        depth: u32,
    },
    /// Reply: [`Reply::Done`].
    DestroyCq {
        /// CQ handle.
        cq: Handle,
    },
    /// Attaches the QP segment sent with this frame (layout
    /// [`super::QpLayout::new`]`(caps.max_send_wr, caps.max_recv_wr, caps.sq_shape(qp_type))`).
    /// Reply: [`Reply::Qp`].
    CreateQp {
        /// PD handle.
        pd: Handle,
        /// Service type.
        qp_type: QpType,
        /// CQ for send completions.
        send_cq: Handle,
        /// CQ for receive completions.
        recv_cq: Handle,
        /// Capabilities. With `srq`, `max_recv_wr` only sizes the (unused) RQ ring:
        /// send 1.
        caps: QpCaps,
        /// The shared receive queue the QP takes its receive WQEs from
        /// (`ibv_qp_init_attr.srq`); it must be of the same client and PD.
        #[serde(default)]
        srq: Option<Handle>,
        /// [`QpType::XrcRecv`] only, and required there: its XRC domain (an OpenXrcd
        /// handle of this client; `ibv_qp_init_attr_ex.xrcd`). Such a QP has no PD and
        /// no CQs: `pd`, `send_cq` and `recv_cq` are 0; its rings are unused, so the
        /// client sends caps `max_send_wr` 1, `max_recv_wr` 1, `max_sge` 1,
        /// `max_inline` 0 and a segment of that layout. An XrcSend QP has a PD and a
        /// send CQ; its `recv_cq` is 0 and its RQ ring unused (`max_recv_wr` 1).
        #[serde(default)]
        xrcd: Option<Handle>,
    },
    /// Reply: [`Reply::Done`].
    ModifyQp {
        /// QP number.
        qpn: u32,
        /// Attributes (mask = the `Some` fields).
        attr: QpAttr,
    },
    /// Reply: [`Reply::QpInfo`].
    QueryQp {
        /// QP number.
        qpn: u32,
    },
    /// Reply: [`Reply::Done`].
    DestroyQp {
        /// QP number.
        qpn: u32,
    },
    /// Reply: [`Reply::Stats`].
    Stats,
    /// Attaches the SRQ segment sent with this frame (layout
    /// [`super::SrqLayout::new`]`(max_wr)`: one receive ring). Reply: [`Reply::Srq`].
    CreateSrq {
        /// PD handle.
        pd: Handle,
        /// Capabilities and the initial limit (0 = not armed).
        attr: SrqAttr,
        /// An XRC SRQ (`IBV_SRQT_XRC`): its XRC domain and the CQ its completions go
        /// to. `None`: a basic SRQ.
        #[serde(default)]
        xrc: Option<XrcSrqInit>,
    },
    /// `ibv_open_xrcd`. `inode`: the `(st_dev, st_ino)` of the file the client gave
    /// (`ibv_xrcd_init_attr.fd`), under which the NIC shares one domain between the
    /// opens of all clients of one user naming the same file; `None` (fd −1): a new
    /// domain nobody else can open. `create`: O_CREAT was given (without it, a file
    /// with no domain yet is `NotFound`; libibverbs answers EAGAIN, as the kernel).
    /// `exclusive`: O_EXCL too (a file with a domain already is `InvalidArgument`,
    /// checked and created in one step). Reply: [`Reply::Xrcd`].
    OpenXrcd {
        /// The file's identity, if a file was given.
        inode: Option<(u64, u64)>,
        /// `oflags` had O_CREAT.
        create: bool,
        /// `oflags` had O_CREAT and O_EXCL.
        #[serde(default)]
        exclusive: bool,
    },
    /// `ibv_close_xrcd`: drops this open (the domain lives while opens, XRC SRQs or
    /// XRC receive QPs hold it: `Busy` while an SRQ or QP of it remains and this is
    /// its last open). Reply: [`Reply::Done`].
    CloseXrcd {
        /// Handle from OpenXrcd.
        xrcd: Handle,
    },
    /// `ibv_modify_srq`: `None` = not in the mask. Resizing (`max_wr`) is not
    /// supported (the ring is fixed at creation); only the limit can be armed.
    /// Reply: [`Reply::Done`].
    ModifySrq {
        /// SRQ handle.
        srq: Handle,
        /// IBV_SRQ_MAX_WR.
        max_wr: Option<u32>,
        /// IBV_SRQ_LIMIT.
        srq_limit: Option<u32>,
    },
    /// Reply: [`Reply::SrqInfo`].
    QuerySrq {
        /// SRQ handle.
        srq: Handle,
    },
    /// Refused (`Busy`) while a QP uses it. Reply: [`Reply::Done`].
    DestroySrq {
        /// SRQ handle.
        srq: Handle,
    },
    /// Takes the client's pending asynchronous events (never blocks), object by object
    /// in the order each object's first pending event was noticed, each object's
    /// oldest first. Costs the objects with pending events, not the client's objects.
    /// Reply: [`Reply::AsyncEvents`].
    GetAsyncEvents,
    /// The connection manager ([`cm`]).
    Cm(cm::CmRequest),
    /// Registers `len` bytes from byte `offset` of the SysV shared-memory segment
    /// `shmid` (which the client has attached; `shmget` memory, e.g. perftest
    /// `--use_hugepages`), addressed by the client as `iova`. The NIC attaches the
    /// segment itself (zero-copy) if the client's uid owns it with read-write
    /// permission, and refuses hugetlb segments (their pages can vanish under a
    /// mapping: register those with [`Request::RegMrCopy`]). Reply: [`Reply::Mr`].
    RegMrSysv {
        /// PD handle.
        pd: Handle,
        /// Region length in bytes.
        len: u64,
        /// `ibv_access_flags` bits.
        access: u32,
        /// Client virtual address of the region's first byte.
        iova: u64,
        /// The segment (`shmget`'s id; the inode of its `/SYSV…` line in
        /// `/proc/<pid>/maps`).
        shmid: i32,
        /// Byte offset of the region's first byte in the segment.
        offset: u64,
    },
    /// Registers `[iova, iova + len)` of the client's memory, whatever backs it (the
    /// stack, `MAP_HUGETLB`, `/dev/shm` and other shared files): the frame carries the
    /// client's `/proc/self/mem` opened read-write, and the NIC copies through it
    /// (`pread`/`pwrite` at the client's addresses) — no mapping, so nothing the
    /// client does to that memory can fault in the NIC. Atomics on such a region are
    /// refused (a copy is not atomic against the client's CPU). Reply: [`Reply::Mr`].
    RegMrCopy {
        /// PD handle.
        pd: Handle,
        /// Region length in bytes.
        len: u64,
        /// `ibv_access_flags` bits.
        access: u32,
        /// Client virtual address of the region's first byte.
        iova: u64,
    },
    /// `ibv_alloc_mw`: a memory window of `mw_type` (1 or 2, IBTA 10.6.7) in `pd`,
    /// unbound. Reply: [`Reply::Mw`].
    AllocMw {
        /// PD handle.
        pd: Handle,
        /// 1 (bound with `ibv_bind_mw`) or 2 (bound with an `IBV_WR_BIND_MW` WR).
        mw_type: u8,
    },
    /// `ibv_dealloc_mw`: the window's R_Key stops working at once. Reply: [`Reply::Done`].
    DeallocMw {
        /// MW handle.
        mw: Handle,
    },
    /// Binds window `mw` to `[addr, addr + len)` of region `mr` with `access`
    /// (remote rights only) under the new R_Key `rkey` (same index as the window's,
    /// new key byte), on behalf of QP `qpn` (IBTA 10.6.7.2). A type 1 window with
    /// `len` 0 is unbound. The client then posts the bind's WQE for its completion.
    /// Reply: [`Reply::Done`].
    BindMw {
        /// The QP the bind is posted on (same client and PD).
        qpn: u32,
        /// MW handle.
        mw: Handle,
        /// MR handle (ignored when `len` is 0).
        mr: Handle,
        /// The R_Key the window answers to after the bind.
        rkey: u32,
        /// First byte (client virtual address).
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// `ibv_access_flags` bits.
        access: u32,
    },
    /// Invalidates the type 2 window whose R_Key is `rkey` (`IBV_WR_LOCAL_INV`, IBTA
    /// 10.6.7.2.4), on behalf of QP `qpn` (same PD). Reply: [`Reply::Done`].
    InvalidateMw {
        /// The QP the invalidation is posted on.
        qpn: u32,
        /// The window's current R_Key.
        rkey: u32,
    },
    /// `ibv_resize_cq`: the NIC moves the completions not yet polled into the CQ segment
    /// sent with this frame (layout [`super::CqLayout::new`]`(depth)`, header
    /// initialised by the client) and completes into it from then on; the CQ keeps its
    /// handle and event pipe. InvalidArgument when more than `depth` completions wait
    /// (rxe's rule). The client must not poll the old ring meanwhile.
    /// Reply: [`Reply::Cq`] (no descriptor).
    ResizeCq {
        /// CQ handle.
        cq: Handle,
        /// Requested depth.
        depth: u32,
    },
    /// The read end of a pipe the NIC writes a byte to when the client's list of
    /// pending asynchronous events goes from empty to not empty, so a watcher can block
    /// in `poll(2)` and send [`Request::GetAsyncEvents`] only when there is something
    /// to take. Read the pipe empty *before* asking, so an event noticed after the
    /// answer writes again. One pipe per connection: asking again returns the same
    /// pipe. The NIC keeps the write end (non-blocking, an open file of its own: no
    /// client can make the NIC block on it). Reply: [`Reply::Done`] + the read end.
    AsyncEventChannel,
    /// `ibv_attach_mcast`: the UD QP `qpn` receives the datagrams sent to the multicast
    /// group `gid` (an IPv4-mapped `::ffff:224.0.0.0/4` or an IPv6 `ff00::/8` address of
    /// the NIC's family) from now on. Attaching a QP twice is no error. InvalidArgument
    /// for a QP that is not UD or a GID that is not such a group, NoResources past
    /// [`super::MAX_MCAST_GRP`] groups or [`super::MAX_MCAST_QP_ATTACH`] QPs in one
    /// group. Reply: [`Reply::Done`].
    AttachMcast {
        /// QP number.
        qpn: u32,
        /// The group's GID.
        gid: [u8; 16],
    },
    /// `ibv_detach_mcast`: undoes [`Request::AttachMcast`]. InvalidArgument when the QP
    /// is not attached to the group. Destroying a QP detaches it from every group.
    /// Reply: [`Reply::Done`].
    DetachMcast {
        /// QP number.
        qpn: u32,
        /// The group's GID.
        gid: [u8; 16],
    },
}

/// An XRC SRQ's creation attributes beyond a basic SRQ's
/// (`ibv_srq_init_attr_ex.xrcd` and `.cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct XrcSrqInit {
    /// The XRC domain (an OpenXrcd handle of this client).
    pub xrcd: Handle,
    /// The CQ every completion of the SRQ's WQEs goes to.
    pub cq: Handle,
}

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SrqAttr {
    /// Most WQEs outstanding in the SRQ.
    pub max_wr: u32,
    /// SGEs per WQE (≤ [`super::MAX_SGE`]).
    pub max_sge: u32,
    /// The armed limit (0 = not armed).
    pub srq_limit: u32,
}

/// An affiliated asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AsyncEvent {
    /// IBV_EVENT_SRQ_LIMIT_REACHED: fewer WQEs than the armed limit remain in the SRQ;
    /// the SRQ is disarmed.
    SrqLimitReached {
        /// SRQ handle.
        srq: Handle,
    },
    /// IBV_EVENT_SRQ_ERR: the SRQ entered the error state.
    SrqErr {
        /// SRQ handle.
        srq: Handle,
    },
    /// IBV_EVENT_QP_LAST_WQE_REACHED: a QP on an SRQ entered the error state and will
    /// complete no more of the SRQ's receive WQEs.
    QpLastWqeReached {
        /// QP number.
        qpn: u32,
    },
    /// IBV_EVENT_COMM_EST: an RC/UC QP in RTR received its first packet (IBTA
    /// 11.6.3.1).
    CommEst {
        /// QP number.
        qpn: u32,
    },
    /// IBV_EVENT_QP_REQ_ERR: the QP, as responder, NAKed an invalid request and
    /// entered the error state (IBTA 11.6.3.2 Invalid Request Local WQ Error).
    QpReqErr {
        /// QP number.
        qpn: u32,
    },
    /// IBV_EVENT_QP_ACCESS_ERR: the QP, as responder, found an access violation (bad
    /// R_Key or range, or its receive buffer's L_Key) and entered the error state
    /// (IBTA 11.6.3.2 Local Access Violation WQ Error).
    QpAccessErr {
        /// QP number.
        qpn: u32,
    },
    /// IBV_EVENT_QP_FATAL: the NIC moved the QP to the error state for a local
    /// catastrophic reason: its client's ring was corrupt, or a CQ it completes to
    /// was full (IBTA 11.6.3.2 Local Work Queue Catastrophic Error).
    QpFatal {
        /// QP number.
        qpn: u32,
    },
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// To OpenDevice; the wake pipe's write end comes with this frame.
    Opened {
        /// The device.
        device: DeviceAttr,
    },
    /// To QueryDevice.
    Device(DeviceAttr),
    /// To AllocPd.
    Pd {
        /// New PD handle.
        pd: Handle,
    },
    /// To RegMr.
    Mr {
        /// New MR handle.
        mr: Handle,
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// To CreateCq; the read end of the CQ's event pipe comes with this frame.
    Cq {
        /// New CQ handle.
        cq: Handle,
        /// Ring capacity (the depth rounded up to a power of two).
        capacity: u32,
    },
    /// To CreateQp.
    Qp {
        /// New QP number.
        qpn: u32,
        /// Capabilities granted (≥ requested).
        caps: QpCaps,
        /// Its slot on the client's doorbell page ([`super::doorbell`]).
        doorbell: u32,
    },
    /// To OpenXrcd.
    Xrcd {
        /// The open's handle.
        xrcd: Handle,
    },
    /// To CreateSrq.
    Srq {
        /// New SRQ handle.
        srq: Handle,
        /// An XRC SRQ's number (`ibv_get_srq_num`): what XRC senders name in their
        /// work requests and the XRCETH carries; random, 24 bits, never 0. 0 for a
        /// basic SRQ.
        #[serde(default)]
        srq_num: u32,
        /// Granted attributes (`max_wr` is the ring capacity).
        attr: SrqAttr,
        /// Its slot on the client's doorbell page ([`super::doorbell`]).
        doorbell: u32,
    },
    /// To QuerySrq.
    SrqInfo(SrqAttr),
    /// To GetAsyncEvents, oldest first.
    AsyncEvents(Vec<AsyncEvent>),
    /// To QueryQp.
    QpInfo {
        /// Current state.
        state: QpState,
        /// Current attributes (every field the QP has set).
        attr: QpAttr,
    },
    /// Done, nothing to return.
    Done,
    /// To Stats: named counters.
    Stats {
        /// `(name, value)` pairs.
        counters: Vec<(String, u64)>,
    },
    /// To a CM request.
    Cm(cm::CmReply),
    /// To AllocMw.
    Mw {
        /// New MW handle.
        mw: Handle,
        /// Its initial R_Key (bits 8..32 name the window, bits 0..8 are the key).
        rkey: u32,
    },
}

/// Why a request failed (the class; the message says the details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// A malformed or out-of-range argument (EINVAL).
    InvalidArgument,
    /// No such handle/QPN for this client (ENOENT).
    NotFound,
    /// The object is in the wrong state (e.g. an illegal QP transition) (EINVAL).
    InvalidState,
    /// Out of a resource or over a limit (ENOMEM).
    NoResources,
    /// The object is still in use (e.g. a PD with QPs, a CQ with QPs) (EBUSY).
    Busy,
    /// The client and NIC speak different ABI versions.
    AbiMismatch,
    /// The request arrived without the descriptors it needs, or with extra ones.
    Protocol,
    /// A bug or an OS error in the NIC.
    Internal,
}

/// NIC → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Success.
    Ok(Reply),
    /// Failure, with a message that says what was wrong.
    Err {
        /// Class.
        code: ErrorCode,
        /// Human-readable detail, e.g. "QP 0x12: RTR needs dest_qpn, rq_psn, path_mtu, remote".
        message: String,
    },
}

/// Why a frame could not be sent or received.
#[derive(Debug)]
pub enum ControlError {
    /// An OS error.
    Io(io::Error),
    /// The peer closed the connection between frames.
    Closed,
    /// The peer closed the connection in the middle of a frame.
    Truncated {
        /// Bytes of the frame received.
        have: usize,
        /// Bytes of the frame expected.
        need: usize,
    },
    /// The length prefix exceeds [`MAX_FRAME`] (or is 0).
    BadLength {
        /// Announced length.
        len: u32,
    },
    /// More than [`MAX_FDS`] descriptors arrived with one frame (all were closed).
    TooManyFds,
    /// The frame is not valid JSON for the expected message type.
    Json(serde_json::Error),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Io(e) => write!(f, "control socket: {e}"),
            ControlError::Closed => write!(f, "control connection closed"),
            ControlError::Truncated { have, need } => write!(
                f,
                "control connection closed mid-frame ({have} of {need} bytes)"
            ),
            ControlError::BadLength { len } => {
                write!(f, "control frame length {len} is outside 1..={MAX_FRAME}")
            }
            ControlError::TooManyFds => {
                write!(f, "more than {MAX_FDS} descriptors with one control frame")
            }
            ControlError::Json(e) => write!(f, "malformed control message: {e}"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Io(e) => Some(e),
            ControlError::Json(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for ControlError {
    fn from(e: io::Error) -> Self {
        ControlError::Io(e)
    }
}

/// Serialises `msg` as one frame (length prefix + JSON).
pub fn encode<M: Serialize>(msg: &M) -> Result<Vec<u8>, ControlError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg).map_err(ControlError::Json)?;
    let len = buf.len() - 4;
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    if len == 0 || len > MAX_FRAME {
        return Err(ControlError::BadLength { len: len32 });
    }
    buf[..4].copy_from_slice(&len32.to_le_bytes());
    Ok(buf)
}

/// Sends `msg` as one frame with `fds` attached (blocking socket; a short write is
/// completed with further writes, the descriptors going with the first).
///
/// Takes `BorrowedFd`s rather than raw integers so the caller cannot pass a closed
/// descriptor by mistake; `owned.as_fd()` gives one.
pub fn send_msg<M: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &M,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ControlError> {
    if fds.len() > MAX_FDS {
        return Err(ControlError::TooManyFds);
    }
    let frame = encode(msg)?;
    let mut sent = os::send_with_fds(sock, &frame, fds)?;
    // Bounded: each iteration sends at least one byte or returns an error.
    while sent < frame.len() {
        let n = os::send_with_fds(sock, &frame[sent..], &[])?;
        if n == 0 {
            return Err(ControlError::Io(io::ErrorKind::WriteZero.into()));
        }
        sent += n;
    }
    Ok(())
}

/// One received frame: its JSON bytes and the descriptors that came with it.
pub type Frame = (Vec<u8>, Vec<OwnedFd>);

/// Reassembles frames from a stream socket, blocking or non-blocking.
///
/// Keeps at most one partial frame (≤ 4 + [`MAX_FRAME`] bytes) and ≤ [`MAX_FDS`]
/// descriptors per connection. For a non-blocking socket, call [`FrameReader::read`]
/// whenever poll(2) says readable; it returns `Ok(None)` when the frame is incomplete.
#[derive(Debug, Default)]
pub struct FrameReader {
    header: [u8; 4],
    header_have: usize,
    body: Vec<u8>,
    body_have: usize,
    fds: Vec<OwnedFd>,
}

impl FrameReader {
    /// A reader with no partial frame.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when part of a frame has been read.
    pub fn in_frame(&self) -> bool {
        self.header_have > 0
    }

    /// Reads until one frame is complete (returns its JSON bytes and descriptors), the
    /// socket would block (`Ok(None)`), or an error. After an error the connection is
    /// unusable: close it.
    pub fn read(&mut self, sock: BorrowedFd<'_>) -> Result<Option<Frame>, ControlError> {
        // Bounded: every iteration reads ≥ 1 byte, returns, or errors, and a frame has
        // at most 4 + MAX_FRAME bytes.
        loop {
            let (buf, need) = if self.header_have < 4 {
                (&mut self.header[self.header_have..], 4)
            } else {
                let need = self.body.len();
                (&mut self.body[self.body_have..], need)
            };
            let r = match os::recv_with_fds(sock, buf, MAX_FDS) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let truncated = r.fds_truncated;
            self.fds.extend(r.fds);
            if truncated || self.fds.len() > MAX_FDS {
                self.fds.clear(); // closes them
                return Err(ControlError::TooManyFds);
            }
            if r.len == 0 {
                return Err(if self.header_have == 0 {
                    ControlError::Closed
                } else {
                    let have = self.header_have + self.body_have;
                    ControlError::Truncated {
                        have,
                        need: if self.header_have < 4 { 4 } else { 4 + need },
                    }
                });
            }
            if self.header_have < 4 {
                self.header_have += r.len;
                if self.header_have == 4 {
                    let len = u32::from_le_bytes(self.header);
                    if len == 0 || len as usize > MAX_FRAME {
                        self.fds.clear();
                        return Err(ControlError::BadLength { len });
                    }
                    self.body = vec![0u8; len as usize];
                    self.body_have = 0;
                }
            } else {
                self.body_have += r.len;
            }
            if self.header_have == 4 && self.body_have == self.body.len() {
                let body = core::mem::take(&mut self.body);
                let fds = core::mem::take(&mut self.fds);
                self.header_have = 0;
                self.body_have = 0;
                return Ok(Some((body, fds)));
            }
        }
    }

    /// [`FrameReader::read`] and decode the JSON as `M`.
    pub fn read_msg<M: DeserializeOwned>(
        &mut self,
        sock: BorrowedFd<'_>,
    ) -> Result<Option<(M, Vec<OwnedFd>)>, ControlError> {
        match self.read(sock)? {
            None => Ok(None),
            Some((body, fds)) => {
                let m = serde_json::from_slice(&body).map_err(ControlError::Json)?;
                Ok(Some((m, fds)))
            }
        }
    }
}

/// Receives one message from a blocking socket.
pub fn recv_msg<M: DeserializeOwned>(
    sock: BorrowedFd<'_>,
) -> Result<(M, Vec<OwnedFd>), ControlError> {
    let mut r = FrameReader::new();
    match r.read_msg(sock)? {
        Some(v) => Ok(v),
        // Only a non-blocking (or timed-out) socket gets here.
        None => Err(ControlError::Io(io::ErrorKind::WouldBlock.into())),
    }
}

/// Sends `req` with `fds` and waits for the response (the client's RPC).
///
/// A NIC that refuses a connection (over its connection limits) answers it with one
/// error frame and closes it, possibly before the first request is sent. So when the
/// send fails because the NIC is gone, the error frame it left, if any, is returned
/// instead: the caller learns why rather than "broken pipe".
pub fn call(
    sock: &impl AsFd,
    req: &Request,
    fds: &[BorrowedFd<'_>],
) -> Result<(Response, Vec<OwnedFd>), ControlError> {
    if let Err(e) = send_msg(sock.as_fd(), req, fds) {
        let gone = matches!(&e, ControlError::Io(io) if matches!(
            io.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ));
        if gone {
            if let Ok(parting @ (Response::Err { .. }, _)) = recv_msg(sock.as_fd()) {
                return Ok(parting);
            }
        }
        return Err(e);
    }
    recv_msg(sock.as_fd())
}

#[cfg(test)]
mod tests;

pub mod cm;
