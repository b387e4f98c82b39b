//! The victim: one NIC's worth of QPs (RC, UC, UD) in RTS, connected to the peer, with
//! canaried memory, driven through the NIC's receive path, and checked after every
//! call into the transport.
//!
//! The receive path mirrors `softnic/src/nic/runtime.rs` (`rx_one`): length, `wire`
//! parse, the single pass where `Qp::placement` allows it (the payload written before
//! the check, `nic/rx_place.rs`), ICRC (`rx_icrc::verify`'s first path: IPv4 ID 0
//! with DF; with a placed payload's CRC combined in), demultiplex by destination QPN,
//! `Qp::handle_packet` (through `Placed` for a placed packet); then, like the runtime's loop, drain
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
//!   makes that same write (`Placed::skipped`);
//! * completions: only for WQEs posted on that QP and queue, each at most once, in
//!   posting order, with plausible lengths and opcodes;
//! * output: every packet parses, its ICRC fills and verifies, it goes to the peer's
//!   address and QPN with the QP's transport, no payload exceeds the path MTU, a READ
//!   response carries the bytes it was read from, and request PSNs stay within the
//!   PSNs the posted WQEs occupy;
//! * bounded work: per input step, responses ≤ what the delivered requests ask for,
//!   requests ≤ the posted work times the retry events; `poll_transmit` goes quiet and
//!   timers stop within fixed bounds once the peer falls silent.

use std::collections::{HashMap, HashSet};

use softnic_transport::memory::Access;
use softnic_transport::qp::{Placed, Placement, Qp, QpAttr, QpCaps, QpState, QpType, PATH_MTUS};
use softnic_transport::testing::{connect_qp, PairConfig};
use softnic_transport::time::{Duration, Instant};
use softnic_transport::wr::{
    Completion, Queue, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, MAX_SGE,
};
use wire::{Operation, PacketRepr, Transport};

use super::memory::{mr_index, Actor, CanaryMem, Kind, Touch, MRS};
use super::peer::{icrc_params, npkts, Datagram, Outstanding, Peer, QpView, LOCAL, PEER};
use arbitrary::{Result, Unstructured};

/// The victim's QPNs: RC, UC, UD.
pub const QPNS: [u32; 3] = [0x00_0123, 0x00_0456, 0x00_0789];

/// The peer's QPNs, in the same order.
pub const PEER_QPNS: [u32; 3] = [0x0A_0001, 0x0A_0002, 0x0A_0003];

/// Protection domain of every victim QP.
const PD: u32 = 1;

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

/// Ranges a QP was asked to touch.
#[derive(Debug, Default)]
struct Windows {
    /// WRITE First/Only RETHs delivered: (rkey, va, dma_len).
    write: Vec<(u32, u64, u64)>,
    /// READ request RETHs delivered.
    read: Vec<(u32, u64, u64)>,
    /// Atomic targets delivered: (rkey, va).
    atomic: Vec<(u32, u64)>,
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
        for (i, t) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
            let mut qp = Qp::new(QPNS[i], t, PD, CAPS);
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
            });
        }
        let mut v = Victim {
            qps,
            mem: CanaryMem::new(),
            now: Instant::from_nanos(1_000_000),
            peer: Peer {
                qps: views,
                recent: Vec::new(),
            },
            send_live: (0..3).map(|_| HashMap::new()).collect(),
            recv_live: (0..3).map(|_| HashMap::new()).collect(),
            posted: HashSet::new(),
            completed: HashSet::new(),
            windows: (0..3).map(|_| Windows::default()).collect(),
            executed: HashSet::new(),
            last_completed: vec![[0; 2]; 3],
            write_cursor: vec![None; 3],
            psn_span: vec![0; 3],
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
        };
        for qp in 0..3 {
            for _ in 0..u.int_in_range(0..=4)? {
                v.post_recv(u, qp)?;
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
        let mut sent = (0u64, 0u64);
        match u.int_in_range(0u8..=15)? {
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
                for d in self.peer.message(u, qp)? {
                    self.deliver(&d);
                    let s = self.drain_all();
                    sent = (sent.0 + s.0, sent.1 + s.1);
                }
            }
            9 => {
                let d = self.peer.response(u, 0)?;
                self.deliver(&d);
            }
            10 => {
                for d in self.peer.answer(u, 0)? {
                    self.deliver(&d);
                    let s = self.drain_all();
                    sent = (sent.0 + s.0, sent.1 + s.1);
                }
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
        let s = self.drain_all();
        sent = (sent.0 + s.0, sent.1 + s.1);
        self.check_step(sent, live_before);
        Ok(())
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
        self.mem.actor = Actor {
            qp,
            request_psn: request.then_some(pkt.repr.bth.psn.value()),
        };
        let dups = self.qps[qp].counters().duplicate_requests;
        match placed {
            Some((_, at, _)) => {
                self.stats.placed += 1;
                let mut w = Placed::new(&mut self.mem, at, pkt.payload);
                self.qps[qp].handle_packet(self.now, d.src, &pkt, &mut w);
                assert!(
                    w.skipped(),
                    "QP {qp}: {:?} handled without the write placed before its check ({at:?})",
                    pkt.repr.bth.opcode
                );
            }
            None => self.qps[qp].handle_packet(self.now, d.src, &pkt, &mut self.mem),
        }
        // Only a request taken as new may open a range: a duplicate is never executed
        // again, and a duplicate READ is answered only inside a READ served before
        // (issue 9, item 3), so its own RETH grants nothing.
        let duplicate = self.qps[qp].counters().duplicate_requests != dups;
        if request && !duplicate {
            let w = &mut self.windows[qp];
            match (info.operation, pkt.repr.reth, pkt.repr.atomic_eth) {
                (Operation::Write, Some(r), _) if info.position.starts() => {
                    w.write.push((r.rkey, r.va, u64::from(r.dma_len)));
                }
                (Operation::ReadRequest, Some(r), _) => {
                    w.read.push((r.rkey, r.va, u64::from(r.dma_len)));
                }
                (Operation::CompareSwap | Operation::FetchAdd, _, Some(a)) => {
                    w.atomic.push((a.rkey, a.va));
                }
                // An ATOMIC WRITE stores its 8 bytes at the RETH's address (the
                // transport refuses any other DMA length).
                (Operation::AtomicWrite, Some(r), _) => {
                    w.write.push((r.rkey, r.va, 8));
                }
                _ => {}
            }
        }
        let touched = self.check_touches();
        self.check_placement(qp, &pkt, info, &touched);
    }

    /// Writes `pkt`'s payload where its QP says it may before the ICRC check
    /// (`Qp::placement`), as the NIC's `rx_place::place` does, logged under the actor
    /// that handles the packet; the QP, the placement and the payload's CRC.
    fn place(&mut self, pkt: &wire::ParsedPacket<'_>) -> Option<(usize, Placement, u32)> {
        let qpn = pkt.repr.bth.dest_qpn.value();
        let qp = self.qps.iter().position(|q| q.qpn() == qpn)?;
        let at = self.qps[qp].placement(pkt)?;
        let request = pkt.repr.bth.opcode.info()?.is_request();
        self.mem.actor = Actor {
            qp,
            request_psn: request.then_some(pkt.repr.bth.psn.value()),
        };
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
            request_psn: None,
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
                request_psn: None,
            };
            let Some(t) = self.qps[qp].poll_transmit(self.now, &mut self.tx_buf, &self.mem) else {
                self.check_touches();
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
                if c.status == WcStatus::Success {
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

    /// Judges every access the transport was granted since the last call.
    fn check_touches(&mut self) -> Vec<Touch> {
        let log = self.mem.take_log();
        let mut modified: Vec<(usize, u32)> = Vec::new();
        for t in &log {
            self.stats.touches[t.kind as usize] += 1;
            let qp = t.actor.qp;
            let ok = match t.kind {
                Kind::ReadLocal => self.send_live[qp]
                    .values()
                    .any(|w| sges_cover(&w.sges[..w.num_sge], t)),
                Kind::WriteLocal => {
                    self.recv_live[qp]
                        .values()
                        .any(|w| sges_cover(&w.sges[..w.num_sge], t))
                        || self.send_live[qp].values().any(|w| {
                            matches!(
                                w.op,
                                SendOp::Read | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
                            ) && sges_cover(&w.sges[..w.num_sge], t)
                        })
                }
                Kind::ReadRemote => self.windows[qp].read.iter().any(|w| covers(*w, t)),
                Kind::WriteRemote => self.windows[qp].write.iter().any(|w| covers(*w, t)),
                Kind::Atomic => self.windows[qp].atomic.contains(&(t.key, t.va)),
            };
            assert!(
                ok,
                "QP {qp}: access outside what was asked for: {t:?} (windows {:?})",
                self.windows[qp]
            );
            let modifies = matches!(t.kind, Kind::WriteLocal | Kind::WriteRemote | Kind::Atomic);
            if let (true, Some(psn)) = (modifies, t.actor.request_psn) {
                if self.qps[qp].qp_type() == QpType::Rc && !modified.contains(&(qp, psn)) {
                    modified.push((qp, psn));
                }
            }
        }
        for key in modified {
            assert!(
                self.executed.insert(key),
                "RC QP {}: request PSN {:#x} modified memory a second time (duplicate executed)",
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
            if (m.pd != PD || !writable) && !self.mem.pristine(r) {
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
        let recv = MRS[mr_index("recv")];
        let mut sges = [Sge::default(); MAX_SGE];
        // Each receive gets its own 1 KiB slot of the receive region (cycling).
        let slot = recv.iova + (self.next_recv_slot % 8) * 1024;
        self.next_recv_slot += 1;
        let mtu = self.mtu;
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
                sges[0] = sge(recv.lkey, slot, mtu.min(1024));
                1
            }
        };
        let wr = RecvWr {
            wr_id: self.fresh_wr_id(),
            sges,
            num_sge,
        };
        if self.qps[qp].post_recv(wr).is_ok() {
            self.posted.insert((qp, Queue::Recv, wr.wr_id));
            self.recv_live[qp].insert(wr.wr_id, wr);
        }
        Ok(())
    }

    fn post_send(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<()> {
        let t = self.qps[qp].qp_type();
        let ops: &[u8] = match t {
            QpType::Rc | QpType::XrcSend => &[0, 1, 2, 3, 4, 5, 6],
            QpType::Uc => &[0, 1, 2, 3],
            QpType::Ud => &[0, 1],
            // No send queue (the victim makes no XRC QPs).
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
            7 => wr.sges[0].lkey ^= 0x100, // a key that names nothing
            _ => {}
        }
        if self.qps[qp].post_send(wr.clone()).is_ok() {
            self.posted_packets += wr_packets(&wr);
            self.psn_span[qp] += match wr.op {
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
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
                    request_psn: None,
                };
                self.qps[qp].handle_timeout(self.now);
                self.check_touches();
            }
        }
    }

    /// Counters of every QP (for the summary a debug run prints).
    pub fn qp_counters(&self) -> Vec<softnic_transport::qp::QpCounters> {
        self.qps.iter().map(|q| *q.counters()).collect()
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

/// Largest region a READ can be served from.
fn max_remote_readable() -> u32 {
    MRS.iter()
        .filter(|m| m.access.contains(Access::REMOTE_READ))
        .map(|m| m.len as u32)
        .max()
        .unwrap_or(0)
}

/// True when `[t.va, t.va + t.len)` lies inside the window `(key, va, len)` with the
/// same key.
fn covers((key, va, len): (u32, u64, u64), t: &Touch) -> bool {
    let (s, e) = (u128::from(t.va), u128::from(t.va) + u128::from(t.len));
    key == t.key && s >= u128::from(va) && e <= u128::from(va) + u128::from(len)
}

fn sges_cover(sges: &[Sge], t: &Touch) -> bool {
    sges.iter()
        .any(|s| covers((s.lkey, s.addr, u64::from(s.length)), t))
}
