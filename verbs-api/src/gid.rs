//! Global identifiers (`union ibv_gid`).
//!
//! On RoCEv2 a GID is an IP address: an IPv4 address appears IPv4-mapped
//! (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2), as rxe and hardware RNICs show it in
//! `/sys/class/infiniband/*/ports/1/gids/`.
//!
//! softnic's GID table is rxe's (so `-g 1` / `-x 1` scripts written for rxe work
//! unchanged): index 0 ([`LINK_LOCAL_GID_INDEX`]) is the link-local GID `fe80::` + the
//! node GUID as interface id, listed for compatibility but not routable by softnic (the
//! NIC has no IPv6 link-local socket); index 1 ([`ADDRESS_GID_INDEX`]) is the NIC's bound
//! address, the GID every QP sends from and peers address. Both are RoCE v2 GIDs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The UDP destination port of RoCEv2 (IANA; IBTA Annex A17.2.3).
pub const ROCE_V2_PORT: u16 = 4791;

/// GID index of the link-local GID (`fe80::` + interface id from the node GUID).
pub const LINK_LOCAL_GID_INDEX: u32 = 0;

/// GID index of the NIC's address (`::ffff:a.b.c.d`, or the IPv6 address): the only
/// source GID a QP may use.
pub const ADDRESS_GID_INDEX: u32 = 1;

/// Populated entries at the start of the GID table (indexes 0 and 1).
pub const GID_TABLE_LEN: u32 = 2;

/// The GID table's size as the port reports it (`gid_tbl_len`): rxe's
/// (`RXE_PORT_GID_TBL_LEN`, 1024 in Linux 6.1). Indexes from [`GID_TABLE_LEN`] up to
/// this are empty entries, which rdma-core answers with ENODATA in `ibv_query_gid_ex`
/// (the kernel's `rdma_get_gid_attr`) and an all-zero GID in `ibv_query_gid`;
/// pyverbs' `test_query_gid_ex_bad_flow` needs such an index.
pub const GID_TABLE_CAPACITY: u32 = 1024;

/// The node GUID (an EUI-64, host order) of a NIC bound to `addr`: `02:00` (locally
/// administered) followed by the IPv4 address and the UDP port, so two NICs on one host
/// differ; for IPv6, `02` followed by 56 bits of an FNV-1a hash of address and port.
pub fn node_guid(addr: SocketAddr) -> u64 {
    match addr.ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            let [p0, p1] = addr.port().to_be_bytes();
            u64::from_be_bytes([0x02, 0x00, a, b, c, d, p0, p1])
        }
        IpAddr::V6(v6) => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in v6.octets().into_iter().chain(addr.port().to_be_bytes()) {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            (0x02 << 56) | (h & 0x00ff_ffff_ffff_ffff)
        }
    }
}

/// The GID table of a NIC bound to `addr`, indexed by GID index.
pub fn gid_table(addr: SocketAddr) -> [Gid; GID_TABLE_LEN as usize] {
    // Link-local: fe80::/64 with the modified EUI-64 interface id (U/L bit inverted,
    // RFC 4291 appendix A), as rxe derives GID 0 from its netdev's MAC.
    let iid = node_guid(addr) ^ (0x02 << 56);
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[8..].copy_from_slice(&iid.to_be_bytes());
    [Gid(ll), Gid::from_ip(addr.ip())]
}

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
    fn table_is_link_local_then_address() {
        let a: SocketAddr = "127.0.0.2:4791".parse().unwrap();
        let t = gid_table(a);
        assert_eq!(
            t[ADDRESS_GID_INDEX as usize].to_string(),
            "::ffff:127.0.0.2"
        );
        assert_eq!(
            t[LINK_LOCAL_GID_INDEX as usize].to_string(),
            "fe80::7f00:2:12b7"
        );
        assert_eq!(node_guid(a), 0x0200_7f00_0002_12b7);
        // Another port on the same address: another GUID and link-local GID.
        let b: SocketAddr = "127.0.0.2:4792".parse().unwrap();
        assert_ne!(node_guid(a), node_guid(b));
        assert_ne!(gid_table(a)[0], gid_table(b)[0]);
        let v6: SocketAddr = "[fd00::1]:4791".parse().unwrap();
        assert_eq!(node_guid(v6) >> 56, 0x02);
        assert_eq!(gid_table(v6)[1].to_string(), "fd00::1");
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
