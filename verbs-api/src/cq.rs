//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`, and the completion-channel wait).
//!
//! The CQ is a ring in a client-created memfd; the NIC produces [`Cqe`]s, the client
//! consumes them. [`CompletionQueue::poll`] is a few loads and stores: no syscall.
//! [`CompletionQueue::wait`] is the blocking alternative (`ibv_req_notify_cq` +
//! `ibv_get_cq_event`): it sets CQ_ARMED, re-checks, and sleeps on the CQ's event
//! pipe, to which the NIC writes a byte when it next publishes a completion to an armed
//! CQ. The NIC hands out only the pipe's read end and writes through its own
//! non-blocking write end, so nothing a client does to its descriptor can make the NIC
//! wait (an eventfd would be one open file shared with the NIC). End of file on the
//! pipe means the NIC is gone.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::abi::control::{Handle, Reply, Request};
use crate::abi::slots::{wc_flags, wc_opcode, wc_status};
use crate::abi::{Consumer, CqLayout, Cqe, Ring, CQ_ARMED};
use crate::device::Context;
use crate::error::{io, Error, Result};
use crate::os;
use crate::poll_idle::IdleState;

pub use crate::poll_idle::{POLL_NAP_ENV, POLL_SPIN_ENV, POLL_YIELD_EVERY};

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    #[default]
    Success,
    /// IBV_WC_LOC_LEN_ERR.
    LocLenErr,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr,
    /// IBV_WC_LOC_PROT_ERR.
    LocProtErr,
    /// IBV_WC_WR_FLUSH_ERR.
    WrFlushErr,
    /// IBV_WC_BAD_RESP_ERR.
    BadRespErr,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr,
    /// IBV_WC_REM_INV_REQ_ERR.
    RemInvReqErr,
    /// IBV_WC_REM_ACCESS_ERR.
    RemAccessErr,
    /// IBV_WC_REM_OP_ERR.
    RemOpErr,
    /// IBV_WC_RETRY_EXC_ERR.
    RetryExcErr,
    /// IBV_WC_RNR_RETRY_EXC_ERR.
    RnrRetryExcErr,
    /// IBV_WC_GENERAL_ERR.
    GeneralErr,
    /// Any other `ibv_wc_status` value.
    Other(u32),
}

impl WcStatus {
    /// From the `ibv_wc_status` number.
    pub fn from_raw(v: u32) -> WcStatus {
        match v {
            wc_status::SUCCESS => WcStatus::Success,
            wc_status::LOC_LEN_ERR => WcStatus::LocLenErr,
            wc_status::LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
            wc_status::LOC_PROT_ERR => WcStatus::LocProtErr,
            wc_status::WR_FLUSH_ERR => WcStatus::WrFlushErr,
            wc_status::BAD_RESP_ERR => WcStatus::BadRespErr,
            wc_status::LOC_ACCESS_ERR => WcStatus::LocAccessErr,
            wc_status::REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
            wc_status::REM_ACCESS_ERR => WcStatus::RemAccessErr,
            wc_status::REM_OP_ERR => WcStatus::RemOpErr,
            wc_status::RETRY_EXC_ERR => WcStatus::RetryExcErr,
            wc_status::RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
            wc_status::GENERAL_ERR => WcStatus::GeneralErr,
            other => WcStatus::Other(other),
        }
    }

    /// The `ibv_wc_status` number.
    pub fn raw(self) -> u32 {
        match self {
            WcStatus::Success => wc_status::SUCCESS,
            WcStatus::LocLenErr => wc_status::LOC_LEN_ERR,
            WcStatus::LocQpOpErr => wc_status::LOC_QP_OP_ERR,
            WcStatus::LocProtErr => wc_status::LOC_PROT_ERR,
            WcStatus::WrFlushErr => wc_status::WR_FLUSH_ERR,
            WcStatus::BadRespErr => wc_status::BAD_RESP_ERR,
            WcStatus::LocAccessErr => wc_status::LOC_ACCESS_ERR,
            WcStatus::RemInvReqErr => wc_status::REM_INV_REQ_ERR,
            WcStatus::RemAccessErr => wc_status::REM_ACCESS_ERR,
            WcStatus::RemOpErr => wc_status::REM_OP_ERR,
            WcStatus::RetryExcErr => wc_status::RETRY_EXC_ERR,
            WcStatus::RnrRetryExcErr => wc_status::RNR_RETRY_EXC_ERR,
            WcStatus::GeneralErr => wc_status::GENERAL_ERR,
            WcStatus::Other(v) => v,
        }
    }

    /// True for success.
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

/// The strings of `ibv_wc_status_str`.
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::GeneralErr => "general error",
            WcStatus::Other(_) => "unknown",
        };
        f.write_str(s)
    }
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    #[default]
    Send,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite,
    /// IBV_WC_RDMA_READ.
    RdmaRead,
    /// IBV_WC_COMP_SWAP.
    CompSwap,
    /// IBV_WC_FETCH_ADD.
    FetchAdd,
    /// IBV_WC_BIND_MW.
    BindMw,
    /// IBV_WC_LOCAL_INV.
    LocalInv,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite,
    /// IBV_WC_RECV.
    Recv,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm,
    /// Any other value.
    Other(u32),
}

impl WcOpcode {
    /// From the `ibv_wc_opcode` number.
    pub fn from_raw(v: u32) -> WcOpcode {
        match v {
            wc_opcode::SEND => WcOpcode::Send,
            wc_opcode::RDMA_WRITE => WcOpcode::RdmaWrite,
            wc_opcode::RDMA_READ => WcOpcode::RdmaRead,
            wc_opcode::COMP_SWAP => WcOpcode::CompSwap,
            wc_opcode::FETCH_ADD => WcOpcode::FetchAdd,
            wc_opcode::BIND_MW => WcOpcode::BindMw,
            wc_opcode::LOCAL_INV => WcOpcode::LocalInv,
            wc_opcode::ATOMIC_WRITE => WcOpcode::AtomicWrite,
            wc_opcode::RECV => WcOpcode::Recv,
            wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }

    /// True for receive-queue completions (`opcode & IBV_WC_RECV`).
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkCompletion {
    /// The work request's wr_id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid on success, and always for receives).
    pub opcode: WcOpcode,
    /// Vendor error (softnic-specific reason, 0 = none).
    pub vendor_err: u32,
    /// Bytes received, or read (READ; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (IBV_WC_WITH_IMM).
    pub imm_data: Option<u32>,
    /// QP number.
    pub qp_num: u32,
    /// UD: the sender's QP number.
    pub src_qp: u32,
    /// `enum ibv_wc_flags` bits: IBV_WC_GRH (a UD receive; the buffer starts with the
    /// GRH) and IBV_WC_WITH_IMM.
    pub wc_flags: u32,
    /// When the NIC wrote the completion, in nanoseconds of `CLOCK_MONOTONIC`
    /// (`crate::os::monotonic_ns` reads the same clock): `ibv_wc_read_completion_ts`.
    pub timestamp: u64,
}

impl WorkCompletion {
    /// IBV_WC_GRH: the first 40 bytes of the receive buffer hold the GRH.
    pub fn has_grh(&self) -> bool {
        self.wc_flags & wc_flags::GRH != 0
    }
}

impl From<Cqe> for WorkCompletion {
    fn from(c: Cqe) -> Self {
        WorkCompletion {
            wr_id: c.wr_id,
            status: WcStatus::from_raw(c.status),
            opcode: WcOpcode::from_raw(c.opcode),
            vendor_err: c.vendor_err,
            byte_len: c.byte_len,
            imm_data: (c.flags & (wc_flags::WITH_IMM | wc_flags::WITH_INV) != 0).then_some(c.imm),
            qp_num: c.qp_num,
            src_qp: c.src_qp,
            timestamp: c.timestamp,
            wc_flags: c.flags & (wc_flags::GRH | wc_flags::WITH_IMM | wc_flags::WITH_INV),
        }
    }
}

/// A CQ segment of at least `depth` entries (checked against `max_cqe`): its layout,
/// memfd and initialised ring, for CreateCq and ResizeCq.
fn new_ring(ctx: &Context, depth: u32) -> Result<(CqLayout, OwnedFd, Ring<Cqe>)> {
    let max = ctx.inner.attr().max_cqe;
    if depth == 0 || depth > max {
        return Err(Error::InvalidArgument(format!(
            "CQ depth {depth} is outside 1..={max} (the device's max_cqe)"
        )));
    }
    let layout = CqLayout::new(depth)?;
    let fd = os::memfd("softnic-cq", layout.len).map_err(io("creating the CQ memfd"))?;
    let map = os::map_shared(fd.as_fd(), layout.len).map_err(io("mapping the CQ"))?;
    let ring = Ring::<Cqe>::new(Arc::new(map), layout.offset, layout.capacity)?;
    ring.init();
    Ok((layout, fd, ring))
}

/// How often `resize` asks again while the NIC is busy (200 µs apart: about 2 s).
const RESIZE_TRIES: u32 = 10_000;

pub(crate) struct CqShared {
    pub ctx: Context,
    pub handle: Handle,
    event: OwnedFd,
    /// Hybrid polling's state for this CQ (`poll_idle`).
    idle: IdleState,
}

impl CqShared {
    fn after_empty(&self) -> bool {
        let ctx = &self.ctx.inner;
        self.idle.after_empty(&ctx.poll, &ctx.doorbell)
    }
}

/// A handle on a CQ's hybrid polling ([`CompletionQueue::idle`]) that can be used
/// without the CQ itself: the C library keeps one beside the lock around its CQ, so
/// that a thread sleeping in `ibv_poll_cq` does not hold that lock.
#[derive(Clone)]
pub struct PollIdle(Arc<CqShared>);

impl fmt::Debug for PollIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PollIdle").field(&self.0.handle).finish()
    }
}

impl PollIdle {
    /// As [`CompletionQueue::idle`].
    pub fn idle(&self) -> bool {
        self.0.after_empty()
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let _ = self.ctx.inner.call(
            "ibv_destroy_cq",
            &Request::DestroyCq { cq: self.handle },
            &[],
        );
    }
}

/// A completion queue (`struct ibv_cq`). `Send`, single consumer: `poll` takes
/// `&mut self`. QPs using it keep it alive on the NIC until they are destroyed.
pub struct CompletionQueue {
    ring: Consumer<Cqe>,
    pub(crate) shared: Arc<CqShared>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("handle", &self.shared.handle)
            .field("capacity", &self.ring.ring().capacity())
            .finish()
    }
}

impl CompletionQueue {
    pub(crate) fn create(ctx: &Context, depth: u32) -> Result<Self> {
        let (layout, fd, ring) = new_ring(ctx, depth)?;
        let (reply, mut fds) =
            ctx.inner
                .call("ibv_create_cq", &Request::CreateCq { depth }, &[fd.as_fd()])?;
        let handle = match reply {
            Reply::Cq { cq, capacity } if capacity == layout.capacity => cq,
            other => return Err(Error::Protocol(format!("CreateCq answered with {other:?}"))),
        };
        if fds.len() != 1 {
            return Err(Error::Protocol(format!(
                "CreateCq reply carried {} descriptors, expected the CQ's event pipe",
                fds.len()
            )));
        }
        Ok(CompletionQueue {
            ring: ring.into_consumer(),
            shared: Arc::new(CqShared {
                ctx: ctx.clone(),
                handle,
                event: fds.remove(0),
                idle: IdleState::default(),
            }),
        })
    }

    /// The NIC's handle.
    pub fn handle(&self) -> Handle {
        self.shared.handle
    }

    /// `ibv_resize_cq`: a new ring of at least `depth` entries, holding the
    /// completions not yet polled (InvalidArgument when more than `depth` wait).
    /// Returns the new capacity.
    pub fn resize(&mut self, depth: u32) -> Result<u32> {
        let ctx = &self.shared.ctx;
        let (layout, fd, ring) = new_ring(ctx, depth)?;
        let req = Request::ResizeCq {
            cq: self.shared.handle,
            depth,
        };
        // The NIC answers Busy while sends already posted on the CQ's QPs have yet to
        // complete (it counts their completions, as rxe): bounded retries, then EBUSY.
        let mut tries = 0;
        let reply = loop {
            match ctx.inner.call("ibv_resize_cq", &req, &[fd.as_fd()]) {
                Err(Error::Nic {
                    code: crate::abi::control::ErrorCode::Busy,
                    ..
                }) if tries < RESIZE_TRIES => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                r => break r?.0,
            }
        };
        match reply {
            Reply::Cq { capacity, .. } if capacity == layout.capacity => {}
            other => return Err(Error::Protocol(format!("ResizeCq answered with {other:?}"))),
        }
        self.ring = ring.into_consumer();
        Ok(layout.capacity)
    }

    /// Ring capacity (the depth rounded up to a power of two).
    pub fn capacity(&self) -> u32 {
        self.ring.ring().capacity()
    }

    /// Fills `out` with up to `out.len()` completions and returns how many
    /// (`ibv_poll_cq`). No syscalls. Errors: [`Error::Ring`], the NIC corrupted the
    /// ring; [`Error::NicGone`], the CQ is empty and its NIC has exited (one load of
    /// the NIC's life sign, a word the kernel marks when the NIC process ends:
    /// `os::life_sign`). Completions the NIC published before it died are still
    /// returned first.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> Result<usize> {
        let max = out.len();
        self.poll_with(max, |i, wc| out[i] = wc)
    }

    /// Removes the completions of QP `qpn` not yet polled, keeping the others in order:
    /// what a provider does when a QP is moved to RESET (rdma-core's mlx5 provider,
    /// `mlx5_cq_clean`), so that a QP reused after a reset does not hand its poller the
    /// flushes of its earlier life. With `keep_receives` (a QP on a shared receive
    /// queue, whose receive WQEs belong to the SRQ: dropping such a completion would
    /// lose the SRQ's buffer, which mlx5 hands back to the SRQ instead) only its send
    /// completions go. softnic's libibverbs calls this from `ibv_modify_qp` to RESET; a
    /// Rust program resetting a QP may call it on the QP's CQs. Returns how many were
    /// removed.
    pub fn purge_qp(&mut self, qpn: u32, keep_receives: bool) -> Result<u32> {
        let qpn = qpn & 0xFF_FFFF;
        let ours = |c: &Cqe| {
            c.qp_num & 0xFF_FFFF == qpn && !(keep_receives && c.opcode & wc_opcode::RECV != 0)
        };
        let n = self.ring.retain(|c| !ours(c)).map_err(Error::Ring)?;
        if n > 0 {
            self.ring.release();
        }
        Ok(n)
    }

    /// As [`Self::poll`] for up to `max` completions, handing each to `f` with its
    /// index (0, 1, …) instead of storing it in a slice.
    ///
    /// Why: the C library's `ibv_poll_cq` converts each completion straight into the
    /// caller's `ibv_wc` array. Through [`Self::poll`] it needed a buffer of
    /// completions on its stack, filled with defaults on every call, empty polls of a
    /// busy-poll loop included.
    pub fn poll_with(
        &mut self,
        max: usize,
        mut f: impl FnMut(usize, WorkCompletion),
    ) -> Result<usize> {
        let mut n = 0;
        // Any receive completion (IBV_WC_RECV and IBV_WC_RECV_RDMA_WITH_IMM have
        // bit 7 set): a receiving poller does not nap (`poll_idle`).
        let mut recv = 0;
        while n < max {
            match self.ring.pop().map_err(Error::Ring)? {
                Some(cqe) => {
                    recv |= cqe.opcode;
                    f(n, WorkCompletion::from(cqe));
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 && max > 0 {
            self.shared.ctx.inner.check_nic_alive()?;
        }
        if n > 0 {
            self.ring.release();
            let ctx = &self.shared.ctx.inner.poll;
            ctx.note_found();
            if recv & wc_opcode::RECV != 0 {
                ctx.note_received();
            }
            self.shared.idle.note_found();
        }
        Ok(n)
    }

    /// Call after a [`Self::poll`] that found nothing, in a busy-poll loop: spins,
    /// yields the core every [`POLL_YIELD_EVERY`] empty polls, and once no completion
    /// came to any CQ of this context for the spin window (50 µs, [`POLL_SPIN_ENV`]),
    /// sleeps up to 1 ms until the NIC publishes one (hybrid polling,
    /// `verbs_api::poll_idle`); while much send work is queued ahead of the NIC it
    /// naps instead of yielding ([`POLL_NAP_ENV`]). Returns whether it slept or
    /// napped. Never needed for correctness; a loop that spins without it burns the
    /// core the NIC shares.
    pub fn idle(&self) -> bool {
        self.shared.after_empty()
    }

    /// Empty polls between [`Self::idle`]'s yield points (default
    /// [`POLL_YIELD_EVERY`]); 0 = never yield nor sleep (spin as on hardware, for a
    /// program that owns a core).
    pub fn set_poll_yield(&self, every: u32) {
        self.shared.idle.set_yield_every(every);
    }

    /// [`Self::idle`] without the CQ (see [`PollIdle`]).
    pub fn poll_idle(&self) -> PollIdle {
        PollIdle(self.shared.clone())
    }

    /// Blocks until at least one completion is ready or `timeout` passes (`None` =
    /// forever); returns whether completions are ready (then call [`Self::poll`]).
    /// Arms the CQ (CQ_ARMED), re-checks, sleeps on the CQ's event pipe: the
    /// `ibv_req_notify_cq` + `ibv_get_cq_event` pattern, with the re-check built in so
    /// no completion is missed.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        // Bounded by the deadline (each pass sleeps until readable or timeout).
        loop {
            if self.ring.available().map_err(Error::Ring)? > 0 {
                return Ok(true);
            }
            if !self.ring.arm(CQ_ARMED).map_err(Error::Ring)? {
                self.ring.ring().clear_flags(CQ_ARMED);
                return Ok(true);
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        self.ring.ring().clear_flags(CQ_ARMED);
                        return Ok(false);
                    }
                    Some(d - now)
                }
            };
            let fd = self.shared.event.as_fd();
            os::wait_readable(fd, left).map_err(io("waiting on the CQ's event pipe"))?;
            self.take_event()?;
        }
    }

    /// The read end of the CQ's event pipe, for integrating [`Self::wait`]'s wake-up
    /// into an event loop: arm with [`Self::arm`], wait for readability,
    /// [`Self::take_event`], poll.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.as_fd()
    }

    /// Reads the event pipe empty; returns whether it held an event (false: it was
    /// empty, e.g. another thread took the event). An error when the pipe is at end of
    /// file: the NIC is gone, and no event will ever come.
    pub fn take_event(&self) -> Result<bool> {
        match os::pipe_take(self.shared.event.as_fd()).map_err(io("reading the CQ's event pipe"))? {
            Some(n) => Ok(n > 0),
            None => Err(Error::Io {
                what: "reading the CQ's event pipe",
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the NIC closed the CQ's event pipe (it exited)",
                ),
            }),
        }
    }

    /// Requests a notification for the next completion (`ibv_req_notify_cq`); returns
    /// `false` when completions are already waiting (poll instead of sleeping).
    pub fn arm(&mut self) -> Result<bool> {
        self.ring.arm(CQ_ARMED).map_err(Error::Ring)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_converts_with_imm_only_when_flagged() {
        let mut c = Cqe {
            wr_id: 9,
            status: wc_status::REM_ACCESS_ERR,
            opcode: wc_opcode::RECV_RDMA_WITH_IMM,
            flags: 0,
            byte_len: 77,
            imm: 0xdead_beef,
            qp_num: 0x11,
            src_qp: 0,
            vendor_err: 3,
            timestamp: 5,
        };
        let w = WorkCompletion::from(c);
        assert_eq!(w.imm_data, None);
        assert_eq!(w.status, WcStatus::RemAccessErr);
        assert_eq!(w.status.to_string(), "remote access error");
        assert_eq!(w.opcode, WcOpcode::RecvRdmaWithImm);
        assert!(w.opcode.is_recv());
        c.flags = wc_flags::WITH_IMM;
        assert_eq!(WorkCompletion::from(c).imm_data, Some(0xdead_beef));
    }

    #[test]
    fn status_numbers_round_trip() {
        for v in 0..32 {
            assert_eq!(WcStatus::from_raw(v).raw(), v);
        }
        assert_eq!(WcStatus::from_raw(12), WcStatus::RetryExcErr);
        assert_eq!(WcOpcode::from_raw(4), WcOpcode::FetchAdd);
        assert_eq!(WcOpcode::from_raw(77), WcOpcode::Other(77));
    }
}
