//! Immediate Data, 4 bytes (IBTA 9.3.4): 32 bits delivered to the receiver's completion.
//! Carried in network byte order; verbs hands it to the application as `__be32`, so
//! softnic keeps the value as the big-endian number read from the wire.

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an ImmDt header.
    ImmDt,
    Layer::ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value.
    pub fn imm(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 0, v)
    }
}

/// An owned ImmDt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDtRepr {
    /// The immediate value.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &ImmDt<T>) -> Result<Self> {
        crate::error::check_len(Layer::ImmDt, v.header_bytes(), HEADER_LEN)?;
        Ok(ImmDtRepr { imm: v.imm() })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut ImmDt<T>) {
        v.set_imm(self.imm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0xDE, 0xAD, 0xBE, 0xEF];
        let repr = ImmDtRepr { imm: 0xDEAD_BEEF };
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0u8; 4];
        repr.emit(&mut ImmDt::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..4 {
            assert!(ImmDt::new_checked(&bytes[..n]).is_err());
        }
    }
}
