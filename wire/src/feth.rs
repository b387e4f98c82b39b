//! Flush Extended Transport Header, 4 bytes (IBTA 1.5 memory placement extensions,
//! as rxe implements it): selectivity level (bits 5..4) and placement type (bits 3..0).

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of a FETH.
    Feth,
    Layer::Feth,
    4
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Selectivity level (0 = memory region range, 1 = whole memory region).
    pub fn selectivity(&self) -> u8 {
        ((get_u32(self.buffer.as_ref(), 0) >> 4) & 0x3) as u8
    }
    /// Placement type bits (bit 0 global visibility, bit 1 persistence).
    pub fn placement(&self) -> u8 {
        (get_u32(self.buffer.as_ref(), 0) & 0xF) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Sets both fields (reserved bits zero).
    pub fn set_fields(&mut self, selectivity: u8, placement: u8) {
        let v = (u32::from(selectivity & 3) << 4) | u32::from(placement & 0xF);
        put_u32(self.buffer.as_mut(), 0, v)
    }
}

/// An owned FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FethRepr {
    /// Selectivity level.
    pub selectivity: u8,
    /// Placement type.
    pub placement: u8,
}

impl FethRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Feth<T>) -> Result<Self> {
        crate::error::check_len(Layer::Feth, v.header_bytes(), HEADER_LEN)?;
        Ok(FethRepr {
            selectivity: v.selectivity(),
            placement: v.placement(),
        })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Feth<T>) {
        v.set_fields(self.selectivity, self.placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes = [0, 0, 0, 0x13];
        let repr = FethRepr {
            selectivity: 1,
            placement: 3,
        };
        assert_eq!(
            FethRepr::parse(&Feth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0xFFu8; 4];
        repr.emit(&mut Feth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..4 {
            assert!(Feth::new_checked(&bytes[..n]).is_err());
        }
    }
}
