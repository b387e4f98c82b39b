//! The requester: send WQEs → request packets (IBTA 9.7.4.1 "Requester Side").
//!
//! The send queue holds every posted WQE until it completes. A cursor walks it: the
//! WQE under the cursor and the PSN of its next packet. A WQE gets its PSNs when its
//! first packet is sent (IBTA 9.7.1: one PSN per request packet, and one per expected
//! response packet for an RDMA READ), so PSNs are contiguous in posting order and a
//! go-back-N retry is just "move the cursor back to the oldest unacknowledged PSN".
//! The PSNs themselves (oldest unacknowledged, cursor, highest sent, next free) live in
//! one [`SendWindow`], which keeps them ordered and their span below 2^23.
//!
//! Opcodes come from the `wire` opcode table ([`wire::Opcode::find`]) by transport,
//! operation and position; none is written by hand.
//!
//! AckReq policy (IBTA 9.7.6.1.1 lets the requester choose): set on one packet in every
//! [`ACK_REQ_INTERVAL`] (or half the in-flight window, when losses shrank it, and on
//! the packet that fills such a window), on every resent packet, on READ and atomic
//! requests, and on the last packet of a message
//! unless at least [`DEEP_QUEUE`] WQEs wait behind it and the next can start at once
//! ([`Qp::next_follows`]). An ACK covers every earlier PSN (IBTA 9.7.5.1.2), so a
//! stream of messages needs one AckReq per interval, not one per message: each ACK
//! costs the responder a `sendmsg` and the requester a receive (issue 12: 64 KiB
//! WRITEs from a deep send queue went from ≈ 0.74 to ≤ 0.25 ACKs per message). A
//! message near the end of the queue asks at its end: its completion may be what the
//! application waits for before it posts more (perftest's 8 B WRITEs wait for the
//! 100th of 128), and an ACK held back to the end of the queue would leave the queue
//! empty for a round trip. A message whose successor must wait (another QP state, a
//! READ or atomic, a window that cannot take it) asks too, so its completion is never
//! left to the retransmission timer; a move to SQD after an end that did not ask
//! resends that end, asking ([`Requester::ask_before_draining`]). Because an AckReq
//! goes out at least every interval ≤ half the window, a full window always holds one,
//! whose ACK opens it again. Linux rxe acknowledges only packets with AckReq set, so
//! this keeps the window moving against rxe as well as against hardware that
//! coalesces.

use std::collections::VecDeque;

use super::sq_pool;
use wire::{
    AtomicEthRepr, BthRepr, DethRepr, Header, IethRepr, ImmDtRepr, Opcode, Operation, PacketRepr,
    Position, Psn, Qpn, RethRepr, XrcEthRepr,
};

use super::cwnd::{Cwnd, MAX_OUTSTANDING_PSNS};
use super::rto::Rto;
use super::window::{forward, SendWindow};
use super::{PayloadDigest, Qp, QpState, QpType, Transmit};
use crate::memory::Memory;
use crate::sgl;
use crate::time::Instant;
use crate::wr::{SendOp, SendWr, WcStatus};

/// A packet with AckReq at least every this many request packets.
pub const ACK_REQ_INTERVAL: u32 = 64;

/// A message's last packet leaves out AckReq only when at least this many WQEs are
/// queued behind it (module documentation): about an ACK's round trip of small
/// messages, and far less than a streaming application keeps queued (perftest: 128).
pub const DEEP_QUEUE: usize = 32;

/// What a send WQE does, as far as packetisation is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// SEND (with or without immediate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ.
    Read,
    /// Compare & Swap or Fetch & Add.
    Atomic,
    /// ATOMIC WRITE (IBTA Annex A19): one request packet with its 8 bytes, answered by
    /// a zero-length READ response.
    AtomicWrite,
}

impl Kind {
    fn of(op: SendOp) -> Kind {
        match op {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => Kind::Send,
            SendOp::Write | SendOp::WriteWithImm(_) => Kind::Write,
            SendOp::Read => Kind::Read,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => Kind::Atomic,
            SendOp::AtomicWrite { .. } => Kind::AtomicWrite,
        }
    }

    /// READ and atomics use responder resources (IBTA 9.4.4, `max_rd_atomic`), and so
    /// does an ATOMIC WRITE, which the responder remembers to answer a duplicate
    /// without storing again (as rxe's responder resources hold it).
    pub fn is_rd_atomic(self) -> bool {
        !self.is_plain()
    }

    /// SEND or WRITE: acknowledged by ACKs alone, and a duplicate is re-acknowledged
    /// without being executed again (IBTA 9.7.5.1), so such a packet may be sent twice
    /// or resent just to ask for an ACK. A duplicate READ is served again, whole, and
    /// an atomic's answer is the responder's saved result.
    pub fn is_plain(self) -> bool {
        matches!(self, Kind::Send | Kind::Write)
    }
}

/// One send WQE and its transmission state.
#[derive(Debug, Clone)]
pub(super) struct SqEntry {
    /// The work request.
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u32,
    /// Operation class.
    pub kind: Kind,
    /// PSN of its first packet (valid once `started`).
    pub first_psn: Psn,
    /// PSNs it uses: request packets, or expected READ response packets.
    pub npkts: u32,
    /// Whether PSNs have been assigned (first packet sent).
    pub started: bool,
    /// READ: PSN of the most recent request for it (a retried READ asks only for
    /// the responses from the first missing PSN, which start again at First).
    pub req_psn: Psn,
}

impl SqEntry {
    /// PSN of the last packet.
    pub fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }

    /// One past the last PSN.
    pub fn end_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts)
    }

    /// True when `psn` is one of this WQE's PSNs (a forward offset from the first:
    /// unambiguous for any message the window accepts).
    pub fn contains(&self, psn: Psn) -> bool {
        forward(self.first_psn, psn) < self.npkts
    }
}

/// Requester state.
#[derive(Debug)]
pub(super) struct Requester {
    /// Posted, not yet completed WQEs in posting order. Its buffer (room for the QP's
    /// `max_send_wr`) comes from the thread's [`sq_pool`] when the first WQE arrives
    /// and, unless the queue is deep, goes back there when the last completes: an idle
    /// QP holds none.
    pub sq: VecDeque<SqEntry>,
    /// Index in `sq` of the WQE whose packet goes next.
    pub cursor: usize,
    /// The PSNs: oldest unacknowledged (IBTA 9.7.5.1: the completer's expected PSN),
    /// the next packet's (of `sq[cursor]` when it is started), highest sent, next free.
    pub win: SendWindow,
    /// Request packets sent since the last one with AckReq.
    pub noack_pkts: u32,
    /// PSN of the last packet sent with AckReq (none yet: `None`).
    pub last_ask: Option<Psn>,
    /// The next packet asks for an ACK whatever the policy says
    /// ([`Qp::defer_unasked_timeout`]).
    pub ask_next: bool,
    /// Started, uncompleted READ/atomic WQEs.
    pub rd_atomic: u32,
    /// Retries left before IBV_WC_RETRY_EXC_ERR.
    pub retry_left: u8,
    /// RNR retries left before IBV_WC_RNR_RETRY_EXC_ERR (7 = infinite).
    pub rnr_left: u8,
    /// Waiting out an RNR NAK: nothing is sent until the RNR timer fires.
    pub rnr_paused: bool,
    /// Gone back N and no progress since: further implied NAKs (responses still in
    /// flight from before the rewind) are ignored, so one loss costs one retry.
    pub in_retry: bool,
    /// When to resend and which resends cost a retry (`rto.rs`).
    pub rto: Rto,
    /// How many request PSNs may be outstanding (`cwnd.rs`).
    pub cwnd: Cwnd,
    /// Gone back on a PSN sequence NAK: the next packet, the oldest unacknowledged,
    /// goes out twice ([`Requester::repeat_head`]).
    pub head_twice: bool,
    /// What an early timer expiry left to find out ([`Recovery`]).
    pub recovery: Recovery,
}

/// After an early (adaptive, uncharged) timer expiry, until the answers show whether
/// anything was lost. One value, not two options, because an expiry either probes the
/// tail or goes back N behind an undo-probe, never both: a go-back (IBTA 9.7.5.2.1)
/// ends a tail probe, and a tail probe replaces an answered undo-probe.
#[derive(Debug, Clone, Copy, Default)]
pub(super) enum Recovery {
    /// No early expiry to resolve.
    #[default]
    None,
    /// Gone back N on the expiry: only the oldest unacknowledged packet goes out until
    /// a response comes, and a spurious expiry restores the window ([`Probe`]).
    Probe(Probe),
    /// The expiry resent the last packet sent ([`Requester::seek_last_sent`]) and went
    /// on from where it was, until the answers cover everything sent before it
    /// (RFC 8985 §7's tail loss probe; `Qp::probe_tail`).
    TailProbe(TailProbe),
}

impl Recovery {
    /// An undo-probe is out and no response has made progress since: sending is held
    /// to the oldest unacknowledged packet.
    pub fn probe_unanswered(&self) -> bool {
        matches!(self, Recovery::Probe(p) if !p.answered)
    }
}

/// A tail-loss probe under way (`Qp::probe_tail`).
#[derive(Debug, Clone, Copy)]
pub(super) struct TailProbe {
    /// One past the last PSN sent before the expiry: the answers covering it make the
    /// expiry spurious (`spurious_timeouts`).
    pub resume: Psn,
    /// A response made progress since the probe. Without one, the next expiry does not
    /// probe again but goes back N: a responder that has NAKed a gap once stays silent
    /// until the gap is filled (IBTA 9.7.5.1.3; rxe's `sent_psn_nak`), so if that NAK
    /// was lost, no probe of the tail is ever answered.
    pub progressed: bool,
}

/// What an early (adaptive, uncharged) timer expiry leaves to undo. On a loaded host
/// most such expiries are spurious: the responder's NIC was descheduled, not a packet
/// lost (lossless 64 KiB WRITEs at load ~6 went back tens to hundreds of times per
/// 30,000 messages, each resending up to a window and halving it; docs/perf.md
/// "Goodput under loss"). So the requester first resends only the oldest
/// unacknowledged packet, asking (as TCP sends one segment after a timeout, RFC 5681
/// §3.1). The responder answers a duplicate with an ACK of everything it has (IBTA
/// 9.7.5.1.3): if that covers every PSN sent before the expiry, nothing was lost and
/// the window is restored (as RFC 3522's Eifel response undoes a spurious timeout);
/// otherwise go-back-N resumes from the first PSN not acknowledged, one round trip
/// later than before — and if the rest of the late ACKs cover everything before a
/// packet is resent, the expiry is found spurious all the same. Charged expiries (a
/// whole Local ACK Timeout) go back at once, as the spec and rxe do; so does a READ or
/// atomic at the head (a resent READ is served again whole).
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    /// The window before the expiry.
    pub cwnd: Cwnd,
    /// One past the last PSN sent before the expiry.
    pub resume: Psn,
    /// A response made progress since: sending is no longer held to the probe, and
    /// the first packet resent after it ends the undo.
    pub answered: bool,
}

/// Position of packet `k` of an `n`-packet message (IBTA 9.4: First/Middle/Last/Only).
pub(super) fn position(k: u32, n: u32) -> Position {
    if n <= 1 {
        Position::Only
    } else if k == 0 {
        Position::First
    } else if k + 1 >= n {
        Position::Last
    } else {
        Position::Middle
    }
}

/// Packets a message of `len` bytes takes at `mtu` (at least one).
pub(super) fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu.max(1)).max(1)
}

impl Requester {
    pub fn new() -> Requester {
        Requester {
            sq: VecDeque::new(),
            cursor: 0,
            win: SendWindow::new(Psn::ZERO),
            noack_pkts: 0,
            last_ask: None,
            ask_next: false,
            rd_atomic: 0,
            retry_left: 0,
            rnr_left: 0,
            rnr_paused: false,
            in_retry: false,
            rto: Rto::default(),
            cwnd: Cwnd::default(),
            head_twice: false,
            recovery: Recovery::None,
        }
    }

    /// Entering RTS: the first PSN is `sq_psn`.
    pub fn start(&mut self, sq_psn: Psn, retry_cnt: u8, rnr_retry: u8) {
        self.win = SendWindow::new(sq_psn);
        self.cwnd.start(sq_psn);
        self.retry_left = retry_cnt;
        self.rnr_left = rnr_retry;
    }

    /// Queues a WQE (shape already checked) on a queue of `max_send_wr` entries.
    pub fn push(&mut self, wr: SendWr, max_send_wr: u32) {
        let len = u32::try_from(wr.total_len()).unwrap_or(u32::MAX);
        let kind = Kind::of(wr.op);
        if self.sq.capacity() == 0 {
            self.attach_sq(max_send_wr);
        }
        self.sq.push_back(SqEntry {
            wr,
            len,
            kind,
            first_psn: Psn::ZERO,
            npkts: 0,
            started: false,
            req_psn: Psn::ZERO,
        });
    }

    /// Gives the empty queue a buffer from the thread's pool (out of line: once per
    /// burst at most, and kept out of `push`'s inlined body).
    #[cold]
    #[inline(never)]
    fn attach_sq(&mut self, max_send_wr: u32) {
        self.sq = sq_pool::take(max_send_wr.clamp(1, 1 << 16) as usize);
    }

    /// Returns the emptied queue's buffer to the pool, unless the queue is deep.
    #[cold]
    #[inline(never)]
    fn release_sq(&mut self) {
        sq_pool::give(&mut self.sq);
    }

    /// Removes the oldest WQE, keeping the cursor on the same entry. (If the cursor
    /// was on the removed WQE — a resend overtaken by its ACK — it moves to the next
    /// WQE; acknowledging the PSNs moves the cursor PSN past them, `SendWindow::advance`.)
    /// Inlined: a call would return the 200-byte entry through a `memmove`, which
    /// cost the 8 B WRITE path ≈ 10 % (`cargo bench --bench dataplane -- small`).
    #[inline(always)]
    pub fn pop_front(&mut self) -> Option<SqEntry> {
        let e = self.sq.pop_front()?;
        if self.sq.is_empty() {
            self.release_sq();
        }
        self.cursor = self.cursor.saturating_sub(1);
        if e.started && e.kind.is_rd_atomic() {
            self.rd_atomic = self.rd_atomic.saturating_sub(1);
        }
        Some(e)
    }

    /// True while some request PSN is sent and not acknowledged.
    pub fn outstanding(&self) -> bool {
        self.win.outstanding()
    }

    /// Go-back-N: the next packet sent is the oldest unacknowledged (IBTA 9.7.5.2.1).
    pub fn rewind(&mut self) {
        self.recovery = Recovery::None;
        self.rto.on_rewind();
        self.cursor = 0;
        self.win.rewind();
        self.noack_pkts = 0;
        self.ask_next = false;
    }

    /// After a SEND or WRITE packet with `psn` went out: sends it once more when it
    /// is the first resend after a PSN sequence NAK. The responder NAKs a gap once and
    /// then drops silently until the missing PSN arrives (IBTA 9.7.5.1.3, as rxe; it
    /// NAKs again for a packet that asks, but the requester, still going back on the
    /// first NAK, ignores that), so that one resend is the packet whose loss only the
    /// retransmission timer repairs (a NAK repairs any later one). Two copies back to back make that p² instead of
    /// p; the second is a duplicate the responder re-acknowledges without executing
    /// (9.7.5.1.3). Measured in issue 12 (5 % loss on both NICs, traced): about one NAK
    /// in twenty-five was followed by a lost first resend and waited 100–540 µs for the
    /// timer, where a NAK round trip took ~60 µs. READ and atomic requests are never
    /// repeated: a duplicate READ is served again, whole.
    fn repeat_head(&mut self, psn: Psn, kind: Kind) {
        if std::mem::take(&mut self.head_twice)
            && kind.is_plain()
            && psn == self.win.oldest_unacked()
        {
            self.cursor = 0;
            self.win.rewind();
        }
    }

    /// Moves the cursor back onto the last packet sent since the last rewind, when it
    /// is a SEND or WRITE packet, so that it goes out once more (asking, as every
    /// resend does) and the cursor then returns where it was; false (nothing moved)
    /// otherwise: nothing sent since the rewind, or a READ or atomic there (a
    /// duplicate READ is served again, whole). Karn's rule: an ACK after the resend
    /// times neither send.
    pub fn seek_last_sent(&mut self) -> bool {
        let at = self.win.cursor();
        if at == self.win.oldest_unacked() {
            return false;
        }
        let last = at.wrapping_sub(1);
        // The cursor's WQE if it is part sent, else the one before it.
        let idx = [Some(self.cursor), self.cursor.checked_sub(1)]
            .into_iter()
            .flatten()
            .find(|&i| {
                self.sq
                    .get(i)
                    .is_some_and(|e| e.started && e.contains(last))
            });
        let Some(idx) = idx.filter(|&i| self.sq[i].kind.is_plain()) else {
            return false;
        };
        if !self.win.seek(last) {
            return false;
        }
        self.rto.on_rewind();
        self.cursor = idx;
        true
    }

    /// Packets are outstanding and the last ones sent did not ask for an ACK (more
    /// were to follow them at once, or the policy's interval had not run out): only a
    /// packet sent later, asking, or the retransmission timer will get them
    /// acknowledged. The one test of that, for [`Requester::ask_before_draining`] and
    /// [`Qp::defer_unasked_timeout`].
    pub fn unasked_tail(&self) -> bool {
        self.noack_pkts > 0 && self.outstanding()
    }

    /// Entering SQD, which starts no new WQE (IBTA 10.3.1.2): if the packets sent last
    /// left out AckReq because the next WQE was to follow at once
    /// ([`Qp::next_follows`]), nothing will now ask for them, so the last one goes out
    /// once more, asking. The responder re-acknowledges a duplicate SEND or WRITE
    /// (IBTA 9.7.5.1.3, as rxe), and that ACK covers every earlier PSN. Without it
    /// those messages waited for the retransmission timer: forever with `timeout` 0,
    /// and charged against `retry_cnt` once a Local ACK Timeout had passed.
    pub fn ask_before_draining(&mut self) {
        let nothing_asks = self.unasked_tail()
            && self.win.cursor() == self.win.sent_end()
            && self.sq.get(self.cursor).is_none_or(|e| !e.started);
        let Some(idx) = self.cursor.checked_sub(1).filter(|_| nothing_asks) else {
            return;
        };
        let last = self.win.sent_end().wrapping_sub(1);
        let ends_there = self
            .sq
            .get(idx)
            .is_some_and(|e| e.started && e.kind.is_plain() && e.last_psn() == last);
        if ends_there && self.win.seek(last) {
            // Karn's rule: an ACK after the resend times neither send.
            self.rto.on_rewind();
            self.cursor = idx;
        }
    }
}

/// What one call to `emit_request` produced.
struct Emitted {
    len: usize,
    payload_len: usize,
    psn: Psn,
    next_psn: Psn,
    wqe_done: bool,
    ack_req: bool,
    dest_qpn: u32,
    digest: Option<PayloadDigest>,
}

impl Qp {
    /// The next request packet, if the requester may send one now.
    #[inline(always)]
    pub(super) fn poll_request(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &dyn Memory,
    ) -> Option<Transmit> {
        let idx = self.req.cursor;
        let e = self.req.sq.get(idx)?;
        if !self.may_send(e) {
            return None;
        }
        if self.req.recovery.probe_unanswered()
            && self.req.win.cursor() != self.req.win.oldest_unacked()
        {
            return None; // the probe is out: wait for its answer (`Probe`)
        }
        if !e.started {
            let npkts = self.psns_of(e);
            if self.qp_type.is_reliable() {
                let in_flight = self.req.win.span();
                if in_flight > 0 && in_flight + 1 > self.req.cwnd.limit() {
                    return None;
                }
                // IBTA 9.4.4 / 10.3.1: at most max_rd_atomic READ/atomic outstanding.
                if e.kind.is_rd_atomic()
                    && self.req.rd_atomic >= u32::from(self.attrs.max_rd_atomic.max(1))
                {
                    return None;
                }
            }
            let is_rd = e.kind.is_rd_atomic();
            let Some(first) = self.req.win.assign(npkts) else {
                if self.req.win.span() == 0 {
                    // Can never fit (post_send refuses such messages; this is the
                    // backstop): a local length error, not a hang.
                    self.fail_wqe_at(idx, WcStatus::LocLenErr);
                }
                // Otherwise it waits until older PSNs are acknowledged.
                return None;
            };
            if let Some(e) = self.req.sq.get_mut(idx) {
                e.first_psn = first;
                e.npkts = npkts;
                e.started = true;
            }
            self.req.win.seek(first);
            if is_rd {
                self.req.rd_atomic += 1;
            }
        } else if self.qp_type.is_reliable() {
            let ahead = self.req.win.offset(self.req.win.cursor());
            if ahead.is_some_and(|a| a >= self.req.cwnd.limit()) {
                return None;
            }
        }
        let em = match self.emit_request(idx, buf, mem) {
            Ok(Some(em)) => em,
            Ok(None) => return None,
            Err(status) => {
                self.fail_wqe_at(idx, status);
                return None;
            }
        };
        let e = self.req.sq.get(idx)?;
        // Built here, straight from the WQE or the QP attributes: a `SocketAddr` copied
        // into a local and from there into the result made two store-forwarding stalls
        // per packet (its 30 bytes are moved as two overlapping 16-byte halves; ~10 ns
        // per packet in `perf annotate` of the dataplane bench, docs/perf.md).
        let t = Transmit {
            len: em.len,
            dest: match (&e.wr.ud, &self.attrs.remote) {
                (Some(ud), _) => ud.addr,
                (None, Some(r)) => *r,
                (None, None) => return None,
            },
            src_port: self.src_port(em.dest_qpn),
            tclass: match &e.wr.ud {
                Some(ud) => ud.traffic_class,
                None => self.attrs.traffic_class,
            },
            digest: em.digest,
        };
        self.counters.bytes_sent += em.payload_len as u64;
        let resend = self.req.win.is_resend(em.psn);
        if resend {
            self.counters.retransmitted_packets += 1;
            // A resend after the probe's answer: later ACKs may be for it.
            if let Recovery::Probe(Probe { answered: true, .. }) = self.req.recovery {
                self.req.recovery = Recovery::None;
            }
        }
        self.req.rto.on_send(em.psn, resend, now);
        self.req.win.record_sent(em.next_psn);
        if em.ack_req {
            self.req.noack_pkts = 0;
            self.req.last_ask = Some(em.psn);
            self.req.ask_next = false;
        } else {
            self.req.noack_pkts += 1;
        }
        if em.wqe_done {
            self.req.cursor += 1;
        }
        let kind = e.kind;
        self.req.repeat_head(em.psn, kind);
        match self.qp_type {
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv => {
                if self.timers.retransmit.is_none() {
                    if !self.req.in_retry {
                        self.req.rto.on_arm_from_idle(now);
                    }
                    self.arm_retransmit(now);
                }
            }
            // UC and UD have no acknowledgements: a WQE is complete once its last
            // packet is on the wire (IBTA 9.8.2, 9.8.3).
            QpType::Uc | QpType::Ud => {
                if em.wqe_done {
                    self.retire_head(WcStatus::Success);
                }
            }
        }
        Some(t)
    }

    /// PSNs the WQE `e` uses: its request packets, or a READ's response packets
    /// (IBTA 9.7.1). IBTA 9.8.2: a UD message is one packet (longer ones fail in emit).
    fn psns_of(&self, e: &SqEntry) -> u32 {
        match (e.kind, self.qp_type) {
            (Kind::Atomic | Kind::AtomicWrite, _) | (_, QpType::Ud) => 1,
            _ => packets_for(e.len, self.mtu()),
        }
    }

    /// Whether the QP's state lets `e`'s next packet go now: RTS, or SQD for a WQE
    /// already started (IBTA 10.3.1.2: SQD starts no new WQE), and no RNR wait under
    /// way. (A WQE that starts is also bounded by the window, `cwnd` and
    /// `max_rd_atomic`, checked in `poll_request`.)
    #[inline(always)]
    fn may_send(&self, e: &SqEntry) -> bool {
        !self.req.rnr_paused
            && (self.state == QpState::Rts || (self.state == QpState::Sqd && e.started))
    }

    /// Whether a deep queue follows `sq[idx]` ([`DEEP_QUEUE`] WQEs or more) and its next
    /// WQE, a SEND or WRITE, can follow the last packet at once, so that the packets
    /// behind will carry the AckReq `sq[idx]`'s end leaves out. Not when the state does
    /// not let it go ([`Qp::may_send`]), when the next is a READ or atomic (bounded by
    /// `max_rd_atomic`), or when its PSNs would not fit the window now: then
    /// `sq[idx]`'s end asks for its own ACK.
    fn next_follows(&self, idx: usize) -> bool {
        let behind = self.req.sq.len().saturating_sub(idx + 1);
        if behind < DEEP_QUEUE {
            return false;
        }
        self.req.sq.get(idx + 1).is_some_and(|n| {
            self.may_send(n)
                && !n.kind.is_rd_atomic()
                && (n.started || self.req.win.can_assign(self.psns_of(n)))
        })
    }

    /// On a retransmission timeout: true (and the next packet will ask for an ACK) when
    /// the expiry says nothing about the network — every packet that asked for an ACK
    /// has been acknowledged, the packets since did not ask (more were to follow them
    /// at once), and the requester can send the next one now. The expiry is then its
    /// own delay in sending that next packet (on a loaded host the NIC thread can be
    /// descheduled for milliseconds between two packets of a stream), and the
    /// responder had no reason to answer: going back N would resend packets that
    /// arrived. (Asking once per interval opened this case; with an AckReq on every
    /// message's end it arose only inside long messages.) Only once in a row: if
    /// nothing was sent since, the next expiry goes back as usual, so a lost packet is
    /// still repaired (a gap is also NAKed by the responder when the next packet
    /// arrives, IBTA 9.7.5.1.3).
    pub(super) fn defer_unasked_timeout(&mut self) -> bool {
        let r = &self.req;
        let asked_all_acked = r.last_ask.is_none_or(|p| !r.win.contains(p));
        let can_send = r.sq.get(r.cursor).is_some_and(|e| self.may_send(e));
        if !r.unasked_tail() || r.ask_next || !asked_all_acked || !can_send {
            return false;
        }
        self.req.ask_next = true;
        true
    }

    /// Whether the packet with `psn` is the last a window shrunk by losses
    /// (`cwnd.rs`) lets out before an ACK: it asks, so that the ACK that opens the
    /// window answers everything sent, and, when the NAK of a gap before it was lost,
    /// the responder NAKs again (`responder.rs`) instead of the requester waiting for
    /// its timer. A lossless QP's window (the maximum) keeps the interval alone, so
    /// its ACKs per message do not change.
    fn fills_shrunk_window(&self, psn: Psn) -> bool {
        let limit = self.req.cwnd.limit();
        limit < MAX_OUTSTANDING_PSNS && self.req.win.offset(psn) == Some(limit - 1)
    }

    /// Writes the packet of `sq[idx]` at `cursor_psn`. `Err` is a local error that
    /// completes the WQE (IBTA 10.7.3.1: local protection error when a gather fails).
    /// Inlined into its one caller: returned through memory, the `Emitted` was written
    /// field by field and read back eight bytes at a time, a store-forwarding stall per
    /// packet (its digest: ≈ 0.5 % of a 64 KiB sender's samples, docs/perf.md).
    #[inline(always)]
    fn emit_request(
        &mut self,
        idx: usize,
        buf: &mut [u8],
        mem: &dyn Memory,
    ) -> Result<Option<Emitted>, WcStatus> {
        let mtu = self.mtu();
        let Some(e) = self.req.sq.get(idx) else {
            return Ok(None);
        };
        let psn = self.req.win.cursor();
        let k = forward(e.first_psn, psn);
        if k >= e.npkts {
            return Err(WcStatus::GeneralErr);
        }
        let offset = u64::from(k) * u64::from(mtu);
        let transport = self.qp_type.transport();
        let (operation, payload_len, pos, next_psn, wqe_done) = match e.kind {
            Kind::Send | Kind::Write => {
                let rem = u64::from(e.len).saturating_sub(offset);
                let plen = rem.min(u64::from(mtu)) as usize;
                let pos = position(k, e.npkts);
                let op = if e.kind == Kind::Send {
                    Operation::Send
                } else {
                    Operation::Write
                };
                (op, plen, pos, psn.next(), pos.ends())
            }
            Kind::Read => (Operation::ReadRequest, 0, Position::Only, e.end_psn(), true),
            Kind::Atomic => {
                let op = match e.wr.op {
                    SendOp::CompareSwap { .. } => Operation::CompareSwap,
                    _ => Operation::FetchAdd,
                };
                (op, 0, Position::Only, psn.next(), true)
            }
            Kind::AtomicWrite => (Operation::AtomicWrite, 8, Position::Only, psn.next(), true),
        };
        if self.qp_type == QpType::Ud && e.len > mtu {
            // IBTA 9.8.2: a UD message is one packet; longer is a local length error.
            return Err(WcStatus::LocLenErr);
        }
        let imm = match e.wr.op {
            SendOp::SendWithImm(i) | SendOp::WriteWithImm(i) if pos.ends() => Some(i),
            _ => None,
        };
        let inv = match e.wr.op {
            SendOp::SendWithInv(rkey) if pos.ends() => Some(rkey),
            _ => None,
        };
        let with = imm.map(|_| Header::ImmDt).or(inv.map(|_| Header::Ieth));
        let Some(opcode) = Opcode::find(transport, operation, pos, with) else {
            return Err(WcStatus::LocQpOpErr);
        };
        // Resent packets always ask for an ACK: during recovery every delivered packet
        // should count as progress, so one more loss does not cost a whole round.
        let resend = self.req.win.is_resend(psn);
        // And at least twice per window, so ACKs come back before a window shrunk by
        // losses (`cwnd.rs`) fills up.
        let interval = ACK_REQ_INTERVAL.min((self.req.cwnd.limit() / 2).max(1));
        // A message's end asks unless a deep queue follows at once (module docs).
        let at_end = pos.ends() && (e.kind.is_rd_atomic() || !self.next_follows(idx));
        let ack_req = self.qp_type.is_reliable()
            && (at_end
                || self.req.noack_pkts + 1 >= interval
                || resend
                || self.req.ask_next
                || self.fills_shrunk_window(psn));
        let dest_qpn = match &e.wr.ud {
            Some(ud) => ud.qpn,
            None => self.attrs.dest_qpn,
        };
        let mut repr = PacketRepr::new(BthRepr {
            solicited: e.wr.solicited && pos.ends(),
            // MigReq set, as the hardware RNIC of the `hw_send_imm` capture sends it
            // (rxe sends it clear; no receiver here or in rxe looks at it).
            mig_req: true,
            ack_req,
            ..BthRepr::new(opcode, Qpn::new(dest_qpn), psn)
        });
        match e.kind {
            Kind::Write if pos.starts() => {
                repr.reth = Some(RethRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    dma_len: e.len,
                });
            }
            // A READ resent from the middle asks for the rest only (IBTA 9.7.5.2.1:
            // the retried request starts at the first missing response PSN).
            Kind::Read => {
                repr.reth = Some(RethRepr {
                    va: e.wr.remote_addr.wrapping_add(offset),
                    rkey: e.wr.rkey,
                    dma_len: e.len.saturating_sub(offset as u32),
                });
            }
            // IBTA A19: the RETH names the target and a DMA length of 8.
            Kind::AtomicWrite => {
                repr.reth = Some(RethRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    dma_len: 8,
                });
            }
            Kind::Atomic => {
                let (swap_add, compare) = match e.wr.op {
                    SendOp::CompareSwap { compare, swap } => (swap, compare),
                    SendOp::FetchAdd { add } => (add, 0),
                    _ => (0, 0),
                };
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    swap_add,
                    compare,
                });
            }
            _ => {}
        }
        if let Some(imm) = imm {
            repr.immdt = Some(ImmDtRepr { imm });
        }
        if let Some(rkey) = inv {
            repr.ieth = Some(IethRepr { rkey });
        }
        if self.qp_type == QpType::XrcSend {
            // Every XRC request names the target's SRQ (IBTA 9.3: XRCETH follows the
            // BTH in each request packet, Middle and Last included).
            repr.xrceth = Some(XrcEthRepr {
                srqn: e.wr.xrc_srqn & wire::types::MASK_24,
            });
        }
        if let Some(ud) = &e.wr.ud {
            // IBTA 10.2.4: a Q_Key with the high bit set means "use the QP's Q_Key".
            let qkey = if ud.qkey & 0x8000_0000 != 0 {
                self.attrs.qkey
            } else {
                ud.qkey
            };
            repr.deth = Some(DethRepr {
                qkey,
                src_qpn: Qpn::new(self.qpn),
            });
        }
        repr.payload_len = payload_len;
        let Ok(h) = repr.emit_headers(buf) else {
            return Ok(None);
        };
        let Some(dst) = buf.get_mut(h..h + payload_len) else {
            return Ok(None);
        };
        let digest = if let SendOp::AtomicWrite { value } = e.wr.op {
            // The 8 bytes travel in the work request itself, not in a gather list.
            dst.copy_from_slice(&value);
            None
        } else if payload_len >= sgl::DIGEST_MIN_PAYLOAD {
            let Ok(crc) = sgl::gather_crc(self.pd, &e.wr, offset, dst, mem) else {
                return Err(WcStatus::LocProtErr);
            };
            PayloadDigest::at(h, payload_len, crc)
        } else if sgl::gather(self.pd, &e.wr, offset, dst, mem).is_err() {
            return Err(WcStatus::LocProtErr);
        } else {
            None
        };
        let Ok(len) = repr.emit_trailer(buf, h) else {
            return Ok(None);
        };
        if let Some(e) = self.req.sq.get_mut(idx) {
            if e.kind == Kind::Read {
                e.req_psn = psn;
            }
        }
        Ok(Some(Emitted {
            len,
            payload_len,
            psn,
            next_psn,
            wqe_done,
            ack_req,
            dest_qpn,
            digest,
        }))
    }
}
