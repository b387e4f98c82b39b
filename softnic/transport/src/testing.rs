//! Test support (feature `testing`): a `Vec<u8>`-backed [`Memory`], and [`Pair`], two
//! QPs over a simulated network in virtual time with seeded faults.
//!
//! The network is the real wire format: every packet [`Qp::poll_transmit`] writes gets
//! its ICRC filled by [`wire::IcrcParams`] as the NIC would (IPv4, ID 0, DF), may be
//! dropped, duplicated, delayed (reordered) or corrupted (one bit flipped anywhere in
//! the UDP payload), and on arrival is ICRC-checked, parsed and demultiplexed by
//! destination QPN exactly like the NIC does. Corruption is therefore caught by the
//! ICRC, never by luck. Time only moves when the harness moves it: to the next
//! delivery or the next QP timeout; there are no sleeps.

use core::net::{IpAddr, SocketAddr};

use crate::memory::{Access, Accessor, AtomicOp, MemError, Memory};
use crate::qp::{Placed, Placement, Qp, QpAttr, QpCaps, QpState, QpType};
use crate::srq::{Srq, SrqCaps};
use crate::time::{Duration, Instant};

/// One registered region.
#[derive(Debug, Clone)]
pub struct Region {
    /// Protection domain.
    pub pd: u32,
    /// lkey and rkey (the same value).
    pub key: u32,
    /// Address of byte 0 (the iova).
    pub addr: u64,
    /// Access rights.
    pub access: Access,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Registered memory over plain vectors, with real key, PD, range and access checks.
#[derive(Debug, Clone, Default)]
pub struct MemVec {
    /// Regions.
    pub regions: Vec<Region>,
    next_key: u32,
}

impl MemVec {
    /// Registers `len` zero bytes at `addr`; returns the key (lkey = rkey).
    pub fn register(&mut self, pd: u32, addr: u64, len: usize, access: Access) -> u32 {
        self.next_key += 1;
        // A recognisable high byte so a key from another MemVec rarely matches.
        let key = 0x5A00_0000 | self.next_key;
        self.regions.push(Region {
            pd,
            key,
            addr,
            access,
            data: vec![0; len],
        });
        key
    }

    /// Registers `len` zero bytes at `addr` under a key chosen by the caller (to
    /// replay captured traffic whose R_Keys are fixed). Returns the key.
    pub fn register_with_key(
        &mut self,
        pd: u32,
        key: u32,
        addr: u64,
        len: usize,
        access: Access,
    ) -> u32 {
        self.regions.push(Region {
            pd,
            key,
            addr,
            access,
            data: vec![0; len],
        });
        key
    }

    /// The region with this key.
    pub fn region(&self, key: u32) -> Option<&Region> {
        self.regions.iter().find(|r| r.key == key)
    }

    /// The bytes of region `key`.
    pub fn bytes(&self, key: u32) -> &[u8] {
        self.region(key).map_or(&[], |r| &r.data)
    }

    /// The bytes of region `key`, mutable.
    pub fn bytes_mut(&mut self, key: u32) -> &mut [u8] {
        match self.regions.iter_mut().find(|r| r.key == key) {
            Some(r) => &mut r.data,
            None => &mut [],
        }
    }

    fn find(
        &self,
        pd: u32,
        key: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(usize, usize), MemError> {
        let (i, r) = self
            .regions
            .iter()
            .enumerate()
            .find(|(_, r)| r.key == key && r.pd == pd)
            .ok_or(MemError::InvalidKey)?;
        let off = va.checked_sub(r.addr).ok_or(MemError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfRange)?;
        if end > r.data.len() as u64 {
            return Err(MemError::OutOfRange);
        }
        if !r.access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        Ok((i, off as usize))
    }

    /// The `len` bytes at `va` of region `key`, checked as [`MemVec::find`] checks.
    fn src(
        &self,
        pd: u32,
        key: u32,
        va: u64,
        len: usize,
        access: Access,
    ) -> Result<&[u8], MemError> {
        let (i, off) = self.find(pd, key, va, len as u64, access)?;
        Ok(&self.regions[i].data[off..off + len])
    }

    /// [`MemVec::src`], mutable (the destination of a write).
    fn dst(
        &mut self,
        pd: u32,
        key: u32,
        va: u64,
        len: usize,
        access: Access,
    ) -> Result<&mut [u8], MemError> {
        let (i, off) = self.find(pd, key, va, len as u64, access)?;
        Ok(&mut self.regions[i].data[off..off + len])
    }
}

impl Memory for MemVec {
    fn read_local(&self, pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError> {
        dst.copy_from_slice(self.src(pd, lkey, va, dst.len(), Access::NONE)?);
        Ok(())
    }

    fn read_local_crc(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let src = self.src(pd, lkey, va, dst.len(), Access::NONE)?;
        Ok(crate::crc::copy_update(crc, src, dst))
    }

    fn write_local(&mut self, pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        self.dst(pd, lkey, va, src.len(), Access::LOCAL_WRITE)?
            .copy_from_slice(src);
        Ok(())
    }

    fn write_local_crc(
        &mut self,
        pd: u32,
        lkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let dst = self.dst(pd, lkey, va, src.len(), Access::LOCAL_WRITE)?;
        Ok(crate::crc::copy_update(crc, src, dst))
    }

    fn check_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        self.find(by.pd, rkey, va, len, access).map(|_| ())
    }

    fn read_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        dst.copy_from_slice(self.src(by.pd, rkey, va, dst.len(), Access::REMOTE_READ)?);
        Ok(())
    }

    fn read_remote_crc(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let src = self.src(by.pd, rkey, va, dst.len(), Access::REMOTE_READ)?;
        Ok(crate::crc::copy_update(crc, src, dst))
    }

    fn write_remote(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        self.dst(by.pd, rkey, va, src.len(), Access::REMOTE_WRITE)?
            .copy_from_slice(src);
        Ok(())
    }

    fn write_remote_crc(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let dst = self.dst(by.pd, rkey, va, src.len(), Access::REMOTE_WRITE)?;
        Ok(crate::crc::copy_update(crc, src, dst))
    }

    fn atomic(&mut self, by: Accessor, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let (i, off) = self.find(by.pd, rkey, va, 8, Access::REMOTE_ATOMIC)?;
        let cell = &mut self.regions[i].data[off..off + 8];
        let mut b = [0u8; 8];
        b.copy_from_slice(cell);
        let orig = u64::from_ne_bytes(b);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }
}

/// A small, seeded PRNG (SplitMix64): reproducible fault schedules without a
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// Random faults applied to every packet (each a probability in 0..=1).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Drop.
    pub loss: f64,
    /// Deliver late (after packets sent later).
    pub reorder: f64,
    /// Deliver twice.
    pub duplicate: f64,
    /// Flip one bit.
    pub corrupt: f64,
}

/// Which side of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first node.
    A,
    /// The second node.
    B,
}

/// What a [`Pair`] filter does with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver normally (random faults still apply).
    Pass,
    /// Drop it.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver it this much later than normal.
    Delay(Duration),
    /// Deliver it normally, and a copy this much later.
    DuplicateLate(Duration),
}

/// A packet as a filter sees it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Sender.
    pub from: Side,
    /// Headers.
    pub repr: wire::PacketRepr,
    /// Index of this packet among all packets sent by the pair.
    pub index: u64,
    /// The IP TOS / traffic class it was sent with ([`crate::qp::Transmit::tclass`]).
    pub tclass: u8,
}

/// A node: one QP, its memory, and the SRQ the QP receives from, if any.
#[derive(Debug)]
pub struct Node {
    /// The QP.
    pub qp: Qp,
    /// The QP's shared receive queue ([`Pair::connect_srq`]).
    pub srq: Option<Srq>,
    /// Its registered memory.
    pub mem: MemVec,
    /// Its UDP endpoint.
    pub addr: SocketAddr,
}

struct InFlight {
    at: Instant,
    seq: u64,
    to: Side,
    src: SocketAddr,
    src_port: u16,
    bytes: Vec<u8>,
}

/// Pair-level counters (what the network did).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets sent by both QPs.
    pub sent: u64,
    /// Of those, packets whose ICRC was completed from their payload digest
    /// ([`crate::qp::Transmit::digest`]) instead of hashing the payload.
    pub digested: u64,
    /// Packets delivered to a QP.
    pub delivered: u64,
    /// Dropped by loss or a filter.
    pub dropped: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Delayed for reordering.
    pub reordered: u64,
    /// Corrupted (bit flipped).
    pub corrupted: u64,
    /// Corrupted in BTH byte 4 (FECN, BECN, reserved), which the ICRC masks (IBTA
    /// A17.4.1.1): undetectable by design, and harmless to the transport.
    pub corrupted_masked: u64,
    /// Caught by the ICRC check on arrival.
    pub icrc_errors: u64,
    /// Failed to parse on arrival.
    pub parse_errors: u64,
    /// For a QPN the receiver does not have.
    pub wrong_qpn: u64,
    /// With [`Pair::fused_receive`]: delivered packets whose payload was written before
    /// their ICRC was checked (`Qp::placement`), and whose check passed.
    pub placed: u64,
    /// Of those, packets whose handling did not make the placed write: the query and
    /// the handling disagree (a bug).
    pub place_mismatch: u64,
}

/// The packet filter type.
pub type Filter = Box<dyn FnMut(&Seen) -> Verdict>;

/// Two QPs connected over a simulated network in virtual time.
pub struct Pair {
    /// Node A.
    pub a: Node,
    /// Node B.
    pub b: Node,
    /// Virtual now.
    pub now: Instant,
    /// One-way latency.
    pub latency: Duration,
    /// Random faults.
    pub faults: Faults,
    /// Per-packet deterministic filter (runs before random faults).
    pub filter: Option<Filter>,
    /// What the network did.
    pub stats: NetStats,
    /// Receive as the NIC's single pass does: each packet's payload written where
    /// `Qp::placement` says before its ICRC is checked (see [`Pair::deliver`]).
    pub fused_receive: bool,
    /// Per side (A, B): at most one packet sent per this interval, as a NIC bound by
    /// its own CPU sends (`None`: everything a QP has goes out at once).
    pub pace: [Option<Duration>; 2],
    next_free: [Instant; 2],
    rng: Rng,
    in_flight: Vec<InFlight>,
    seq: u64,
    buf: Vec<u8>,
}

impl core::fmt::Debug for Pair {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pair")
            .field("now", &self.now)
            .field("stats", &self.stats)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

/// The SRQ number [`Pair::connect_srq`] gives B's SRQ.
pub const PAIR_SRQN: u32 = 0x5;

/// Connection parameters for [`Pair::connect`].
#[derive(Debug, Clone, Copy)]
pub struct PairConfig {
    /// Transport service.
    pub qp_type: QpType,
    /// Path MTU.
    pub mtu: u32,
    /// QPN of A and B.
    pub qpns: (u32, u32),
    /// Initial PSN of A's and B's send queues.
    pub psns: (u32, u32),
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// retry_cnt.
    pub retry_cnt: u8,
    /// rnr_retry.
    pub rnr_retry: u8,
    /// min_rnr_timer.
    pub min_rnr_timer: u8,
    /// max_rd_atomic and max_dest_rd_atomic.
    pub rd_atomic: u8,
    /// QP access flags.
    pub access: Access,
    /// Queue depths.
    pub caps: QpCaps,
    /// UD Q_Key.
    pub qkey: u32,
    /// The address vector's traffic class (connected QPs).
    pub traffic_class: u8,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            qp_type: QpType::Rc,
            mtu: 1024,
            qpns: (0x11, 0x22),
            psns: (100, 5000),
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 4,
            access: Access::ALL,
            caps: QpCaps {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_sge: 4,
                max_inline: 256,
            },
            qkey: 0x1111,
            traffic_class: 0,
        }
    }
}

/// Brings `qp` to RTS (RTR for nothing else) with `cfg`, peer `dest_qpn` at `remote`.
pub fn connect_qp(
    qp: &mut Qp,
    cfg: &PairConfig,
    dest_qpn: u32,
    remote: SocketAddr,
    rq_psn: u32,
    sq_psn: u32,
) {
    let now = Instant::ZERO;
    let t = qp.qp_type();
    // The attributes each service takes (`state::TRANSITIONS`): a responder's for RC
    // and the XRC receive QP, a requester's retries for RC and the XRC send QP.
    let responder = matches!(t, QpType::Rc | QpType::XrcRecv);
    let retries = matches!(t, QpType::Rc | QpType::XrcSend);
    let init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        access: (t != QpType::Ud).then_some(cfg.access),
        qkey: (t == QpType::Ud).then_some(cfg.qkey),
        ..Default::default()
    };
    qp.modify(now, &init).expect("to Init");
    let rtr = match t {
        QpType::Ud => QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        _ => QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(cfg.mtu),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(rq_psn),
            remote: Some(remote),
            traffic_class: cfg.traffic_class,
            max_dest_rd_atomic: responder.then_some(cfg.rd_atomic),
            min_rnr_timer: responder.then_some(cfg.min_rnr_timer),
            ..Default::default()
        },
    };
    qp.modify(now, &rtr).expect("to RTR");
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(sq_psn),
        timeout: t.is_reliable().then_some(cfg.timeout),
        retry_cnt: retries.then_some(cfg.retry_cnt),
        rnr_retry: retries.then_some(cfg.rnr_retry),
        max_rd_atomic: retries.then_some(cfg.rd_atomic),
        ..Default::default()
    };
    qp.modify(now, &rts).expect("to RTS");
}

impl Pair {
    /// Two connected QPs in RTS with empty memories, no faults, 1 µs latency.
    pub fn connect(cfg: PairConfig, seed: u64) -> Pair {
        let addr_a: SocketAddr = "127.0.0.1:4791".parse().expect("addr");
        let addr_b: SocketAddr = "127.0.0.2:4791".parse().expect("addr");
        let mut qa = Qp::new(cfg.qpns.0, cfg.qp_type, 1, cfg.caps);
        let mut qb = Qp::new(cfg.qpns.1, cfg.qp_type, 1, cfg.caps);
        connect_qp(&mut qa, &cfg, cfg.qpns.1, addr_b, cfg.psns.1, cfg.psns.0);
        connect_qp(&mut qb, &cfg, cfg.qpns.0, addr_a, cfg.psns.0, cfg.psns.1);
        qa.set_port_mtu(cfg.mtu);
        qb.set_port_mtu(cfg.mtu);
        qa.set_local_addr(addr_a);
        qb.set_local_addr(addr_b);
        Pair {
            a: Node {
                qp: qa,
                srq: None,
                mem: MemVec::default(),
                addr: addr_a,
            },
            b: Node {
                qp: qb,
                srq: None,
                mem: MemVec::default(),
                addr: addr_b,
            },
            now: Instant::ZERO,
            latency: Duration::from_micros(1),
            faults: Faults::default(),
            filter: None,
            stats: NetStats::default(),
            fused_receive: false,
            pace: [None, None],
            next_free: [Instant::ZERO; 2],
            rng: Rng::new(seed),
            in_flight: Vec::new(),
            seq: 0,
            buf: vec![0; 4096 + 128],
        }
    }

    /// As [`Pair::connect`], but B's QP takes its receive WQEs from an SRQ (number
    /// [`PAIR_SRQN`], `caps`), kept in `b.srq`.
    pub fn connect_srq(cfg: PairConfig, seed: u64, caps: SrqCaps) -> Pair {
        let mut p = Pair::connect(cfg, seed);
        let mut qb = Qp::new_with_srq(cfg.qpns.1, cfg.qp_type, 1, cfg.caps, PAIR_SRQN);
        connect_qp(&mut qb, &cfg, cfg.qpns.0, p.a.addr, cfg.psns.0, cfg.psns.1);
        qb.set_port_mtu(cfg.mtu);
        qb.set_local_addr(p.b.addr);
        p.b.qp = qb;
        p.b.srq = Some(Srq::new(PAIR_SRQN, 1, caps));
        p
    }

    /// An XRC pair: A is an XRC send QP (`cfg.qpns.0`), B an XRC receive QP
    /// (`cfg.qpns.1`) receiving through the XRC SRQ [`PAIR_SRQN`] (`caps`, PD 1) in
    /// `b.srq`, which is what A's work requests must name
    /// ([`crate::wr::SendWr::xrc_srqn`]). B looks the SRQ up as the NIC does: a
    /// request naming another goes to [`Qp::handle_packet_xrc_no_srq`].
    /// `cfg.qp_type` is ignored.
    pub fn connect_xrc(cfg: PairConfig, seed: u64, caps: SrqCaps) -> Pair {
        let mut p = Pair::connect(cfg, seed);
        let mut qa = Qp::new(cfg.qpns.0, QpType::XrcSend, 1, cfg.caps);
        let mut qb = Qp::new_xrc_recv(cfg.qpns.1, cfg.caps);
        connect_qp(&mut qa, &cfg, cfg.qpns.1, p.b.addr, cfg.psns.1, cfg.psns.0);
        connect_qp(&mut qb, &cfg, cfg.qpns.0, p.a.addr, cfg.psns.0, cfg.psns.1);
        qa.set_local_addr(p.a.addr);
        qb.set_local_addr(p.b.addr);
        p.a.qp = qa;
        p.b.qp = qb;
        p.b.srq = Some(Srq::new(PAIR_SRQN, 1, caps));
        p
    }

    /// The node on `side`.
    pub fn node(&mut self, side: Side) -> &mut Node {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    fn icrc_params(src: SocketAddr, dst: SocketAddr, src_port: u16) -> wire::IcrcParams {
        let ip = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => wire::IpParams::V4 {
                src: s,
                dst: d,
                id: 0,
                dont_fragment: true,
            },
            (s, d) => wire::IpParams::V6 {
                src: match s {
                    IpAddr::V6(x) => x,
                    IpAddr::V4(x) => x.to_ipv6_mapped(),
                },
                dst: match d {
                    IpAddr::V6(x) => x,
                    IpAddr::V4(x) => x.to_ipv6_mapped(),
                },
            },
        };
        wire::IcrcParams {
            ip,
            src_port,
            dst_port: dst.port(),
        }
    }

    /// Collects every packet both QPs want to send now and puts it on the wire.
    /// Returns how many were sent.
    pub fn transmit(&mut self) -> u64 {
        let mut n = 0;
        for side in [Side::A, Side::B] {
            let si = side as usize;
            // Bounded: a QP emits at most its window plus its queued responses.
            for _ in 0..100_000 {
                let now = self.now;
                if self.pace[si].is_some() && self.next_free[si] > now {
                    break;
                }
                let node = match side {
                    Side::A => &mut self.a,
                    Side::B => &mut self.b,
                };
                let Some(t) = node.qp.poll_transmit(now, &mut self.buf, &node.mem) else {
                    break;
                };
                if let Some(d) = self.pace[si] {
                    self.next_free[si] = now + d;
                }
                let src = node.addr;
                let mut bytes = self.buf[..t.len].to_vec();
                let params = Pair::icrc_params(src, t.dest, t.src_port);
                // As the NIC fills it: the gathered payload combined in by its digest
                // (the receiver checks with a full hash, so a wrong digest is an ICRC
                // error here).
                let icrc = match t.digest {
                    Some(d) => {
                        self.stats.digested += 1;
                        params
                            .prepare()
                            .compute_with_payload(&bytes, d.range(), d.crc)
                    }
                    None => params.compute(&bytes),
                };
                let slot = bytes.len() - wire::ICRC_LEN;
                bytes[slot..].copy_from_slice(&icrc.expect("ICRC").to_le_bytes());
                let to = if t.dest == self.a.addr {
                    Side::A
                } else if t.dest == self.b.addr {
                    Side::B
                } else {
                    continue;
                };
                n += 1;
                self.put_on_wire(side, to, (src, t.src_port, t.tclass), bytes);
            }
        }
        n
    }

    fn put_on_wire(
        &mut self,
        from: Side,
        to: Side,
        (src, src_port, tclass): (SocketAddr, u16, u8),
        bytes: Vec<u8>,
    ) {
        let index = self.stats.sent;
        self.stats.sent += 1;
        let verdict = match (&mut self.filter, wire::PacketRepr::parse(&bytes)) {
            (Some(f), Ok(p)) => f(&Seen {
                from,
                repr: p.repr,
                index,
                tclass,
            }),
            _ => Verdict::Pass,
        };
        let mut copies = 1;
        let mut at = self.now + self.latency;
        if let Verdict::DuplicateLate(d) = verdict {
            self.stats.duplicated += 1;
            self.seq += 1;
            self.in_flight.push(InFlight {
                at: at + d,
                seq: self.seq,
                to,
                src,
                src_port,
                bytes: bytes.clone(),
            });
        }
        match verdict {
            Verdict::Drop => {
                self.stats.dropped += 1;
                return;
            }
            Verdict::Duplicate => {
                copies = 2;
                self.stats.duplicated += 1;
            }
            Verdict::Delay(d) => {
                at = at + d;
                self.stats.reordered += 1;
            }
            Verdict::Pass | Verdict::DuplicateLate(_) => {}
        }
        if self.rng.chance(self.faults.loss) {
            self.stats.dropped += 1;
            return;
        }
        if self.rng.chance(self.faults.duplicate) {
            copies += 1;
            self.stats.duplicated += 1;
        }
        if self.rng.chance(self.faults.reorder) {
            at = at + Duration::from_micros(1 + self.rng.below(20));
            self.stats.reordered += 1;
        }
        for _ in 0..copies {
            let mut b = bytes.clone();
            if self.rng.chance(self.faults.corrupt) && !b.is_empty() {
                let bit = self.rng.below(b.len() as u64 * 8);
                b[(bit / 8) as usize] ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
                if bit / 8 == 4 {
                    self.stats.corrupted_masked += 1;
                }
            }
            self.seq += 1;
            self.in_flight.push(InFlight {
                at,
                seq: self.seq,
                to,
                src,
                src_port,
                bytes: b,
            });
        }
    }

    /// Delivers every packet due at `now`, in arrival order. Returns how many.
    pub fn deliver(&mut self) -> u64 {
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].at <= now {
                due.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| (p.at, p.seq));
        let n = due.len() as u64;
        for p in due {
            let node = match p.to {
                Side::A => &mut self.a,
                Side::B => &mut self.b,
            };
            let params = Pair::icrc_params(p.src, node.addr, p.src_port);
            if !self.fused_receive {
                if params.verify(&p.bytes).is_err() {
                    self.stats.icrc_errors += 1;
                    continue;
                }
                let Ok(parsed) = wire::PacketRepr::parse(&p.bytes) else {
                    self.stats.parse_errors += 1;
                    continue;
                };
                Pair::handle(node, &mut self.stats, now, p.src, &parsed, None);
                continue;
            }
            // The receiver's single pass, as the NIC makes it (`qp::placement`):
            // parse, ask where the payload goes, write it there with its CRC, then
            // check the ICRC with that CRC combined in — and only then handle.
            let Ok(parsed) = wire::PacketRepr::parse(&p.bytes) else {
                match params.verify(&p.bytes) {
                    Ok(()) => self.stats.parse_errors += 1,
                    Err(_) => self.stats.icrc_errors += 1,
                }
                continue;
            };
            let to_us = parsed.repr.bth.dest_qpn.value() == node.qp.qpn();
            let placed = to_us
                .then(|| node.qp.placement(&parsed))
                .flatten()
                .and_then(|at| Some((at, at.write(&mut node.mem, parsed.payload).ok()?)));
            let payload = parsed.header_len..parsed.header_len + parsed.payload.len();
            let icrc = match placed {
                Some((_, crc)) => params
                    .prepare()
                    .compute_with_payload(&p.bytes, payload, crc),
                None => params.compute(&p.bytes),
            };
            if icrc.ok() != Some(parsed.icrc) {
                self.stats.icrc_errors += 1;
                continue;
            }
            self.stats.placed += u64::from(placed.is_some());
            Pair::handle(
                node,
                &mut self.stats,
                now,
                p.src,
                &parsed,
                placed.map(|x| x.0),
            );
        }
        n
    }

    /// Hands a packet whose ICRC was checked to `node`'s QP; `placed`: its payload is
    /// already where this placement says (handled through [`Placed`], which counts a
    /// placement handling did not make as `place_mismatch`).
    fn handle(
        node: &mut Node,
        stats: &mut NetStats,
        now: Instant,
        src: SocketAddr,
        parsed: &wire::ParsedPacket<'_>,
        placed: Option<Placement>,
    ) {
        if parsed.repr.bth.dest_qpn.value() != node.qp.qpn() {
            stats.wrong_qpn += 1;
            return;
        }
        stats.delivered += 1;
        // An XRC receive QP takes the SRQ its XRCETH names, looked up as the NIC does.
        let xrc = node.qp.qp_type() == QpType::XrcRecv;
        let named = parsed.repr.xrceth.map(|x| x.srqn);
        let ip = crate::qp::ReceivedIp::default();
        let mut handle = |mem: &mut dyn Memory| match node.srq.as_mut() {
            Some(srq) if xrc && Some(srq.srqn()) == named => {
                node.qp.handle_packet_xrc(now, src, &ip, parsed, mem, srq)
            }
            _ if xrc => node.qp.handle_packet_xrc_no_srq(now, src, &ip, parsed, mem),
            Some(srq) => node.qp.handle_packet_srq(now, src, parsed, mem, srq),
            None => node.qp.handle_packet(now, src, parsed, mem),
        };
        match placed {
            Some(at) => {
                let mut wrapped = Placed::new(&mut node.mem, at, parsed.payload);
                handle(&mut wrapped);
                stats.place_mismatch += u64::from(!wrapped.skipped());
            }
            None => handle(&mut node.mem),
        }
    }

    /// The next instant something happens: a delivery, a QP timeout, or a paced side
    /// free to send again ([`Pair::pace`]).
    pub fn next_event(&self) -> Option<Instant> {
        let d = self.in_flight.iter().map(|p| p.at).min();
        let free = |i: usize| {
            let t = self.next_free[i];
            (self.pace[i].is_some() && t > self.now).then_some(t)
        };
        [
            d,
            self.a.qp.poll_timeout(),
            self.b.qp.poll_timeout(),
            free(0),
            free(1),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// One step: transmit, deliver what is due, or jump time to the next event and
    /// run timeouts. Returns false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        if self.transmit() > 0 {
            return true;
        }
        if self.deliver() > 0 {
            return true;
        }
        let Some(t) = self.next_event() else {
            return false;
        };
        if t > self.now {
            self.now = t;
        }
        let now = self.now;
        self.a.qp.handle_timeout(now);
        self.b.qp.handle_timeout(now);
        true
    }

    /// Steps until idle; panics after `max_steps` (a livelock is a bug).
    pub fn drive(&mut self, max_steps: u64) {
        for _ in 0..max_steps {
            if !self.step() {
                return;
            }
        }
        panic!("pair did not go idle within {max_steps} steps: {self:?}");
    }

    /// Steps until idle or `max_steps`; returns whether it went idle.
    pub fn drive_bounded(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}
