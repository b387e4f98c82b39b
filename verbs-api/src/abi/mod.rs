//! The shared-memory ABI between a client (`verbs-api`) and the NIC process (`softnic run`).
//!
//! Both processes compile this module, so there is exactly one definition of every byte
//! they share (as rdma-core keeps one ABI header for the kernel and user space).
//!
//! ```text
//!  client process                                  softnic process
//!  ──────────────                                  ───────────────
//!  QP segment (memfd, created by the client) ─────► mapped by the NIC too
//!    [SQ ring: RingHeader | SendWqe × cap]          client produces, NIC consumes
//!    [RQ ring: RingHeader | RecvWqe × cap]          client produces, NIC consumes
//!  SRQ segment (memfd, created by the client) ────► mapped by the NIC too
//!    [SRQ ring: RingHeader | RecvWqe × cap]         client produces, NIC consumes
//!  doorbell page (memfd, one per client)    ─────► mapped by the NIC too
//!    [flags | summary | bitmap: a bit per ring]     client sets bits, NIC takes them
//!  CQ segment (memfd, created by the client) ─────► mapped by the NIC too
//!    [CQ ring: RingHeader | Cqe × cap]              NIC produces, client consumes
//!  MR segment (memfd per region)             ─────► the NIC's "DMA" target
//! ```
//!
//! * [`doorbell`]: the per-client doorbell page (which rings have new entries).
//! * [`ring`]: the single-producer single-consumer ring (io_uring / AF_XDP cursors) and the
//!   wake-up flag protocol.
//! * [`slots`]: the fixed-size entries ([`SendWqe`], [`RecvWqe`], [`Cqe`]).
//! * [`layout`]: where each ring sits in a segment and how big segments are.
//! * [`control`]: the control-socket messages and their framing (slow path).
//!
//! # Wake-ups: doorbells, NEED_WAKEUP and CQ_ARMED (io_uring SQPOLL model)
//!
//! A client tells the NIC which of its rings it posted to through its *doorbell page*
//! ([`doorbell`]): one bit per QP or SRQ, so the NIC reads only rings that were rung.
//! [`NEED_WAKEUP`] lives in that page's `flags` (one per client); [`CQ_ARMED`] is bit 1
//! of a CQ ring's `flags`. Both are a Dekker-style handshake: each side *stores* its
//! own variable, issues `fence(SeqCst)`, then *loads* the other side's variable, so at
//! least one of the two sides sees the other's store and no wake-up is lost.
//!
//! NIC going to sleep:
//! 1. `flags.fetch_or(NEED_WAKEUP, SeqCst)` on every client's doorbell page;
//! 2. `fence(SeqCst)`;
//! 3. re-read every page's summary words. If any is non-zero, clear the flags and keep
//!    polling; otherwise block in poll(2) on the wake eventfds;
//! 4. after waking, clear NEED_WAKEUP (`fetch_and(!NEED_WAKEUP)`) while it polls.
//!
//! Client posting (producer of SQ/RQ/SRQ), [`doorbell::Doorbell::ring`]:
//! 1. write the entries, then `producer.store(tail, Release)`;
//! 2. set the ring's doorbell bit (and its summary bit), `fetch_or(Release)`;
//! 3. `fence(SeqCst)`; `flags.load(Relaxed)`; only if NEED_WAKEUP is set, write(2) 1 to
//!    the wake eventfd that the NIC passed at OpenDevice. Otherwise no syscall at all.
//!
//! Client waiting on a CQ (consumer), [`ring::Consumer::arm`]:
//! 1. `flags.fetch_or(CQ_ARMED, SeqCst)`; 2. `fence(SeqCst)`; 3. re-check the ring
//!    (Acquire). If it is non-empty, do not sleep. Otherwise block on the CQ's event
//!    pipe (its read end passed by the NIC at CreateCq); after waking, read the pipe
//!    empty and poll again.
//!
//! NIC pushing a CQE (producer), [`ring::Producer::publish_and_take`]:
//! 1. write the CQE, `producer.store(tail, Release)`; 2. `fence(SeqCst)`;
//! 3. if `flags` has CQ_ARMED, `fetch_and(!CQ_ARMED)`; if this call cleared it, write(2)
//!    one byte to the CQ's event pipe (so one arm gives at most one wake-up, as
//!    `ibv_req_notify_cq`; a full pipe is skipped, never waited on).
//!
//! NIC flushing any CQ of a client also bumps that client's completion sequence on its
//! doorbell page before the fence, and after it wakes a poller that sleeps on the
//! sequence (hybrid polling, [`doorbell`]'s module docs).
//!
//! # Trust
//! The NIC treats every byte of a client segment as hostile: it never uses the header's
//! `capacity`/`entry_size` except to check them against the values it computed itself
//! from the control message, it validates every index it reads (`producer − consumer ≤
//! capacity`, else the ring is corrupt: the NIC moves the QP to ERR and counts it), it
//! copies each entry out before looking at it, and it never reads or writes outside the
//! mapping. Memfds are checked, mapped and sealed by [`crate::os::map_peer_shm`] so that a
//! client cannot make the NIC's mapping fault with SIGBUS.

pub mod control;
pub mod doorbell;
pub mod layout;
pub mod ring;
pub mod slots;

pub use doorbell::{Doorbell, DOORBELL_SEGMENT_LEN, DOORBELL_SLOTS};
pub use layout::{CqLayout, LayoutError, QpLayout, SqShape, SrqLayout};
pub use ring::{CachePadded, Consumer, Producer, Ring, RingError, RingHeader};
pub use slots::{Cqe, RecvWqe, SendWqe, Sge, Slot, UdDest};

/// Doorbell page flag bit 0 ([`doorbell`]): the NIC is asleep or about to be; a client
/// that rings a doorbell must write the wake eventfd. Set and cleared by the NIC only.
pub const NEED_WAKEUP: u32 = 1 << 0;

/// Ring flag bit 1 (CQ rings): the client waits for a completion on this CQ; the NIC
/// clears the bit and writes the CQ's event pipe when it next publishes a CQE. Set by the
/// client, cleared by the NIC (or by the client when it gives up waiting).
pub const CQ_ARMED: u32 = 1 << 1;

/// Version of this ABI; sent in OpenDevice so that mismatched builds refuse each other.
/// 2: the doorbell page (OpenDevice carries it; CreateQp/CreateSrq return a slot).
/// 3: CreateCq returns the read end of a pipe the NIC writes, not an eventfd (which the
/// client shared with the NIC and could make block it).
/// 4: the doorbell page's hybrid-polling line (a CQ flush bumps the client's completion
/// sequence and wakes a poller sleeping on it).
/// 5: the hybrid-polling line also counts the client's send WQEs the NIC retired
/// (`sends_retired`: a poller with deep queued work naps).
/// 6: a send ring's slots are only as far apart as the QP's `max_inline` needs
/// (`layout::send_wqe_stride`; the header's `entry_size` is that stride).
/// 7: a send WQE's gather list comes right after its fixed fields (a one-entry WQE is
/// its first 64 bytes), the UD destination after the gather list and only with
/// `send_flags::UD_DEST`; the stride follows the QP's `max_sge` too (`SqShape`).
/// 8: an inline payload lies over the gather list unless the WQE carries a UD
/// destination (`SendWqe::inline_offset`); a QP is granted the inline room its stride
/// has (`SqShape::inline_capacity`).
/// 9: OpenDevice's answer carries a second descriptor, the NIC's life sign
/// (`os::life_sign`): a page the client maps read-only and reads to learn that the
/// NIC has exited.
/// 10: `AttachMcast` / `DetachMcast` requests (UD multicast).
/// 11: `CmRequest::SetAckTimeout` (`RDMA_OPTION_ID_ACK_TIMEOUT`).
/// 12: traffic classes: `control::QpAttr::traffic_class` (the address vector's) and
/// `UdDest::traffic_class` (a UD work request's), put in each packet's IP TOS.
/// 13: `CmEventUd::traffic_class` (a UD id's TOS in its ESTABLISHED address).
/// 14: `ReregMr`.
/// 15: XRC: `QpType::XrcSend`/`XrcRecv`, `OpenXrcd`/`CloseXrcd`, `CreateSrq::xrc`,
/// `CreateQp::xrcd`, `Reply::Srq::srq_num`, `send_flags::XRC_SRQN`.
/// 16: `CmRequest::Listen::qp_type`, `CmRequest::Connect::qp_type`,
/// `CmEventMsg::space`; `RDMA_PS_IB` (RC and XRC connections).
/// 17: `wr_opcode::ATOMIC_WRITE` (its 8 bytes in `SendWqe::compare_add`),
/// `wc_opcode::ATOMIC_WRITE`.
pub const ABI_VERSION: u32 = 17;

/// The BTH destination QPN of every multicast datagram (IBTA 9.6.1.1): what a sender
/// addresses a group's QPs with, never a QP's own number.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Most multicast groups one NIC has QPs attached to (`ibv_device_attr.max_mcast_grp`):
/// each is a socket the NIC holds open (`softnic/src/nic/mcast.rs`).
pub const MAX_MCAST_GRP: u32 = 64;

/// Most QPs attached to one multicast group (`max_mcast_qp_attach`; rxe's 56).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;

/// Most scatter/gather entries in one work request (the same as the transport's limit).
pub const MAX_SGE: usize = 4;

/// Most inline bytes in one send work request.
pub const MAX_INLINE: usize = 256;

/// Most entries in one work queue ring (send, receive, SRQ): a larger request is
/// refused. It bounds the WQEs one QP can queue (and the NIC can be made to map) for
/// each `max_qp_wr`, as rxe's 32768 (`RXE_MAX_QP_WR`) does.
pub const MAX_RING_ENTRIES: u32 = 1 << 15;

/// Most entries in one completion queue ring, the device's `max_cqe`. Larger than a work
/// queue's: programs size one CQ for all their QPs. perftest's `ib_write_bw -q N`
/// creates one send CQ of `tx_depth` × N entries (128,000 at `-q 1000`, 1,280,000 at
/// `-q 10000`), which rxe's 32767 refuses ("Couldn't create CQ"); ConnectX devices
/// report 4,194,303. A CQ ring costs 40 bytes per entry of client memory, mapped by
/// both sides and counted against the user's mapped-bytes quota (`nic/quota.rs`);
/// untouched pages cost nothing.
pub const MAX_CQ_ENTRIES: u32 = 1 << 22;
