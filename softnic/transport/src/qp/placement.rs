//! Where a packet's payload would be written: the receiver's single pass.
//!
//! A receiver that checks a packet's ICRC and then copies its payload into memory reads
//! the payload twice. One that copies it first — hashing it as it copies
//! (`Memory::write_remote_crc`, `write_local_crc`) — and then checks the ICRC with
//! that hash combined in reads it once. It writes bytes the ICRC has not vouched for
//! yet, which is what cut-through RNICs do. The argument (no IBTA section is cited
//! here: we could not check the text): a verbs consumer may rely on a receive buffer's
//! or a READ buffer's contents only after that WQE's successful completion, and on an
//! RDMA WRITE's target only once the message is known to have completed (a completion
//! in error, or none, leaves them undefined). The ICRC is an integrity check, not
//! authentication: a peer that could forge a packet could also give it a valid ICRC.
//!
//! So a packet is placed before its check only where its destination is fixed by state
//! this QP already validated, never by fields of the unverified packet itself:
//! RC/UC RDMA WRITE Middle/Last and SEND Middle at the expected PSN (the RETH or the
//! receive WQE of the message in progress, at the bytes written so far), and RC READ
//! response packets at the PSN the requester expects (the READ's own scatter list). Not
//! a RETH or AtomicETH packet (a corrupt RETH could aim the bytes anywhere in a
//! region), not UD, a duplicate, an out-of-sequence PSN, a WRITE with immediate (its
//! receive WQE may be missing), a payload that would span SGEs, or one shorter than
//! [`crate::sgl::DIGEST_MIN_PAYLOAD`]. A packet that fails its ICRC after placement is
//! dropped as any other. The bytes it wrote lie where the message in progress writes:
//! an RDMA WRITE's at its cursor inside the First packet's RETH range, a READ
//! response's at exactly that response's bytes of the READ's buffer — ranges the
//! retransmission overwrites, or the message never completes. A SEND Middle's lie at
//! its cursor inside the receive WQE's buffer, exactly the path MTU long. A SEND's
//! Last is not placed: its length (a pad count, a datagram length) is a field of the
//! unverified packet that, unlike a WRITE's, no validated RETH bounds, so a corrupted
//! one could put bytes past the completion's `byte_len` (`tests/placement_hostile.rs`
//! offers every header bit, pad count and length of each packet to this query).
//!
//! [`Qp::placement`] is a pure query over the same helpers the handling code uses
//! (`Qp::admit`, `check_packet_len`, `InMsg::write_at`, `send_window`,
//! `Qp::read_response_at`, `sgl::scatter`). Where the *verified* bytes go does not rest
//! on it: the packet is then handled through [`Placed`], which skips exactly the one
//! write that was already made and passes every other one through — so if handling
//! ever decided differently, it still writes the bytes where it wants. Where the
//! *unverified* write went does: that write is made, and stays, wherever this query
//! said. Hence the shared helpers, and `tests/placement_hostile.rs`, which holds every
//! header-corrupted variant of each packet to the message's own range.

use wire::{Operation, ParsedPacket, Position};

use super::responder::{check_packet_len, send_window};
use super::{Qp, QpType};
use crate::memory::{Access, Accessor, AtomicOp, MemError, Memory};
use crate::sgl;

/// Which key a [`Placement`] writes under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// An R_Key (RDMA WRITE): [`Memory::write_remote`].
    Remote,
    /// An L_Key of a scatter list (SEND, READ response): [`Memory::write_local`].
    Local,
}

/// Where a packet's whole payload would be written if it were handled now: one
/// contiguous range `[va, va + payload)` of the region `key`, reached by the QP `by`
/// (an L_Key of its PD, or an R_Key it may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The receiving QP: its PD (and, for an R_Key, its number).
    pub by: Accessor,
    /// R_Key or L_Key, as `target` says.
    pub key: u32,
    /// First byte.
    pub va: u64,
    /// Remote or local write.
    pub target: Target,
}

impl Placement {
    /// Writes `src` where this placement says, through `mem`'s usual checks, and
    /// returns its CRC-32 (continued from 0), copied and hashed in one pass.
    pub fn write(&self, mem: &mut dyn Memory, src: &[u8]) -> Result<u32, MemError> {
        match self.target {
            Target::Remote => mem.write_remote_crc(self.by, self.key, self.va, src, 0),
            Target::Local => mem.write_local_crc(self.by.pd, self.key, self.va, src, 0),
        }
    }
}

impl Qp {
    /// Where `pkt`'s payload would be written if it were handled now, when it may be
    /// written before its ICRC is checked (module docs); `None` otherwise. Pure: looks,
    /// changes nothing.
    pub fn placement(&self, pkt: &ParsedPacket<'_>) -> Option<Placement> {
        if pkt.payload.len() < sgl::DIGEST_MIN_PAYLOAD {
            return None;
        }
        let info = self.admit(pkt).ok()?;
        let p = pkt.repr.bth.psn;
        let plen = pkt.payload.len();
        let local = |sges: &[crate::wr::Sge], offset| {
            let (lkey, va) = single_piece(self.pd, sges, offset, pkt.payload)?;
            Some(self.at(lkey, va, Target::Local))
        };
        if info.operation == Operation::ReadResponse {
            // `handle_response`: only PSNs sent and not yet acknowledged.
            if !self.req.win.contains(p) {
                return None;
            }
            let offset = self.read_response_at(p, info, plen).ok()?;
            let head = self.req.sq.front()?;
            return local(sgl::used(&head.wr.sges, head.wr.num_sge), offset);
        }
        // Requests: RC or UC at the expected PSN (no duplicate, no gap), continuing the
        // message in progress (no RETH, no AtomicETH: those start a message).
        if !info.is_request()
            || !matches!(self.qp_type, QpType::Rc | QpType::Uc)
            || p != self.resp.epsn
            || !matches!(info.position, Position::Middle | Position::Last)
        {
            return None;
        }
        self.check_opcode_sequence(info).ok()?;
        self.check_qp_access(info).ok()?;
        check_packet_len(info.position, plen, self.mtu()).ok()?;
        let cur = self.resp.cur.as_ref()?;
        match info.operation {
            // Not a SEND's Last: its length (datagram length, pad count) is a field of
            // the unverified packet and, unlike a WRITE's, nothing validated bounds it
            // to the message — a corrupted one would put bytes past the completion's
            // `byte_len`. A Middle's payload is exactly the path MTU.
            Operation::Send if info.position == Position::Middle => {
                let recv = cur.recv.as_ref()?;
                let (sges, at) = send_window(recv, cur.written, plen).ok()?;
                local(sges, at)
            }
            // A WRITE with immediate takes a receive WQE first, which may be missing.
            Operation::Write if pkt.repr.immdt.is_none() => {
                let va = cur.write_at(plen as u64).ok()?;
                Some(self.at(cur.rkey, va, Target::Remote))
            }
            _ => None,
        }
    }

    fn at(&self, key: u32, va: u64, target: Target) -> Placement {
        Placement {
            by: self.accessor(),
            key,
            va,
            target,
        }
    }
}

/// The one `(lkey, va)` that `sgl::scatter` of `payload` at `offset` of `sges` writes,
/// found by running that scatter against a memory that only records; `None` when it
/// would write in more than one piece.
fn single_piece(
    pd: u32,
    sges: &[crate::wr::Sge],
    offset: u64,
    payload: &[u8],
) -> Option<(u32, u64)> {
    let mut rec = Recorder::default();
    sgl::scatter(pd, sges, offset, payload, &mut rec).ok()?;
    match rec {
        Recorder {
            pieces: 1,
            first: Some((lkey, va, len)),
        } if len == payload.len() => Some((lkey, va)),
        _ => None,
    }
}

/// A [`Memory`] that records the local writes made into it and refuses everything
/// else (for [`single_piece`]).
#[derive(Default)]
struct Recorder {
    pieces: usize,
    first: Option<(u32, u64, usize)>,
}

impl Memory for Recorder {
    fn read_local(&self, _: u32, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn write_local(&mut self, _: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        self.pieces += 1;
        self.first.get_or_insert((lkey, va, src.len()));
        Ok(())
    }

    fn check_remote(&self, _: Accessor, _: u32, _: u64, _: u64, _: Access) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn read_remote(&self, _: Accessor, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn write_remote(&mut self, _: Accessor, _: u32, _: u64, _: &[u8]) -> Result<(), MemError> {
        Err(MemError::AccessDenied)
    }

    fn atomic(&mut self, _: Accessor, _: u32, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Err(MemError::AccessDenied)
    }
}

/// The memory a packet placed before its check is handled with: the one write that
/// matches the placement exactly — same kind, PD (and QP, for an R_Key), key, address,
/// source bytes (the packet's own payload, by pointer) and length — was already made
/// and is skipped;
/// every other access goes to `inner` unchanged.
pub struct Placed<'a> {
    inner: &'a mut dyn Memory,
    /// The write already made: placement, source pointer, length. Taken when skipped.
    pending: Option<(Placement, *const u8, usize)>,
}

impl<'a> Placed<'a> {
    /// `inner`, where `payload` was already written as `placement` says.
    pub fn new(inner: &'a mut dyn Memory, placement: Placement, payload: &[u8]) -> Self {
        Placed {
            inner,
            pending: Some((placement, payload.as_ptr(), payload.len())),
        }
    }

    /// True when handling made the placed write (and it was skipped); false when it did
    /// not — handling decided differently from [`Qp::placement`], a bug in the query.
    pub fn skipped(&self) -> bool {
        self.pending.is_none()
    }

    /// Whether a write of `src` at `va` of `key` is the pending one. `(pd, qpn)` is the
    /// writer: an R_Key write names the whole QP, an L_Key write only its PD (`qpn`
    /// None: any QP number matches, since a local write is checked by the PD alone).
    fn is_placed(
        &mut self,
        target: Target,
        (pd, qpn): (u32, Option<u32>),
        key: u32,
        va: u64,
        src: &[u8],
    ) -> bool {
        let Some((p, ..)) = self.pending else {
            return false;
        };
        let by = Accessor {
            pd,
            qpn: qpn.unwrap_or(p.by.qpn),
        };
        let want = Placement {
            by,
            key,
            va,
            target,
        };
        if self.pending == Some((want, src.as_ptr(), src.len())) {
            self.pending = None;
            return true;
        }
        false
    }
}

impl Memory for Placed<'_> {
    fn read_local(&self, pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.inner.read_local(pd, lkey, va, dst)
    }

    fn read_local_crc(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.inner.read_local_crc(pd, lkey, va, dst, crc)
    }

    fn write_local(&mut self, pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        if self.is_placed(Target::Local, (pd, None), lkey, va, src) {
            return Ok(());
        }
        self.inner.write_local(pd, lkey, va, src)
    }

    fn check_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        self.inner.check_remote(by, rkey, va, len, access)
    }

    fn read_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        self.inner.read_remote(by, rkey, va, dst)
    }

    fn read_remote_crc(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.inner.read_remote_crc(by, rkey, va, dst, crc)
    }

    fn write_remote(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        if self.is_placed(Target::Remote, (by.pd, Some(by.qpn)), rkey, va, src) {
            return Ok(());
        }
        self.inner.write_remote(by, rkey, va, src)
    }

    fn atomic(&mut self, by: Accessor, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.inner.atomic(by, rkey, va, op)
    }

    fn invalidate(&mut self, by: Accessor, rkey: u32) -> Result<(), MemError> {
        self.inner.invalidate(by, rkey)
    }
}
