//! The RDMA IP CM service (IBTA Annex A11; Linux `drivers/infiniband/core/cma.c`): how
//! `rdma_cm` maps an IP port onto a CM service ID, and the 36-byte header it puts at
//! the start of a REQ's (or SIDR REQ's) private data so the passive side learns the
//! active side's IP address and port.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::field::*;

/// Bytes of the IP CM header.
pub const CMA_HEADER_LEN: usize = 36;

/// The service ID of IP port `port` in `rdma_cm` port space `ps` (`RDMA_PS_TCP` =
/// 0x0106, `RDMA_PS_UDP` = 0x0111): `ps << 16 | port` (Linux `RDMA_IB_IP_PS_TCP |
/// port`, IBTA A11.2.1's "0x0000 0000 01 pp pppp" with protocol and port).
pub fn ip_service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The port space and port of an IP CM service ID, or `None` if `sid` is not one
/// (its upper 40 bits are not `0x00000000_01`).
pub fn service_port_space(sid: u64) -> Option<(u16, u16)> {
    if sid >> 24 != 0x01 {
        return None;
    }
    Some(((sid >> 16) as u16, sid as u16))
}

/// The IP CM private-data header (Linux `struct cma_hdr`): version 0, IP version in
/// the upper nibble of byte 1, the active side's source port, then source and
/// destination addresses, 16 bytes each (an IPv4 address in the last 4, the rest 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// CM version byte (major nibble, minor nibble; 0.0 in Linux).
    pub cma_version: u8,
    /// Source IP (the active side).
    pub src: IpAddr,
    /// Destination IP (the passive side).
    pub dst: IpAddr,
    /// The active side's source port.
    pub src_port: u16,
}

impl CmaHeader {
    /// Reads the header from the start of `private_data`; `None` if it is shorter
    /// than [`CMA_HEADER_LEN`], its version is not 0, or its IP version is neither 4
    /// nor 6.
    pub fn parse(private_data: &[u8]) -> Option<CmaHeader> {
        let b = private_data.get(..CMA_HEADER_LEN)?;
        if get_u8(b, 0) != 0 {
            return None;
        }
        let src: [u8; 16] = get_array(b, 4);
        let dst: [u8; 16] = get_array(b, 20);
        let (src, dst) = match get_u8(b, 1) >> 4 {
            4 => (
                IpAddr::V4(Ipv4Addr::from(get_u32(&src, 12))),
                IpAddr::V4(Ipv4Addr::from(get_u32(&dst, 12))),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
            ),
            _ => return None,
        };
        Some(CmaHeader {
            cma_version: 0,
            src,
            dst,
            src_port: get_u16(b, 2),
        })
    }

    /// Writes the header into the first [`CMA_HEADER_LEN`] bytes of `out` (nothing if
    /// `out` is shorter). IP version 4 when both addresses are IPv4; otherwise 6,
    /// with an IPv4 address written IPv4-mapped.
    pub fn emit(&self, out: &mut [u8]) {
        let Some(b) = out.get_mut(..CMA_HEADER_LEN) else {
            return;
        };
        b.fill(0);
        put_u8(b, 0, self.cma_version);
        let v4 = self.src.is_ipv4() && self.dst.is_ipv4();
        put_u8(b, 1, if v4 { 4 << 4 } else { 6 << 4 });
        put_u16(b, 2, self.src_port);
        for (at, ip) in [(4, self.src), (20, self.dst)] {
            match ip {
                IpAddr::V4(a) if v4 => put_u32(b, at + 12, u32::from(a)),
                IpAddr::V4(a) => put_slice(b, at, &a.to_ipv6_mapped().octets()),
                IpAddr::V6(a) => put_slice(b, at, &a.octets()),
            }
        }
    }
}
