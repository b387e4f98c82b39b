//! XRC Extended Transport Header, 4 bytes (IBTA 9.3, XRCETH): the XRC SRQ number that an
//! XRC request names.
//!
//! XRC (eXtended Reliable Connected) lets one connection serve many receive queues: the
//! target QP is shared, so every request must say which shared receive queue of the
//! target's XRC domain it is for. That is this header, which follows the BTH of every
//! XRC request packet (IBTA 9.2 table 38, opcodes 101xxxxx) and of no response.
//!
//! ```text
//! byte 0: reserved (sent as 0, ignored on receive)
//! bytes 1..4: XRC SRQ number (24 bits, big-endian)
//! ```

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an XRCETH.
    XrcEth,
    Layer::XrcEth,
    4
);

impl<T: AsRef<[u8]>> XrcEth<T> {
    /// The XRC SRQ number (24 bits; the reserved byte before it is not part of it).
    pub fn srqn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEth<T> {
    /// Sets the XRC SRQ number (its low 24 bits) and the reserved byte to 0, as a
    /// sender must.
    pub fn set_srqn(&mut self, v: u32) {
        put_u8(self.buffer.as_mut(), 0, 0);
        put_u24(self.buffer.as_mut(), 1, v)
    }
}

/// An owned XRCETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct XrcEthRepr {
    /// The XRC SRQ number (24 bits; `emit` writes the low 24 bits).
    pub srqn: u32,
}

impl XrcEthRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &XrcEth<T>) -> Result<Self> {
        crate::error::check_len(Layer::XrcEth, v.header_bytes(), HEADER_LEN)?;
        Ok(XrcEthRepr { srqn: v.srqn() })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut XrcEth<T>) {
        v.set_srqn(self.srqn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0xAB, 0xCD, 0xEF];
        let repr = XrcEthRepr { srqn: 0x00AB_CDEF };
        assert_eq!(
            XrcEthRepr::parse(&XrcEth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        // The reserved byte is written as 0 over whatever was there.
        let mut out = [0xFFu8; 4];
        repr.emit(&mut XrcEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..4 {
            assert_eq!(
                XrcEth::new_checked(&bytes[..n]),
                Err(Error::Truncated {
                    layer: Layer::XrcEth,
                    need: 4,
                    have: n
                })
            );
        }
    }

    #[test]
    fn reserved_byte_is_ignored_and_srqn_is_24_bits() {
        // A receiver ignores the reserved byte (IBTA: reserved fields are not checked).
        let bytes = [0x5A, 0x00, 0x00, 0x01];
        assert_eq!(XrcEth::new_checked(&bytes[..]).unwrap().srqn(), 1);
        // Bits above 24 cannot be carried: the setter keeps the low 24.
        let mut out = [0u8; 4];
        XrcEth::new_unchecked(&mut out[..]).set_srqn(0xFF12_3456);
        assert_eq!(out, [0x00, 0x12, 0x34, 0x56]);
    }
}
