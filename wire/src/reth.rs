//! RDMA Extended Transport Header, 16 bytes (IBTA 9.3.3): virtual address, R_Key and
//! DMA length of an RDMA WRITE, READ request, FLUSH or ATOMIC WRITE.

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of a RETH.
    Reth,
    Layer::Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }
    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put_u64(self.buffer.as_mut(), 0, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 8, v)
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 12, v)
    }
}

/// An owned RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Virtual address in the responder's memory region.
    pub va: u64,
    /// Remote key naming that region.
    pub rkey: u32,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Reth<T>) -> Result<Self> {
        crate::error::check_len(Layer::Reth, v.header_bytes(), HEADER_LEN)?;
        Ok(RethRepr {
            va: v.va(),
            rkey: v.rkey(),
            dma_len: v.dma_len(),
        })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Reth<T>) {
        v.set_va(self.va);
        v.set_rkey(self.rkey);
        v.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0x00, 0x00, 0x12, 0x34, 0x00, 0x01, 0x00,
        0x00,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x7f12_3456_789a,
        rkey: 0x1234,
        dma_len: 65536,
    };

    #[test]
    fn deconstruct_construct() {
        let v = Reth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(RethRepr::parse(&v).unwrap(), REPR);
        let mut buf = [0xAAu8; 16];
        REPR.emit(&mut Reth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..16 {
            assert!(Reth::new_checked(&BYTES[..n]).is_err());
            assert!(RethRepr::parse(&Reth::new_unchecked(&BYTES[..n])).is_err());
        }
    }
}
