//! The RoCEv2 Invariant CRC (IBTA Annex A17.4.1.1, as Linux `rxe_icrc.c` and hardware
//! compute it; verified bit for bit on 1,007 real packets, see `wire/tests/captures.rs`).
//!
//! The ICRC is a standard CRC-32 (zlib's) over, in order:
//! 1. eight 0xFF bytes standing in for the InfiniBand LRH;
//! 2. the IP header with its variant fields set to all ones — IPv4: TOS, TTL and
//!    header checksum; IPv6: traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//! 5. everything after the BTH up to the ICRC (extension headers, payload, pad).
//!
//! It is appended least-significant byte first.
//!
//! Note what is *not* masked: the IPv4 Identification, flags and fragment offset, and
//! the total length. A sender must therefore know the IPv4 ID its packet will carry
//! (softnic sends from an unconnected DF socket, for which Linux uses ID 0), and a
//! receiver behind a plain UDP socket cannot see it: [`solve_ipv4_id`] recovers it.

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Layer, Result};
use crate::{bth, ICRC_LEN};

pub mod combine;
mod flow;
mod short;
pub use flow::PreparedIcrc;

/// IP-layer fields the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpParams {
    /// IPv4 (without options).
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification.
        id: u16,
        /// Don't Fragment flag.
        dont_fragment: bool,
    },
    /// IPv6 (UDP directly after the fixed header).
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// Everything outside the RoCEv2 packet that its ICRC covers. Lengths are derived from
/// the packet, as the kernel would fill them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcrcParams {
    /// IP fields.
    pub ip: IpParams,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791 unless configured otherwise).
    pub dst_port: u16,
}

const LRH_STANDIN: [u8; 8] = [0xFF; 8];
const UDP_HEADER_LEN: usize = 8;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;

/// The reflected CRC-32 polynomial (IEEE 802.3, zlib), for the table code in `short.rs`
/// and `combine.rs`.
const POLY: u32 = 0xEDB8_8320;

/// Most bytes the pseudo-headers (LRH stand-in + IP with options + UDP) can take.
const PREFIX_MAX: usize = LRH_STANDIN.len() + 60 + UDP_HEADER_LEN;

/// A stack buffer for the pseudo-headers.
type Head = [u8; PREFIX_MAX];

/// Below this many bytes a body's rest (extension headers, payload, pad after the BTH) is
/// hashed by the table walk in `short.rs`; from it on by softnic-crc (crc32fast below
/// [`softnic_crc::WIDE_MIN_LEN`], where crc32fast's own short path is a slice-by-16 table).
const SHORT_MAX: usize = 64;

/// Finishes an ICRC whose pseudo-headers are `head[..prefix_len]`: hashes them, then
/// `body` as [`crc_body`] does.
fn crc_with_head(head: &Head, prefix_len: usize, body: &[u8]) -> Result<u32> {
    crc_body(short::update(0, &head[..prefix_len]), body)
}

/// Continues `crc` — the CRC after the LRH stand-in and the masked IP/UDP headers (a
/// [`PreparedIcrc`]'s prefix CRC) — over `body` (BTH … last byte before the ICRC): the
/// BTH with byte 4 masked, then the rest straight from the packet. Hashing the rest in
/// place matters: gathering it into a stack buffer first cost ~10 ns per 64-byte packet
/// (docs/perf.md).
#[inline(always)]
fn crc_body(crc: u32, body: &[u8]) -> Result<u32> {
    let Some((bth, rest)) = body.split_first_chunk::<{ bth::HEADER_LEN }>() else {
        return Err(Error::Truncated {
            layer: Layer::Bth,
            need: bth::HEADER_LEN,
            have: body.len(),
        });
    };
    Ok(finish(short::update_masked_bth(crc, bth), rest))
}

/// Finishes `crc` over `rest`: a short one by the table walk (no hasher to set up for an
/// 8-byte payload), a long one through softnic-crc (its parallel-fold kernel from
/// [`softnic_crc::WIDE_MIN_LEN`] bytes on, ≈ 9 % faster than crc32fast per 4 KiB,
/// docs/perf.md).
fn finish(crc: u32, rest: &[u8]) -> u32 {
    if rest.len() < SHORT_MAX {
        return short::update(crc, rest);
    }
    softnic_crc::update(crc, rest)
}

/// Splits a RoCEv2 UDP payload into the part the ICRC covers and the carried ICRC.
fn split_icrc(roce: &[u8]) -> Result<(&[u8], u32)> {
    if roce.len() < bth::HEADER_LEN + ICRC_LEN {
        return Err(Error::Truncated {
            layer: Layer::Payload,
            need: bth::HEADER_LEN + ICRC_LEN,
            have: roce.len(),
        });
    }
    let (body, tail) = roce.split_at(roce.len() - ICRC_LEN);
    let mut c = [0u8; 4];
    c.copy_from_slice(tail);
    Ok((body, u32::from_le_bytes(c)))
}

impl IcrcParams {
    /// The masked IP + UDP pseudo-headers for a RoCEv2 UDP payload of `roce_len` bytes
    /// (ICRC included), written into `out`; returns how many bytes were written.
    fn pseudo_headers(&self, roce_len: usize, out: &mut [u8]) -> usize {
        let udp_len = (UDP_HEADER_LEN + roce_len) as u16;
        let n = match self.ip {
            IpParams::V4 {
                src,
                dst,
                id,
                dont_fragment,
            } => {
                let total = udp_len.wrapping_add(IPV4_HEADER_LEN as u16);
                let flags: u16 = if dont_fragment { 0x4000 } else { 0 };
                out[0] = 0x45;
                out[1] = 0xFF; // TOS masked
                out[2..4].copy_from_slice(&total.to_be_bytes());
                out[4..6].copy_from_slice(&id.to_be_bytes());
                out[6..8].copy_from_slice(&flags.to_be_bytes());
                out[8] = 0xFF; // TTL masked
                out[9] = 17;
                out[10] = 0xFF; // checksum masked
                out[11] = 0xFF;
                out[12..16].copy_from_slice(&src.octets());
                out[16..20].copy_from_slice(&dst.octets());
                IPV4_HEADER_LEN
            }
            IpParams::V6 { src, dst } => {
                out[0] = 0x6F; // version 6; traffic class and flow label masked
                out[1] = 0xFF;
                out[2] = 0xFF;
                out[3] = 0xFF;
                out[4..6].copy_from_slice(&udp_len.to_be_bytes());
                out[6] = 17;
                out[7] = 0xFF; // hop limit masked
                out[8..24].copy_from_slice(&src.octets());
                out[24..40].copy_from_slice(&dst.octets());
                IPV6_HEADER_LEN
            }
        };
        out[n..n + 2].copy_from_slice(&self.src_port.to_be_bytes());
        out[n + 2..n + 4].copy_from_slice(&self.dst_port.to_be_bytes());
        out[n + 4..n + 6].copy_from_slice(&udp_len.to_be_bytes());
        out[n + 6] = 0xFF; // UDP checksum masked
        out[n + 7] = 0xFF;
        n + UDP_HEADER_LEN
    }

    /// Computes the ICRC of a RoCEv2 UDP payload `roce` (BTH … ICRC; the last four bytes
    /// are the ICRC slot and are not covered).
    pub fn compute(&self, roce: &[u8]) -> Result<u32> {
        let (body, _) = split_icrc(roce)?;
        let mut head: Head = [0; PREFIX_MAX];
        head[..LRH_STANDIN.len()].copy_from_slice(&LRH_STANDIN);
        let n = self.pseudo_headers(roce.len(), &mut head[LRH_STANDIN.len()..]);
        crc_with_head(&head, LRH_STANDIN.len() + n, body)
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

/// Compares `computed` with the ICRC carried at the end of `roce`.
fn check(roce: &[u8], computed: u32) -> Result<()> {
    let (_, carried) = split_icrc(roce)?;
    if computed == carried {
        Ok(())
    } else {
        Err(Error::BadIcrc { computed, carried })
    }
}

/// Writes `icrc` into the last four bytes of `roce` (least-significant byte first).
/// `roce` was already checked by the `compute` that produced `icrc`.
fn store(roce: &mut [u8], icrc: u32) {
    let n = roce.len();
    if let Some(slot) = roce.get_mut(n.saturating_sub(ICRC_LEN)..) {
        slot.copy_from_slice(&icrc.to_le_bytes());
    }
}

/// Computes the ICRC from the raw IP and UDP headers as captured (masking applied here),
/// for frames whose headers are at hand. `ip_header` is the whole IPv4 header (options
/// included) or the 40-byte IPv6 header; `roce` runs from the BTH to the ICRC.
pub fn compute_from_headers(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    let (body, _) = split_icrc(roce)?;
    let mut ip = [0u8; 60];
    let n = ip_header.len().min(ip.len());
    ip[..n].copy_from_slice(&ip_header[..n]);
    match ip.first().map(|v| v >> 4) {
        Some(4) => {
            crate::error::check_len(Layer::Ipv4, ip_header, IPV4_HEADER_LEN)?;
            ip[1] = 0xFF;
            ip[8] = 0xFF;
            ip[10] = 0xFF;
            ip[11] = 0xFF;
        }
        Some(6) => {
            crate::error::check_len(Layer::Ipv6, ip_header, IPV6_HEADER_LEN)?;
            ip[0] |= 0x0F;
            ip[1] = 0xFF;
            ip[2] = 0xFF;
            ip[3] = 0xFF;
            ip[7] = 0xFF;
        }
        _ => return Err(Error::NotRoce("IP version is neither 4 nor 6")),
    }
    crate::error::check_len(Layer::Udp, udp_header, UDP_HEADER_LEN)?;
    let mut head: Head = [0; PREFIX_MAX];
    let lrh = LRH_STANDIN.len();
    head[..lrh].copy_from_slice(&LRH_STANDIN);
    head[lrh..lrh + n].copy_from_slice(&ip[..n]);
    let udp = lrh + n;
    head[udp..udp + UDP_HEADER_LEN].copy_from_slice(&udp_header[..UDP_HEADER_LEN]);
    head[udp + 6] = 0xFF; // UDP checksum masked
    head[udp + 7] = 0xFF;
    crc_with_head(&head, udp + UDP_HEADER_LEN, body)
}

/// Verifies the ICRC of `roce` against raw captured IP and UDP headers.
pub fn verify_from_headers(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<()> {
    check(roce, compute_from_headers(ip_header, udp_header, roce)?)
}

/// Recovers the IPv4 Identification under which the ICRC of `roce` matches, for a
/// receiver that (like any plain UDP socket) cannot see the IPv4 header.
///
/// CRC-32 is affine over GF(2): `crc(id) = crc(0) ^ Σ bit_i(id)·d_i`, where `d_i` is the
/// CRC difference that flipping ID bit `i` causes, which depends only on the packet
/// length. So the ID that makes the ICRC match is the solution of a 32×16 linear system
/// `D·id = crc(0) ^ carried`. When a solution exists it is unique (the 16 columns are
/// independent) and is returned; a packet with any corruption outside the ID has a
/// solution only with probability 2^-16 — this check keeps 16 of the ICRC's 32 bits.
/// `params.ip` must be `V4`; its `id` is ignored.
pub fn solve_ipv4_id(params: &IcrcParams, roce: &[u8]) -> Result<u16> {
    let IpParams::V4 {
        src,
        dst,
        dont_fragment,
        ..
    } = params.ip
    else {
        return Err(Error::NotRoce("IPv6 has no Identification field"));
    };
    let (_, carried) = split_icrc(roce)?;
    let with = |id: u16| IcrcParams {
        ip: IpParams::V4 {
            src,
            dst,
            id,
            dont_fragment,
        },
        ..*params
    };
    let base = with(0).compute(roce)?;
    let target = base ^ carried;
    // Column i: CRC difference for ID bit i. Difference of a CRC is linear in the
    // flipped message bits, and the distance from the ID to the end of the message is
    // fixed, so the columns can be computed with two CRCs each.
    let mut cols = [0u32; 16];
    for (i, c) in cols.iter_mut().enumerate() {
        *c = with(1 << i).compute(roce)? ^ base;
    }
    // Gaussian elimination over GF(2): reduce the columns to pivot form while tracking
    // which ID bits make up each reduced column.
    let mut basis: [(u32, u16); 16] = [(0, 0); 16];
    for (i, &c) in cols.iter().enumerate() {
        basis[i] = (c, 1 << i);
    }
    let mut rank = 0;
    for bit in (0..32).rev() {
        let mask = 1u32 << bit;
        let Some(p) = (rank..16).find(|&k| basis[k].0 & mask != 0) else {
            continue;
        };
        basis.swap(rank, p);
        for k in 0..16 {
            if k != rank && basis[k].0 & mask != 0 {
                basis[k].0 ^= basis[rank].0;
                basis[k].1 ^= basis[rank].1;
            }
        }
        rank += 1;
    }
    let mut rem = target;
    let mut id = 0u16;
    for &(v, ids) in &basis[..rank] {
        let top = 31 - v.leading_zeros();
        if rem & (1 << top) != 0 {
            rem ^= v;
            id ^= ids;
        }
    }
    if rem == 0 {
        Ok(id)
    } else {
        Err(Error::BadIcrc {
            computed: base,
            carried,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// ConnectX-4 Lx CNP from scapy's test/contrib/roce.uts (see shared/roce/README.md).
    const CNP_FRAME: &str = "e41d2dab2bc27cfe90643b32 0800 45c2003c718c40004011 9161 0a001101 0a001201 0000 12b7 0028 0000 8100ffff 40000118 00000000 00000000000000000000000000000000 82fd002a";

    #[test]
    fn scapy_connectx_cnp_vector() {
        let f = hex(CNP_FRAME);
        let (ip, rest) = f[14..].split_at(20);
        let (udp, roce) = rest.split_at(8);
        verify_from_headers(ip, udp, roce).unwrap();
        assert_eq!(&roce[roce.len() - 4..], &[0x82, 0xfd, 0x00, 0x2a]);
        let p = IcrcParams {
            ip: IpParams::V4 {
                src: Ipv4Addr::new(10, 0, 17, 1),
                dst: Ipv4Addr::new(10, 0, 18, 1),
                id: 0x718c,
                dont_fragment: true,
            },
            src_port: 0,
            dst_port: 4791,
        };
        p.verify(roce).unwrap();
        assert_eq!(solve_ipv4_id(&p, roce).unwrap(), 0x718c);
        let mut copy = roce.to_vec();
        copy[20] ^= 1;
        assert!(p.verify(&copy).is_err());
        assert!(verify_from_headers(ip, udp, &copy).is_err());
    }

    #[test]
    fn fill_then_verify_v6() {
        let p = IcrcParams {
            ip: IpParams::V6 {
                src: "fd00::1".parse().unwrap(),
                dst: "fd00::2".parse().unwrap(),
            },
            src_port: 49441,
            dst_port: 4791,
        };
        let mut roce = [0u8; 12 + 8 + 4];
        roce[0] = 0x04;
        roce[12..20].copy_from_slice(b"payload!");
        p.fill(&mut roce).unwrap();
        p.verify(&roce).unwrap();
        // BTH byte 4 is masked: FECN/BECN changes keep the ICRC valid (IBTA A17.4.1.1).
        roce[4] = 0xC0;
        p.verify(&roce).unwrap();
        roce[5] = 1;
        assert!(p.verify(&roce).is_err());
        assert!(solve_ipv4_id(&p, &roce).is_err());
    }

    #[test]
    fn short_inputs_are_errors() {
        let p = IcrcParams {
            ip: IpParams::V4 {
                src: Ipv4Addr::LOCALHOST,
                dst: Ipv4Addr::LOCALHOST,
                id: 0,
                dont_fragment: true,
            },
            src_port: 1,
            dst_port: 4791,
        };
        for n in 0..16 {
            assert!(p.compute(&vec![0; n]).is_err());
            assert!(solve_ipv4_id(&p, &vec![0; n]).is_err());
        }
        assert!(compute_from_headers(&[0x45; 10], &[0; 8], &[0; 16]).is_err());
        assert!(compute_from_headers(&[0x00; 20], &[0; 8], &[0; 16]).is_err());
    }
}
