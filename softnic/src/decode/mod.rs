//! `softnic decode FILE [--json] [--port N]`: print every RoCEv2 packet of a pcap or
//! pcapng capture, one line each, and verify its ICRC against the frame's own IP and
//! UDP headers (IBTA Annex A17.4.1.1; see `wire::icrc`).
//!
//! * [`capture`] reads the file format (pcap and pcapng, both byte orders);
//! * [`link`] finds the RoCEv2 packet in a frame (Ethernet, raw IP, Linux SLL/SLL2);
//! * [`record`] decodes one packet into what is reported, [`cm`] the CM MAD of a
//!   packet to QP1;
//! * [`format`] renders it as text or JSON.
//!
//! Exit status: 0 when every RoCEv2 packet parsed and its ICRC verified; 1 when one did
//! not, or the file cannot be read; 2 for usage errors (from clap). The reasons go to
//! stderr, with a final summary. The user guide is docs/decode.md.

pub mod capture;
pub mod cm;
pub mod format;
pub mod link;
pub mod record;

use std::io::Write;
use std::process::ExitCode;

use capture::Capture;
use link::Classified;
use record::{Record, Status};

/// Arguments of `softnic decode`.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// The pcap or pcapng file.
    pub file: std::path::PathBuf,
    /// Print one JSON object per packet (JSON Lines) instead of text.
    #[arg(long)]
    pub json: bool,
    /// UDP destination port that carries RoCEv2.
    #[arg(long, default_value_t = wire::ROCEV2_UDP_PORT)]
    pub port: u16,
}

/// Counts for the summary line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Frames read from the file.
    pub frames: u64,
    /// RoCEv2 packets (including broken ones).
    pub roce: u64,
    /// RoCEv2 packets whose headers did not parse.
    pub parse_errors: u64,
    /// RoCEv2 packets that parsed but whose ICRC did not verify.
    pub bad_icrc: u64,
    /// RoCEv2 packets captured shorter than they were on the wire.
    pub snapped: u64,
}

impl Summary {
    /// True when every RoCEv2 packet parsed and verified.
    pub fn all_ok(&self) -> bool {
        self.parse_errors == 0 && self.bad_icrc == 0
    }
}

/// Decodes a capture held in memory, calling `emit` with each RoCEv2 packet's record.
/// Returns the counts, or the reason the file could not be read to its end (the records
/// before that point have been emitted).
pub fn decode_capture(
    buf: &[u8],
    port: u16,
    mut emit: impl FnMut(&Record),
) -> Result<Summary, (Summary, capture::CaptureError)> {
    let mut sum = Summary::default();
    let cap = match Capture::new(buf) {
        Ok(c) => c,
        Err(e) => return Err((sum, e)),
    };
    for frame in cap {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return Err((sum, e)),
        };
        sum.frames += 1;
        let mut rec = match link::classify(frame.link, frame.data, port) {
            Classified::Other => continue,
            Classified::Roce(f) => Record::from_frame(frame.number, &f),
            Classified::Broken(e, ends) => Record::broken(frame.number, &e, ends),
        };
        sum.roce += 1;
        if (frame.data.len() as u64) < u64::from(frame.orig_len) && rec.status != Status::Ok {
            // The capture's snap length cut the packet: say so rather than blame it.
            sum.snapped += 1;
            let why = rec.error.take().unwrap_or_default();
            rec.error = Some(format!(
                "captured {} of {} bytes (snap length): {why}",
                frame.data.len(),
                frame.orig_len
            ));
        }
        match rec.status {
            Status::Ok => {}
            Status::BadIcrc => sum.bad_icrc += 1,
            Status::ParseError => sum.parse_errors += 1,
        }
        emit(&rec);
    }
    Ok(sum)
}

/// Runs `softnic decode`.
pub fn main(a: DecodeArgs) -> ExitCode {
    let name = a.file.display().to_string();
    let buf = match std::fs::read(&a.file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("softnic decode: {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut problems: Vec<String> = Vec::new();
    let mut write_failed = false;
    let result = decode_capture(&buf, a.port, |r| {
        let line = if a.json {
            format::json_line(r)
        } else {
            format::text_line(r)
        };
        if !write_failed && writeln!(out, "{line}").is_err() {
            // stdout closed (e.g. piped into `head`): keep counting, stop writing.
            write_failed = true;
        }
        if r.status != Status::Ok {
            problems.push(format!(
                "frame {}: {}",
                r.frame,
                r.error.as_deref().unwrap_or("error")
            ));
        }
    });
    let _ = out.flush();
    drop(out);
    for p in &problems {
        eprintln!("softnic decode: {name}: {p}");
    }
    let (sum, file_error) = match result {
        Ok(s) => (s, None),
        Err((s, e)) => (s, Some(e)),
    };
    eprintln!(
        "softnic decode: {name}: {} frames, {} RoCEv2 packets ({} ICRC bad, {} parse errors), {} other frames skipped",
        sum.frames,
        sum.roce,
        sum.bad_icrc,
        sum.parse_errors,
        sum.frames - sum.roce
    );
    if let Some(e) = file_error {
        eprintln!("softnic decode: {name}: error: {e}");
        return ExitCode::FAILURE;
    }
    if sum.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Ethernet frame from `rxe-lab/rc_send.pcap` would do, but a built one keeps
    /// this test independent of files: an RC SEND Only with a valid ICRC.
    fn frame(payload: &[u8]) -> Vec<u8> {
        use wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn};
        let p = PacketRepr::new(BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11), Psn::new(7))
        });
        frame_of(p, payload)
    }

    /// The Ethernet frame of `p` with `payload`, its ICRC filled.
    fn frame_of(mut p: wire::PacketRepr, payload: &[u8]) -> Vec<u8> {
        use wire::frame::{emit_ethernet, FrameParams};
        use wire::{IcrcParams, IpParams};
        p.payload_len = payload.len();
        let mut roce = vec![0u8; p.total_len().unwrap()];
        p.emit(&mut roce, payload).unwrap();
        let icrc = IcrcParams {
            ip: IpParams::V4 {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                id: 0x1234,
                dont_fragment: true,
            },
            src_port: 49441,
            dst_port: 4791,
        };
        icrc.fill(&mut roce).unwrap();
        let fp = FrameParams {
            dst_mac: [2; 6],
            src_mac: [4; 6],
            icrc,
            ttl: 64,
            tos: 0,
        };
        let mut out = vec![0u8; 1500];
        let n = emit_ethernet(&fp, &roce, &mut out).unwrap();
        out.truncate(n);
        out
    }

    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut f = Vec::new();
        for v in [0xA1B2_C3D4u32, 0x0004_0002, 0, 0, 65535, 1] {
            f.extend(v.to_le_bytes());
        }
        for d in frames {
            for v in [0, 0, d.len() as u32, d.len() as u32] {
                f.extend(v.to_le_bytes());
            }
            f.extend(d);
        }
        f
    }

    #[test]
    fn counts_good_bad_and_other_frames() {
        let good = frame(b"hello!");
        let mut bad = good.clone();
        let last = bad.len() - 6;
        bad[last] ^= 0x01; // a payload byte
        let other = vec![0u8; 60];
        let file = pcap(&[good, other, bad]);
        let mut recs = Vec::new();
        let sum = decode_capture(&file, 4791, |r| recs.push(r.clone())).unwrap();
        assert_eq!(sum.frames, 3);
        assert_eq!(sum.roce, 2);
        assert_eq!(sum.bad_icrc, 1);
        assert!(!sum.all_ok());
        assert_eq!(recs[0].frame, 1);
        assert_eq!(recs[0].status, Status::Ok);
        assert_eq!(recs[1].frame, 3);
        assert_eq!(recs[1].status, Status::BadIcrc);
        let line = format::text_line(&recs[0]);
        assert!(line.starts_with("1 10.0.0.1:49441 → 10.0.0.2:4791 RC_SEND_ONLY"));
        assert!(line.ends_with("len=6 ICRC ok"), "{line}");
        assert!(format::text_line(&recs[1]).contains("ICRC BAD"));
        // Another port sees no RoCEv2 at all.
        let sum = decode_capture(&file, 4792, |_| {}).unwrap();
        assert_eq!((sum.frames, sum.roce), (3, 0));
    }

    /// An XRC request shows its XRCETH in both renderings, first after the BTH fields.
    #[test]
    fn xrc_request_shows_its_srq_number() {
        use wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn, RethRepr, XrcEthRepr};
        let mut p = PacketRepr::new(BthRepr::new(Opcode(0xA6), Qpn::new(0x12), Psn::new(9)));
        p.xrceth = Some(XrcEthRepr { srqn: 0xAB_CDEF });
        p.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x77,
            dma_len: 64,
        });
        let file = pcap(&[frame_of(p, &[5u8; 8])]);
        let mut recs = Vec::new();
        let sum = decode_capture(&file, 4791, |r| recs.push(r.clone())).unwrap();
        assert!(sum.all_ok());
        let line = format::text_line(&recs[0]);
        assert!(
            line.contains(
                "XRC_RDMA_WRITE_FIRST qp=0x000012 psn=9 ack_req=0 \
                 xrceth(srqn=0xabcdef) reth(va=0x1000 rkey=0x77 len=64) len=8 ICRC ok"
            ),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&format::json_line(&recs[0])).unwrap();
        assert_eq!(v["opcode_name"], "XRC_RDMA_WRITE_FIRST");
        assert_eq!(v["xrceth"]["srqn"], 0xAB_CDEF);
        assert_eq!(v["reth"]["dma_len"], 64);
        // An RC packet has no `xrceth` key at all.
        let rc = decode_capture(&pcap(&[frame(b"x")]), 4791, |r| {
            assert!(!format::json_line(r).contains("xrceth"));
            assert!(!format::text_line(r).contains("xrceth"));
        });
        assert!(rc.unwrap().all_ok());
    }

    #[test]
    fn snapped_packet_is_reported() {
        let mut f = pcap(&[frame(&[7u8; 100])]);
        // Cut the record's captured length to 60 (of 154) and drop the bytes.
        f[32..36].copy_from_slice(&60u32.to_le_bytes());
        f.truncate(24 + 16 + 60);
        let mut errs = Vec::new();
        let sum = decode_capture(&f, 4791, |r| errs.push(r.error.clone())).unwrap();
        assert_eq!((sum.roce, sum.snapped, sum.parse_errors), (1, 1, 1));
        assert!(errs[0].as_deref().unwrap().contains("snap length"));
    }

    /// Real captures, corrupted at random and cut everywhere: the decoder reports
    /// errors and never panics (the no-panic rule for untrusted input).
    #[test]
    fn corrupted_real_captures_never_panic() {
        let files: [&[u8]; 2] = [
            include_bytes!("../../../tests/data/captures/public/rdma_atomic_bw.pcap"),
            include_bytes!("../../../tests/data/captures/pcapng/rdma_atomic_bw.pcapng"),
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for f in files {
            let clean = decode_capture(f, 4791, |_| {}).unwrap();
            assert_eq!((clean.roce, clean.bad_icrc), (10, 0));
            for cut in (0..f.len()).step_by(7) {
                let r = decode_capture(&f[..cut], 4791, |r| assert!(r.frame > 0));
                let sum = match r {
                    Ok(s) | Err((s, _)) => s,
                };
                assert!(sum.roce <= clean.roce);
            }
            let (mut errors, mut bad) = (0, 0);
            for _ in 0..2000 {
                let mut g = f.to_vec();
                for _ in 0..1 + rnd() % 4 {
                    let i = (rnd() % g.len() as u64) as usize;
                    g[i] ^= 1 << (rnd() % 8);
                }
                match decode_capture(&g, 4791, |r| {
                    let _ = format::text_line(r);
                    let _ = format::json_line(r);
                }) {
                    Ok(s) => bad += u64::from(!s.all_ok()),
                    Err(_) => errors += 1,
                }
            }
            // Corruption is noticed one way or another in a good share of the cases
            // (flips in non-RoCEv2 frames or masked fields go unnoticed, rightly).
            assert!(
                errors + bad > 200,
                "{errors} file errors, {bad} bad packets"
            );
        }
    }
}
