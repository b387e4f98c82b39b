//! `--pcap FILE`: every packet the NIC sends and receives, written as an Ethernet II /
//! IP / UDP frame in classic pcap format (linktype 1), so `softnic decode` and tshark
//! read it and every ICRC verifies.
//!
//! A plain UDP socket sees no Ethernet or IP header, so they are synthesized with
//! [`wire::frame::emit_ethernet`] from what the ICRC covers: addresses, ports, the
//! IPv4 Identification and DF. Sent packets carry ID 0 (what Linux puts on an unconnected
//! DF socket's packets, see `udp.rs`); received packets carry the ID the ICRC check
//! recovered (see `rx_icrc.rs`), so the capture shows each packet as it was on the wire
//! and its ICRC verifies. MAC addresses are synthetic and locally administered:
//! `02:00` followed by the last four bytes of the IP address.
//!
//! Packets are buffered; the file is flushed at most every [`FLUSH_EVERY`] and when the
//! NIC stops (and on drop), so a capture of a crashed NIC loses at most that much.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wire::frame::{emit_ethernet, FrameParams};
use wire::icrc::{IcrcParams, IpParams};

/// Longest interval between flushes.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

const SNAPLEN: u32 = 65_535;
const LINKTYPE_ETHERNET: u32 = 1;

/// The synthetic MAC of a host: `02:00` + the low four address bytes.
pub fn synthetic_mac(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let s = a.octets();
            [s[12], s[13], s[14], s[15]]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

fn ip_of(p: &IpParams) -> (IpAddr, IpAddr) {
    match *p {
        IpParams::V4 { src, dst, .. } => (IpAddr::V4(src), IpAddr::V4(dst)),
        IpParams::V6 { src, dst } => (IpAddr::V6(src), IpAddr::V6(dst)),
    }
}

/// A classic-pcap writer of RoCEv2 frames.
pub struct PcapWriter {
    out: BufWriter<File>,
    frame: Vec<u8>,
    last_flush: std::time::Instant,
    records: u64,
}

impl PcapWriter {
    /// Creates (truncates) `path` and writes the pcap file header.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs: 0
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        out.flush()?;
        Ok(PcapWriter {
            out,
            frame: vec![0u8; SNAPLEN as usize],
            last_flush: std::time::Instant::now(),
            records: 0,
        })
    }

    /// Records one RoCEv2 UDP payload `roce` (BTH … ICRC) with the outer fields in
    /// `params` (the same the ICRC was computed or verified with) and IP TOS / traffic
    /// class `tos`.
    pub fn record(&mut self, params: &IcrcParams, tos: u8, roce: &[u8]) -> io::Result<()> {
        let (src, dst) = ip_of(&params.ip);
        let fp = FrameParams {
            dst_mac: synthetic_mac(dst),
            src_mac: synthetic_mac(src),
            icrc: *params,
            ttl: 64,
            tos,
        };
        let n = emit_ethernet(&fp, roce, &mut self.frame)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&(ts.as_secs() as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&(n as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(n as u32).to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(self.frame.get(..n).unwrap_or(&[]))?;
        self.records += 1;
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = std::time::Instant::now();
        self.out.flush()
    }

    /// Records written.
    pub fn records(&self) -> u64 {
        self.records
    }
}

impl Drop for PcapWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use wire::bth::BthRepr;
    use wire::opcode::Opcode;
    use wire::{PacketRepr, Psn, Qpn};

    #[test]
    fn written_frames_parse_back_with_valid_icrc() {
        let dir = std::env::temp_dir().join(format!("softnic-pcap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcap");
        // An RC SEND Only carrying 5 bytes.
        let repr = PacketRepr {
            payload_len: 5,
            ..PacketRepr::new(BthRepr {
                ack_req: true,
                ..BthRepr::new(Opcode(0x04), Qpn::new(0x11), Psn::new(7))
            })
        };
        let mut roce = [0u8; 64];
        let n = repr.emit(&mut roce, b"hello").unwrap();
        let params = IcrcParams {
            ip: IpParams::V4 {
                src: Ipv4Addr::new(127, 0, 0, 2),
                dst: Ipv4Addr::new(127, 0, 0, 3),
                id: 0x1234,
                dont_fragment: true,
            },
            src_port: 4791,
            dst_port: 4791,
        };
        params.fill(&mut roce[..n]).unwrap();
        {
            let mut w = PcapWriter::create(&path).unwrap();
            w.record(&params, 0, &roce[..n]).unwrap();
            w.record(&params, 0, &roce[..n]).unwrap();
            assert_eq!(w.records(), 2);
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..4], &[0xD4, 0xC3, 0xB2, 0xA1]);
        let incl = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
        let frame = &bytes[40..40 + incl];
        let f = wire::frame::parse_ethernet(frame, 4791).unwrap();
        assert_eq!(f.ipv4_id, 0x1234);
        f.verify_icrc().unwrap();
        assert_eq!(bytes.len(), 24 + 2 * (16 + incl));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
