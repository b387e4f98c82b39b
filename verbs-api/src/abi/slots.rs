//! Fixed-size ring entries: send and receive work queue entries and completion entries.
//!
//! Every slot is `#[repr(C)]`, made only of integers and integer arrays, with every
//! padding byte spelled out as a `_reserved` field. So any bit pattern is a valid value
//! (a peer may write garbage and reading it is still defined) and no uninitialised byte
//! is ever copied into shared memory. Sizes and alignments are asserted at compile time:
//! changing a slot changes the ABI and must bump [`super::ABI_VERSION`].
//!
//! Numeric codes are libibverbs': `enum ibv_wr_opcode`, `enum ibv_send_flags`,
//! `enum ibv_wc_opcode`, `enum ibv_wc_status`, `enum ibv_wc_flags` (verbs.h).

use super::{MAX_INLINE, MAX_SGE};

/// A value that may live in a ring slot.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain no padding, no pointers, no references
/// and nothing with a validity invariant (plain integers and arrays of them), so that
/// every bit pattern written by a peer is a valid value and copying one in or out of
/// shared memory never exposes uninitialised bytes.
pub unsafe trait Slot: Copy + 'static {
    /// Bytes at the start of every value that a ring always copies.
    const HEAD: usize = core::mem::size_of::<Self>();

    /// Most slots a ring of this type may have: [`super::MAX_RING_ENTRIES`] for work
    /// queues, [`super::MAX_CQ_ENTRIES`] for completions.
    const MAX_ENTRIES: u32 = super::MAX_RING_ENTRIES;

    /// Bytes from the start of this value that carry meaning; a ring copies only
    /// these (in whole words, at least [`Slot::HEAD`], at most the size) and leaves
    /// the rest of the slot as it was. Read from a copy already taken, never from
    /// shared memory. Default: all of it.
    fn used_len(&self) -> usize {
        core::mem::size_of::<Self>()
    }
}

// SAFETY: u64 is plain data without padding; used by ring tests.
unsafe impl Slot for u64 {}

/// `enum ibv_wr_opcode` values.
pub mod wr_opcode {
    /// IBV_WR_RDMA_WRITE.
    pub const RDMA_WRITE: u8 = 0;
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    pub const RDMA_WRITE_WITH_IMM: u8 = 1;
    /// IBV_WR_SEND.
    pub const SEND: u8 = 2;
    /// IBV_WR_SEND_WITH_IMM.
    pub const SEND_WITH_IMM: u8 = 3;
    /// IBV_WR_RDMA_READ.
    pub const RDMA_READ: u8 = 4;
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    pub const ATOMIC_CMP_AND_SWP: u8 = 5;
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    pub const ATOMIC_FETCH_AND_ADD: u8 = 6;
    /// IBV_WR_LOCAL_INV: the NIC already invalidated the window (`InvalidateMw`); the
    /// WQE only orders its completion.
    pub const LOCAL_INV: u8 = 7;
    /// IBV_WR_BIND_MW: the NIC already bound the window (`BindMw`); the WQE only orders
    /// its completion.
    pub const BIND_MW: u8 = 8;
    /// IBV_WR_SEND_WITH_INV: a SEND whose IETH (`imm`) names an R_Key for the
    /// responder to invalidate (IBTA 9.4.1.1).
    pub const SEND_WITH_INV: u8 = 9;
    /// IBV_WR_ATOMIC_WRITE (RC): the 8 bytes to store at `remote_addr` are
    /// `compare_add`, in memory order (`u64::from_ne_bytes` of the application's
    /// bytes); no gather list.
    pub const ATOMIC_WRITE: u8 = 15;
}

/// `enum ibv_send_flags` bits (in [`SendWqe::flags`]).
pub mod send_flags {
    /// IBV_SEND_FENCE (accepted; the NIC may treat it as a no-op on RC in order).
    pub const FENCE: u8 = 1;
    /// IBV_SEND_SIGNALED: produce a completion on success.
    pub const SIGNALED: u8 = 2;
    /// IBV_SEND_SOLICITED: set the BTH solicited-event bit.
    pub const SOLICITED: u8 = 4;
    /// IBV_SEND_INLINE: the payload is in the slot itself
    /// ([`super::SendWqe::inline_payload`]).
    pub const INLINE: u8 = 8;
    /// softnic's own (no `ibv_send_flags` value): the slot carries a UD destination in
    /// [`super::SendWqe::ud`]. The library sets it on every WQE of a UD QP; without it
    /// a ring copies no further than the gather list, and the NIC refuses the WQE of a
    /// UD QP.
    pub const UD_DEST: u8 = 0x80;
    /// softnic's own: the slot carries the remote XRC SRQ number
    /// (`ibv_send_wr.qp_type.xrc.remote_srqn`) in the destination area's
    /// [`super::UdDest::qpn`], the rest of that area zero; the inline payload then lies
    /// after the area, as with [`UD_DEST`]. The library sets it on every WQE of an
    /// XRC send QP, and the NIC refuses such a WQE without it (and any other WQE with
    /// it).
    pub const XRC_SRQN: u8 = 0x40;
    /// Either flag that fills the destination area.
    pub const DEST_AREA: u8 = UD_DEST | XRC_SRQN;
}

/// `enum ibv_wc_opcode` values (in [`Cqe::opcode`]).
pub mod wc_opcode {
    /// IBV_WC_SEND.
    pub const SEND: u32 = 0;
    /// IBV_WC_RDMA_WRITE.
    pub const RDMA_WRITE: u32 = 1;
    /// IBV_WC_RDMA_READ.
    pub const RDMA_READ: u32 = 2;
    /// IBV_WC_COMP_SWAP.
    pub const COMP_SWAP: u32 = 3;
    /// IBV_WC_FETCH_ADD.
    pub const FETCH_ADD: u32 = 4;
    /// IBV_WC_BIND_MW.
    pub const BIND_MW: u32 = 5;
    /// IBV_WC_LOCAL_INV.
    pub const LOCAL_INV: u32 = 6;
    /// IBV_WC_ATOMIC_WRITE.
    pub const ATOMIC_WRITE: u32 = 9;
    /// IBV_WC_RECV.
    pub const RECV: u32 = 128;
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_flags` bits (in [`Cqe::flags`]).
pub mod wc_flags {
    /// IBV_WC_GRH: the receive buffer starts with the 40-byte GRH (set by softnic on
    /// successful UD receives).
    pub const GRH: u32 = 1;
    /// IBV_WC_WITH_IMM: [`super::Cqe::imm`] is valid.
    pub const WITH_IMM: u32 = 2;
    /// IBV_WC_WITH_INV: a SEND with Invalidate; [`super::Cqe::imm`] is the R_Key it
    /// invalidated.
    pub const WITH_INV: u32 = 8;
}

/// `enum ibv_wc_status` values (in [`Cqe::status`]).
pub mod wc_status {
    /// IBV_WC_SUCCESS.
    pub const SUCCESS: u32 = 0;
    /// IBV_WC_LOC_LEN_ERR.
    pub const LOC_LEN_ERR: u32 = 1;
    /// IBV_WC_LOC_QP_OP_ERR.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// IBV_WC_LOC_EEC_OP_ERR.
    pub const LOC_EEC_OP_ERR: u32 = 3;
    /// IBV_WC_LOC_PROT_ERR.
    pub const LOC_PROT_ERR: u32 = 4;
    /// IBV_WC_WR_FLUSH_ERR.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// IBV_WC_MW_BIND_ERR.
    pub const MW_BIND_ERR: u32 = 6;
    /// IBV_WC_BAD_RESP_ERR.
    pub const BAD_RESP_ERR: u32 = 7;
    /// IBV_WC_LOC_ACCESS_ERR.
    pub const LOC_ACCESS_ERR: u32 = 8;
    /// IBV_WC_REM_INV_REQ_ERR.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// IBV_WC_REM_ACCESS_ERR.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// IBV_WC_REM_OP_ERR.
    pub const REM_OP_ERR: u32 = 11;
    /// IBV_WC_RETRY_EXC_ERR.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// IBV_WC_RNR_RETRY_EXC_ERR.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// IBV_WC_LOC_RDD_VIOL_ERR.
    pub const LOC_RDD_VIOL_ERR: u32 = 14;
    /// IBV_WC_REM_INV_RD_REQ_ERR.
    pub const REM_INV_RD_REQ_ERR: u32 = 15;
    /// IBV_WC_REM_ABORT_ERR.
    pub const REM_ABORT_ERR: u32 = 16;
    /// IBV_WC_INV_EECN_ERR.
    pub const INV_EECN_ERR: u32 = 17;
    /// IBV_WC_INV_EEC_STATE_ERR.
    pub const INV_EEC_STATE_ERR: u32 = 18;
    /// IBV_WC_FATAL_ERR.
    pub const FATAL_ERR: u32 = 19;
    /// IBV_WC_RESP_TIMEOUT_ERR.
    pub const RESP_TIMEOUT_ERR: u32 = 20;
    /// IBV_WC_GENERAL_ERR.
    pub const GENERAL_ERR: u32 = 21;
}

/// A scatter/gather element (`struct ibv_sge`): `length` bytes at client virtual
/// address `addr` inside the memory region whose local key is `lkey`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Client virtual address (the region's iova space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// UD destination (the address-handle content of `ibv_send_wr.wr.ud`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UdDest {
    /// Remote QP number (24 bits used).
    pub qpn: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Remote GID (IPv4-mapped `::ffff:a.b.c.d` for IPv4 peers).
    pub gid: [u8; 16],
    /// Remote UDP port (softnic extension; 4791 for a standard peer, 0 = 4791).
    pub port: u16,
    /// IP TOS / IPv6 traffic class of the datagram (`ibv_ah_attr.grh.traffic_class`).
    pub traffic_class: u8,
    /// Zero.
    pub _reserved: [u8; 5],
}

/// A send work queue entry (`struct ibv_send_wr` flattened, with the gather list and
/// inline data in the slot itself so the NIC needs nothing else from client memory).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendWqe {
    /// Caller's cookie, returned in the completion.
    pub wr_id: u64,
    /// [`wr_opcode`] value.
    pub opcode: u8,
    /// [`send_flags`] bits.
    pub flags: u8,
    /// Entries used in `sges` (0..=[`MAX_SGE`]); ignored with [`send_flags::INLINE`].
    pub num_sge: u8,
    /// Zero.
    pub _reserved0: u8,
    /// Immediate data (SEND/WRITE_WITH_IMM), as the number the application passed; it
    /// travels big-endian in the ImmDt header (IBTA 9.2.3).
    pub imm: u32,
    /// Remote virtual address (WRITE, READ, atomics).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// Inline payload bytes with [`send_flags::INLINE`] ([`SendWqe::inline_payload`]).
    pub inline_len: u32,
    /// Compare (CMP_AND_SWP) or add (FETCH_AND_ADD) operand.
    pub compare_add: u64,
    /// Swap operand (CMP_AND_SWP).
    pub swap: u64,
    /// Gather list (SEND/WRITE) or scatter list (READ; atomics: one 8-byte entry).
    /// Right after the fixed fields, so that a one-entry WQE (every atomic, and the
    /// common WRITE, SEND and READ) is its first 64 bytes: one cache line for the
    /// client to write and the NIC to read ([`SendWqe::used_len`]).
    pub sges: [Sge; MAX_SGE],
    /// UD destination (UD QPs only, with [`send_flags::UD_DEST`]).
    pub ud: UdDest,
    /// The rest of the slot. An inline payload lies here on a UD WQE; on any other it
    /// starts at the gather list ([`SendWqe::inline_offset`]).
    pub tail: [u8; MAX_INLINE],
}

/// A receive work queue entry (`struct ibv_recv_wr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RecvWqe {
    /// Caller's cookie.
    pub wr_id: u64,
    /// Entries used in `sges`.
    pub num_sge: u32,
    /// Zero.
    pub _reserved: u32,
    /// Scatter list.
    pub sges: [Sge; MAX_SGE],
}

/// A completion queue entry (`struct ibv_wc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cqe {
    /// The work request's cookie.
    pub wr_id: u64,
    /// [`wc_status`] value.
    pub status: u32,
    /// [`wc_opcode`] value.
    pub opcode: u32,
    /// [`wc_flags`] bits.
    pub flags: u32,
    /// Bytes received (receive completions) or read (RDMA READ, atomics: 8).
    pub byte_len: u32,
    /// Immediate data when [`wc_flags::WITH_IMM`] is set (as a number, see [`SendWqe::imm`]).
    pub imm: u32,
    /// The QP this completion belongs to.
    pub qp_num: u32,
    /// UD receive: the sender's QP number.
    pub src_qp: u32,
    /// Vendor error code (softnic: a NIC-specific reason, 0 = none).
    pub vendor_err: u32,
    /// When the NIC wrote the completion: nanoseconds of the host's `CLOCK_MONOTONIC`
    /// (the time of the NIC pass that delivered it), so every process on the host reads
    /// it in the same clock.
    pub timestamp: u64,
}

impl Default for SendWqe {
    fn default() -> Self {
        SendWqe {
            wr_id: 0,
            opcode: 0,
            flags: 0,
            num_sge: 0,
            _reserved0: 0,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            inline_len: 0,
            compare_add: 0,
            swap: 0,
            ud: UdDest::default(),
            sges: [Sge::default(); MAX_SGE],
            tail: [0; MAX_INLINE],
        }
    }
}

// SAFETY: repr(C), integers and integer arrays only, no implicit padding (asserted below).
unsafe impl Slot for SendWqe {
    /// The fixed fields, before the gather list.
    const HEAD: usize = core::mem::offset_of!(SendWqe, sges);

    /// Only the bytes this WQE uses: the fixed fields and its `num_sge` gather entries;
    /// with [`send_flags::DEST_AREA`] everything up to [`SendWqe::INLINE_AT`] (the UD
    /// destination is last before it); with [`send_flags::INLINE`] and a non-zero
    /// `inline_len`, that and the payload ([`SendWqe::inline_offset`]). A one-entry
    /// WRITE is 64 bytes, one cache line, rather than 144; with thousands of QPs each
    /// post writes and the NIC reads cold lines, so fewer lines per WQE is fewer misses
    /// on both sides (issue 12, "Many QPs"; docs/perf.md). The inline area is never
    /// copied unused (it once cost more than the rest of the slot: "Per-message cost").
    fn used_len(&self) -> usize {
        let inline = self.flags & send_flags::INLINE != 0;
        let inline_len = if inline {
            (self.inline_len as usize).min(MAX_INLINE)
        } else {
            0
        };
        if inline_len > 0 {
            self.inline_offset() + inline_len
        } else if self.flags & send_flags::DEST_AREA != 0 {
            Self::INLINE_AT
        } else if inline {
            // A zero-length inline message: no gather list either.
            Self::HEAD
        } else {
            Self::HEAD + core::mem::size_of::<Sge>() * usize::from(self.num_sge).min(MAX_SGE)
        }
    }
}

impl SendWqe {
    /// Where a UD WQE's inline payload starts, after its destination: everything
    /// before it is what a UD WQE always uses.
    pub const INLINE_AT: usize = core::mem::offset_of!(SendWqe, tail);

    /// Where this WQE's inline payload starts: right after the fixed fields
    /// ([`Slot::HEAD`], over the gather list an inline WQE does not use), or after the
    /// destination area with [`send_flags::UD_DEST`] or [`send_flags::XRC_SRQN`].
    ///
    /// Why over the gather list: a QP's send ring is only as wide as its WQEs can be
    /// (`layout::send_wqe_stride`), and a QP that asked for no inline room still has
    /// its gather entries' 16 bytes each. Inline bytes there cost no wider a ring, so
    /// every QP can take `max_send_sge` × 16 inline bytes, the least rxe grants
    /// (`rxe_qp_init_req`: its WQE keeps the gather list and inline data in one union),
    /// and a program that sends 16 bytes inline on a QP created with
    /// `max_inline_data` 0 (rdma-core's `rdma_xclient`) works on both.
    pub fn inline_offset(&self) -> usize {
        if self.flags & send_flags::DEST_AREA != 0 {
            Self::INLINE_AT
        } else {
            Self::HEAD
        }
    }

    /// The inline payload: `inline_len` bytes (at most [`MAX_INLINE`]) from
    /// [`Self::inline_offset`]. Meaningful only with [`send_flags::INLINE`].
    pub fn inline_payload(&self) -> &[u8] {
        let at = self.inline_offset();
        let len = (self.inline_len as usize).min(MAX_INLINE);
        &self.as_bytes()[at..at + len]
    }

    /// The [`MAX_INLINE`] bytes an inline payload may fill, from
    /// [`Self::inline_offset`] (so set [`send_flags::UD_DEST`] or [`send_flags::XRC_SRQN`] first). Writing them
    /// overwrites the gather list of a WQE without a UD destination.
    pub fn inline_area_mut(&mut self) -> &mut [u8] {
        let at = self.inline_offset();
        &mut self.as_bytes_mut()[at..at + MAX_INLINE]
    }

    fn as_bytes(&self) -> &[u8; SEND_WQE_SIZE] {
        // SAFETY: SendWqe is repr(C), SEND_WQE_SIZE bytes of integers and integer
        // arrays without padding (asserted below), so every byte is initialised and u8
        // has no alignment requirement; the borrow of `self` bounds the view's life.
        unsafe { &*(self as *const SendWqe).cast::<[u8; SEND_WQE_SIZE]>() }
    }

    fn as_bytes_mut(&mut self) -> &mut [u8; SEND_WQE_SIZE] {
        // SAFETY: as in `as_bytes`; and every field is plain integers, for which any
        // byte pattern written through the view is a valid value.
        unsafe { &mut *(self as *mut SendWqe).cast::<[u8; SEND_WQE_SIZE]>() }
    }
}

// The inline area fits after either offset.
const _: () = assert!(<SendWqe as Slot>::HEAD + MAX_INLINE <= SEND_WQE_SIZE);
const _: () = assert!(SendWqe::INLINE_AT + MAX_INLINE <= SEND_WQE_SIZE);

// SAFETY: as above.
unsafe impl Slot for RecvWqe {}
// SAFETY: as above.
unsafe impl Slot for Cqe {
    // One CQ serves many QPs (the constant's docs).
    const MAX_ENTRIES: u32 = super::MAX_CQ_ENTRIES;
}

/// Size of [`SendWqe`] in bytes.
pub const SEND_WQE_SIZE: usize = 400;
/// Size of [`RecvWqe`] in bytes.
pub const RECV_WQE_SIZE: usize = 80;
/// Size of [`Cqe`] in bytes.
pub const CQE_SIZE: usize = 48;

// The ABI: sizes equal the sum of the fields (no hidden padding) and are fixed.
const _: () = assert!(core::mem::size_of::<Sge>() == 16);
const _: () = assert!(core::mem::align_of::<Sge>() == 8);
const _: () = assert!(core::mem::size_of::<UdDest>() == 4 + 4 + 16 + 2 + 6);
const _: () = assert!(core::mem::align_of::<UdDest>() == 4);
const _: () = assert!(
    core::mem::size_of::<SendWqe>()
        == 8 + 4 + 4 + 8 + 4 + 4 + 8 + 8 + 16 * MAX_SGE + 32 + MAX_INLINE
);
const _: () = assert!(core::mem::size_of::<SendWqe>() == SEND_WQE_SIZE);
const _: () = assert!(<SendWqe as Slot>::HEAD.is_multiple_of(8));
const _: () = assert!(core::mem::align_of::<SendWqe>() == 8);
const _: () = assert!(core::mem::size_of::<RecvWqe>() == 8 + 4 + 4 + 16 * MAX_SGE);
const _: () = assert!(core::mem::size_of::<RecvWqe>() == RECV_WQE_SIZE);
const _: () = assert!(core::mem::align_of::<RecvWqe>() == 8);
const _: () = assert!(core::mem::size_of::<Cqe>() == 8 + 4 * 8 + 8);
const _: () = assert!(core::mem::size_of::<Cqe>() == CQE_SIZE);
const _: () = assert!(core::mem::align_of::<Cqe>() == 8);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn send_wqe_field_offsets_are_the_abi() {
        assert_eq!(offset_of!(SendWqe, wr_id), 0);
        assert_eq!(offset_of!(SendWqe, opcode), 8);
        assert_eq!(offset_of!(SendWqe, flags), 9);
        assert_eq!(offset_of!(SendWqe, num_sge), 10);
        assert_eq!(offset_of!(SendWqe, imm), 12);
        assert_eq!(offset_of!(SendWqe, remote_addr), 16);
        assert_eq!(offset_of!(SendWqe, rkey), 24);
        assert_eq!(offset_of!(SendWqe, inline_len), 28);
        assert_eq!(offset_of!(SendWqe, compare_add), 32);
        assert_eq!(offset_of!(SendWqe, swap), 40);
        assert_eq!(offset_of!(SendWqe, sges), 48);
        assert_eq!(offset_of!(SendWqe, ud), 112);
        assert_eq!(offset_of!(SendWqe, tail), 144);
    }

    #[test]
    fn cqe_and_recv_wqe_field_offsets_are_the_abi() {
        assert_eq!(offset_of!(Cqe, status), 8);
        assert_eq!(offset_of!(Cqe, opcode), 12);
        assert_eq!(offset_of!(Cqe, flags), 16);
        assert_eq!(offset_of!(Cqe, byte_len), 20);
        assert_eq!(offset_of!(Cqe, imm), 24);
        assert_eq!(offset_of!(Cqe, qp_num), 28);
        assert_eq!(offset_of!(Cqe, src_qp), 32);
        assert_eq!(offset_of!(Cqe, vendor_err), 36);
        assert_eq!(offset_of!(RecvWqe, num_sge), 8);
        assert_eq!(offset_of!(RecvWqe, sges), 16);
    }
}
