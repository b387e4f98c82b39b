//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`) and their translation into
//! ring slots, with the client-side checks that give precise errors.
//!
//! The checks here are a courtesy: they catch what the client can see (SGE count, keys
//! of this PD, ranges, LOCAL_WRITE where the NIC must write, atomic shape, opcodes the
//! QP type forbids). The NIC re-validates every slot it copies out of the ring.

use std::fmt;
use std::ops::BitOr;

use crate::abi::slots::{send_flags, wr_opcode};
use crate::abi::{RecvWqe, SendWqe, UdDest, MAX_INLINE, MAX_SGE};
use crate::error::PostError;
use crate::gid::{Gid, ROCE_V2_PORT};
use crate::pd::MrEntry;
use crate::qp::{QpState, QpType};

pub use crate::abi::Sge;

/// What a send work request does, with the operation's arguments (`ibv_wr_opcode` and
/// the `wr.rdma` / `wr.atomic` unions, typed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM, with the immediate data (a number; it travels big-endian).
    SendWithImm(u32),
    /// IBV_WR_SEND_WITH_INV (RC only), with the R_Key the peer invalidates on receipt
    /// (its memory window's; IBTA 10.6.7.2.4).
    SendWithInv(u32),
    /// IBV_WR_RDMA_WRITE to `remote_addr` in the peer's region `rkey`.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM (consumes a receive at the peer).
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// IBV_WR_RDMA_READ from `remote_addr` into the local SGEs.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP on the 8 bytes at `remote_addr`; the original value
    /// lands in the one 8-byte local SGE.
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// IBV_WR_ATOMIC_WRITE (RC only; IBTA 1.5 Annex A19, `ibv_wr_atomic_write`): the
    /// peer stores these 8 bytes at `remote_addr` in one store, under REMOTE_WRITE.
    /// No local buffer (an empty `sg_list`).
    AtomicWrite {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key (of a region open to REMOTE_WRITE).
        rkey: u32,
        /// The bytes, in the order they land in the peer's memory.
        value: [u8; 8],
    },
}

impl WrOpcode {
    fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }

    /// The verbs name.
    pub fn name(self) -> &'static str {
        match self {
            WrOpcode::Send => "SEND",
            WrOpcode::SendWithImm(_) => "SEND_WITH_IMM",
            WrOpcode::SendWithInv(_) => "SEND_WITH_INV",
            WrOpcode::RdmaWrite { .. } => "RDMA_WRITE",
            WrOpcode::RdmaWriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            WrOpcode::RdmaRead { .. } => "RDMA_READ",
            WrOpcode::AtomicCmpAndSwp { .. } => "ATOMIC_CMP_AND_SWP",
            WrOpcode::AtomicFetchAndAdd { .. } => "ATOMIC_FETCH_AND_ADD",
            WrOpcode::AtomicWrite { .. } => "ATOMIC_WRITE",
        }
    }
}

/// `enum ibv_send_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u8);

impl SendFlags {
    /// No flags: unsignaled (no completion on success unless the QP has sq_sig_all).
    pub const NONE: SendFlags = SendFlags(0);
    /// IBV_SEND_FENCE.
    pub const FENCE: SendFlags = SendFlags(send_flags::FENCE);
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: SendFlags = SendFlags(send_flags::SIGNALED);
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: SendFlags = SendFlags(send_flags::SOLICITED);
    /// IBV_SEND_INLINE: the payload is copied into the work request at post time, so the
    /// buffer may be reused at once. The payload is either [`SendWr::inline_data`] (bytes
    /// from anywhere, as every provider's `ibv_post_send` memcpy's from the raw address
    /// and ignores the lkey) or, when that is empty, the SGEs, which must then lie in
    /// regions of this PD (a safe API cannot read an arbitrary address).
    pub const INLINE: SendFlags = SendFlags(send_flags::INLINE);

    /// True when every flag in `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for SendFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::FENCE, "FENCE"),
            (Self::SIGNALED, "SIGNALED"),
            (Self::SOLICITED, "SOLICITED"),
            (Self::INLINE, "INLINE"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(b, _)| self.contains(*b))
            .map(|(_, n)| *n)
            .collect();
        write!(
            f,
            "{}",
            if set.is_empty() {
                "NONE".into()
            } else {
                set.join("|")
            }
        )
    }
}

/// UD destination (what an address handle holds, plus the remote QPN and Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdAddress {
    /// Remote GID.
    pub gid: Gid,
    /// Remote UDP port (0 = 4791).
    pub udp_port: u16,
    /// Remote QP number.
    pub qpn: u32,
    /// Q_Key.
    pub qkey: u32,
    /// IP TOS / IPv6 traffic class of the datagram (`grh.traffic_class`).
    pub traffic_class: u8,
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation and its arguments.
    pub opcode: WrOpcode,
    /// Gather list (SEND/WRITE), scatter list (READ), or the 8-byte result buffer
    /// (atomics).
    pub sg_list: &'a [Sge],
    /// Flags.
    pub send_flags: SendFlags,
    /// UD QPs: the destination.
    pub ud: Option<UdAddress>,
    /// XRC initiator QPs: the number of the remote XRC SRQ the message is for
    /// (`ibv_send_wr.qp_type.xrc.remote_srqn`, `ibv_wr_set_xrc_srqn`); every work
    /// request of such a QP needs one. Ignored on other QP types, as libibverbs
    /// ignores `qp_type.xrc` there.
    pub xrc_srqn: Option<u32>,
    /// With [`SendFlags::INLINE`]: the payload, gathered from these pieces in order,
    /// from any memory (registered or not); `sg_list` must then be empty. Empty: the
    /// payload of an inline send comes from `sg_list`. Set by [`SendWr::inline_bytes`].
    pub inline_data: &'a [&'a [u8]],
}

impl<'a> SendWr<'a> {
    /// An unsignaled work request.
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            opcode,
            sg_list,
            send_flags: SendFlags::NONE,
            ud: None,
            xrc_srqn: None,
            inline_data: &[],
        }
    }

    /// IBV_SEND_INLINE with the payload `pieces` (gathered in order; any memory, no
    /// lkey): the bytes are copied into the ring slot at post time. Clears `sg_list`.
    pub fn inline_bytes(mut self, pieces: &'a [&'a [u8]]) -> Self {
        self.sg_list = &[];
        self.inline_data = pieces;
        self.inline()
    }

    /// Adds IBV_SEND_SIGNALED.
    pub fn signaled(mut self) -> Self {
        self.send_flags = self.send_flags | SendFlags::SIGNALED;
        self
    }

    /// Adds IBV_SEND_INLINE.
    pub fn inline(mut self) -> Self {
        self.send_flags = self.send_flags | SendFlags::INLINE;
        self
    }

    /// Adds IBV_SEND_SOLICITED.
    pub fn solicited(mut self) -> Self {
        self.send_flags = self.send_flags | SendFlags::SOLICITED;
        self
    }

    /// Sets the UD destination.
    pub fn to(mut self, ud: UdAddress) -> Self {
        self.ud = Some(ud);
        self
    }

    /// Names the remote XRC SRQ (its [`crate::SharedReceiveQueue::srq_num`]) this
    /// work request of an XRC initiator QP is for.
    pub fn to_xrc_srq(mut self, srq_num: u32) -> Self {
        self.xrc_srqn = Some(srq_num);
        self
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive into `sg_list`.
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        RecvWr { wr_id, sg_list }
    }
}

/// What the checks need to know about the QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpLimits {
    pub qp_type: QpType,
    pub state: QpState,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    pub sq_sig_all: bool,
}

/// Finds the region of an inline send's `sge` and checks that the SGE lies inside it:
/// the library itself reads those bytes, so they must be this process's mapped memory.
///
/// Only inline SGEs are checked here. Every other SGE is the NIC's to check when it
/// executes the request, as rxe and hardware do (IBTA 10.7.2.2 C10-79: a bad L_Key or
/// address is a local protection error, reported in the completion): the post
/// succeeds, and the WR completes with `IBV_WC_LOC_PROT_ERR` and moves the QP to the
/// error state. A program that checks only completions (rping with a mismatched `-S`)
/// then sees what it sees on rxe, not an errno from the post.
fn check_inline_sge(i: usize, sge: &Sge, mrs: &[MrEntry]) -> Result<(), PostError> {
    let mr = mrs
        .iter()
        .find(|m| m.lkey == sge.lkey)
        .ok_or(PostError::BadLkey {
            sge: i,
            lkey: sge.lkey,
        })?;
    let inside = sge.addr >= mr.addr
        && sge
            .addr
            .checked_add(u64::from(sge.length))
            .is_some_and(|end| end <= mr.addr + mr.len);
    if !inside {
        return Err(PostError::OutOfRange {
            sge: i,
            addr: sge.addr,
            length: sge.length,
            mr_addr: mr.addr,
            mr_len: mr.len,
        });
    }
    Ok(())
}

/// Checks `wr` and builds its ring slot in `wqe`, a scratch slot the caller reuses for
/// every WR it posts.
///
/// Built in place rather than returned: a 400-byte `SendWqe` returned by value was
/// copied twice per WR (out of this function, then into the push), each copy reading
/// with wide loads what had just been written field by field, so the loads waited on
/// the stores instead of forwarding from them (issue 12: 14–21 % of a posting
/// client's samples). Every byte before the inline area is written for every WR; of
/// the inline area only this WR's bytes, and a ring slot receives only the bytes its
/// WQE uses (`Slot::used_len`), so nothing of an earlier WR reaches the ring. On an
/// error `wqe` holds a partial build that must not be pushed.
///
/// # Safety
/// Every entry of `mrs` must describe memory (`addr .. addr + len` in this process)
/// that is mapped and readable for the duration of the call: the INLINE flag copies
/// payload bytes from there. The PD's region table guarantees this while its read lock
/// is held (a region removes itself before it unmaps).
pub(crate) unsafe fn build_send_wqe(
    wr: &SendWr<'_>,
    q: &QpLimits,
    mrs: &[MrEntry],
    wqe: &mut SendWqe,
) -> Result<(), PostError> {
    match q.state {
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
        s => return Err(PostError::WrongState(s)),
    }
    let n = wr.sg_list.len();
    let max_sge = q.max_send_sge.min(MAX_SGE as u32);
    if n > max_sge as usize {
        return Err(PostError::TooManySge {
            count: n,
            max: max_sge,
        });
    }
    let op = wr.opcode;
    let inline = wr.send_flags.contains(SendFlags::INLINE);
    match (q.qp_type, op) {
        (QpType::Ud, WrOpcode::Send | WrOpcode::SendWithImm(_)) if wr.ud.is_none() => {
            return Err(PostError::Unsupported(
                "a UD send needs a destination (SendWr::to)".into(),
            ));
        }
        (QpType::Ud, WrOpcode::Send | WrOpcode::SendWithImm(_)) => {}
        (QpType::Ud, _) => {
            return Err(PostError::Unsupported(format!(
                "{} is not supported on a UD QP (only SEND and SEND_WITH_IMM)",
                op.name()
            )))
        }
        (QpType::XrcSend, _) if wr.xrc_srqn.is_none() => {
            return Err(PostError::Unsupported(
                "an XRC send QP's work request names the remote XRC SRQ \
                 (SendWr::to_xrc_srq, qp_type.xrc.remote_srqn)"
                    .into(),
            ));
        }
        (QpType::XrcSend, _) if wr.xrc_srqn.is_some_and(|n| n > 0xFF_FFFF) => {
            return Err(PostError::Unsupported(format!(
                "XRC SRQ number {:#x} does not fit in 24 bits",
                wr.xrc_srqn.unwrap_or(0)
            )));
        }
        (QpType::XrcRecv, _) => {
            return Err(PostError::Unsupported(
                "an XRC receive QP has no send queue".into(),
            ));
        }
        (QpType::Uc | QpType::XrcSend, WrOpcode::AtomicWrite { .. }) => {
            return Err(PostError::Unsupported(
                "ATOMIC_WRITE is an RC operation (IBTA A19 defines no UC or XRC opcode)".into(),
            ));
        }
        (QpType::Uc, WrOpcode::RdmaRead { .. })
        | (QpType::Uc, WrOpcode::AtomicCmpAndSwp { .. })
        | (QpType::Uc, WrOpcode::AtomicFetchAndAdd { .. })
        | (QpType::Uc, WrOpcode::SendWithInv(_)) => {
            return Err(PostError::Unsupported(format!(
                "{} is not supported on a UC QP (IBTA 9.8.1: no READ or atomics)",
                op.name()
            )))
        }
        _ => {}
    }
    // The NIC writes into the local SGEs of READ responses and atomic results.
    let need_write = matches!(op, WrOpcode::RdmaRead { .. }) || op.is_atomic();
    if let WrOpcode::AtomicWrite { remote_addr, .. } = op {
        //= IBTA A19 (oA19-28): 8 bytes at an 8-byte-aligned address, carried in the
        //= request: nothing to gather or inline.
        if remote_addr % 8 != 0 || n != 0 || inline || !wr.inline_data.is_empty() {
            return Err(PostError::BadAtomic(format!(
                "ATOMIC_WRITE to {remote_addr:#x}: needs an 8-byte-aligned address and \
                 no sg_list or inline data"
            )));
        }
    }
    if inline && need_write {
        return Err(PostError::Unsupported(format!(
            "IBV_SEND_INLINE is meaningless for {} (the NIC writes the local buffer)",
            op.name()
        )));
    }
    if !wr.inline_data.is_empty() && (!inline || n != 0) {
        return Err(PostError::Unsupported(
            "inline_data needs IBV_SEND_INLINE and an empty sg_list (SendWr::inline_bytes)".into(),
        ));
    }
    let mut total: u64 = wr.inline_data.iter().map(|p| p.len() as u64).sum();
    // The parts an earlier WR may have left that not every WQE overwrites below.
    wqe.sges = [Sge::default(); MAX_SGE];
    wqe.ud = UdDest::default();
    wqe._reserved0 = 0;
    wqe.inline_len = 0;
    for (i, sge) in wr.sg_list.iter().enumerate() {
        if inline {
            check_inline_sge(i, sge, mrs)?;
        }
        total += u64::from(sge.length);
        wqe.sges[i] = *sge;
    }
    if total > 1 << 31 {
        return Err(PostError::TooLong(total));
    }
    let (opcode, remote_addr, rkey, compare_add, swap, imm) = match op {
        WrOpcode::Send => (wr_opcode::SEND, 0, 0, 0, 0, 0),
        WrOpcode::SendWithImm(imm) => (wr_opcode::SEND_WITH_IMM, 0, 0, 0, 0, imm),
        WrOpcode::SendWithInv(rkey) => (wr_opcode::SEND_WITH_INV, 0, 0, 0, 0, rkey),
        WrOpcode::RdmaWrite { remote_addr, rkey } => {
            (wr_opcode::RDMA_WRITE, remote_addr, rkey, 0, 0, 0)
        }
        WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => (wr_opcode::RDMA_WRITE_WITH_IMM, remote_addr, rkey, 0, 0, imm),
        WrOpcode::RdmaRead { remote_addr, rkey } => {
            (wr_opcode::RDMA_READ, remote_addr, rkey, 0, 0, 0)
        }
        WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => (
            wr_opcode::ATOMIC_CMP_AND_SWP,
            remote_addr,
            rkey,
            compare,
            swap,
            0,
        ),
        WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => (
            wr_opcode::ATOMIC_FETCH_AND_ADD,
            remote_addr,
            rkey,
            add,
            0,
            0,
        ),
        WrOpcode::AtomicWrite {
            remote_addr,
            rkey,
            value,
        } => (
            wr_opcode::ATOMIC_WRITE,
            remote_addr,
            rkey,
            u64::from_ne_bytes(value),
            0,
            0,
        ),
    };
    if op.is_atomic() {
        //= IBTA 1.4 §9.4.5: the atomic operand is a naturally aligned 64-bit word.
        if remote_addr % 8 != 0 {
            return Err(PostError::BadAtomic(format!(
                "{}: remote address {remote_addr:#x} is not 8-byte aligned",
                op.name()
            )));
        }
        if n != 1 || wr.sg_list.first().is_some_and(|s| s.length != 8) {
            return Err(PostError::BadAtomic(format!(
                "{} needs exactly one 8-byte SGE for the original value",
                op.name()
            )));
        }
    }
    wqe.wr_id = wr.wr_id;
    wqe.opcode = opcode;
    wqe.remote_addr = remote_addr;
    wqe.rkey = rkey;
    wqe.compare_add = compare_add;
    wqe.swap = swap;
    wqe.imm = imm;
    let mut flags =
        wr.send_flags.0 & (send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED);
    if q.sq_sig_all {
        flags |= send_flags::SIGNALED;
    }
    // A destination travels only on a UD QP (its stride has room for it; a connected
    // QP's destination is its peer, and libibverbs ignores `wr.ud` there too).
    if let Some(ud) = wr.ud.filter(|_| q.qp_type == QpType::Ud) {
        flags |= send_flags::UD_DEST;
        wqe.ud = UdDest {
            qpn: ud.qpn,
            qkey: ud.qkey,
            gid: ud.gid.0,
            port: if ud.udp_port == 0 {
                ROCE_V2_PORT
            } else {
                ud.udp_port
            },
            traffic_class: ud.traffic_class,
            _reserved: [0; 5],
        };
    }
    // An XRC initiator's every WQE carries the SRQ number in the destination area, the
    // rest of the area zero (`send_flags::XRC_SRQN`); its stride has room for it
    // (`QpCaps::sq_shape`).
    if let Some(srqn) = wr.xrc_srqn.filter(|_| q.qp_type == QpType::XrcSend) {
        flags |= send_flags::XRC_SRQN;
        wqe.ud.qpn = srqn;
    }
    if inline {
        let max = q.max_inline.min(MAX_INLINE as u32);
        if total > u64::from(max) {
            return Err(PostError::InlineTooLarge {
                len: total as usize,
                max,
            });
        }
        // The payload starts where `flags` says (after a UD destination, else over the
        // gather list: `SendWqe::inline_offset`), so the flags go in first.
        wqe.flags = flags | send_flags::INLINE;
        let area = wqe.inline_area_mut();
        let mut at = 0usize;
        for piece in wr.inline_data {
            area[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        for sge in wr.sg_list {
            let len = sge.length as usize;
            // SAFETY: check_inline_sge proved [addr, addr+len) lies inside a table entry, which
            // the caller guarantees is mapped and readable; at + len ≤ total ≤ MAX_INLINE
            // = area.len() bounds the destination. The source is shared memory the NIC
            // may write, so it is copied byte-wise without forming a reference.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    sge.addr as usize as *const u8,
                    area.as_mut_ptr().add(at),
                    len,
                );
            }
            at += len;
        }
        wqe.inline_len = at as u32;
        wqe.num_sge = 0;
        flags |= send_flags::INLINE;
    } else {
        wqe.num_sge = n as u8;
    }
    wqe.flags = flags;
    Ok(())
}

/// Checks `wr` and builds its ring slot. Its SGEs' keys, ranges and LOCAL_WRITE access
/// are the NIC's to check, when a message lands there (see [`check_inline_sge`]).
pub(crate) fn build_recv_wqe(wr: &RecvWr<'_>, q: &QpLimits) -> Result<RecvWqe, PostError> {
    if q.state == QpState::Reset {
        return Err(PostError::WrongState(q.state));
    }
    let n = wr.sg_list.len();
    let max_sge = q.max_recv_sge.min(MAX_SGE as u32);
    if n > max_sge as usize {
        return Err(PostError::TooManySge {
            count: n,
            max: max_sge,
        });
    }
    let mut wqe = RecvWqe {
        wr_id: wr.wr_id,
        num_sge: n as u32,
        ..RecvWqe::default()
    };
    for (i, sge) in wr.sg_list.iter().enumerate() {
        wqe.sges[i] = *sge;
    }
    Ok(wqe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(state: QpState) -> QpLimits {
        QpLimits {
            qp_type: QpType::Rc,
            state,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline: 64,
            sq_sig_all: false,
        }
    }

    /// A fake region table over test-owned buffers.
    fn table(bufs: &[(u32, &[u8])]) -> Vec<MrEntry> {
        bufs.iter()
            .map(|(lkey, b)| MrEntry {
                lkey: *lkey,
                addr: b.as_ptr() as u64,
                len: b.len() as u64,
            })
            .collect()
    }

    fn post(wr: &SendWr<'_>, q: &QpLimits, mrs: &[MrEntry]) -> Result<SendWqe, PostError> {
        let mut wqe = SendWqe::default();
        // SAFETY: every table entry in these tests points at a live test buffer.
        unsafe { build_send_wqe(wr, q, mrs, &mut wqe) }.map(|()| wqe)
    }

    /// The bytes of `w` a ring slot receives (`Slot::used_len`).
    fn slot_bytes(w: &SendWqe) -> Vec<u8> {
        use crate::abi::Slot;
        // SAFETY: SendWqe is repr(C) plain data without padding (slots.rs), so all of
        // its bytes are initialised; `w` outlives the slice.
        let all = unsafe {
            std::slice::from_raw_parts(
                (w as *const SendWqe).cast::<u8>(),
                std::mem::size_of::<SendWqe>(),
            )
        };
        all[..w.used_len()].to_vec()
    }

    /// `post_send` builds every WR of a call in one scratch slot: what reaches the ring
    /// for each must be what a fresh slot would give, whatever the WRs before it left
    /// there (a long inline payload, a UD destination, more SGEs, a refused WR).
    #[test]
    fn a_reused_scratch_slot_carries_nothing_of_an_earlier_wr() {
        let buf = [0x5au8; 256];
        let mrs = table(&[(0x10, &buf)]);
        let base = buf.as_ptr() as u64;
        let sge = |off: u64, length: u32, lkey: u32| Sge {
            addr: base + off,
            length,
            lkey,
        };
        let (one, bad) = ([sge(0, 8, 0x10)], [sge(0, 8, 0x99)]);
        let two = [sge(16, 32, 0x10), sge(64, 24, 0x10)];
        let long: &[u8] = &[0xc3; 60];
        let short: &[u8] = &[0x3c; 3];
        let (pieces_long, pieces_short) = ([long], [short]);
        let write = WrOpcode::RdmaWrite {
            remote_addr: 0x4000,
            rkey: 0x77,
        };
        let dest = UdAddress {
            gid: Gid::default(),
            udp_port: 4791,
            qpn: 0x1234,
            qkey: 0x11,
            traffic_class: 0,
        };
        let rc = limits(QpState::Rts);
        let mut ud = limits(QpState::Rts);
        ud.qp_type = QpType::Ud;
        let wrs: [(SendWr<'_>, &QpLimits); 9] = [
            (
                SendWr::new(1, WrOpcode::Send, &[]).inline_bytes(&pieces_long),
                &rc,
            ),
            (SendWr::new(2, write, &one), &rc),
            (SendWr::new(3, WrOpcode::Send, &two).signaled(), &rc),
            (SendWr::new(4, WrOpcode::SendWithImm(9), &one).to(dest), &ud),
            (
                SendWr::new(5, WrOpcode::Send, &[]).inline_bytes(&pieces_short),
                &rc,
            ),
            (SendWr::new(6, write, &bad), &rc),
            (SendWr::new(7, write, &two).inline(), &rc),
            (SendWr::new(8, WrOpcode::Send, &[]).inline(), &rc),
            (SendWr::new(9, write, &one), &rc),
        ];
        let mut scratch = SendWqe::default();
        for (wr, q) in &wrs {
            let fresh = post(wr, q, &mrs);
            // SAFETY: every table entry points at a live test buffer.
            let reused = unsafe { build_send_wqe(wr, q, &mrs, &mut scratch) };
            match (fresh, reused) {
                (Ok(w), Ok(())) => {
                    assert_eq!(slot_bytes(&scratch), slot_bytes(&w), "wr {}", wr.wr_id)
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("wr {}: fresh {a:?}, reused {b:?}", wr.wr_id),
            }
        }
    }

    #[test]
    fn write_builds_the_slot_fields() {
        let buf = [0u8; 128];
        let mrs = table(&[(0x10, &buf)]);
        let base = buf.as_ptr() as u64;
        let sgl = [Sge {
            addr: base + 8,
            length: 100,
            lkey: 0x10,
        }];
        let wr = SendWr::new(
            7,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: 0x55,
                imm: 0xabcd,
            },
            &sgl,
        )
        .signaled();
        let w = post(&wr, &limits(QpState::Rts), &mrs).unwrap();
        assert_eq!(w.wr_id, 7);
        assert_eq!(w.opcode, wr_opcode::RDMA_WRITE_WITH_IMM);
        assert_eq!(w.flags, send_flags::SIGNALED);
        assert_eq!(w.num_sge, 1);
        assert_eq!(w.sges[0], sgl[0]);
        assert_eq!((w.remote_addr, w.rkey, w.imm), (0x1000, 0x55, 0xabcd));
    }

    /// Two SGEs on `buf` (registered as 0x10): the first at `first_at`, the second
    /// under a key no region has.
    fn known_then_unknown_key(buf: &[u8], first_at: u64) -> [Sge; 2] {
        let base = buf.as_ptr() as u64;
        let sge = |addr, lkey| Sge {
            addr,
            length: 8,
            lkey,
        };
        [sge(base + first_at, 0x10), sge(base, 0x1234)]
    }

    /// A gather list's keys and ranges are the NIC's to judge (a LOC_PROT_ERR
    /// completion, as rxe): the post takes them as they are.
    #[test]
    fn a_bad_lkey_or_range_is_posted_for_the_nic_to_judge() {
        let buf = [0u8; 64];
        let mrs = table(&[(0x10, &buf)]);
        let sgl = known_then_unknown_key(&buf, 60);
        let w = post(
            &SendWr::new(1, WrOpcode::Send, &sgl),
            &limits(QpState::Rts),
            &mrs,
        )
        .unwrap();
        assert_eq!((w.num_sge, w.sges[0], w.sges[1]), (2, sgl[0], sgl[1]));
    }

    /// An inline send's bytes are read by the library itself: their SGEs must lie in
    /// this PD's regions.
    #[test]
    fn an_inline_sges_bad_lkey_is_named() {
        let buf = [0u8; 64];
        let mrs = table(&[(0x10, &buf)]);
        let sgl = known_then_unknown_key(&buf, 0);
        let err = post(
            &SendWr::new(1, WrOpcode::Send, &sgl).inline(),
            &limits(QpState::Rts),
            &mrs,
        )
        .unwrap_err();
        assert_eq!(
            err,
            PostError::BadLkey {
                sge: 1,
                lkey: 0x1234
            }
        );
        assert_eq!(
            err.to_string(),
            "SGE 1: lkey 0x1234 is not a memory region of this protection domain"
        );
    }

    #[test]
    fn an_inline_sge_out_of_range_or_overflowing_is_caught() {
        let buf = [0u8; 64];
        let mrs = table(&[(1, &buf)]);
        let base = buf.as_ptr() as u64;
        for sge in [
            Sge {
                addr: base + 60,
                length: 8,
                lkey: 1,
            },
            Sge {
                addr: base - 1,
                length: 1,
                lkey: 1,
            },
            Sge {
                addr: u64::MAX - 2,
                length: 8,
                lkey: 1,
            },
        ] {
            let e = post(
                &SendWr::new(1, WrOpcode::Send, &[sge]).inline(),
                &limits(QpState::Rts),
                &mrs,
            )
            .unwrap_err();
            assert!(matches!(e, PostError::OutOfRange { sge: 0, .. }), "{e:?}");
        }
    }

    /// LOCAL_WRITE on a READ's or atomic's local region is the NIC's to check (the
    /// post takes it); the atomic's shape is checked here, as rxe does at post.
    #[test]
    fn atomics_need_their_shape() {
        let ro = [0u8; 64];
        let mut rw = [0u8; 64];
        let rw_ptr = rw.as_mut_ptr() as u64;
        let mrs = table(&[(1, &ro), (2, &rw)]);
        let q = limits(QpState::Rts);
        let read = WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 9,
        };
        let ro_sge = [Sge {
            addr: ro.as_ptr() as u64,
            length: 8,
            lkey: 1,
        }];
        assert!(post(&SendWr::new(1, read, &ro_sge), &q, &mrs).is_ok());
        let rw8 = [Sge {
            addr: rw_ptr,
            length: 8,
            lkey: 2,
        }];
        assert!(post(&SendWr::new(1, read, &rw8), &q, &mrs).is_ok());
        let faa = |addr| WrOpcode::AtomicFetchAndAdd {
            remote_addr: addr,
            rkey: 3,
            add: 1,
        };
        let w = post(&SendWr::new(1, faa(0x1008), &rw8), &q, &mrs).unwrap();
        assert_eq!(
            (w.opcode, w.compare_add),
            (wr_opcode::ATOMIC_FETCH_AND_ADD, 1)
        );
        assert!(matches!(
            post(&SendWr::new(1, faa(0x1004), &rw8), &q, &mrs),
            Err(PostError::BadAtomic(_))
        ));
        let rw4 = [Sge {
            addr: rw_ptr,
            length: 4,
            lkey: 2,
        }];
        assert!(matches!(
            post(&SendWr::new(1, faa(0x1000), &rw4), &q, &mrs),
            Err(PostError::BadAtomic(_))
        ));
        assert!(matches!(
            post(&SendWr::new(1, faa(0x1000), &[]), &q, &mrs),
            Err(PostError::BadAtomic(_))
        ));
    }

    #[test]
    fn inline_copies_the_bytes_and_respects_max_inline() {
        let a = *b"hello ";
        let b = *b"world";
        let mrs = table(&[(1, &a), (2, &b)]);
        let sgl = [
            Sge {
                addr: a.as_ptr() as u64,
                length: 6,
                lkey: 1,
            },
            Sge {
                addr: b.as_ptr() as u64,
                length: 5,
                lkey: 2,
            },
        ];
        let w = post(
            &SendWr::new(1, WrOpcode::Send, &sgl).inline(),
            &limits(QpState::Rts),
            &mrs,
        )
        .unwrap();
        assert_eq!(w.inline_payload(), b"hello world");
        assert_eq!(w.num_sge, 0);
        assert_eq!(w.flags & send_flags::INLINE, send_flags::INLINE);
        let mut q = limits(QpState::Rts);
        q.max_inline = 10;
        assert_eq!(
            post(&SendWr::new(1, WrOpcode::Send, &sgl).inline(), &q, &mrs),
            Err(PostError::InlineTooLarge { len: 11, max: 10 })
        );
    }

    #[test]
    fn inline_bytes_come_from_any_memory_and_ignore_the_region_table() {
        // No region at all: the pieces are plain (unregistered) Rust memory.
        let head = *b"hello ";
        let tail = vec![b'w', b'o', b'r', b'l', b'd'];
        let pieces: [&[u8]; 2] = [&head, &tail];
        let q = limits(QpState::Rts);
        let w = post(
            &SendWr::new(4, WrOpcode::Send, &[]).inline_bytes(&pieces),
            &q,
            &[],
        )
        .unwrap();
        assert_eq!(w.inline_payload(), b"hello world");
        assert_eq!((w.num_sge, w.flags), (0, send_flags::INLINE));
        let mut small = q;
        small.max_inline = 10;
        assert_eq!(
            post(
                &SendWr::new(4, WrOpcode::Send, &[]).inline_bytes(&pieces),
                &small,
                &[]
            ),
            Err(PostError::InlineTooLarge { len: 11, max: 10 })
        );
        // A read cannot be inline, whatever carries its payload.
        let read = WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        assert!(matches!(
            post(&SendWr::new(1, read, &[]).inline_bytes(&pieces), &q, &[]),
            Err(PostError::Unsupported(_))
        ));
        // Pieces without the flag, or beside SGEs, are refused rather than guessed at.
        let mut no_flag = SendWr::new(1, WrOpcode::Send, &[]);
        no_flag.inline_data = &pieces;
        assert!(matches!(
            post(&no_flag, &q, &[]),
            Err(PostError::Unsupported(_))
        ));
        let buf = [0u8; 8];
        let mrs = table(&[(1, &buf)]);
        let sgl = [Sge {
            addr: buf.as_ptr() as u64,
            length: 8,
            lkey: 1,
        }];
        let mut both = SendWr::new(1, WrOpcode::Send, &sgl).inline();
        both.inline_data = &pieces;
        assert!(matches!(
            post(&both, &q, &mrs),
            Err(PostError::Unsupported(_))
        ));
    }

    #[test]
    fn state_type_and_sge_count_rules() {
        let buf = [0u8; 64];
        let mrs = table(&[(1, &buf)]);
        let s = Sge {
            addr: buf.as_ptr() as u64,
            length: 1,
            lkey: 1,
        };
        for st in [QpState::Reset, QpState::Init, QpState::Rtr] {
            assert_eq!(
                post(&SendWr::new(1, WrOpcode::Send, &[]), &limits(st), &mrs),
                Err(PostError::WrongState(st))
            );
        }
        assert_eq!(
            post(
                &SendWr::new(1, WrOpcode::Send, &[s, s, s]),
                &limits(QpState::Rts),
                &mrs
            ),
            Err(PostError::TooManySge { count: 3, max: 2 })
        );
        let mut uc = limits(QpState::Rts);
        uc.qp_type = QpType::Uc;
        let read = WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        assert!(matches!(
            post(&SendWr::new(1, read, &[s]), &uc, &mrs),
            Err(PostError::Unsupported(_))
        ));
        let mut ud = limits(QpState::Rts);
        ud.qp_type = QpType::Ud;
        assert!(matches!(
            post(&SendWr::new(1, WrOpcode::Send, &[s]), &ud, &mrs),
            Err(PostError::Unsupported(_))
        ));
        let dest = UdAddress {
            gid: Gid::default(),
            udp_port: 0,
            qpn: 5,
            qkey: 0x11,
            traffic_class: 0x68,
        };
        let w = post(&SendWr::new(1, WrOpcode::Send, &[s]).to(dest), &ud, &mrs).unwrap();
        assert_eq!((w.ud.qpn, w.ud.qkey, w.ud.port), (5, 0x11, 4791));
        assert_eq!(w.ud.traffic_class, 0x68);
        let mut all = limits(QpState::Rts);
        all.sq_sig_all = true;
        let w = post(&SendWr::new(1, WrOpcode::Send, &[]), &all, &mrs).unwrap();
        assert_eq!(w.flags, send_flags::SIGNALED);
    }

    /// An XRC initiator's every WR names the remote XRC SRQ: in the destination area's
    /// QPN under XRC_SRQN, the rest of the area zero, an inline payload after the area;
    /// without a number it is refused, and an XRC target QP posts nothing.
    #[test]
    fn xrc_sends_carry_the_remote_srq_number() {
        let buf = [7u8; 64];
        let mrs = table(&[(1, &buf)]);
        let s = Sge {
            addr: buf.as_ptr() as u64,
            length: 8,
            lkey: 1,
        };
        let mut xrc = limits(QpState::Rts);
        xrc.qp_type = QpType::XrcSend;
        assert!(matches!(
            post(&SendWr::new(1, WrOpcode::Send, &[s]), &xrc, &mrs),
            Err(PostError::Unsupported(_))
        ));
        let write = WrOpcode::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 5,
        };
        let w = post(
            &SendWr::new(2, write, &[s]).to_xrc_srq(0xab_cdef),
            &xrc,
            &mrs,
        )
        .unwrap();
        assert_eq!(w.flags, send_flags::XRC_SRQN);
        assert_eq!(
            w.ud,
            UdDest {
                qpn: 0xab_cdef,
                ..UdDest::default()
            }
        );
        assert_eq!((w.num_sge, w.sges[0]), (1, s));
        let piece: &[u8] = b"xrc inline";
        let pieces = [piece];
        let w = post(
            &SendWr::new(3, WrOpcode::Send, &[])
                .inline_bytes(&pieces)
                .to_xrc_srq(9),
            &xrc,
            &mrs,
        )
        .unwrap();
        assert_eq!(w.flags, send_flags::XRC_SRQN | send_flags::INLINE);
        assert_eq!(w.inline_offset(), SendWqe::INLINE_AT);
        assert_eq!((w.ud.qpn, w.inline_payload()), (9, piece));
        assert!(matches!(
            post(&SendWr::new(4, write, &[s]).to_xrc_srq(1 << 24), &xrc, &mrs),
            Err(PostError::Unsupported(_))
        ));
        // Other QP types ignore the number, as libibverbs ignores `qp_type.xrc`.
        let w = post(
            &SendWr::new(5, write, &[s]).to_xrc_srq(9),
            &limits(QpState::Rts),
            &mrs,
        )
        .unwrap();
        assert_eq!((w.flags, w.ud), (0, UdDest::default()));
        let mut target = limits(QpState::Rts);
        target.qp_type = QpType::XrcRecv;
        assert!(matches!(
            post(&SendWr::new(6, write, &[s]).to_xrc_srq(9), &target, &mrs),
            Err(PostError::Unsupported(_))
        ));
    }

    /// A receive's regions are the NIC's to check when a message lands (a LOC_PROT_ERR
    /// completion); the post checks the QP's state and the SGE count.
    #[test]
    fn recv_needs_a_state_and_takes_any_sge() {
        let q = limits(QpState::Init);
        let sge = Sge {
            addr: 0x1000,
            length: 8,
            lkey: 0xBAD,
        };
        let w = build_recv_wqe(&RecvWr::new(9, &[sge]), &q).unwrap();
        assert_eq!((w.wr_id, w.num_sge, w.sges[0]), (9, 1, sge));
        assert_eq!(
            build_recv_wqe(&RecvWr::new(9, &[sge, sge]), &q),
            Err(PostError::TooManySge { count: 2, max: 1 })
        );
        assert_eq!(
            build_recv_wqe(&RecvWr::new(1, &[]), &limits(QpState::Reset)),
            Err(PostError::WrongState(QpState::Reset))
        );
    }
}
