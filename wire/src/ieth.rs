//! Invalidate Extended Transport Header, 4 bytes (IBTA 9.3.6): the R_Key that a SEND
//! with Invalidate asks the responder to invalidate.

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an IETH.
    Ieth,
    Layer::Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 0, v)
    }
}

/// An owned IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IethRepr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Ieth<T>) -> Result<Self> {
        crate::error::check_len(Layer::Ieth, v.header_bytes(), HEADER_LEN)?;
        Ok(IethRepr { rkey: v.rkey() })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Ieth<T>) {
        v.set_rkey(self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x00, 0x01, 0x02, 0x03];
        let repr = IethRepr { rkey: 0x0001_0203 };
        assert_eq!(
            IethRepr::parse(&Ieth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0u8; 4];
        repr.emit(&mut Ieth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..4 {
            assert!(Ieth::new_checked(&bytes[..n]).is_err());
        }
    }
}
