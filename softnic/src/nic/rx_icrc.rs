//! ICRC verification of received packets, when the IP header cannot be seen.
//!
//! The ICRC covers the IPv4 Identification (see the shared RoCE README, "The IPv4
//! Identification problem"), and a plain UDP socket does not show the IPv4 header. So
//! for IPv4 the check runs in two steps:
//!
//! 1. **ID 0, full 32-bit check.** softnic peers send from an unconnected socket with DF
//!    set, for which Linux puts ID 0 on every packet; hardware RNICs send ID 0 too. This
//!    is one CRC and keeps all 32 bits of the ICRC's strength.
//! 2. **The segment's ID, full 32-bit check.** A UDP GSO send's segment k carries
//!    ID k, and on loopback a GSO send reaches a GRO socket as one buffer, so the k-th
//!    datagram of a GRO buffer most likely carries ID k ([`verify_segment`]). CRC-32 is
//!    affine: the ICRC under ID k is the ID-0 ICRC of step 1 XOR the columns of k's bits
//!    (cached per packet length), so this costs a few XORs, no second CRC.
//! 3. **Solve for the ID** (as [`wire::icrc::solve_ipv4_id`] does, with the linear
//!    system cached per packet length: [`IdSolver`]). Linux rxe sends varying
//!    non-zero IDs. The one 16-bit ID under which the ICRC matches, if any, can be
//!    computed; a corrupted packet passes only with probability 2^-16 — this path
//!    keeps 16 of the 32 bits. It is only tried after steps 1 and 2 failed.
//!
//! All steps assume DF was set (rxe, hardware and softnic all set it; the DF bit is
//! covered by the ICRC). IPv6 has no Identification: the ICRC is checked in full.
//!
//! Step 1 (and the send path's fill, `runtime.rs`) uses a [`PreparedIcrc`] per peer,
//! kept in a small cache ([`PreparedCache`]): the IP/UDP pseudo-headers are the same for
//! every packet between two sockets except for the lengths, so their CRC is computed once
//! and the lengths are folded in per packet (`wire/src/icrc/flow.rs`).
//! Counters record which path verified each packet (`rx_icrc_id0`,
//! `rx_icrc_segment_id`, `rx_icrc_solved`, `rx_icrc_ipv6`) and how many failed
//! (`rx_drop_bad_icrc`).

use std::net::{IpAddr, SocketAddr};

use softnic_transport::qp::PayloadDigest;
use wire::icrc::{IcrcParams, IpParams, PreparedIcrc};

/// How a received packet's ICRC was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcPath {
    /// IPv4, matched with ID 0 (full 32-bit check).
    Ipv4Id0,
    /// IPv4, matched with the ID of the packet's position in its GRO buffer (segment k
    /// of a GSO send carries ID k; full 32-bit check).
    Ipv4Segment,
    /// IPv4, matched under a solved non-zero ID (16-bit check).
    Ipv4Solved,
    /// IPv6 (full 32-bit check).
    Ipv6,
}

/// `p` with its IPv4 ID replaced by `id` (IPv6 has none: `p` itself).
fn with_id(p: &IcrcParams, id: u16) -> IcrcParams {
    match p.ip {
        IpParams::V4 {
            src,
            dst,
            dont_fragment,
            ..
        } => IcrcParams {
            ip: IpParams::V4 {
                src,
                dst,
                id,
                dont_fragment,
            },
            ..*p
        },
        IpParams::V6 { .. } => *p,
    }
}

/// Writes the ICRC `c` into the last four bytes of `roce` (whose compute checked that
/// the slot exists), least-significant byte first.
fn store_icrc(roce: &mut [u8], c: u32) {
    let n = roce.len();
    if let Some(slot) = roce.get_mut(n.saturating_sub(wire::ICRC_LEN)..) {
        slot.copy_from_slice(&c.to_le_bytes());
    }
}

/// The ICRC parameters a packet from `peer` to `local` was sent with, for IPv4 ID `id`.
pub fn params(local: SocketAddr, peer: SocketAddr, id: u16) -> Option<IcrcParams> {
    let ip = match (peer.ip(), local.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpParams::V4 {
            src,
            dst,
            id,
            dont_fragment: true,
        },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpParams::V6 { src, dst },
        _ => return None,
    };
    Some(IcrcParams {
        ip,
        src_port: peer.port(),
        dst_port: local.port(),
    })
}

/// The 16 ICRC columns of the IPv4 ID bits for one packet length, in echelon form
/// (row k has no bit at the pivots of rows 0..k), with the ID bits each row combines.
#[derive(Debug, Clone, Copy)]
struct Basis {
    rows: [(u32, u16); 16],
    rank: usize,
}

/// What the IPv4 ID does to the ICRC of packets of one length: `cols[i]` is what
/// setting ID bit i XORs into it, and `basis` the same columns reduced for solving.
/// `segments[k]` is what ID k XORs in for the IDs of a GSO run's segments (k <
/// [`SEGMENT_IDS`]): one load instead of a loop over k's bits, on both sides of every
/// segment but the first (issue 12). 256 bytes more per cached length: with at most
/// [`MAX_CACHED_LENGTHS`] lengths, at most 1 MiB more, whatever a peer sends.
#[derive(Debug, Clone, Copy)]
struct Columns {
    cols: [u32; 16],
    basis: Basis,
    segments: [u32; SEGMENT_IDS],
}

/// IDs with their column sums tabled: a GSO run's segment positions
/// (`udp::GSO_MAX_SEGMENTS`).
const SEGMENT_IDS: usize = 64;

impl Columns {
    fn new(cols: [u32; 16], basis: Basis) -> Columns {
        let mut c = Columns {
            cols,
            basis,
            segments: [0; SEGMENT_IDS],
        };
        for k in 1..SEGMENT_IDS {
            c.segments[k] = c.of_bits(k as u16);
        }
        c
    }

    /// The ICRC under ID `id` minus (XOR) the ICRC under ID 0.
    #[inline]
    fn of(&self, id: u16) -> u32 {
        match self.segments.get(usize::from(id)) {
            Some(&v) => v,
            None => self.of_bits(id),
        }
    }

    /// [`Columns::of`], from the columns of `id`'s bits.
    fn of_bits(&self, id: u16) -> u32 {
        let mut v = 0;
        let mut bits = id;
        while bits != 0 {
            v ^= self.cols[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        v
    }
}

impl Basis {
    /// Reduces `v` (with its ID bits `ids`) by the rows; returns what is left.
    fn reduce(&self, mut v: u32, mut ids: u16) -> (u32, u16) {
        for &(r, r_ids) in &self.rows[..self.rank] {
            let pivot = 1u32 << (31 - r.leading_zeros());
            if v & pivot != 0 {
                v ^= r;
                ids ^= r_ids;
            }
        }
        (v, ids)
    }
}

/// Slots of a [`PreparedCache`] (a power of two).
const PREPARED_SLOTS: usize = 64;

/// The [`PreparedIcrc`] of recently seen ICRC parameters (one per peer and direction in
/// practice). Direct-mapped: O(1), bounded memory, no allocation.
///
/// Entries are made lazily: the first packet under new parameters is hashed unprepared
/// (what every packet cost before the cache) and only remembered as the slot's
/// candidate; the second one in a row prepares them and takes the slot. So a sender
/// that sprays source ports costs the NIC about what it cost without a cache — never a
/// `prepare` per packet — and can evict a peer's entry only by repeating itself, after
/// which that peer pays the unprepared price until it wins the slot back.
#[derive(Debug)]
pub struct PreparedCache {
    slots: [Slot; PREPARED_SLOTS],
    /// The slot of the last hit, compared first: a bulk transfer asks for one peer's
    /// parameters many times in a row, and comparing them needs no hash, whose
    /// multiply-and-index chain cost ~1 % of the dataplane bench (docs/perf.md).
    recent: usize,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    entry: Option<(IcrcParams, PreparedIcrc)>,
    candidate: Option<IcrcParams>,
}

impl Default for PreparedCache {
    fn default() -> Self {
        PreparedCache {
            slots: [Slot::default(); PREPARED_SLOTS],
            recent: 0,
        }
    }
}

impl PreparedCache {
    /// The prepared form of `p` if it is cached (or has just earned a slot); `None`
    /// means "hash this packet unprepared".
    pub fn get(&mut self, p: &IcrcParams) -> Option<PreparedIcrc> {
        if let Some((q, prep)) = self.slots.get(self.recent).and_then(|s| s.entry) {
            if q == *p {
                return Some(prep);
            }
        }
        let i = Self::index(p);
        let slot = &mut self.slots[i];
        match slot.entry {
            Some((q, prep)) if q == *p => {
                self.recent = i;
                Some(prep)
            }
            _ if slot.candidate.as_ref() == Some(p) => {
                let prep = p.prepare();
                slot.entry = Some((*p, prep));
                slot.candidate = None;
                self.recent = i;
                Some(prep)
            }
            _ => {
                slot.candidate = Some(*p);
                None
            }
        }
    }

    /// The ICRC of `roce` (BTH … ICRC slot) under `p`, as [`IcrcParams::compute`].
    pub fn compute(&mut self, p: &IcrcParams, roce: &[u8]) -> wire::Result<u32> {
        match self.get(p) {
            Some(prep) => prep.compute(roce),
            None => p.compute(roce),
        }
    }

    /// A cheap multiplicative hash of the fields that differ between peers. Not keyed:
    /// a colliding peer costs only a `prepare` per packet, never a wrong answer (the
    /// slot holds the full parameters and is compared in full).
    fn index(p: &IcrcParams) -> usize {
        let ip: u64 = match p.ip {
            IpParams::V4 { src, dst, id, .. } => {
                u64::from(u32::from(src))
                    ^ u64::from(u32::from(dst)).rotate_left(32)
                    ^ u64::from(id)
            }
            IpParams::V6 { src, dst } => {
                let (a, b) = (u128::from(src), u128::from(dst));
                (a ^ (a >> 64) ^ b.rotate_left(32) ^ (b >> 64)) as u64
            }
        };
        let x = ip ^ u64::from(p.src_port) << 16 ^ u64::from(p.dst_port) << 40;
        (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - PREPARED_SLOTS.trailing_zeros())) as usize
    }
}

/// Solves for the IPv4 ID like [`wire::icrc::solve_ipv4_id`], but caches the linear
/// system per packet length: CRC-32 is affine, and flipping ID bit `i` changes the ICRC
/// by a column that depends only on the distance from the ID to the end of the packet,
/// i.e. on the length — not on addresses, ports or contents. With the cache a solve
/// costs one CRC (the ID-0 CRC, already computed by the first step) and a few dozen
/// XORs instead of 17 CRCs, which matters when every packet arrives with a non-zero ID
/// (rxe peers). The same columns give the ICRC under a guessed ID without solving: a
/// GSO segment's position in its GRO buffer ([`verify_segment`]).
///
/// It also holds the packet path's [`PreparedCache`] (its `prepared` field), used by
/// [`verify`] and by the send path, so that one object owns the path's ICRC state.
#[derive(Debug, Default)]
pub struct IdSolver {
    cache: std::collections::HashMap<usize, Columns>,
    /// The last length looked up and its columns: a bulk transfer's segments are all
    /// one length, so most look-ups skip the map's hashing.
    recent: Option<(usize, Columns)>,
    prepared: PreparedCache,
}

/// Most lengths cached (a datagram has at most 64 KiB; real traffic uses a handful).
const MAX_CACHED_LENGTHS: usize = 4096;

impl IdSolver {
    /// An empty solver.
    pub fn new() -> Self {
        IdSolver::default()
    }

    /// Computes the ICRC of `roce` under `p` and writes it into its last four bytes,
    /// through the [`PreparedCache`] (the send path's fill): a run of one segment.
    ///
    /// Under a non-zero IPv4 ID (segment k of a GSO send carries ID k, `udp.rs`) the
    /// ICRC is the ID-0 ICRC XOR the columns of k's bits, as on receive
    /// ([`verify_segment`]): the cache keeps one entry per peer, not one per segment
    /// position — a run of 64 positions would otherwise fill, and thrash, the whole
    /// direct-mapped cache.
    pub fn fill(
        &mut self,
        p: &IcrcParams,
        roce: &mut [u8],
        digest: Option<PayloadDigest>,
    ) -> wire::Result<()> {
        if roce.is_empty() {
            // No segment to fill: the error the hash gives a packet too short for one.
            return p.compute(roce).map(drop);
        }
        let id = match p.ip {
            IpParams::V4 { id, .. } => id,
            IpParams::V6 { .. } => 0,
        };
        self.fill_run(p, roce, roce.len(), |_| id, &[digest])
    }

    /// [`IdSolver::fill`] for every `seg`-byte segment of a GSO run (the last may be
    /// shorter), segment k under `p` with the IPv4 ID `id(k)`. The per-peer look-ups —
    /// the prepared ID-0 form, compared field by field, and the ID columns — are made
    /// once per run instead of once per segment (issue 12: with one look-up per segment
    /// they took ≈ 2 % of a 64 KiB sender's samples beside the CRC itself). A new peer is
    /// prepared on its second run, as [`PreparedCache::get`] prepares on its second ask.
    ///
    /// `digests[k]`, when present, is segment k's gathered payload and its CRC: the
    /// prepared path then hashes the headers and the pad only and combines the payload
    /// in ([`PreparedIcrc::compute_with_payload`]) — the payload was read once, by the
    /// gather. Segments without one (or past the slice's end) are hashed in full.
    pub fn fill_run(
        &mut self,
        p: &IcrcParams,
        run: &mut [u8],
        seg: usize,
        id: impl Fn(usize) -> u16,
        digests: &[Option<PayloadDigest>],
    ) -> wire::Result<()> {
        let flow = self.flow(with_id(p, 0));
        let p0 = flow.p0;
        for (k, roce) in run.chunks_mut(seg.max(1)).enumerate() {
            let base = flow.id0_icrc(roce, digests.get(k).copied().flatten())?;
            // IPv6 has no ID: every segment is `base`.
            let c = match id(k) {
                i if i == 0 || !matches!(p.ip, IpParams::V4 { .. }) => base,
                i => match self.columns(&p0, roce, base) {
                    Some(c) => base ^ c.of(i),
                    None => with_id(p, i).compute(roce)?,
                },
            };
            store_icrc(roce, c);
        }
        Ok(())
    }

    /// The ICRC change each IPv4 ID bit makes to a datagram of `roce.len()` bytes
    /// (`base` = its ICRC under ID 0), by reference: looked up for every GSO segment
    /// whose ICRC does not match under ID 0.
    fn columns(&mut self, p0: &IcrcParams, roce: &[u8], base: u32) -> Option<&Columns> {
        let len = roce.len();
        if self.recent.as_ref().is_none_or(|(l, _)| *l != len) {
            let c = self.columns_uncached(p0, roce, base)?;
            self.recent = Some((len, c));
        }
        self.recent.as_ref().map(|(_, c)| c)
    }

    fn columns_uncached(&mut self, p0: &IcrcParams, roce: &[u8], base: u32) -> Option<Columns> {
        if let Some(c) = self.cache.get(&roce.len()) {
            return Some(*c);
        }
        let IpParams::V4 {
            src,
            dst,
            dont_fragment,
            ..
        } = p0.ip
        else {
            return None;
        };
        let mut b = Basis {
            rows: [(0, 0); 16],
            rank: 0,
        };
        let mut cols = [0u32; 16];
        for (i, c) in cols.iter_mut().enumerate() {
            let p = IcrcParams {
                ip: IpParams::V4 {
                    src,
                    dst,
                    id: 1 << i,
                    dont_fragment,
                },
                ..*p0
            };
            let col = p.compute(roce).ok()? ^ base;
            *c = col;
            let (v, ids) = b.reduce(col, 1 << i);
            if v != 0 && b.rank < 16 {
                b.rows[b.rank] = (v, ids);
                b.rank += 1;
            }
        }
        if self.cache.len() >= MAX_CACHED_LENGTHS {
            self.cache.clear();
        }
        let c = Columns::new(cols, b);
        self.cache.insert(roce.len(), c);
        Some(c)
    }
}

/// Verifies the ICRC of `roce` (BTH … ICRC) received on `local` from `peer`. Returns
/// the parameters it verified under (with the recovered IPv4 ID) and the path taken, or
/// `None` when no ID makes it match (or the address families differ).
pub fn verify(
    solver: &mut IdSolver,
    local: SocketAddr,
    peer: SocketAddr,
    roce: &[u8],
) -> Option<(IcrcParams, IcrcPath)> {
    verify_segment(solver, local, peer, roce, 0)
}

/// [`verify`] for the datagram at `position` (0, 1, …) in a GRO buffer: after ID 0 it
/// tries ID `position` with a full check, since the kernel numbers a GSO send's
/// segments 0, 1, 2, … (`udp.rs`) and loopback hands such a send to a GRO socket whole.
/// Where that guess is wrong (GRO on a real link merged other sends, or a peer numbers
/// differently) the ID is solved as by [`verify`].
pub fn verify_segment(
    solver: &mut IdSolver,
    local: SocketAddr,
    peer: SocketAddr,
    roce: &[u8],
    position: usize,
) -> Option<(IcrcParams, IcrcPath)> {
    let from = solver.sender(local, peer)?;
    solver.verify_from(&from, roce, position)
}

/// What [`verify_segment`] looks up per sender — its ID-0 parameters and their prepared
/// form, compared field by field in the [`PreparedCache`] — made once for all the
/// datagrams of one GRO buffer, which come from one sender (the receive side of
/// [`IdSolver::fill_run`], which makes the same look-ups once per GSO run; issue 12: per
/// datagram these look-ups were ≈ 2–3 % of a 64 KiB WRITE receiver's samples beside the
/// CRC itself). A new sender is prepared on its second buffer, as
/// [`PreparedCache::get`] prepares on its second ask.
#[derive(Debug, Clone, Copy)]
pub struct Sender {
    p0: IcrcParams,
    prep: Option<PreparedIcrc>,
}

impl Sender {
    /// The ICRC of `roce` under ID 0: through the prepared form when there is one (with
    /// the payload combined in by its `digest` if given), else hashed in full.
    fn id0_icrc(&self, roce: &[u8], digest: Option<PayloadDigest>) -> wire::Result<u32> {
        match (&self.prep, digest) {
            (Some(prep), Some(d)) => prep.compute_with_payload(roce, d.range(), d.crc),
            (Some(prep), None) => prep.compute(roce),
            (None, _) => self.p0.compute(roce),
        }
    }
}

impl IdSolver {
    /// The look-ups for datagrams from `peer` to `local`; `None` when the address
    /// families differ (no ICRC can match).
    pub fn sender(&mut self, local: SocketAddr, peer: SocketAddr) -> Option<Sender> {
        Some(self.flow(params(local, peer, 0)?))
    }

    /// The per-peer look-ups for the ID-0 parameters `p0`.
    fn flow(&mut self, p0: IcrcParams) -> Sender {
        Sender {
            p0,
            prep: self.prepared.get(&p0),
        }
    }

    /// [`verify_segment`] for a datagram from `from` (the steps of the module docs).
    pub fn verify_from(
        &mut self,
        from: &Sender,
        roce: &[u8],
        position: usize,
    ) -> Option<(IcrcParams, IcrcPath)> {
        self.verify_with(from, roce, position, None)
    }

    /// [`IdSolver::verify_from`] with the payload's CRC already known (`digest`: the
    /// receiver's single pass hashed it as it placed it, `rx_place.rs`): the prepared
    /// path hashes the headers and the pad only and combines the payload in, as the
    /// send path's fill does. The same steps, paths and answers; without a prepared
    /// form for the sender the datagram is hashed in full.
    pub fn verify_with(
        &mut self,
        from: &Sender,
        roce: &[u8],
        position: usize,
        digest: Option<PayloadDigest>,
    ) -> Option<(IcrcParams, IcrcPath)> {
        let p0 = &from.p0;
        let tail = roce.len().checked_sub(wire::ICRC_LEN)?;
        let carried = u32::from_le_bytes(roce.get(tail..)?.try_into().ok()?);
        let base = from.id0_icrc(roce, digest).ok()?;
        if base == carried {
            let path = match p0.ip {
                IpParams::V4 { .. } => IcrcPath::Ipv4Id0,
                IpParams::V6 { .. } => IcrcPath::Ipv6,
            };
            return Some((*p0, path));
        }
        if let IpParams::V4 { .. } = p0.ip {
            // The non-zero ID under which the ICRC matches: the datagram's position if
            // it does (a full 32-bit check), else the ID solved from the difference (16
            // bits).
            let c = self.columns(p0, roce, base)?;
            let diff = base ^ carried;
            let (id, path) = match u16::try_from(position).ok().filter(|&g| g != 0) {
                Some(g) if c.of(g) == diff => (g, IcrcPath::Ipv4Segment),
                _ => match c.basis.reduce(diff, 0) {
                    (0, id) => (id, IcrcPath::Ipv4Solved),
                    _ => return None,
                },
            };
            return Some((with_id(p0, id), path));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet() -> Vec<u8> {
        // BTH (SEND Only, QP 0x11, PSN 1) + 8 payload bytes + ICRC slot.
        let mut v = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 0, 1];
        v.extend_from_slice(b"12345678");
        v.extend_from_slice(&[0; 4]);
        v
    }

    fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "127.0.0.3:4791".parse().unwrap(),
            "127.0.0.2:49441".parse().unwrap(),
        )
    }

    #[test]
    fn id0_is_tried_first_and_solved_ids_are_recovered() {
        let (local, peer) = addrs();
        for id in [0u16, 1, 0x15e9, 0xFFFF] {
            let mut pkt = packet();
            params(local, peer, id).unwrap().fill(&mut pkt).unwrap();
            let (p, path) = verify(&mut IdSolver::new(), local, peer, &pkt).unwrap();
            let IpParams::V4 { id: got, .. } = p.ip else {
                panic!()
            };
            assert_eq!(got, id);
            let want = if id == 0 {
                IcrcPath::Ipv4Id0
            } else {
                IcrcPath::Ipv4Solved
            };
            assert_eq!(path, want);
        }
    }

    /// The tabled column sums of a GSO run's segment IDs (and the loop above them)
    /// are what the ID does to the ICRC, computed in full by wire for each ID.
    #[test]
    fn segment_id_columns_equal_the_full_icrc_difference() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        for len in [0usize, 5, 4096] {
            let mut pkt = packet();
            pkt.splice(12..12, (0..len).map(|i| (i * 31 + 3) as u8));
            let p0 = params(local, peer, 0).unwrap();
            let base = p0.compute(&pkt).unwrap();
            let c = *solver.columns(&p0, &pkt, base).unwrap();
            for id in (0u16..70).chain([0x100, 0x8001, 0xFFFF]) {
                let want = params(local, peer, id).unwrap().compute(&pkt).unwrap() ^ base;
                assert_eq!(c.of(id), want, "len {len} id {id}");
                assert_eq!(c.of_bits(id), want, "len {len} id {id}");
            }
        }
    }

    #[test]
    fn cached_solver_agrees_with_wire_for_many_ids_and_lengths() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        for len in [0usize, 3, 64, 1000] {
            for id in [1u16, 2, 3, 0x8000, 0x1234, 0xFFFF] {
                let mut pkt = packet();
                pkt.splice(12..12, std::iter::repeat_n(0xAB, len));
                let p = params(local, peer, id).unwrap();
                p.fill(&mut pkt).unwrap();
                let from_wire = wire::icrc::solve_ipv4_id(&p, &pkt).unwrap();
                let (got, path) = verify(&mut solver, local, peer, &pkt).unwrap();
                assert_eq!(path, IcrcPath::Ipv4Solved);
                assert_eq!(got.ip, params(local, peer, from_wire).unwrap().ip);
                assert_eq!(from_wire, id);
            }
        }
    }

    /// A GRO buffer's datagrams are verified through one look-up of their sender: each
    /// as `verify_segment` verifies it (path and recovered ID), a flipped bit rejects
    /// its own datagram only, the sender is prepared on its second buffer, and the
    /// look-ups of another sender (port) or address family match nothing.
    #[test]
    fn a_gro_buffer_is_verified_through_one_sender_look_up() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        let mut seg = packet();
        seg.resize(12 + 1024 + 4, 0x5A);
        let run: Vec<Vec<u8>> = (0u16..16)
            .map(|k| {
                let mut s = seg.clone();
                s[20] = k as u8; // payload differs per segment
                params(local, peer, k).unwrap().fill(&mut s).unwrap();
                s
            })
            .collect();
        for buffer in 0..2 {
            let from = solver.sender(local, peer).unwrap();
            assert_eq!(
                from.prep.is_some(),
                buffer == 1,
                "prepared on the second buffer"
            );
            for (k, s) in run.iter().enumerate() {
                let got = solver.verify_from(&from, s, k).unwrap();
                let want = verify_segment(&mut IdSolver::new(), local, peer, s, k).unwrap();
                assert_eq!(got, want, "segment {k}");
                assert_eq!(got.0, params(local, peer, k as u16).unwrap());
                let path = if k == 0 {
                    IcrcPath::Ipv4Id0
                } else {
                    IcrcPath::Ipv4Segment
                };
                assert_eq!(got.1, path, "segment {k}");
                let mut bad = s.clone();
                bad[30] ^= 0x10;
                assert!(solver.verify_from(&from, &bad, k).is_none(), "flip in {k}");
            }
        }
        let other: SocketAddr = "127.0.0.2:49442".parse().unwrap();
        let from = solver.sender(local, other).unwrap();
        assert!(run
            .iter()
            .enumerate()
            .all(|(k, s)| solver.verify_from(&from, s, k).is_none()));
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        assert!(solver.sender(local, v6).is_none());
    }

    /// With the payload's CRC known (the receiver's single pass) every datagram gets
    /// the answer it gets hashed in full — ID 0, segment ID, solved — and a wrong CRC,
    /// or a flipped payload bit under the right one, is rejected once the sender is
    /// prepared (its second buffer).
    #[test]
    fn a_known_payload_crc_gives_the_same_answers() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        let mut seg = packet();
        seg.resize(12 + 1024 + 4, 0x3C);
        for buffer in 0..2 {
            let from = solver.sender(local, peer).unwrap();
            for (k, id) in [(0usize, 0u16), (3, 3), (5, 0x15e9)] {
                let mut s = seg.clone();
                s[40] = k as u8;
                params(local, peer, id).unwrap().fill(&mut s).unwrap();
                let crc = softnic_transport::crc::update(0, &s[12..12 + 1024]);
                let d = |c| PayloadDigest::at(12, 1024, c);
                let want = solver.verify_from(&from, &s, k);
                assert!(want.is_some());
                assert_eq!(solver.verify_with(&from, &s, k, d(crc)), want, "{k}");
                let mut bad = s.clone();
                bad[100] ^= 1;
                assert!(solver.verify_with(&from, &bad, k, d(crc ^ 1)).is_none());
                if buffer == 1 {
                    // Prepared: the digest is used, not the bytes.
                    assert!(solver.verify_with(&from, &s, k, d(crc ^ 1)).is_none());
                    assert!(solver.verify_with(&from, &bad, k, d(crc)).is_some());
                }
            }
        }
    }

    /// Segment k of a GSO send carries ID k: at position k it matches with the full
    /// check; at another position (or an ID a GSO send would not give) it is solved.
    #[test]
    fn the_position_in_a_gro_buffer_is_tried_as_the_id() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        for (id, position, want) in [
            (0u16, 0usize, IcrcPath::Ipv4Id0),
            (0, 5, IcrcPath::Ipv4Id0),
            (1, 1, IcrcPath::Ipv4Segment),
            (15, 15, IcrcPath::Ipv4Segment),
            (7, 7, IcrcPath::Ipv4Segment),
            (7, 6, IcrcPath::Ipv4Solved),
            (7, 0, IcrcPath::Ipv4Solved),
            (0x15e9, 3, IcrcPath::Ipv4Solved),
            (3, 0x10003, IcrcPath::Ipv4Solved),
        ] {
            let mut pkt = packet();
            params(local, peer, id).unwrap().fill(&mut pkt).unwrap();
            let (p, path) = verify_segment(&mut solver, local, peer, &pkt, position).unwrap();
            assert_eq!(p, params(local, peer, id).unwrap(), "id {id} at {position}");
            assert_eq!(path, want, "id {id} at {position}");
        }
    }

    /// The send path's fill of segment k (ID k) of a GSO run: the ICRC under ID k, to
    /// the bit, made from the peer's one ID-0 entry in the cache — not an entry per
    /// position, which would take most of the 64 slots for one run of 64.
    #[test]
    fn a_gso_run_is_filled_through_one_cache_entry_per_peer() {
        let (local, peer) = addrs();
        let mut solver = IdSolver::new();
        for payload in [8usize, 1024] {
            let mut pkt = packet();
            pkt.resize(12 + payload + 4, 0xA5);
            for round in 0..2 {
                for id in (0u16..64).chain([0x100, 0x8000, 0xFFFF]) {
                    let p = params(local, peer, id).unwrap();
                    let mut want = pkt.clone();
                    p.fill(&mut want).unwrap();
                    solver.fill(&p, &mut pkt, None).unwrap();
                    assert_eq!(pkt, want, "payload {payload} round {round} id {id}");
                }
            }
        }
        let entries = solver.prepared.slots.iter().filter(|s| s.entry.is_some());
        assert_eq!(entries.count(), 1, "one prepared entry: the peer's, ID 0");
    }

    /// A run filled at once matches each segment filled on its own under its ID, for
    /// the peer's first run (unprepared), its second (prepared there) and later ones,
    /// with a shorter last segment, and over IPv6 (no ID).
    #[test]
    fn a_run_is_filled_as_its_segments_one_by_one() {
        let (local, peer) = addrs();
        let v6: (SocketAddr, SocketAddr) = (
            "[::1]:4791".parse().unwrap(),
            "[::1]:49441".parse().unwrap(),
        );
        for (local, peer) in [(local, peer), v6] {
            let mut solver = IdSolver::new();
            for (round, (seg, n, last)) in
                [(60, 5, 60), (60, 5, 40), (1040, 17, 1040), (1040, 3, 20)]
                    .into_iter()
                    .enumerate()
            {
                let mut pkt = packet();
                pkt.resize(seg, 0);
                let mut run = Vec::new();
                for k in 0..n {
                    let mut p = pkt.clone();
                    p[11] = k as u8; // another PSN per segment
                    p[12..seg - 4].fill(k as u8 ^ 0x5A);
                    run.extend_from_slice(&p);
                }
                run.truncate((n - 1) * seg + last);
                let mut want = run.clone();
                for (k, s) in want.chunks_mut(seg).enumerate() {
                    params(peer, local, k as u16).unwrap().fill(s).unwrap();
                }
                let p = params(peer, local, 0).unwrap();
                // Payload digests for every segment but the second (hashed in full):
                // the payload from byte 16 to 5 before the end (a pad byte follows),
                // none where that is empty.
                let digest = |s: &[u8], flip: u32| {
                    let end = s.len().checked_sub(5).filter(|&e| e > 16)?;
                    let crc = softnic_transport::crc::update(0, &s[16..end]);
                    PayloadDigest::at(16, end - 16, crc ^ flip)
                };
                let digests = |run: &[u8], flip| -> Vec<Option<PayloadDigest>> {
                    let d = run.chunks(seg).map(|s| digest(s, flip));
                    d.enumerate().map(|(k, d)| d.filter(|_| k != 1)).collect()
                };
                let (good, bad) = (digests(&run, 0), digests(&run, 1));
                let mut with_bad = run.clone();
                let mut with_digests = run.clone();
                solver
                    .fill_run(&p, &mut run, seg, |k| k as u16, &[])
                    .unwrap();
                assert_eq!(run, want, "{local} round {round}");
                solver
                    .fill_run(&p, &mut with_digests, seg, |k| k as u16, &good)
                    .unwrap();
                assert_eq!(with_digests, want, "{local} round {round}, digests");
                // The digests are used (the peer is prepared after its first run): a
                // wrong one gives a wrong ICRC.
                solver
                    .fill_run(&p, &mut with_bad, seg, |k| k as u16, &bad)
                    .unwrap();
                assert_eq!(with_bad[..seg - 4], want[..seg - 4]);
                assert_ne!(with_bad[..seg], want[..seg], "{local} round {round}");
            }
        }
    }

    #[test]
    fn single_bit_flips_are_rejected() {
        let (local, peer) = addrs();
        // ID 0, and ID 3 as the fourth segment of a GRO buffer.
        for (id, position) in [(0u16, 0usize), (3, 3)] {
            let mut pkt = packet();
            params(local, peer, id).unwrap().fill(&mut pkt).unwrap();
            let mut accepted = 0;
            for bit in 0..pkt.len() * 8 {
                if bit / 8 == 4 {
                    // BTH byte 4 (FECN, BECN, reserved) is masked out of the ICRC by design.
                    continue;
                }
                let mut p = pkt.clone();
                p[bit / 8] ^= 1 << (bit % 8);
                if verify_segment(&mut IdSolver::new(), local, peer, &p, position).is_some() {
                    accepted += 1;
                }
            }
            assert_eq!(accepted, 0, "id {id}");
        }
    }

    #[test]
    fn prepared_cache_agrees_with_the_parameters_and_survives_collisions() {
        let local: SocketAddr = "127.0.0.3:4791".parse().unwrap();
        let mut cache = PreparedCache::default();
        let mut pkt = packet();
        // More peers than slots, twice over: every answer must be that peer's ICRC.
        for round in 0..2 {
            for port in 0..(3 * PREPARED_SLOTS as u16) {
                let peer = SocketAddr::new([127, 0, 0, 2].into(), 40000 + port);
                let p = params(local, peer, 0).unwrap();
                p.fill(&mut pkt).unwrap();
                // Twice: the first is hashed unprepared, the second prepares.
                for _ in 0..2 {
                    assert_eq!(
                        cache.compute(&p, &pkt).unwrap(),
                        p.compute(&pkt).unwrap(),
                        "round {round} port {port}"
                    );
                }
            }
        }
    }

    /// The slot of the last hit is asked first; it answers only for the parameters it
    /// holds now, also after another peer took it over.
    #[test]
    fn the_recent_slot_answers_only_for_its_own_parameters() {
        let local: SocketAddr = "127.0.0.3:4791".parse().unwrap();
        let peer = |port| params(local, SocketAddr::new([127, 0, 0, 2].into(), port), 0).unwrap();
        let (a, b) = (peer(1000), peer(1001));
        let mut cache = PreparedCache::default();
        for p in [a, a, b, b] {
            cache.get(&p);
        }
        for p in [a, b, a, a, b] {
            assert_eq!(cache.get(&p), Some(p.prepare()));
        }
        // c lands in a's slot; a was the last hit, c takes the slot over.
        let c = (2000..u16::MAX)
            .map(peer)
            .find(|c| PreparedCache::index(c) == PreparedCache::index(&a))
            .expect("a colliding port");
        assert_eq!(cache.get(&a), Some(a.prepare()));
        assert_eq!(cache.get(&c), None, "c's first sight");
        assert_eq!(cache.get(&c), Some(c.prepare()), "c takes a's slot");
        assert_eq!(cache.get(&a), None, "a was evicted: never c's answer");
        assert_eq!(cache.get(&c), Some(c.prepare()));
    }

    #[test]
    fn prepared_cache_prepares_on_the_second_packet_only() {
        let local: SocketAddr = "127.0.0.3:4791".parse().unwrap();
        let a = params(local, "127.0.0.2:1000".parse().unwrap(), 0).unwrap();
        let mut cache = PreparedCache::default();
        assert_eq!(cache.get(&a), None, "first sight: unprepared");
        assert_eq!(cache.get(&a), Some(a.prepare()), "second: prepared");
        assert_eq!(cache.get(&a), Some(a.prepare()), "then a hit");
        // A sender that never repeats (in a's slot or elsewhere) never prepares and
        // never evicts a.
        for port in 2000..4000u16 {
            let q = params(local, SocketAddr::new([127, 0, 0, 9].into(), port), 0).unwrap();
            assert_eq!(cache.get(&q), None);
        }
        assert_eq!(cache.get(&a), Some(a.prepare()), "a kept its slot");
        // A sender that repeats itself in a's slot takes it over.
        let mut port = 1001u16;
        let b = loop {
            let q = params(local, SocketAddr::new([127, 0, 0, 2].into(), port), 0).unwrap();
            if PreparedCache::index(&q) == PreparedCache::index(&a) {
                break q;
            }
            port += 1;
        };
        assert_eq!(cache.get(&b), None);
        assert_eq!(cache.get(&b), Some(b.prepare()));
        assert_eq!(cache.get(&a), None, "a evicted, back to unprepared");
    }

    #[test]
    fn wrong_port_or_address_fails() {
        let (local, peer) = addrs();
        let mut pkt = packet();
        params(local, peer, 0).unwrap().fill(&mut pkt).unwrap();
        let other: SocketAddr = "127.0.0.2:49442".parse().unwrap();
        assert!(verify(&mut IdSolver::new(), local, other, &pkt).is_none());
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        assert!(verify(&mut IdSolver::new(), local, v6, &pkt).is_none());
    }

    #[test]
    fn ipv6_full_check() {
        let local: SocketAddr = "[::1]:4791".parse().unwrap();
        let peer: SocketAddr = "[::1]:4792".parse().unwrap();
        let mut pkt = packet();
        params(local, peer, 0).unwrap().fill(&mut pkt).unwrap();
        assert_eq!(
            verify(&mut IdSolver::new(), local, peer, &pkt).unwrap().1,
            IcrcPath::Ipv6
        );
        pkt[13] ^= 4;
        assert!(verify(&mut IdSolver::new(), local, peer, &pkt).is_none());
    }
}
