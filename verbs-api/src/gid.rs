//! Global identifiers (`union ibv_gid`).
//!
//! On RoCEv2 a GID is an IP address: an IPv4 address appears IPv4-mapped
//! (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2), as rxe and hardware RNICs show it in
//! `/sys/class/infiniband/*/ports/1/gids/`. softnic's GID index 0 is its bound address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The UDP destination port of RoCEv2 (IANA; IBTA Annex A17.2.3).
pub const ROCE_V2_PORT: u16 = 4791;

/// A 16-byte GID, in wire order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4-mapped for IPv4).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for (IPv4 for an IPv4-mapped GID).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The peer NIC's UDP endpoint for this GID and `port` (normally [`ROCE_V2_PORT`]).
    pub fn to_socket_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.to_ip(), port)
    }

    /// True for the all-zero GID (an unset entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The raw bytes.
    pub fn raw(&self) -> [u8; 16] {
        self.0
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(v4: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(v4))
    }
}

impl From<[u8; 16]> for Gid {
    fn from(b: [u8; 16]) -> Gid {
        Gid(b)
    }
}

/// As `inet_ntop(AF_INET6)` prints it (what `ibv_rc_pingpong` shows): `::ffff:127.0.0.1`.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Parses an IPv6 text form (`::ffff:10.0.0.1`, `fe80::1`) or an IPv4 address (mapped).
impl FromStr for Gid {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        match s.parse::<Ipv6Addr>() {
            Ok(v6) => Ok(Gid(v6.octets())),
            Err(e) => s.parse::<Ipv4Addr>().map(Gid::from).map_err(|_| e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_maps_and_unmaps() {
        let g = Gid::from(Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(
            g.0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2]
        );
        assert_eq!(g.to_string(), "::ffff:127.0.0.2");
        assert_eq!(
            g.to_socket_addr(4791),
            "127.0.0.2:4791".parse::<SocketAddr>().unwrap()
        );
        assert_eq!("::ffff:127.0.0.2".parse::<Gid>().unwrap(), g);
        assert_eq!("127.0.0.2".parse::<Gid>().unwrap(), g);
    }

    #[test]
    fn ipv6_stays_ipv6() {
        let g: Gid = "fd00::5".parse().unwrap();
        assert_eq!(g.to_ip(), "fd00::5".parse::<IpAddr>().unwrap());
        assert!(!g.is_zero());
        assert!(Gid::default().is_zero());
        assert!("nonsense".parse::<Gid>().is_err());
    }
}
