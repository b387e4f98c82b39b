//! A small, panic-free reader of pcap and pcapng capture files.
//!
//! Why not a crate: the decoder must never panic on a truncated or garbage file, and
//! the two formats need only a few dozen lines each when the whole file is in memory.
//! Every length read from the file is checked against what is left before it is used.
//!
//! * pcap (<https://www.tcpdump.org/manpages/pcap-savefile.5.txt>): a 24-byte file
//!   header whose magic gives the byte order and the timestamp unit (0xA1B2C3D4
//!   microseconds, 0xA1B23C4D nanoseconds), then 16-byte record headers, each followed
//!   by `incl_len` bytes.
//! * pcapng (IETF draft-ietf-opsawg-pcapng): blocks of `type, total_length, body,
//!   total_length`. A Section Header Block (SHB) sets the byte order of its section and
//!   forgets the interfaces; Interface Description Blocks (IDB) give each interface's
//!   link type; Enhanced, Simple and (obsolete) Packet Blocks carry frames. Every other
//!   block is skipped.
//!
//! Frames are numbered from 1 in file order, counting every packet record or packet
//! block, as tshark's `frame.number` does.

use core::fmt;

/// A link-layer header type (<https://www.tcpdump.org/linktypes.html>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkType(pub u16);

impl LinkType {
    /// BSD loopback: a 4-byte address family in the writer's byte order.
    pub const NULL: LinkType = LinkType(0);
    /// Ethernet II.
    pub const ETHERNET: LinkType = LinkType(1);
    /// Raw IP, version from the first nibble.
    pub const RAW: LinkType = LinkType(101);
    /// OpenBSD loopback: a 4-byte address family in network byte order.
    pub const LOOP: LinkType = LinkType(108);
    /// Linux "cooked" capture v1 (16-byte header).
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// Raw IPv4.
    pub const IPV4: LinkType = LinkType(228);
    /// Raw IPv6.
    pub const IPV6: LinkType = LinkType(229);
    /// Linux "cooked" capture v2 (20-byte header).
    pub const LINUX_SLL2: LinkType = LinkType(276);
}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// 1-based frame number in the file.
    pub number: u64,
    /// The link type of the interface the frame was captured on.
    pub link: LinkType,
    /// The captured bytes (possibly cut short by the snap length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
}

/// Why a capture file could not be read (further).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureError {
    /// The file is neither pcap nor pcapng.
    UnknownFormat {
        /// The first bytes of the file, for the message.
        magic: [u8; 4],
    },
    /// The file ends in the middle of a header or record.
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Byte offset in the file where it starts.
        offset: usize,
        /// Bytes it needs.
        need: usize,
        /// Bytes left in the file.
        have: usize,
    },
    /// A structure holds a value that cannot be right.
    Malformed {
        /// What is wrong.
        what: &'static str,
        /// Byte offset in the file.
        offset: usize,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::UnknownFormat { magic } => write!(
                f,
                "not a pcap or pcapng file (starts with {:02x} {:02x} {:02x} {:02x})",
                magic[0], magic[1], magic[2], magic[3]
            ),
            CaptureError::Truncated {
                what,
                offset,
                need,
                have,
            } => write!(
                f,
                "file truncated: {what} at byte {offset} needs {need} bytes, {have} left"
            ),
            CaptureError::Malformed { what, offset } => {
                write!(f, "malformed capture: {what} at byte {offset}")
            }
        }
    }
}

impl std::error::Error for CaptureError {}

/// Largest frame accepted. pcap writers use 262,144 as the default snap length; a record
/// claiming more than this is garbage, not a frame.
const MAX_FRAME: usize = 1 << 20;

const PCAP_MAGIC_US: u32 = 0xA1B2_C3D4;
const PCAP_MAGIC_NS: u32 = 0xA1B2_3C4D;
const PCAP_HEADER_LEN: usize = 24;
const PCAP_RECORD_LEN: usize = 16;

const PCAPNG_SHB: u32 = 0x0A0D_0D0A;
const PCAPNG_BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_PB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;

/// Byte order of the structures in a file or section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endian {
    Little,
    Big,
}

impl Endian {
    fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        }
    }
    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }
}

/// Bytes `off..off + N` of `buf` as an array, if present.
fn arr<const N: usize>(buf: &[u8], off: usize) -> Option<[u8; N]> {
    buf.get(off..off.checked_add(N)?)?.try_into().ok()
}

fn take<'a>(
    buf: &'a [u8],
    off: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], CaptureError> {
    let have = buf.len().saturating_sub(off);
    off.checked_add(len)
        .and_then(|end| buf.get(off..end))
        .ok_or(CaptureError::Truncated {
            what,
            offset: off,
            need: len,
            have,
        })
}

#[derive(Debug)]
enum Format {
    Pcap { endian: Endian, link: LinkType },
    Pcapng(Pcapng),
}

#[derive(Debug)]
struct Pcapng {
    /// Byte order of the current section; `None` before the first SHB is read.
    endian: Option<Endian>,
    /// Link type and snap length of each interface of the current section.
    interfaces: Vec<(LinkType, u32)>,
}

/// Iterates over the frames of a capture held in memory. After an error, iteration ends.
#[derive(Debug)]
pub struct Capture<'a> {
    buf: &'a [u8],
    off: usize,
    next_number: u64,
    format: Format,
    failed: bool,
}

impl<'a> Capture<'a> {
    /// Recognises the format from the first bytes and reads the file header.
    pub fn new(buf: &'a [u8]) -> Result<Self, CaptureError> {
        let head: [u8; 4] = match arr(buf, 0) {
            Some(h) => h,
            None => {
                return Err(CaptureError::Truncated {
                    what: "file magic",
                    offset: 0,
                    need: 4,
                    have: buf.len(),
                })
            }
        };
        let le = u32::from_le_bytes(head);
        let be = u32::from_be_bytes(head);
        let format = if le == PCAPNG_SHB {
            // The SHB type is a palindrome; its byte-order magic is read in `next`.
            Format::Pcapng(Pcapng {
                endian: None,
                interfaces: Vec::new(),
            })
        } else {
            let endian = if le == PCAP_MAGIC_US || le == PCAP_MAGIC_NS {
                Endian::Little
            } else if be == PCAP_MAGIC_US || be == PCAP_MAGIC_NS {
                Endian::Big
            } else {
                return Err(CaptureError::UnknownFormat { magic: head });
            };
            let h = take(buf, 0, PCAP_HEADER_LEN, "pcap file header")?;
            let network = arr(h, 20).map(|b| endian.u32(b)).unwrap_or(0);
            // Bits 16..31 of the link-type field carry FCS information; the type is
            // the low 16 bits (pcap-savefile(5), "LinkType and additional information").
            let link = LinkType((network & 0xFFFF) as u16);
            Format::Pcap { endian, link }
        };
        let off = match format {
            Format::Pcap { .. } => PCAP_HEADER_LEN,
            Format::Pcapng(_) => 0,
        };
        Ok(Capture {
            buf,
            off,
            next_number: 1,
            format,
            failed: false,
        })
    }

    fn next_pcap(
        &mut self,
        endian: Endian,
        link: LinkType,
    ) -> Option<Result<Frame<'a>, CaptureError>> {
        if self.off >= self.buf.len() {
            return None;
        }
        let start = self.off;
        let rec = match take(self.buf, start, PCAP_RECORD_LEN, "pcap record header") {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let field = |o| arr(rec, o).map(|b| endian.u32(b)).unwrap_or(0);
        let incl = field(8) as usize;
        let orig = field(12);
        if incl > MAX_FRAME {
            return Some(Err(CaptureError::Malformed {
                what: "pcap record length above 1 MiB",
                offset: start,
            }));
        }
        let data = match take(self.buf, start + PCAP_RECORD_LEN, incl, "pcap record data") {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        self.off = start + PCAP_RECORD_LEN + incl;
        Some(Ok(self.frame(link, data, orig)))
    }

    fn frame(&mut self, link: LinkType, data: &'a [u8], orig_len: u32) -> Frame<'a> {
        let number = self.next_number;
        self.next_number += 1;
        Frame {
            number,
            link,
            data,
            orig_len,
        }
    }

    /// Reads pcapng blocks until one carries a frame.
    fn next_pcapng(&mut self) -> Option<Result<Frame<'a>, CaptureError>> {
        loop {
            if self.off >= self.buf.len() {
                return None;
            }
            match self.pcapng_block() {
                Ok(Some(f)) => return Some(Ok(f)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Reads one pcapng block; returns the frame it carries, if any. Always advances
    /// `self.off` by at least 12 bytes on success, so the loop above is bounded.
    fn pcapng_block(&mut self) -> Result<Option<Frame<'a>>, CaptureError> {
        let start = self.off;
        let head = take(self.buf, start, 8, "pcapng block header")?;
        let raw_type: [u8; 4] = arr(head, 0).unwrap_or_default();
        let Format::Pcapng(ng) = &mut self.format else {
            return Ok(None);
        };
        let endian = if u32::from_le_bytes(raw_type) == PCAPNG_SHB {
            let bom: [u8; 4] =
                arr(take(self.buf, start, 12, "pcapng section header")?, 8).unwrap_or_default();
            let e = if u32::from_le_bytes(bom) == PCAPNG_BYTE_ORDER_MAGIC {
                Endian::Little
            } else if u32::from_be_bytes(bom) == PCAPNG_BYTE_ORDER_MAGIC {
                Endian::Big
            } else {
                return Err(CaptureError::Malformed {
                    what: "pcapng section header byte-order magic",
                    offset: start + 8,
                });
            };
            ng.endian = Some(e);
            ng.interfaces.clear();
            e
        } else {
            match ng.endian {
                Some(e) => e,
                None => {
                    return Err(CaptureError::Malformed {
                        what: "pcapng file does not start with a section header",
                        offset: start,
                    })
                }
            }
        };
        let btype = endian.u32(raw_type);
        let total = endian.u32(arr(head, 4).unwrap_or_default()) as usize;
        if total < 12 || !total.is_multiple_of(4) || total > MAX_FRAME + 4096 {
            return Err(CaptureError::Malformed {
                what: "pcapng block length",
                offset: start + 4,
            });
        }
        let block = take(self.buf, start, total, "pcapng block")?;
        let trailer = endian.u32(arr(block, total - 4).unwrap_or_default()) as usize;
        if trailer != total {
            return Err(CaptureError::Malformed {
                what: "pcapng block trailing length differs from leading length",
                offset: start + total - 4,
            });
        }
        self.off = start + total;
        // The block body, between the two length fields.
        let body = block.get(8..total - 4).unwrap_or(&[]);
        let u32_at = |o: usize| arr(body, o).map(|b| endian.u32(b));
        let short = |what| CaptureError::Malformed {
            what,
            offset: start,
        };
        match btype {
            PCAPNG_IDB => {
                let link = arr(body, 0)
                    .map(|b| endian.u16(b))
                    .ok_or(short("pcapng interface block too short"))?;
                let snap = u32_at(4).ok_or(short("pcapng interface block too short"))?;
                ng.interfaces.push((LinkType(link), snap));
                Ok(None)
            }
            PCAPNG_EPB | PCAPNG_PB => {
                let (iface, caplen, orig) = if btype == PCAPNG_EPB {
                    (u32_at(0), u32_at(12), u32_at(16))
                } else {
                    let iface = arr(body, 0).map(|b| u32::from(endian.u16(b)));
                    (iface, u32_at(12), u32_at(16))
                };
                let (Some(iface), Some(caplen), Some(orig)) = (iface, caplen, orig) else {
                    return Err(short("pcapng packet block too short"));
                };
                let (link, _) = *ng
                    .interfaces
                    .get(iface as usize)
                    .ok_or(short("pcapng packet block names an undeclared interface"))?;
                let data = body
                    .get(20..20 + caplen as usize)
                    .ok_or(short("pcapng packet block captured length exceeds block"))?;
                Ok(Some(self.frame(link, data, orig)))
            }
            PCAPNG_SPB => {
                let (link, snap) = *ng
                    .interfaces
                    .first()
                    .ok_or(short("pcapng simple packet block without an interface"))?;
                let orig = u32_at(0).ok_or(short("pcapng simple packet block too short"))?;
                // The captured length is implied: the original length, cut to the
                // snap length (0 = unlimited) and to the block.
                let mut caplen = orig as usize;
                if snap != 0 {
                    caplen = caplen.min(snap as usize);
                }
                caplen = caplen.min(body.len().saturating_sub(4));
                let data = body.get(4..4 + caplen).unwrap_or(&[]);
                Ok(Some(self.frame(link, data, orig)))
            }
            _ => Ok(None),
        }
    }
}

impl<'a> Iterator for Capture<'a> {
    type Item = Result<Frame<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = match self.format {
            Format::Pcap { endian, link } => self.next_pcap(endian, link),
            Format::Pcapng(_) => self.next_pcapng(),
        };
        if matches!(r, Some(Err(_))) {
            self.failed = true;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap(endian: Endian, ns: bool, link: u32, frames: &[&[u8]]) -> Vec<u8> {
        let w32 = |v: u32| match endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        let w16 = |v: u16| match endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        let mut f = Vec::new();
        f.extend(w32(if ns { PCAP_MAGIC_NS } else { PCAP_MAGIC_US }));
        f.extend(w16(2));
        f.extend(w16(4));
        f.extend(w32(0));
        f.extend(w32(0));
        f.extend(w32(65535));
        f.extend(w32(link));
        for d in frames {
            f.extend(w32(1));
            f.extend(w32(2));
            f.extend(w32(d.len() as u32));
            f.extend(w32(d.len() as u32 + 1));
            f.extend(*d);
        }
        f
    }

    fn block(endian: Endian, t: u32, body: &[u8]) -> Vec<u8> {
        let w32 = |v: u32| match endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        let mut padded = body.to_vec();
        while !padded.len().is_multiple_of(4) {
            padded.push(0);
        }
        let total = (padded.len() + 12) as u32;
        let mut b = Vec::new();
        b.extend(w32(t));
        b.extend(w32(total));
        b.extend(padded);
        b.extend(w32(total));
        b
    }

    fn pcapng(endian: Endian, frames: &[&[u8]]) -> Vec<u8> {
        let w32 = |v: u32| match endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        let w16 = |v: u16| match endian {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        };
        let mut shb = Vec::new();
        shb.extend(w32(PCAPNG_BYTE_ORDER_MAGIC));
        shb.extend(w16(1));
        shb.extend(w16(0));
        shb.extend([0xFF; 8]);
        let mut f = block(endian, PCAPNG_SHB, &shb);
        let mut idb = Vec::new();
        idb.extend(w16(101));
        idb.extend(w16(0));
        idb.extend(w32(0));
        f.extend(block(endian, PCAPNG_IDB, &idb));
        // An unknown block (name resolution) to skip.
        f.extend(block(endian, 4, &[0; 4]));
        for (i, d) in frames.iter().enumerate() {
            if i % 2 == 0 {
                let mut epb = Vec::new();
                epb.extend(w32(0));
                epb.extend(w32(0));
                epb.extend(w32(0));
                epb.extend(w32(d.len() as u32));
                epb.extend(w32(d.len() as u32));
                epb.extend(*d);
                f.extend(block(endian, PCAPNG_EPB, &epb));
            } else {
                let mut spb = Vec::new();
                spb.extend(w32(d.len() as u32));
                spb.extend(*d);
                f.extend(block(endian, PCAPNG_SPB, &spb));
            }
        }
        f
    }

    fn read_all(buf: &[u8]) -> Result<Vec<(u64, LinkType, Vec<u8>)>, CaptureError> {
        Capture::new(buf)?
            .map(|r| r.map(|f| (f.number, f.link, f.data.to_vec())))
            .collect()
    }

    #[test]
    fn pcap_both_byte_orders_and_units() {
        for endian in [Endian::Little, Endian::Big] {
            for ns in [false, true] {
                let f = pcap(endian, ns, 1, &[b"abc", b"", b"defgh"]);
                let got = read_all(&f).unwrap();
                assert_eq!(got.len(), 3);
                assert_eq!(got[0], (1, LinkType::ETHERNET, b"abc".to_vec()));
                assert_eq!(got[2], (3, LinkType::ETHERNET, b"defgh".to_vec()));
            }
        }
    }

    #[test]
    fn pcapng_both_byte_orders_epb_and_spb() {
        for endian in [Endian::Little, Endian::Big] {
            let f = pcapng(endian, &[b"abcde", b"xyz", b"12345678"]);
            let got = read_all(&f).unwrap();
            assert_eq!(
                got,
                vec![
                    (1, LinkType::RAW, b"abcde".to_vec()),
                    (2, LinkType::RAW, b"xyz".to_vec()),
                    (3, LinkType::RAW, b"12345678".to_vec()),
                ]
            );
        }
    }

    #[test]
    fn every_truncation_is_an_error_or_a_clean_prefix() {
        let files = [
            pcap(Endian::Little, false, 1, &[b"abc", b"defgh"]),
            pcapng(Endian::Big, &[b"abcde", b"xyz"]),
        ];
        for f in &files {
            let full = read_all(f).unwrap();
            for n in 0..f.len() {
                match read_all(&f[..n]) {
                    Ok(v) => assert!(v.len() < full.len() && full.starts_with(&v), "len {n}"),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
        }
    }

    #[test]
    fn garbage_is_rejected_without_panic() {
        assert!(matches!(
            Capture::new(b"hello world, not a capture"),
            Err(CaptureError::UnknownFormat { .. })
        ));
        assert!(Capture::new(b"").is_err());
        // Every single-byte corruption of a small file either reads or errors.
        let f = pcapng(Endian::Little, &[b"abcde", b"xyz"]);
        for i in 0..f.len() {
            for v in [0x00, 0xFF, 0x80] {
                let mut g = f.clone();
                g[i] = v;
                if let Ok(c) = Capture::new(&g) {
                    assert!(c.take(100).count() <= 4);
                }
            }
        }
        // A record claiming 4 GiB.
        let mut p = pcap(Endian::Little, false, 1, &[b"abc"]);
        p[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_all(&p), Err(CaptureError::Malformed { .. })));
    }
}
