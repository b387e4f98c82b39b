//! A completion queue as the NIC sees it: the producer side of a CQ ring in the client's
//! shared segment, and the pipe that wakes a client blocked on it.
//!
//! The NIC writes CQEs as completions come out of its QPs and publishes them in a batch
//! ([`CompletionQueue::flush`]) once per runtime iteration: one release-store of the
//! producer index for many CQEs. If the client armed the CQ (CQ_ARMED, the
//! `ibv_req_notify_cq` analogue), the publishing call clears the bit and writes one
//! byte to the CQ's event pipe, so one arm gives at most one wake-up (see
//! `verbs_api::abi` for the fences).
//!
//! Why a pipe and not an eventfd: the client gets only the pipe's read end, and the NIC
//! writes through its own write end, a separate open file that is non-blocking for
//! good ([`verbs_api::os::SignalPipe`]). An eventfd handed over `SCM_RIGHTS` is one open
//! file shared with the client, which could set its counter to 2^64 − 2 and clear
//! `O_NONBLOCK`: the NIC's next write then blocked the data plane of every client for
//! good (eventfd ignores `RWF_NOWAIT` on writes; `softnic/tests/nic_attack_fds.rs`). A
//! client that arms and never reads fills its pipe at worst, and later writes are
//! skipped: a full pipe is a wake-up already pending.
//!
//! Hybrid polling (`verbs_api::poll_idle`): every flush also bumps the client's
//! completion sequence on its doorbell page and, if a poller of that client sleeps on
//! it, wakes it with one `futex_wake` — one load when nobody sleeps. Only the NIC
//! clears the sleeping flag (one thread's timed-out sleep must not hide another's):
//! so a sleep that timed out costs the next flush one wake that finds nobody. A client
//! that keeps the flag set costs one wake per flush of its own CQs, counted in
//! `poller_wakes`.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;
use softnic_transport::qp::QpType;
use softnic_transport::wr::{Completion, Queue, WcOpcode, WcStatus};
use verbs_api::abi::ring::Producer;
use verbs_api::abi::slots::{wc_flags, wc_opcode};
use verbs_api::abi::{CqLayout, Cqe, Doorbell, LayoutError, Ring, RingError, CQ_ARMED};
use verbs_api::os::SignalPipe;

/// Result of [`CompletionQueue::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// No free slot: the client has not polled (a CQ overrun).
    Full,
    /// The client corrupted the ring's consumer index; the CQ is unusable.
    Corrupt,
}

/// One CQ.
#[derive(Debug)]
pub struct CompletionQueue {
    /// Owning client.
    pub client: u32,
    /// QPs that complete into this CQ (it cannot be destroyed while any does).
    pub qp_users: u32,
    ring: Producer<Cqe>,
    event: SignalPipe,
    /// The owning client's doorbell page: its completion sequence and sleeping poller.
    page: Doorbell,
    /// Pollers woken since [`CompletionQueue::take_poller_wakes`].
    poller_wakes: u64,
    dirty: bool,
}

/// IBV_WC_GRH for a UD receive that succeeded: its buffer starts with the 40-byte GRH
/// (for RoCEv2, the IP header; IBTA 11.4.1.2, `ibv_poll_cq(3)`: "GRH is present (valid
/// only for UD QPs)"). Linux rxe sets the flag on every receive of every QP type; only
/// UD receives hold a GRH, so softnic sets it there alone.
pub fn grh_flag(qp_type: QpType, c: &Completion) -> u32 {
    let ud_recv = qp_type == QpType::Ud && c.queue == Queue::Recv;
    if ud_recv && c.status == WcStatus::Success {
        wc_flags::GRH
    } else {
        0
    }
}

/// The CQE for a completion of QP `qp_num`.
pub fn cqe_of(c: &Completion, qp_num: u32, vendor_err: u32) -> Cqe {
    Cqe {
        wr_id: c.wr_id,
        status: c.status as u32,
        opcode: match c.opcode {
            WcOpcode::RecvWithInv => wc_opcode::RECV,
            o => o as u32,
        },
        flags: match (c.opcode, c.imm) {
            (WcOpcode::RecvWithInv, _) => wc_flags::WITH_INV,
            (_, Some(_)) => wc_flags::WITH_IMM,
            _ => 0,
        },
        byte_len: c.byte_len,
        imm: c.imm.unwrap_or(0),
        qp_num,
        src_qp: c.src_qp,
        vendor_err,
        timestamp: 0,
    }
}

impl CompletionQueue {
    /// Attaches the CQ ring in `map` (laid out as `layout`), checking the header the
    /// client initialised; `event` is the pipe the NIC created for it (the client
    /// gets its read end); `page` is the client's doorbell page.
    pub fn attach(
        client: u32,
        map: Arc<MmapRaw>,
        layout: &CqLayout,
        event: SignalPipe,
        page: Doorbell,
    ) -> Result<Self, LayoutError> {
        let ring = Ring::<Cqe>::new(map, layout.offset, layout.capacity)?;
        ring.check_header()?;
        Ok(CompletionQueue {
            client,
            qp_users: 0,
            ring: ring.into_producer(),
            event,
            page,
            poller_wakes: 0,
            dirty: false,
        })
    }

    /// Ring capacity.
    pub fn capacity(&self) -> u32 {
        self.ring.ring().capacity()
    }

    /// The read end of the event pipe, which clients block on.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.event.read_end()
    }

    /// Writes one CQE (visible to the client after [`CompletionQueue::flush`]).
    pub fn push(&mut self, cqe: &Cqe) -> Result<(), PushError> {
        match self.ring.push(cqe) {
            Ok(()) => {
                self.dirty = true;
                Ok(())
            }
            Err(RingError::Full) => {
                // Publish what is written so the client can make room.
                self.flush();
                Err(PushError::Full)
            }
            Err(RingError::Corrupt { .. }) => Err(PushError::Corrupt),
        }
    }

    /// `ibv_resize_cq`, at a safe point (the runtime handles control requests between
    /// iterations, so no completion is being written): the completions the client has
    /// not polled move, in order, into `new` (a ring of the client's, checked like
    /// [`CompletionQueue::attach`]), which replaces the ring; an armed CQ stays armed.
    /// Refused with nothing changed when more than `depth` completions wait (as rxe)
    /// or the old ring's consumer index is impossible.
    pub fn replace_ring(
        &mut self,
        map: Arc<MmapRaw>,
        layout: &CqLayout,
        depth: u32,
    ) -> Result<(), String> {
        let ring = Ring::<Cqe>::new(map, layout.offset, layout.capacity)
            .map_err(|e| format!("CQ segment: {e}"))?;
        ring.check_header()
            .map_err(|e| format!("CQ segment: {e}"))?;
        let mut new = ring.into_producer();
        let waiting = self
            .ring
            .unconsumed()
            .map_err(|e| format!("old CQ ring: {e}"))?;
        if waiting > depth {
            return Err(format!(
                "{waiting} completions are not polled yet, more than the new depth {depth}"
            ));
        }
        self.ring
            .move_unconsumed(&mut new)
            .map_err(|e| format!("moving completions: {e}"))?;
        if self.ring.ring().flags() & CQ_ARMED != 0 {
            new.ring().set_flags(CQ_ARMED);
        }
        self.ring = new;
        self.dirty = false;
        Ok(())
    }

    /// Publishes written CQEs, wakes a sleeping poller of the client (hybrid polling)
    /// and an armed client (CQ_ARMED). Returns whether it wrote the event pipe.
    pub fn flush(&mut self) -> bool {
        if !self.dirty {
            return false;
        }
        self.dirty = false;
        self.ring.publish();
        self.page.note_completions();
        // Orders the producer index and the sequence before the loads of CQ_ARMED and
        // of the sleeping flag (both handshakes in `verbs_api::abi`).
        fence(Ordering::SeqCst);
        if self.page.take_sleeper() {
            // An error (none is expected of FUTEX_WAKE) leaves the sleeper to its
            // timeout (≤ 1 ms).
            let _ = verbs_api::os::futex_wake(self.page.poll_seq());
            self.poller_wakes += 1;
        }
        if self.ring.take_flags(CQ_ARMED) {
            self.event.notify();
            return true;
        }
        false
    }

    /// Pollers woken since the last call (for the `poller_wakes` counter).
    pub fn take_poller_wakes(&mut self) -> u64 {
        std::mem::take(&mut self.poller_wakes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softnic_transport::wr::WcOpcode;
    use std::os::fd::{AsFd, OwnedFd};

    /// A doorbell page as the client and the NIC each map it.
    fn page() -> (Doorbell, Doorbell) {
        let len = verbs_api::abi::DOORBELL_SEGMENT_LEN;
        let fd = verbs_api::os::memfd("db", len).unwrap();
        let map = || Arc::new(verbs_api::os::map_shared(fd.as_fd(), len).unwrap());
        (Doorbell::new(map()).unwrap(), Doorbell::new(map()).unwrap())
    }

    fn cq(
        depth: u32,
    ) -> (
        CompletionQueue,
        verbs_api::abi::ring::Consumer<Cqe>,
        OwnedFd,
    ) {
        cq_on(depth, page().1)
    }

    fn cq_on(
        depth: u32,
        page: Doorbell,
    ) -> (
        CompletionQueue,
        verbs_api::abi::ring::Consumer<Cqe>,
        OwnedFd,
    ) {
        let layout = CqLayout::new(depth).unwrap();
        let fd = verbs_api::os::memfd("cq", layout.len).unwrap();
        let client_map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), layout.len).unwrap());
        let client_ring = Ring::<Cqe>::new(client_map, 0, layout.capacity).unwrap();
        client_ring.init();
        let nic_map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), layout.len).unwrap());
        let ev = SignalPipe::new().unwrap();
        let ev2 = ev.reader().unwrap();
        let q = CompletionQueue::attach(1, nic_map, &layout, ev, page).unwrap();
        (q, client_ring.into_consumer(), ev2)
    }

    fn completion(wr_id: u64) -> Completion {
        Completion {
            queue: Queue::Recv,
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 10,
            imm: Some(0xABCD),
            src_qp: 0,
            srqn: 0,
        }
    }

    fn cqe_of_11(c: &Completion, vendor_err: u32) -> Cqe {
        cqe_of(c, 0x11, vendor_err)
    }

    #[test]
    fn cqes_become_visible_on_flush_and_wake_only_when_armed() {
        let (mut q, mut client, ev) = cq(2);
        q.push(&cqe_of_11(&completion(1), 0)).unwrap();
        assert_eq!(client.pop().unwrap(), None, "not published yet");
        assert!(!q.flush(), "not armed: no wake-up");
        let c = client.pop().unwrap().unwrap();
        assert_eq!(
            (c.wr_id, c.opcode, c.flags, c.imm, c.byte_len),
            (1, 129, 2, 0xABCD, 10)
        );
        client.release();
        assert!(client.arm(CQ_ARMED).unwrap(), "empty: may sleep");
        q.push(&cqe_of_11(&completion(2), 0)).unwrap();
        assert!(q.flush(), "armed: wake-up");
        assert_eq!(verbs_api::os::pipe_take(ev.as_fd()).unwrap(), Some(1));
        q.push(&cqe_of_11(&completion(3), 0)).unwrap();
        assert!(!q.flush(), "one wake-up per arm");
    }

    /// Hybrid polling: each flush moves the client's completion sequence; a flush
    /// wakes a sleeping poller once (and counts it), and costs nothing when none
    /// sleeps; any CQ of the client wakes it.
    #[test]
    fn a_flush_of_any_cq_of_the_client_wakes_its_sleeping_poller_once() {
        let (client, nic) = page();
        let (mut a, _ca, _ea) = cq_on(4, nic.clone());
        let (mut b, _cb, _eb) = cq_on(4, nic);
        let seq = || client.poll_seq().load(std::sync::atomic::Ordering::Acquire);
        let e = seq();
        a.push(&cqe_of_11(&completion(1), 0)).unwrap();
        a.flush();
        assert_eq!(seq(), e.wrapping_add(1), "a flush moves the sequence");
        assert_eq!(a.take_poller_wakes(), 0, "nobody sleeps");
        assert!(client.set_sleeper(seq()));
        b.push(&cqe_of_11(&completion(2), 0)).unwrap();
        b.flush();
        assert_eq!(b.take_poller_wakes(), 1, "the other CQ wakes the sleeper");
        a.push(&cqe_of_11(&completion(3), 0)).unwrap();
        a.flush();
        assert_eq!(a.take_poller_wakes(), 0, "one wake per sleep");
        assert!(!b.flush(), "not dirty: nothing");
    }

    /// A hostile client sets its sleeping flag again after every flush and never
    /// sleeps: one wake per flush of its own CQs, each counted, and nothing more.
    #[test]
    fn a_client_that_keeps_its_sleeping_flag_set_costs_one_wake_per_flush() {
        let (client, nic) = page();
        let (mut q, mut c, _ev) = cq_on(2, nic);
        for i in 0..1000 {
            client.set_sleeper(0);
            q.push(&cqe_of_11(&completion(i), 0)).unwrap();
            q.flush();
            assert_eq!(q.take_poller_wakes(), 1);
            assert!(!q.flush(), "nothing written: no flush, no wake");
            assert_eq!(q.take_poller_wakes(), 0);
            assert_eq!(c.pop().unwrap().unwrap().wr_id, i);
            c.release();
        }
    }

    /// The client makes its end of the event pipe blocking and never reads it, and
    /// arms again after every completion: the pipe fills, and the NIC's writes are
    /// skipped instead of blocking.
    #[test]
    fn a_client_that_never_reads_its_event_pipe_cannot_block_the_nic() {
        let (mut q, mut client, ev) = cq(2);
        verbs_api::os::set_nonblocking(ev.as_fd(), false).unwrap();
        for i in 0..200_000 {
            assert!(client.arm(CQ_ARMED).unwrap());
            q.push(&cqe_of_11(&completion(i), 0)).unwrap();
            assert!(q.flush(), "armed: wake-up");
            assert_eq!(client.pop().unwrap().unwrap().wr_id, i);
            client.release();
        }
        verbs_api::os::set_nonblocking(ev.as_fd(), true).unwrap();
        let held = verbs_api::os::pipe_take(ev.as_fd()).unwrap().unwrap();
        assert!(
            (4096..200_000).contains(&held),
            "{held} bytes: full, then skipped"
        );
    }

    #[test]
    fn full_ring_reports_full_and_recovers_after_poll() {
        let (mut q, mut client, _ev) = cq(2);
        q.push(&cqe_of_11(&completion(1), 0)).unwrap();
        q.push(&cqe_of_11(&completion(2), 0)).unwrap();
        assert_eq!(q.push(&cqe_of_11(&completion(3), 0)), Err(PushError::Full));
        assert_eq!(client.pop().unwrap().unwrap().wr_id, 1);
        client.release();
        q.push(&cqe_of_11(&completion(3), 0)).unwrap();
    }

    #[test]
    fn grh_flag_only_on_successful_ud_receives() {
        let recv = completion(1);
        let send = Completion {
            queue: Queue::Send,
            ..recv
        };
        let failed = Completion {
            status: WcStatus::WrFlushErr,
            ..recv
        };
        assert_eq!(grh_flag(QpType::Ud, &recv), wc_flags::GRH);
        assert_eq!(grh_flag(QpType::Ud, &send), 0, "sends carry no GRH");
        assert_eq!(grh_flag(QpType::Ud, &failed), 0, "nothing was written");
        assert_eq!(grh_flag(QpType::Rc, &recv), 0, "RC buffers hold no GRH");
        assert_eq!(grh_flag(QpType::Uc, &recv), 0, "UC buffers hold no GRH");
    }
}
