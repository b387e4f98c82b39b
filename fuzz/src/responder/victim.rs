//! The victim: one NIC's worth of QPs (RC, UC, UD, and an XRC receive QP with the XRC
//! SRQs of its domain) in RTS, connected to the peer, with canaried memory, driven
//! through the NIC's receive path, and checked after every call into the transport.
//!
//! The receive path mirrors `softnic/src/nic/runtime.rs` (`rx_one`): length, `wire`
//! parse, the single pass where `Qp::placement` allows it (the payload written before
//! the check, `nic/rx_place.rs`), ICRC (`rx_icrc::verify`'s first path: IPv4 ID 0
//! with DF; with a placed payload's CRC combined in), demultiplex by destination QPN,
//! `Qp::handle_packet` (through `Placed` for a placed packet) — or, for the XRC receive
//! QP, as the runtime's `deliver` does, `Qp::handle_packet_xrc` with the XRC SRQ of the
//! QP's domain that the XRCETH names (`nic/xrc.rs` `srq_for_request`), else
//! `Qp::handle_packet_xrc_no_srq`; then, like the runtime's loop, drain
//! `poll_transmit` (filling each packet's ICRC as `runtime::tx_params` does) and
//! `poll_completion`, and fire `handle_timeout` when `poll_timeout` has passed in
//! virtual time.
//!
//! Oracles (a panic is a finding):
//! * memory: canaries intact; regions without write rights and the other PD's region
//!   unchanged; every access the transport was granted lies inside what asked for it
//!   (the RETH range of a WRITE or READ, the 8 bytes of an ATOMIC WRITE, or an
//!   atomic's target, each taken as a new
//!   request — a duplicate grants nothing of its own; the SGEs of a posted WQE still
//!   outstanding); on RC no request PSN modifies memory twice (duplicates are never
//!   executed again); a packet written before its ICRC check that then fails it made
//!   exactly that one write, of its own bytes, where the message in progress writes
//!   them (a WRITE at the write cursor), and its handling, when the check passes,
//!   makes that same write (`Placed::skipped`); every access is made under the QP's
//!   PD — for the XRC receive QP, under the PD of the SRQ the packet names (a message
//!   is bound to the SRQ of its first packet, and a packet naming another is refused),
//!   a receive scatter only into a WQE posted on that SRQ, and a READ response or
//!   RDMA WRITE only inside a range a request naming an SRQ of that same PD asked for;
//!   a packet naming no SRQ of the domain touches nothing;
//! * completions: only for WQEs posted on that QP and queue, each at most once, in
//!   posting order, with plausible lengths and opcodes; the XRC receive QP's go to the
//!   SRQ their WQE was posted on (`Completion::srqn`), in posting order per SRQ, and a
//!   successful one only while handling a packet that names that SRQ;
//! * XRC binding: a packet hands nothing to or takes nothing from an SRQ it does not
//!   name; a new request naming no SRQ of the domain, or an SRQ other than the one the
//!   message in progress is bound to, is refused — the QP goes to Err and sends NAK
//!   Remote Access Error (`RespError::XrcSrq`) — and one naming no SRQ never changes
//!   the state otherwise, never draws an RNR, Invalid Request or Remote Operational
//!   NAK, and executes nothing; the QP holds at most one SRQ WQE, of the SRQ its
//!   message in progress is bound to;
//! * output: every packet parses, its ICRC fills and verifies, it goes to the peer's
//!   address and QPN with the QP's transport, no payload exceeds the path MTU, a READ
//!   response carries the bytes it was read from, and request PSNs stay within the
//!   PSNs the posted WQEs occupy; the XRC receive QP sends only responses, without an
//!   XRCETH;
//! * bounded work: per input step, responses ≤ what the delivered requests ask for,
//!   requests ≤ the posted work times the retry events; `poll_transmit` goes quiet and
//!   timers stop within fixed bounds once the peer falls silent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;

use softnic_transport::memory::{Access, Memory};
use softnic_transport::qp::{
    Placed, Placement, Qp, QpAttr, QpCaps, QpCounters, QpState, QpType, ReceivedIp, PATH_MTUS,
};
use softnic_transport::srq::{Srq, SrqCaps, SrqCounters};
use softnic_transport::testing::{connect_qp, PairConfig};
use softnic_transport::time::{Duration, Instant};
use softnic_transport::wr::{
    Completion, Queue, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, MAX_SGE,
};
use wire::{NakCode, OpcodeInfo, Operation, PacketRepr, Position, Syndrome, Transport};

use super::memory::{mr_index, Actor, CanaryMem, Kind, Touch, Via, MRS, MRS_BASE};
use super::peer::{icrc_params, npkts, Datagram, Outstanding, Peer, QpView, LOCAL, PEER};
use arbitrary::{Result, Unstructured};

/// The victim's QPNs: RC, UC, UD, XRC receive.
pub const QPNS: [u32; 4] = [0x00_0123, 0x00_0456, 0x00_0789, 0x00_0ABC];

/// The peer's QPNs, in the same order (the last is the peer's XRC send QP).
pub const PEER_QPNS: [u32; 4] = [0x0A_0001, 0x0A_0002, 0x0A_0003, 0x0A_0004];

/// Index of the XRC receive QP among the victim's QPs.
pub const XRC: usize = 3;

/// Protection domain of the RC, UC and UD QPs (an XRC receive QP has none of its own).
const PD: u32 = 1;

/// The XRC domain of the victim's XRC receive QP.
pub const XRC_DOMAIN: u32 = 1;

/// One XRC SRQ the victim's NIC holds (`nic/xrc.rs`).
#[derive(Debug, Clone, Copy)]
pub struct SrqSpec {
    /// Its number on the wire, the one an XRCETH names (`ibv_get_srq_num`).
    pub num: u32,
    /// The number the transport knows it by, which `Completion::srqn` carries (the
    /// NIC's handle, not the wire number).
    pub handle: u32,
    /// Its XRC domain.
    pub domain: u32,
    /// Its protection domain: the memory a request through it may reach.
    pub pd: u32,
    /// The region (of that PD) its receive WQEs scatter into.
    pub region: &'static str,
}

/// The victim's XRC SRQs: three of the XRC receive QP's domain, each in its own PD (the
/// RC QPs' PD 1, and PDs 3 and 4, each with one region of the table), with numbers
/// small, random-looking and at the top of the 24 bits; and one of another domain
/// (PD 2, whose one region nothing may change), which a request to this QP must never
/// reach (IBTA 9.3 XRCETH: only an XRC SRQ of the target QP's domain).
pub const XRC_SRQS: [SrqSpec; 4] = [
    srq_spec(0x00_0005, 0x41, XRC_DOMAIN, 1, "recv"),
    srq_spec(0x8A_31C7, 0x42, XRC_DOMAIN, 3, "xrc3"),
    srq_spec(0xFF_FFFF, 0x43, XRC_DOMAIN, 4, "xrc4"),
    srq_spec(0x00_0009, 0x44, 2, 2, "otherpd"),
];

const fn srq_spec(num: u32, handle: u32, domain: u32, pd: u32, region: &'static str) -> SrqSpec {
    SrqSpec {
        num,
        handle,
        domain,
        pd,
        region,
    }
}

/// Capacities of every XRC SRQ.
const SRQ_CAPS: SrqCaps = SrqCaps {
    max_wr: 16,
    max_sge: MAX_SGE as u32,
};

/// Receive WQEs each XRC SRQ starts with (posted without reading the input, so that
/// inputs written before the XRC QP existed keep their meaning).
const SRQ_INITIAL_WQES: usize = 3;

/// Step bytes from this value up select an XRC step (the low four bits say which);
/// below it, a step byte `b` selects step `b % 16` as it did before the XRC QP existed.
const XRC_STEPS: u8 = 0xF0;

/// `poll_transmit` calls one drain may make before the QP counts as looping.
const TX_GUARD: usize = 1 << 16;

/// Timer firings allowed, once the peer is silent, before the timers count as
/// never stopping (a retry-limited requester needs at most a few dozen).
const MAX_FIRINGS: usize = 512;

/// Queue capacities of every victim QP.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_sge: MAX_SGE as u32,
    max_inline: 64,
};

/// Ranges a QP was asked to touch, each with the protection domain the request was
/// received under (the QP's, or the PD of the XRC SRQ it named).
#[derive(Debug, Default)]
struct Windows {
    /// WRITE First/Only RETHs delivered: (rkey, va, dma_len, pd).
    write: Vec<(u32, u64, u64, u32)>,
    /// READ request RETHs delivered.
    read: Vec<(u32, u64, u64, u32)>,
    /// Atomic targets delivered: (rkey, va, pd).
    atomic: Vec<(u32, u64, u32)>,
}

/// One XRC SRQ of the victim, with the WQEs posted on it.
#[derive(Debug)]
struct XrcSrq {
    spec: SrqSpec,
    srq: Srq,
    /// Every wr_id ever posted on it (minus those discarded by a Reset of the QP that
    /// held them).
    posted: HashSet<u64>,
    /// Posted, not yet completed, by wr_id: those still in the pool are the highest
    /// (it lends from its front, in posting order), the rest are held by the QP.
    live: BTreeMap<u64, RecvWr>,
    /// Latest completed wr_id.
    last_completed: u64,
    /// Receive slots handed out so far.
    next_slot: u64,
}

impl XrcSrq {
    /// WQEs taken from the pool and not completed: held by the XRC receive QP.
    fn held(&self) -> usize {
        self.live
            .len()
            .checked_sub(self.srq.len())
            .expect("the pool holds only WQEs posted on it and not completed")
    }
}

/// What the XRC receive QP and the SRQs looked like before a packet was handled.
struct XrcBefore {
    counters: QpCounters,
    state: QpState,
    /// Per SRQ: WQEs in the pool, and WQEs taken.
    srqs: Vec<(usize, u64)>,
}

/// What the run saw (for the summary a debug run prints).
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Datagrams offered to the receive path.
    pub datagrams: u64,
    /// Dropped by the ICRC check.
    pub drop_icrc: u64,
    /// Dropped by the parser.
    pub drop_parse: u64,
    /// Dropped for an unknown QPN.
    pub drop_qpn: u64,
    /// Handed to `Qp::handle_packet`.
    pub handled: u64,
    /// Of those, written before their ICRC check (`Qp::placement`) and handled through
    /// `Placed`.
    pub placed: u64,
    /// Written before their ICRC check, which then failed (counted in `drop_icrc`).
    pub placed_dropped: u64,
    /// Packets the victim sent.
    pub sent: u64,
    /// Completions.
    pub completions: u64,
    /// Memory accesses granted, by kind: read_local, write_local, read_remote,
    /// write_remote, atomic.
    pub touches: [u64; 5],
    /// Successful completions, receive and send.
    pub success: [u64; 2],
    /// Packets handed to the XRC receive QP with an XRC SRQ of its domain, and without
    /// one (`handle_packet_xrc_no_srq`).
    pub xrc: [u64; 2],
}

/// The victim NIC.
pub struct Victim {
    qps: Vec<Qp>,
    /// Registered memory.
    pub mem: CanaryMem,
    now: Instant,
    /// The peer, which owns the generator's model.
    pub peer: Peer,
    /// Posted, not yet completed WQEs, per QP.
    send_live: Vec<HashMap<u64, SendWr>>,
    recv_live: Vec<HashMap<u64, RecvWr>>,
    /// Every wr_id ever posted and every one completed, per (QP, queue).
    posted: HashSet<(usize, Queue, u64)>,
    completed: HashSet<(usize, Queue, u64)>,
    windows: Vec<Windows>,
    /// RC request PSNs that have modified memory.
    executed: HashSet<(usize, u32)>,
    /// Where the next RDMA WRITE Middle/Last packet must land, per QP: (R_Key, VA).
    write_cursor: Vec<Option<(u32, u64)>>,
    /// Latest completed wr_id per QP, receive and send queue.
    last_completed: Vec<[u64; 2]>,
    /// PSNs the send WQEs posted since the QP was connected can occupy (an upper
    /// bound: one per path-MTU packet, a READ as many as its response packets, one
    /// per atomic).
    psn_span: Vec<u64>,
    next_wr_id: u64,
    next_recv_slot: u64,
    tx_buf: Vec<u8>,
    mtu: u32,
    /// Connection settings, for reconnecting a QP after Reset.
    cfg: PairConfig,
    psns: (u32, u32),
    /// What happened.
    pub stats: Stats,
    /// Per-step budget of responses (RC) and events that may trigger retransmission.
    budget_responses: u64,
    events: u64,
    /// Request packets of the send WQEs posted in this step.
    posted_packets: u64,
    /// The XRC SRQs (of the XRC receive QP's domain, and one of another domain).
    srqs: Vec<XrcSrq>,
    /// The model of the XRC receive QP's responder: the SRQ its message in progress
    /// is bound to (a SEND or WRITE whose First was executed and whose Last was not),
    /// by index in `srqs`.
    xrc_msg: Option<usize>,
    /// The XRC receive QP refused a request for its XRCETH: its next output must
    /// carry NAK Remote Access Error.
    expect_rae: bool,
}

fn psn_choice(u: &mut Unstructured<'_>) -> Result<u32> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => 0,
        1 => 0x00FF_FFFF,
        2 => 0x00FF_FFF0,
        3 => 0x007F_FFFF,
        4 => u.int_in_range(0..=0x00FF_FFFF)?,
        _ => 0x00AB_CD00,
    })
}

impl Victim {
    /// Builds the victim from the first bytes of the input: path MTU, initial PSNs,
    /// READ/atomic depth, QP access flags, timers and retry counts, Q_Key.
    pub fn new(u: &mut Unstructured<'_>) -> Result<Victim> {
        let mtu = *u.choose(&PATH_MTUS)?;
        let rq_psn = psn_choice(u)?;
        let sq_psn = psn_choice(u)?;
        let access = if u.ratio(7, 8)? {
            Access::ALL
        } else {
            Access(u.int_in_range(0..=15)?)
        };
        let cfg = PairConfig {
            qp_type: QpType::Rc,
            mtu,
            qpns: (0, 0),
            psns: (0, 0),
            timeout: u.int_in_range(0..=12)?,
            retry_cnt: u.int_in_range(0..=7)?,
            rnr_retry: u.int_in_range(0..=7)?,
            min_rnr_timer: u.int_in_range(0..=31)?,
            rd_atomic: u.int_in_range(1..=16)?,
            access,
            caps: CAPS,
            qkey: if u.ratio(3, 4)? {
                0x1111_2222
            } else {
                u.arbitrary()?
            },
            traffic_class: 0,
        };
        let mut qps = Vec::new();
        let mut views = Vec::new();
        let types = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::XrcRecv];
        for (i, t) in types.into_iter().enumerate() {
            let mut qp = match t {
                QpType::XrcRecv => Qp::new_xrc_recv(QPNS[i], CAPS),
                _ => Qp::new(QPNS[i], t, PD, CAPS),
            };
            connect_qp(&mut qp, &cfg, PEER_QPNS[i], PEER, rq_psn, sq_psn);
            qp.set_port_mtu(mtu);
            qp.set_local_addr(LOCAL);
            qps.push(qp);
            views.push(QpView {
                qp_type: t,
                qpn: QPNS[i],
                peer_qpn: PEER_QPNS[i],
                mtu,
                qkey: cfg.qkey,
                next_psn: rq_psn,
                // The XRC QP's requests name the XRC SRQs' regions too.
                regions: if t == QpType::XrcRecv {
                    MRS.len()
                } else {
                    MRS_BASE
                },
            });
        }
        let n = qps.len();
        let mut v = Victim {
            qps,
            mem: CanaryMem::new(),
            now: Instant::from_nanos(1_000_000),
            peer: Peer {
                qps: views,
                recent: Vec::new(),
            },
            send_live: (0..n).map(|_| HashMap::new()).collect(),
            recv_live: (0..n).map(|_| HashMap::new()).collect(),
            posted: HashSet::new(),
            completed: HashSet::new(),
            windows: (0..n).map(|_| Windows::default()).collect(),
            executed: HashSet::new(),
            last_completed: vec![[0; 2]; n],
            write_cursor: vec![None; n],
            psn_span: vec![0; n],
            next_wr_id: 1,
            next_recv_slot: 0,
            tx_buf: vec![0; 4096 + 128],
            mtu,
            cfg,
            psns: (rq_psn, sq_psn),
            stats: Stats::default(),
            budget_responses: 0,
            events: 0,
            posted_packets: 0,
            srqs: XRC_SRQS
                .iter()
                .map(|&spec| XrcSrq {
                    spec,
                    srq: Srq::new(spec.handle, spec.pd, SRQ_CAPS),
                    posted: HashSet::new(),
                    live: BTreeMap::new(),
                    last_completed: 0,
                    next_slot: 0,
                })
                .collect(),
            xrc_msg: None,
            expect_rae: false,
        };
        for qp in 0..XRC {
            for _ in 0..u.int_in_range(0..=4)? {
                v.post_recv(u, qp)?;
            }
        }
        for s in 0..v.srqs.len() {
            for _ in 0..SRQ_INITIAL_WQES {
                let r = mr_index(v.srqs[s].spec.region);
                let slot = v.next_slot(r, Some(s));
                let mut sges = [Sge::default(); MAX_SGE];
                sges[0] = whole_slot(r, slot, mtu);
                let wr = RecvWr {
                    wr_id: v.fresh_wr_id(),
                    sges,
                    num_sge: 1,
                };
                v.srq_post(s, wr);
            }
        }
        Ok(v)
    }

    /// One input step, then every oracle.
    pub fn step(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        self.budget_responses = 0;
        self.events = 0;
        self.posted_packets = 0;
        let live_before = self.live_send_packets();
        let pick: u8 = u.arbitrary()?;
        let sent = if pick >= XRC_STEPS {
            self.xrc_step(u, pick - XRC_STEPS)?
        } else {
            self.classic_step(u, pick % 16)?
        };
        let s = self.drain_all();
        self.check_step(add(sent, s), live_before);
        Ok(())
    }

    /// One step on the RC, UC and UD QPs (`k` < 16). Returns (responses, requests)
    /// sent while delivering a message or an answer.
    fn classic_step(&mut self, u: &mut Unstructured<'_>, k: u8) -> Result<(u64, u64)> {
        let mut sent = (0, 0);
        match k {
            0..=3 | 15 => {
                let d = self.peer.packet(u, 0)?;
                self.deliver(&d);
            }
            4 | 5 => {
                let qp = u.int_in_range(1..=2)?;
                let d = self.peer.packet(u, qp)?;
                self.deliver(&d);
            }
            6..=8 => {
                let qp = u.int_in_range(0..=1)?;
                let ds = self.peer.message(u, qp)?;
                sent = self.deliver_each(&ds);
            }
            9 => {
                let d = self.peer.response(u, 0)?;
                self.deliver(&d);
            }
            10 => {
                let ds = self.peer.answer(u, 0)?;
                sent = self.deliver_each(&ds);
            }
            11 => {
                let qp = u.int_in_range(0..=2)?;
                self.post_recv(u, qp)?;
            }
            12 | 13 => {
                let qp = *u.choose(&[0, 0, 0, 1, 2])?;
                self.post_send(u, qp)?;
            }
            14 if u.ratio(1, 4)? => {
                let qp = u.int_in_range(0..=2)?;
                match u.int_in_range(0u8..=3)? {
                    0 => self.move_to_error(qp),
                    1 => self.reconnect(qp),
                    // Drain the send queue, or resume from SQD/SQE. Illegal from the
                    // state the QP is in is fine: `modify` must refuse without harm.
                    2 => self.set_state(qp, QpState::Sqd),
                    _ => self.set_state(qp, QpState::Rts),
                }
            }
            _ => self.advance(u)?,
        }
        Ok(sent)
    }

    /// One XRC step (`k` < 16): mostly a crafted request or a well-formed message to
    /// the XRC receive QP; another service's request to it, or an XRC request to the
    /// RC, UC or UD QP (each must drop it: IBTA 9.2, the opcode names the service); an
    /// RC, UC or UD QP's own request with keys of the XRC SRQs' PDs too; a receive
    /// posted on an XRC SRQ; or the user changing the XRC QP's state. Returns
    /// (responses, requests) sent while delivering a message.
    fn xrc_step(&mut self, u: &mut Unstructured<'_>, k: u8) -> Result<(u64, u64)> {
        match k {
            0..=5 | 15 => {
                let d = self.peer.packet(u, XRC)?;
                self.deliver(&d);
            }
            6..=8 => {
                let ds = self.peer.message(u, XRC)?;
                return Ok(self.deliver_each(&ds));
            }
            9 => {
                let t = *u.choose(&[Transport::Rc, Transport::Uc, Transport::Ud])?;
                let d = self.peer.packet_of(u, XRC, t, MRS.len())?;
                self.deliver(&d);
            }
            10 | 11 => {
                let qp = u.int_in_range(0..=XRC - 1)?;
                let t = match k {
                    10 => Transport::Xrc,
                    _ => self.peer.qps[qp].qp_type.transport(),
                };
                let d = self.peer.packet_of(u, qp, t, MRS.len())?;
                self.deliver(&d);
            }
            12 | 13 => {
                let s = u.int_in_range(0..=self.srqs.len() - 1)?;
                self.post_srq_recv(u, s)?;
            }
            _ => match u.int_in_range(0u8..=3)? {
                0 => self.move_to_error(XRC),
                1 => self.reconnect(XRC),
                2 => self.set_state(XRC, QpState::Sqd),
                _ => self.set_state(XRC, QpState::Rts),
            },
        }
        Ok((0, 0))
    }

    /// Delivers `ds` in order, draining every QP after each (a message's packets, or
    /// the answers to a request). Returns (responses, requests) sent.
    fn deliver_each(&mut self, ds: &[Datagram]) -> (u64, u64) {
        let mut sent = (0, 0);
        for d in ds {
            self.deliver(d);
            sent = add(sent, self.drain_all());
        }
        sent
    }

    /// The victim's receive path for one datagram (`runtime::rx_one`).
    fn deliver(&mut self, d: &Datagram) {
        self.stats.datagrams += 1;
        if d.bytes.len() < wire::bth::HEADER_LEN + wire::ICRC_LEN {
            self.stats.drop_icrc += 1;
            return;
        }
        // The receiver's single pass (`nic/rx_place.rs`): parsed first; where
        // `Qp::placement` allows, the payload is written before the ICRC is checked.
        let parsed = PacketRepr::parse(&d.bytes);
        let placed = parsed.as_ref().ok().and_then(|p| self.place(p));
        if !self.icrc_ok(d, parsed.as_ref().ok(), placed.as_ref()) {
            self.stats.drop_icrc += 1;
            if let (Some((qp, _, _)), Ok(pkt)) = (placed, &parsed) {
                self.check_dropped_placement(qp, pkt);
            }
            return;
        }
        let Ok(pkt) = parsed else {
            self.stats.drop_parse += 1;
            return;
        };
        let qpn = pkt.repr.bth.dest_qpn.value();
        let Some(qp) = self.qps.iter().position(|q| q.qpn() == qpn) else {
            self.stats.drop_qpn += 1;
            return;
        };
        self.stats.handled += 1;
        self.events += 1;
        let Some(info) = pkt.repr.bth.opcode.info() else {
            unreachable!("parse accepted an unknown opcode");
        };
        let request = info.is_request();
        if request {
            if let (Operation::ReadRequest, Some(r)) = (info.operation, pkt.repr.reth) {
                let readable = max_remote_readable();
                self.budget_responses += u64::from(npkts(r.dma_len.min(readable), self.mtu));
            }
            self.budget_responses += 1;
        }
        self.mem.actor = self.actor(qp, &pkt);
        let via = self.mem.actor.via;
        let before = (qp == XRC).then(|| self.xrc_before());
        let dups = self.qps[qp].counters().duplicate_requests;
        let (now, src) = (self.now, d.src);
        let (q, srqs) = (&mut self.qps[qp], &mut self.srqs);
        match placed {
            Some((_, at, _)) => {
                self.stats.placed += 1;
                let mut w = Placed::new(&mut self.mem, at, pkt.payload);
                handle(q, srqs, via, (now, src), &pkt, &mut w);
                assert!(
                    w.skipped(),
                    "QP {qp}: {:?} handled without the write placed before its check ({at:?})",
                    pkt.repr.bth.opcode
                );
            }
            None => handle(q, srqs, via, (now, src), &pkt, &mut self.mem),
        }
        // Only a request taken as new may open a range: a duplicate is never executed
        // again, and a duplicate READ is answered only inside a READ served before
        // (issue 9, item 3), so its own RETH grants nothing. A range is granted under
        // the PD the request was received under; one naming no XRC SRQ of the domain
        // is refused and grants nothing.
        let duplicate = self.qps[qp].counters().duplicate_requests != dups;
        let pd = match via {
            Via::Qp => Some(PD),
            Via::Srq(s) => Some(self.srqs[s].spec.pd),
            Via::NoSrq => None,
        };
        if let (true, false, Some(pd)) = (request, duplicate, pd) {
            let w = &mut self.windows[qp];
            match (info.operation, pkt.repr.reth, pkt.repr.atomic_eth) {
                (Operation::Write, Some(r), _) if info.position.starts() => {
                    w.write.push((r.rkey, r.va, u64::from(r.dma_len), pd));
                }
                (Operation::ReadRequest, Some(r), _) => {
                    w.read.push((r.rkey, r.va, u64::from(r.dma_len), pd));
                }
                (Operation::CompareSwap | Operation::FetchAdd, _, Some(a)) => {
                    w.atomic.push((a.rkey, a.va, pd));
                }
                // An ATOMIC WRITE stores its 8 bytes at the RETH's address (the
                // transport refuses any other DMA length).
                (Operation::AtomicWrite, Some(r), _) => {
                    w.write.push((r.rkey, r.va, 8, pd));
                }
                _ => {}
            }
        }
        let touched = self.check_touches();
        self.check_placement(qp, &pkt, info, &touched);
        if let Some(before) = before {
            self.check_xrc(via, info, &before);
        }
    }

    /// Who handles `pkt` on victim QP `qp`, and how the NIC's `deliver` hands it in:
    /// a QP with its own receive queue takes it as it is; the XRC receive QP through
    /// the XRC SRQ its XRCETH names if that SRQ is of the QP's domain (`runtime.rs`
    /// `xrc_srq_of`: the number, then the domain), else through
    /// `handle_packet_xrc_no_srq` (no XRCETH, no SRQ by that number, or another
    /// domain's).
    fn actor(&self, qp: usize, pkt: &wire::ParsedPacket<'_>) -> Actor {
        let via = if qp == XRC {
            pkt.repr
                .xrceth
                .and_then(|x| self.srqs.iter().position(|s| s.spec.num == x.srqn))
                .filter(|&s| self.srqs[s].spec.domain == XRC_DOMAIN)
                .map_or(Via::NoSrq, Via::Srq)
        } else {
            Via::Qp
        };
        let request = pkt.repr.bth.opcode.info().is_some_and(|i| i.is_request());
        Actor {
            qp,
            request_psn: request.then_some(pkt.repr.bth.psn.value()),
            via,
        }
    }

    fn xrc_before(&self) -> XrcBefore {
        XrcBefore {
            counters: *self.qps[XRC].counters(),
            state: self.qps[XRC].state(),
            srqs: self
                .srqs
                .iter()
                .map(|s| (s.srq.len(), s.srq.counters().consumed))
                .collect(),
        }
    }

    /// The XRC oracles after the XRC receive QP handled a packet handed in `via`: its
    /// completions (drained now, while the actor still names the packet's SRQ), the
    /// SRQs it was not handed, the refusal of a request naming no SRQ of its domain
    /// or switching SRQ mid-message, and the WQE it holds; then the model of the
    /// message in progress moves on.
    fn check_xrc(&mut self, via: Via, info: &OpcodeInfo, before: &XrcBefore) {
        self.stats.xrc[usize::from(via == Via::NoSrq)] += 1;
        self.drain_completions(XRC);
        for (i, s) in self.srqs.iter().enumerate() {
            if via != Via::Srq(i) {
                assert_eq!(
                    (s.srq.len(), s.srq.counters().consumed),
                    before.srqs[i],
                    "XRC SRQ {:#x} lent or took back WQEs for a packet handed in {via:?}",
                    s.spec.num
                );
            }
        }
        let q = &self.qps[XRC];
        let (b, c, state) = (&before.counters, q.counters(), q.state());
        // Taken as a new request: handled, and neither dropped, a duplicate nor out
        // of sequence (`handle_rc_request`: the PSN checks come first).
        let unseen = |c: &QpCounters| {
            (
                c.duplicate_requests,
                c.out_of_sequence,
                c.drop_bad_opcode,
                c.drop_bad_pkey,
                c.drop_bad_state,
            )
        };
        let taken = c.packets_received > b.packets_received && unseen(c) == unseen(b);
        let refused = state == QpState::Err
            && before.state != QpState::Err
            && c.nak_remote_access_sent == b.nak_remote_access_sent + 1;
        let foreign = match via {
            Via::Qp => false,
            Via::NoSrq => true,
            Via::Srq(s) => self.xrc_msg.is_some_and(|m| m != s),
        };
        if taken && foreign {
            assert!(
                refused,
                "XRC QP took a new {:?} {:?} handed in {via:?} (message bound to SRQ {:?}) \
                 without NAK Remote Access Error and Err: now {state:?}, {c:?}",
                info.operation, info.position, self.xrc_msg
            );
            self.expect_rae = true;
        }
        if via == Via::NoSrq {
            // A request naming no SRQ of the domain is never executed, never looks
            // for a receive WQE, and changes the state only by that refusal.
            let naks = |c: &QpCounters| {
                (
                    c.nak_rnr_sent,
                    c.nak_invalid_request_sent,
                    c.nak_remote_op_sent,
                    c.bytes_received,
                )
            };
            assert_eq!(
                naks(c),
                naks(b),
                "XRC QP: a packet naming no SRQ was executed"
            );
            assert!(
                state == before.state || refused,
                "XRC QP: a packet naming no SRQ moved it from {:?} to {state:?}",
                before.state
            );
        }
        let executed = taken && !refused && c.nak_rnr_sent == b.nak_rnr_sent;
        if state == QpState::Err {
            self.xrc_msg = None;
        } else if let (true, Via::Srq(s)) = (executed, via) {
            self.xrc_msg = match (info.operation, info.position) {
                (Operation::Send | Operation::Write, Position::First) => Some(s),
                (Operation::Send | Operation::Write, Position::Middle) => self.xrc_msg,
                _ => None,
            };
        }
        self.check_held();
    }

    /// The XRC receive QP holds at most one SRQ WQE, that of its message in progress,
    /// from the SRQ that message is bound to (a SEND takes its WQE at the First; a
    /// WRITE with immediate at the Last, and completes it there).
    fn check_held(&self) {
        let held: Vec<(usize, usize)> = (0..self.srqs.len())
            .map(|s| (s, self.srqs[s].held()))
            .filter(|&(_, n)| n > 0)
            .collect();
        match held[..] {
            [] => {}
            [(s, 1)] => assert_eq!(
                self.xrc_msg,
                Some(s),
                "XRC QP holds a WQE of SRQ {s} outside a message bound to it"
            ),
            _ => panic!("XRC QP holds WQEs of SRQs {held:?} (index, count)"),
        }
    }

    /// Writes `pkt`'s payload where its QP says it may before the ICRC check
    /// (`Qp::placement`), as the NIC's `rx_place::place` does, logged under the actor
    /// that handles the packet; the QP, the placement and the payload's CRC.
    fn place(&mut self, pkt: &wire::ParsedPacket<'_>) -> Option<(usize, Placement, u32)> {
        let qpn = pkt.repr.bth.dest_qpn.value();
        let qp = self.qps.iter().position(|q| q.qpn() == qpn)?;
        let at = self.qps[qp].placement(pkt)?;
        self.mem.actor = self.actor(qp, pkt);
        // Refused: nothing written, and the packet takes the usual order (the
        // handling meets the same refusal after the check).
        let crc = at.write(&mut self.mem, pkt.payload).ok()?;
        Some((qp, at, crc))
    }

    /// The ICRC check of `rx_one`: in full, or with a placed payload's CRC combined in
    /// (`IdSolver::verify_with`).
    fn icrc_ok(
        &self,
        d: &Datagram,
        pkt: Option<&wire::ParsedPacket<'_>>,
        placed: Option<&(usize, Placement, u32)>,
    ) -> bool {
        let params = icrc_params(d.src, LOCAL);
        let (Some(pkt), Some(&(_, _, crc))) = (pkt, placed) else {
            return params.verify(&d.bytes).is_ok();
        };
        let payload = pkt.header_len..pkt.header_len + pkt.payload.len();
        let got = params
            .prepare()
            .compute_with_payload(&d.bytes, payload, crc);
        got.ok() == Some(pkt.icrc)
    }

    /// A packet placed before its check whose ICRC failed: it is dropped, and the one
    /// write it made lies where the message in progress writes those bytes — inside a
    /// live receive WQE's or READ's scatter list, or an RDMA WRITE's RETH range right
    /// after the bytes placed so far (the write cursor does not move: the packet was
    /// not taken). It counts as no execution of its PSN.
    fn check_dropped_placement(&mut self, qp: usize, pkt: &wire::ParsedPacket<'_>) {
        self.stats.placed_dropped += 1;
        self.mem.relabel(Actor {
            qp,
            ..Actor::default()
        });
        let touched = self.check_touches();
        assert!(
            touched.len() == 1 && touched[0].data == pkt.payload,
            "QP {qp}: a placed packet that failed its ICRC made {touched:?}"
        );
        let t = &touched[0];
        if t.kind == Kind::WriteRemote {
            assert_eq!(
                Some((t.key, t.va)),
                self.write_cursor[qp],
                "QP {qp}: a WRITE placed before its failed check, at the wrong place"
            );
        }
    }

    /// What one packet wrote must be its own bytes, in order: the payload of a SEND,
    /// WRITE or READ response (or a prefix of it, when a later piece failed), the
    /// GRH stand-in and payload of a UD SEND, the original value of an atomic ACK.
    /// An RDMA WRITE lands at its RETH address (First/Only) or right after the
    /// previous WRITE packet's bytes (Middle/Last).
    fn check_placement(
        &mut self,
        qp: usize,
        pkt: &wire::ParsedPacket<'_>,
        info: &wire::OpcodeInfo,
        touched: &[Touch],
    ) {
        let written: Vec<u8> = touched
            .iter()
            .filter(|t| matches!(t.kind, Kind::WriteLocal | Kind::WriteRemote))
            .flat_map(|t| t.data.iter().copied())
            .collect();
        if written.is_empty() {
            return;
        }
        let orig;
        let expect: &[u8] = match info.operation {
            Operation::AtomicAcknowledge => {
                orig = pkt.repr.atomic_ack_eth.map_or(0, |a| a.orig).to_ne_bytes();
                &orig
            }
            _ if info.transport == Transport::Ud => {
                // 40 bytes of GRH stand-in (an IPv4 header in bytes 20..40), then the
                // payload; a prefix when the receive buffer's scatter failed midway.
                let grh = written.len().min(40);
                assert!(
                    grh < 40 || written[20..40].iter().any(|&b| b != 0),
                    "QP {qp}: UD receive without its GRH"
                );
                assert!(
                    pkt.payload.starts_with(&written[grh..]),
                    "QP {qp}: UD payload placed wrong"
                );
                return;
            }
            _ => pkt.payload,
        };
        assert!(
            expect.starts_with(&written),
            "QP {qp}: {:?} wrote {} bytes that are not its own (expected a prefix of {} bytes)",
            pkt.repr.bth.opcode,
            written.len(),
            expect.len()
        );
        for t in touched.iter().filter(|t| t.kind == Kind::WriteRemote) {
            let want = if info.position.starts() {
                pkt.repr.reth.map(|r| (r.rkey, r.va))
            } else {
                self.write_cursor[qp]
            };
            assert_eq!(
                Some((t.key, t.va)),
                want,
                "QP {qp}: {:?} wrote at the wrong place",
                pkt.repr.bth.opcode
            );
            self.write_cursor[qp] = Some((t.key, t.va.wrapping_add(t.len)));
        }
    }

    /// Drains every QP's output and completions. Returns (responses, requests) sent.
    fn drain_all(&mut self) -> (u64, u64) {
        let mut sent = (0, 0);
        for qp in 0..self.qps.len() {
            let s = self.drain_tx(qp);
            sent = (sent.0 + s.0, sent.1 + s.1);
            self.drain_completions(qp);
        }
        sent
    }

    /// `poll_transmit` until `None`; checks each packet as the wire would see it.
    fn drain_tx(&mut self, qp: usize) -> (u64, u64) {
        let (mut responses, mut requests) = (0, 0);
        let view = self.peer.qps[qp];
        for _ in 0..TX_GUARD {
            self.mem.actor = Actor {
                qp,
                ..Actor::default()
            };
            let Some(t) = self.qps[qp].poll_transmit(self.now, &mut self.tx_buf, &self.mem) else {
                self.check_touches();
                assert!(
                    !(qp == XRC && self.expect_rae),
                    "XRC QP refused a request for its XRCETH without sending NAK Remote Access Error"
                );
                return (responses, requests);
            };
            let touched = self.check_touches();
            self.stats.sent += 1;
            assert!(
                t.len <= self.tx_buf.len(),
                "QP {qp}: packet of {} bytes",
                t.len
            );
            assert_eq!(t.dest, PEER, "QP {qp}: packet to {}", t.dest);
            let pkt = &mut self.tx_buf[..t.len];
            let params = icrc_params(LOCAL, t.dest);
            params.fill(pkt).expect("ICRC fill of an emitted packet");
            params
                .verify(pkt)
                .expect("ICRC of an emitted packet verifies");
            let p = PacketRepr::parse(pkt).expect("an emitted packet parses");
            let info = p.repr.info().expect("known opcode");
            assert_eq!(
                info.transport,
                view.qp_type.transport(),
                "QP {qp} sent {:?}",
                p.repr.bth.opcode
            );
            assert_eq!(p.repr.bth.dest_qpn.value(), view.peer_qpn, "dest QPN");
            if qp == XRC {
                // The target half only responds (IBTA 9.2: XRC responses carry no
                // XRCETH).
                assert!(
                    !info.is_request() && p.repr.xrceth.is_none(),
                    "XRC receive QP sent {:?} {:?}",
                    p.repr.bth.opcode,
                    p.repr.xrceth
                );
                let rae = Syndrome::Nak(NakCode::RemoteAccessError);
                if p.repr.aeth.is_some_and(|a| a.syndrome == rae) {
                    self.expect_rae = false;
                }
            }
            assert!(
                p.payload.len() <= self.mtu as usize,
                "payload {} above the MTU {}",
                p.payload.len(),
                self.mtu
            );
            if info.operation == Operation::ReadResponse && !p.payload.is_empty() {
                // The payload is the bytes the responder read for it, unchanged.
                let read = touched
                    .iter()
                    .find(|t| t.kind == Kind::ReadRemote && t.len == p.payload.len() as u64);
                let Some(t) = read else {
                    panic!("QP {qp}: READ response payload without a matching read: {touched:?}");
                };
                assert_eq!(
                    self.mem.peek_remote(t.key, t.va, p.payload.len()),
                    Some(p.payload),
                    "QP {qp}: READ response payload differs from memory"
                );
            }
            if info.is_request() {
                requests += 1;
                let span = self.psn_span[qp];
                // Forward distance: a 2^31-byte READ spans 2^23 PSNs at MTU 256.
                let d = p.repr.bth.psn.value().wrapping_sub(self.psns.1) & wire::types::MASK_24;
                assert!(
                    u64::from(d) < span,
                    "QP {qp}: request PSN {:#x} outside the {span} PSNs from {:#x} its posted WQEs occupy",
                    p.repr.bth.psn.value(),
                    self.psns.1
                );
                if info.transport == Transport::Rc {
                    let n = match (info.operation, p.repr.reth) {
                        (Operation::ReadRequest, Some(r)) => npkts(r.dma_len, self.mtu),
                        _ => 1,
                    };
                    self.peer.saw_request(Outstanding {
                        psn: p.repr.bth.psn.value(),
                        op: info.operation,
                        npkts: n,
                    });
                }
            } else {
                responses += 1;
            }
        }
        panic!("QP {qp}: poll_transmit did not go quiet after {TX_GUARD} packets");
    }

    fn drain_completions(&mut self, qp: usize) {
        for _ in 0..TX_GUARD {
            let Some(c) = self.qps[qp].poll_completion() else {
                return;
            };
            self.stats.completions += 1;
            if c.status == WcStatus::Success {
                self.stats.success[usize::from(c.queue == Queue::Send)] += 1;
            }
            self.check_completion(qp, &c);
        }
        panic!("QP {qp}: completions never stop");
    }

    fn check_completion(&mut self, qp: usize, c: &Completion) {
        if qp == XRC {
            return self.check_xrc_completion(c);
        }
        let key = (qp, c.queue, c.wr_id);
        assert!(
            self.posted.contains(&key),
            "QP {qp}: completion for a WQE never posted: {c:?}"
        );
        assert!(
            self.completed.insert(key),
            "QP {qp}: second completion for one WQE: {c:?}"
        );
        // IBTA 10.8.5 (C10-109): a work queue's completions come in posting order, and
        // wr_ids are handed out in increasing order.
        let last = &mut self.last_completed[qp][usize::from(c.queue == Queue::Send)];
        assert!(
            c.wr_id > *last,
            "QP {qp}: completion for wr_id {} after wr_id {}: {c:?}",
            c.wr_id,
            *last
        );
        *last = c.wr_id;
        match c.queue {
            Queue::Recv => {
                let wr = self.recv_live[qp]
                    .remove(&c.wr_id)
                    .expect("a posted receive WQE is live");
                check_recv_completion(qp, c, &wr);
            }
            Queue::Send => {
                let wr = self.send_live[qp]
                    .remove(&c.wr_id)
                    .expect("a posted send WQE is live");
                if c.status == WcStatus::Success {
                    let want = match wr.op {
                        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => {
                            WcOpcode::Send
                        }
                        SendOp::Write | SendOp::WriteWithImm(_) => WcOpcode::RdmaWrite,
                        SendOp::Read => WcOpcode::RdmaRead,
                        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
                        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
                        SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
                    };
                    assert_eq!(c.opcode, want, "QP {qp}: {c:?} for {wr:?}");
                }
            }
        }
    }

    /// A completion of the XRC receive QP: a receive (it has no send queue) on an SRQ
    /// of its domain (`Completion::srqn`, which picks the CQ in the NIC), for a WQE
    /// posted on that very SRQ and still live, in posting order per SRQ; a successful
    /// one only while the QP handles a packet naming that SRQ (the message's last
    /// packet names the SRQ its first did, or is refused).
    fn check_xrc_completion(&mut self, c: &Completion) {
        assert_eq!(c.queue, Queue::Recv, "XRC receive QP: {c:?}");
        let Some(s) = self
            .srqs
            .iter()
            .position(|s| s.spec.handle == c.srqn && s.spec.domain == XRC_DOMAIN)
        else {
            panic!("XRC QP: completion for no SRQ of its domain: {c:?}");
        };
        if c.status == WcStatus::Success {
            assert_eq!(
                self.mem.actor.via,
                Via::Srq(s),
                "XRC QP: successful completion on SRQ {s} while handling {:?}: {c:?}",
                self.mem.actor
            );
        }
        let srq = &mut self.srqs[s];
        assert!(
            srq.posted.contains(&c.wr_id),
            "XRC QP: completion on SRQ {s} for a WQE not posted there: {c:?}"
        );
        assert!(
            self.completed.insert((XRC, c.queue, c.wr_id)),
            "XRC QP: second completion for one WQE: {c:?}"
        );
        assert!(
            c.wr_id > srq.last_completed,
            "XRC QP: completion on SRQ {s} for wr_id {} after wr_id {}: {c:?}",
            c.wr_id,
            srq.last_completed
        );
        srq.last_completed = c.wr_id;
        let wr = srq.live.remove(&c.wr_id).expect("a posted SRQ WQE is live");
        check_recv_completion(XRC, c, &wr);
    }

    /// Judges every access the transport was granted since the last call.
    fn check_touches(&mut self) -> Vec<Touch> {
        let log = self.mem.take_log();
        let mut modified: Vec<(usize, u32)> = Vec::new();
        for t in &log {
            self.stats.touches[t.kind as usize] += 1;
            let qp = t.actor.qp;
            // The PD an access is made under: the QP's own, or for the XRC receive QP
            // the PD of the SRQ the packet names (its message is bound to that SRQ,
            // or the packet is refused); one naming no SRQ of the domain touches
            // nothing.
            match t.actor.via {
                Via::NoSrq => panic!("XRC QP: a packet naming no SRQ of its domain made {t:?}"),
                Via::Srq(s) => assert_eq!(
                    t.pd, self.srqs[s].spec.pd,
                    "XRC QP: access under another PD than that of SRQ {s} the packet names: {t:?}"
                ),
                Via::Qp if qp != XRC => {
                    assert_eq!(t.pd, PD, "QP {qp}: access under another PD: {t:?}")
                }
                Via::Qp => {}
            }
            let ok = match t.kind {
                Kind::ReadLocal => self.send_live[qp]
                    .values()
                    .any(|w| sges_cover(&w.sges[..w.num_sge], PD, t)),
                Kind::WriteLocal if qp == XRC => match t.actor.via {
                    // Only into a WQE of the SRQ the packet names.
                    Via::Srq(s) => self.srqs[s]
                        .live
                        .values()
                        .any(|w| sges_cover(&w.sges[..w.num_sge], self.srqs[s].spec.pd, t)),
                    _ => false,
                },
                Kind::WriteLocal => {
                    self.recv_live[qp]
                        .values()
                        .any(|w| sges_cover(&w.sges[..w.num_sge], PD, t))
                        || self.send_live[qp].values().any(|w| {
                            matches!(
                                w.op,
                                SendOp::Read | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
                            ) && sges_cover(&w.sges[..w.num_sge], PD, t)
                        })
                }
                Kind::ReadRemote => self.windows[qp].read.iter().any(|w| covers(*w, t)),
                Kind::WriteRemote => self.windows[qp].write.iter().any(|w| covers(*w, t)),
                Kind::Atomic => self.windows[qp].atomic.contains(&(t.key, t.va, t.pd)),
            };
            assert!(
                ok,
                "QP {qp}: access outside what was asked for: {t:?} (windows {:?})",
                self.windows[qp]
            );
            let modifies = matches!(t.kind, Kind::WriteLocal | Kind::WriteRemote | Kind::Atomic);
            if let (true, Some(psn)) = (modifies, t.actor.request_psn) {
                let rc = matches!(self.qps[qp].qp_type(), QpType::Rc | QpType::XrcRecv);
                if rc && !modified.contains(&(qp, psn)) {
                    modified.push((qp, psn));
                }
            }
        }
        for key in modified {
            assert!(
                self.executed.insert(key),
                "QP {}: request PSN {:#x} modified memory a second time (duplicate executed)",
                key.0,
                key.1
            );
        }
        // The buffer changes only through the Memory calls just logged (the harness
        // owns it): without a write there is nothing new to scan.
        let wrote = log
            .iter()
            .any(|t| matches!(t.kind, Kind::WriteLocal | Kind::WriteRemote | Kind::Atomic));
        if !wrote {
            return log;
        }
        if let Some((off, b)) = self.mem.damaged_canary() {
            panic!("canary at backing offset {off} overwritten with {b:#04x}");
        }
        for (r, m) in MRS.iter().enumerate() {
            let writable = m.access.contains(Access::LOCAL_WRITE)
                || m.access.contains(Access::REMOTE_WRITE)
                || m.access.contains(Access::REMOTE_ATOMIC);
            // PDs a QP or an XRC SRQ of the victim's domain works in.
            let used = m.pd == PD
                || self
                    .srqs
                    .iter()
                    .any(|s| s.spec.domain == XRC_DOMAIN && s.spec.pd == m.pd);
            if (!used || !writable) && !self.mem.pristine(r) {
                panic!("region {} changed (pd {}, {:?})", m.name, m.pd, m.access);
            }
        }
        log
    }

    /// Bounded work for one step: responses within what the delivered requests asked
    /// for; requests within the posted work times the events that may rewind it.
    fn check_step(&self, (responses, requests): (u64, u64), live_before: u64) {
        assert!(
            responses <= self.budget_responses,
            "{responses} responses for requests worth {}",
            self.budget_responses
        );
        let live = live_before + self.posted_packets;
        let bound = (live + 1) * (self.events + 1);
        assert!(
            requests <= bound,
            "{requests} request packets from {live} posted packets and {} events",
            self.events
        );
    }

    fn live_send_packets(&self) -> u64 {
        self.send_live
            .iter()
            .flat_map(|m| m.values())
            .map(wr_packets)
            .sum()
    }

    fn fresh_wr_id(&mut self) -> u64 {
        self.next_wr_id += 1;
        self.next_wr_id
    }

    fn post_recv(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<()> {
        let r = mr_index("recv");
        let slot = self.next_slot(r, None);
        let wr = self.recv_wqe(u, r, slot)?;
        if self.qps[qp].post_recv(wr).is_ok() {
            self.posted.insert((qp, Queue::Recv, wr.wr_id));
            self.recv_live[qp].insert(wr.wr_id, wr);
        }
        Ok(())
    }

    /// A receive posted on XRC SRQ `s`, into its region.
    fn post_srq_recv(&mut self, u: &mut Unstructured<'_>, s: usize) -> Result<()> {
        let r = mr_index(self.srqs[s].spec.region);
        let slot = self.next_slot(r, Some(s));
        let wr = self.recv_wqe(u, r, slot)?;
        self.srq_post(s, wr);
        Ok(())
    }

    fn srq_post(&mut self, s: usize, wr: RecvWr) {
        let x = &mut self.srqs[s];
        if x.srq.post_recv(wr).is_ok() {
            x.posted.insert(wr.wr_id);
            x.live.insert(wr.wr_id, wr);
        }
    }

    /// The next 1 KiB slot of region `r` (cycling), for a receive of the RC, UC and UD
    /// QPs (`srq` = `None`) or of XRC SRQ `srq`: each receive gets its own slot.
    fn next_slot(&mut self, r: usize, srq: Option<usize>) -> u64 {
        let n = match srq {
            Some(s) => &mut self.srqs[s].next_slot,
            None => &mut self.next_recv_slot,
        };
        let slots = (MRS[r].len as u64 / 1024).max(1);
        let slot = MRS[r].iova + (*n % slots) * 1024;
        *n += 1;
        slot
    }

    /// A receive WQE in `slot` of region `r`, of the shape the input picks: the whole
    /// slot (up to the path MTU), two pieces, a good piece then one without
    /// LOCAL_WRITE or with a bad key, 40 bytes, 2 bytes across the slot's end, or none.
    fn recv_wqe(&mut self, u: &mut Unstructured<'_>, r: usize, slot: u64) -> Result<RecvWr> {
        let recv = MRS[r];
        let mut sges = [Sge::default(); MAX_SGE];
        let num_sge = match u.int_in_range(0u8..=7)? {
            7 => 0,
            6 => {
                // Two pieces.
                sges[0] = sge(recv.lkey, slot, 40);
                sges[1] = sge(recv.lkey, slot + 40, 984);
                2
            }
            5 => {
                // A piece without LOCAL_WRITE, or with a bad key, after a good one.
                sges[0] = sge(recv.lkey, slot, 64);
                let none = MRS[mr_index("none")];
                sges[1] = if u.ratio(1, 2)? {
                    sge(none.lkey, none.iova, 256)
                } else {
                    sge(0xDEAD_BEEF, slot + 64, 512)
                };
                2
            }
            4 => {
                sges[0] = sge(recv.lkey, slot, 40);
                1
            }
            3 => {
                sges[0] = sge(recv.lkey, slot + 1024 - 1, 2);
                1
            }
            _ => {
                sges[0] = whole_slot(r, slot, self.mtu);
                1
            }
        };
        Ok(RecvWr {
            wr_id: self.fresh_wr_id(),
            sges,
            num_sge,
        })
    }

    fn post_send(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<()> {
        let t = self.qps[qp].qp_type();
        let ops: &[u8] = match t {
            QpType::Rc | QpType::XrcSend => &[0, 1, 2, 3, 4, 5, 6],
            QpType::Uc => &[0, 1, 2, 3],
            QpType::Ud => &[0, 1],
            // No send queue (the target half of XRC only responds); never chosen.
            QpType::XrcRecv => return Ok(()),
        };
        let src = MRS[mr_index("rw")];
        let sink = MRS[mr_index("sink")];
        let mtu = self.mtu;
        let len: u32 = match u.int_in_range(0u8..=6)? {
            0 => 0,
            1 => 1,
            2 => mtu,
            3 => mtu + 1,
            4 => (3 * mtu).min(4096),
            // The largest message (IBTA 9.4.1: 2^31 bytes): 2^23 PSNs at MTU 256.
            5 => 1 << 31,
            _ => u.int_in_range(0..=4096)?,
        };
        let len = if t == QpType::Ud { len.min(mtu) } else { len };
        let mut wr = SendWr {
            wr_id: self.fresh_wr_id(),
            op: SendOp::Send,
            sges: [Sge::default(); MAX_SGE],
            num_sge: 1,
            inline: None,
            remote_addr: u.arbitrary()?,
            rkey: u.arbitrary()?,
            signaled: u.ratio(3, 4)?,
            solicited: u.arbitrary()?,
            ud: (t == QpType::Ud).then_some(UdDest {
                qpn: PEER_QPNS[qp],
                qkey: self.peer.qps[qp].qkey,
                addr: PEER,
                traffic_class: 0,
            }),
            xrc_srqn: 0,
        };
        let sink_at = sink.iova + u64::from(u.int_in_range(0u32..=(4096 - 8) / 8)? * 8);
        wr.sges[0] = sge(src.lkey, src.iova, len);
        match *u.choose(ops)? {
            0 => {}
            1 => wr.op = SendOp::SendWithImm(u.arbitrary()?),
            2 => wr.op = SendOp::Write,
            3 => wr.op = SendOp::WriteWithImm(u.arbitrary()?),
            4 => {
                wr.op = SendOp::Read;
                wr.sges[0] = sge(sink.lkey, sink.iova, len);
            }
            5 => {
                wr.op = SendOp::CompareSwap {
                    compare: u.arbitrary()?,
                    swap: u.arbitrary()?,
                };
                wr.sges[0] = sge(sink.lkey, sink_at, 8);
            }
            _ => {
                wr.op = SendOp::FetchAdd {
                    add: u.arbitrary()?,
                };
                wr.sges[0] = sge(sink.lkey, sink_at, 8);
            }
        }
        match u.int_in_range(0u8..=7)? {
            6 if len <= 64 && matches!(wr.op, SendOp::Send | SendOp::Write) => {
                wr.inline = softnic_transport::wr::Inline::new(&[0x5A; 64][..len as usize]);
            }
            // The same choice makes a FETCH_ADD an ATOMIC WRITE of its 8 bytes, which
            // gathers nothing (RC only: the other QPs refuse the post).
            6 => {
                if let SendOp::FetchAdd { add } = wr.op {
                    wr.op = SendOp::AtomicWrite {
                        value: add.to_ne_bytes(),
                    };
                    wr.num_sge = 0;
                }
            }
            7 => wr.sges[0].lkey ^= 0x100, // a key that names nothing
            _ => {}
        }
        if self.qps[qp].post_send(wr.clone()).is_ok() {
            self.posted_packets += wr_packets(&wr);
            self.psn_span[qp] += match wr.op {
                SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. } => 1,
                _ => u64::from(npkts(wr.total_len() as u32, self.mtu)),
            };
            self.posted.insert((qp, Queue::Send, wr.wr_id));
            self.send_live[qp].insert(wr.wr_id, wr);
        }
        Ok(())
    }

    /// The user moves `qp` to Err: every posted WQE must complete, flushed.
    fn move_to_error(&mut self, qp: usize) {
        let attr = QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        };
        self.qps[qp]
            .modify(self.now, &attr)
            .expect("any state may move to Err");
    }

    /// The user asks for a state change with no other attributes (RTS→SQD, SQD→RTS,
    /// SQE→RTS); a refusal leaves the QP as it was.
    fn set_state(&mut self, qp: usize, to: QpState) {
        let attr = QpAttr {
            state: Some(to),
            ..QpAttr::default()
        };
        let before = self.qps[qp].state();
        if self.qps[qp].modify(self.now, &attr).is_err() {
            assert_eq!(
                self.qps[qp].state(),
                before,
                "a refused modify changed the state"
            );
        }
    }

    /// The user recovers `qp` the way an application does after an error: Reset, then
    /// Init, RTR, RTS with the same settings. WQEs still queued are discarded without
    /// completions (IBTA 10.3.1: Reset), and the connection starts afresh.
    fn reconnect(&mut self, qp: usize) {
        let reset = QpAttr {
            state: Some(QpState::Reset),
            ..QpAttr::default()
        };
        self.qps[qp]
            .modify(self.now, &reset)
            .expect("any state may move to Reset");
        self.drain_completions(qp);
        for id in self.send_live[qp].drain().map(|(id, _)| id) {
            self.posted.remove(&(qp, Queue::Send, id));
        }
        for id in self.recv_live[qp].drain().map(|(id, _)| id) {
            self.posted.remove(&(qp, Queue::Recv, id));
        }
        if qp == XRC {
            // The WQE the QP held (its message's, taken from an SRQ) is discarded
            // with it: it never completes.
            for s in &mut self.srqs {
                let held: Vec<u64> = s.live.keys().take(s.held()).copied().collect();
                for id in held {
                    s.live.remove(&id);
                    s.posted.remove(&id);
                }
            }
            self.xrc_msg = None;
            self.expect_rae = false;
        }
        self.windows[qp] = Windows::default();
        self.executed.retain(|&(q, _)| q != qp);
        self.psn_span[qp] = 0;
        self.write_cursor[qp] = None;
        let (rq_psn, sq_psn) = self.psns;
        connect_qp(
            &mut self.qps[qp],
            &self.cfg,
            PEER_QPNS[qp],
            PEER,
            rq_psn,
            sq_psn,
        );
        self.peer.qps[qp].next_psn = rq_psn;
        if self.qps[qp].qp_type() == QpType::Rc {
            self.peer.recent.clear();
        }
    }

    /// Moves virtual time (to the next timer, or by an input-chosen amount) and fires
    /// the timers that are due.
    fn advance(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let next = self.qps.iter().filter_map(Qp::poll_timeout).min();
        self.now = match (u.int_in_range(0u8..=3)?, next) {
            (0 | 1, Some(t)) => t.max(self.now),
            (2, _) => self.now + Duration::from_nanos(u.int_in_range(0..=1 << 32)?),
            _ => self.now + Duration::from_nanos(1),
        };
        self.fire_timers();
        Ok(())
    }

    fn fire_timers(&mut self) {
        for qp in 0..self.qps.len() {
            if self.qps[qp].poll_timeout().is_some_and(|t| t <= self.now) {
                self.events += 1;
                self.mem.actor = Actor {
                    qp,
                    ..Actor::default()
                };
                self.qps[qp].handle_timeout(self.now);
                self.check_touches();
            }
        }
    }

    /// Counters of every QP (for the summary a debug run prints).
    pub fn qp_counters(&self) -> Vec<QpCounters> {
        self.qps.iter().map(|q| *q.counters()).collect()
    }

    /// Counters of every XRC SRQ (for the summary a debug run prints).
    pub fn srq_counters(&self) -> Vec<SrqCounters> {
        self.srqs.iter().map(|s| *s.srq.counters()).collect()
    }

    /// The peer falls silent: timers must stop within [`MAX_FIRINGS`] firings, with
    /// every oracle holding throughout.
    pub fn finish(&mut self) {
        for _ in 0..MAX_FIRINGS {
            let Some(t) = self.qps.iter().filter_map(Qp::poll_timeout).min() else {
                return;
            };
            self.budget_responses = 0;
            self.events = 0;
            self.posted_packets = 0;
            let live_before = self.live_send_packets();
            self.now = t.max(self.now);
            self.fire_timers();
            let sent = self.drain_all();
            self.check_step(sent, live_before);
        }
        let armed: Vec<_> = self
            .qps
            .iter()
            .map(|q| (q.qpn(), q.state(), q.poll_timeout()))
            .collect();
        panic!("timers still armed after {MAX_FIRINGS} firings with a silent peer: {armed:?}");
    }
}

/// Request packets a send WQE needs at the smallest path MTU (an upper bound).
fn wr_packets(w: &SendWr) -> u64 {
    u64::from(npkts(w.total_len().min(u64::from(u32::MAX)) as u32, 256))
}

fn sge(lkey: u32, addr: u64, length: u32) -> Sge {
    Sge { addr, length, lkey }
}

/// The receive slot at `slot` of region `r`, up to one path MTU: 1 KiB, or what is
/// left of the region.
fn whole_slot(r: usize, slot: u64, mtu: u32) -> Sge {
    let m = MRS[r];
    let room = (m.iova + m.len as u64).saturating_sub(slot).min(1024) as u32;
    sge(m.lkey, slot, room.min(mtu))
}

fn add(a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    (a.0 + b.0, a.1 + b.1)
}

/// Hands `pkt` to `qp` as `via` says: `Qp::handle_packet`, or for the XRC receive QP
/// `handle_packet_xrc` with XRC SRQ `srqs[s]`, or `handle_packet_xrc_no_srq`.
fn handle(
    qp: &mut Qp,
    srqs: &mut [XrcSrq],
    via: Via,
    (now, src): (Instant, SocketAddr),
    pkt: &wire::ParsedPacket<'_>,
    mem: &mut dyn Memory,
) {
    let ip = ReceivedIp::default();
    match via {
        Via::Qp => qp.handle_packet(now, src, pkt, mem),
        Via::Srq(s) => qp.handle_packet_xrc(now, src, &ip, pkt, mem, &mut srqs[s].srq),
        Via::NoSrq => qp.handle_packet_xrc_no_srq(now, src, &ip, pkt, mem),
    }
}

/// What a successful receive completion must say: no more bytes than the WQE had room
/// for (a WRITE with immediate's length is the WRITE's), a receive opcode.
fn check_recv_completion(qp: usize, c: &Completion, wr: &RecvWr) {
    if c.status != WcStatus::Success {
        return;
    }
    let room: u64 = wr.sges[..wr.num_sge]
        .iter()
        .map(|s| u64::from(s.length))
        .sum();
    assert!(
        u64::from(c.byte_len) <= room || c.opcode == WcOpcode::RecvRdmaWithImm,
        "QP {qp}: received {} bytes into {room}: {c:?}",
        c.byte_len
    );
    assert!(
        matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
        "receive completion with {c:?}"
    );
}

/// Largest region a READ can be served from.
fn max_remote_readable() -> u32 {
    MRS.iter()
        .filter(|m| m.access.contains(Access::REMOTE_READ))
        .map(|m| m.len as u32)
        .max()
        .unwrap_or(0)
}

/// True when `[t.va, t.va + t.len)` lies inside the window `(key, va, len)` with the
/// same key, and `t` was made under the window's protection domain `pd`.
fn covers((key, va, len, pd): (u32, u64, u64, u32), t: &Touch) -> bool {
    let (s, e) = (u128::from(t.va), u128::from(t.va) + u128::from(t.len));
    key == t.key && pd == t.pd && s >= u128::from(va) && e <= u128::from(va) + u128::from(len)
}

/// True when one of `sges`, posted under PD `pd`, covers `t`.
fn sges_cover(sges: &[Sge], pd: u32, t: &Touch) -> bool {
    sges.iter()
        .any(|s| covers((s.lkey, s.addr, u64::from(s.length), pd), t))
}
