//! Shared by the capture tests: the frames of `tests/data/captures/**/*.pcap`, read by a
//! few lines of pcap parsing so that `wire` keeps no dependency for it.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use wire::frame::parse_ethernet;
use wire::ROCEV2_UDP_PORT;

pub fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/captures")
}

pub fn pcap_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read captures dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            pcap_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "pcap") {
            out.push(p);
        }
    }
}

/// The frames of a classic pcap file (either byte order, micro- or nanosecond), all of
/// link type Ethernet. Test data is trusted: malformed files fail the test.
pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).expect("read capture");
    let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
    let le = match magic {
        0xA1B2_C3D4 | 0xA1B2_3C4D => true,
        0xD4C3_B2A1 | 0x4D3C_B2A1 => false,
        m => panic!("{}: not pcap (magic {m:#x})", path.display()),
    };
    let u32_at = |o: usize| {
        let a: [u8; 4] = b[o..o + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    assert_eq!(u32_at(20) & 0xFFFF, 1, "{}: link type", path.display());
    let mut frames = Vec::new();
    let mut off = 24;
    while off < b.len() {
        let incl = u32_at(off + 8) as usize;
        let orig = u32_at(off + 12) as usize;
        assert_eq!(incl, orig, "{}: snapped frame", path.display());
        frames.push(b[off + 16..off + 16 + incl].to_vec());
        off += 16 + incl;
    }
    frames
}

/// A RoCEv2 frame from a capture.
pub struct Packet {
    pub file: String,
    /// 1-based frame number.
    pub number: usize,
    pub frame: Vec<u8>,
}

pub fn all_packets() -> Vec<Packet> {
    let mut files = Vec::new();
    pcap_files(&captures_dir(), &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let name = f
            .strip_prefix(captures_dir())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for (i, frame) in read_pcap(&f).into_iter().enumerate() {
            if parse_ethernet(&frame, ROCEV2_UDP_PORT).is_ok() {
                out.push(Packet {
                    file: name.clone(),
                    number: i + 1,
                    frame,
                });
            }
        }
    }
    out
}
