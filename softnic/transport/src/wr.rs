//! Work requests and completions, as the transport sees them: already copied out of the
//! client's rings and checked for shape by the NIC (opcode valid for the QP type, SGE
//! count within limits). Keys and ranges are checked on use, through [`crate::memory`].

/// Most scatter/gather entries in one work request.
pub const MAX_SGE: usize = 4;

/// Most inline bytes in one send work request.
pub const MAX_INLINE: usize = 256;

/// A scatter/gather element: `length` bytes at `addr` in the region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Address (in the client's address space, the region's iova).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// What a send work request does (`enum ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM, with the immediate value.
    SendWithImm(u32),
    /// IBV_WR_SEND_WITH_INV (RC): a SEND whose IETH names the R_Key the responder
    /// invalidates when the message completes (IBTA 9.4.1.1, 10.6.7.2.4).
    SendWithInv(u32),
    /// IBV_WR_RDMA_WRITE.
    Write,
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    WriteWithImm(u32),
    /// IBV_WR_RDMA_READ.
    Read,
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    CompareSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    FetchAdd {
        /// Value to add.
        add: u64,
    },
    /// IBV_WR_ATOMIC_WRITE (RC; IBTA 1.5 memory placement extensions, Annex A19):
    /// these 8 bytes, as the application gave them, stored at `remote_addr` in one
    /// 8-byte store under REMOTE_WRITE, answered like a READ of nothing.
    AtomicWrite {
        /// The bytes to store.
        value: [u8; 8],
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's cookie, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Gather list (SEND/WRITE) or scatter list (READ, atomics: one 8-byte SGE).
    pub sges: [Sge; MAX_SGE],
    /// Entries used in `sges`.
    pub num_sge: usize,
    /// Inline data (IBV_SEND_INLINE): when `Some`, used instead of the gather list.
    pub inline: Option<Inline>,
    /// Remote address (WRITE, READ, atomics).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// IBV_SEND_SIGNALED: produce a completion on success.
    pub signaled: bool,
    /// IBV_SEND_SOLICITED.
    pub solicited: bool,
    /// UD only: destination QP number, Q_Key and address (from the address handle).
    pub ud: Option<UdDest>,
    /// XRC send QPs only: the XRC SRQ at the target that receives this message
    /// (`ibv_send_wr.qp_type.xrc.remote_srqn`), carried in every request packet's
    /// XRCETH. 0 on other QPs.
    pub xrc_srqn: u32,
}

/// The inline bytes of a send work request (IBV_SEND_INLINE), at most [`MAX_INLINE`].
///
/// Kept on the heap, apart from the [`SendWr`]: a WQE moves several times between the
/// client's ring and the send queue (converted, posted, queued), and an inline array
/// in place would make every WQE, inline or not, carry and copy 256 more bytes each
/// time — most of the copying of an 8-byte WRITE (docs/perf.md, issue 12). A WQE with
/// inline data pays one small allocation instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inline(Box<[u8]>);

impl Inline {
    /// Copies `data`; `None` when it is longer than [`MAX_INLINE`].
    pub fn new(data: &[u8]) -> Option<Inline> {
        (data.len() <= MAX_INLINE).then(|| Inline(data.into()))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none (a zero-length inline message).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// UD destination of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Remote QP number.
    pub qpn: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Remote address.
    pub addr: core::net::SocketAddr,
    /// IP TOS / traffic class of the datagram (the address handle's
    /// `grh.traffic_class`).
    pub traffic_class: u8,
}

impl SendWr {
    /// Total bytes of the gather list (or inline data).
    pub fn total_len(&self) -> u64 {
        match &self.inline {
            Some(data) => data.len() as u64,
            None => self.sges[..self.num_sge.min(MAX_SGE)]
                .iter()
                .map(|s| u64::from(s.length))
                .sum(),
        }
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's cookie.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: [Sge; MAX_SGE],
    /// Entries used.
    pub num_sge: usize,
}

/// Completion status, with the values of `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR: a receive buffer too small, or a length limit exceeded.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR: a bad lkey or address in the local SGEs.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR: flushed because the QP went to the error state.
    WrFlushErr = 5,
    /// IBV_WC_BAD_RESP_ERR.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR: the responder NAKed with Invalid Request.
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR: the responder NAKed with Remote Access Error.
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR: the responder NAKed with Remote Operational Error.
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR: retry_cnt exhausted.
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR: rnr_retry exhausted.
    RnrRetryExcErr = 13,
    /// IBV_WC_GENERAL_ERR.
    GeneralErr = 21,
}

/// Completion opcode, with the values of `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW (a memory-window bind the NIC completes in order).
    BindMw = 5,
    /// IBV_WC_LOCAL_INV (a memory-window invalidation, likewise).
    LocalInv = 6,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite = 9,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
    /// IBV_WC_RECV of a SEND with Invalidate: `imm` holds the invalidated R_Key (as
    /// `ibv_wc.invalidated_rkey` shares `imm_data`'s union). Not an `ibv_wc_opcode`
    /// value: the NIC writes IBV_WC_RECV with IBV_WC_WITH_INV.
    RecvWithInv = 130,
}

/// Which of a QP's queues a completion belongs to (each may feed a different CQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queue {
    /// Send queue.
    Send,
    /// Receive queue.
    Recv,
}

/// A work completion (`struct ibv_wc`), less `qp_num`: the QP that gives it is the QP
/// it belongs to, whose number the NIC writes into the CQE (kept out, the completion
/// is 32 bytes, copied a few times per message; docs/perf.md "Session 33").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// Which queue.
    pub queue: Queue,
    /// The work request's cookie.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful on success, and for receive completions).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (READ).
    pub byte_len: u32,
    /// Immediate data (IBV_WC_WITH_IMM).
    pub imm: Option<u32>,
    /// UD: the sender's QP number.
    pub src_qp: u32,
    /// A receive completion of an XRC receive QP: the XRC SRQ its WQE came from, whose
    /// CQ takes it (`ibv_create_srq_ex(3)`: an XRC SRQ has a CQ of its own). 0
    /// otherwise.
    pub srqn: u32,
}
