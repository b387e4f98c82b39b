//! The completer: responses → retired WQEs → completions (IBTA 9.7.5.2 "Requester
//! Side — Response Processing", 10.7.3 completions).
//!
//! Acknowledgements are cumulative by PSN (IBTA 9.7.5.1.2): an ACK, a READ response
//! or an atomic ACK with PSN `p` acknowledges every request packet up to `p`. WQEs
//! retire strictly from the head of the send queue, so completions come out in
//! posting order; a WQE yields a completion if it was signaled or if it failed
//! (IBTA 10.7.3.1: unsignaled successful WQEs complete silently).
//!
//! Retries (IBTA 9.7.5.2.1 go-back-N): a PSN sequence error NAK, an *implied NAK*
//! (a response that acknowledges PSNs beyond an outstanding READ or atomic whose own
//! response never arrived, or a READ response that skips response PSNs — IBTA
//! 9.7.5.1.4), and a Local ACK Timeout all rewind the requester to the oldest
//! unacknowledged PSN and count against `retry_cnt`. An RNR NAK (IBTA 9.7.5.2.8)
//! pauses for the RNR timer and counts against `rnr_retry` (7 = infinite), once per
//! wait: an RNR NAK that arrives during the wait is an echo and is ignored. Forward
//! progress resets both counters, as in Linux rxe.

use wire::aeth::rnr_timer_us;
use wire::{NakCode, OpcodeInfo, Operation, ParsedPacket, Position, Psn, Syndrome};

use super::requester::{position, Kind, Probe, Recovery, TailProbe};
use super::timers::ack_timeout;
use super::window::{forward, MAX_SPAN};
use super::{Qp, QpState, QpType};
use crate::memory::Memory;
use crate::sgl;
use crate::time::{Duration, Instant};
use crate::wr::WcStatus;

/// Why the requester goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryCause {
    /// The Local ACK Timeout (IBTA 9.7.6.1.3): costs one of `retry_cnt`.
    Timeout,
    /// The adaptive timer expired before a whole Local ACK Timeout passed without
    /// progress (`rto.rs`): a free resend.
    EarlyTimeout,
    SeqNak,
    ImpliedNak,
}

impl Qp {
    /// Retires the head WQE with `status`: a completion if signaled or failed, and on
    /// failure the QP moves to Err or SQE (see `on_send_error`).
    pub(super) fn retire_head(&mut self, status: WcStatus) {
        let Some(e) = self.req.pop_front() else {
            return;
        };
        if status == WcStatus::Success && e.started {
            self.req.win.advance(e.end_psn());
        }
        if e.wr.signaled || status != WcStatus::Success {
            let byte_len = match (status, e.kind) {
                (WcStatus::Success, Kind::Atomic | Kind::AtomicWrite) => 8,
                (WcStatus::Success, _) => e.len,
                _ => 0,
            };
            let c = self.send_completion(&e.wr, status, byte_len);
            self.push_completion(c);
        }
        if status != WcStatus::Success {
            self.on_send_error();
        }
    }

    /// After a send completion error: RC moves to Err (IBTA 10.3.1.7); UC and UD move
    /// to SQE, which stops only the send queue (IBTA 10.3.1.6).
    fn on_send_error(&mut self) {
        match self.qp_type {
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv => self.enter_error(),
            QpType::Uc | QpType::Ud => self.enter_sqe(),
        }
    }

    /// Completes `sq[idx]` with `status`; the WQEs before it are flushed (they were
    /// not acknowledged and the QP is leaving RTS), then the QP moves to Err or SQE.
    pub(super) fn fail_wqe_at(&mut self, idx: usize, status: WcStatus) {
        for _ in 0..idx {
            if let Some(e) = self.req.pop_front() {
                let c = self.send_completion(&e.wr, WcStatus::WrFlushErr, 0);
                self.push_completion(c);
            }
        }
        self.retire_head(status);
        if !matches!(self.state, QpState::Err | QpState::Sqe) {
            self.on_send_error();
        }
    }

    /// Forward progress: counters reset, the RTT estimate takes its sample if the timed
    /// PSN is now acknowledged, the ACK timer restarts or stops.
    fn on_progress(&mut self, now: Instant) {
        self.req.in_retry = false;
        self.req.retry_left = self.attrs.retry_cnt;
        self.req.rnr_left = self.attrs.rnr_retry;
        let win = self.req.win;
        match &mut self.req.recovery {
            Recovery::None => {}
            // Everything sent before the expiry is acknowledged: it was spurious.
            Recovery::Probe(probe) if win.acknowledged_before(probe.resume) => {
                self.req.cwnd = probe.cwnd;
                self.req.recovery = Recovery::None;
                self.counters.spurious_timeouts += 1;
            }
            Recovery::Probe(probe) => probe.answered = true,
            Recovery::TailProbe(tail) if win.acknowledged_before(tail.resume) => {
                self.req.recovery = Recovery::None;
                self.counters.spurious_timeouts += 1;
            }
            Recovery::TailProbe(tail) => tail.progressed = true,
        }
        self.req.rto.on_progress(now, |p| !win.contains(p));
        self.req.cwnd.on_progress(win.oldest_unacked());
        if self.req.outstanding() {
            self.arm_retransmit(now);
        } else {
            self.timers.retransmit = None;
        }
    }

    /// Arms the retransmission timer: the adaptive timeout, at most the Local ACK
    /// Timeout (`rto.rs`); none when `timeout` is 0.
    pub(super) fn arm_retransmit(&mut self, now: Instant) {
        let lat = self
            .req
            .rto
            .local_ack_timeout(ack_timeout(self.attrs.timeout));
        self.timers.retransmit = self.req.rto.deadline(now, lat);
    }

    /// Retires the SEND/WRITE WQEs whose every PSN is ≤ `p` and records partial
    /// progress inside a multi-packet one. Returns `(progress, blocked)`: `blocked` is
    /// true when a READ/atomic at the head has PSNs ≤ `p` — its response is missing, an
    /// implied NAK (IBTA 9.7.5.1.4).
    ///
    /// `p` is at most one before the oldest unacknowledged PSN (callers pass a PSN the
    /// window contains, or the one before it). Positions are forward offsets from the
    /// head WQE's first PSN, which is at or before the oldest unacknowledged PSN, so
    /// they stay exact however long the head message is.
    fn retire_acked(&mut self, p: Psn) -> (bool, bool) {
        let end = p.next();
        if self.req.win.offset(end).is_none() {
            return (false, false);
        }
        let mut progress = false;
        while let Some(head) = self.req.sq.front() {
            // PSNs of the head acknowledged by `p`.
            let covered = forward(head.first_psn, end);
            if !head.started || covered == 0 {
                break;
            }
            if head.kind.is_rd_atomic() {
                return (progress, true);
            }
            if covered < head.npkts {
                // Partial progress inside a multi-packet message; the cursor moves
                // past what was just acknowledged (it is not resent).
                progress |= self.req.win.advance(end);
                break;
            }
            self.retire_head(WcStatus::Success);
            progress = true;
        }
        (progress, false)
    }

    /// Goes back to the oldest unacknowledged PSN, or fails the head WQE with
    /// IBV_WC_RETRY_EXC_ERR when `retry_cnt` is used up (IBTA 9.7.6.1.3). An early,
    /// adaptive expiry ([`RetryCause::EarlyTimeout`]) goes back without costing a retry.
    fn retry(&mut self, cause: RetryCause) {
        let infinite = self.compat.retry_cnt_7_is_infinite && self.attrs.retry_cnt == 7;
        let charged = cause != RetryCause::EarlyTimeout && !infinite;
        if charged && self.req.retry_left == 0 {
            self.fail_wqe_at(0, WcStatus::RetryExcErr);
            return;
        }
        if charged {
            self.req.retry_left -= 1;
        }
        // An early expiry probes first (`Probe`); a second one keeps the first's undo.
        let head_plain = self.req.sq.front().is_some_and(|e| e.kind.is_plain());
        let probe =
            (cause == RetryCause::EarlyTimeout && head_plain).then(|| match self.req.recovery {
                Recovery::Probe(p) => Probe {
                    answered: false,
                    ..p
                },
                Recovery::None | Recovery::TailProbe(_) => Probe {
                    cwnd: self.req.cwnd,
                    resume: self.req.win.sent_end(),
                    answered: false,
                },
            });
        match cause {
            RetryCause::Timeout => self.counters.retransmit_timeouts += 1,
            RetryCause::EarlyTimeout => self.counters.early_retransmits += 1,
            RetryCause::SeqNak => self.counters.seq_nak_retries += 1,
            RetryCause::ImpliedNak => self.counters.implied_nak_retries += 1,
        }
        self.req.rewind();
        if let Some(probe) = probe {
            self.req.recovery = Recovery::Probe(probe);
        }
        self.req.head_twice = cause == RetryCause::SeqNak;
        self.req.cwnd.on_retry();
        self.req.in_retry = true;
        self.timers.retransmit = None;
    }

    /// An early (adaptive, uncharged) expiry resends the last packet sent, asking, and
    /// goes on from where it was: a tail-loss probe (TCP's, RFC 8985 §7). Whatever the
    /// responder has, that duplicate or gap filler gets an answer that says it: an ACK
    /// of everything sent when nothing is missing (the expiry was spurious, or only
    /// that packet was lost and is now repaired), or, when a packet before it is
    /// missing, a PSN sequence NAK (the responder NAKs again for a packet that asks,
    /// `responder.rs`), and the NAK goes back as any NAK does. So nothing is resent
    /// and the window is not halved unless something is missing.
    ///
    /// Before, such an expiry went back N and resent only the oldest unacknowledged
    /// packet until a response came (`Probe`, which remains for the cases below). On a
    /// loaded host most expiries are spurious (lossless runs have them, strict timing
    /// none): a NIC waited for a core, and the late ACKs arrive in batches — the
    /// responder's loop reads at most 128 datagrams per pass, so with a
    /// full window of 8 B WRITEs (128 PSNs) and the probe behind them, the first ACK
    /// covers the window only up to the last packet that asked, the requester took
    /// that for the probe's answer and resent the rest of the window (duplicates, each
    /// answered by an ACK that arrived stale): lossless, 3 M × 8 B, 93 expiries made
    /// 472 resends and 36 stale ACKs.
    ///
    /// Returns false (the caller goes back N as before) during a go-back-N with no
    /// progress since: there the first resend was most likely lost (both copies) and
    /// the requester ignores the responder's repeated NAKs as echoes, so resending the
    /// oldest packet repairs the gap a round trip sooner than a tail probe and its NAK
    /// would. (A first form probed there too and let that NAK go back; at 5 % loss one
    /// run of three fell to 0.37× the starting build's goodput with ~2,500 NAKs
    /// ignored, but one starting-build run of four did the same, so that is not
    /// resolved.) Likewise when an undo-probe is still unanswered, when there is no
    /// SEND or WRITE packet to resend ([`Requester::seek_last_sent`]), and when the
    /// last tail probe made no progress at all ([`TailProbe::progressed`]): one probe
    /// per silence, as RFC 8985 sends one, since a responder that has NAKed a gap once
    /// (rxe) answers no probe until the gap is filled, and if that NAK was lost only a
    /// go-back repairs it before the Local ACK Timeout. The timer runs on from the expiry (with its
    /// backoff), and the Local ACK Timeout period is not restarted, so a silent peer
    /// is still charged on the spec's schedule.
    fn probe_tail(&mut self) -> bool {
        if self.req.in_retry
            || self.req.recovery.probe_unanswered()
            || matches!(self.req.recovery, Recovery::TailProbe(t) if !t.progressed)
        {
            return false;
        }
        let resume = self.req.win.sent_end();
        if !self.req.seek_last_sent() {
            return false;
        }
        self.counters.early_retransmits += 1;
        // An answered undo-probe, if any, ends here: its window is no longer restored.
        self.req.recovery = Recovery::TailProbe(TailProbe {
            resume,
            progressed: false,
        });
        true
    }

    /// An implied NAK (IBTA 9.7.5.1.4): go back, unless already gone back with no
    /// progress since (the packet is then an echo of the traffic sent before the
    /// rewind: responses overtaken by reordering, NAKs caused by packets already
    /// resent). Only progress or the Local ACK Timeout re-enable NAK-driven retries,
    /// so reordering on a UDP path cannot drain `retry_cnt` without a real timeout.
    fn implied_nak(&mut self) {
        self.nak_retry(RetryCause::ImpliedNak);
    }

    fn nak_retry(&mut self, cause: RetryCause) {
        if self.req.in_retry {
            self.counters.retries_suppressed += 1;
        } else {
            self.retry(cause);
        }
    }

    /// A response packet (ACK, NAK, READ response, atomic ACK) for this requester.
    pub(super) fn handle_response(
        &mut self,
        now: Instant,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) {
        let p = pkt.repr.bth.psn;
        // Only sent, unacknowledged PSNs can be answered. Older ones (in the half of
        // the PSN space behind the oldest unacknowledged, IBTA 9.7.1) are stale
        // duplicates, which the protocol makes in normal operation: a responder
        // re-acknowledges every duplicate request with its latest PSN (IBTA
        // 9.7.5.1.3), so a resend that arrived twice, a probe answered after the late
        // ACK it probed for, or a repeated first resend after a NAK each bring back an
        // ACK that covers nothing new. They are ignored, as rxe's completer ignores a
        // response older than its expected PSN (`check_psn`), and counted apart. Newer
        // ones were never sent (a "ghost" response): dropped and counted.
        if !self.req.win.contains(p) {
            let behind = forward(p, self.req.win.oldest_unacked());
            if (1..=MAX_SPAN).contains(&behind) {
                self.counters.duplicate_responses += 1;
            } else {
                self.counters.drop_unexpected_response += 1;
            }
            return;
        }
        match info.operation {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.repr.aeth else {
                    self.counters.drop_unexpected_response += 1;
                    return;
                };
                self.handle_ack(now, p, aeth.syndrome);
            }
            Operation::ReadResponse => self.handle_read_response(now, pkt, info, mem),
            Operation::AtomicAcknowledge => self.handle_atomic_ack(now, pkt, mem),
            _ => self.counters.drop_unexpected_response += 1,
        }
    }

    fn handle_ack(&mut self, now: Instant, p: Psn, syndrome: Syndrome) {
        match syndrome {
            Syndrome::Ack { .. } => {
                self.counters.acks_received += 1;
                let (progress, blocked) = self.retire_acked(p);
                if progress {
                    self.on_progress(now);
                }
                if blocked {
                    self.implied_nak();
                }
            }
            Syndrome::RnrNak { timer } => {
                self.counters.nak_rnr_received += 1;
                // The NAK acknowledges everything before its PSN (IBTA 9.7.5.1.2).
                let (progress, blocked) = self.retire_acked(p.wrapping_sub(1));
                if progress {
                    self.on_progress(now);
                }
                if blocked {
                    self.implied_nak();
                    return;
                }
                if self.req.rnr_paused {
                    // Nothing is sent during the wait, so this answers a packet sent
                    // before it: the repeated first resend after a NAK
                    // (`Requester::repeat_head`) or a network duplicate that met the
                    // same empty receive queue. The wait under way is its retry
                    // (`rnr_retry` counts retries, IBTA 9.7.5.2.8): not charged again.
                    self.counters.retries_suppressed += 1;
                    self.timers.retransmit = None;
                    return;
                }
                if self.req.rnr_left == 0 {
                    self.fail_wqe_at(0, WcStatus::RnrRetryExcErr);
                    return;
                }
                if self.req.rnr_left != 7 {
                    self.req.rnr_left -= 1;
                }
                self.counters.rnr_retries += 1;
                self.req.rewind();
                self.req.rnr_paused = true;
                self.timers.retransmit = None;
                self.timers.rnr = Some(now + Duration::from_micros(u64::from(rnr_timer_us(timer))));
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.counters.nak_psn_seq_received += 1;
                let (progress, _) = self.retire_acked(p.wrapping_sub(1));
                if progress {
                    self.on_progress(now);
                }
                // While waiting out an RNR NAK the rewind is already pending.
                if !self.req.rnr_paused && matches!(self.state, QpState::Rts | QpState::Sqd) {
                    self.nak_retry(RetryCause::SeqNak);
                }
            }
            Syndrome::Nak(code) => {
                let status = match code {
                    NakCode::InvalidRequest => {
                        self.counters.nak_invalid_request_received += 1;
                        WcStatus::RemInvReqErr
                    }
                    NakCode::RemoteAccessError => {
                        self.counters.nak_remote_access_received += 1;
                        WcStatus::RemAccessErr
                    }
                    NakCode::RemoteOperationalError => {
                        self.counters.nak_remote_op_received += 1;
                        WcStatus::RemOpErr
                    }
                    _ => WcStatus::BadRespErr,
                };
                let (progress, _) = self.retire_acked(p.wrapping_sub(1));
                if progress {
                    self.on_progress(now);
                }
                let idx = self
                    .req
                    .sq
                    .iter()
                    .position(|e| e.started && e.contains(p))
                    .unwrap_or(0);
                self.fail_wqe_at(idx, status);
            }
            Syndrome::Reserved(_) => self.counters.drop_unexpected_response += 1,
        }
    }

    fn handle_read_response(
        &mut self,
        now: Instant,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &mut dyn Memory,
    ) {
        let p = pkt.repr.bth.psn;
        let (progress, _) = self.retire_acked(p.wrapping_sub(1));
        if progress {
            self.on_progress(now);
        }
        let offset = match self.read_response_at(p, info, pkt.payload.len()) {
            Ok(offset) => offset,
            Err(ReadMiss::ImpliedNak) => return self.implied_nak(),
            Err(ReadMiss::Drop) => {
                self.counters.drop_unexpected_response += 1;
                return;
            }
        };
        let Some(head) = self.req.sq.front() else {
            return;
        };
        let last = p == head.last_psn();
        let sges = head.wr.sges;
        let n = head.wr.num_sge;
        if sgl::scatter(self.pd, sgl::used(&sges, n), offset, pkt.payload, mem).is_err() {
            self.fail_wqe_at(0, WcStatus::LocProtErr);
            return;
        }
        self.counters.bytes_received += pkt.payload.len() as u64;
        self.req.win.advance(p.next());
        if last {
            self.retire_head(WcStatus::Success);
        }
        self.on_progress(now);
    }

    /// Where the `plen`-byte payload of the READ response at PSN `p` goes in the
    /// head WQE's scatter list (its message offset), or why it is not taken: an
    /// earlier READ/atomic left unanswered or response PSNs skipped (implied NAK, IBTA
    /// 9.7.5.1.4), or a position or length that is not this READ's. The one rule for
    /// a READ response's destination, shared with the placement query
    /// (`placement.rs`).
    pub(super) fn read_response_at(
        &self,
        p: Psn,
        info: &OpcodeInfo,
        plen: usize,
    ) -> Result<u64, ReadMiss> {
        let mtu = self.mtu();
        let head = self.req.sq.front().ok_or(ReadMiss::Drop)?;
        if head.kind == Kind::AtomicWrite && head.started && head.first_psn == p {
            // IBTA A19 (and rxe): an ATOMIC WRITE is answered by an RDMA READ Response
            // Only of zero length at its PSN; it scatters nothing.
            if p != self.req.win.oldest_unacked() {
                return Err(ReadMiss::ImpliedNak);
            }
            if info.position != Position::Only || plen != 0 {
                return Err(ReadMiss::Drop);
            }
            return Ok(0);
        }
        if head.kind != Kind::Read || !head.started || !head.contains(p) {
            // A response for a later PSN while an earlier READ/atomic is unanswered:
            // implied NAK.
            if head.started && head.kind.is_rd_atomic() && forward(head.first_psn, p) > 0 {
                return Err(ReadMiss::ImpliedNak);
            }
            return Err(ReadMiss::Drop);
        }
        if p != self.req.win.oldest_unacked() {
            // Response PSNs skipped: the missing ones were lost (IBTA 9.7.5.1.4).
            return Err(ReadMiss::ImpliedNak);
        }
        let k = forward(head.first_psn, p);
        let offset = u64::from(k) * u64::from(mtu);
        let expect = u64::from(head.len)
            .saturating_sub(offset)
            .min(u64::from(mtu));
        // Positions count from the request that produced the response: the original
        // READ (from `first_psn`) or the latest retry (from `req_psn`). Both streams
        // carry the same bytes at the same PSNs, so either is accepted.
        let retried = forward(head.first_psn, head.req_psn);
        let pos_ok = info.position == position(k, head.npkts)
            || (k >= retried
                && info.position == position(k - retried, head.npkts - retried.min(head.npkts)));
        if !pos_ok || plen as u64 != expect {
            return Err(ReadMiss::Drop);
        }
        Ok(offset)
    }

    fn handle_atomic_ack(&mut self, now: Instant, pkt: &ParsedPacket<'_>, mem: &mut dyn Memory) {
        let p = pkt.repr.bth.psn;
        let (progress, _) = self.retire_acked(p.wrapping_sub(1));
        if progress {
            self.on_progress(now);
        }
        let (Some(head), Some(ack)) = (self.req.sq.front(), pkt.repr.atomic_ack_eth) else {
            self.counters.drop_unexpected_response += 1;
            return;
        };
        if head.kind != Kind::Atomic || !head.started || head.first_psn != p {
            if head.started && head.kind.is_rd_atomic() && forward(head.first_psn, p) > 0 {
                self.implied_nak();
            } else {
                self.counters.drop_unexpected_response += 1;
            }
            return;
        }
        // The original value lands in the local 8-byte buffer in host byte order, as
        // libibverbs applications read it.
        let sge = head.wr.sges[0];
        if mem
            .write_local(self.pd, sge.lkey, sge.addr, &ack.orig.to_ne_bytes())
            .is_err()
        {
            self.fail_wqe_at(0, WcStatus::LocProtErr);
            return;
        }
        self.retire_head(WcStatus::Success);
        self.on_progress(now);
    }

    /// Timer expiries.
    pub(super) fn on_timeout(&mut self, now: Instant) {
        if self.timers.rnr.is_some_and(|t| t <= now) {
            self.timers.rnr = None;
            self.req.rnr_paused = false;
            self.req.rewind();
        }
        if self.timers.retransmit.is_some_and(|t| t <= now) {
            self.timers.retransmit = None;
            if self.req.outstanding() && matches!(self.state, QpState::Rts | QpState::Sqd) {
                if self.defer_unasked_timeout() {
                    self.arm_retransmit(now);
                    return;
                }
                let lat = (self.req.rto)
                    .local_ack_timeout(ack_timeout(self.attrs.timeout))
                    .unwrap_or(Duration::MAX);
                if self.req.rto.on_expiry(now, lat) {
                    self.retry(RetryCause::Timeout);
                } else if self.probe_tail() {
                    self.arm_retransmit(now);
                } else {
                    self.retry(RetryCause::EarlyTimeout);
                }
            }
        }
    }
}

/// Why a READ response is not placed ([`Qp::read_response_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadMiss {
    /// Responses are missing before it: the requester retries (implied NAK).
    ImpliedNak,
    /// Not a response this requester expects: dropped and counted.
    Drop,
}
