//! The responder: request packets → memory effects, receive completions and
//! responses (IBTA 9.7.4.2 "Responder Side", 9.7.5.1 "Responder Response
//! Generation").
//!
//! Each new RC request runs one pipeline, every step a function that returns
//! `Result<_, RespError>`:
//!
//! ```text
//!   PSN check ─► opcode sequence ─► QP access ─► resources ─► length ─► R_Key ─► execute ─► ACK
//!   (9.7.4.2.1)  (9.7.4.2.2)        (9.7.4.2.3)  (9.7.4.2.4)  (9.7.4.2.5) (9.7.4.2.6)
//! ```
//!
//! and [`disposition`] is the one table that says what each error means on the wire
//! (NAK syndrome), to the receive WQE in hand (completion status), and to the QP (next
//! state).
//!
//! PSN check (IBTA 9.7.4.2.1): PSN = expected → new request. PSN behind (within half
//! the PSN space) → duplicate: SEND/WRITE are re-acknowledged without executing again;
//! a READ is answered again from the duplicate's own PSN if it repeats (the tail of)
//! a READ this responder served, and an identical atomic from the cache of recent
//! atomic results, never executed twice (`served`); other duplicates are dropped and
//! counted. PSN ahead → out of sequence: one PSN sequence error NAK, then silence
//! until the expected PSN arrives (IBTA 9.7.5.1.3, as rxe), except for a packet with
//! AckReq once that NAK has left: it gets the NAK again. A lost NAK used to leave the
//! requester to its retransmission timer, since nothing else answers it until the gap
//! is filled: about one go-back-N in twenty at 5 % loss, each waiting 150–250 µs
//! where a NAK round trip takes ~70 µs (issue 12, docs/perf.md "Goodput under loss").
//! The requester asks at least twice per window and with the packet that fills it,
//! so after a lost NAK some packet that asks follows the gap. A repeated NAK the
//! requester already acted on is ignored there (softnic: `retries_suppressed`; rxe's
//! completer starts no second retry while one is under way, `comp.started_retry`),
//! and a NAK still queued is not repeated, so a burst of packets read at once costs
//! one.
//!
//! Length (IBTA 9.7.4.2.5): besides each packet's length for its position, a READ
//! asks for at most [`super::max_msg_len`] at the path MTU (2^31 bytes, and at most
//! 2^23 − 1 response PSNs) and a WRITE announces at most 2^31 bytes; longer is NAKed
//! Invalid Request.
//!
//! Responses (ACKs, NAKs, READ response packets, atomic ACKs) leave in PSN order from
//! one queue. Consecutive positive ACKs coalesce into the latest (they are cumulative);
//! NAKs are never coalesced away.

use std::collections::VecDeque;

use core::net::SocketAddr;

use wire::{
    AtomicEthRepr, Msn, NakCode, OpcodeInfo, Operation, ParsedPacket, Position, Psn, Syndrome,
};

use super::requester::packets_for;
use super::served::{AtomicCache, ServedReads};
use super::window::{max_msg_len, MAX_MSG_BYTES};
use super::{Qp, QpEvent, QpState, QpType};
use crate::memory::{Access, AtomicOp, MemError, Memory};
use crate::sgl;
use crate::time::Instant;
use crate::wr::{Completion, Queue, RecvWr, WcOpcode, WcStatus};

/// Atomic results remembered for duplicate atomics (at least this many, or
/// `max_dest_rd_atomic` if larger: a requester may resend any of its outstanding atomics,
/// of which there are at most the peer's `max_dest_rd_atomic`).
pub const ATOMIC_CACHE_MIN: usize = 16;

/// READs remembered for duplicate READs: at least this many, or `max_dest_rd_atomic`
/// if larger. A requester retries only READs it still has outstanding, at most its
/// `max_rd_atomic`, which should not exceed this responder's `max_dest_rd_atomic`
/// (rxe keeps exactly that many). But this responder refuses a READ for resources only
/// while earlier responses are still queued here, so a requester with a larger
/// `max_rd_atomic` is not always refused; remembering at least 16, as for atomics,
/// keeps its retries answerable.
pub const SERVED_READS_MIN: usize = 16;

/// Most entries in the response queue; beyond it a response is dropped and counted
/// (the requester's timer recovers). Positive ACKs coalesce, so this is only reached
/// if the caller stops draining `poll_transmit`.
pub const MAX_RESPONSES: usize = 4096;

/// Why a request was not executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespError {
    /// A SEND (or WRITE with immediate) found no receive WQE (IBTA 9.7.5.2.8).
    RnrNoRecv,
    /// Opcode out of sequence: a Middle/Last without a First, or a First/Only inside
    /// an unfinished message (IBTA 9.7.4.2.2).
    OpcodeSequence,
    /// An operation softnic does not implement (FLUSH), or one the QP's transport
    /// does not carry.
    Unsupported,
    /// The QP's access flags do not allow the operation (IBTA 9.7.4.2.3: remote
    /// operation not enabled on the QP).
    QpAccess,
    /// READ/atomic beyond `max_dest_rd_atomic` (IBTA 9.7.4.2.4).
    NoResources,
    /// Packet length wrong for its position, WRITE total differs from the RETH DMA
    /// length, the message is longer than the receive buffer, or a RETH DMA length
    /// beyond what the QP carries (IBTA 9.7.4.2.5; 9.4.1: 2^31 bytes; 9.7.1: a READ
    /// of 2^23 or more response PSNs).
    Length,
    /// Atomic target not 8-byte aligned (IBTA 9.4.5).
    Misaligned,
    /// R_Key invalid, range outside the region, or region without the access right
    /// (IBTA 9.7.4.2.6, 10.6.3).
    RemoteAccess,
    /// Writing into the receive WQE's own buffers failed (bad lkey): a local problem
    /// of the responder, reported as a remote operational error.
    LocalWrite,
    /// An XRC request whose XRCETH names no XRC SRQ of the receive QP's XRC domain
    /// ([`Qp::handle_packet_xrc_no_srq`]). Answered as an access violation: the
    /// sender named a receive queue it may not use (Linux's XRC patches for rxe,
    /// `RESPST_ERR_INVALID_XRCETH`, do the same: NAK Remote Access Error, QP to Err).
    XrcSrq,
}

/// NAK kinds a responder sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakKind {
    /// RNR NAK with the QP's `min_rnr_timer`.
    Rnr,
    /// NAK Invalid Request.
    InvalidRequest,
    /// NAK Remote Access Error.
    RemoteAccess,
    /// NAK Remote Operational Error.
    RemoteOperational,
}

/// What an RC responder error means: the NAK sent with the offending PSN, the status
/// of the receive WQE in hand (if any; otherwise it is flushed), and the next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disposition {
    /// NAK sent.
    pub nak: NakKind,
    /// Status for a receive WQE being filled, `None` = flushed like the others.
    pub wc: Option<WcStatus>,
    /// The QP's next state (`None` = unchanged).
    pub next: Option<QpState>,
}

/// The table (IBTA 9.7.5.1 NAK codes; 10.7.3.1 completion errors; 10.3.1.7 error
/// state). Classes follow IBTA 9.9.3.1.3: RNR is transient, everything else is fatal
/// to the connection, and the responder enters Err after the NAK goes out, as Linux
/// rxe does (`do_class_ac_error`).
pub const fn disposition(e: RespError) -> Disposition {
    use NakKind as N;
    const ERR: Option<QpState> = Some(QpState::Err);
    let (nak, wc, next) = match e {
        RespError::RnrNoRecv => (N::Rnr, None, None),
        RespError::OpcodeSequence => (N::InvalidRequest, None, ERR),
        RespError::Unsupported => (N::InvalidRequest, None, ERR),
        RespError::QpAccess => (N::InvalidRequest, None, ERR),
        RespError::NoResources => (N::InvalidRequest, None, ERR),
        RespError::Length => (N::InvalidRequest, Some(WcStatus::LocLenErr), ERR),
        RespError::Misaligned => (N::InvalidRequest, None, ERR),
        RespError::RemoteAccess => (N::RemoteAccess, None, ERR),
        RespError::XrcSrq => (N::RemoteAccess, None, ERR),
        RespError::LocalWrite => (N::RemoteOperational, Some(WcStatus::LocProtErr), ERR),
    };
    Disposition { nak, wc, next }
}

/// The affiliated event of a responder error that moves the QP to Err (IBTA 11.6.3.2):
/// an access violation — a bad R_Key or range on an inbound RDMA/atomic, or the receive
/// WQE's own buffer failing its L_Key — is a Local Access Violation WQ Error; every
/// other error NAKed Invalid Request is an Invalid Request Local WQ Error. RNR moves
/// nothing to Err and raises nothing (it maps to REQ_ERR only for totality).
pub const fn error_event(e: RespError) -> QpEvent {
    match e {
        RespError::RemoteAccess | RespError::LocalWrite | RespError::XrcSrq => QpEvent::AccessErr,
        RespError::RnrNoRecv
        | RespError::OpcodeSequence
        | RespError::Unsupported
        | RespError::QpAccess
        | RespError::NoResources
        | RespError::Length
        | RespError::Misaligned => QpEvent::ReqErr,
    }
}

/// A queued response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Response {
    /// ACK or NAK.
    Ack {
        psn: Psn,
        msn: Msn,
        syndrome: Syndrome,
    },
    /// RDMA READ response packets still to send.
    Read {
        /// PSN of the next response packet.
        psn: Psn,
        va: u64,
        rkey: u32,
        /// Bytes still to send.
        remaining: u32,
        /// Index of the next packet, and packet count.
        k: u32,
        npkts: u32,
        /// MSN carried in the AETH of First/Last/Only: the count of messages
        /// completed when the READ was accepted (this READ included).
        msn: Msn,
        /// Answers a duplicate request (does not hold a responder resource).
        replay: bool,
        /// The protection domain the READ was checked under, which its payload is read
        /// under: an XRC receive QP's changes with each packet's SRQ
        /// ([`Qp::handle_packet_xrc`]); any other QP's is fixed.
        pd: u32,
    },
    /// Atomic ACK with the original value.
    Atomic {
        psn: Psn,
        orig: u64,
        msn: Msn,
        /// Answers a duplicate request from the atomic cache.
        replay: bool,
    },
}

/// A multi-packet SEND or WRITE being received.
#[derive(Debug, Clone, Copy)]
pub(super) struct InMsg {
    /// SEND or WRITE.
    pub op: Operation,
    /// The receive WQE consumed (SEND; WRITE with immediate at its last packet).
    pub recv: Option<RecvWr>,
    /// Bytes placed so far.
    pub written: u64,
    /// WRITE: RETH target.
    pub va: u64,
    /// WRITE: RETH R_Key.
    pub rkey: u32,
    /// WRITE: RETH DMA length.
    pub dma_len: u64,
}

impl InMsg {
    /// Where the next `plen` bytes of this WRITE go (under `rkey`): right after the
    /// bytes placed so far, if the RETH's DMA length has room for them (IBTA
    /// 9.7.4.2.5). The one rule for a WRITE packet's destination, shared with the
    /// placement query (`placement.rs`).
    pub(super) fn write_at(&self, plen: u64) -> Result<u64, RespError> {
        if self.written + plen > self.dma_len {
            return Err(RespError::Length);
        }
        Ok(self.va.wrapping_add(self.written))
    }
}

/// The scatter list and message offset where the next `plen` bytes of a SEND go in its
/// receive WQE `recv` (`written` bytes placed so far), if the WQE has room for them
/// (IBTA 9.7.4.2.5). Shared with the placement query (`placement.rs`).
pub(super) fn send_window(
    recv: &RecvWr,
    written: u64,
    plen: usize,
) -> Result<(&[crate::wr::Sge], u64), RespError> {
    let sges = sgl::used(&recv.sges, recv.num_sge);
    if written + plen as u64 > sgl::total_len(sges) {
        return Err(RespError::Length);
    }
    Ok((sges, written))
}

/// Responder state.
#[derive(Debug)]
pub(super) struct Responder {
    /// Posted receive WQEs.
    pub rq: VecDeque<RecvWr>,
    /// Expected PSN.
    pub epsn: Psn,
    /// Messages completed (IBTA 9.7.5.1.1).
    pub msn: Msn,
    /// A PSN sequence NAK was sent for `epsn` and no packet at `epsn` came since.
    pub nak_sent: bool,
    /// PSN sequence NAKs in `responses`: one still queued is not repeated.
    pub seq_naks_queued: u32,
    /// Message in progress.
    pub cur: Option<InMsg>,
    /// Responses to send, in PSN order.
    pub responses: VecDeque<Response>,
    /// Recent atomics and their original values, for duplicates.
    pub atomic_cache: AtomicCache,
    /// Recent READs served, for duplicates.
    pub served_reads: ServedReads,
}

impl Responder {
    pub fn new(cap: u32) -> Responder {
        Responder {
            rq: VecDeque::with_capacity(cap.min(1 << 16) as usize),
            epsn: Psn::ZERO,
            msn: Msn::ZERO,
            nak_sent: false,
            seq_naks_queued: 0,
            cur: None,
            responses: VecDeque::new(),
            atomic_cache: AtomicCache::default(),
            served_reads: ServedReads::default(),
        }
    }

    /// Entering RTR: the first expected PSN.
    pub fn start(&mut self, rq_psn: Psn) {
        self.epsn = rq_psn;
    }

    /// The receive WQE of the message in progress, if any.
    pub fn take_current_recv(&mut self) -> Option<RecvWr> {
        self.cur.take().and_then(|c| c.recv)
    }

    /// Entering Err. When the responder itself failed a request (`keep_queued`),
    /// the responses to requests executed before it and the NAK still go out, in
    /// order, so earlier READs and atomics complete at the requester; when the user
    /// moved the QP to Err, nothing more is sent.
    pub fn on_error(&mut self, keep_queued: bool) {
        self.cur = None;
        self.served_reads.clear();
        if !keep_queued {
            self.responses.clear();
            self.seq_naks_queued = 0;
        }
    }

    /// READ/atomic responses queued for new requests: the responder resources in
    /// use (IBTA 9.4.4). Replays for duplicates do not count.
    pub fn rd_atomic_in_use(&self) -> usize {
        self.count(false)
    }

    /// Queued replays of duplicate READs and atomics.
    pub fn replays_queued(&self) -> usize {
        self.count(true)
    }

    fn count(&self, replays: bool) -> usize {
        self.responses
            .iter()
            .filter(|r| match r {
                Response::Read { replay, .. } | Response::Atomic { replay, .. } => {
                    *replay == replays
                }
                Response::Ack { .. } => false,
            })
            .count()
    }
}

/// Checks a RC/UC request payload length against its position (IBTA 9.7.4.2.5):
/// First and Middle carry exactly one path MTU, Last 1..=MTU, Only 0..=MTU.
pub(super) fn check_packet_len(pos: Position, len: usize, mtu: u32) -> Result<(), RespError> {
    let mtu = mtu as usize;
    let ok = match pos {
        Position::First | Position::Middle => len == mtu,
        Position::Last => len >= 1 && len <= mtu,
        Position::Only => len <= mtu,
    };
    if ok {
        Ok(())
    } else {
        Err(RespError::Length)
    }
}

fn map_remote(e: MemError) -> RespError {
    match e {
        MemError::Misaligned => RespError::Misaligned,
        _ => RespError::RemoteAccess,
    }
}

impl Qp {
    /// A request packet (state already checked).
    pub(super) fn handle_request(
        &mut self,
        _now: Instant,
        src: SocketAddr,
        ip: &super::ReceivedIp,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) {
        // IBTA 11.6.3.1: the first packet an RC/UC QP receives in RTR establishes
        // communication (a QP whose peer sends before the CM's RTU arrives learns it
        // here). A QP already in RTS raises nothing, as rdmavt does.
        if self.state == QpState::Rtr && self.qp_type != QpType::Ud {
            self.events.raise(QpEvent::CommEst);
        }
        match self.qp_type {
            QpType::Rc | QpType::XrcRecv | QpType::XrcSend => {
                self.handle_rc_request(pkt, info, mem)
            }
            QpType::Uc => self.handle_uc_request(pkt, info, mem),
            QpType::Ud => self.handle_ud_request(src, ip, pkt, mem),
        }
    }

    fn handle_rc_request(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) {
        let p = pkt.repr.bth.psn;
        let d = self.resp.epsn.distance_to(p);
        if d < 0 {
            self.duplicate(pkt, info, mem);
            return;
        }
        if d > 0 {
            self.counters.out_of_sequence += 1;
            // One NAK per gap, and again for a packet that asks once it has left
            // (module documentation: a lost NAK is repaired without the timer).
            if !self.resp.nak_sent || (pkt.repr.bth.ack_req && self.resp.seq_naks_queued == 0) {
                self.resp.nak_sent = true;
                self.queue_nak(self.resp.epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        self.resp.nak_sent = false;
        let done = if self.xrc_no_srq {
            Err(RespError::XrcSrq)
        } else {
            self.execute(pkt, info, mem)
        };
        match done {
            Ok(npsn) => {
                self.counters.bytes_received += pkt.payload.len() as u64;
                self.resp.epsn = p.wrapping_add(npsn);
                // IBTA 9.7.5.1: acknowledge when asked; READ and atomics answer with
                // their own responses.
                if pkt.repr.bth.ack_req
                    && matches!(info.operation, Operation::Send | Operation::Write)
                {
                    self.queue_ack(p);
                }
            }
            Err(e) => self.respond_error(e, p),
        }
    }

    /// IBTA 9.8.3 (UC): no ACKs; a PSN gap or any error silently drops the message in
    /// progress, whose receive WQE is reused for the next message.
    fn handle_uc_request(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) {
        let p = pkt.repr.bth.psn;
        if p != self.resp.epsn {
            self.abandon_message();
            self.resp.epsn = p;
        }
        match self.execute(pkt, info, mem) {
            Ok(n) => {
                self.counters.bytes_received += pkt.payload.len() as u64;
                self.resp.epsn = p.wrapping_add(n);
            }
            Err(e) => {
                if e == RespError::RnrNoRecv {
                    self.counters.drop_no_recv_wqe += 1;
                }
                self.abandon_message();
                self.resp.epsn = p.next();
            }
        }
    }

    fn abandon_message(&mut self) {
        if let Some(c) = self.resp.cur.take() {
            self.counters.drop_uc_message += 1;
            if let Some(r) = c.recv {
                self.resp.rq.push_front(r);
            }
        }
    }

    /// Runs the pipeline for a new request; returns the PSNs it uses.
    fn execute(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) -> Result<u32, RespError> {
        self.check_opcode_sequence(info)?;
        self.check_qp_access(info)?;
        match info.operation {
            Operation::Send => self.rx_send(pkt, info, mem).map(|()| 1),
            Operation::Write => self.rx_write(pkt, info, mem).map(|()| 1),
            Operation::ReadRequest => self.rx_read(pkt, mem),
            Operation::CompareSwap | Operation::FetchAdd => {
                self.rx_atomic(pkt, info, mem).map(|()| 1)
            }
            Operation::AtomicWrite => self.rx_atomic_write(pkt, mem).map(|()| 1),
            _ => Err(RespError::Unsupported),
        }
    }

    /// IBTA 9.7.4.2.2: Middle/Last only continue the same operation; First/Only only
    /// start a message.
    pub(super) fn check_opcode_sequence(&self, info: &OpcodeInfo) -> Result<(), RespError> {
        let ok = match (&self.resp.cur, info.position.starts()) {
            (Some(c), false) => c.op == info.operation,
            (None, true) => true,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(RespError::OpcodeSequence)
        }
    }

    /// IBTA 9.7.4.2.3 / 10.2.3: the QP's own access flags gate remote operations.
    pub(super) fn check_qp_access(&self, info: &OpcodeInfo) -> Result<(), RespError> {
        let need = match info.operation {
            // An ATOMIC WRITE writes: REMOTE_WRITE, as rxe checks it.
            Operation::Write | Operation::AtomicWrite => Access::REMOTE_WRITE,
            Operation::ReadRequest => Access::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
            Operation::Send => Access::NONE,
            _ => return Err(RespError::Unsupported),
        };
        if self.attrs.access.contains(need) {
            Ok(())
        } else {
            Err(RespError::QpAccess)
        }
    }

    fn take_recv(&mut self) -> Result<RecvWr, RespError> {
        self.resp.rq.pop_front().ok_or(RespError::RnrNoRecv)
    }

    fn rx_send(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) -> Result<(), RespError> {
        let pos = info.position;
        // Length before resources would be kinder to the WQE, but IBTA orders
        // resources first; a bad length is fatal anyway.
        if pos.starts() {
            let recv = self.take_recv()?;
            self.resp.cur = Some(InMsg {
                op: Operation::Send,
                recv: Some(recv),
                written: 0,
                va: 0,
                rkey: 0,
                dma_len: 0,
            });
        }
        check_packet_len(pos, pkt.payload.len(), self.mtu())?;
        let Some(cur) = self.resp.cur.as_mut() else {
            return Err(RespError::OpcodeSequence);
        };
        let Some(recv) = cur.recv else {
            return Err(RespError::OpcodeSequence);
        };
        let (sges, at) = send_window(&recv, cur.written, pkt.payload.len())?;
        sgl::scatter(self.pd, sges, at, pkt.payload, mem).map_err(|_| RespError::LocalWrite)?;
        cur.written += pkt.payload.len() as u64;
        if pos.ends() {
            let written = cur.written;
            // SEND with Invalidate (IBTA 9.4.1.1): the R_Key goes before the message
            // completes. One this QP's PD cannot invalidate is a remote access error,
            // with the NAK of an invalid R_Key (rxe completes the receive with
            // IBV_WC_REM_INV_REQ_ERR instead).
            let inv = pkt.repr.ieth.map(|i| i.rkey);
            if let Some(rkey) = inv {
                mem.invalidate(self.accessor(), rkey).map_err(map_remote)?;
            }
            self.resp.cur = None;
            self.resp.msn = self.resp.msn.next();
            let c = Completion {
                queue: Queue::Recv,
                wr_id: recv.wr_id,
                status: WcStatus::Success,
                opcode: if inv.is_some() {
                    WcOpcode::RecvWithInv
                } else {
                    WcOpcode::Recv
                },
                byte_len: written as u32,
                imm: pkt.repr.immdt.map(|i| i.imm).or(inv),
                src_qp: self.attrs.dest_qpn,
                srqn: 0,
            };
            self.push_completion(c);
        }
        Ok(())
    }

    fn rx_write(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) -> Result<(), RespError> {
        let pos = info.position;
        let imm = pkt.repr.immdt.map(|i| i.imm);
        // Resources: a WRITE with immediate consumes a receive WQE at its last packet.
        let recv = if imm.is_some() {
            Some(self.take_recv()?)
        } else {
            None
        };
        let r = self.rx_write_inner(pkt, pos, mem);
        match r {
            Ok(true) => {
                let dma_len = self.resp.cur.map_or(0, |c| c.dma_len);
                self.resp.cur = None;
                self.resp.msn = self.resp.msn.next();
                if let (Some(recv), Some(imm)) = (recv, imm) {
                    let c = Completion {
                        queue: Queue::Recv,
                        wr_id: recv.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: dma_len as u32,
                        imm: Some(imm),
                        src_qp: self.attrs.dest_qpn,
                        srqn: 0,
                    };
                    self.push_completion(c);
                }
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => {
                if let (Some(recv), Some(c)) = (recv, self.resp.cur.as_mut()) {
                    c.recv = Some(recv);
                } else if let Some(recv) = recv {
                    self.resp.cur = Some(InMsg {
                        op: Operation::Write,
                        recv: Some(recv),
                        written: 0,
                        va: 0,
                        rkey: 0,
                        dma_len: 0,
                    });
                }
                Err(e)
            }
        }
    }

    /// Places one WRITE packet; `Ok(true)` when the message is complete.
    fn rx_write_inner(
        &mut self,
        pkt: &ParsedPacket<'_>,
        pos: Position,
        mem: &mut dyn Memory,
    ) -> Result<bool, RespError> {
        check_packet_len(pos, pkt.payload.len(), self.mtu())?;
        if pos.starts() {
            let Some(reth) = pkt.repr.reth else {
                return Err(RespError::OpcodeSequence);
            };
            let dma_len = u64::from(reth.dma_len);
            if pos == Position::Only && pkt.payload.len() as u64 != dma_len {
                return Err(RespError::Length);
            }
            if dma_len > u64::from(MAX_MSG_BYTES) {
                return Err(RespError::Length);
            }
            // IBTA 9.7.4.2.6: a zero-length RDMA operation does not check the R_Key.
            if dma_len > 0 {
                mem.check_remote(
                    self.accessor(),
                    reth.rkey,
                    reth.va,
                    dma_len,
                    Access::REMOTE_WRITE,
                )
                .map_err(map_remote)?;
            }
            self.resp.cur = Some(InMsg {
                op: Operation::Write,
                recv: None,
                written: 0,
                va: reth.va,
                rkey: reth.rkey,
                dma_len,
            });
        }
        let by = self.accessor();
        let Some(cur) = self.resp.cur.as_mut() else {
            return Err(RespError::OpcodeSequence);
        };
        let plen = pkt.payload.len() as u64;
        let va = cur.write_at(plen)?;
        if plen > 0 {
            mem.write_remote(by, cur.rkey, va, pkt.payload)
                .map_err(map_remote)?;
        }
        cur.written += plen;
        if pos.ends() {
            if cur.written != cur.dma_len {
                return Err(RespError::Length);
            }
            return Ok(true);
        }
        Ok(false)
    }

    fn rd_atomic_limit(&self) -> usize {
        usize::from(self.attrs.max_dest_rd_atomic)
    }

    fn rx_read(&mut self, pkt: &ParsedPacket<'_>, mem: &dyn Memory) -> Result<u32, RespError> {
        if self.resp.rd_atomic_in_use() >= self.rd_atomic_limit() {
            return Err(RespError::NoResources);
        }
        let Some(reth) = pkt.repr.reth else {
            return Err(RespError::OpcodeSequence);
        };
        // A READ's responses must fit the requester's PSN window (span < 2^23) and be
        // at most 2^31 bytes: a longer one cannot be answered correctly.
        if reth.dma_len > max_msg_len(self.mtu()) {
            return Err(RespError::Length);
        }
        // The R_Key check comes first: a refused READ does not count as a message.
        self.check_read(reth, mem, self.pd)?;
        self.resp.msn = self.resp.msn.next();
        let p = pkt.repr.bth.psn;
        self.queue_read(p, reth, mem, None)?;
        let npkts = packets_for(reth.dma_len, self.mtu());
        let cap = SERVED_READS_MIN.max(self.rd_atomic_limit());
        self.resp.served_reads.record(p, npkts, reth, self.pd, cap);
        Ok(npkts)
    }

    /// Checks the R_Key of a READ and queues its response packets from PSN `p`: a new
    /// READ (`replay` `None`) under the QP's protection domain, a replay under the
    /// domain its original was served under (`Some(pd)`; an XRC receive QP's changes
    /// with each message's SRQ, [`Qp::handle_packet_xrc`]).
    pub(super) fn queue_read(
        &mut self,
        p: Psn,
        reth: wire::RethRepr,
        mem: &dyn Memory,
        replay: Option<u32>,
    ) -> Result<(), RespError> {
        let pd = replay.unwrap_or(self.pd);
        self.check_read(reth, mem, pd)?;
        self.push_response(Response::Read {
            psn: p,
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            k: 0,
            npkts: packets_for(reth.dma_len, self.mtu()),
            msn: self.resp.msn,
            replay: replay.is_some(),
            pd,
        });
        Ok(())
    }

    /// IBTA 9.7.4.2.6: the R_Key, range and REMOTE_READ right of a READ under
    /// protection domain `pd` (none for a zero-length READ).
    fn check_read(&self, reth: wire::RethRepr, mem: &dyn Memory, pd: u32) -> Result<(), RespError> {
        if reth.dma_len > 0 {
            mem.check_remote(
                crate::memory::Accessor { pd, qpn: self.qpn },
                reth.rkey,
                reth.va,
                u64::from(reth.dma_len),
                Access::REMOTE_READ,
            )
            .map_err(map_remote)?;
        }
        Ok(())
    }

    fn rx_atomic(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) -> Result<(), RespError> {
        if self.resp.rd_atomic_in_use() >= self.rd_atomic_limit() {
            return Err(RespError::NoResources);
        }
        let Some(a) = pkt.repr.atomic_eth else {
            return Err(RespError::OpcodeSequence);
        };
        if a.va % 8 != 0 {
            return Err(RespError::Misaligned);
        }
        mem.check_remote(self.accessor(), a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
            .map_err(map_remote)?;
        let op = if info.operation == Operation::CompareSwap {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = mem
            .atomic(self.accessor(), a.rkey, a.va, op)
            .map_err(map_remote)?;
        let p = pkt.repr.bth.psn;
        let cap = ATOMIC_CACHE_MIN.max(self.rd_atomic_limit());
        self.resp
            .atomic_cache
            .record(p, info.operation, a, orig, cap);
        self.resp.msn = self.resp.msn.next();
        self.push_response(Response::Atomic {
            psn: p,
            orig,
            msn: self.resp.msn,
            replay: false,
        });
        Ok(())
    }

    /// An RDMA ATOMIC WRITE (IBTA Annex A19, as rxe executes it): exactly 8 bytes of
    /// payload for a RETH of DMA length 8 with no pad (oA19-28), at an 8-byte-aligned
    /// address of a region open to REMOTE_WRITE, stored in one store
    /// ([`Memory::atomic_write`]). It holds a responder resource like a READ or an
    /// atomic, is remembered so that a duplicate is answered without storing again
    /// (a later WRITE may have changed those bytes meanwhile), and is answered with
    /// an RDMA READ Response Only of zero length carrying the AETH.
    fn rx_atomic_write(
        &mut self,
        pkt: &ParsedPacket<'_>,
        mem: &mut dyn Memory,
    ) -> Result<(), RespError> {
        if self.resp.rd_atomic_in_use() >= self.rd_atomic_limit() {
            return Err(RespError::NoResources);
        }
        let Some(key) = atomic_write_key(pkt) else {
            return Err(RespError::Length);
        };
        if key.va % 8 != 0 {
            return Err(RespError::Misaligned);
        }
        mem.atomic_write(
            self.accessor(),
            key.rkey,
            key.va,
            key.swap_add.to_ne_bytes(),
        )
        .map_err(map_remote)?;
        let p = pkt.repr.bth.psn;
        let cap = ATOMIC_CACHE_MIN.max(self.rd_atomic_limit());
        self.resp
            .atomic_cache
            .record(p, Operation::AtomicWrite, key, 0, cap);
        self.resp.msn = self.resp.msn.next();
        self.push_atomic_write_response(p, key, false);
        Ok(())
    }

    /// Queues the zero-length READ response that answers an ATOMIC WRITE at `p`.
    pub(super) fn push_atomic_write_response(&mut self, p: Psn, key: AtomicEthRepr, replay: bool) {
        self.push_response(Response::Read {
            psn: p,
            va: key.va,
            rkey: key.rkey,
            remaining: 0,
            k: 0,
            npkts: 1,
            msn: self.resp.msn,
            replay,
            pd: self.pd,
        });
    }
}

/// An ATOMIC WRITE request as the atomic cache remembers it: the AtomicETH it would
/// carry — its RETH's address and R_Key, its 8 bytes as the swap value — or `None`
/// when it is not well formed (no RETH, a DMA length or payload other than 8 bytes,
/// or a pad: IBTA oA19-28).
pub(super) fn atomic_write_key(pkt: &ParsedPacket<'_>) -> Option<AtomicEthRepr> {
    let reth = pkt.repr.reth?;
    let value = <[u8; 8]>::try_from(pkt.payload).ok()?;
    if reth.dma_len != 8 || pkt.repr.bth.pad_count != 0 {
        return None;
    }
    Some(AtomicEthRepr {
        va: reth.va,
        rkey: reth.rkey,
        swap_add: u64::from_ne_bytes(value),
        compare: 0,
    })
}
