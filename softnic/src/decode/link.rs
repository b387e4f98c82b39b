//! From a captured frame to the RoCEv2 packet inside it, for each supported link type.
//!
//! A frame is *RoCEv2* when it is IPv4 or IPv6 carrying UDP to the RoCEv2 port (4791,
//! IANA; or the one given with `--port`). Other frames are skipped. A RoCEv2 frame that
//! `wire::frame` cannot take apart (cut short by the snap length, inconsistent lengths,
//! a fragment) is an error, not a skip: it would otherwise vanish from the output
//! silently.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use wire::frame::RoceFrame;

use super::capture::LinkType;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
const IPPROTO_UDP: u8 = 17;

/// What a frame turned out to be.
#[derive(Debug)]
pub enum Classified<'a> {
    /// A RoCEv2 packet with its outer headers.
    Roce(RoceFrame<'a>),
    /// UDP to the RoCEv2 port, but the outer layers are broken. The addresses are
    /// given when the IP and UDP headers were captured far enough to read them.
    Broken(wire::Error, Option<(SocketAddr, SocketAddr)>),
    /// Anything else.
    Other,
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(off)?, *b.get(off + 1)?]))
}

/// The IP packet inside a frame of link type `link`, or `None` when the frame does not
/// carry IP (or the link type is not supported).
fn ip_of(link: LinkType, data: &[u8]) -> Option<&[u8]> {
    let after_ethertype = |off: usize| -> Option<&[u8]> {
        match be16(data, off)? {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => data.get(off + 2..),
            _ => None,
        }
    };
    match link {
        LinkType::ETHERNET => {
            let mut off = 12;
            // 802.1Q / 802.1ad tags; bounded by the frame length.
            while matches!(be16(data, off)?, ETHERTYPE_VLAN | ETHERTYPE_QINQ) {
                off += 4;
            }
            after_ethertype(off)
        }
        LinkType::RAW | LinkType::IPV4 | LinkType::IPV6 => Some(data),
        // SLL: packet type, ARPHRD, address length, 8 address bytes, protocol at 14.
        LinkType::LINUX_SLL => after_ethertype(14),
        // SLL2: protocol first, then reserved, ifindex, ARPHRD, type, address; 20 bytes.
        LinkType::LINUX_SLL2 => match be16(data, 0)? {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => data.get(20..),
            _ => None,
        },
        // BSD loopback: a 4-byte address family; the IP version nibble says the rest.
        LinkType::NULL | LinkType::LOOP => data.get(4..),
        _ => None,
    }
}

/// The UDP destination port of an IP packet, if it is a UDP packet (or first fragment)
/// whose UDP header was captured.
fn udp_dst_port(ip: &[u8]) -> Option<u16> {
    let version = ip.first()? >> 4;
    let udp_off = match version {
        4 => {
            let ihl = usize::from(ip.first()? & 0x0F) * 4;
            let frag_off = be16(ip, 6)? & 0x1FFF;
            if ihl < 20 || *ip.get(9)? != IPPROTO_UDP || frag_off != 0 {
                return None;
            }
            ihl
        }
        6 => {
            if *ip.get(6)? != IPPROTO_UDP {
                return None;
            }
            40
        }
        _ => return None,
    };
    be16(ip, udp_off + 2)
}

/// Source and destination address and port of an IP/UDP packet whose headers are
/// captured at least as far as the UDP ports (for error messages).
fn endpoints(ip: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let arr4 = |o: usize| -> Option<[u8; 4]> { ip.get(o..o + 4)?.try_into().ok() };
    let arr16 = |o: usize| -> Option<[u8; 16]> { ip.get(o..o + 16)?.try_into().ok() };
    let (src, dst, udp) = match ip.first()? >> 4 {
        4 => (
            IpAddr::V4(Ipv4Addr::from(arr4(12)?)),
            IpAddr::V4(Ipv4Addr::from(arr4(16)?)),
            usize::from(ip.first()? & 0x0F) * 4,
        ),
        6 => (
            IpAddr::V6(Ipv6Addr::from(arr16(8)?)),
            IpAddr::V6(Ipv6Addr::from(arr16(24)?)),
            40,
        ),
        _ => return None,
    };
    Some((
        SocketAddr::new(src, be16(ip, udp)?),
        SocketAddr::new(dst, be16(ip, udp + 2)?),
    ))
}

/// Classifies a frame: RoCEv2 to `port`, broken RoCEv2, or something else.
pub fn classify(link: LinkType, data: &[u8], port: u16) -> Classified<'_> {
    let Some(ip) = ip_of(link, data) else {
        return Classified::Other;
    };
    if udp_dst_port(ip) != Some(port) {
        return Classified::Other;
    }
    match wire::frame::parse_ip(ip, port) {
        Ok(f) => Classified::Roce(f),
        Err(e) => Classified::Broken(e, endpoints(ip)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal IPv4/UDP packet to `port` with `n` payload bytes.
    fn ipv4_udp(port: u16, n: usize) -> Vec<u8> {
        let total = (20 + 8 + n) as u16;
        let mut p = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend(1234u16.to_be_bytes());
        p.extend(port.to_be_bytes());
        p.extend(((8 + n) as u16).to_be_bytes());
        p.extend([0, 0]);
        p.extend(vec![0u8; n]);
        p
    }

    #[test]
    fn link_types_reach_the_ip_packet() {
        let ip = ipv4_udp(4791, 16);
        let mut eth = vec![0u8; 12];
        eth.extend([0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        eth.extend(&ip);
        let mut sll = vec![0u8; 14];
        sll.extend([0x08, 0x00]);
        sll.extend(&ip);
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend([0u8; 18]);
        sll2.extend(&ip);
        let mut null = 2u32.to_le_bytes().to_vec();
        null.extend(&ip);
        for (link, frame) in [
            (LinkType::ETHERNET, &eth),
            (LinkType::LINUX_SLL, &sll),
            (LinkType::LINUX_SLL2, &sll2),
            (LinkType::NULL, &null),
            (LinkType::RAW, &ip),
            (LinkType::IPV4, &ip),
        ] {
            match classify(link, frame, 4791) {
                Classified::Roce(f) => assert_eq!(f.roce.len(), 16),
                other => panic!("{link:?}: {other:?}"),
            }
            assert!(matches!(classify(link, frame, 4792), Classified::Other));
        }
        assert!(matches!(
            classify(LinkType(147), &ip, 4791),
            Classified::Other
        ));
    }

    #[test]
    fn snapped_roce_frame_is_broken_not_skipped() {
        let ip = ipv4_udp(4791, 64);
        assert!(matches!(
            classify(LinkType::RAW, &ip[..40], 4791),
            Classified::Broken(_, Some(_))
        ));
        for n in 0..30 {
            // Shorter than the UDP header: not recognisable as RoCEv2, so skipped.
            assert!(!matches!(
                classify(LinkType::RAW, &ip[..n], 4791),
                Classified::Roce(_)
            ));
        }
    }
}
