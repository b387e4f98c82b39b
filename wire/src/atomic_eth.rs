//! Atomic Extended Transport Header, 28 bytes (IBTA 9.3.3.2): the target address, R_Key
//! and operands of a Compare & Swap or Fetch & Add. The target must be 8-byte aligned
//! (IBTA 9.4.5: otherwise the responder NAKs with Invalid Request).

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an AtomicETH.
    AtomicEth,
    Layer::AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }
    /// Swap value (Compare & Swap) or add value (Fetch & Add).
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 12)
    }
    /// Compare value (Compare & Swap only).
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), 0, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 8, v)
    }
    /// Sets the swap/add value.
    pub fn set_swap_add(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), 12, v)
    }
    /// Sets the compare value.
    pub fn set_compare(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), 20, v)
    }
}

/// An owned AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Virtual address of the target.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &AtomicEth<T>) -> Result<Self> {
        crate::error::check_len(Layer::AtomicEth, v.header_bytes(), HEADER_LEN)?;
        Ok(AtomicEthRepr {
            va: v.va(),
            rkey: v.rkey(),
            swap_add: v.swap_add(),
            compare: v.compare(),
        })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut AtomicEth<T>) {
        v.set_va(self.va);
        v.set_rkey(self.rkey);
        v.set_swap_add(self.swap_add);
        v.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let bytes: [u8; 28] = [
            0, 0, 0x55, 0x55, 0x00, 0x00, 0x10, 0x08, // va
            0, 0, 0x02, 0x01, // rkey
            0, 0, 0, 0, 0, 0, 0, 1, // swap/add
            0x80, 0, 0, 0, 0, 0, 0, 0x2A, // compare
        ];
        let repr = AtomicEthRepr {
            va: 0x5555_0000_1008,
            rkey: 0x201,
            swap_add: 1,
            compare: 0x8000_0000_0000_002A,
        };
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0u8; 28];
        repr.emit(&mut AtomicEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..28 {
            assert!(AtomicEth::new_checked(&bytes[..n]).is_err());
        }
    }
}
