//! The responder's output: the response queue (ACK, NAK, READ response, atomic ACK),
//! duplicate handling, the error table applied, and packet emission.

use wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, OpcodeInfo, Operation, PacketRepr,
    ParsedPacket, Position, Psn, Qpn, Syndrome, Transport,
};

use super::requester::position;
use super::responder::{disposition, error_event, NakKind, RespError, Response, MAX_RESPONSES};
use super::served::{DupAtomic, DupRead};
use super::{PayloadDigest, Qp, QpState, Transmit};
use crate::memory::Memory;
use crate::sgl;
use crate::wr::{Completion, Queue, WcOpcode};

/// Credit field of the ACKs softnic sends: 31 = "no end-to-end credits" (IBTA
/// 9.7.7.2.5), what rxe sends (`AETH_ACK_UNLIMITED`).
const CREDITS_UNLIMITED: u8 = 0x1F;

const SEQ_NAK: Syndrome = Syndrome::Nak(NakCode::PsnSequenceError);

impl Qp {
    /// Queues a response, dropping (and counting) it if the queue is full.
    pub(super) fn push_response(&mut self, r: Response) {
        if self.resp.responses.len() >= MAX_RESPONSES {
            self.counters.drop_duplicate += 1;
            return;
        }
        self.resp.responses.push_back(r);
    }

    /// Queues a positive ACK of every PSN up to `psn`, replacing an unsent positive
    /// ACK at the tail (ACKs are cumulative, IBTA 9.7.5.1.2: coalescing loses nothing).
    pub(super) fn queue_ack(&mut self, psn: Psn) {
        if !self.qp_type.is_reliable() {
            return;
        }
        let msn = self.resp.msn;
        // Field by field, not `*last = ack`: the whole-value copy went through a
        // 40-byte stack temporary written in pieces and read back in 16-byte loads, a
        // store-forwarding stall on every RC request packet (30-38 % of
        // `handle_packet`'s samples at 8 B WRITEs; docs/perf.md, session 21).
        if let Some(Response::Ack {
            psn: last_psn,
            msn: last_msn,
            syndrome: Syndrome::Ack { credits },
        }) = self.resp.responses.back_mut()
        {
            (*last_psn, *last_msn, *credits) = (psn, msn, CREDITS_UNLIMITED);
            return;
        }
        self.push_response(Response::Ack {
            psn,
            msn,
            syndrome: Syndrome::Ack {
                credits: CREDITS_UNLIMITED,
            },
        });
    }

    /// Queues a NAK (never coalesced away).
    pub(super) fn queue_nak(&mut self, psn: Psn, syndrome: Syndrome) {
        if !self.qp_type.is_reliable() {
            return;
        }
        match syndrome {
            Syndrome::RnrNak { .. } => self.counters.nak_rnr_sent += 1,
            Syndrome::Nak(NakCode::PsnSequenceError) => self.counters.nak_psn_seq_sent += 1,
            Syndrome::Nak(NakCode::InvalidRequest) => self.counters.nak_invalid_request_sent += 1,
            Syndrome::Nak(NakCode::RemoteAccessError) => self.counters.nak_remote_access_sent += 1,
            Syndrome::Nak(NakCode::RemoteOperationalError) => self.counters.nak_remote_op_sent += 1,
            _ => {}
        }
        let queued = self.resp.responses.len();
        self.push_response(Response::Ack {
            psn,
            msn: self.resp.msn,
            syndrome,
        });
        if self.resp.responses.len() > queued && syndrome == SEQ_NAK {
            self.resp.seq_naks_queued += 1;
        }
    }

    /// Applies [`disposition`] to an RC request error at PSN `p`.
    pub(super) fn respond_error(&mut self, e: RespError, p: Psn) {
        let d = disposition(e);
        let syndrome = match d.nak {
            NakKind::Rnr => Syndrome::RnrNak {
                timer: self.attrs.min_rnr_timer,
            },
            NakKind::InvalidRequest => Syndrome::Nak(NakCode::InvalidRequest),
            NakKind::RemoteAccess => Syndrome::Nak(NakCode::RemoteAccessError),
            NakKind::RemoteOperational => Syndrome::Nak(NakCode::RemoteOperationalError),
        };
        self.queue_nak(p, syndrome);
        if let Some(status) = d.wc {
            if let Some(recv) = self.resp.take_current_recv() {
                let c = Completion {
                    queue: Queue::Recv,
                    wr_id: recv.wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    src_qp: self.attrs.dest_qpn,
                    srqn: 0,
                };
                self.push_completion(c);
            }
        }
        if d.next == Some(QpState::Err) {
            self.raise_error_event(error_event(e));
            self.enter_error_keeping_responses();
        }
    }

    /// A request with a PSN behind the expected one (IBTA 9.7.4.2.1, 9.7.5.1.3).
    pub(super) fn duplicate(
        &mut self,
        pkt: &ParsedPacket<'_>,
        info: &OpcodeInfo,
        mem: &dyn Memory,
    ) {
        self.counters.duplicate_requests += 1;
        let p = pkt.repr.bth.psn;
        match info.operation {
            // Re-acknowledge with the latest PSN, without executing again (C9-105
            // as quoted in rxe_resp.c).
            Operation::Send | Operation::Write => self.queue_ack(self.resp.epsn.wrapping_sub(1)),
            // Answered again from the duplicate's own PSN and RETH, if that repeats a
            // READ served here (the whole READ, or its tail from this PSN on: a retry
            // asks only for the missing responses). See `served`.
            Operation::ReadRequest => {
                let Some(reth) = pkt.repr.reth else {
                    self.counters.drop_duplicate += 1;
                    return;
                };
                let pd = match self.resp.served_reads.check(p, reth, self.mtu()) {
                    DupRead::Replay(pd) => pd,
                    DupRead::NotServed => {
                        self.counters.drop_duplicate += 1;
                        return;
                    }
                    DupRead::Mismatch => {
                        self.counters.drop_duplicate_mismatch += 1;
                        return;
                    }
                };
                // Replays are bounded separately from the resources of new requests.
                let busy = self.resp.replays_queued();
                let limit = usize::from(self.attrs.max_dest_rd_atomic.max(1));
                if busy >= limit || self.queue_read(p, reth, mem, Some(pd)).is_err() {
                    self.counters.drop_duplicate += 1;
                }
            }
            // Never executed twice: answered from the cache if identical, or dropped.
            Operation::CompareSwap | Operation::FetchAdd => {
                let eth = pkt.repr.atomic_eth;
                match self.resp.atomic_cache.check(p, info.operation, eth) {
                    DupAtomic::Replay(orig) => {
                        self.counters.atomic_replays += 1;
                        self.push_response(Response::Atomic {
                            psn: p,
                            orig,
                            msn: self.resp.msn,
                            replay: true,
                        });
                    }
                    DupAtomic::NotServed => self.counters.drop_duplicate += 1,
                    DupAtomic::Mismatch => self.counters.drop_duplicate_mismatch += 1,
                }
            }
            // Likewise: answered again (zero-length READ response) if identical to an
            // ATOMIC WRITE stored here, never stored twice.
            Operation::AtomicWrite => {
                let key = super::responder::atomic_write_key(pkt);
                match self.resp.atomic_cache.check(p, info.operation, key) {
                    DupAtomic::Replay(_) => match key {
                        Some(k) => {
                            self.counters.atomic_replays += 1;
                            self.push_atomic_write_response(p, k, true);
                        }
                        None => self.counters.drop_duplicate += 1,
                    },
                    DupAtomic::NotServed => self.counters.drop_duplicate += 1,
                    DupAtomic::Mismatch => self.counters.drop_duplicate_mismatch += 1,
                }
            }
            _ => self.counters.drop_duplicate += 1,
        }
    }

    /// Emits the next queued response.
    pub(super) fn poll_response(&mut self, buf: &mut [u8], mem: &dyn Memory) -> Option<Transmit> {
        if !self.qp_type.is_reliable() {
            return None;
        }
        let dest = self.attrs.remote?;
        let front = *self.resp.responses.front()?;
        let mut bth = BthRepr {
            mig_req: true,
            ..BthRepr::new(Opcode(0), Qpn::new(self.attrs.dest_qpn), Psn::ZERO)
        };
        let transport = self.qp_type.transport();
        let src_port = self.src_port(self.attrs.dest_qpn);
        let tclass = self.attrs.traffic_class;
        let t = |len| Transmit {
            len,
            dest,
            src_port,
            tclass,
            digest: None,
        };
        match front {
            Response::Ack { psn, msn, syndrome } => {
                self.resp.responses.pop_front();
                if syndrome == SEQ_NAK {
                    self.resp.seq_naks_queued = self.resp.seq_naks_queued.saturating_sub(1);
                }
                bth.opcode = find(transport, Operation::Acknowledge, Position::Only)?;
                bth.psn = psn;
                let mut r = PacketRepr::new(bth);
                r.aeth = Some(AethRepr { syndrome, msn });
                let len = r.emit(buf, &[]).ok()?;
                if syndrome.is_ack() {
                    self.counters.acks_sent += 1;
                }
                Some(t(len))
            }
            Response::Atomic { psn, orig, msn, .. } => {
                self.resp.responses.pop_front();
                bth.opcode = find(transport, Operation::AtomicAcknowledge, Position::Only)?;
                bth.psn = psn;
                let mut r = PacketRepr::new(bth);
                r.aeth = Some(AethRepr {
                    syndrome: Syndrome::Ack {
                        credits: CREDITS_UNLIMITED,
                    },
                    msn,
                });
                r.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                let len = r.emit(buf, &[]).ok()?;
                self.counters.atomic_acks_sent += 1;
                Some(t(len))
            }
            Response::Read {
                psn,
                va,
                rkey,
                remaining,
                k,
                npkts,
                msn,
                pd,
                ..
            } => {
                let by = crate::memory::Accessor { pd, qpn: self.qpn };
                let mtu = self.mtu();
                let plen = remaining.min(mtu);
                let pos = position(k, npkts);
                bth.opcode = find(transport, Operation::ReadResponse, pos)?;
                bth.psn = psn;
                let mut r = PacketRepr::new(bth);
                // IBTA 9.3.5: READ response First, Last and Only carry an AETH.
                if pos != Position::Middle {
                    r.aeth = Some(AethRepr {
                        syndrome: Syndrome::Ack {
                            credits: CREDITS_UNLIMITED,
                        },
                        msn,
                    });
                }
                let plen_us = plen as usize;
                r.payload_len = plen_us;
                let h = r.emit_headers(buf).ok()?;
                let dst = buf.get_mut(h..h + plen_us)?;
                let read = if plen_us >= sgl::DIGEST_MIN_PAYLOAD {
                    mem.read_remote_crc(by, rkey, va, dst, 0)
                        .map(|crc| PayloadDigest::at(h, plen_us, crc))
                } else if plen > 0 {
                    mem.read_remote(by, rkey, va, dst).map(|()| None)
                } else {
                    Ok(None)
                };
                let Ok(digest) = read else {
                    // The region went away under the READ (deregistered): fatal.
                    self.resp.responses.pop_front();
                    self.queue_nak(psn, Syndrome::Nak(NakCode::RemoteAccessError));
                    self.enter_error_keeping_responses();
                    return self.poll_response(buf, mem);
                };
                let len = r.emit_trailer(buf, h).ok()?;
                if pos.ends() {
                    self.resp.responses.pop_front();
                } else if let Some(Response::Read {
                    psn: p2,
                    va: v2,
                    remaining: r2,
                    k: k2,
                    ..
                }) = self.resp.responses.front_mut()
                {
                    *p2 = psn.next();
                    *v2 = va.wrapping_add(u64::from(plen));
                    *r2 = remaining - plen;
                    *k2 = k + 1;
                }
                self.counters.read_responses_sent += 1;
                self.counters.bytes_sent += u64::from(plen);
                Some(Transmit { digest, ..t(len) })
            }
        }
    }
}

fn find(transport: Transport, op: Operation, pos: Position) -> Option<Opcode> {
    Opcode::find(transport, op, pos, None)
}
