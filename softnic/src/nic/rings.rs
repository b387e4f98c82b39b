//! One QP as the NIC runtime holds it: the transport's [`Qp`], the consumer side of the
//! client's SQ and RQ rings, and the completions waiting for room in a CQ.
//!
//! What the runtime does with it:
//! * [`QpEntry::drain_rings`], when the client rang the QP's doorbell (or entries were
//!   left behind, [`QpEntry::needs_drain`]), copies work requests out of the SQ and RQ
//!   rings, checks
//!   and converts each (`wqe.rs`) and posts it to the [`Qp`]. A ring is consumed only
//!   while the QP can take the entry (state accepts posts, queue not full), so a QP that
//!   is not yet in RTS, or is busy, leaves entries in the ring (back-pressure: the
//!   client's ring fills up and its post fails with "queue full").
//!   A refused entry completes with `IBV_WC_LOC_QP_OP_ERR` and moves the QP to ERR
//!   (IBTA 10.10.3: a Local QP Operation Error is a QP-fatal completion error). Order
//!   is kept: the QP's earlier work requests are flushed first, then the bad entry's
//!   error completes, then later entries are flushed.
//!   A ring whose indices are impossible is corrupt: the QP goes to ERR and the ring
//!   is never read again. A slot returns to the client only when its work request has
//!   completed (`QpEntry::release_slots`); a memory-window bind or invalidation
//!   completes in its turn without reaching the transport (`rings/local_op.rs`).
//! * [`QpEntry::take_completions`] moves the QP's completions to a per-QP queue, and
//!   [`QpEntry::deliver`] writes them to the send or receive CQ. A full CQ is an overrun,
//!   which verbs reports as an asynchronous error that moves the QP to ERR (IBTA
//!   11.6.2); softnic does that but loses no completion: the rest wait here until the
//!   client polls and makes room. While completions wait, the rings are not drained,
//!   which bounds the queue.
//! * A corrupt ring or a CQ overrun raises IBV_EVENT_QP_FATAL on a QP not yet in ERR
//!   (`QpEntry::fatal`); never CQ_ERR, since the CQ itself stays intact.

use std::collections::VecDeque;
use std::net::SocketAddr;

use softnic_transport::qp::{PostError, Qp, QpAttr, QpCaps, QpState, QpType};
use softnic_transport::time::Instant;
use softnic_transport::wr::{Completion, Queue, WcOpcode, WcStatus};
use verbs_api::abi::ring::Consumer;
use verbs_api::abi::{Doorbell, RecvWqe, SendWqe};

use super::counters::NicCounters;
use super::cq::{cqe_of, grh_flag, CompletionQueue, PushError};
use super::memory::KeyMap;
use super::ready::Ticket;
use super::srq::SrqEntry;
use super::wqe;
use super::xrc::{self, XrcTarget};

mod local_op;

/// Most entries taken from one ring per iteration (fairness between QPs).
pub const DRAIN_BUDGET: usize = 64;

/// vendor_err of a completion whose CQ was full when it was first delivered.
pub const VENDOR_ERR_CQ_OVERRUN: u32 = 0x201;

/// A QP and its rings.
#[derive(Debug)]
pub struct QpEntry {
    /// The transport state machine.
    pub qp: Qp,
    /// Owning client.
    pub client: u32,
    /// CQ handle for send completions.
    pub send_cq: u32,
    /// CQ handle for receive completions.
    pub recv_cq: u32,
    /// Capabilities granted.
    pub caps: QpCaps,
    sq: Consumer<SendWqe>,
    rq: Consumer<RecvWqe>,
    /// Completions taken from the QP (or made by the NIC) not yet in a CQ, with their
    /// vendor_err code.
    pending: VecDeque<(Completion, u32)>,
    ring_broken: bool,
    overrun: bool,
    /// The last drain of the SQ / RQ left entries in the ring (the QP could not take
    /// them, or the budget ran out): the doorbell was taken, so the runtime drains again
    /// when the QP can take more ([`QpEntry::needs_drain`]).
    sq_more: bool,
    rq_more: bool,
    /// Membership of the runtime's active set (`ready.rs`); the owner gives each QP a
    /// unique serial.
    pub ticket: Ticket,
    /// The last transmit visit ended on its budget, not on an empty QP; or a packet
    /// reached the QP since that visit (it may have something to send now).
    pub tx_more: bool,
    /// Its slot on the client's doorbell page (set by the owner).
    pub doorbell: u32,
    /// The client's doorbell page, where released SQ slots are counted
    /// (`sends_retired`, hybrid polling; set by the owner).
    pub page: Option<Doorbell>,
    /// An XRC receive QP's domain (`xrc.rs`; set by the owner).
    pub xrc: Option<XrcTarget>,
}

impl QpEntry {
    /// A QP entry over attached rings.
    pub fn new(
        qp: Qp,
        client: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
        sq: Consumer<SendWqe>,
        rq: Consumer<RecvWqe>,
    ) -> Self {
        QpEntry {
            qp,
            client,
            send_cq,
            recv_cq,
            caps,
            sq,
            rq,
            pending: VecDeque::new(),
            ring_broken: false,
            overrun: false,
            sq_more: false,
            rq_more: false,
            ticket: Ticket::new(0),
            tx_more: false,
            doorbell: 0,
            page: None,
            xrc: None,
        }
    }

    /// Moves the QP to ERR (flushing its work requests into its completion queue).
    /// Moves the QP to ERR; true if it was not there already.
    fn move_to_error(&mut self, now: Instant) -> bool {
        if self.qp.state() == QpState::Err {
            return false;
        }
        let attr = QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        };
        // Any state may move to ERR (IBTA 10.3.1); an error here is impossible.
        let _ = self.qp.modify(now, &attr);
        true
    }

    /// The NIC itself moves the QP to ERR (corrupt ring, CQ overrun): the program
    /// learns why from IBV_EVENT_QP_FATAL (IBTA 11.6.3.2), raised if the QP was not in
    /// ERR already.
    fn fatal(&mut self, now: Instant) {
        if self.move_to_error(now) {
            self.qp.raise_fatal();
        }
    }

    /// Fails one entry taken from a ring: earlier work is flushed, then this entry
    /// completes with LOC_QP_OP_ERR.
    fn fail_entry(
        &mut self,
        now: Instant,
        (queue, wr_id, opcode): (Queue, u64, WcOpcode),
        vendor_err: u32,
        n: &mut NicCounters,
    ) {
        let c = Completion {
            queue,
            wr_id,
            status: WcStatus::LocQpOpErr,
            opcode,
            byte_len: 0,
            imm: None,
            src_qp: 0,
            srqn: 0,
        };
        n.wqe_invalid += 1;
        self.move_to_error(now);
        self.take_completions();
        self.pending.push_back((c, vendor_err));
    }

    fn corrupt(&mut self, now: Instant, n: &mut NicCounters) {
        if !self.ring_broken {
            n.ring_corrupt += 1;
            self.ring_broken = true;
            tracing::warn!(qpn = self.qp.qpn(), "client ring corrupt; QP moved to ERR");
        }
        self.fatal(now);
    }

    /// Hints (`verbs_api::hint`) the entry's own bytes: the loop calls this for every QP
    /// it is about to visit in a batch (rung doorbells, received datagrams) before it
    /// visits the first, so that with thousands of QPs the misses on their cold states
    /// overlap rather than come one by one as the visit reads field after field.
    /// Measured at 10,000 QPs: +10 % in the aggregate rate (docs/perf.md, session 16).
    /// Not the heap behind the transport's queues: those are reached through pointers
    /// in the entry, which are cold themselves.
    pub fn prefetch(&self) {
        let p: *const QpEntry = self;
        verbs_api::hint::prefetch_range(p.cast(), std::mem::size_of::<QpEntry>(), false);
    }

    /// Takes entries from the SQ and RQ rings into the QP. Returns how many.
    pub fn drain_rings(&mut self, now: Instant, local: SocketAddr, n: &mut NicCounters) -> usize {
        if self.ring_broken {
            return 0;
        }
        if !self.pending.is_empty() {
            // Rung, but not read now: read when the completions are out.
            (self.sq_more, self.rq_more) = (self.has_sq(), self.has_rq());
            return 0;
        }
        let recv = if self.has_rq() {
            self.drain_recv(now, n)
        } else {
            0
        };
        let send = if self.has_sq() {
            self.drain_send(now, local, n)
        } else {
            0
        };
        recv + send
    }

    /// Whether the QP's send ring is read. An XRC receive QP has no send queue (IBTA
    /// 11.4.1.2: the XRC target only responds); its ring, which the protocol has the
    /// client send for a uniform segment, is never read, whatever the client writes
    /// there or rings.
    fn has_sq(&self) -> bool {
        self.qp.qp_type() != QpType::XrcRecv
    }

    /// Whether the QP's receive ring is read: not for either XRC type, which receive
    /// (if at all) through XRC SRQs, never from a queue of their own
    /// (`ibv_create_qp_ex(3)`: XRC QPs have no receive queue).
    fn has_rq(&self) -> bool {
        !matches!(self.qp.qp_type(), QpType::XrcRecv | QpType::XrcSend)
    }

    /// Whether entries were left in a ring that the QP could take now (the runtime
    /// keeps such a QP in its active set and drains it again).
    pub fn needs_drain(&self) -> bool {
        !self.ring_broken
            && ((self.sq_more && self.can_take_send()) || (self.rq_more && self.can_take_recv()))
    }

    /// Before a packet is handled: if the QP holds no receive WQE, takes what the
    /// client has posted to the RQ ring since the last drain. A receive posted before
    /// the peer was told to send (over TCP, say) must be there when the SEND arrives,
    /// even if it arrives in the same loop iteration as the post; RC would recover
    /// with an RNR NAK, but UC and UD would drop the message.
    pub fn refill_recv(&mut self, now: Instant, n: &mut NicCounters) {
        let empty = self.qp.recv_queue_len() == 0;
        if empty && self.has_rq() && !self.ring_broken && self.pending.is_empty() {
            self.drain_recv(now, n);
        }
    }

    fn drain_send(&mut self, now: Instant, local: SocketAddr, n: &mut NicCounters) -> usize {
        let mut taken = 0;
        self.sq_more = true;
        // One slot's copy, reused: each WQE is copied out of the ring straight into it.
        let mut w = SendWqe::default();
        while taken < DRAIN_BUDGET && !self.ring_broken {
            let accepts = matches!(
                self.qp.state(),
                QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
            );
            if !accepts || self.qp.send_queue_len() >= self.caps.max_send_wr as usize {
                break;
            }
            match self.sq.pop_into(&mut w) {
                Ok(true) => {}
                Ok(false) => {
                    self.sq_more = false;
                    break;
                }
                Err(_) => {
                    self.corrupt(now, n);
                    taken += 1; // work: the QP has flush completions now
                    break;
                }
            };
            match self.local_op(&w) {
                local_op::Head::Transport => {}
                local_op::Head::Waiting => {
                    self.sq.unpop();
                    break;
                }
                local_op::Head::Done => {
                    taken += 1;
                    continue;
                }
            }
            taken += 1;
            let err = match wqe::send_wr(&w, self.qp.qp_type(), &self.caps, local) {
                Ok(wr) => match self.qp.post_send(wr) {
                    Ok(()) => None,
                    Err(e) => Some(post_vendor_err(e)),
                },
                Err(e) => Some(e.vendor_err()),
            };
            if let Some(vendor_err) = err {
                let opcode = wqe::wc_opcode_of(w.opcode).unwrap_or(WcOpcode::Send);
                self.fail_entry(now, (Queue::Send, w.wr_id, opcode), vendor_err, n);
                break;
            }
        }
        self.release_slots();
        taken
    }

    fn drain_recv(&mut self, now: Instant, n: &mut NicCounters) -> usize {
        let mut taken = 0;
        self.rq_more = true;
        while taken < DRAIN_BUDGET && !self.ring_broken {
            if self.qp.state() == QpState::Reset
                || self.qp.recv_queue_len() >= self.caps.max_recv_wr as usize
            {
                break;
            }
            let w = match self.rq.pop() {
                Ok(Some(w)) => w,
                Ok(None) => {
                    self.rq_more = false;
                    break;
                }
                Err(_) => {
                    self.corrupt(now, n);
                    taken += 1; // work: the QP has flush completions now
                    break;
                }
            };
            taken += 1;
            let err = match wqe::recv_wr(&w, &self.caps) {
                Ok(wr) => match self.qp.post_recv(wr) {
                    Ok(()) => None,
                    Err(e) => Some(post_vendor_err(e)),
                },
                Err(e) => Some(e.vendor_err()),
            };
            if let Some(vendor_err) = err {
                let entry = (Queue::Recv, w.wr_id, WcOpcode::Recv);
                self.fail_entry(now, entry, vendor_err, n);
                break;
            }
        }
        self.release_slots();
        taken
    }

    /// Moves the QP's completions into the pending queue. Returns how many.
    pub fn take_completions(&mut self) -> usize {
        let mut k = 0;
        while let Some(c) = self.qp.poll_completion() {
            self.pending.push_back((c, 0));
            k += 1;
        }
        self.release_slots();
        k
    }

    /// Returns to the client the ring slots of work requests that are done. A WQE the
    /// NIC has copied into the QP's own queue keeps its slot until it completes (or is
    /// flushed), so the client never has more than the ring's capacity outstanding and
    /// the post after that is ENOMEM, as on rxe (pyverbs' `test_full_rq_bad_flow`).
    /// Runs before the completions are written, so a client that polled one can post.
    /// Released SQ slots are counted on the client's doorbell page (`sends_retired`):
    /// its pollers nap while much work is queued (`verbs_api::poll_idle`).
    fn release_slots(&mut self) {
        let sent = self.sq.release_except(self.qp.send_queue_len() as u32);
        if let (Some(page), 1..) = (&self.page, sent) {
            page.note_sends_retired(sent);
        }
        self.rq.release_except(self.qp.recv_queue_len() as u32);
    }

    /// The CQ a completion of this QP goes to: its send or receive CQ, or for a
    /// receive completion of an XRC receive QP the CQ of the XRC SRQ its WQE came from
    /// (`ibv_create_srq_ex(3)`: an XRC SRQ's completions go to its CQ), if that SRQ
    /// is still one of the QP's domain (in `srqs`). 0: none (an XRC QP's missing
    /// side).
    fn cq_of(&self, c: &Completion, srqs: &KeyMap<SrqEntry>) -> u32 {
        match (c.queue, self.xrc) {
            (Queue::Send, _) => self.send_cq,
            (Queue::Recv, None) => self.recv_cq,
            (Queue::Recv, Some(x)) => xrc::xrc_srq_cq(srqs, x.domain, c.srqn).unwrap_or(0),
        }
    }

    /// Writes pending completions to their CQs (found by handle in `cqs`; those of XRC
    /// SRQs through `srqs`), each stamped `stamp` (`CLOCK_MONOTONIC` ns of this pass),
    /// and adds each XRC SRQ CQ written to `dirty` (the caller lists the QP's own send
    /// and receive CQs). Returns how many were written. A completion whose CQ is gone
    /// is dropped and counted (`cqe_drop_no_cq`).
    pub fn deliver(
        &mut self,
        (now, stamp): (Instant, u64),
        n: &mut NicCounters,
        cqs: &mut KeyMap<CompletionQueue>,
        srqs: &KeyMap<SrqEntry>,
        dirty: &mut Vec<u32>,
    ) -> usize {
        let mut written = 0;
        while let Some((c, vendor_err)) = self.pending.front().copied() {
            let handle = self.cq_of(&c, srqs);
            let Some(cq) = cqs.get_mut(&handle) else {
                // No CQ: an XRC SRQ destroyed under a WQE the QP held (`srq.rs`
                // `remove_srq`), or a completion of an XRC QP's missing side (none is
                // ever made). A CQ in use by a QP cannot be destroyed.
                n.cqe_drop_no_cq += 1;
                self.pending.pop_front();
                continue;
            };
            let mut cqe = cqe_of(&c, self.qp.qpn(), vendor_err);
            cqe.flags |= grh_flag(self.qp.qp_type(), &c);
            cqe.timestamp = stamp;
            match cq.push(&cqe) {
                Ok(()) => {
                    self.pending.pop_front();
                    written += 1;
                    // The QP's own CQs are listed by the caller, send CQ first; an XRC
                    // SRQ's CQ only this QP's completions reveal.
                    if self.xrc.is_some() && dirty.last() != Some(&handle) {
                        dirty.push(handle);
                    }
                }
                Err(PushError::Full) => {
                    if !self.overrun {
                        self.overrun = true;
                        n.cq_overrun += 1;
                        tracing::warn!(qpn = self.qp.qpn(), "CQ overrun; QP moved to ERR");
                        self.fatal(now);
                        self.take_completions();
                    }
                    break;
                }
                Err(PushError::Corrupt) => {
                    // Nobody can ever read this CQ again: drop what is for it.
                    self.pending.pop_front();
                    self.corrupt(now, n);
                    self.take_completions();
                }
            }
        }
        written
    }

    /// True while send work the client has posted will complete without any peer's
    /// help: entries in the SQ ring the QP can take, completions not yet written, or
    /// UD sends not yet transmitted. `ibv_resize_cq` waits for them, so that it counts
    /// the completions of sends already posted, as rxe (whose post executes them).
    pub fn sends_in_flight(&mut self) -> bool {
        let ring = self.sq.available().map(|k| k > 0).unwrap_or(false);
        (ring && self.can_take_send())
            || !self.pending.is_empty()
            || (self.qp.qp_type() == QpType::Ud && self.qp.send_queue_len() > 0)
    }

    /// The QP was just moved to Reset, where it loses its WQEs without completions
    /// (IBTA 10.3.1): completions still waiting for CQ room (a flush made before the
    /// reset) go too, so none reaches the CQ after the client removed the QP's
    /// unpolled ones (`ibv_modify_qp`, as mlx5's `mlx5_cq_clean`) — except, on a shared
    /// receive queue (an XRC receive QP's are XRC SRQs), the receive completions, whose
    /// WQEs are the SRQ's (the client keeps those too); the ring slots its queues held
    /// are returned.
    pub fn reset(&mut self) {
        let srq = self.qp.srq().is_some() || self.xrc.is_some();
        self.pending.retain(|(c, _)| srq && c.queue == Queue::Recv);
        self.release_slots();
    }

    /// Completions waiting for CQ room.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether a receive completion is among those waiting to be written (a message
    /// arrived, which its client may answer at once).
    pub fn pending_recv(&self) -> bool {
        self.pending.iter().any(|(c, _)| c.queue == Queue::Recv)
    }

    fn can_take_send(&self) -> bool {
        self.has_sq()
            && matches!(
                self.qp.state(),
                QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
            )
            && self.qp.send_queue_len() < self.caps.max_send_wr as usize
            && self.pending.is_empty()
    }

    fn can_take_recv(&self) -> bool {
        self.has_rq()
            && self.qp.state() != QpState::Reset
            && self.qp.recv_queue_len() < self.caps.max_recv_wr as usize
            && self.pending.is_empty()
    }
}

/// vendor_err for an entry the transport refused (0x180 + the reason).
fn post_vendor_err(e: PostError) -> u32 {
    0x180
        + match e {
            PostError::InvalidState(_) => 1,
            PostError::QueueFull => 2,
            PostError::TooManySge => 3,
            PostError::InlineTooLong => 4,
            PostError::UnsupportedOp => 5,
            PostError::BadUdDest => 6,
            PostError::BadAtomicSge => 7,
            PostError::TooLong => 8,
            PostError::UsesSrq => 9,
            PostError::SrqInError => 10,
        }
}
