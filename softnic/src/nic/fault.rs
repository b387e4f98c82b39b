//! Seeded fault injection on the send path (`--loss --reorder --duplicate --corrupt
//! --delay-us --seed`), so RC reliability (issue 4) can be exercised between real
//! processes on a loopback that never loses anything by itself (this host's kernel has
//! no netem).
//!
//! Every packet the NIC sends is judged with independent draws from one SplitMix64
//! stream, in order:
//! 1. **loss** — the packet is dropped ([`FaultInjector::drops`]);
//! 2. **corrupt** — one uniformly chosen bit of the UDP payload (BTH … ICRC) is
//!    flipped after the ICRC was computed, so the receiver's ICRC check must catch it
//!    ([`FaultInjector::corrupt`]);
//! 3. **duplicate** — the packet is sent twice;
//! 4. **delay / reorder** — each copy is released `--delay-us` later, and a reordered
//!    copy a further 50–500 µs later, so packets sent after it overtake it.
//!
//! Before all of these, `--drop-cm MSG:N` drops the Nth CM MAD of one type (a UD SEND
//! Only to QP1 whose MAD has that attribute ID), so a lost REQ, REP or RTU can be
//! staged exactly once against any peer (IBTA 12.9: the peer's CM must resend).
//!
//! Loss, corruption and `--drop-cm` keep the NIC's GSO send path
//! ([`FaultInjector::fits_runs`]): a packet is judged as it joins a run (a dropped one
//! does not join, its slot is reused) and corrupted after its segment's ICRC is filled,
//! so a lossy NIC sends as a lossless one does, minus the lost packets — measuring
//! goodput under loss against the batched path is then a fair comparison. Duplication,
//! delay and reordering send packets one by one through [`FaultInjector::submit`], which
//! applies all four stages (a held or doubled packet cannot sit in a run sent now).
//!
//! Held packets wait in a bounded queue ordered by release time; when it is full a packet
//! goes out at once (and is counted) rather than being dropped, so the configured loss
//! rate stays the only source of loss. The same seed and the same sequence of
//! submissions give the same decisions. (In a GSO run the loss draws come as packets
//! join and the corruption draws when the run is sent, so with both configured the
//! draws interleave differently from the one-by-one path: same seed, same path, same
//! decisions.)

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::Duration;

use softnic_transport::time::Instant;

use super::config::FaultConfig;
use super::rng::SplitMix64;

/// Most packets held back at once.
pub const MAX_HELD: usize = 8192;

/// Extra hold of a reordered packet: uniform in this range.
const REORDER_MIN: Duration = Duration::from_micros(50);
const REORDER_SPAN_NS: u64 = 450_000;

/// What the injector did, for `softnic stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Packets dropped on purpose.
    pub dropped: u64,
    /// Packets with one bit flipped.
    pub corrupted: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Packets released immediately because the hold queue was full.
    pub queue_full: u64,
}

#[derive(Debug)]
struct Held {
    release: Instant,
    seq: u64,
    dest: SocketAddr,
    tos: u8,
    bytes: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.release, self.seq) == (o.release, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.release, self.seq).cmp(&(o.release, o.seq))
    }
}

/// The fault injector. See the module documentation.
#[derive(Debug)]
pub struct FaultInjector {
    cfg: FaultConfig,
    rng: SplitMix64,
    held: BinaryHeap<Reverse<Held>>,
    /// Recycled packet buffers, so holding packets does not allocate in steady state.
    pool: Vec<Vec<u8>>,
    seq: u64,
    counters: FaultCounters,
    /// CM MADs of `--drop-cm`'s type sent so far.
    cm_seen: u32,
}

/// The CM attribute ID of a RoCEv2 UDP payload (BTH … ICRC) that is a UD SEND Only to
/// QP1 carrying a CM-class MAD (BTH 12, DETH 8, then the MAD header: class at byte 1,
/// attribute ID at bytes 16–17; IBTA 13.4.3), or None.
fn cm_attribute(pkt: &[u8]) -> Option<u16> {
    const UD_SEND_ONLY: u8 = 0x64;
    const CM_CLASS: u8 = 0x07;
    let mad = pkt.get(20..pkt.len().checked_sub(4)?)?;
    let to_qp1 = pkt.get(5..8)? == [0, 0, 1];
    (pkt[0] == UD_SEND_ONLY && to_qp1 && mad.len() >= 24 && mad[1] == CM_CLASS)
        .then(|| u16::from_be_bytes([mad[16], mad[17]]))
}

impl FaultInjector {
    /// An injector for `cfg`.
    pub fn new(cfg: FaultConfig) -> Self {
        FaultInjector {
            cfg,
            rng: SplitMix64::new(cfg.seed),
            held: BinaryHeap::new(),
            pool: Vec::new(),
            seq: 0,
            counters: FaultCounters::default(),
            cm_seen: 0,
        }
    }

    /// True when no fault is configured (every packet is passed straight through).
    pub fn is_passthrough(&self) -> bool {
        self.cfg.is_none()
    }

    /// True when every configured fault can be decided as packets join a GSO run
    /// ([`FaultConfig::fits_runs`]).
    pub fn fits_runs(&self) -> bool {
        self.cfg.fits_runs()
    }

    /// Stages 0–1: whether `pkt` (a UDP payload, BTH … ICRC; the ICRC need not be filled
    /// yet) is dropped — the `--drop-cm` MAD, or a random loss. Counted.
    pub fn drops(&mut self, pkt: &[u8]) -> bool {
        if let Some(d) = self.cfg.drop_cm {
            if cm_attribute(pkt) == Some(d.attr) {
                self.cm_seen += 1;
                if self.cm_seen == d.nth {
                    self.counters.dropped += 1;
                    return true;
                }
            }
        }
        let lost = self.rng.chance(self.cfg.loss);
        self.counters.dropped += u64::from(lost);
        lost
    }

    /// Stage 2: maybe flips one bit of `pkt`, whose ICRC is already filled. Counted.
    pub fn corrupt(&mut self, pkt: &mut [u8]) {
        if self.rng.chance(self.cfg.corrupt) && !pkt.is_empty() {
            let bit = self.rng.below(pkt.len() as u64 * 8);
            if let Some(b) = pkt.get_mut((bit / 8) as usize) {
                *b ^= 1 << (bit % 8);
            }
            self.counters.corrupted += 1;
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> FaultCounters {
        self.counters
    }

    /// Applies the faults to one packet about to be sent to `dest` with IP TOS `tos`.
    /// Packets that go out now are passed to `send` (zero, one or two times); the rest
    /// are held until [`FaultInjector::release`] is called at or after their release
    /// time. `pkt` may be modified (corruption).
    pub fn submit(
        &mut self,
        now: Instant,
        pkt: &mut [u8],
        (dest, tos): (SocketAddr, u8),
        send: &mut dyn FnMut(&[u8], SocketAddr, u8),
    ) {
        if self.is_passthrough() {
            send(pkt, dest, tos);
            return;
        }
        if self.drops(pkt) {
            return;
        }
        self.corrupt(pkt);
        let copies = if self.rng.chance(self.cfg.duplicate) {
            self.counters.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut hold = self.cfg.delay;
            if self.rng.chance(self.cfg.reorder) {
                self.counters.reordered += 1;
                hold += REORDER_MIN + Duration::from_nanos(self.rng.below(REORDER_SPAN_NS));
            }
            if hold.is_zero() {
                send(pkt, dest, tos);
            } else if self.held.len() >= MAX_HELD {
                self.counters.queue_full += 1;
                send(pkt, dest, tos);
            } else {
                let mut bytes = self.pool.pop().unwrap_or_default();
                bytes.clear();
                bytes.extend_from_slice(pkt);
                self.seq += 1;
                self.held.push(Reverse(Held {
                    release: now + hold,
                    seq: self.seq,
                    dest,
                    tos,
                    bytes,
                }));
            }
        }
    }

    /// Sends every held packet whose release time is at or before `now`, in release
    /// order.
    pub fn release(&mut self, now: Instant, send: &mut dyn FnMut(&[u8], SocketAddr, u8)) {
        while self.held.peek().is_some_and(|h| h.0.release <= now) {
            if let Some(Reverse(h)) = self.held.pop() {
                send(&h.bytes, h.dest, h.tos);
                self.pool.push(h.bytes);
            }
        }
    }

    /// When the next held packet is due.
    pub fn next_release(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.0.release)
    }

    /// Packets currently held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest() -> SocketAddr {
        "127.0.0.2:4791".parse().unwrap()
    }

    fn run(cfg: FaultConfig, n: usize) -> (Vec<Vec<u8>>, FaultCounters) {
        let mut f = FaultInjector::new(cfg);
        let mut out = Vec::new();
        let mut now = Instant::ZERO;
        for i in 0..n {
            let mut pkt = (i as u32).to_be_bytes().repeat(4);
            f.submit(now, &mut pkt, (dest(), 0), &mut |b, _, _| {
                out.push(b.to_vec())
            });
            now = now + Duration::from_micros(10);
            f.release(now, &mut |b, _, _| out.push(b.to_vec()));
        }
        now = now + Duration::from_secs(1);
        f.release(now, &mut |b, _, _| out.push(b.to_vec()));
        assert_eq!(f.held(), 0);
        (out, f.counters())
    }

    #[test]
    fn passthrough_sends_everything_in_order() {
        let (out, c) = run(FaultConfig::default(), 100);
        assert_eq!(out.len(), 100);
        for (i, p) in out.iter().enumerate() {
            assert_eq!(p[..4], (i as u32).to_be_bytes());
        }
        assert_eq!(c, FaultCounters::default());
    }

    #[test]
    fn loss_rate_is_close_to_p_and_reproducible() {
        let cfg = FaultConfig {
            loss: 0.2,
            seed: 9,
            ..FaultConfig::default()
        };
        let (a, ca) = run(cfg, 10_000);
        let (b, _) = run(cfg, 10_000);
        assert_eq!(a, b, "same seed, same survivors");
        assert_eq!(a.len() as u64 + ca.dropped, 10_000);
        assert!((1_800..2_200).contains(&ca.dropped), "{}", ca.dropped);
        let (c, _) = run(FaultConfig { seed: 10, ..cfg }, 10_000);
        assert_ne!(a, c, "different seed, different survivors");
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let cfg = FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::default()
        };
        let (out, c) = run(cfg, 200);
        assert_eq!(c.corrupted, 200);
        for (i, p) in out.iter().enumerate() {
            let orig = (i as u32).to_be_bytes().repeat(4);
            let flipped: u32 = p.iter().zip(&orig).map(|(a, b)| (a ^ b).count_ones()).sum();
            assert_eq!(flipped, 1);
        }
    }

    #[test]
    fn duplicates_and_reordering_keep_every_packet() {
        let cfg = FaultConfig {
            duplicate: 0.3,
            reorder: 0.3,
            seed: 3,
            ..FaultConfig::default()
        };
        let (out, c) = run(cfg, 1000);
        assert_eq!(out.len() as u64, 1000 + c.duplicated);
        assert!(c.duplicated > 200 && c.reordered > 200);
        let mut seen: Vec<u32> = out
            .iter()
            .map(|p| u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
            .collect();
        let in_order = seen.windows(2).all(|w| w[0] <= w[1]);
        assert!(!in_order, "reordering happened");
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..1000).collect::<Vec<u32>>());
    }

    /// A 256-byte CM MAD of attribute `attr` in a UD SEND Only to QP1 (+ ICRC).
    fn cm_packet(attr: u16) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 8 + 256 + 4];
        p[0] = 0x64;
        p[7] = 1;
        p[20] = 1; // base version
        p[21] = 0x07; // CM class
        p[22] = 2;
        p[36..38].copy_from_slice(&attr.to_be_bytes());
        p
    }

    #[test]
    fn drop_cm_drops_exactly_the_nth_mad_of_its_type() {
        let mut f = FaultInjector::new(FaultConfig {
            drop_cm: Some("REP:2".parse().unwrap()),
            ..FaultConfig::default()
        });
        assert!(!f.is_passthrough());
        let mut sent = Vec::new();
        // REP, REQ, REP (dropped), an RC packet to QP 1 with the same bytes but
        // another opcode, REP, a REP to QP 2.
        let mut rc = cm_packet(wire::cm::attr::REP);
        rc[0] = 0x04;
        let mut not_qp1 = cm_packet(wire::cm::attr::REP);
        not_qp1[7] = 2;
        let pkts = [
            cm_packet(wire::cm::attr::REP),
            cm_packet(wire::cm::attr::REQ),
            cm_packet(wire::cm::attr::REP),
            rc,
            cm_packet(wire::cm::attr::REP),
            not_qp1,
        ];
        for (i, p) in pkts.iter().enumerate() {
            let mut b = p.clone();
            f.submit(Instant::ZERO, &mut b, (dest(), 0), &mut |_, _, _| {
                sent.push(i)
            });
        }
        assert_eq!(sent, [0, 1, 3, 4, 5]);
        assert_eq!(f.counters().dropped, 1);
        for bad in ["REP", "REP:0", "FOO:1", "REQ:x", ""] {
            assert!(
                bad.parse::<super::super::config::DropCm>().is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn run_path_decides_loss_and_corruption_as_submit_does() {
        let cfg = FaultConfig {
            loss: 0.1,
            corrupt: 0.1,
            seed: 5,
            ..FaultConfig::default()
        };
        let (want, wc) = run(cfg, 2_000);
        // Packet by packet, `drops` then `corrupt` draw exactly what `submit` draws.
        let mut f = FaultInjector::new(cfg);
        assert!(f.fits_runs());
        let mut got = Vec::new();
        for i in 0..2_000u32 {
            let mut pkt = i.to_be_bytes().repeat(4);
            if !f.drops(&pkt) {
                f.corrupt(&mut pkt);
                got.push(pkt);
            }
        }
        assert_eq!((got, f.counters()), (want, wc), "same seed, same decisions");
        assert!(wc.dropped > 100 && wc.corrupted > 100);
        for held in [
            FaultConfig {
                duplicate: 0.1,
                ..cfg
            },
            FaultConfig {
                reorder: 0.1,
                ..cfg
            },
            FaultConfig {
                delay: Duration::from_micros(1),
                ..cfg
            },
        ] {
            assert!(!FaultInjector::new(held).fits_runs(), "{held:?}");
        }
    }

    #[test]
    fn delay_holds_until_release_time() {
        let mut f = FaultInjector::new(FaultConfig {
            delay: Duration::from_micros(100),
            ..FaultConfig::default()
        });
        let mut n = 0;
        let t0 = Instant::from_nanos(1_000);
        f.submit(t0, &mut [1, 2, 3, 4], (dest(), 0x60), &mut |_, _, _| n += 1);
        assert_eq!(n, 0);
        assert_eq!(f.next_release(), Some(t0 + Duration::from_micros(100)));
        f.release(t0 + Duration::from_micros(99), &mut |_, _, _| n += 1);
        assert_eq!(n, 0);
        // A held packet leaves with the traffic class it was submitted with.
        f.release(t0 + Duration::from_micros(100), &mut |_, _, tos| {
            assert_eq!(tos, 0x60);
            n += 1
        });
        assert_eq!(n, 1);
        assert_eq!(f.next_release(), None);
    }
}
