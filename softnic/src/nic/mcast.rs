//! UD multicast: which QPs are attached to which group (`ibv_attach_mcast`), and the
//! sockets that receive the groups' datagrams.
//!
//! RoCEv2 carries a multicast datagram as an IP multicast packet: the group's GID
//! (IPv4-mapped `::ffff:224.0.0.0/4`, or an IPv6 `ff00::/8` address) is the IP
//! destination, the BTH's destination QP is the multicast QPN 0xFFFFFF (IBTA 9.6.1.1),
//! and every UD QP attached to the group whose Q_Key matches receives a copy, as in
//! rxe (`rxe_rcv_mcast_pkt`). Only UD QPs attach (`ibv_attach_mcast(3)`: multicast is
//! a datagram service).
//!
//! The NIC's unicast socket is bound to its own address and never sees group traffic,
//! so the NIC opens one socket per group that has attached QPs, bound to the group's
//! address and port 4791 with `SO_REUSEADDR` (several NICs of one host, and rxe's
//! kernel socket, share it) and joined on the NIC's own interface. [`McastTable`] is
//! the state (who is attached where), [`GroupSockets`] follows it: the runtime opens a
//! group's socket before the first attach and closes it once the last QP has left.

use std::io;
use std::net::{IpAddr, SocketAddr};

pub use verbs_api::abi::MULTICAST_QPN;
use verbs_api::abi::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH};

use super::gid;
use super::udp::UdpIo;

/// The group a GID names for a NIC bound to `local`: an IP multicast address of the
/// NIC's family, else `None`.
pub fn group_of(g: [u8; 16], local: SocketAddr) -> Option<IpAddr> {
    let a = gid::addr_of(g);
    (a.is_multicast() && a.is_ipv4() == local.is_ipv4()).then_some(a)
}

/// Why an attach or detach was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McastError {
    /// [`MAX_MCAST_GRP`] groups have QPs attached already.
    TooManyGroups,
    /// The group has [`MAX_MCAST_QP_ATTACH`] QPs attached already.
    GroupFull,
    /// Detach of a QP that is not attached to the group.
    NotAttached,
}

/// One group and its attached QPs, in attach order.
#[derive(Debug)]
struct Group {
    addr: IpAddr,
    qpns: Vec<u32>,
}

/// The attachments of one NIC. At most [`MAX_MCAST_GRP`] groups: a linear list is the
/// fastest look-up at that size.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: Vec<Group>,
}

impl McastTable {
    /// Attaches `qpn` to `group` (no change if it is attached already).
    pub fn attach(&mut self, group: IpAddr, qpn: u32) -> Result<(), McastError> {
        let full = self.full();
        match self.groups.iter_mut().find(|g| g.addr == group) {
            Some(g) if g.qpns.contains(&qpn) => Ok(()),
            Some(g) if g.qpns.len() >= MAX_MCAST_QP_ATTACH as usize => Err(McastError::GroupFull),
            Some(g) => {
                g.qpns.push(qpn);
                Ok(())
            }
            None if full => Err(McastError::TooManyGroups),
            None => {
                self.groups.push(Group {
                    addr: group,
                    qpns: vec![qpn],
                });
                Ok(())
            }
        }
    }

    /// Detaches `qpn` from `group`; the group goes when its last QP leaves.
    pub fn detach(&mut self, group: IpAddr, qpn: u32) -> Result<(), McastError> {
        let Some(i) = self.groups.iter().position(|g| g.addr == group) else {
            return Err(McastError::NotAttached);
        };
        let g = &mut self.groups[i];
        let Some(k) = g.qpns.iter().position(|&q| q == qpn) else {
            return Err(McastError::NotAttached);
        };
        g.qpns.remove(k);
        if g.qpns.is_empty() {
            self.groups.swap_remove(i);
        }
        Ok(())
    }

    /// Detaches `qpn` from every group (the QP is being destroyed).
    pub fn forget_qp(&mut self, qpn: u32) {
        for g in &mut self.groups {
            g.qpns.retain(|&q| q != qpn);
        }
        self.groups.retain(|g| !g.qpns.is_empty());
    }

    /// The QPs attached to `group` (empty for a group with none).
    pub fn members(&self, group: IpAddr) -> &[u32] {
        self.groups
            .iter()
            .find(|g| g.addr == group)
            .map_or(&[], |g| &g.qpns)
    }

    /// Whether any QP is attached to `group`.
    pub fn has(&self, group: IpAddr) -> bool {
        self.groups.iter().any(|g| g.addr == group)
    }

    /// Groups with attached QPs.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// [`MAX_MCAST_GRP`] groups have QPs: a new group is refused.
    pub fn full(&self) -> bool {
        self.groups.len() >= MAX_MCAST_GRP as usize
    }

    /// No group has attached QPs.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

/// The receiving sockets of the groups with attached QPs.
#[derive(Default)]
pub struct GroupSockets {
    open: Vec<(IpAddr, UdpIo)>,
}

impl GroupSockets {
    /// Opens `group`'s socket unless it is open, or the table is full (the attach will
    /// be refused for that). The NIC's unicast socket is bound to `local`: the group
    /// socket joins on that address's interface, takes its port, and receives with GRO
    /// if `gro` (as the unicast socket does).
    pub fn open(
        &mut self,
        group: IpAddr,
        local: SocketAddr,
        gro: bool,
        table: &McastTable,
    ) -> io::Result<()> {
        if self.open.iter().any(|(g, _)| *g == group) || (!table.has(group) && table.full()) {
            return Ok(());
        }
        let io = UdpIo::join_group(SocketAddr::new(group, local.port()), local.ip(), gro)?;
        self.open.push((group, io));
        Ok(())
    }

    /// Closes the sockets of groups without attached QPs (leaving the group).
    pub fn sync(&mut self, table: &McastTable) {
        self.open.retain(|(g, _)| table.has(*g));
    }

    /// The open sockets, each with its group.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (IpAddr, &mut UdpIo)> {
        self.open.iter_mut().map(|(g, io)| (*g, io))
    }

    /// The open sockets, for a sleep to wait on.
    pub fn iter(&self) -> impl Iterator<Item = &UdpIo> {
        self.open.iter().map(|(_, io)| io)
    }

    /// No socket open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u8) -> IpAddr {
        IpAddr::from([239, 1, 2, n])
    }

    #[test]
    fn group_of_takes_multicast_addresses_of_the_nics_family_only() {
        let v4: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        let m4 = gid::gid_of(g(1));
        let m6 = gid::gid_of("ff0e::1".parse().unwrap());
        assert_eq!(group_of(m4, v4), Some(g(1)));
        assert_eq!(group_of(m4, v6), None);
        assert_eq!(group_of(m6, v6), Some("ff0e::1".parse().unwrap()));
        assert_eq!(group_of(m6, v4), None);
        assert_eq!(
            group_of(gid::gid_of("127.0.0.3".parse().unwrap()), v4),
            None
        );
        // An IB-style MGID that is not an IPv4-mapped address is IPv6 multicast.
        let mut ib = [0u8; 16];
        ib[0] = 0xFF;
        assert_eq!(group_of(ib, v4), None);
    }

    #[test]
    fn attach_detach_and_forget() {
        let mut t = McastTable::default();
        t.attach(g(1), 7).unwrap();
        t.attach(g(1), 7).unwrap();
        t.attach(g(1), 8).unwrap();
        t.attach(g(2), 7).unwrap();
        assert_eq!(t.members(g(1)), &[7, 8]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.detach(g(2), 8), Err(McastError::NotAttached));
        assert_eq!(t.detach(g(3), 7), Err(McastError::NotAttached));
        t.detach(g(2), 7).unwrap();
        assert!(!t.has(g(2)));
        t.forget_qp(7);
        assert_eq!(t.members(g(1)), &[8]);
        t.forget_qp(8);
        assert!(t.is_empty());
    }

    #[test]
    fn limits_hold() {
        let mut t = McastTable::default();
        for q in 0..MAX_MCAST_QP_ATTACH {
            t.attach(g(1), q).unwrap();
        }
        assert_eq!(t.attach(g(1), 1000), Err(McastError::GroupFull));
        for n in 1..MAX_MCAST_GRP {
            t.attach(IpAddr::from([239, 2, (n >> 8) as u8, n as u8]), 1)
                .unwrap();
        }
        assert_eq!(t.attach(g(9), 1), Err(McastError::TooManyGroups));
        // A group already there still takes QPs.
        t.detach(g(1), 0).unwrap();
        t.attach(g(1), 1000).unwrap();
    }
}
