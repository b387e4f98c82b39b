//! The queue pair: one sans-IO state machine per QP (the quinn-proto `Connection`
//! pattern).
//!
//! ```text
//!   post_send ──► SQ ──► requester ──► poll_transmit ──► (NIC: ICRC, UDP send)
//!                  ▲                                            
//!                  └── completer ◄── handle_packet(ACK/NAK/READ resp/atomic ACK)
//!   post_recv ──► RQ ──► responder ◄── handle_packet(requests) ──► responses queue
//!                               └──► poll_transmit(ACK/NAK/READ resp/atomic ACK)
//!   completions ◄── completer, responder, flush     poll_timeout / handle_timeout
//! ```
//!
//! * [`state`] — states, and legal transitions declared as data.
//! * `requester` — send WQEs → request packets: opcode choice from the `wire` table,
//!   PSN assignment, the outstanding window, the AckReq policy, go-back-N rewinds.
//! * `responder` — the receive pipeline for requests, and the queue of responses.
//! * `completer` — responses → retired WQEs → completions; retry and RNR counters.
//! * `events` — the affiliated events raised and not yet taken, and their order.
//! * `cwnd` — how many request PSNs may be outstanding (halved by each retry).
//! * `timers` — the retransmission and RNR timers.
//! * `rto` — when the retransmission timer fires (adaptive, bounded by the Local ACK
//!   Timeout) and which expiries cost a retry.
//! * `peer_rtt` — the RTT estimate shared by all QPs to one peer NIC, and when a QP's
//!   own estimate is too old to trust.
//! * `placement` — where a received packet's payload would be written (the NIC's
//!   single pass writes it there before the ICRC check), and the memory that skips
//!   that write when handling makes it.
//! * [`window`] — the requester's PSN window, the one owner of send-side PSN
//!   arithmetic and of the "span < 2^23" invariant.
//!
//! The caller (the NIC runtime) owns all I/O: it parses the datagram and checks its
//! ICRC (for a packet [`Qp::placement`] allows, after writing its payload there:
//! `placement`), demultiplexes by destination QPN, calls [`Qp::handle_packet`] (a QP on
//! an SRQ: [`Qp::handle_packet_srq`]; an XRC receive QP: [`Qp::handle_packet_xrc`],
//! with the XRC SRQ the packet's XRCETH names); it calls [`Qp::poll_transmit`] until `None`, fills the ICRC of each packet, and sends it to
//! [`Transmit::dest`] from UDP source port [`Transmit::src_port`]; it drains
//! [`Qp::poll_completion`]; and it calls [`Qp::handle_timeout`] when
//! [`Qp::poll_timeout`] has passed. Nothing here blocks, allocates per packet, or
//! panics on packet contents.

mod completer;
mod counters;
mod cwnd;
mod events;
mod peer_rtt;
mod placement;
mod requester;
mod responder;
mod responses;
mod rto;
mod served;
mod sq_pool;
pub mod state;
mod timers;
mod ud;
pub mod window;

use std::collections::VecDeque;

use core::net::SocketAddr;

use crate::memory::{Access, Memory};
use crate::time::Instant;
use crate::wr::{Completion, Queue, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, MAX_SGE};

pub use counters::QpCounters;
pub use cwnd::{MAX_OUTSTANDING_PSNS, MIN_CWND};
pub use peer_rtt::{PeerRtt, STALE_RTOS};
pub use placement::{Placed, Placement, Target};
pub use requester::{ACK_REQ_INTERVAL, DEEP_QUEUE};
pub use responder::{disposition, Disposition, NakKind, RespError};
pub use rto::{AckTimer, MIN_RTO};
pub use state::{AttrMask, QpState, QpType, TransitionError};
pub use ud::{synth_grh, ReceivedIp};
pub use window::{max_msg_len, MAX_MSG_BYTES};

use events::QpEvents;
use requester::Requester;
use responder::Responder;
use timers::Timers;

/// Path MTUs a QP accepts, in bytes (IBTA 9.2: 256, 512, 1024, 2048, 4096).
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// The longest message every connected QP can carry whatever its path MTU: what the
/// NIC reports as `max_msg_sz`. It is [`max_msg_len`] at the smallest MTU, 256:
/// 2^31 − 256 bytes (2^23 − 1 packets; from MTU 512 up a QP carries 2^31).
pub const MAX_MSG_SZ: u32 = max_msg_len(PATH_MTUS[0]);

/// The MTU used for UD messages (which have no path MTU attribute) until
/// [`Qp::set_port_mtu`] says otherwise.
pub const DEFAULT_PORT_MTU: u32 = 4096;

/// Bytes a receive buffer of a UD QP reserves for the Global Route Header: verbs
/// applications expect the first 40 bytes of every UD receive to hold the GRH (IBTA
/// 11.4.1.2 `Post Receive Request` for UD), and Linux rxe writes it for RoCEv2 too.
pub const GRH_LEN: u32 = 40;

/// Capacities of a QP's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Most send WQEs queued (posted and not yet completed).
    pub max_send_wr: u32,
    /// Most receive WQEs queued.
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per WQE (at most [`MAX_SGE`]).
    pub max_sge: u32,
    /// Most inline bytes per send WQE (at most [`crate::wr::MAX_INLINE`]).
    pub max_inline: u32,
}

/// Attributes for [`Qp::modify`]; `None` = not in the attribute mask (as
/// `ibv_modify_qp` with a mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// IBV_QP_STATE: the state to move to. `None` keeps the current state (a
    /// same-state modify such as RTS→RTS).
    pub state: Option<QpState>,
    /// IBV_QP_PATH_MTU, in bytes: one of [`PATH_MTUS`].
    pub path_mtu: Option<u32>,
    /// IBV_QP_DEST_QPN.
    pub dest_qpn: Option<u32>,
    /// IBV_QP_RQ_PSN: the first PSN the responder expects.
    pub rq_psn: Option<u32>,
    /// IBV_QP_SQ_PSN: the first PSN the requester sends.
    pub sq_psn: Option<u32>,
    /// IBV_QP_AV: the peer NIC's UDP endpoint (derived from its GID).
    pub remote: Option<SocketAddr>,
    /// IBV_QP_AV's `grh.traffic_class`: the IP TOS / IPv6 traffic class (DSCP and
    /// ECN) of every packet the QP sends, ACKs and READ responses included, as rxe and
    /// hardware RNICs mark them. Part of the address vector: taken only with `remote`.
    pub traffic_class: u8,
    /// IBV_QP_TIMEOUT: local ACK timeout 4.096 µs × 2^timeout; 0 = infinite
    /// (IBTA 9.7.6.1.3).
    pub timeout: Option<u8>,
    /// IBV_QP_RETRY_CNT: retries after a timeout or NAK (0..=7; a plain count).
    pub retry_cnt: Option<u8>,
    /// IBV_QP_RNR_RETRY: retries after an RNR NAK (0..=7; 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// IBV_QP_MIN_RNR_TIMER: the RNR timer code this responder puts in RNR NAKs.
    pub min_rnr_timer: Option<u8>,
    /// IBV_QP_MAX_QP_RD_ATOMIC: READ/atomic requests this requester keeps outstanding.
    pub max_rd_atomic: Option<u8>,
    /// IBV_QP_MAX_DEST_RD_ATOMIC: READ/atomic requests this responder serves at once.
    pub max_dest_rd_atomic: Option<u8>,
    /// IBV_QP_ACCESS_FLAGS: remote operations the responder allows on this QP.
    pub access: Option<Access>,
    /// IBV_QP_QKEY (UD).
    pub qkey: Option<u32>,
    /// IBV_QP_PKEY_INDEX (only index 0, the default P_Key 0xFFFF, exists).
    pub pkey_index: Option<u16>,
    /// IBV_QP_PORT (only port 1 exists).
    pub port_num: Option<u8>,
}

impl QpAttr {
    /// These attributes less those a QP of `qp_type` does not have, which
    /// `ibv_modify_qp` ignores rather than refuses: an XRC send QP has no responder
    /// (`max_dest_rd_atomic`, `min_rnr_timer`), an XRC receive QP no requester
    /// (`max_rd_atomic`, `retry_cnt`, `rnr_retry`). The kernel strips them before its
    /// transition check (`modify_qp_mask` in uverbs_cmd.c), and perftest's `-c XRC`
    /// passes RC's full masks to both halves.
    pub fn for_type(&self, qp_type: QpType) -> QpAttr {
        match qp_type {
            QpType::XrcSend => QpAttr {
                max_dest_rd_atomic: None,
                min_rnr_timer: None,
                ..*self
            },
            QpType::XrcRecv => QpAttr {
                max_rd_atomic: None,
                retry_cnt: None,
                rnr_retry: None,
                ..*self
            },
            _ => *self,
        }
    }

    /// The attribute mask these fields make (`ibv_qp_attr_mask` bits).
    pub fn mask(&self) -> AttrMask {
        let bits = [
            (self.state.is_some(), AttrMask::STATE),
            (self.path_mtu.is_some(), AttrMask::PATH_MTU),
            (self.dest_qpn.is_some(), AttrMask::DEST_QPN),
            (self.rq_psn.is_some(), AttrMask::RQ_PSN),
            (self.sq_psn.is_some(), AttrMask::SQ_PSN),
            (self.remote.is_some(), AttrMask::AV),
            (self.timeout.is_some(), AttrMask::TIMEOUT),
            (self.retry_cnt.is_some(), AttrMask::RETRY_CNT),
            (self.rnr_retry.is_some(), AttrMask::RNR_RETRY),
            (self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER),
            (self.max_rd_atomic.is_some(), AttrMask::MAX_QP_RD_ATOMIC),
            (
                self.max_dest_rd_atomic.is_some(),
                AttrMask::MAX_DEST_RD_ATOMIC,
            ),
            (self.access.is_some(), AttrMask::ACCESS_FLAGS),
            (self.qkey.is_some(), AttrMask::QKEY),
            (self.pkey_index.is_some(), AttrMask::PKEY_INDEX),
            (self.port_num.is_some(), AttrMask::PORT),
        ];
        bits.iter()
            .filter(|(on, _)| *on)
            .fold(AttrMask::NONE, |a, (_, b)| a.or(*b))
    }
}

/// Where the packet written by [`Qp::poll_transmit`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written at the start of the caller's buffer: BTH … a zeroed ICRC slot.
    pub len: usize,
    /// Destination UDP endpoint.
    pub dest: SocketAddr,
    /// UDP source port, as rxe picks it ([`rxe_udp_src_port`] for RC/UC,
    /// [`rxe_ud_udp_src_port`] for UD).
    pub src_port: u16,
    /// IP TOS / IPv6 traffic class: the QP's address vector's, or a UD work request's
    /// address handle's.
    pub tclass: u8,
    /// Where the gathered payload lies in the packet and its CRC, computed as it was
    /// copied in (payloads of [`crate::sgl::DIGEST_MIN_PAYLOAD`] bytes or more): the
    /// ICRC can then be completed without hashing it again
    /// (`wire::icrc::PreparedIcrc::compute_with_payload`).
    pub digest: Option<PayloadDigest>,
}

/// A packet's payload position and CRC-32 (crc32fast's `hash` of those bytes). Eight
/// bytes, and `Option<PayloadDigest>` too (a digested payload is never empty): a small
/// [`Transmit`] is cheap to return (docs/perf.md: its moves cost store-forwarding
/// stalls), and a datagram is shorter than 64 KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadDigest {
    /// CRC-32 of the payload.
    pub crc: u32,
    /// First payload byte, from the start of the packet (the BTH).
    pub start: u16,
    /// Payload bytes (the pad follows).
    pub len: core::num::NonZeroU16,
}

impl PayloadDigest {
    /// The digest of `len` bytes at `start`; `None` when they are empty or do not fit a
    /// datagram.
    pub fn at(start: usize, len: usize, crc: u32) -> Option<PayloadDigest> {
        Some(PayloadDigest {
            crc,
            start: u16::try_from(start).ok()?,
            len: u16::try_from(len)
                .ok()
                .and_then(core::num::NonZeroU16::new)?,
        })
    }

    /// The payload's byte range in the packet.
    pub fn range(&self) -> core::ops::Range<usize> {
        let start = usize::from(self.start);
        start..start + usize::from(self.len.get())
    }
}

/// Why [`Qp::admit`] refused a packet (each its own drop counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Opcode,
    Pkey,
    State,
}

/// Why [`Qp::modify`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// The transition is illegal, or its attribute mask is wrong.
    Transition(TransitionError),
    /// An attribute value is out of range.
    InvalidValue {
        /// The attribute (`ibv_qp_attr` field name).
        attr: &'static str,
        /// The value given.
        value: u64,
    },
}

impl core::fmt::Display for ModifyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ModifyError::Transition(TransitionError::Illegal { from, to }) => {
                write!(f, "illegal QP state transition {from:?} -> {to:?}")
            }
            ModifyError::Transition(TransitionError::Missing { from, to, missing }) => write!(
                f,
                "QP transition {from:?} -> {to:?} requires attributes {missing}"
            ),
            ModifyError::Transition(TransitionError::NotAllowed { from, to, invalid }) => write!(
                f,
                "QP transition {from:?} -> {to:?} does not accept attributes {invalid}"
            ),
            ModifyError::InvalidValue { attr, value } => {
                write!(f, "invalid value {value} for QP attribute {attr}")
            }
        }
    }
}

impl std::error::Error for ModifyError {}

/// Why a post was refused (the WQE is not queued and produces no completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP state does not accept posts to this queue (IBTA 10.8.2: Reset for
    /// both queues; Init and RTR for the send queue).
    InvalidState(QpState),
    /// The queue holds `max_send_wr` / `max_recv_wr` WQEs already.
    QueueFull,
    /// More SGEs than `max_sge`.
    TooManySge,
    /// More inline bytes than `max_inline`.
    InlineTooLong,
    /// The operation does not exist on this transport service (e.g. READ on UC).
    UnsupportedOp,
    /// UD send without a destination, or a connected-QP send with one.
    BadUdDest,
    /// An atomic whose local buffer is not exactly one 8-byte SGE, or an ATOMIC WRITE
    /// with any local buffer (its 8 bytes are in the request).
    BadAtomicSge,
    /// Message longer than the QP can carry ([`max_msg_len`] at its path MTU): more
    /// than 2^31 bytes (IBTA 9.4.1: DMA length limit), or on RC/UC more than
    /// 2^23 − 1 packets, which no PSN window can hold (IBTA 9.7.1).
    TooLong,
    /// `post_recv` on a QP created with a shared receive queue: its receive WQEs are
    /// posted to the SRQ (`ibv_post_recv(3)`: such a post fails).
    UsesSrq,
    /// A post to an SRQ in error.
    SrqInError,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PostError::InvalidState(s) => write!(f, "QP in state {s:?} does not accept this post"),
            PostError::QueueFull => write!(f, "queue full"),
            PostError::TooManySge => write!(f, "too many scatter/gather entries"),
            PostError::InlineTooLong => write!(f, "inline data longer than max_inline"),
            PostError::UnsupportedOp => write!(f, "operation not supported on this QP type"),
            PostError::BadUdDest => write!(f, "UD destination missing or not allowed"),
            PostError::BadAtomicSge => write!(f, "atomic needs exactly one 8-byte SGE"),
            PostError::TooLong => write!(
                f,
                "message longer than the QP carries (2^31 bytes, 2^31 - 256 at MTU 256)"
            ),
            PostError::UsesSrq => write!(f, "QP receives from a shared receive queue"),
            PostError::SrqInError => write!(f, "shared receive queue in error"),
        }
    }
}

impl std::error::Error for PostError {}

/// Opt-in deviations from the IBTA that match Linux rxe (off by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxeCompat {
    /// Treat `retry_cnt == 7` as "retry forever", as rxe's completer does. The spec
    /// (IBTA 9.7.6.1.3, and `ibv_modify_qp(3)`) gives the infinite meaning only to
    /// `rnr_retry`; with this off, 7 is 7 retries.
    pub retry_cnt_7_is_infinite: bool,
}

/// Affiliated asynchronous events of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// IBV_EVENT_QP_LAST_WQE_REACHED (`ibv_get_async_event(3)`): a QP that receives
    /// from an SRQ entered Err and has completed (or flushed) the last receive WQE it
    /// took; no more of the SRQ's WQEs will complete on it, so the application may
    /// destroy it without losing any.
    LastWqeReached,
    /// IBV_EVENT_COMM_EST (IBTA 11.6.3.1 Communication Established): an RC/UC QP in
    /// RTR received its first request packet. Raised once per QP.
    CommEst,
    /// IBV_EVENT_QP_REQ_ERR (IBTA 11.6.3.2 Invalid Request Local WQ Error): the
    /// responder NAKed a request Invalid Request and entered Err.
    ReqErr,
    /// IBV_EVENT_QP_ACCESS_ERR (IBTA 11.6.3.2 Local Access Violation WQ Error): the
    /// responder found an R_Key or receive-buffer access violation and entered Err.
    AccessErr,
    /// IBV_EVENT_QP_FATAL (IBTA 11.6.3.2 Local Work Queue Catastrophic Error): the NIC
    /// moved the QP to Err for a reason of its own (see [`Qp::raise_fatal`]).
    Fatal,
}

/// Attribute values in force (what `ibv_query_qp` would report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attrs {
    /// Path MTU in bytes.
    pub path_mtu: u32,
    /// Remote QPN.
    pub dest_qpn: u32,
    /// Peer endpoint.
    pub remote: Option<SocketAddr>,
    /// IP TOS / traffic class of the QP's packets (the address vector's).
    pub traffic_class: u8,
    /// Initial receive PSN.
    pub rq_psn: u32,
    /// Initial send PSN.
    pub sq_psn: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic limit as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic limit as responder.
    pub max_dest_rd_atomic: u8,
    /// Remote access allowed on this QP.
    pub access: Access,
    /// Q_Key (UD).
    pub qkey: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port.
    pub port_num: u8,
}

impl Default for Attrs {
    fn default() -> Self {
        Attrs {
            path_mtu: 1024,
            dest_qpn: 0,
            remote: None,
            traffic_class: 0,
            rq_psn: 0,
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: Access::NONE,
            qkey: 0,
            pkey_index: 0,
            port_num: 1,
        }
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    qpn: u32,
    qp_type: QpType,
    pd: u32,
    caps: QpCaps,
    state: QpState,
    attrs: Attrs,
    compat: RxeCompat,
    port_mtu: u32,
    local: Option<SocketAddr>,
    /// The SRQ this QP takes receive WQEs from (its number), if any. An XRC receive QP
    /// has none of its own: here it is the XRC SRQ the message in progress (or else
    /// the last one) is bound to ([`Qp::handle_packet_xrc`]).
    srq: Option<u32>,
    req: Requester,
    resp: Responder,
    timers: Timers,
    completions: VecDeque<Completion>,
    /// Affiliated events raised and not yet taken.
    events: QpEvents,
    counters: QpCounters,
    /// The last packet sent was a request that went ahead of a queued response
    /// ([`Qp::poll_transmit`]: the response goes next).
    request_ahead: bool,
    /// An XRC receive QP is handling a request whose XRCETH named no SRQ of its domain
    /// ([`Qp::handle_packet_xrc_no_srq`]; set only for that call).
    xrc_no_srq: bool,
}

/// The UDP source port rxe uses for a QP pair (flow label from both QPNs, folded
/// into 0xC000..=0xFFFF), so that softnic flows hash like rxe's. Checked on captures:
/// QPN 0x11 ↔ 0x11 gives 49441.
pub fn rxe_udp_src_port(local_qpn: u32, remote_qpn: u32) -> u16 {
    let mut fl = u64::from(local_qpn) * u64::from(remote_qpn);
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    fl &= 0xF_FFFF;
    0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) as u16
}

/// The UDP source port rxe uses for a UD QP: 0xC000 + the top 14 bits of the QPN
/// times the 32-bit golden ratio (the kernel's `hash_32(qpn, 14)`). UD has no single
/// peer, so the port depends on the sending QP only. Checked on captures: QPN 0x11
/// gives 57236, 0x23 gives 55194.
pub fn rxe_ud_udp_src_port(qpn: u32) -> u16 {
    let h = qpn.wrapping_mul(0x61C8_8647) >> 18;
    0xC000 + (h & 0x3FFF) as u16
}

impl Qp {
    /// A QP in state Reset. `pd` is the protection domain every memory access is made
    /// under.
    pub fn new(qpn: u32, qp_type: QpType, pd: u32, caps: QpCaps) -> Qp {
        let caps = QpCaps {
            max_sge: caps.max_sge.min(MAX_SGE as u32),
            max_inline: caps.max_inline.min(crate::wr::MAX_INLINE as u32),
            ..caps
        };
        Qp {
            qpn: qpn & wire::types::MASK_24,
            qp_type,
            pd,
            caps,
            state: QpState::Reset,
            attrs: Attrs::default(),
            compat: RxeCompat::default(),
            port_mtu: DEFAULT_PORT_MTU,
            local: None,
            srq: None,
            req: Requester::new(),
            resp: Responder::new(caps.max_recv_wr),
            timers: Timers::default(),
            completions: VecDeque::new(),
            events: QpEvents::default(),
            counters: QpCounters::default(),
            request_ahead: false,
            xrc_no_srq: false,
        }
    }

    /// A QP in state Reset that takes its receive WQEs from the shared receive queue
    /// `srqn` (`ibv_qp_init_attr.srq`): `caps.max_recv_wr` is ignored, `post_recv` is
    /// refused, and packets come in through [`Qp::handle_packet_srq`].
    pub fn new_with_srq(qpn: u32, qp_type: QpType, pd: u32, caps: QpCaps, srqn: u32) -> Qp {
        let mut qp = Qp::new(
            qpn,
            qp_type,
            pd,
            QpCaps {
                max_recv_wr: 0,
                ..caps
            },
        );
        qp.srq = Some(srqn);
        qp
    }

    /// An XRC receive QP (`IBV_QPT_XRC_RECV`) in state Reset. It has no queues of its
    /// own: each request packet comes in through [`Qp::handle_packet_xrc`] with the XRC
    /// SRQ its XRCETH names, which lends the receive WQE and whose protection domain
    /// guards the request's memory accesses.
    pub fn new_xrc_recv(qpn: u32, caps: QpCaps) -> Qp {
        Qp::new(
            qpn,
            QpType::XrcRecv,
            0,
            QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                ..caps
            },
        )
    }

    /// The SRQ this QP receives from, if it was created with one (an XRC receive QP:
    /// the XRC SRQ its current or last message is bound to).
    pub fn srq(&self) -> Option<u32> {
        self.srq
    }

    /// This QP's number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// This QP as the way a peer's requests reach memory: its PD and number (type 2
    /// memory windows answer only the QP they were bound on).
    pub fn accessor(&self) -> crate::memory::Accessor {
        crate::memory::Accessor {
            pd: self.pd,
            qpn: self.qpn,
        }
    }

    /// Capacities.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Attribute values in force.
    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    /// Counters.
    pub fn counters(&self) -> &QpCounters {
        &self.counters
    }

    /// Opts in to rxe-compatible deviations from the spec (see [`RxeCompat`]).
    pub fn set_rxe_compat(&mut self, compat: RxeCompat) {
        self.compat = compat;
    }

    /// Chooses adaptive (the default) or strict IBTA retransmission timing (see
    /// [`AckTimer`]).
    pub fn set_ack_timer(&mut self, mode: AckTimer) {
        self.req.rto.set_mode(mode);
    }

    /// Shares the RTT estimate of the peer NIC this QP talks to with the other QPs to
    /// it (see [`PeerRtt`]): the caller keeps one per remote endpoint. Without one the
    /// QP's estimate is its own.
    pub fn set_peer_rtt(&mut self, peer: PeerRtt) {
        self.req.rto.set_peer(peer);
    }

    /// The port MTU, used for UD messages (default [`DEFAULT_PORT_MTU`]). Values
    /// outside [`PATH_MTUS`] are ignored.
    pub fn set_port_mtu(&mut self, mtu: u32) {
        if PATH_MTUS.contains(&mtu) {
            self.port_mtu = mtu;
        }
    }

    /// This NIC's own UDP endpoint, used only to fill the destination address of the
    /// GRH written at the start of UD receive buffers (zero when unknown).
    pub fn set_local_addr(&mut self, addr: SocketAddr) {
        self.local = Some(addr);
    }

    /// Send WQEs queued (not yet completed).
    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len()
    }

    /// Receive WQEs queued (0 for a QP on an SRQ: they are the SRQ's).
    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq.len()
    }

    /// `ibv_modify_qp`: checks the transition and its attribute mask against
    /// [`state::TRANSITIONS`], checks every value, then applies them. On error nothing
    /// changes.
    pub fn modify(&mut self, now: Instant, attr: &QpAttr) -> Result<(), ModifyError> {
        let attr = &attr.for_type(self.qp_type);
        let to = attr.state.unwrap_or(self.state);
        state::check_transition(self.qp_type, self.state, to, attr.mask())
            .map_err(ModifyError::Transition)?;
        validate_values(attr)?;
        self.apply_attrs(attr);
        let from = self.state;
        match to {
            QpState::Reset => self.reset(),
            QpState::Err => self.enter_error(),
            QpState::Rtr if from == QpState::Init => {
                self.state = QpState::Rtr;
                self.resp.start(wire::Psn::new(self.attrs.rq_psn));
            }
            QpState::Rts if from == QpState::Rtr => {
                self.state = QpState::Rts;
                self.req.start(
                    wire::Psn::new(self.attrs.sq_psn),
                    self.attrs.retry_cnt,
                    self.attrs.rnr_retry,
                );
            }
            QpState::Sqd if from == QpState::Rts => {
                self.state = QpState::Sqd;
                if self.qp_type.is_reliable() {
                    self.req.ask_before_draining();
                }
            }
            s => self.state = s,
        }
        let _ = now;
        Ok(())
    }

    fn apply_attrs(&mut self, a: &QpAttr) {
        let t = &mut self.attrs;
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = a.$f { t.$f = v; } )* };
        }
        set!(
            path_mtu,
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer,
            max_rd_atomic,
            max_dest_rd_atomic,
            access,
            qkey,
            pkey_index,
            port_num
        );
        if let Some(v) = a.dest_qpn {
            t.dest_qpn = v;
        }
        if a.remote.is_some() {
            t.remote = a.remote;
            t.traffic_class = a.traffic_class;
        }
        if let Some(v) = a.rq_psn {
            t.rq_psn = v & wire::types::MASK_24;
        }
        if let Some(v) = a.sq_psn {
            t.sq_psn = v & wire::types::MASK_24;
        }
    }

    /// IBTA 10.3.1: a QP moved to Reset loses all its WQEs without completions and
    /// returns to its just-created condition.
    fn reset(&mut self) {
        let (qpn, qp_type, pd, caps, compat, port_mtu, local, srq) = (
            self.qpn,
            self.qp_type,
            self.pd,
            self.caps,
            self.compat,
            self.port_mtu,
            self.local,
            self.srq,
        );
        let (counters, ack_timer) = (self.counters, self.req.rto.mode());
        *self = Qp::new(qpn, qp_type, pd, caps);
        self.set_ack_timer(ack_timer);
        self.srq = srq;
        self.compat = compat;
        self.port_mtu = port_mtu;
        self.local = local;
        self.counters = counters;
    }

    /// Moves to Err: every outstanding and posted WQE completes with
    /// IBV_WC_WR_FLUSH_ERR, send queue first then receive queue, each in posting
    /// order (IBTA 10.3.1.7, 11.6.2). Queued responses are dropped; timers stop.
    pub(crate) fn enter_error(&mut self) {
        self.enter_error_inner(false);
    }

    /// Err entered because the responder failed a request: as [`Qp::enter_error`], but
    /// responses already queued (to requests executed before the failure) and the NAK
    /// still go out.
    pub(crate) fn enter_error_keeping_responses(&mut self) {
        self.enter_error_inner(true);
    }

    /// Moves a UC/UD QP to SQE: the send queue is flushed in order, the receive side
    /// keeps working, and `modify` to RTS resumes sending (IBTA 10.3.1.6).
    pub(crate) fn enter_sqe(&mut self) {
        self.state = QpState::Sqe;
        self.timers.cancel_all();
        while let Some(e) = self.req.pop_front() {
            let c = self.send_completion(&e.wr, WcStatus::WrFlushErr, 0);
            self.push_completion(c);
        }
        self.req.cursor = 0;
        // Nothing acknowledges UC/UD PSNs: after SQE→RTS, sending resumes at the next
        // free PSN with an empty window.
        self.req.win.abandon();
    }

    fn enter_error_inner(&mut self, keep_responses: bool) {
        let on_srq = self.srq.is_some() || self.qp_type == QpType::XrcRecv;
        if on_srq && self.state != QpState::Err {
            self.events.raise(QpEvent::LastWqeReached);
        }
        self.state = QpState::Err;
        self.timers.cancel_all();
        while let Some(e) = self.req.pop_front() {
            let c = self.send_completion(&e.wr, WcStatus::WrFlushErr, 0);
            self.push_completion(c);
        }
        self.flush_recv_queue();
        self.resp.on_error(keep_responses);
    }

    /// Flushes the receive WQEs this QP owns: the one of the message in progress, and
    /// its own receive queue. A QP on an SRQ owns only the former; the WQE it may hold
    /// on loan for the packet being handled goes back to the SRQ: the SRQ's other WQEs
    /// belong to no QP, so one QP's error does not flush them.
    fn flush_recv_queue(&mut self) {
        if let Some(r) = self.resp.take_current_recv() {
            let c = self.recv_flush_completion(&r);
            self.push_completion(c);
        }
        if self.srq.is_some() {
            return;
        }
        while let Some(r) = self.resp.rq.pop_front() {
            let c = self.recv_flush_completion(&r);
            self.push_completion(c);
        }
    }

    fn recv_flush_completion(&self, r: &RecvWr) -> Completion {
        Completion {
            queue: Queue::Recv,
            wr_id: r.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm: None,
            src_qp: 0,
            srqn: 0,
        }
    }

    /// A send completion for `wr`.
    fn send_completion(&self, wr: &SendWr, status: WcStatus, byte_len: u32) -> Completion {
        Completion {
            queue: Queue::Send,
            wr_id: wr.wr_id,
            status,
            opcode: wc_opcode(wr.op),
            byte_len,
            imm: None,
            src_qp: 0,
            srqn: 0,
        }
    }

    fn push_completion(&mut self, mut c: Completion) {
        if self.qp_type == QpType::XrcRecv && c.queue == Queue::Recv {
            // The one place an XRC receive completion learns its SRQ (and so its CQ):
            // the message it completes is bound to `srq` (`handle_packet_xrc`).
            c.srqn = self.srq.unwrap_or(0);
        }
        if c.status == WcStatus::Success {
            self.counters.completions_success += 1;
        } else {
            self.counters.completions_error += 1;
        }
        self.completions.push_back(c);
    }

    /// `ibv_post_send`: queues a send WQE. Shape checks happen here; keys and ranges
    /// are checked when the WQE is executed, and failures then complete it with an
    /// error. In Err the WQE is accepted and flushed at once (IBTA 10.8.3.1).
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            s => return Err(PostError::InvalidState(s)),
        }
        self.check_send_shape(&wr)?;
        if self.req.sq.len() >= self.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        // IBTA 10.3.1.6/10.3.1.7: in SQE and Err, send WQEs complete at once, flushed.
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            let c = self.send_completion(&wr, WcStatus::WrFlushErr, 0);
            self.push_completion(c);
            return Ok(());
        }
        self.req.push(wr, self.caps.max_send_wr);
        Ok(())
    }

    fn check_send_shape(&self, wr: &SendWr) -> Result<(), PostError> {
        if wr.num_sge > self.caps.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        if let Some(data) = &wr.inline {
            if data.len() > self.caps.max_inline as usize {
                return Err(PostError::InlineTooLong);
            }
        }
        let supported = match self.qp_type {
            QpType::Rc => true,
            // IBTA A19 defines ATOMIC WRITE for RC only (no XRC opcode).
            QpType::XrcSend => !matches!(wr.op, SendOp::AtomicWrite { .. }),
            // No send queue: the XRC target only responds.
            QpType::XrcRecv => false,
            QpType::Uc => matches!(
                wr.op,
                SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write | SendOp::WriteWithImm(_)
            ),
            QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)),
        };
        if !supported {
            return Err(PostError::UnsupportedOp);
        }
        if (self.qp_type == QpType::Ud) != wr.ud.is_some() {
            return Err(PostError::BadUdDest);
        }
        if matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
            && (wr.num_sge != 1 || wr.sges[0].length != 8 || wr.inline.is_some())
        {
            return Err(PostError::BadAtomicSge);
        }
        // An ATOMIC WRITE's 8 bytes are in the request itself: no buffer to gather.
        if matches!(wr.op, SendOp::AtomicWrite { .. }) && (wr.num_sge != 0 || wr.inline.is_some()) {
            return Err(PostError::BadAtomicSge);
        }
        // The one length check of a send WQE: 2^31 bytes, and for connected QPs
        // whole messages that fit the PSN window at the path MTU (path_mtu cannot
        // change once the QP accepts sends). UD messages are one packet; a longer one
        // completes with a local length error when executed (IBTA 9.8.2).
        let limit = match self.qp_type {
            QpType::Ud => MAX_MSG_BYTES,
            _ => max_msg_len(self.attrs.path_mtu),
        };
        if wr.total_len() > u64::from(limit) {
            return Err(PostError::TooLong);
        }
        Ok(())
    }

    /// `ibv_post_recv`: queues a receive WQE (allowed from Init on; flushed at once
    /// in Err).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.srq.is_some() || matches!(self.qp_type, QpType::XrcRecv | QpType::XrcSend) {
            return Err(PostError::UsesSrq);
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(QpState::Reset));
        }
        if wr.num_sge > self.caps.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        if self.resp.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            let c = self.recv_flush_completion(&wr);
            self.push_completion(c);
            return Ok(());
        }
        self.resp.rq.push_back(wr);
        Ok(())
    }

    /// Handles one packet addressed to this QP (BTH dest QPN already matched by the
    /// caller, ICRC already checked). Requests go to the responder, responses to the
    /// completer. Never panics; anything unusable is dropped and counted.
    /// A QP created with an SRQ takes its receive WQEs through
    /// [`Qp::handle_packet_srq`]; here it finds none (RNR / drop).
    pub fn handle_packet(
        &mut self,
        now: Instant,
        src: SocketAddr,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
    ) {
        self.handle_packet_to(now, src, &ReceivedIp::default(), pkt, mem);
    }

    /// [`Qp::handle_packet`] with the IP header fields the datagram arrived with, which
    /// a UD receive reports in its GRH ([`ReceivedIp`]). With `ip.group` set the
    /// datagram was sent to that multicast group, which this UD QP is attached to,
    /// rather than to the QP's own address: the group is the GRH's destination (a
    /// multicast receiver sees the group's GID as the GRH's DGID, as on rxe), and the
    /// caller checked that the packet's destination QPN is the multicast QPN 0xFFFFFF.
    pub fn handle_packet_to(
        &mut self,
        now: Instant,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
    ) {
        self.counters.packets_received += 1;
        match self.admit(pkt) {
            Ok(info) if info.is_request() => self.handle_request(now, src, ip, pkt, info, mem),
            Ok(info) => self.handle_response(now, pkt, info, mem),
            Err(Refused::Opcode) => self.counters.drop_bad_opcode += 1,
            Err(Refused::Pkey) => self.counters.drop_bad_pkey += 1,
            Err(Refused::State) => self.counters.drop_bad_state += 1,
        }
    }

    /// The checks every packet passes before the requester or responder sees it: a
    /// known opcode of this QP's transport, the default partition, and a state that
    /// takes requests (responses: an RC QP that can complete). Shared with the
    /// placement query (`placement.rs`).
    fn admit(&self, pkt: &wire::ParsedPacket<'_>) -> Result<&'static wire::OpcodeInfo, Refused> {
        let info = pkt.repr.bth.opcode.info().ok_or(Refused::Opcode)?;
        // IBTA 9.6.1.1 / 10.9.1: only the default partition exists here; compare the
        // 15-bit key, the membership bit aside.
        if pkt.repr.bth.pkey & 0x7FFF != 0x7FFF {
            return Err(Refused::Pkey);
        }
        if info.transport != self.qp_type.transport() {
            return Err(Refused::Opcode);
        }
        // The two halves of XRC: requests go to receive QPs, responses to send QPs.
        let wrong_half = match self.qp_type {
            QpType::XrcSend => info.is_request(),
            QpType::XrcRecv => !info.is_request(),
            _ => false,
        };
        if wrong_half {
            return Err(Refused::Opcode);
        }
        let ok = if info.is_request() {
            self.state.can_receive()
        } else {
            self.state.can_complete() && self.qp_type.is_reliable()
        };
        if ok {
            Ok(info)
        } else {
            Err(Refused::State)
        }
    }

    /// [`Qp::handle_packet`] for a QP created with [`Qp::new_with_srq`]: `srq` must be
    /// that SRQ (another one, or a QP without an SRQ, drops the packet and counts it
    /// as `drop_bad_state`). The QP borrows the SRQ's front WQE for this one packet;
    /// if the packet does not consume it (or a WQE of an abandoned UC message comes
    /// back), what is left returns to the front of the SRQ in order. A consumed WQE may
    /// fire the SRQ's limit event; a request that found the SRQ empty is counted there
    /// (RC: RNR NAK; UC/UD: dropped).
    pub fn handle_packet_srq(
        &mut self,
        now: Instant,
        src: SocketAddr,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
        srq: &mut crate::srq::Srq,
    ) {
        self.handle_packet_srq_to(now, src, &ReceivedIp::default(), pkt, mem, srq);
    }

    /// [`Qp::handle_packet_srq`] with the datagram's IP header fields
    /// ([`Qp::handle_packet_to`]).
    pub fn handle_packet_srq_to(
        &mut self,
        now: Instant,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
        srq: &mut crate::srq::Srq,
    ) {
        if self.srq != Some(srq.srqn()) || self.qp_type == QpType::XrcRecv {
            return self.drop_misrouted();
        }
        self.handle_with_srq(now, src, ip, pkt, mem, srq);
    }

    /// [`Qp::handle_packet`] for an XRC receive QP ([`Qp::new_xrc_recv`]): `srq` is the
    /// XRC SRQ the packet's XRCETH names, which the caller found and checked to be of
    /// this QP's XRC domain (IBTA 9.3: the XRCETH). The request's memory accesses
    /// are made under `srq`'s protection domain, and a receive WQE it needs comes from
    /// `srq` as [`Qp::handle_packet_srq`] lends it. A message is bound to the SRQ its
    /// first packet names (its PD, its WQE, and the CQ its completion goes to,
    /// [`Completion::srqn`]); a later packet of it naming another SRQ is refused as
    /// [`Qp::handle_packet_xrc_no_srq`] refuses one. Any other QP drops the packet
    /// (`drop_bad_state`).
    pub fn handle_packet_xrc(
        &mut self,
        now: Instant,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
        srq: &mut crate::srq::Srq,
    ) {
        if self.qp_type != QpType::XrcRecv {
            return self.drop_misrouted();
        }
        if self.resp.cur.is_some() {
            // A message names one SRQ from its first packet to its last: its WQE (a
            // SEND's, taken at the first; a WRITE with immediate's, at the last), its
            // PD and its completion's CQ are that SRQ's. A packet naming another is
            // an invalid XRCETH (a duplicate of an older message is still answered
            // as a duplicate: PSN checks come first).
            if self.srq != Some(srq.srqn()) {
                return self.handle_packet_xrc_no_srq(now, src, ip, pkt, mem);
            }
        } else {
            self.pd = srq.pd();
            self.srq = Some(srq.srqn());
        }
        self.handle_with_srq(now, src, ip, pkt, mem, srq);
    }

    /// [`Qp::handle_packet_xrc`] for a request whose XRCETH names no XRC SRQ of this
    /// QP's domain (none with that number, or another domain's): as any request, it
    /// is checked for state and PSN first (a duplicate is answered as one); a new
    /// request is refused with NAK Remote Access Error and the QP goes to Err
    /// ([`RespError::XrcSrq`]).
    pub fn handle_packet_xrc_no_srq(
        &mut self,
        now: Instant,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
    ) {
        if self.qp_type != QpType::XrcRecv {
            return self.drop_misrouted();
        }
        self.xrc_no_srq = true;
        self.handle_packet_to(now, src, ip, pkt, mem);
        self.xrc_no_srq = false;
    }

    /// A packet handed in through the wrong entry point (an SRQ that is not this QP's,
    /// an XRC packet for a QP that is not an XRC receive QP): counted, not handled.
    fn drop_misrouted(&mut self) {
        self.counters.packets_received += 1;
        self.counters.drop_bad_state += 1;
    }

    /// The loan of one SRQ WQE around the handling of one packet.
    fn handle_with_srq(
        &mut self,
        now: Instant,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &wire::ParsedPacket<'_>,
        mem: &mut dyn Memory,
        srq: &mut crate::srq::Srq,
    ) {
        let before = srq.len();
        let lent = srq.lend();
        let lent_some = lent.is_some();
        self.resp.rq.extend(lent);
        let starved = self.counters.nak_rnr_sent + self.counters.drop_no_recv_wqe;
        self.handle_packet_to(now, src, ip, pkt, mem);
        srq.give_back(self.resp.rq.drain(..));
        if srq.len() < before {
            srq.consumed();
        }
        if !lent_some && self.counters.nak_rnr_sent + self.counters.drop_no_recv_wqe > starved {
            srq.found_empty();
        }
    }

    /// Writes the next packet into `buf` (BTH … zeroed ICRC slot), or `None` when there
    /// is nothing to send now. `buf` must hold path MTU + 128 bytes.
    ///
    /// A request first, then the responses, but at most one request packet ahead of a
    /// queued response. So a message that answers one just received (a ping-pong's
    /// reply) leaves before that message's ACK, which the peer needs only for a send
    /// completion, and the two fit one GSO send (the shorter ACK last); while an ACK,
    /// NAK or READ response, which unblocks the peer, never waits behind more than one
    /// packet. On two cores this took one `sendmsg` (≈ 3 µs) per direction off an 8 B
    /// round trip (issue 12, docs/perf.md "Latency"). The wire order of a response and
    /// a request is free: they are numbered in different PSN spaces (the requester's
    /// and the peer's).
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &dyn Memory,
    ) -> Option<Transmit> {
        let waiting = !self.resp.responses.is_empty();
        let response_first = waiting && self.request_ahead;
        if response_first {
            self.request_ahead = false;
            if let Some(t) = self.poll_response(buf, mem) {
                self.counters.packets_sent += 1;
                return Some(t);
            }
        }
        // One call site, inlined, and the packet returned as it came: a `Transmit`
        // moved from one stack slot to another cost a store-forwarding stall per
        // packet (its `SocketAddr` is written as two overlapping halves; docs/perf.md).
        let r = self.poll_request(now, buf, mem);
        if !response_first {
            self.request_ahead = waiting && r.is_some();
        }
        if r.is_some() || response_first {
            self.counters.packets_sent += u64::from(r.is_some());
            return r;
        }
        let t = self.poll_response(buf, mem);
        self.counters.packets_sent += u64::from(t.is_some());
        t
    }

    /// Runs the timers that have expired at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.on_timeout(now);
    }

    /// The earliest instant at which [`Qp::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The oldest pending asynchronous event, if any (taken): COMM_EST, then the error
    /// that moved the QP to Err, then LAST_WQE_REACHED.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.poll()
    }

    /// Whether [`Qp::poll_event`] has an event to give (the NIC lists the QP for its
    /// client when this turns true; nothing is taken).
    pub fn has_event(&self) -> bool {
        self.events.any()
    }

    /// The next work completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Path MTU in force for this QP's messages.
    fn mtu(&self) -> u32 {
        match self.qp_type {
            QpType::Ud => self.port_mtu,
            _ => self.attrs.path_mtu,
        }
    }

    /// UDP source port for packets to `remote_qpn`, as rxe picks it (connected QPs:
    /// from both QPNs; UD: from this QPN).
    fn src_port(&self, remote_qpn: u32) -> u16 {
        match self.qp_type {
            QpType::Ud => rxe_ud_udp_src_port(self.qpn),
            _ => rxe_udp_src_port(self.qpn, remote_qpn),
        }
    }
}

/// The completion opcode of a send operation.
pub(crate) fn wc_opcode(op: SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
        SendOp::Write | SendOp::WriteWithImm(_) => WcOpcode::RdmaWrite,
        SendOp::Read => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
    }
}

fn validate_values(a: &QpAttr) -> Result<(), ModifyError> {
    let bad = |attr: &'static str, value: u64| Err(ModifyError::InvalidValue { attr, value });
    if let Some(v) = a.path_mtu {
        if !PATH_MTUS.contains(&v) {
            return bad("path_mtu", v.into());
        }
    }
    for (name, v, max) in [
        ("timeout", a.timeout, 31u8),
        ("retry_cnt", a.retry_cnt, 7),
        ("rnr_retry", a.rnr_retry, 7),
        ("min_rnr_timer", a.min_rnr_timer, 31),
    ] {
        if let Some(v) = v {
            if v > max {
                return bad(name, v.into());
            }
        }
    }
    for (name, v) in [
        ("dest_qpn", a.dest_qpn),
        ("rq_psn", a.rq_psn),
        ("sq_psn", a.sq_psn),
    ] {
        if let Some(v) = v {
            if v > wire::types::MASK_24 {
                return bad(name, v.into());
            }
        }
    }
    if let Some(v) = a.pkey_index {
        if v != 0 {
            return bad("pkey_index", v.into());
        }
    }
    if let Some(v) = a.port_num {
        if v != 1 {
            return bad("port_num", v.into());
        }
    }
    if let Some(v) = a.access {
        if !Access::ALL.contains(v) {
            return bad("qp_access_flags", v.0.into());
        }
    }
    Ok(())
}
