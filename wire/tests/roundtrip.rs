//! Property tests of the whole-packet codec.
//!
//! * For every row of [`OPCODES`], a random valid [`PacketRepr`] (random BTH fields, the
//!   extension headers the row lists with random values, random payload when the row
//!   allows one) survives emit → parse unchanged, payload included.
//! * The ICRC written by [`IcrcParams::fill`] verifies for random IPv4/IPv6 parameters,
//!   and any single flipped bit breaks it — except in BTH byte 4, which the ICRC masks
//!   (IBTA Annex A17.4.1.1: FECN, BECN and the reserved bits may change in flight).
//! * Random bytes never make [`PacketRepr::parse`], [`frame::parse_ethernet`] or
//!   [`frame::parse_ip`] panic, and whatever `parse` accepts is self-consistent.
//! * A truncated packet is rejected, unless the cut removed whole 4-byte words of payload
//!   (then it is a valid, shorter packet of the same headers — see `truncation`).
//!
//! Case counts are chosen so the file runs in a few seconds at the test profile's
//! opt-level 1 on two cores; the fuzz targets in `fuzz/` explore further.

use core::net::{Ipv4Addr, Ipv6Addr};

use proptest::collection::vec;
use proptest::prelude::*;
use wire::frame;
use wire::opcode::{Header, OpcodeInfo, OPCODES};
use wire::packet::pad_for;
use wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, IcrcParams, IethRepr,
    ImmDtRepr, IpParams, Msn, PacketRepr, Psn, Qpn, RethRepr, Syndrome, XrcEthRepr,
    ROCEV2_UDP_PORT,
};

/// Largest payload generated: one 4096-byte MTU.
const MAX_PAYLOAD: usize = 4096;

/// Random values for every field of every header; [`build`] keeps the ones an opcode
/// carries. Payload bytes come from `payload_seed` through a cheap PRNG, so that a 4 KiB
/// payload does not cost 4096 proptest value trees (shrinking still works on the length).
#[derive(Debug, Clone)]
struct Fields {
    bth: (bool, bool, u16, bool, bool, u32, bool, u32),
    reth: (u64, u32, u32),
    aeth: (u8, u32),
    deth: (u32, u32),
    imm: u32,
    ieth_rkey: u32,
    atomic: (u64, u32, u64, u64),
    atomic_ack: u64,
    feth: (u8, u8),
    /// The XRC SRQ number: 24 bits, all the XRCETH carries.
    xrc_srqn: u32,
    payload_len: usize,
    payload_seed: u64,
}

fn arb_fields() -> impl Strategy<Value = Fields> {
    (
        any::<(bool, bool, u16, bool, bool, u32, bool, u32)>(),
        any::<(u64, u32, u32)>(),
        any::<(u8, u32)>(),
        any::<(u32, u32)>(),
        any::<(u32, u32)>(),
        any::<(u64, u32, u64, u64)>(),
        any::<u64>(),
        (0u8..4, 0u8..16),
        0u32..1 << 24,
        // Bias towards the edges (0, 1..3 for every pad count, a full MTU).
        prop_oneof![0usize..=8, 0usize..=MAX_PAYLOAD, Just(MAX_PAYLOAD)],
        any::<u64>(),
    )
        .prop_map(
            |(
                bth,
                reth,
                aeth,
                deth,
                (imm, ieth_rkey),
                atomic,
                atomic_ack,
                feth,
                xrc_srqn,
                len,
                seed,
            )| {
                Fields {
                    bth,
                    reth,
                    aeth,
                    deth,
                    imm,
                    ieth_rkey,
                    atomic,
                    atomic_ack,
                    feth,
                    xrc_srqn,
                    payload_len: len,
                    payload_seed: seed,
                }
            },
        )
}

/// splitmix64: a deterministic byte stream for payloads.
fn payload_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The valid packet of opcode `info` that `f` describes, and its payload.
fn build(info: &OpcodeInfo, f: &Fields) -> (PacketRepr, Vec<u8>) {
    let payload_len = if info.payload { f.payload_len } else { 0 };
    let (solicited, mig_req, pkey, fecn, becn, qpn, ack_req, psn) = f.bth;
    let mut r = PacketRepr::new(BthRepr {
        opcode: info.opcode,
        solicited,
        mig_req,
        pad_count: pad_for(payload_len),
        pkey,
        fecn,
        becn,
        dest_qpn: Qpn::new(qpn),
        ack_req,
        psn: Psn::new(psn),
    });
    for &h in info.headers {
        match h {
            Header::Reth => {
                r.reth = Some(RethRepr {
                    va: f.reth.0,
                    rkey: f.reth.1,
                    dma_len: f.reth.2,
                })
            }
            Header::Aeth => {
                r.aeth = Some(AethRepr {
                    // Through the decoder, so the value is in canonical form.
                    syndrome: Syndrome::from_u8(f.aeth.0),
                    msn: Msn::new(f.aeth.1),
                })
            }
            Header::Deth => {
                r.deth = Some(DethRepr {
                    qkey: f.deth.0,
                    src_qpn: Qpn::new(f.deth.1),
                })
            }
            Header::ImmDt => r.immdt = Some(ImmDtRepr { imm: f.imm }),
            Header::Ieth => r.ieth = Some(IethRepr { rkey: f.ieth_rkey }),
            Header::AtomicEth => {
                r.atomic_eth = Some(AtomicEthRepr {
                    va: f.atomic.0,
                    rkey: f.atomic.1,
                    swap_add: f.atomic.2,
                    compare: f.atomic.3,
                })
            }
            Header::AtomicAckEth => {
                r.atomic_ack_eth = Some(AtomicAckEthRepr { orig: f.atomic_ack })
            }
            Header::Feth => {
                r.feth = Some(FethRepr {
                    selectivity: f.feth.0,
                    placement: f.feth.1,
                })
            }
            Header::CnpPad => {}
            Header::XrcEth => r.xrceth = Some(XrcEthRepr { srqn: f.xrc_srqn }),
        }
    }
    r.payload_len = payload_len;
    (r, payload_bytes(payload_len, f.payload_seed))
}

/// Emits `r` with `payload` into a fresh buffer of exactly the packet's length.
fn emit(r: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; r.total_len().expect("known opcode")];
    let n = r.emit(&mut buf, payload).expect("emit a valid repr");
    assert_eq!(n, buf.len());
    buf
}

fn arb_ip() -> impl Strategy<Value = IpParams> {
    prop_oneof![
        any::<([u8; 4], [u8; 4], u16, bool)>().prop_map(|(s, d, id, df)| IpParams::V4 {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
            id,
            dont_fragment: df,
        }),
        any::<([u8; 16], [u8; 16])>().prop_map(|(s, d)| IpParams::V6 {
            src: Ipv6Addr::from(s),
            dst: Ipv6Addr::from(d),
        }),
    ]
}

fn arb_icrc_params() -> impl Strategy<Value = IcrcParams> {
    (
        arb_ip(),
        any::<u16>(),
        prop_oneof![Just(ROCEV2_UDP_PORT), any::<u16>()],
    )
        .prop_map(|(ip, src_port, dst_port)| IcrcParams {
            ip,
            src_port,
            dst_port,
        })
}

/// One random packet per opcode row, so every case covers the whole table.
fn arb_all_opcodes() -> impl Strategy<Value = Vec<Fields>> {
    vec(arb_fields(), OPCODES.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// emit → parse is the identity on valid packets of every opcode.
    #[test]
    fn emit_then_parse_every_opcode(fields in arb_all_opcodes()) {
        for (info, f) in OPCODES.iter().zip(&fields) {
            let (repr, payload) = build(info, f);
            let buf = emit(&repr, &payload);
            let p = PacketRepr::parse(&buf);
            prop_assert!(p.is_ok(), "{}: {:?}", info.opcode, p);
            let Ok(p) = p else { unreachable!() };
            prop_assert_eq!(p.repr, repr, "{}", info.opcode);
            prop_assert_eq!(p.payload, &payload[..], "{}", info.opcode);
            prop_assert_eq!(p.header_len, repr.header_len().unwrap_or(0));
            prop_assert_eq!(p.icrc, 0, "emit leaves the ICRC slot zero");
        }
    }

    /// fill → verify passes; one flipped bit fails verify unless it is in BTH byte 4.
    #[test]
    fn icrc_fill_verify_and_single_bit_flips(
        fields in arb_all_opcodes(),
        params in arb_icrc_params(),
        flips in vec(any::<prop::sample::Index>(), OPCODES.len()),
    ) {
        for ((info, f), flip) in OPCODES.iter().zip(&fields).zip(&flips) {
            let (repr, payload) = build(info, f);
            let mut buf = emit(&repr, &payload);
            prop_assert!(params.fill(&mut buf).is_ok());
            prop_assert!(params.verify(&buf).is_ok(), "{}", info.opcode);
            // The filled packet still parses to the same headers.
            let parsed = PacketRepr::parse(&buf).map(|p| p.repr);
            prop_assert_eq!(parsed, Ok(repr));
            let bit = flip.index(buf.len() * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            let v = params.verify(&buf);
            if bit / 8 == 4 {
                prop_assert!(v.is_ok(), "{}: BTH byte 4 is masked, bit {}", info.opcode, bit);
            } else {
                prop_assert!(v.is_err(), "{}: flipped bit {} went unnoticed", info.opcode, bit);
            }
        }
    }

    /// Cutting a valid packet short is rejected, except when the cut removes whole
    /// 4-byte words of (padded) payload and leaves at least the pad: that is itself a
    /// valid packet with the same headers and a prefix of the payload, and a receiver
    /// can only tell it apart by its ICRC (or the RETH/transport length checks).
    #[test]
    fn truncation(f in arb_fields(), row in any::<prop::sample::Index>(), cut in any::<prop::sample::Index>()) {
        let info = row.get(OPCODES);
        let (repr, payload) = build(info, &f);
        let buf = emit(&repr, &payload);
        let k = cut.index(buf.len());
        let short = &buf[..k];
        match PacketRepr::parse(short) {
            Err(_) => {}
            Ok(p) => {
                let removed = buf.len() - k;
                let hlen = p.header_len;
                prop_assert!(info.payload, "{}: accepted {} of {} bytes", info.opcode, k, buf.len());
                prop_assert_eq!(removed % 4, 0);
                prop_assert!(k >= hlen + 4 + usize::from(repr.bth.pad_count));
                let mut want = repr;
                want.payload_len = k - hlen - 4 - usize::from(repr.bth.pad_count);
                prop_assert_eq!(p.repr, want);
                prop_assert_eq!(p.payload, &buf[hlen..hlen + want.payload_len]);
            }
        }
        // Anything shorter than headers + ICRC is always rejected.
        let min = repr.header_len().unwrap_or(0) + 4;
        let k2 = cut.index(min);
        prop_assert!(PacketRepr::parse(&buf[..k2]).is_err());
    }
}

/// Random bytes that start like a RoCEv2 packet often enough to reach the extension
/// headers: half the time the first byte is a known opcode and TVer is zero.
fn arb_roce_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..128),
        (
            any::<prop::sample::Index>(),
            any::<u8>(),
            vec(any::<u8>(), 0..128)
        )
            .prop_map(|(row, flags, mut rest)| {
                let mut v = vec![row.get(OPCODES).opcode.0, flags & 0xF0];
                v.append(&mut rest);
                v
            }),
    ]
}

/// Random frames: pure noise, or a valid Ethernet/VLAN/IP/UDP/RoCEv2 frame with a few
/// bytes overwritten and a random length, so the parsers get past their first checks.
fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    let valid = (
        arb_fields(),
        any::<prop::sample::Index>(),
        arb_icrc_params(),
        any::<[u8; 12]>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(f, row, icrc, macs, ttl, tos)| {
            let (repr, payload) = build(row.get(OPCODES), &f);
            let mut roce = emit(&repr, &payload);
            let _ = icrc.fill(&mut roce);
            let p = frame::FrameParams {
                dst_mac: [macs[0], macs[1], macs[2], macs[3], macs[4], macs[5]],
                src_mac: [macs[6], macs[7], macs[8], macs[9], macs[10], macs[11]],
                icrc,
                ttl,
                tos,
            };
            let mut out = vec![0u8; frame::outer_len(&p) + roce.len()];
            let n = frame::emit_ethernet(&p, &roce, &mut out).unwrap_or(0);
            out.truncate(n);
            out
        });
    let mangled = (
        valid,
        vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(mut v, edits, cut, do_cut)| {
            if !v.is_empty() {
                for (at, b) in edits {
                    let i = at.index(v.len());
                    v[i] = b;
                }
                if do_cut {
                    let k = cut.index(v.len());
                    v.truncate(k);
                }
            }
            v
        });
    prop_oneof![vec(any::<u8>(), 0..200), mangled]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    /// `parse` never panics, and what it accepts adds up: headers + payload + pad + ICRC
    /// is the whole input, and the payload is the slice right after the headers.
    #[test]
    fn random_bytes_parse_without_panic(bytes in arb_roce_bytes()) {
        if let Ok(p) = PacketRepr::parse(&bytes) {
            let pad = usize::from(p.repr.bth.pad_count);
            prop_assert_eq!(p.header_len + p.payload.len() + pad + 4, bytes.len());
            prop_assert_eq!(p.payload, &bytes[p.header_len..p.header_len + p.payload.len()]);
            prop_assert_eq!(p.repr.payload_len, p.payload.len());
            prop_assert!(p.repr.info().is_ok());
        }
    }

    /// The frame parsers never panic on random input, for the RoCEv2 port or any other.
    #[test]
    fn random_frames_parse_without_panic(bytes in arb_frame(), port in prop_oneof![Just(ROCEV2_UDP_PORT), any::<u16>()]) {
        if let Ok(f) = frame::parse_ethernet(&bytes, port) {
            prop_assert_eq!(f.dst_port, port);
            let _ = f.verify_icrc();
            let _ = PacketRepr::parse(f.roce);
        }
        let ip = bytes.get(14..).unwrap_or(&[]);
        if let Ok(f) = frame::parse_ip(ip, port) {
            prop_assert_eq!(f.dst_port, port);
            let _ = f.verify_icrc();
        }
        let _ = frame::parse_ip(&bytes, port);
    }
}
