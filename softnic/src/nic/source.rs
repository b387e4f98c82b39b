//! The source check of connected QPs: a packet for an RC or UC QP must come from the
//! peer in the QP's address vector.
//!
//! The BTH names only the destination QP, so without this check anyone who can reach
//! UDP 4791 and guess a QPN and a PSN in the window can inject into a connection
//! (ReDMArk, USENIX Security 2021). A connected QP has exactly one peer, named by its
//! address vector; in RoCEv2 the peer's GID is its IP address (Annex A17), so the IP
//! source address must be that address — the check rxe makes too (`check_addr` in
//! `rxe_recv.c`). Packets that fail it are silently dropped, as IBTA 9.6 has the
//! receiver do with packets that fail transport header validation (no NAK: answering
//! would only help the sender), and counted under their reason.
//!
//! The UDP source port is checked only when the address vector carries a port other
//! than 4791: that is a softnic peer on a port of its own, and softnic sends every
//! packet from its one bound port. Real RoCE NICs (rxe, hardware) send to 4791 from a
//! per-QP source port chosen for ECMP entropy, so a 4791 address vector says nothing
//! about the port packets come from.
//!
//! UD QPs are connectionless and take packets from anyone (the Q_Key is their check,
//! IBTA 10.2.4); a connected QP without an address vector yet (RESET, INIT) is left to
//! the transport, which drops by state.

use std::net::SocketAddr;

use softnic_transport::qp::QpType;

/// Why a packet failed the source check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// The source IP address is not the peer's.
    Address,
    /// The peer is a softnic NIC on its own port, and the source port is not that port.
    Port,
}

/// Checks the source `src` of a packet for a QP of type `qp_type` whose address vector
/// is `remote`.
pub fn check(qp_type: QpType, remote: Option<SocketAddr>, src: SocketAddr) -> Result<(), Mismatch> {
    let Some(remote) = remote else {
        return Ok(());
    };
    if qp_type == QpType::Ud {
        return Ok(());
    }
    if remote.ip().to_canonical() != src.ip().to_canonical() {
        return Err(Mismatch::Address);
    }
    if remote.port() != wire::ROCEV2_UDP_PORT && remote.port() != src.port() {
        return Err(Mismatch::Port);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn connected_qps_take_packets_from_their_peer_only() {
        for t in [QpType::Rc, QpType::Uc] {
            let softnic_peer = Some(sa("127.0.0.2:5000"));
            assert_eq!(check(t, softnic_peer, sa("127.0.0.2:5000")), Ok(()));
            assert_eq!(
                check(t, softnic_peer, sa("127.0.0.3:5000")),
                Err(Mismatch::Address)
            );
            assert_eq!(
                check(t, softnic_peer, sa("127.0.0.2:5001")),
                Err(Mismatch::Port)
            );
            // A peer on 4791 (rxe, hardware) sends from any source port.
            let rxe_peer = Some(sa("127.0.0.2:4791"));
            assert_eq!(check(t, rxe_peer, sa("127.0.0.2:49441")), Ok(()));
            assert_eq!(
                check(t, rxe_peer, sa("127.0.0.9:49441")),
                Err(Mismatch::Address)
            );
            // IPv6, and an IPv4-mapped address vector for an IPv4 source.
            assert_eq!(check(t, Some(sa("[::1]:4791")), sa("[::1]:50000")), Ok(()));
            assert_eq!(
                check(t, Some(sa("[::ffff:127.0.0.2]:4791")), sa("127.0.0.2:1")),
                Ok(())
            );
            assert_eq!(
                check(t, Some(sa("[fd00::2]:4791")), sa("[fd00::3]:4791")),
                Err(Mismatch::Address)
            );
        }
    }

    #[test]
    fn ud_and_unconnected_qps_are_not_checked() {
        assert_eq!(
            check(QpType::Ud, Some(sa("127.0.0.2:5000")), sa("127.0.0.3:1")),
            Ok(())
        );
        assert_eq!(check(QpType::Rc, None, sa("127.0.0.3:1")), Ok(()));
    }
}
