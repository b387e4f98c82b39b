//! GIDs of a RoCEv2 NIC and the UDP endpoints they stand for.
//!
//! RoCEv2 (IBTA Annex A17.4.2) puts an IP address where InfiniBand puts a GID: a NIC at
//! IPv4 `a.b.c.d` has the IPv4-mapped GID `::ffff:a.b.c.d`, and a NIC at an IPv6
//! address has that address as its GID. In the GID table clients see it is index 1;
//! index 0 is the link-local GID, as in rxe's table (`verbs_api::gid::gid_table`), so
//! `-g 1` / `-x 1` command lines written for rxe work unchanged.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The GID of a NIC bound to `addr`.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The IP address a GID stands for (IPv4-mapped GIDs give IPv4).
pub fn addr_of(gid: [u8; 16]) -> IpAddr {
    let a = Ipv6Addr::from(gid);
    match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    }
}

/// The UDP endpoint of a peer with this GID and port (0 = the RoCEv2 port 4791).
pub fn endpoint_of(gid: [u8; 16], port: u16) -> SocketAddr {
    let port = if port == 0 {
        wire::ROCEV2_UDP_PORT
    } else {
        port
    };
    SocketAddr::new(addr_of(gid), port)
}

/// True when this NIC (bound to `local`) can send to `peer`: same address family, and
/// neither unspecified nor multicast.
pub fn reachable(local: SocketAddr, peer: SocketAddr) -> bool {
    local.is_ipv4() == peer.is_ipv4() && !peer.ip().is_unspecified() && !peer.ip().is_multicast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_gid_is_mapped_and_round_trips() {
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let g = gid_of(a);
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]);
        assert_eq!(&g[12..], &[127, 0, 0, 2]);
        assert_eq!(addr_of(g), a);
        assert_eq!(endpoint_of(g, 0), "127.0.0.2:4791".parse().unwrap());
        assert_eq!(endpoint_of(g, 5000), "127.0.0.2:5000".parse().unwrap());
    }

    #[test]
    fn ipv6_gid_is_the_address() {
        let a: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(addr_of(gid_of(a)), a);
        assert!(!reachable(
            "127.0.0.1:4791".parse().unwrap(),
            "[fd00::1]:4791".parse().unwrap()
        ));
        assert!(reachable(
            "127.0.0.1:4791".parse().unwrap(),
            "127.0.0.3:4791".parse().unwrap()
        ));
    }
}
