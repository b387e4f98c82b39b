//! The layers around a RoCEv2 packet in a captured frame: Ethernet II (with optional
//! 802.1Q / 802.1ad tags) → IPv4 or IPv6 → UDP → RoCEv2. Used by capture readers and
//! writers and by any raw-socket path; the NIC's UDP path never sees these headers.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{get_u16, get_u8};
use crate::error::{check_len, Error, Layer, Result};
use crate::icrc::{IcrcParams, IpParams};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
const IPPROTO_UDP: u8 = 17;

/// Ethernet II header length.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// A RoCEv2 packet found inside a frame, with the outer fields that matter to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Outermost VLAN ID, if tagged.
    pub vlan: Option<u16>,
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// IPv4 Identification (0 for IPv6).
    pub ipv4_id: u16,
    /// DSCP and ECN (IPv4 TOS / IPv6 traffic class).
    pub tos: u8,
    /// The raw IP header (IPv4 with options, or the fixed IPv6 header).
    pub ip_header: &'a [u8],
    /// The raw UDP header.
    pub udp_header: &'a [u8],
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload: BTH … ICRC.
    pub roce: &'a [u8],
}

impl RoceFrame<'_> {
    /// The ICRC parameters of this frame.
    pub fn icrc_params(&self) -> IcrcParams {
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpParams::V4 {
                src,
                dst,
                id: self.ipv4_id,
                dont_fragment: get_u16(self.ip_header, 6) & 0x4000 != 0,
            },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpParams::V6 { src, dst },
            // Mixed families cannot come out of `parse_ip`.
            _ => IpParams::V6 {
                src: Ipv6Addr::UNSPECIFIED,
                dst: Ipv6Addr::UNSPECIFIED,
            },
        };
        IcrcParams {
            ip,
            src_port: self.src_port,
            dst_port: self.dst_port,
        }
    }

    /// Verifies the ICRC against the frame's own IP and UDP headers.
    pub fn verify_icrc(&self) -> Result<()> {
        crate::icrc::verify_from_headers(self.ip_header, self.udp_header, self.roce)
    }
}

/// Parses an Ethernet II frame and returns the RoCEv2 packet it carries to UDP `port`.
/// Frames that are not IP/UDP to `port` give [`Error::NotRoce`].
pub fn parse_ethernet(frame: &[u8], port: u16) -> Result<RoceFrame<'_>> {
    check_len(Layer::Ethernet, frame, ETHERNET_HEADER_LEN)?;
    let mut off = 12;
    let mut vlan = None;
    let mut ethertype = get_u16(frame, off);
    while ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
        check_len(Layer::Vlan, frame, off + 6)?;
        if vlan.is_none() {
            vlan = Some(get_u16(frame, off + 2) & 0x0FFF);
        }
        off += 4;
        ethertype = get_u16(frame, off);
    }
    if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
        return Err(Error::NotRoce("ethertype is not IPv4 or IPv6"));
    }
    let mut r = parse_ip(frame.get(off + 2..).unwrap_or(&[]), port)?;
    r.vlan = vlan;
    Ok(r)
}

/// Parses an IP packet (version from its first nibble) carrying UDP to `port`.
pub fn parse_ip(pkt: &[u8], port: u16) -> Result<RoceFrame<'_>> {
    match get_u8(pkt, 0) >> 4 {
        4 => parse_ipv4(pkt, port),
        6 => parse_ipv6(pkt, port),
        _ => Err(Error::NotRoce("not IPv4 or IPv6")),
    }
}

fn parse_ipv4(pkt: &[u8], port: u16) -> Result<RoceFrame<'_>> {
    check_len(Layer::Ipv4, pkt, 20)?;
    let ihl = usize::from(get_u8(pkt, 0) & 0x0F) * 4;
    if ihl < 20 {
        return Err(Error::NotRoce("IPv4 header length below 20"));
    }
    check_len(Layer::Ipv4, pkt, ihl)?;
    if get_u8(pkt, 9) != IPPROTO_UDP {
        return Err(Error::NotRoce("not UDP"));
    }
    let frag = get_u16(pkt, 6);
    if frag & 0x3FFF != 0 {
        return Err(Error::NotRoce("IPv4 fragment"));
    }
    let total = usize::from(get_u16(pkt, 2));
    if total < ihl || total > pkt.len() {
        return Err(Error::NotRoce("IPv4 total length inconsistent with frame"));
    }
    let a = |o: usize| Ipv4Addr::new(pkt[o], pkt[o + 1], pkt[o + 2], pkt[o + 3]);
    let (src, dst) = (a(12), a(16));
    let mut r = parse_udp(&pkt[ihl..total], port)?;
    r.src = IpAddr::V4(src);
    r.dst = IpAddr::V4(dst);
    r.ipv4_id = get_u16(pkt, 4);
    r.tos = get_u8(pkt, 1);
    r.ip_header = &pkt[..ihl];
    Ok(r)
}

fn parse_ipv6(pkt: &[u8], port: u16) -> Result<RoceFrame<'_>> {
    check_len(Layer::Ipv6, pkt, 40)?;
    if get_u8(pkt, 6) != IPPROTO_UDP {
        return Err(Error::NotRoce("not UDP (or IPv6 extension headers)"));
    }
    let plen = usize::from(get_u16(pkt, 4));
    if 40 + plen > pkt.len() {
        return Err(Error::NotRoce("IPv6 payload length exceeds frame"));
    }
    let mut s = [0u8; 16];
    let mut d = [0u8; 16];
    s.copy_from_slice(&pkt[8..24]);
    d.copy_from_slice(&pkt[24..40]);
    let mut r = parse_udp(&pkt[40..40 + plen], port)?;
    r.src = IpAddr::V6(Ipv6Addr::from(s));
    r.dst = IpAddr::V6(Ipv6Addr::from(d));
    r.tos = ((get_u16(pkt, 0) >> 4) & 0xFF) as u8;
    r.ip_header = &pkt[..40];
    Ok(r)
}

fn parse_udp(seg: &[u8], port: u16) -> Result<RoceFrame<'_>> {
    check_len(Layer::Udp, seg, 8)?;
    let dst_port = get_u16(seg, 2);
    if dst_port != port {
        return Err(Error::NotRoce(
            "UDP destination port is not the RoCEv2 port",
        ));
    }
    let len = usize::from(get_u16(seg, 4));
    if len < 8 || len > seg.len() {
        return Err(Error::NotRoce("UDP length inconsistent with IP length"));
    }
    Ok(RoceFrame {
        vlan: None,
        src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        ipv4_id: 0,
        tos: 0,
        ip_header: &[],
        udp_header: &seg[..8],
        src_port: get_u16(seg, 0),
        dst_port,
        roce: &seg[8..len],
    })
}

/// What [`emit_ethernet`] needs to wrap a RoCEv2 packet into a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameParams {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// IP and UDP fields (the same that the ICRC covers).
    pub icrc: IcrcParams,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 TOS / IPv6 traffic class (DSCP and ECN): the path's traffic class
    /// (`ibv_global_route.traffic_class`), as rxe and hardware RNICs put it there. The
    /// ICRC masks it (IBTA A17.4.1.1), so it can differ from what the ICRC saw.
    pub tos: u8,
}

/// Bytes of Ethernet + IP + UDP headers that [`emit_ethernet`] puts before the packet.
pub fn outer_len(p: &FrameParams) -> usize {
    ETHERNET_HEADER_LEN
        + 8
        + match p.icrc.ip {
            IpParams::V4 { .. } => 20,
            IpParams::V6 { .. } => 40,
        }
}

/// Writes the IP header of a UDP datagram of `udp_len` bytes (UDP header included) with
/// the addresses and IPv4 fields of `ip` and IP TOS / IPv6 traffic class and TTL / hop
/// limit `(tos, ttl)` at the start of `out`, as a Linux sender fills it: IPv4 with IHL 5
/// and its checksum computed, IPv6 with flow label 0. Returns its length (20 or 40).
/// Also what a UD receive's GRH holds (softnic-transport's `synth_grh`).
pub fn emit_ip_header(
    ip: &IpParams,
    (tos, ttl): (u8, u8),
    udp_len: u16,
    out: &mut [u8],
) -> Result<usize> {
    let need = match ip {
        IpParams::V4 { .. } => 20,
        IpParams::V6 { .. } => 40,
    };
    let Some(h) = out.get_mut(..need) else {
        return Err(Error::BufferTooSmall {
            need,
            have: out.len(),
        });
    };
    match *ip {
        IpParams::V4 {
            src,
            dst,
            id,
            dont_fragment,
        } => {
            h[0] = 0x45;
            h[1] = tos;
            h[2..4].copy_from_slice(&udp_len.wrapping_add(20).to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
            h[6..8].copy_from_slice(&(if dont_fragment { 0x4000u16 } else { 0 }).to_be_bytes());
            h[8] = ttl;
            h[9] = IPPROTO_UDP;
            h[10] = 0;
            h[11] = 0;
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            let c = ipv4_checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
        IpParams::V6 { src, dst } => {
            // Version 6, traffic class, flow label 0.
            h[0..4].copy_from_slice(&(0x6000_0000u32 | (u32::from(tos) << 20)).to_be_bytes());
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = IPPROTO_UDP;
            h[7] = ttl;
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
        }
    }
    Ok(need)
}

/// Writes an Ethernet/IP/UDP frame around `roce` (BTH … ICRC) into `out`, with the
/// header fields a Linux sender would produce (IPv4 checksum computed, UDP checksum 0
/// as rxe and hardware send it). Returns the frame length.
pub fn emit_ethernet(p: &FrameParams, roce: &[u8], out: &mut [u8]) -> Result<usize> {
    let hl = outer_len(p);
    let total = hl + roce.len();
    if out.len() < total {
        return Err(Error::BufferTooSmall {
            need: total,
            have: out.len(),
        });
    }
    out[0..6].copy_from_slice(&p.dst_mac);
    out[6..12].copy_from_slice(&p.src_mac);
    let udp_len = (8 + roce.len()) as u16;
    let iplen = emit_ip_header(
        &p.icrc.ip,
        (p.tos, p.ttl),
        udp_len,
        &mut out[ETHERNET_HEADER_LEN..],
    )?;
    let et = if iplen == 20 {
        ETHERTYPE_IPV4
    } else {
        ETHERTYPE_IPV6
    };
    out[12..14].copy_from_slice(&et.to_be_bytes());
    let u = ETHERNET_HEADER_LEN + iplen;
    out[u..u + 2].copy_from_slice(&p.icrc.src_port.to_be_bytes());
    out[u + 2..u + 4].copy_from_slice(&p.icrc.dst_port.to_be_bytes());
    out[u + 4..u + 6].copy_from_slice(&udp_len.to_be_bytes());
    out[u + 6..u + 8].copy_from_slice(&[0, 0]);
    out[hl..total].copy_from_slice(roce);
    Ok(total)
}

/// The RFC 791 header checksum of an IPv4 header whose checksum field is zero.
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in h.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        sum += u32::from(w);
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_then_parse_v4_and_v6() {
        let roce = {
            let mut r = [0u8; 12 + 4];
            r[0] = 0x11 - 0x0D; // RC SEND_ONLY
            r
        };
        for ip in [
            IpParams::V4 {
                src: Ipv4Addr::new(127, 0, 0, 2),
                dst: Ipv4Addr::new(127, 0, 0, 3),
                id: 0,
                dont_fragment: true,
            },
            IpParams::V6 {
                src: Ipv6Addr::LOCALHOST,
                dst: Ipv6Addr::LOCALHOST,
            },
        ] {
            let p = FrameParams {
                dst_mac: [2, 0, 0, 0, 0, 1],
                src_mac: [2, 0, 0, 0, 0, 2],
                icrc: IcrcParams {
                    ip,
                    src_port: 0xC001,
                    dst_port: 4791,
                },
                ttl: 64,
                tos: 0xB9, // DSCP 46 (EF), ECN ECT(1)
            };
            let mut roce = roce;
            p.icrc.fill(&mut roce).unwrap();
            let mut buf = [0u8; 128];
            let n = emit_ethernet(&p, &roce, &mut buf).unwrap();
            let f = parse_ethernet(&buf[..n], 4791).unwrap();
            assert_eq!(f.roce, &roce[..]);
            assert_eq!(f.tos, 0xB9);
            assert_eq!(f.icrc_params(), p.icrc);
            f.verify_icrc().unwrap();
            assert!(matches!(
                parse_ethernet(&buf[..n], 4792),
                Err(Error::NotRoce(_))
            ));
            for k in 0..n {
                assert!(parse_ethernet(&buf[..k], 4791).is_err());
            }
        }
    }

    #[test]
    fn checksum_of_known_header() {
        // The scapy CNP vector's IPv4 header carries checksum 0x9161.
        let mut h = [
            0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0, 0, 0x0a, 0x00, 0x11,
            0x01, 0x0a, 0x00, 0x12, 0x01,
        ];
        assert_eq!(ipv4_checksum(&h), 0x9161);
        h[10] = 0x91;
        h[11] = 0x61;
        assert_eq!(ipv4_checksum(&h), 0);
    }
}
