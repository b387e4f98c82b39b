//! Base Transport Header, 12 bytes (IBTA 9.2).
//!
//! ```text
//!  0       opcode
//!  1       SE(1) M(1) PadCnt(2) TVer(4)
//!  2..4    P_Key
//!  4       FECN(1) BECN(1) reserved(6)     -- RoCEv2 masks this byte in the ICRC
//!  5..8    DestQP (24)
//!  8       AckReq(1) reserved(7)
//!  9..12   PSN (24)
//! ```

use crate::bytes::*;
use crate::error::{Error, Layer, Result};
use crate::opcode::Opcode;
use crate::types::{Psn, Qpn};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of a BTH.
    Bth,
    Layer::Bth,
    12
);

/// The default partition key: full membership of the default partition (IBTA 10.9.1.2),
/// what rxe and perftest use.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(get_u8(self.b(), 0))
    }
    /// Solicited Event bit.
    pub fn solicited(&self) -> bool {
        get_u8(self.b(), 1) & 0x80 != 0
    }
    /// MigReq bit.
    pub fn mig_req(&self) -> bool {
        get_u8(self.b(), 1) & 0x40 != 0
    }
    /// Pad count: bytes of padding after the payload (0..=3).
    pub fn pad_count(&self) -> u8 {
        (get_u8(self.b(), 1) >> 4) & 0x3
    }
    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        get_u8(self.b(), 1) & 0x0F
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        get_u16(self.b(), 2)
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        get_u8(self.b(), 4) & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        get_u8(self.b(), 4) & 0x40 != 0
    }
    /// The six reserved bits of byte 4.
    pub fn resv6(&self) -> u8 {
        get_u8(self.b(), 4) & 0x3F
    }
    /// Destination QP.
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(get_u24(self.b(), 5))
    }
    /// Acknowledge-request bit.
    pub fn ack_req(&self) -> bool {
        get_u8(self.b(), 8) & 0x80 != 0
    }
    /// The seven reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        get_u8(self.b(), 8) & 0x7F
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.b(), 9))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        put_u8(self.m(), 0, op.0)
    }
    /// Sets SE, M, PadCnt and TVer (byte 1).
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad: u8, tver: u8) {
        let v = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad & 3) << 4)
            | (tver & 0x0F);
        put_u8(self.m(), 1, v)
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        put_u16(self.m(), 2, pkey)
    }
    /// Sets FECN and BECN, clearing the reserved bits of byte 4.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        put_u8(self.m(), 4, (u8::from(fecn) << 7) | (u8::from(becn) << 6))
    }
    /// Sets the destination QP.
    pub fn set_dest_qpn(&mut self, qpn: Qpn) {
        put_u24(self.m(), 5, qpn.value())
    }
    /// Sets the AckReq bit, clearing the reserved bits of byte 8.
    pub fn set_ack_req(&mut self, a: bool) {
        put_u8(self.m(), 8, u8::from(a) << 7)
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        put_u24(self.m(), 9, psn.value())
    }
}

/// An owned BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq (path migration state). softnic sends 1, as the hardware RNIC of the
    /// `hw_send_imm` capture does; Linux rxe sends 0 (every rxe capture in `tests/data`).
    pub mig_req: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qpn: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH for `opcode` to `dest_qpn` at `psn`, every other field at the value most
    /// packets carry: not solicited, MigReq clear, no pad, the default P_Key
    /// ([`DEFAULT_PKEY`], IBTA 10.9.1.2), no congestion marks, AckReq clear. A sender sets
    /// what differs with struct update syntax (`BthRepr { ack_req: true,
    /// ..BthRepr::new(..) }`), so each call site names only what it decides.
    pub const fn new(opcode: Opcode, dest_qpn: Qpn, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        }
    }

    /// Parses a BTH view. Rejects a non-zero TVer (IBTA 9.2.1 requires 0); reserved bits
    /// are ignored on receive, as IBTA's reserved-field rule (1.5.3) asks.
    pub fn parse<T: AsRef<[u8]>>(v: &Bth<T>) -> Result<Self> {
        if v.header_bytes().len() < HEADER_LEN {
            return Err(Error::Truncated {
                layer: Layer::Bth,
                need: HEADER_LEN,
                have: v.header_bytes().len(),
            });
        }
        if v.tver() != 0 {
            return Err(Error::BadTver(v.tver()));
        }
        Ok(BthRepr {
            opcode: v.opcode(),
            solicited: v.solicited(),
            mig_req: v.mig_req(),
            pad_count: v.pad_count(),
            pkey: v.pkey(),
            fecn: v.fecn(),
            becn: v.becn(),
            dest_qpn: v.dest_qpn(),
            ack_req: v.ack_req(),
            psn: v.psn(),
        })
    }

    /// Writes this BTH into `v` (reserved bits zero, TVer 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Bth<T>) {
        v.set_opcode(self.opcode);
        v.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        v.set_pkey(self.pkey);
        v.set_ecn(self.fecn, self.becn);
        v.set_dest_qpn(self.dest_qpn);
        v.set_ack_req(self.ack_req);
        v.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A hand-made vector in which every field has a distinct, non-zero value.
    const BYTES: [u8; 12] = [
        0x0A, 0xE0, 0xFF, 0xFF, 0xC0, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode(0x0A),
            solicited: true,
            mig_req: true,
            pad_count: 2,
            pkey: 0xFFFF,
            fecn: true,
            becn: true,
            dest_qpn: Qpn::new(0x123456),
            ack_req: true,
            psn: Psn::new(0xABCDEF),
        }
    }

    #[test]
    fn deconstruct() {
        let v = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(v.opcode(), Opcode(0x0A));
        assert!(v.solicited() && v.mig_req());
        assert_eq!(v.pad_count(), 2);
        assert_eq!(v.tver(), 0);
        assert_eq!(v.pkey(), 0xFFFF);
        assert!(v.fecn() && v.becn());
        assert_eq!(v.dest_qpn(), Qpn::new(0x123456));
        assert!(v.ack_req());
        assert_eq!(v.psn(), Psn::new(0xABCDEF));
        assert_eq!(BthRepr::parse(&v).unwrap(), repr());
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 12];
        repr().emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..12 {
            assert!(matches!(
                Bth::new_checked(&BYTES[..n]),
                Err(Error::Truncated { layer: Layer::Bth, need: 12, have }) if have == n
            ));
        }
    }

    #[test]
    fn tver_must_be_zero() {
        let mut b = BYTES;
        b[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(Error::BadTver(1))
        );
    }
}
