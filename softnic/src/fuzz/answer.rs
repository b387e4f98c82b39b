//! What came back: every datagram from the peer is put in one answer class, the
//! fuzzer's coverage signal (as stateful network fuzzers use response codes). The
//! classes follow IBTA 9.7.5.1 (AETH syndromes: ACK, RNR NAK, the five NAK codes) and
//! the response opcodes of table 38; two more are inferred from what did *not* come
//! back: silence (no answer to a sequence) and QP death (the QP stopped answering even
//! a duplicate, which a live RC responder must re-acknowledge, IBTA 9.7.5.1).

use std::fmt;

use wire::{NakCode, Operation, PacketRepr, Syndrome, Transport};

/// One answer class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Positive acknowledgement (AETH syndrome `000ccccc`).
    Ack,
    /// Receiver not ready (`001ttttt`).
    RnrNak,
    /// NAK with a code (`011nnnnn`), including reserved codes.
    Nak(u8),
    /// An AETH with a reserved syndrome.
    AethReserved,
    /// An RDMA READ response packet.
    ReadResponse,
    /// An atomic acknowledge.
    AtomicAck,
    /// A request from the peer (e.g. `ibv_rc_pingpong`'s own SEND).
    PeerRequest,
    /// A congestion notification packet.
    Cnp,
    /// A datagram that did not parse, or whose ICRC is wrong.
    Malformed,
    /// No answer to a sequence within the answer window.
    Silence,
    /// After the sequence the QP answered nothing, not even a duplicate.
    QpDeath,
}

impl Class {
    /// Every class a table lists, in order (NAK codes 0..=4; reserved codes are shown
    /// only when seen).
    pub const LISTED: [Class; 14] = [
        Class::Ack,
        Class::RnrNak,
        Class::Nak(0),
        Class::Nak(1),
        Class::Nak(2),
        Class::Nak(3),
        Class::Nak(4),
        Class::AethReserved,
        Class::ReadResponse,
        Class::AtomicAck,
        Class::PeerRequest,
        Class::Malformed,
        Class::Silence,
        Class::QpDeath,
    ];

    /// True for the NAKs after which an RC responder's QP is in the error state
    /// (IBTA 9.9.3.1.3: of the responder's errors only RNR is transient; invalid
    /// request, remote access and remote operational errors are fatal).
    pub fn is_fatal_nak(self) -> bool {
        matches!(self, Class::Nak(1..=3))
    }

    /// The class's name as the coverage table prints it.
    pub fn name(self) -> String {
        match self {
            Class::Ack => "ACK".into(),
            Class::RnrNak => "RNR-NAK".into(),
            Class::Nak(c) => match NakCode::from_code(c) {
                NakCode::PsnSequenceError => "NAK-PSN-SEQUENCE".into(),
                NakCode::InvalidRequest => "NAK-INVALID-REQUEST".into(),
                NakCode::RemoteAccessError => "NAK-REMOTE-ACCESS".into(),
                NakCode::RemoteOperationalError => "NAK-REMOTE-OPERATIONAL".into(),
                NakCode::InvalidRdRequest => "NAK-INVALID-RD-REQUEST".into(),
                NakCode::Reserved(c) => format!("NAK-RESERVED-{c}"),
            },
            Class::AethReserved => "AETH-RESERVED".into(),
            Class::ReadResponse => "READ-RESPONSE".into(),
            Class::AtomicAck => "ATOMIC-ACK".into(),
            Class::PeerRequest => "PEER-REQUEST".into(),
            Class::Cnp => "CNP".into(),
            Class::Malformed => "MALFORMED-ANSWER".into(),
            Class::Silence => "SILENCE".into(),
            Class::QpDeath => "QP-DEATH".into(),
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// One classified datagram from the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Its class.
    pub class: Class,
    /// Its BTH PSN (0 when malformed).
    pub psn: u32,
    /// For a peer request: whether an RC requester waits for our ACK of it (it ends a
    /// message or asks for one).
    pub wants_ack: bool,
}

/// Classifies one datagram `roce` (BTH … ICRC) whose ICRC check gave `icrc_ok`. A
/// peer that sends bad ICRCs or unparsable packets is itself worth a look, so that is
/// its own class.
pub fn classify(roce: &[u8], icrc_ok: bool) -> Answer {
    let malformed = Answer {
        class: Class::Malformed,
        psn: 0,
        wants_ack: false,
    };
    if !icrc_ok {
        return malformed;
    }
    let Ok(p) = PacketRepr::parse(roce) else {
        return malformed;
    };
    let Ok(info) = p.repr.info() else {
        return malformed;
    };
    let psn = p.repr.bth.psn.value();
    let class = match info.operation {
        Operation::Acknowledge => match p.repr.aeth.map(|a| a.syndrome) {
            Some(Syndrome::Ack { .. }) => Class::Ack,
            Some(Syndrome::RnrNak { .. }) => Class::RnrNak,
            Some(Syndrome::Nak(c)) => Class::Nak(c.code()),
            Some(Syndrome::Reserved(_)) => Class::AethReserved,
            None => Class::Malformed,
        },
        Operation::ReadResponse => Class::ReadResponse,
        Operation::AtomicAcknowledge => Class::AtomicAck,
        Operation::Cnp => Class::Cnp,
        _ => Class::PeerRequest,
    };
    let wants_ack = class == Class::PeerRequest
        && info.transport == Transport::Rc
        && (info.position.ends() || p.repr.bth.ack_req);
    Answer {
        class,
        psn,
        wants_ack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::aeth::AethRepr;
    use wire::{BthRepr, Msn, Opcode, Psn, Qpn};

    fn packet(op: u8, psn: u32, ack_req: bool, syndrome: Option<u8>) -> Vec<u8> {
        let mut r = PacketRepr::new(BthRepr {
            ack_req,
            ..BthRepr::new(Opcode(op), Qpn::new(0x42), Psn::new(psn))
        });
        r.aeth = syndrome.map(|s| AethRepr {
            syndrome: Syndrome::from_u8(s),
            msn: Msn::new(1),
        });
        let mut b = vec![0u8; r.total_len().unwrap()];
        r.emit(&mut b, &[]).unwrap();
        b
    }

    #[test]
    fn every_aeth_syndrome_has_its_class() {
        let c = |s: u8| classify(&packet(0x11, 9, false, Some(s)), true).class;
        assert_eq!(c(0x1F), Class::Ack);
        assert_eq!(c(0x2C), Class::RnrNak);
        for code in 0..=4 {
            assert_eq!(c(0x60 | code), Class::Nak(code));
        }
        assert_eq!(c(0x71).name(), "NAK-RESERVED-17");
        assert_eq!(c(0x40), Class::AethReserved);
        assert!(Class::Nak(1).is_fatal_nak() && Class::Nak(3).is_fatal_nak());
        assert!(!Class::Nak(0).is_fatal_nak() && !Class::RnrNak.is_fatal_nak());
        assert_eq!(classify(&packet(0x11, 9, false, Some(0)), true).psn, 9);
    }

    #[test]
    fn peer_requests_bad_icrcs_and_garbage() {
        // A zero-length SEND ONLY from the peer wants our ACK; a SEND FIRST without
        // AckReq does not.
        let a = classify(&packet(0x04, 3, false, None), true);
        assert_eq!((a.class, a.wants_ack), (Class::PeerRequest, true));
        let mut first = packet(0x00, 3, false, None);
        first.splice(12..12, [0u8; 4]); // a 4-byte payload; pad stays 0
        let a = classify(&first, true);
        assert_eq!((a.class, a.wants_ack), (Class::PeerRequest, false));
        assert_eq!(
            classify(&packet(0x11, 9, false, Some(0)), false).class,
            Class::Malformed
        );
        assert_eq!(classify(&[0xFF; 3], true).class, Class::Malformed);
        assert_eq!(
            classify(&packet(0x10, 1, false, Some(0)), true).class,
            Class::ReadResponse
        );
    }
}
