//! ACK Extended Transport Header, 4 bytes (IBTA 9.3.5): an 8-bit syndrome and a 24-bit
//! MSN. The syndrome is decoded into [`Syndrome`] once, at parse time, so the completer
//! matches on meaning instead of testing bit masks (IBTA 9.7.5.1, tables 43–45).

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::types::Msn;
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an AETH.
    Aeth,
    Layer::Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        get_u8(self.buffer.as_ref(), 0)
    }
    /// Decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }
    /// Message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::new(get_u24(self.buffer.as_ref(), 1))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        put_u8(self.buffer.as_mut(), 0, s.to_u8())
    }
    /// Sets the MSN.
    pub fn set_msn(&mut self, m: Msn) {
        put_u24(self.buffer.as_mut(), 1, m.value())
    }
}

/// The credit count that means "no end-to-end flow-control credits advertised"
/// (IBTA 9.7.7.2.5: the value 31 is "invalid", used by responders that do not limit).
pub const CREDITS_INVALID: u8 = 0x1F;

/// NAK codes (IBTA 9.7.5.1, table 44, syndrome `011xxxxx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the responder expected an earlier PSN; go back N.
    PsnSequenceError,
    /// Invalid request (unsupported opcode, bad length, …).
    InvalidRequest,
    /// Remote access error (bad R_Key, range or access rights).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code (5..=31), kept so that decoding never loses information.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1F,
        }
    }

    /// Decodes a 5-bit code.
    pub const fn from_code(c: u8) -> Self {
        match c & 0x1F {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// `000ccccc`: positive acknowledgement with a credit count.
    Ack {
        /// End-to-end credits (31 = invalid / not limited).
        credits: u8,
    },
    /// `001ttttt`: receiver not ready; retry after the encoded time.
    RnrNak {
        /// The 5-bit RNR timer code (see [`rnr_timer_us`]).
        timer: u8,
    },
    /// `011nnnnn`: negative acknowledgement.
    Nak(NakCode),
    /// `010xxxxx` or any value with the top bit set: reserved.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub const fn from_u8(v: u8) -> Self {
        match v >> 5 {
            0b000 => Syndrome::Ack { credits: v & 0x1F },
            0b001 => Syndrome::RnrNak { timer: v & 0x1F },
            0b011 => Syndrome::Nak(NakCode::from_code(v)),
            _ => Syndrome::Reserved(v),
        }
    }

    /// Encodes the syndrome byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(v) => v,
        }
    }

    /// True for a positive ACK.
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

/// Minimum RNR NAK timer values in microseconds, indexed by the 5-bit timer code
/// (IBTA 9.7.5.2.8, table 45). Code 0 is the longest, 655.36 ms.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The minimum RNR delay in microseconds for a 5-bit timer code.
pub const fn rnr_timer_us(code: u8) -> u32 {
    RNR_TIMER_US[(code & 0x1F) as usize]
}

/// An owned AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// MSN: the sequence number of the last message completed by the responder.
    pub msn: Msn,
}

impl AethRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Aeth<T>) -> Result<Self> {
        crate::error::check_len(Layer::Aeth, v.header_bytes(), HEADER_LEN)?;
        Ok(AethRepr {
            syndrome: v.syndrome(),
            msn: v.msn(),
        })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Aeth<T>) {
        v.set_syndrome(self.syndrome);
        v.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        // An rxe ACK (captures/rxe-lab/rc_send.pcap): syndrome 0x1f, MSN 1.
        let bytes = [0x1F, 0x00, 0x00, 0x01];
        let repr = AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: Msn::new(1),
        };
        assert_eq!(
            AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0u8; 4];
        repr.emit(&mut Aeth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..4 {
            assert!(Aeth::new_checked(&bytes[..n]).is_err());
        }
    }

    #[test]
    fn syndromes_round_trip_all_bytes() {
        for v in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(v).to_u8(), v);
        }
        assert_eq!(
            Syndrome::from_u8(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_u8(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_u8(0x2E), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from_u8(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn rnr_table() {
        assert_eq!(rnr_timer_us(0), 655_360);
        assert_eq!(rnr_timer_us(1), 10);
        // ibv_rc_pingpong's min_rnr_timer 12 = 0.64 ms.
        assert_eq!(rnr_timer_us(12), 640);
        assert_eq!(rnr_timer_us(31), 491_520);
        for w in RNR_TIMER_US[1..].windows(2) {
            assert!(w[0] < w[1]);
        }
    }
}
