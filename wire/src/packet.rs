//! A whole RoCEv2 packet: the UDP payload from the BTH to the ICRC.
//!
//! [`PacketRepr`] holds the BTH and whichever extension headers its opcode carries (as
//! the opcode table says), plus the payload length. [`PacketRepr::parse`] checks a
//! datagram completely — length of every header, known opcode, pad count, payload
//! allowed — and returns the payload as a slice of the input, so nothing is copied.
//! [`PacketRepr::emit_headers`] writes only the headers, so a NIC can place payload
//! straight from registered memory into the packet buffer (one copy: the DMA), and
//! [`PacketRepr::emit`] writes a complete packet from a payload slice.

use crate::aeth::{Aeth, AethRepr};
use crate::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use crate::atomic_eth::{AtomicEth, AtomicEthRepr};
use crate::bth::{self, Bth, BthRepr};
use crate::deth::{Deth, DethRepr};
use crate::error::{Error, Layer, Result};
use crate::feth::{Feth, FethRepr};
use crate::ieth::{Ieth, IethRepr};
use crate::immdt::{ImmDt, ImmDtRepr};
use crate::opcode::{Header, OpcodeInfo};
use crate::xrceth::{XrcEth, XrcEthRepr};
use crate::ICRC_LEN;

/// An owned RoCEv2 packet header stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// Base transport header. On emit, `pad_count` is recomputed from `payload_len`.
    pub bth: BthRepr,
    /// RETH, when the opcode carries one.
    pub reth: Option<crate::reth::RethRepr>,
    /// AETH, when the opcode carries one.
    pub aeth: Option<AethRepr>,
    /// DETH, when the opcode carries one.
    pub deth: Option<DethRepr>,
    /// Immediate data, when the opcode carries it.
    pub immdt: Option<ImmDtRepr>,
    /// IETH, when the opcode carries one.
    pub ieth: Option<IethRepr>,
    /// AtomicETH, when the opcode carries one.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH, when the opcode carries one.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// FETH, when the opcode carries one.
    pub feth: Option<FethRepr>,
    /// XRCETH, when the opcode carries one (every XRC request).
    pub xrceth: Option<XrcEthRepr>,
    /// Payload bytes, excluding pad and ICRC.
    pub payload_len: usize,
}

/// A parsed datagram: the headers, and where the payload and ICRC are in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// The headers.
    pub repr: PacketRepr,
    /// Length of BTH + extension headers.
    pub header_len: usize,
    /// The payload (without pad).
    pub payload: &'a [u8],
    /// The ICRC carried by the packet (its 4 wire bytes read least-significant first,
    /// the same convention [`crate::icrc`] computes in).
    pub icrc: u32,
}

/// The pad count that makes `payload_len` a whole number of 4-byte words (IBTA 9.2).
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len & 3)) & 3) as u8
}

/// The precise error for a buffer that ends inside the extension headers: which header
/// is cut short, and how many bytes it needed from its own start.
fn truncation(buf: &[u8], info: &OpcodeInfo) -> Error {
    let mut off = bth::HEADER_LEN;
    for &h in info.headers {
        let have = buf.len().saturating_sub(off);
        if have < h.size() {
            return Error::Truncated {
                layer: header_layer(h),
                need: h.size(),
                have,
            };
        }
        off += h.size();
    }
    Error::Truncated {
        layer: Layer::Payload,
        need: off + ICRC_LEN,
        have: buf.len(),
    }
}

/// The error layer of an extension header.
const fn header_layer(h: Header) -> Layer {
    match h {
        Header::Reth => Layer::Reth,
        Header::Aeth => Layer::Aeth,
        Header::Deth => Layer::Deth,
        Header::ImmDt => Layer::ImmDt,
        Header::Ieth => Layer::Ieth,
        Header::AtomicEth => Layer::AtomicEth,
        Header::AtomicAckEth => Layer::AtomicAckEth,
        Header::Feth => Layer::Feth,
        Header::CnpPad => Layer::Cnp,
        Header::XrcEth => Layer::XrcEth,
    }
}

impl PacketRepr {
    /// A packet with only a BTH and no payload; set the extension headers it needs.
    pub const fn new(bth: BthRepr) -> Self {
        PacketRepr {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            immdt: None,
            ieth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            feth: None,
            xrceth: None,
            payload_len: 0,
        }
    }

    /// The opcode's table row, or `UnknownOpcode`.
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// Parses a whole RoCEv2 UDP payload (BTH … ICRC). The ICRC is returned, not checked:
    /// checking needs the IP and UDP headers (see [`crate::icrc`]).
    pub fn parse(buf: &[u8]) -> Result<ParsedPacket<'_>> {
        let bth = BthRepr::parse(&Bth::new_checked(buf)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        let header_len = bth::HEADER_LEN + info.ext_len();
        let Some(ext) = buf.get(bth::HEADER_LEN..header_len) else {
            return Err(truncation(buf, info));
        };
        // Every extension header is present: one length check above covers them all, so
        // the views below are read unchecked (the hot path; see docs/perf.md).
        let mut repr = PacketRepr::new(bth);
        let mut off = 0;
        for &h in info.headers {
            let s = ext.get(off..off + h.size()).unwrap_or(&[]);
            match h {
                Header::Reth => {
                    let v = crate::reth::Reth::new_unchecked(s);
                    repr.reth = Some(crate::reth::RethRepr {
                        va: v.va(),
                        rkey: v.rkey(),
                        dma_len: v.dma_len(),
                    })
                }
                Header::Aeth => {
                    let v = Aeth::new_unchecked(s);
                    repr.aeth = Some(AethRepr {
                        syndrome: v.syndrome(),
                        msn: v.msn(),
                    })
                }
                Header::Deth => {
                    let v = Deth::new_unchecked(s);
                    repr.deth = Some(DethRepr {
                        qkey: v.qkey(),
                        src_qpn: v.src_qpn(),
                    })
                }
                Header::ImmDt => {
                    repr.immdt = Some(ImmDtRepr {
                        imm: ImmDt::new_unchecked(s).imm(),
                    })
                }
                Header::Ieth => {
                    repr.ieth = Some(IethRepr {
                        rkey: Ieth::new_unchecked(s).rkey(),
                    })
                }
                Header::AtomicEth => {
                    let v = AtomicEth::new_unchecked(s);
                    repr.atomic_eth = Some(AtomicEthRepr {
                        va: v.va(),
                        rkey: v.rkey(),
                        swap_add: v.swap_add(),
                        compare: v.compare(),
                    })
                }
                Header::AtomicAckEth => {
                    repr.atomic_ack_eth = Some(AtomicAckEthRepr {
                        orig: AtomicAckEth::new_unchecked(s).orig(),
                    })
                }
                Header::Feth => {
                    let v = Feth::new_unchecked(s);
                    repr.feth = Some(FethRepr {
                        selectivity: v.selectivity(),
                        placement: v.placement(),
                    })
                }
                Header::CnpPad => {}
                Header::XrcEth => {
                    repr.xrceth = Some(XrcEthRepr {
                        srqn: XrcEth::new_unchecked(s).srqn(),
                    })
                }
            }
            off += h.size();
        }
        let need = header_len + ICRC_LEN;
        if buf.len() < need {
            return Err(Error::Truncated {
                layer: Layer::Payload,
                need,
                have: buf.len(),
            });
        }
        let padded_len = buf.len() - need;
        let pad = usize::from(bth.pad_count);
        if pad > padded_len || !padded_len.is_multiple_of(4) {
            return Err(Error::BadPad {
                pad: bth.pad_count,
                padded_len,
            });
        }
        if !info.payload && padded_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: bth.opcode.0,
                len: padded_len,
            });
        }
        let payload_len = padded_len - pad;
        repr.payload_len = payload_len;
        let payload = buf.get(header_len..header_len + payload_len).unwrap_or(&[]);
        let mut c = [0u8; 4];
        if let Some(s) = buf.get(buf.len() - ICRC_LEN..) {
            c.copy_from_slice(s);
        }
        Ok(ParsedPacket {
            repr,
            header_len,
            payload,
            icrc: u32::from_le_bytes(c),
        })
    }

    /// Length of BTH + extension headers.
    pub fn header_len(&self) -> Result<usize> {
        Ok(bth::HEADER_LEN + self.info()?.ext_len())
    }

    /// Length of the whole packet: headers, payload, pad and ICRC.
    pub fn total_len(&self) -> Result<usize> {
        Ok(self.header_len()?
            + self.payload_len
            + usize::from(pad_for(self.payload_len))
            + ICRC_LEN)
    }

    /// Checks that the optional headers present are exactly those the opcode carries.
    fn check_consistent(&self, info: &OpcodeInfo) -> Result<()> {
        let present = [
            (Header::Reth, self.reth.is_some()),
            (Header::Aeth, self.aeth.is_some()),
            (Header::Deth, self.deth.is_some()),
            (Header::ImmDt, self.immdt.is_some()),
            (Header::Ieth, self.ieth.is_some()),
            (Header::AtomicEth, self.atomic_eth.is_some()),
            (Header::AtomicAckEth, self.atomic_ack_eth.is_some()),
            (Header::Feth, self.feth.is_some()),
            (Header::XrcEth, self.xrceth.is_some()),
        ]
        .iter()
        .fold(0, |m, &(h, is)| if is { m | h.bit() } else { m });
        // The CNP's reserved body is written, never held: not a field here.
        let want = info.header_mask() & !Header::CnpPad.bit();
        if present != want {
            return Err(Error::Inconsistent(if present & !want != 0 {
                "extension header the opcode does not carry"
            } else {
                "missing extension header the opcode requires"
            }));
        }
        if !info.payload && self.payload_len != 0 {
            return Err(Error::Inconsistent("payload on an opcode without payload"));
        }
        Ok(())
    }

    /// Writes the BTH (with the pad count for `payload_len`) and the extension headers.
    /// Returns the header length; the payload goes right after it.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize> {
        let info = self.info()?;
        self.check_consistent(info)?;
        let hlen = bth::HEADER_LEN + info.ext_len();
        if buf.len() < hlen {
            return Err(Error::BufferTooSmall {
                need: hlen,
                have: buf.len(),
            });
        }
        let mut b = self.bth;
        b.pad_count = pad_for(self.payload_len);
        b.emit(&mut Bth::new_unchecked(&mut buf[..bth::HEADER_LEN]));
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            let end = off + h.size();
            let s = &mut buf[off..end];
            match h {
                Header::Reth => {
                    if let Some(r) = self.reth {
                        r.emit(&mut crate::reth::Reth::new_unchecked(s))
                    }
                }
                Header::Aeth => {
                    if let Some(r) = self.aeth {
                        r.emit(&mut Aeth::new_unchecked(s))
                    }
                }
                Header::Deth => {
                    if let Some(r) = self.deth {
                        r.emit(&mut Deth::new_unchecked(s))
                    }
                }
                Header::ImmDt => {
                    if let Some(r) = self.immdt {
                        r.emit(&mut ImmDt::new_unchecked(s))
                    }
                }
                Header::Ieth => {
                    if let Some(r) = self.ieth {
                        r.emit(&mut Ieth::new_unchecked(s))
                    }
                }
                Header::AtomicEth => {
                    if let Some(r) = self.atomic_eth {
                        r.emit(&mut AtomicEth::new_unchecked(s))
                    }
                }
                Header::AtomicAckEth => {
                    if let Some(r) = self.atomic_ack_eth {
                        r.emit(&mut AtomicAckEth::new_unchecked(s))
                    }
                }
                Header::Feth => {
                    if let Some(r) = self.feth {
                        r.emit(&mut Feth::new_unchecked(s))
                    }
                }
                Header::CnpPad => s.fill(0),
                Header::XrcEth => {
                    if let Some(r) = self.xrceth {
                        r.emit(&mut XrcEth::new_unchecked(s))
                    }
                }
            }
            off = end;
        }
        Ok(off)
    }

    /// Writes pad bytes (zero) after a payload already placed at `header_len`, and
    /// zeroes the ICRC slot. Returns the total length.
    pub fn emit_trailer(&self, buf: &mut [u8], header_len: usize) -> Result<usize> {
        let pad = usize::from(pad_for(self.payload_len));
        let start = header_len + self.payload_len;
        let total = start + pad + ICRC_LEN;
        match buf.get_mut(start..total) {
            Some(s) => {
                s.fill(0);
                Ok(total)
            }
            None => Err(Error::BufferTooSmall {
                need: total,
                have: buf.len(),
            }),
        }
    }

    /// Writes the whole packet — headers, `payload`, pad — with a zero ICRC (fill it with
    /// [`crate::icrc::IcrcParams::fill`]). Returns the packet length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::Inconsistent(
                "payload length differs from payload_len",
            ));
        }
        let total = self.total_len()?;
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let h = self.emit_headers(buf)?;
        buf[h..h + payload.len()].copy_from_slice(payload);
        self.emit_trailer(buf, h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opcode::Opcode;
    use crate::types::{Psn, Qpn};

    fn bth(op: u8) -> BthRepr {
        BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode(op), Qpn::new(0x11), Psn::new(100))
        }
    }

    #[test]
    fn write_only_round_trip_with_pad() {
        let mut r = PacketRepr::new(bth(0x0A));
        r.reth = Some(crate::reth::RethRepr {
            va: 0x1000,
            rkey: 7,
            dma_len: 5,
        });
        r.payload_len = 5;
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, b"hello").unwrap();
        assert_eq!(n, 12 + 16 + 5 + 3 + 4);
        assert_eq!(buf[1] >> 4 & 3, 3, "pad count");
        let p = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.header_len, 28);
        r.bth.pad_count = 3;
        assert_eq!(p.repr, r);
    }

    #[test]
    fn rejects_bad_pad_and_unexpected_payload() {
        let mut r = PacketRepr::new(bth(0x04));
        r.payload_len = 4;
        let mut buf = [0u8; 32];
        let n = r.emit(&mut buf, b"abcd").unwrap();
        // Claim a pad of 1 on a 4-byte payload: fine (payload 3 + pad 1).
        buf[1] |= 0x10;
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap().payload, b"abc");
        // Remove one byte: padded length 3 is not a word multiple.
        assert!(matches!(
            PacketRepr::parse(&buf[..n - 1]),
            Err(Error::BadPad { .. })
        ));
        // An ACK with 4 stray bytes.
        let mut a = PacketRepr::new(bth(0x11));
        a.aeth = Some(AethRepr {
            syndrome: crate::aeth::Syndrome::Ack { credits: 31 },
            msn: crate::types::Msn::new(1),
        });
        let n = a.emit(&mut buf, &[]).unwrap();
        assert_eq!(n, 20);
        assert!(matches!(
            PacketRepr::parse(&buf[..n + 4]),
            Err(Error::UnexpectedPayload { .. })
        ));
    }

    #[test]
    fn emit_rejects_inconsistent_reprs() {
        let r = PacketRepr::new(bth(0x0A)); // RETH missing
        assert!(matches!(
            r.emit(&mut [0u8; 64], &[]),
            Err(Error::Inconsistent(_))
        ));
        let mut s = PacketRepr::new(bth(0x04));
        s.aeth = Some(AethRepr {
            syndrome: crate::aeth::Syndrome::Ack { credits: 0 },
            msn: crate::types::Msn::ZERO,
        });
        assert!(s.emit(&mut [0u8; 64], &[]).is_err());
        assert!(matches!(
            PacketRepr::new(bth(0x15)).emit(&mut [0u8; 64], &[]),
            Err(Error::UnknownOpcode(0x15))
        ));
    }

    #[test]
    fn truncated_everywhere() {
        let mut r = PacketRepr::new(bth(0x13));
        r.atomic_eth = Some(AtomicEthRepr::default());
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, &[]).unwrap();
        assert_eq!(n, 12 + 28 + 4);
        assert!(PacketRepr::parse(&buf[..n]).is_ok());
        for k in 0..n {
            assert!(PacketRepr::parse(&buf[..k]).is_err(), "len {k}");
        }
        // The error names the header that was cut, and what it needed.
        assert_eq!(
            PacketRepr::parse(&buf[..20]),
            Err(Error::Truncated {
                layer: Layer::AtomicEth,
                need: 28,
                have: 8
            })
        );
        assert_eq!(
            PacketRepr::parse(&buf[..41]),
            Err(Error::Truncated {
                layer: Layer::Payload,
                need: 44,
                have: 41
            })
        );
    }

    /// An XRC SEND Only, byte by byte: BTH, XRCETH (reserved byte, SRQ number), payload,
    /// pad, ICRC slot.
    #[test]
    fn xrc_send_only_known_bytes() {
        let mut r = PacketRepr::new(bth(0xA4));
        r.xrceth = Some(XrcEthRepr { srqn: 0x00AB_CDEF });
        r.payload_len = 3;
        #[rustfmt::skip]
        let want = [
            0xA4, 0x10, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x64, // BTH
            0x00, 0xAB, 0xCD, 0xEF, // XRCETH
            b'x', b'r', b'c', 0x00, // payload, 1 pad byte
            0x00, 0x00, 0x00, 0x00, // ICRC slot
        ];
        let mut buf = [0xEEu8; 64];
        let n = r.emit(&mut buf, b"xrc").unwrap();
        assert_eq!(&buf[..n], &want[..]);
        assert_eq!(r.header_len(), Ok(16));
        let p = PacketRepr::parse(&want).unwrap();
        assert_eq!(p.header_len, 16);
        assert_eq!(p.payload, b"xrc");
        r.bth.pad_count = 1;
        assert_eq!(p.repr, r);
    }

    /// An XRC RDMA WRITE First: the XRCETH comes before the RETH.
    #[test]
    fn xrc_write_first_known_bytes() {
        let mut r = PacketRepr::new(bth(0xA6));
        r.xrceth = Some(XrcEthRepr { srqn: 7 });
        r.reth = Some(crate::reth::RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            dma_len: 8192,
        });
        r.payload_len = 4;
        #[rustfmt::skip]
        let want = [
            0xA6, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x64, // BTH
            0x00, 0x00, 0x00, 0x07, // XRCETH
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // RETH VA
            0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x20, 0x00, // R_Key, DMA length
            0xDE, 0xAD, 0xBE, 0xEF, // payload
            0x00, 0x00, 0x00, 0x00, // ICRC slot
        ];
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, &[0xDE, 0xAD, 0xBE, 0xEF]).unwrap();
        assert_eq!(&buf[..n], &want[..]);
        let p = PacketRepr::parse(&want).unwrap();
        assert_eq!(p.header_len, 32);
        assert_eq!(p.payload, &[0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(p.repr, r);
    }

    #[test]
    fn xrc_truncation_names_the_xrceth() {
        let mut r = PacketRepr::new(bth(0xA6));
        r.xrceth = Some(XrcEthRepr { srqn: 7 });
        r.reth = Some(crate::reth::RethRepr::default());
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, &[]).unwrap();
        for k in 0..n {
            assert!(PacketRepr::parse(&buf[..k]).is_err(), "len {k}");
        }
        for k in 12..16 {
            assert_eq!(
                PacketRepr::parse(&buf[..k]),
                Err(Error::Truncated {
                    layer: Layer::XrcEth,
                    need: 4,
                    have: k - 12
                })
            );
        }
        // Past the XRCETH, the RETH is the one cut short.
        assert_eq!(
            PacketRepr::parse(&buf[..20]),
            Err(Error::Truncated {
                layer: Layer::Reth,
                need: 16,
                have: 4
            })
        );
    }

    #[test]
    fn xrceth_must_match_the_opcode() {
        // An XRC request without its XRCETH cannot be emitted ...
        let r = PacketRepr::new(bth(0xA4));
        assert_eq!(
            r.emit(&mut [0u8; 64], &[]),
            Err(Error::Inconsistent(
                "missing extension header the opcode requires"
            ))
        );
        // ... nor an RC packet or an XRC response with one.
        for op in [0x04, 0xB1] {
            let mut r = PacketRepr::new(bth(op));
            r.xrceth = Some(XrcEthRepr::default());
            if op == 0xB1 {
                r.aeth = Some(AethRepr {
                    syndrome: crate::aeth::Syndrome::Ack { credits: 31 },
                    msn: crate::types::Msn::ZERO,
                });
            }
            assert_eq!(
                r.emit(&mut [0u8; 64], &[]),
                Err(Error::Inconsistent(
                    "extension header the opcode does not carry"
                ))
            );
        }
    }
}
