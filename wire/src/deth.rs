//! Datagram Extended Transport Header, 8 bytes (IBTA 9.3.2): the Q_Key and source QP of
//! a UD packet.

use crate::bytes::*;
use crate::error::{Layer, Result};
use crate::types::Qpn;
use crate::view::header_view;

header_view!(
    /// A zero-copy view of a DETH.
    Deth,
    Layer::Deth,
    8
);

/// The Q_Key of the GSI QP (QP1), which carries CM MADs (IBTA 13.5.2.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
    /// Source QP.
    pub fn src_qpn(&self) -> Qpn {
        Qpn::new(get_u24(self.buffer.as_ref(), 5))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the queue key.
    pub fn set_qkey(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), 0, v)
    }
    /// Sets the source QP (and the reserved byte to 0).
    pub fn set_src_qpn(&mut self, q: Qpn) {
        put_u8(self.buffer.as_mut(), 4, 0);
        put_u24(self.buffer.as_mut(), 5, q.value())
    }
}

/// An owned DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qpn: Qpn,
}

impl DethRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Deth<T>) -> Result<Self> {
        crate::error::check_len(Layer::Deth, v.header_bytes(), HEADER_LEN)?;
        Ok(DethRepr {
            qkey: v.qkey(),
            src_qpn: v.src_qpn(),
        })
    }
    /// Writes into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Deth<T>) {
        v.set_qkey(self.qkey);
        v.set_src_qpn(self.src_qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        // A CM MAD on QP1 from captures/rxe-lab/rdma_cm.pcap: Q_Key 0x80010000, src QP 1.
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        let repr = DethRepr {
            qkey: GSI_QKEY,
            src_qpn: Qpn::GSI,
        };
        assert_eq!(
            DethRepr::parse(&Deth::new_checked(&bytes[..]).unwrap()).unwrap(),
            repr
        );
        let mut out = [0xFFu8; 8];
        repr.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        for n in 0..8 {
            assert!(Deth::new_checked(&bytes[..n]).is_err());
        }
    }
}
