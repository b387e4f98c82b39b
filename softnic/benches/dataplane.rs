//! softnic's own cost per message, without sockets: two RC QPs in one process, each
//! message going client SQ ring → WQE check and conversion (`nic::wqe`) → transport →
//! GSO runs as the NIC builds them, each run's ICRCs filled with one look-up of the
//! peer (the NIC's prepared path, segment k under IPv4 ID k) → each run received as
//! one GRO buffer → parse → the receiver's single pass where the transport allows it
//! (`nic::rx_place`: payload written and hashed at once) → ICRC check at the
//! datagram's position (`IdSolver::verify_with`, as on receive) → transport, the ACKs
//! the same way back, then the completion as a CQE through the CQ ring to the client.
//! No kernel, no threads, no sleeping.
//!
//! The rings are the real shared-memory rings (`verbs_api::abi::ring`, in an anonymous
//! mapping), used as the client library and the NIC use them: the client pushes a batch
//! of WQEs and publishes once; the NIC pops and releases them, publishes the CQEs of a
//! batch at once; the client polls the CQ. Memory is the NIC's own: each side's
//! `MrTable` with one region over a client memfd, as a registered MR. What this does
//! **not** include: the runtime's per-iteration bookkeeping (its loop over QPs, timers,
//! wake-ups) and the sockets. So it is the NIC's code cost per message on its data
//! path, a lower bound of the whole NIC's.
//!
//! ```text
//! cargo bench -p softnic --bench dataplane            # ns per 8 B WRITE, GB/s at 64 KiB
//! cargo bench -p softnic --bench dataplane -- small   # only the 8 B figure (or `big`)
//! cargo bench -p softnic --bench dataplane -- inline  # only the 8 B figure, IBV_SEND_INLINE
//! cargo bench -p softnic --bench dataplane -- floor   # only the 64 KiB data-work floor
//! cargo bench -p softnic --bench dataplane -- big nofloor  # the 64 KiB figure alone
//! cargo bench -p softnic --bench dataplane -- reused  # 64 KiB, perftest's memory layout
//! cargo bench -p softnic --bench dataplane -- small big reused  # tests/perf/run's figures
//! ```
//! Beside the 64 KiB figure it measures its floor in the same run ([`floor`]): the
//! copies and ICRC passes a 4 KiB packet needs, with nothing else, and prints the
//! NIC's figure as a share of it (`dataplane_write_64k_of_floor`); the same floor
//! with the sender's single pass (`*_floor_fused_*`); and with both sides' single
//! passes (`*_floor_single_pass_*`), the data work of today's send and receive paths.
//! The 64 KiB figure sends message i of each batch of 16 from, and writes it to, offset
//! 64 KiB × i of a 1 MiB region per side; `reused` measures the same with every message
//! at offset 0 of both (`dataplane_write_64k_reused_*`), as perftest's `write_bw` and
//! `softnic perf` use their buffers: 2 × 64 KiB stay in L2 where 2 × 1 MiB may not
//! (on session 13's Intel Xeon, 2 MiB of L2, the two differ by ≈ 30 %: docs/perf.md);
//! with the floor in the same run, also as a share of the single-pass floor
//! (`dataplane_write_64k_reused_of_floor_single_pass`, the floor's memory spread).
//! Prints `key value` lines: the best of 7 rounds of the thread's **CPU time**
//! (`CLOCK_THREAD_CPUTIME_ID`, up to date at each read: `common/cpu.rs`), so time the
//! thread spends descheduled on a shared machine does not count, and the same in
//! wall-clock time (`*_wall`). Each round runs for ≥ 0.2 s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant as WallClock;

#[path = "common/cpu.rs"]
mod cpu;
use cpu::thread_cpu_ns;

use memmap2::{MmapMut, MmapRaw};
use softnic::nic::counters::NicCounters;
use softnic::nic::cq::cqe_of;
use softnic::nic::memory::MrTable;
use softnic::nic::runtime::tx_params;
use softnic::nic::rx_icrc::{self, IdSolver};
use softnic::nic::rx_place;
use softnic::nic::udp::{PhasedBuf, BUF_PHASE, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
use softnic::nic::wqe;
use softnic_transport::memory::{Access, Memory};
use softnic_transport::qp::{PayloadDigest, Qp, QpCaps, QpType};
use softnic_transport::testing::{connect_qp, PairConfig};
use softnic_transport::time::Instant;
use softnic_transport::wr;
use std::os::fd::AsFd;
use verbs_api::abi::layout::ring_bytes;
use verbs_api::abi::slots::{send_flags, wc_status, wr_opcode};
use verbs_api::abi::{Consumer, Cqe, Producer, Ring, SendWqe, Sge, Slot};
use wire::PacketRepr;

const REGION: u64 = 0x10_0000;

/// Send queue and CQ depth.
const DEPTH: u32 = 1024;

/// One side: a QP, its memory, its address, its ICRC state and its receive counters.
struct Side {
    qp: Qp,
    caps: QpCaps,
    /// The NIC's region table, holding one region over a client memfd, mapped as the
    /// NIC maps a client's MR (`MrTable::register`): the same look-ups, bounds checks
    /// and fused copies through raw pointers as the NIC's data path.
    mem: MrTable,
    addr: SocketAddr,
    solver: IdSolver,
    lkey: u32,
    rkey: u32,
    counters: NicCounters,
}

/// The protection domain of both QPs and their regions.
const PD: u32 = 1;

impl Side {
    /// The region's first `len` bytes, read as a local access (the client's view).
    fn bytes(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let read = self.mem.read_local(PD, self.lkey, REGION, &mut v);
        read.expect("region readable");
        v
    }
}

/// The two ends of one ring in one anonymous mapping: (client's end, NIC's end) or
/// (NIC's, client's), as `T` flows.
fn ring<T: Slot>(cap: u32) -> (Producer<T>, Consumer<T>) {
    let len = ring_bytes::<T>(cap).expect("ring size");
    let map = Arc::new(MmapRaw::from(MmapMut::map_anon(len).expect("mmap")));
    let p = Ring::<T>::new(map.clone(), 0, cap).expect("ring");
    p.init();
    let c = Ring::<T>::new(map, 0, cap).expect("ring");
    c.check_header().expect("header");
    (p.into_producer(), c.into_consumer())
}

/// The client's SQ and CQ rings of the sending QP, both ends of each.
struct Rings {
    sq_client: Producer<SendWqe>,
    sq_nic: Consumer<SendWqe>,
    cq_nic: Producer<Cqe>,
    cq_client: Consumer<Cqe>,
}

impl Rings {
    fn new() -> Rings {
        let (sq_client, sq_nic) = ring::<SendWqe>(DEPTH);
        let (cq_nic, cq_client) = ring::<Cqe>(DEPTH);
        Rings {
            sq_client,
            sq_nic,
            cq_nic,
            cq_client,
        }
    }

    /// The NIC's side: takes every WQE from the SQ ring into the QP, as
    /// `rings.rs` does.
    fn drain(&mut self, s: &mut Side) {
        let mut w = SendWqe::default();
        while self.sq_nic.pop_into(&mut w).expect("ring") {
            let wr = wqe::send_wr(&w, QpType::Rc, &s.caps, s.addr).expect("valid WQE");
            s.qp.post_send(wr).expect("post");
        }
    }

    /// The NIC's side: the QP's completions into the CQ ring, published once; the
    /// SQ slots of completed WQEs go back to the client, as `rings.rs` does.
    fn complete(&mut self, s: &mut Side) {
        let mut any = false;
        while let Some(c) = s.qp.poll_completion() {
            self.cq_nic
                .push(&cqe_of(&c, s.qp.qpn(), 0))
                .expect("CQ room");
            any = true;
        }
        if any {
            self.sq_nic.release_except(s.qp.send_queue_len() as u32);
            self.cq_nic.publish();
        }
    }
}

/// The transmit buffer of `runtime.rs`'s GSO send path: room for a full run at a
/// stride of `TX_SLOT` bytes, placed in memory as the NIC places it (`BUF_PHASE`), and
/// each packet's payload digest by position in its run.
struct TxBuf {
    buf: PhasedBuf,
    digests: [Option<PayloadDigest>; GSO_MAX_SEGMENTS],
}

/// `runtime.rs`'s `TX_SLOT` (the room one `poll_transmit` gets) and `RUN_ROOM`.
const TX_SLOT: usize = 4096 + 512;
const RUN_ROOM: usize = GSO_MAX_BYTES + TX_SLOT;

impl TxBuf {
    fn new() -> TxBuf {
        TxBuf {
            buf: PhasedBuf::new(TX_SLOT * GSO_MAX_SEGMENTS, BUF_PHASE),
            digests: [None; GSO_MAX_SEGMENTS],
        }
    }
}

/// Moves every packet `from` wants to send now into `to`, the way the two NICs'
/// runtimes would with UDP GSO and GRO (loopback): packets are gathered into runs by
/// the rules of `runtime.rs`'s `transmit_segments` — consecutive packets of the first
/// one's length (a shorter one ends the run), at most [`GSO_MAX_SEGMENTS`] and
/// [`GSO_MAX_BYTES`] — and each run is one [`deliver`]. Returns how many packets.
fn hop(from: &mut Side, to: &mut Side, now: Instant, tx: &mut TxBuf) -> usize {
    let mut n = 0;
    // The run being built: `k` packets from `base` at a stride of `seg`, the last `last`.
    let (mut base, mut k, mut seg, mut last, mut closed) = (0, 0, 0, 0, false);
    loop {
        let off = base + k * seg;
        let full = k >= GSO_MAX_SEGMENTS || off - base + seg > GSO_MAX_BYTES;
        if k > 0 && (closed || full || off + TX_SLOT > tx.buf.len()) {
            let run = &mut tx.buf[base..base + (k - 1) * seg + last];
            n += deliver(from, to, now, (run, seg), &tx.digests[..k]);
            (base, k) = (0, 0);
            continue;
        }
        // Read in place, as `transmit_segments` does (its note: copied out of the
        // `Option`, the `SocketAddr` is a store-forwarding stall per packet).
        let slot = &mut tx.buf[off..off + TX_SLOT];
        let polled = from.qp.poll_transmit(now, slot, &from.mem);
        let Some(t) = polled.as_ref() else {
            break;
        };
        assert_eq!(t.dest, to.addr);
        if k > 0 && t.len > seg {
            // Does not fit: the run goes, this packet starts the next one where it lies
            // (or at the buffer's start when a whole run would not fit behind it).
            let run = &mut tx.buf[base..base + (k - 1) * seg + last];
            n += deliver(from, to, now, (run, seg), &tx.digests[..k]);
            (base, k) = (off, 0);
            if off + RUN_ROOM > tx.buf.len() {
                tx.buf.copy_within(off..off + t.len, 0);
                base = 0;
            }
        }
        if k == 0 {
            (seg, closed) = (t.len, false);
        } else {
            closed = t.len < seg;
        }
        tx.digests[k] = t.digest;
        k += 1;
        last = t.len;
    }
    if k > 0 {
        let run = &mut tx.buf[base..base + (k - 1) * seg + last];
        n += deliver(from, to, now, (run, seg), &tx.digests[..k]);
    }
    n
}

/// One GSO run from `from` to `to`: its ICRCs filled as `runtime.rs`'s `transmit_run`
/// fills them (the sender's look-ups once per run, segment k under IPv4 ID k, each
/// payload combined in from its digest), then received as one GRO buffer as `receive`
/// and `rx_one` take it (the sender's look-ups once per buffer; each datagram parsed
/// once, placed where the transport allows, checked at its position, handled).
fn deliver(
    from: &mut Side,
    to: &mut Side,
    now: Instant,
    (run, seg): (&mut [u8], usize),
    digests: &[Option<PayloadDigest>],
) -> usize {
    let params = tx_params(from.addr, to.addr, 0).expect("same family");
    let id = |k: usize| k as u16;
    let filled = from.solver.fill_run(&params, run, seg, id, digests);
    filled.expect("ICRC fill");
    let from_s = to.solver.sender(to.addr, from.addr).expect("same family");
    let mut n = 0;
    for (k, pkt) in run.chunks(seg).enumerate() {
        // Parsed once (borrowed: moving it out of the `Result` is a memcpy).
        let parsed = PacketRepr::parse(pkt);
        let parsed = parsed.as_ref().expect("parses");
        let placed = rx_place::place(&to.qp, parsed, &mut to.mem);
        // Two calls, as `rx_one` makes them (its note on `verify_from`).
        let verified = match placed {
            None => to.solver.verify_from(&from_s, pkt, k),
            Some(s) => to.solver.verify_with(&from_s, pkt, k, Some(s.digest)),
        };
        verified.expect("ICRC verifies");
        let c = &mut to.counters;
        rx_place::handle(placed.as_ref(), &mut to.mem, parsed.payload, c, |m| {
            to.qp.handle_packet(now, from.addr, parsed, m)
        });
        n += 1;
    }
    n
}

/// A's and B's addresses.
fn addrs() -> (SocketAddr, SocketAddr) {
    (
        "127.0.0.1:4791".parse().expect("addr"),
        "127.0.0.2:4791".parse().expect("addr"),
    )
}

fn pair(msg: usize, depth: usize) -> (Side, Side) {
    let cfg = PairConfig {
        mtu: 4096,
        caps: QpCaps {
            max_send_wr: DEPTH,
            max_recv_wr: 16,
            max_sge: 1,
            max_inline: wr::MAX_INLINE as u32,
        },
        ..PairConfig::default()
    };
    let (aa, ba) = addrs();
    let side = |qpn, peer_qpn, addr, peer, rq, sq| {
        let mut qp = Qp::new(qpn, QpType::Rc, PD, cfg.caps);
        connect_qp(&mut qp, &cfg, peer_qpn, peer, rq, sq);
        qp.set_port_mtu(cfg.mtu);
        qp.set_local_addr(addr);
        let len = msg * depth;
        let fd = verbs_api::os::memfd("dataplane", len).expect("memfd");
        let mut mem = MrTable::new();
        let (_, lkey, rkey) = mem
            .register(1, PD, fd.as_fd(), len, len as u64, Access::ALL.0, REGION)
            .expect("register");
        // The client's data: a pattern, so that "data landed" compares bytes.
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let wrote = mem.write_local(PD, lkey, REGION, &pattern);
        wrote.expect("region writable");
        Side {
            qp,
            caps: cfg.caps,
            mem,
            addr,
            solver: IdSolver::new(),
            lkey,
            rkey,
            counters: NicCounters::default(),
        }
    };
    let a = side(0x11, 0x22, aa, ba, 5000, 100);
    let b = side(0x22, 0x11, ba, aa, 100, 5000);
    (a, b)
}

/// Best seconds per message, by CPU time and by wall-clock time.
#[derive(Clone, Copy)]
struct Best {
    cpu: f64,
    wall: f64,
}

/// The best of 7 tries of `round` run `rounds` times, per message (`msgs` per round).
fn best_of_7(rounds: usize, msgs: usize, mut round: impl FnMut()) -> Best {
    let mut best = Best {
        cpu: f64::INFINITY,
        wall: f64::INFINITY,
    };
    for _ in 0..7 {
        let t = WallClock::now();
        let cpu = thread_cpu_ns();
        for _ in 0..rounds {
            round();
        }
        let n = (rounds * msgs) as f64;
        best.wall = best.wall.min(t.elapsed().as_secs_f64() / n);
        best.cpu = best.cpu.min((thread_cpu_ns() - cpu) as f64 * 1e-9 / n);
    }
    best
}

/// Where message `i` of a batch lies in both regions: at `msg · i` (spread over
/// `msg · depth` bytes), or at 0 for every message (`Reused`, perftest's layout).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Spread,
    Reused,
}

/// Runs `rounds` × `depth` WRITEs of `msg` bytes from A to B (the last of each batch
/// signaled, as perftest's `write_bw` does with its CQ moderation); returns the best
/// seconds per message over 7 tries. `inline`: the bytes travel in the WQE
/// (IBV_SEND_INLINE), as perftest's latency tests post every message up to their
/// default 220 bytes (its bandwidth tests, and `softnic perf`'s, send inline only with
/// `-I`).
fn run(msg: usize, depth: usize, rounds: usize, inline: bool, layout: Layout) -> Best {
    let at = |i: usize| if layout == Layout::Reused { 0 } else { i * msg };
    let (mut a, mut b) = pair(msg, depth);
    let mut rings = Rings::new();
    let mut tx = TxBuf::new();
    // What the client's buffer holds (for inline sends, copied by the client).
    let client = a.bytes(msg * depth);
    let now = Instant::ZERO;
    let best = best_of_7(rounds, depth, || {
        // The client: a batch of WQEs, published once.
        for i in 0..depth {
            let mut w = SendWqe {
                wr_id: i as u64,
                opcode: wr_opcode::RDMA_WRITE,
                flags: if i + 1 == depth {
                    send_flags::SIGNALED
                } else {
                    0
                },
                num_sge: 1,
                remote_addr: REGION + at(i) as u64,
                rkey: b.rkey,
                ..SendWqe::default()
            };
            w.sges[0] = Sge {
                addr: REGION + at(i) as u64,
                length: msg as u32,
                lkey: a.lkey,
            };
            if inline {
                w.flags |= send_flags::INLINE;
                w.num_sge = 0;
                w.inline_len = msg as u32;
                let from = &client[at(i)..at(i) + msg];
                w.inline_area_mut()[..msg].copy_from_slice(from);
            }
            rings.sq_client.push(&w).expect("SQ room");
        }
        rings.sq_client.publish();
        // The NICs.
        rings.drain(&mut a);
        let mut done = false;
        for _ in 0..100_000 {
            hop(&mut a, &mut b, now, &mut tx);
            hop(&mut b, &mut a, now, &mut tx);
            rings.complete(&mut a);
            // The client polls its CQ.
            let mut polled = false;
            while let Some(c) = rings.cq_client.pop().expect("CQ ring") {
                assert_eq!(c.status, wc_status::SUCCESS, "{c:?}");
                done = true;
                polled = true;
            }
            if polled {
                rings.cq_client.release();
            }
            if done {
                break;
            }
        }
        assert!(done, "the batch completed");
    });
    let used = at(depth - 1) + msg;
    assert_eq!(a.bytes(used), b.bytes(used), "data landed");
    // A multi-packet WRITE takes the single pass from its second packet on.
    let placed = b.counters.rx_placed_fused;
    assert!(
        msg <= 4096 || placed > 0,
        "the receiver's single pass was taken"
    );
    assert_eq!(b.counters.rx_placed_mismatch, 0);
    best
}

/// The reference for [`run`] at 64 KiB, measured in the same run: only the data work
/// each 4 KiB packet needs, with the same kernels over the same amount of memory —
/// gather copy from A's memory into a packet buffer, ICRC fill (`PreparedIcrc`, as the
/// NIC's prepared path), ICRC check, scatter copy into B's memory — and no NIC at all
/// (no WQE, no headers, no parse, no transport state). `run`'s figure over this one
/// is the share of the time that is data work; what is left is softnic's own
/// per-packet and per-message work.
///
/// `Floor::SendPass`: the sender's single pass (session 9) instead — the gather copy
/// computes the payload's CRC as it copies (`crc::copy_update`, as `MemVec` and the
/// NIC's mappings do) and the fill hashes the BTH only and combines that CRC in
/// (`PreparedIcrc::compute_with_payload`, as `IdSolver::fill_run` does with a digest);
/// the receive side is a full check, then the scatter copy. `Floor::BothPasses`: the
/// receiver's single pass too (session 10) — the scatter copy computes the CRC as it
/// copies and the check combines it in (as `rx_place` and `IdSolver::verify_with`).
fn floor(msg: usize, depth: usize, rounds: usize, kind: Floor) -> Best {
    const MTU: usize = 4096;
    let src: Vec<u8> = (0..msg * depth).map(|i| (i * 7 + 1) as u8).collect();
    let mut dst = vec![0u8; msg * depth];
    let (aa, ba) = addrs();
    let icrc = rx_icrc::params(ba, aa, 0).expect("same family").prepare();
    // A BTH (RDMA WRITE Middle), the payload, the ICRC.
    let head = wire::bth::HEADER_LEN;
    let mut pkt = vec![0u8; head + MTU + wire::ICRC_LEN];
    pkt[0] = 0x07;
    let best = best_of_7(rounds, depth, || {
        let fused = kind != Floor::Copies;
        for (s, d) in src.chunks_exact(MTU).zip(dst.chunks_exact_mut(MTU)) {
            if fused {
                let crc = softnic_transport::crc::copy_update(0, s, &mut pkt[head..head + MTU]);
                let c = icrc.compute_with_payload(&pkt, head..head + MTU, crc);
                let slot = pkt.len() - wire::ICRC_LEN;
                pkt[slot..].copy_from_slice(&c.expect("ICRC fill").to_le_bytes());
            } else {
                pkt[head..head + MTU].copy_from_slice(s);
                icrc.fill(&mut pkt).expect("ICRC fill");
            }
            if kind == Floor::BothPasses {
                let crc = softnic_transport::crc::copy_update(0, &pkt[head..head + MTU], d);
                let c = icrc.compute_with_payload(&pkt, head..head + MTU, crc);
                let slot = pkt.len() - wire::ICRC_LEN;
                assert_eq!(
                    c.ok(),
                    Some(u32::from_le_bytes(pkt[slot..].try_into().unwrap()))
                );
            } else {
                icrc.verify(&pkt).expect("ICRC verifies");
                d.copy_from_slice(&pkt[head..head + MTU]);
            }
        }
    });
    assert_eq!(src, dst, "data landed");
    best
}

/// Which data work [`floor`] measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// Copy, fill, check, copy.
    Copies,
    /// The sender's single pass, then check and copy.
    SendPass,
    /// Both single passes.
    BothPasses,
}

fn main() {
    // `cargo bench` appends `--bench`; `small` or `big` picks one figure (to profile it).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |w: &str| only.is_empty() || only.iter().any(|a| a == w);
    if want("small") {
        let small = run(8, 64, 16_000, false, Layout::Spread);
        println!("dataplane_write_8b_ns {:.1}", small.cpu * 1e9);
        println!("dataplane_write_8b_ns_wall {:.1}", small.wall * 1e9);
    }
    if want("inline") {
        let small = run(8, 64, 16_000, true, Layout::Spread);
        println!("dataplane_write_8b_inline_ns {:.1}", small.cpu * 1e9);
        println!("dataplane_write_8b_inline_ns_wall {:.1}", small.wall * 1e9);
    }
    let gbytes = |b: Best| 65536.0 / b.cpu / 1e9;
    let big = want("big").then(|| run(64 << 10, 16, 3_000, false, Layout::Spread));
    if let Some(big) = big {
        println!("dataplane_write_64k_gbytes_per_s {:.2}", gbytes(big));
        println!(
            "dataplane_write_64k_gbytes_per_s_wall {:.2}",
            65536.0 / big.wall / 1e9
        );
    }
    // Only when asked: not part of the default run (nor of issue 12's figure).
    let reused = only
        .iter()
        .any(|a| a == "reused")
        .then(|| run(64 << 10, 16, 3_000, false, Layout::Reused));
    if let Some(reused) = reused {
        println!(
            "dataplane_write_64k_reused_gbytes_per_s {:.2}",
            gbytes(reused)
        );
        println!(
            "dataplane_write_64k_reused_gbytes_per_s_wall {:.2}",
            65536.0 / reused.wall / 1e9
        );
    }
    let floors = want("floor") || (want("big") && !only.iter().any(|a| a == "nofloor"));
    if floors {
        let f = floor(64 << 10, 16, 3_000, Floor::Copies);
        println!("dataplane_write_64k_floor_gbytes_per_s {:.2}", gbytes(f));
        if let Some(big) = big {
            // The NIC's rate as a share of the data work's alone (1 = no own cost).
            println!("dataplane_write_64k_of_floor {:.3}", f.cpu / big.cpu);
        }
        let f = floor(64 << 10, 16, 3_000, Floor::SendPass);
        println!(
            "dataplane_write_64k_floor_fused_gbytes_per_s {:.2}",
            gbytes(f)
        );
        if let Some(big) = big {
            println!("dataplane_write_64k_of_floor_fused {:.3}", f.cpu / big.cpu);
        }
        let f = floor(64 << 10, 16, 3_000, Floor::BothPasses);
        println!(
            "dataplane_write_64k_floor_single_pass_gbytes_per_s {:.2}",
            gbytes(f)
        );
        if let Some(big) = big {
            println!(
                "dataplane_write_64k_of_floor_single_pass {:.3}",
                f.cpu / big.cpu
            );
        }
        // The floor's memory is spread as `big`'s: `reused` stays in L2 and may pass it.
        if let Some(reused) = reused {
            println!(
                "dataplane_write_64k_reused_of_floor_single_pass {:.3}",
                f.cpu / reused.cpu
            );
        }
    }
}
