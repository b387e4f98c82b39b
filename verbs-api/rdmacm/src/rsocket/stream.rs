//! One connected rsocket stream: the protocol state of [`super::proto`] ([`Stream`])
//! over its verbs objects ([`Endpoint`]) — credits, the two buffer rings,
//! control messages — in safe Rust over `verbs_api`. The accounting follows
//! rdma-core's `rsocket.c` field for field (`sseq_no`/`sseq_comp`, `rseq_no`/
//! `rseq_comp`, `ctrl_seqno`/`ctrl_max_seqno`, …) so that either side may be
//! rdma-core's.
//!
//! Two deliberate differences, neither visible on the wire:
//! * the sender keeps its target SGL (where it may write next) in its own memory and
//!   takes a granted entry from the registered array only once the grant's completion
//!   is polled, so it never acts on a half-written entry;
//! * a receive flushed while the stream is connected (the peer's CM disconnected the
//!   QP without an in-band DISCONNECT, e.g. the peer process died) ends the stream as
//!   a DISCONNECT would, instead of leaving a reader waiting for data that cannot come.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::time::{Duration, Instant};

use softnic_ibverbs::mr::ProgramMr;
use verbs_api::cm::CmId;
use verbs_api::{AccessFlags, SendWr, Sge as WrSge, WcStatus, WorkCompletion, WrOpcode};

pub use super::endpoint::{Endpoint, Sizes};
use super::proto::{self, ConnData, IoMap, Sge};
use crate::channel::errno_of;

/// Marks a receive's `wr_id` (rdma-core's `RS_WR_ID_FLAG_RECV`).
pub(super) const RECV_FLAG: u64 = 1 << 63;

/// How long a blocking call polls the CQ before it sleeps on the CQ's event pipe
/// (rdma-core's default `polling_time`, 10 µs).
pub const POLLING_TIME: Duration = Duration::from_micros(10);

/// A connected stream (rdma-core's `struct rsocket` in a connected state).
pub struct Stream {
    /// The connection's CM id (kept for the disconnect, and for the addresses).
    pub id: CmId,
    ep: Endpoint,
    /// Data may still arrive (`rs_readable`).
    pub readable: bool,
    /// This side may still send (`rs_writable`).
    pub writable: bool,
    /// The QP is usable (`rs_connected`).
    pub connected: bool,
    /// Ended by a DISCONNECT, both shutdowns or a flush (`rs_disconnected`).
    pub disconnected: bool,
    /// A work request failed (`rs_error`): the errno for `SO_ERROR`.
    pub error: Option<c_int>,
    peer_big_endian: bool,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    /// The peer's target SGL array, and the entry our next grant goes to.
    remote_sgl: Sge,
    remote_sge: u32,
    /// Where we may write next: the first from the peer's connection data, then its
    /// grants; the entry in use, and the entry the next grant fills.
    target: [Sge; proto::SGL_SIZE as usize],
    target_sge: usize,
    grant_slot: usize,
    /// Lengths of the messages received and not yet read (`rmsg`).
    rmsg: VecDeque<u32>,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    sbuf_bytes_avail: u32,
    sbuf_head: u32,
    sqe_avail: u32,
    /// The peer's iomap array, where our writable `riomap`s go (`remote_iomap`).
    peer_iomap_array: Sge,
    /// Our `riomap`s (`iomap_list` and `iomap_queue`).
    maps: Vec<LocalMap>,
    /// The windows the peer mapped for our `riowrite`s, by index in our iomap array;
    /// each taken once its IOMAP_SGL completion is polled.
    peer_maps: Vec<Option<IoMap>>,
}

/// One `riomap` of this side: the registration, the offset it answers to, and for a
/// writable one its index in the peer's iomap array and whether it was sent there.
struct LocalMap {
    mr: ProgramMr,
    offset: u64,
    slot: Option<u32>,
    sent: bool,
}

/// Which condition a wait is for (rdma-core's `test` callbacks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Data to read, or no more can come.
    Readable,
    /// Room to send, or sending is over.
    Writable,
    /// A control-message slot, or the connection is gone.
    CtrlSlot,
    /// Every send completed, or the connection is gone.
    SendsDone,
    /// Just process what is there.
    Nothing,
}

impl Stream {
    /// The stream once both sides' connection data are known (`rs_save_conn_data`
    /// and `rs_init_bufs`' starting values).
    pub fn new(id: CmId, mut ep: Endpoint, peer: &ConnData) -> Stream {
        // The NIC moved the QP to RTR and RTS (at the REP, or at the accept): refresh
        // the state the QP handle checks posts against.
        let _ = ep.qp.query();
        let sizes = ep.sizes;
        let mut target = [Sge::default(); proto::SGL_SIZE as usize];
        target[0] = peer.data_buf;
        Stream {
            id,
            readable: true,
            writable: true,
            connected: true,
            disconnected: false,
            error: None,
            peer_big_endian: peer.big_endian(),
            ctrl_seqno: 0,
            ctrl_max_seqno: proto::QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: peer.credits,
            rseq_no: 0,
            rseq_comp: (sizes.rq_size >> 1) as u16,
            remote_sgl: peer.target_sgl,
            remote_sge: 1 % peer.target_sgl.length,
            target,
            target_sge: 0,
            grant_slot: 1,
            rmsg: VecDeque::new(),
            rbuf_bytes_avail: sizes.rbuf_size >> 1,
            rbuf_free_offset: sizes.rbuf_size >> 1,
            rbuf_offset: 0,
            sbuf_bytes_avail: sizes.sbuf_size,
            sbuf_head: 0,
            sqe_avail: sizes.sq_size - proto::QP_CTRL_SIZE,
            peer_iomap_array: peer.iomap_array(),
            maps: Vec::new(),
            peer_maps: vec![None; sizes.iomap_size as usize],
            ep,
        }
    }

    /// The sizes in force.
    pub fn sizes(&self) -> Sizes {
        self.ep.sizes
    }

    fn half(&self) -> u32 {
        self.ep.sizes.rbuf_size >> 1
    }

    /// `rs_can_send`.
    pub fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= proto::SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target[self.target_sge].length != 0
    }

    /// `rs_have_rdata`.
    pub fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn holds(&self, until: Until) -> bool {
        match until {
            Until::Readable => self.have_rdata() || !self.readable,
            Until::Writable => self.can_send() || !self.writable,
            Until::CtrlSlot => self.ctrl_avail() || !self.connected,
            Until::SendsDone => {
                i64::from(self.ctrl_max_seqno) - i64::from(self.ctrl_seqno)
                    + i64::from(self.sqe_avail)
                    == i64::from(self.ep.sizes.sq_size)
                    || !self.connected
            }
            Until::Nothing => true,
        }
    }

    /// A work request failed: the stream is over with `errno` for `SO_ERROR`.
    fn fail(&mut self, errno: c_int) {
        if self.connected {
            self.error = Some(errno);
        }
        self.close_both();
    }

    /// The peer ended the stream (DISCONNECT, its SHUTDOWN after ours, a flush).
    fn end(&mut self) {
        self.close_both();
        self.disconnected = true;
    }

    fn close_both(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    /// Processes completions, gives credits, and returns once `until` holds; with
    /// `nonblock`, EWOULDBLOCK instead of waiting (`rs_get_comp`: a short spin, then
    /// sleep on the CQ's event pipe).
    pub fn progress(&mut self, nonblock: bool, until: Until) -> Result<(), c_int> {
        let start = Instant::now();
        // Bounded: each pass either returns, spins within POLLING_TIME, or sleeps
        // until a completion arrives (every state change the tests wait for is one).
        loop {
            self.update_credits();
            let polled = self.poll_cq();
            if self.holds(until) {
                self.update_credits();
                return Ok(());
            }
            polled?;
            // Nothing yet: let the NIC have the core now and then (the program may be
            // spinning on EWOULDBLOCK, as rstream does, on the cores the NICs run on).
            self.ep.cq.idle();
            if nonblock {
                return Err(libc::EWOULDBLOCK);
            }
            if start.elapsed() < POLLING_TIME {
                std::hint::spin_loop();
                continue;
            }
            self.update_credits();
            if let Err(e) = self.ep.cq.wait(None) {
                self.fail(errno_of(&e));
                return Err(errno_of(&e));
            }
        }
    }

    /// Polls every completion (`rs_poll_cq`), then re-posts the receives consumed.
    fn poll_cq(&mut self) -> Result<(), c_int> {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut reposts = 0u32;
        loop {
            let n = match self.ep.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.fail(libc::EIO);
                    return Err(errno_of(&e));
                }
            };
            for wc in &wcs[..n] {
                if wc.wr_id & RECV_FLAG != 0 {
                    if !self.on_recv(wc) {
                        return Ok(());
                    }
                    if wc.status == WcStatus::Success {
                        reposts += 1;
                    }
                } else {
                    self.on_send(wc);
                }
            }
            if n < wcs.len() {
                break;
            }
        }
        if self.connected {
            for _ in 0..reposts {
                if let Err(e) = self.ep.post_recv() {
                    self.fail(errno_of(&e));
                    return Err(errno_of(&e));
                }
            }
        }
        Ok(())
    }

    /// One receive completion; false when the stream ended (stop processing, as
    /// rdma-core returns at a DISCONNECT).
    fn on_recv(&mut self, wc: &WorkCompletion) -> bool {
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushErr && self.connected {
                self.end();
                return false;
            }
            return true;
        }
        // A receive without immediate data is no message of this protocol (rdma-core
        // sends them only on iWARP, which has no WRITE with immediate): ignored.
        let Some(msg) = wc.imm_data else {
            return true;
        };
        match proto::msg_op(msg) {
            proto::OP_SGL => {
                self.sseq_comp = proto::msg_data(msg) as u16;
                if wc.byte_len as usize == proto::SGE_LEN {
                    let at = self.grant_slot * proto::SGE_LEN;
                    self.target[self.grant_slot] = Sge::from_ne_bytes(self.ep.tgt.read_array(at));
                    self.grant_slot = (self.grant_slot + 1) % self.target.len();
                }
            }
            proto::OP_CTRL => match proto::msg_data(msg) {
                proto::CTRL_DISCONNECT => {
                    self.end();
                    return false;
                }
                proto::CTRL_SHUTDOWN => {
                    if self.writable {
                        self.readable = false;
                    } else {
                        self.end();
                        return false;
                    }
                }
                _ => {}
            },
            proto::OP_DATA => {
                let len = proto::msg_data(msg);
                // The peer wrote at most one buffer half per message; more is a
                // protocol violation that would make the reader copy stale bytes.
                if len > self.half() || self.rmsg.len() > self.ep.sizes.rq_size as usize {
                    self.fail(libc::EPROTO);
                    return false;
                }
                self.rmsg.push_back(len);
            }
            proto::OP_IOMAP_SGL => {
                // The peer wrote one entry of our iomap array; take it now that its
                // WRITE has landed. An index outside the array is no entry of ours.
                let i = proto::msg_data(msg) as usize;
                if i >= self.peer_maps.len() {
                    self.fail(libc::EPROTO);
                    return false;
                }
                let at = proto::SGE_LEN * proto::SGL_SIZE as usize + i * proto::IOMAP_LEN;
                self.peer_maps[i] = Some(IoMap::from_ne_bytes(self.ep.tgt.read_array(at)));
            }
            // The reserved ones: nothing to do.
            _ => {}
        }
        true
    }

    /// One send completion: the slot, bytes or control slot it held come back.
    fn on_send(&mut self, wc: &WorkCompletion) {
        let msg = wc.wr_id as u32;
        match proto::msg_op(msg) {
            proto::OP_SGL => self.ctrl_max_seqno += 1,
            proto::OP_IOMAP_SGL => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += proto::IOMAP_LEN as u32;
            }
            proto::OP_CTRL => {
                self.ctrl_max_seqno += 1;
                if proto::msg_data(msg) == proto::CTRL_DISCONNECT {
                    self.end();
                }
            }
            _ => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += proto::msg_data(msg);
            }
        }
        if wc.status != WcStatus::Success && self.connected {
            self.fail(libc::EIO);
        }
    }

    fn post(&mut self, wr: SendWr<'_>) -> Result<(), c_int> {
        self.ep.qp.post_send(&[wr.signaled()]).map_err(|e| {
            let errno = errno_of(&e);
            self.fail(errno);
            errno
        })
    }

    /// A zero-length WRITE with immediate `msg` (`rs_post_msg`).
    fn post_msg(&mut self, msg: u32) -> Result<(), c_int> {
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: self.remote_sgl.addr,
            rkey: self.remote_sgl.key,
            imm: msg,
        };
        self.post(SendWr::new(u64::from(msg), op, &[]))
    }

    /// `rs_give_credits`.
    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.half()
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.connected
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            // A failed post has already failed the stream; the caller sees it.
            let _ = self.send_credits();
        }
    }

    /// `rs_send_credits`: the new message limit, with the free half of the receive
    /// buffer when there is one.
    fn send_credits(&mut self) -> Result<(), c_int> {
        self.ctrl_seqno += 1;
        let rq = self.ep.sizes.rq_size as u16;
        self.rseq_comp = self.rseq_no.wrapping_add(rq >> 1);
        let msg = proto::msg(proto::OP_SGL, u32::from(self.rseq_no) + u32::from(rq));
        if self.rbuf_bytes_avail < self.half() {
            return self.post_msg(msg);
        }
        let half = self.half();
        let grant = Sge {
            addr: self.ep.rbuf.addr() + u64::from(self.rbuf_free_offset),
            key: self.ep.rbuf.rkey(),
            length: half,
        }
        .to_peer_bytes(self.peer_big_endian);
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: self.remote_sgl.addr + u64::from(self.remote_sge) * proto::SGE_LEN as u64,
            rkey: self.remote_sgl.key,
            imm: msg,
        };
        let r = if self.ep.sizes.sq_inline as usize >= proto::SGE_LEN {
            let pieces: [&[u8]; 1] = [&grant];
            self.post(SendWr::new(u64::from(msg), op, &[]).inline_bytes(&pieces))
        } else {
            let slot = (self.ctrl_seqno % proto::QP_CTRL_SIZE) as usize;
            let at = self.ep.sizes.sbuf_size as usize + slot * proto::SGE_LEN;
            self.ep.sbuf.write(at, &grant);
            let sge = [self.ep.sbuf.sge(at, proto::SGE_LEN as u32)];
            self.post(SendWr::new(u64::from(msg), op, &sge))
        };
        self.rbuf_bytes_avail -= half;
        self.rbuf_free_offset += half;
        if self.rbuf_free_offset >= self.ep.sizes.rbuf_size {
            self.rbuf_free_offset = 0;
        }
        self.remote_sge = (self.remote_sge + 1) % self.remote_sgl.length;
        r
    }

    /// `rrecv` on a connected stream, without waiting: what has arrived, up to
    /// `buf.len()`; 0 at the end of the stream; EWOULDBLOCK when nothing has yet.
    /// `peek` leaves the bytes in place. (`MSG_WAITALL` and blocking are the caller's
    /// loop, which waits without holding the socket.)
    pub fn recv(&mut self, buf: &mut [u8], peek: bool) -> Result<usize, c_int> {
        if !self.have_rdata() {
            self.progress(true, Until::Readable)?;
        }
        if peek {
            return Ok(self.peek(buf));
        }
        let mut done = 0usize;
        while done < buf.len() {
            let Some(front) = self.rmsg.front_mut() else {
                break;
            };
            let want = buf.len() - done;
            let take = if (want as u64) < u64::from(*front) {
                *front -= want as u32;
                want as u32
            } else {
                let n = *front;
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
                n
            };
            self.copy_out(&mut buf[done..done + take as usize], true);
            done += take as usize;
        }
        Ok(done)
    }

    /// Copies the next `out.len()` bytes of the receive ring; `consume` advances it.
    fn copy_out(&mut self, out: &mut [u8], consume: bool) {
        let size = self.ep.sizes.rbuf_size;
        let mut off = self.rbuf_offset;
        let mut at = 0usize;
        while at < out.len() {
            let n = ((size - off) as usize).min(out.len() - at);
            self.ep.rbuf.read(off as usize, &mut out[at..at + n]);
            at += n;
            off += n as u32;
            if off >= size {
                off = 0;
            }
        }
        if consume {
            self.rbuf_offset = off;
            self.rbuf_bytes_avail += out.len() as u32;
        }
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        let queued: u64 = self.rmsg.iter().map(|&n| u64::from(n)).sum();
        let n = (buf.len() as u64).min(queued) as usize;
        self.copy_out(&mut buf[..n], false);
        n
    }

    /// `rsend` on a connected stream, without waiting: how many bytes of `data` were
    /// queued, or an errno when none was (EWOULDBLOCK; EPIPE after this side's SHUT_WR;
    /// ECONNRESET once the connection is gone).
    pub fn send(&mut self, data: &[u8]) -> Result<usize, c_int> {
        self.may_write()?;
        let mut done = 0usize;
        let mut olen = proto::OLAP_START_SIZE;
        // Bounded: each pass queues at least one byte or returns.
        while done < data.len() {
            if let Err(e) = self.room_to_send() {
                return partial(done, e);
            }
            let xfer = next_transfer(&mut olen, data.len() - done)
                .min(self.sbuf_bytes_avail)
                .min(self.target[self.target_sge].length);
            let piece = &data[done..done + xfer as usize];
            if let Err(e) = self.write_data(piece) {
                return partial(done, e);
            }
            done += xfer as usize;
        }
        Ok(done)
    }

    /// One data transfer into the peer's current target (`rs_write_data`).
    fn write_data(&mut self, piece: &[u8]) -> Result<(), c_int> {
        let len = piece.len() as u32;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let t = &mut self.target[self.target_sge];
        let (addr, rkey) = (t.addr, t.key);
        t.addr += u64::from(len);
        t.length -= len;
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % self.target.len();
        }
        let msg = proto::msg(proto::OP_DATA, len);
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: addr,
            rkey,
            imm: msg,
        };
        self.post_bytes(piece, op, msg)
    }

    /// Posts `op` carrying `piece`: inline when small enough, else through the send
    /// ring (two SGEs across its end). The caller has taken the ring space.
    fn post_bytes(&mut self, piece: &[u8], op: WrOpcode, msg: u32) -> Result<(), c_int> {
        let len = piece.len() as u32;
        if len <= self.ep.sizes.sq_inline {
            let pieces: [&[u8]; 1] = [piece];
            return self.post(SendWr::new(u64::from(msg), op, &[]).inline_bytes(&pieces));
        }
        let size = self.ep.sizes.sbuf_size;
        let head = self.sbuf_head;
        let first = len.min(size - head);
        self.ep.sbuf.write(head as usize, &piece[..first as usize]);
        let mut sges: [WrSge; 2] = [self.ep.sbuf.sge(head as usize, first), WrSge::default()];
        let mut n = 1;
        if first < len {
            self.ep.sbuf.write(0, &piece[first as usize..]);
            sges[1] = self.ep.sbuf.sge(0, len - first);
            n = 2;
        }
        self.sbuf_head = (head + len) % size;
        self.post(SendWr::new(u64::from(msg), op, &sges[..n]))
    }

    /// `riomap` on a connected stream: keeps the registration `mr` as the window
    /// answering to `offset`; a writable one takes a free entry of the peer's iomap
    /// array (ENOMEM when none is left) and is sent there before this side's next data
    /// (now, when there is room).
    pub fn map(&mut self, mr: ProgramMr, offset: u64, writable: bool) -> Result<(), c_int> {
        let slot = if writable {
            let free = (0..self.peer_iomap_array.length)
                .find(|&i| self.maps.iter().all(|m| m.slot != Some(i)));
            Some(free.ok_or(libc::ENOMEM)?)
        } else {
            None
        };
        self.maps.push(LocalMap {
            mr,
            offset,
            slot,
            sent: slot.is_none(),
        });
        // What does not go now goes with this side's next rsend or riowrite, which
        // report a failure.
        let _ = self.send_iomaps();
        Ok(())
    }

    /// `riounmap` on a connected stream: drops the mapping `riomap` made of exactly
    /// `[addr, addr + len)` (EINVAL when there is none) and frees its entry.
    pub fn unmap(&mut self, addr: usize, len: usize) -> Result<(), c_int> {
        let i = self
            .maps
            .iter()
            .position(|m| m.mr.addr() == addr && m.mr.len() == len)
            .ok_or(libc::EINVAL)?;
        // Dropping it deregisters it: the peer's entry, if sent, now names keys the
        // NIC refuses, as with rdma-core.
        self.maps.swap_remove(i);
        Ok(())
    }

    /// The access rights `riomap` registers with: local write always, remote write
    /// for a window the peer may `riowrite` into.
    pub fn map_access(writable: bool) -> AccessFlags {
        let mut a = AccessFlags::LOCAL_WRITE.0;
        if writable {
            a |= AccessFlags::REMOTE_WRITE.0;
        }
        AccessFlags(a)
    }

    /// The PD `riomap` registers on.
    pub fn pd(&self) -> &verbs_api::ProtectionDomain {
        &self.ep.pd
    }

    /// Sends the writable mappings not yet sent (`rs_send_iomaps`): each an RDMA WRITE
    /// with immediate of its entry into the peer's array, taking a message credit as
    /// data does. EWOULDBLOCK when the send queue or the peer's credits are exhausted.
    fn send_iomaps(&mut self) -> Result<(), c_int> {
        // Bounded: each pass sends one mapping or returns.
        while let Some(i) = self.maps.iter().position(|m| !m.sent) {
            self.room_to_send()?;
            let m = &mut self.maps[i];
            m.sent = true;
            let slot = m.slot.unwrap_or(0);
            let entry = IoMap {
                offset: m.offset,
                sge: Sge {
                    addr: m.mr.addr() as u64,
                    key: m.mr.rkey(),
                    length: m.mr.len() as u32,
                },
            }
            .to_peer_bytes(self.peer_big_endian);
            self.sseq_no = self.sseq_no.wrapping_add(1);
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= proto::IOMAP_LEN as u32;
            let msg = proto::msg(proto::OP_IOMAP_SGL, slot);
            let op = WrOpcode::RdmaWriteWithImm {
                remote_addr: self.peer_iomap_array.addr + u64::from(slot) * proto::IOMAP_LEN as u64,
                rkey: self.peer_iomap_array.key,
                imm: msg,
            };
            self.post_bytes(&entry, op, msg)?;
        }
        Ok(())
    }

    /// `riowrite` on a connected stream, without waiting: RDMA WRITEs of `data` into
    /// the peer's mapped windows from `offset` on (no immediate: the peer learns of
    /// them from a later message, which RC orders after them). How many bytes were
    /// queued; EINVAL when `offset` is in no window the peer mapped; otherwise the
    /// errors of [`Stream::send`].
    pub fn iowrite(&mut self, data: &[u8], offset: u64) -> Result<usize, c_int> {
        self.may_write()?;
        let mut done = 0usize;
        let mut olen = proto::OLAP_START_SIZE;
        // Bounded: each pass queues at least one byte or returns.
        while done < data.len() {
            let at = offset.saturating_add(done as u64);
            let mut window = self.locate(at);
            if window.is_none() {
                // Its entry may have landed with completions not yet polled.
                let _ = self.progress(true, Until::Nothing);
                window = self.locate(at);
            }
            let Some((addr, rkey, room)) = window else {
                return partial(done, libc::EINVAL);
            };
            if let Err(e) = self.room_to_send() {
                return partial(done, e);
            }
            let xfer = next_transfer(&mut olen, data.len() - done)
                .min(self.sbuf_bytes_avail)
                .min(room);
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= xfer;
            let op = WrOpcode::RdmaWrite {
                remote_addr: addr,
                rkey,
            };
            let piece = &data[done..done + xfer as usize];
            if let Err(e) = self.post_bytes(piece, op, proto::msg(proto::OP_WRITE, xfer)) {
                return partial(done, e);
            }
            done += xfer as usize;
        }
        Ok(done)
    }

    /// Where offset `at` of the peer's windows is: address, R_Key, bytes of the window
    /// from there (`rs_find_iomap`).
    fn locate(&self, at: u64) -> Option<(u64, u32, u32)> {
        self.peer_maps.iter().flatten().find_map(|m| {
            let (addr, room) = m.locate(at)?;
            Some((addr, m.sge.key, room))
        })
    }

    /// Whether this side may still send; first sends the mappings not yet sent, which
    /// go before the data that follows them (`rs_send_iomaps`). After this side's
    /// SHUT_WR: EPIPE, as TCP answers (rdma-core would still send while it has room);
    /// once the connection is gone: ECONNRESET.
    fn may_write(&mut self) -> Result<(), c_int> {
        if !self.writable {
            return Err(if self.connected {
                libc::EPIPE
            } else {
                libc::ECONNRESET
            });
        }
        self.send_iomaps()
    }

    /// Room for one more transfer (`rs_can_send`), after polling without waiting:
    /// EWOULDBLOCK when there is none yet, ECONNRESET once sending is over.
    fn room_to_send(&mut self) -> Result<(), c_int> {
        if !self.can_send() {
            self.progress(true, Until::Writable)?;
            if !self.writable {
                return Err(libc::ECONNRESET);
            }
        }
        Ok(())
    }

    /// `rshutdown` on a connected stream: tells the peer (SHUTDOWN when it may still
    /// send to us, else DISCONNECT) and waits until every send completed.
    pub fn shutdown(&mut self, how: c_int) -> Result<(), c_int> {
        if self.connected {
            let ctrl = match how {
                libc::SHUT_RDWR => {
                    self.readable = false;
                    self.writable = false;
                    proto::CTRL_DISCONNECT
                }
                libc::SHUT_WR => {
                    self.writable = false;
                    if self.readable {
                        proto::CTRL_SHUTDOWN
                    } else {
                        proto::CTRL_DISCONNECT
                    }
                }
                _ => {
                    self.readable = false;
                    if self.writable {
                        return Ok(());
                    }
                    proto::CTRL_DISCONNECT
                }
            };
            if !self.ctrl_avail() {
                self.progress(false, Until::CtrlSlot)?;
            }
            if self.connected && self.ctrl_avail() {
                self.ctrl_seqno += 1;
                self.post_msg(proto::msg(proto::OP_CTRL, ctrl))?;
            }
        }
        if self.connected {
            self.progress(false, Until::SendsDone)?;
        }
        Ok(())
    }

    /// Poll readiness (`rs_poll_rs` for a connected stream): processes completions
    /// without waiting, then POLLIN, POLLOUT, POLLHUP, POLLERR as they hold.
    pub fn revents(&mut self, events: i16) -> i16 {
        let _ = self.progress(true, Until::Nothing);
        let mut r = 0;
        if events & libc::POLLIN != 0 && self.holds(Until::Readable) {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && self.can_send() {
            r |= libc::POLLOUT;
        }
        // The end is reported once the data that arrived before it has been read, as
        // a TCP socket reports its peer's close after the data (rdma-core reports
        // POLLHUP at once, so a program that treats POLLHUP as fatal, as rstream's
        // `-T a` does, may lose the tail of the stream; here it reads it first).
        if !self.connected && !self.have_rdata() {
            r |= if self.disconnected {
                libc::POLLHUP
            } else {
                libc::POLLERR
            };
        }
        r
    }

    /// Arms the CQ for a `poll(2)` on [`Stream::wait_fd`]: false when completions are
    /// already waiting (do not sleep).
    pub fn arm(&mut self) -> bool {
        self.ep.cq.arm().unwrap_or(false)
    }

    /// The descriptor that becomes readable when the armed CQ gets a completion.
    pub fn wait_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ep.cq.event_fd().as_raw_fd()
    }

    /// After a poll found nothing: yields or sleeps now and then (see
    /// `CompletionQueue::idle`).
    pub fn idle(&self) {
        self.ep.cq.idle();
    }

    /// Takes the CQ's event after a wake-up.
    pub fn take_event(&self) {
        let _ = self.ep.cq.take_event();
    }
}

/// The size of a send's next transfer with `left` bytes to go: the first
/// [`proto::OLAP_START_SIZE`], each following one twice the last up to
/// [`proto::MAX_TRANSFER`] (rdma-core's `olen`), so a large send starts moving early.
fn next_transfer(olen: &mut u32, left: usize) -> u32 {
    if (*olen as usize) >= left {
        return left as u32;
    }
    let x = *olen;
    if *olen < proto::MAX_TRANSFER {
        *olen <<= 1;
    }
    x
}

/// A call that moved `done` bytes before `e` returns the count, as `send(2)` does.
fn partial(done: usize, e: c_int) -> Result<usize, c_int> {
    if done == 0 {
        Err(e)
    } else {
        Ok(done)
    }
}
