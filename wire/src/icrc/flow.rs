//! The ICRC of one flow, with the IP/UDP part precomputed.
//!
//! Every packet between two endpoints hashes the same 36-byte (IPv4) or 56-byte (IPv6)
//! prefix — LRH stand-in, masked IP header, masked UDP header — except for the two length
//! fields. CRC-32 is affine over GF(2): for messages of equal length,
//! `crc(a ^ b ^ c) = crc(a) ^ crc(b) ^ crc(c)`. So the prefix's CRC is the CRC of the
//! prefix with both lengths zero (computed once per flow, [`IcrcParams::prepare`]) XORed
//! with a linear function of the length bits, read from constant tables built at compile
//! time. A packet then costs one CRC pass over its own bytes only — the difference
//! between ~44 ns and ~30 ns for a 64-byte packet (docs/perf.md).

use core::ops::Range;

use super::{
    check, combine, crc_body, short, split_icrc, store, IcrcParams, IpParams, IPV4_HEADER_LEN,
    LRH_STANDIN, UDP_HEADER_LEN,
};
use crate::bth;
use crate::error::{Error, Result};

/// Prefix lengths: LRH stand-in + IP header + UDP header.
const PREFIX_V4: usize = 8 + 20 + 8;
const PREFIX_V6: usize = 8 + 40 + 8;

/// Where the 16-bit length fields sit in each prefix.
const V4_TOTAL_LEN_AT: usize = 8 + 2;
const V4_UDP_LEN_AT: usize = 8 + 20 + 4;
const V6_PAYLOAD_LEN_AT: usize = 8 + 4;
const V6_UDP_LEN_AT: usize = 8 + 40 + 4;

/// Bitwise CRC-32 (reflected 0xEDB88320, init and final XOR all ones) of `len` zero bytes
/// with the bytes `at..at + 2` replaced by `v` big-endian. Compile-time only.
const fn crc_with_field(len: usize, at: usize, v: u16) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    let mut i = 0;
    while i < len {
        let byte = if i == at {
            (v >> 8) as u8
        } else if i == at + 1 {
            v as u8
        } else {
            0
        };
        crc ^= byte as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
            k += 1;
        }
        i += 1;
    }
    !crc
}

/// `T[0][lo] ^ T[1][hi]` is the CRC change caused by a 16-bit field at `at` (in a
/// `len`-byte message) holding `hi << 8 | lo` instead of 0.
type FieldTable = [[u32; 256]; 2];

const fn field_table(len: usize, at: usize) -> FieldTable {
    let zero = crc_with_field(len, at, 0);
    let mut cols = [0u32; 16];
    let mut b = 0;
    while b < 16 {
        cols[b] = crc_with_field(len, at, 1 << b) ^ zero;
        b += 1;
    }
    let mut t = [[0u32; 256]; 2];
    let mut half = 0;
    while half < 2 {
        let mut v = 0;
        while v < 256 {
            let mut acc = 0;
            let mut bit = 0;
            while bit < 8 {
                if v & (1 << bit) != 0 {
                    acc ^= cols[half * 8 + bit];
                }
                bit += 1;
            }
            t[half][v] = acc;
            v += 1;
        }
        half += 1;
    }
    t
}

static V4_TOTAL: FieldTable = field_table(PREFIX_V4, V4_TOTAL_LEN_AT);
static V4_UDP: FieldTable = field_table(PREFIX_V4, V4_UDP_LEN_AT);
static V6_PAYLOAD: FieldTable = field_table(PREFIX_V6, V6_PAYLOAD_LEN_AT);
static V6_UDP: FieldTable = field_table(PREFIX_V6, V6_UDP_LEN_AT);

fn delta(t: &FieldTable, v: u16) -> u32 {
    t[0][usize::from(v as u8)] ^ t[1][usize::from(v >> 8)]
}

/// The ICRC parameters of one flow, prepared: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedIcrc {
    /// CRC of the prefix with both length fields zero.
    crc0: u32,
    /// IPv4 (else IPv6).
    v4: bool,
}

impl IcrcParams {
    /// Precomputes the per-flow part of the ICRC. Use it where many packets share the
    /// same addresses, ports and IPv4 ID (a NIC's send path, a receiver per peer).
    pub fn prepare(&self) -> PreparedIcrc {
        // The pseudo-headers with a RoCE length that makes both length fields zero:
        // UDP length 0 means roce_len = -8, so build them and clear the fields.
        let mut p = [0u8; PREFIX_V6];
        p[..8].copy_from_slice(&LRH_STANDIN);
        let n = self.pseudo_headers(0, &mut p[8..]);
        let v4 = matches!(self.ip, IpParams::V4 { .. });
        let (a, b) = if v4 {
            (V4_TOTAL_LEN_AT, V4_UDP_LEN_AT)
        } else {
            (V6_PAYLOAD_LEN_AT, V6_UDP_LEN_AT)
        };
        p[a..a + 2].fill(0);
        p[b..b + 2].fill(0);
        PreparedIcrc {
            crc0: crc32fast::hash(&p[..8 + n]),
            v4,
        }
    }
}

impl PreparedIcrc {
    /// CRC of the prefix for a RoCEv2 UDP payload of `roce_len` bytes.
    #[inline]
    fn prefix_crc(&self, roce_len: usize) -> u32 {
        let udp_len = (UDP_HEADER_LEN + roce_len) as u16;
        if self.v4 {
            let total = udp_len.wrapping_add(IPV4_HEADER_LEN as u16);
            self.crc0 ^ delta(&V4_TOTAL, total) ^ delta(&V4_UDP, udp_len)
        } else {
            self.crc0 ^ delta(&V6_PAYLOAD, udp_len) ^ delta(&V6_UDP, udp_len)
        }
    }

    /// Computes the ICRC of `roce` (BTH … ICRC slot), as [`IcrcParams::compute`].
    pub fn compute(&self, roce: &[u8]) -> Result<u32> {
        let (body, _) = split_icrc(roce)?;
        crc_body(self.prefix_crc(roce.len()), body)
    }

    /// [`PreparedIcrc::compute`] for a packet whose bytes `roce[payload]` have CRC
    /// `payload_crc` (crc32fast's `hash` of them, e.g. computed while they were copied
    /// in): the headers and the pad are hashed, the payload is combined in by its CRC
    /// and length and not read (`combine.rs`). `payload` must lie after the BTH and
    /// before the ICRC slot.
    pub fn compute_with_payload(
        &self,
        roce: &[u8],
        payload: Range<usize>,
        payload_crc: u32,
    ) -> Result<u32> {
        let (body, _) = split_icrc(roce)?;
        let (Some(head), Some(pad)) = (body.get(..payload.start), body.get(payload.end..)) else {
            return Err(Error::Inconsistent("payload range outside the packet"));
        };
        if payload.start < bth::HEADER_LEN || payload.start > payload.end {
            return Err(Error::Inconsistent("payload range overlaps the BTH"));
        }
        let c = combine::combine(
            crc_body(self.prefix_crc(roce.len()), head)?,
            payload_crc,
            payload.len(),
        )
        .ok_or(Error::Inconsistent("payload longer than a datagram"))?;
        Ok(short::update(c, pad))
    }

    /// Verifies the ICRC carried at the end of `roce`.
    pub fn verify(&self, roce: &[u8]) -> Result<()> {
        check(roce, self.compute(roce)?)
    }

    /// Computes the ICRC and writes it into the last four bytes of `roce`.
    pub fn fill(&self, roce: &mut [u8]) -> Result<()> {
        let c = self.compute(roce)?;
        store(roce, c);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{Ipv4Addr, Ipv6Addr};
    use proptest::prelude::*;

    fn params() -> [IcrcParams; 3] {
        [
            IcrcParams {
                ip: IpParams::V4 {
                    src: Ipv4Addr::new(10, 0, 17, 1),
                    dst: Ipv4Addr::new(10, 0, 18, 1),
                    id: 0x718c,
                    dont_fragment: true,
                },
                src_port: 0,
                dst_port: 4791,
            },
            IcrcParams {
                ip: IpParams::V4 {
                    src: Ipv4Addr::new(127, 0, 0, 2),
                    dst: Ipv4Addr::new(127, 0, 0, 3),
                    id: 0,
                    dont_fragment: false,
                },
                src_port: 0xC011,
                dst_port: 4791,
            },
            IcrcParams {
                ip: IpParams::V6 {
                    src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                    dst: Ipv6Addr::LOCALHOST,
                },
                src_port: 49441,
                dst_port: 4791,
            },
        ]
    }

    /// The reference: the same packet framed as Linux would send it, and its ICRC
    /// computed from those real header bytes (masking applied by `compute_from_headers`),
    /// with no table or linearity involved.
    fn from_real_headers(p: &IcrcParams, roce: &[u8]) -> Result<u32> {
        let fp = crate::frame::FrameParams {
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_mac: [2, 0, 0, 0, 0, 2],
            icrc: *p,
            ttl: 64,
            // Masked by the ICRC like the TTL: a traffic class must not change it.
            tos: 0xB8,
        };
        let mut frame = vec![0u8; crate::frame::outer_len(&fp) + roce.len()];
        crate::frame::emit_ethernet(&fp, roce, &mut frame)?;
        let ip_len = crate::frame::outer_len(&fp) - 14 - 8;
        let (ip, rest) = frame[14..].split_at(ip_len);
        super::super::compute_from_headers(ip, &rest[..8], roce)
    }

    #[test]
    fn prepared_equals_real_headers_at_every_length() {
        for p in params() {
            let f = p.prepare();
            // Every length from the shortest packet to a few hundred bytes, and large
            // ones (the length fields' high bytes).
            let lens = (16..600).chain([4096 + 16, 9000, 65_000]);
            for len in lens {
                let roce: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                let want = from_real_headers(&p, &roce).unwrap();
                assert_eq!(f.compute(&roce).unwrap(), want, "len {len}");
                assert_eq!(p.compute(&roce).unwrap(), want, "len {len}");
            }
        }
    }

    fn arb_params() -> impl Strategy<Value = IcrcParams> {
        let v4 =
            (any::<u32>(), any::<u32>(), any::<u16>(), any::<bool>()).prop_map(|(s, d, id, df)| {
                IpParams::V4 {
                    src: Ipv4Addr::from(s),
                    dst: Ipv4Addr::from(d),
                    id,
                    dont_fragment: df,
                }
            });
        let v6 = (any::<u128>(), any::<u128>()).prop_map(|(s, d)| IpParams::V6 {
            src: Ipv6Addr::from(s),
            dst: Ipv6Addr::from(d),
        });
        (prop_oneof![v4, v6], any::<u16>(), any::<u16>()).prop_map(|(ip, s, d)| IcrcParams {
            ip,
            src_port: s,
            dst_port: d,
        })
    }

    proptest! {
        /// The ICRC with the payload combined in by its CRC is the ICRC hashed in full,
        /// for any headers (the bytes before the payload, BTH included), payload range,
        /// pad and addresses.
        #[test]
        fn with_payload_equals_full_hash(
            p in arb_params(),
            roce in proptest::collection::vec(any::<u8>(), 16..5000),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
        ) {
            let body = roce.len() - 4;
            // 12 ≤ start ≤ end ≤ body: headers after the BTH, then payload, then pad.
            let start = 12 + a.index(body - 12 + 1);
            let end = start + b.index(body - start + 1);
            let crc = crc32fast::hash(&roce[start..end]);
            let want = p.compute(&roce).unwrap();
            let f = p.prepare();
            prop_assert_eq!(f.compute(&roce).unwrap(), want);
            prop_assert_eq!(f.compute_with_payload(&roce, start..end, crc).unwrap(), want);
            // A wrong digest gives a wrong ICRC.
            prop_assert_ne!(f.compute_with_payload(&roce, start..end, crc ^ 1).unwrap(), want);
        }
    }

    #[test]
    fn with_payload_rejects_bad_ranges() {
        let f = params()[0].prepare();
        let roce = [0u8; 64];
        let crc = crc32fast::hash(&roce[20..40]);
        assert!(f.compute_with_payload(&roce, 20..40, crc).is_ok());
        assert!(f.compute_with_payload(&roce, 11..40, crc).is_err()); // inside the BTH
        assert!(f.compute_with_payload(&roce, 20..61, crc).is_err()); // into the ICRC
        let backwards = Range { start: 30, end: 20 };
        assert!(f.compute_with_payload(&roce, backwards, crc).is_err());
        assert!(f.compute_with_payload(&roce[..15], 12..12, 0).is_err());
    }

    #[test]
    fn prepared_verify_and_fill() {
        for p in params() {
            let f = p.prepare();
            let mut roce = [0u8; 64];
            roce[0] = 0x04;
            f.fill(&mut roce).unwrap();
            p.verify(&roce).unwrap();
            f.verify(&roce).unwrap();
            roce[4] ^= 0xC0; // masked
            f.verify(&roce).unwrap();
            roce[30] ^= 1;
            assert!(f.verify(&roce).is_err());
            assert!(f.compute(&roce[..15]).is_err());
        }
    }
}
