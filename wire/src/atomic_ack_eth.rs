//! Atomic Acknowledge Extended Transport Header, 8 bytes (IBTA 9.3.5.3): the value the
//! target held before the atomic operation.

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an AtomicAckETH.
    AtomicAckEth,
    Layer::AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Original remote data.
    pub fn orig(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote data.
    pub fn set_orig(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), 0, v)
    }
}

/// An owned AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// The value at the target before the operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &AtomicAckEth<T>) -> Result<Self> {
        crate::error::check_len(Layer::AtomicAckEth, v.header_bytes(), HEADER_LEN)?;
        Ok(AtomicAckEthRepr { orig: v.orig() })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut AtomicAckEth<T>) {
        v.set_orig(self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF];
        let repr = AtomicAckEthRepr {
            orig: 0x0123_4567_89AB_CDEF,
        };
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0u8; 8];
        repr.emit(&mut AtomicAckEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..8 {
            assert!(AtomicAckEth::new_checked(&bytes[..n]).is_err());
        }
    }
}
