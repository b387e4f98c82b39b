//! Real traffic: every RoCEv2 packet in `tests/data/captures/**/*.pcap` (Linux rxe and
//! one hardware RNIC; see `tests/data/captures/SOURCES.md`) parses, its ICRC verifies
//! against the frame's own IP/UDP headers, and a single flipped bit anywhere the ICRC
//! covers is caught — while flips in the fields the ICRC masks by design (IBTA Annex
//! A17.4.1.1: IPv4 TOS/TTL/checksum, IPv6 traffic class/flow label/hop limit, UDP
//! checksum, BTH byte 4) are not. And the IPv4 ID, which a plain UDP receiver cannot
//! see, is recovered from the ICRC for every IPv4 packet.
//!
//! The pcap reader is a few lines in `support/` so that `wire` keeps no dependency for it.

mod support;

use std::collections::BTreeMap;

use support::{all_packets, Packet};

use wire::frame::parse_ethernet;
use wire::icrc::solve_ipv4_id;
use wire::{PacketRepr, ROCEV2_UDP_PORT};

/// RoCEv2 packets (UDP destination port 4791) per capture, counted by this test's own
/// reader and checked against tshark's `udp.dstport==4791` filter. tshark's `infiniband`
/// filter shows 37 fewer in `hw_send_imm.pcap`: its ACKs come from UDP source port 69,
/// which tshark dissects as TFTP.
const EXPECTED: &[(&str, usize)] = &[
    ("public/hw_send_imm.pcap", 105),
    ("public/nccl_ring2_node0.pcap", 184),
    ("public/pingpong_rc.pcap", 20),
    ("public/pingpong_uc.pcap", 10),
    ("public/pingpong_ud.pcap", 10),
    ("public/rdma_atomic_bw.pcap", 10),
    ("public/rdma_cm.pcap", 96),
    ("public/rdma_read_bw.pcap", 20),
    ("public/rdma_read_lat.pcap", 10),
    ("public/rdma_send_bw.pcap", 20),
    ("public/rdma_write_bw.pcap", 20),
    ("public/rdma_write_lat.pcap", 20),
    ("public/rping.pcap", 65),
    ("rxe-lab/rc_mtu1024.pcap", 72),
    ("rxe-lab/rc_read.pcap", 64),
    ("rxe-lab/rc_send.pcap", 64),
    ("rxe-lab/rc_send_ipv6.pcap", 32),
    ("rxe-lab/rc_write.pcap", 64),
    ("rxe-lab/rdma_cm.pcap", 41),
    ("rxe-lab/uc_send.pcap", 48),
    ("rxe-lab/ud_send.pcap", 16),
    ("rxe-lab/ud_send_ipv6.pcap", 16),
];

/// The shared README's count of RoCEv2 packets in all these captures.
const TOTAL: usize = 1007;

/// Whether a receiver that sees the whole frame accepts it: it is a RoCEv2 frame and
/// its ICRC verifies against its own IP and UDP headers.
fn accepted(frame: &[u8]) -> bool {
    parse_ethernet(frame, ROCEV2_UDP_PORT).is_ok_and(|f| f.verify_icrc().is_ok())
}

/// Where the IP header starts in an Ethernet frame (after any VLAN tags).
fn ip_offset(frame: &[u8]) -> usize {
    let mut off = 12;
    while matches!(
        u16::from_be_bytes([frame[off], frame[off + 1]]),
        0x8100 | 0x88A8
    ) {
        off += 4;
    }
    off + 2
}

/// The byte range the ICRC covers or guards (IP header to ICRC, inclusive), and the
/// bytes within it that the ICRC masks, as offsets in the frame.
fn covered_and_masked(frame: &[u8]) -> (std::ops::Range<usize>, Vec<(usize, u8)>) {
    let ip = ip_offset(frame);
    let f = parse_ethernet(frame, ROCEV2_UDP_PORT).unwrap();
    let ihl = f.ip_header.len();
    let end = ip + ihl + 8 + f.roce.len();
    let (udp, bth) = (ip + ihl, ip + ihl + 8);
    // (byte offset, mask of the masked bits in that byte)
    let masked = if frame[ip] >> 4 == 4 {
        vec![
            (ip + 1, 0xFF),  // TOS (DSCP + ECN)
            (ip + 8, 0xFF),  // TTL
            (ip + 10, 0xFF), // header checksum
            (ip + 11, 0xFF),
            (udp + 6, 0xFF), // UDP checksum
            (udp + 7, 0xFF),
            (bth + 4, 0xFF), // FECN, BECN, reserved
        ]
    } else {
        vec![
            (ip, 0x0F),     // traffic class (high nibble) …
            (ip + 1, 0xFF), // … traffic class (low nibble), flow label
            (ip + 2, 0xFF),
            (ip + 3, 0xFF),
            (ip + 7, 0xFF), // hop limit
            (udp + 6, 0xFF),
            (udp + 7, 0xFF),
            (bth + 4, 0xFF),
        ]
    };
    (ip..end, masked)
}

fn is_masked(masked: &[(usize, u8)], byte: usize, bit: u8) -> bool {
    masked
        .iter()
        .any(|&(o, m)| o == byte && m & (1 << bit) != 0)
}

/// Flips bit `bit` of byte `byte` and checks the verdict the ICRC design calls for.
fn check_flip(p: &Packet, masked: &[(usize, u8)], byte: usize, bit: u8) {
    let mut g = p.frame.clone();
    g[byte] ^= 1 << bit;
    let want = is_masked(masked, byte, bit);
    assert_eq!(
        accepted(&g),
        want,
        "{} frame {}: flipping byte {byte} bit {bit} (masked: {want})",
        p.file,
        p.number
    );
}

/// A small deterministic generator (xorshift64*), so failures are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn every_packet_parses_and_verifies_with_exact_counts() {
    let packets = all_packets();
    let mut per_file: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &packets {
        *per_file.entry(p.file.as_str()).or_default() += 1;
        let f = parse_ethernet(&p.frame, ROCEV2_UDP_PORT).unwrap();
        let parsed = PacketRepr::parse(f.roce)
            .unwrap_or_else(|e| panic!("{} frame {}: {e}", p.file, p.number));
        f.verify_icrc()
            .unwrap_or_else(|e| panic!("{} frame {}: {e}", p.file, p.number));
        // The explicit-parameter path agrees with the raw-header path.
        f.icrc_params()
            .verify(f.roce)
            .unwrap_or_else(|e| panic!("{} frame {} (params): {e}", p.file, p.number));
        assert_eq!(
            parsed.icrc,
            u32::from_le_bytes(f.roce[f.roce.len() - 4..].try_into().unwrap())
        );
    }
    let want: BTreeMap<&str, usize> = EXPECTED.iter().copied().collect();
    assert_eq!(per_file, want);
    assert_eq!(packets.len(), TOTAL);
    assert_eq!(want.values().sum::<usize>(), TOTAL);
}

#[test]
fn single_bit_flips_are_caught_except_in_masked_fields() {
    let packets = all_packets();
    assert_eq!(packets.len(), TOTAL);
    let mut rng = Rng(0x5EED_1CC0_0000_0001);
    // Every bit of the first packet of each (opcode, IP version, length class); a random
    // sample of the covered bits of all others; the masked bits of every packet.
    let mut seen = std::collections::HashSet::new();
    let (mut full, mut flips) = (0usize, 0usize);
    for p in &packets {
        let f = parse_ethernet(&p.frame, ROCEV2_UDP_PORT).unwrap();
        let key = (f.roce[0], f.src.is_ipv4(), f.roce.len() > 256);
        let (range, masked) = covered_and_masked(&p.frame);
        if seen.insert(key) {
            full += 1;
            for byte in range.clone() {
                for bit in 0..8 {
                    check_flip(p, &masked, byte, bit);
                    flips += 1;
                }
            }
        } else {
            for _ in 0..256 {
                let byte = range.start + rng.below(range.len());
                check_flip(p, &masked, byte, rng.below(8) as u8);
                flips += 1;
            }
            for &(byte, m) in &masked {
                for bit in (0..8).filter(|b| m & (1 << b) != 0) {
                    check_flip(p, &masked, byte, bit);
                    flips += 1;
                }
            }
        }
    }
    // At least the distinct opcodes of these captures were flipped bit by bit.
    assert!(full >= 20, "only {full} packets flipped exhaustively");
    assert!(flips > 100_000, "only {flips} flips");
}

#[test]
fn ipv4_id_is_recovered_from_the_icrc() {
    let mut n = 0;
    for p in all_packets() {
        let f = parse_ethernet(&p.frame, ROCEV2_UDP_PORT).unwrap();
        if !f.src.is_ipv4() {
            continue;
        }
        let got = solve_ipv4_id(&f.icrc_params(), f.roce)
            .unwrap_or_else(|e| panic!("{} frame {}: {e}", p.file, p.number));
        assert_eq!(got, f.ipv4_id, "{} frame {}", p.file, p.number);
        n += 1;
    }
    // All but the 48 IPv6 packets (rc_send_ipv6 + ud_send_ipv6).
    assert_eq!(n, TOTAL - 48);
}
