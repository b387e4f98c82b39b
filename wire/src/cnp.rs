//! RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3): a BTH with opcode 0x81,
//! BECN set and PSN 0, followed by 16 reserved bytes and the ICRC. A notification point
//! sends it to the source QP of a packet that arrived ECN-marked (CE).

use crate::bth::BthRepr;
use crate::opcode::Opcode;
use crate::types::{Psn, Qpn};

/// Length of the reserved CNP body after the BTH.
pub const BODY_LEN: usize = 16;

/// The BTH of a CNP towards `dest_qpn`, as ConnectX NICs send it (see the scapy vector in
/// the ICRC tests): BECN set, PSN 0, P_Key 0xFFFF, no AckReq.
pub const fn bth(dest_qpn: Qpn) -> BthRepr {
    BthRepr {
        becn: true,
        ..BthRepr::new(Opcode::CNP, dest_qpn, Psn::ZERO)
    }
}
