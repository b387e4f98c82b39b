//! `softnic decode` as a user runs it: the built binary on the repository's captures,
//! on a pcapng copy, on a corrupted packet, on truncated and garbage files, and on a
//! non-standard port.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// RoCEv2 packets per capture (UDP destination port 4791; see wire/tests/captures.rs,
/// which checks the same numbers with its own reader).
const EXPECTED: &[(&str, usize)] = &[
    ("public/hw_send_imm.pcap", 105),
    ("public/nccl_ring2_node0.pcap", 184),
    ("public/pingpong_rc.pcap", 20),
    ("public/pingpong_uc.pcap", 10),
    ("public/pingpong_ud.pcap", 10),
    ("public/rdma_atomic_bw.pcap", 10),
    ("public/rdma_cm.pcap", 96),
    ("public/rdma_read_bw.pcap", 20),
    ("public/rdma_read_lat.pcap", 10),
    ("public/rdma_send_bw.pcap", 20),
    ("public/rdma_write_bw.pcap", 20),
    ("public/rdma_write_lat.pcap", 20),
    ("public/rping.pcap", 65),
    ("rxe-lab/rc_mtu1024.pcap", 72),
    ("rxe-lab/rc_read.pcap", 64),
    ("rxe-lab/rc_send.pcap", 64),
    ("rxe-lab/rc_send_ipv6.pcap", 32),
    ("rxe-lab/rc_write.pcap", 64),
    ("rxe-lab/rdma_cm.pcap", 41),
    ("rxe-lab/uc_send.pcap", 48),
    ("rxe-lab/ud_send.pcap", 16),
    ("rxe-lab/ud_send_ipv6.pcap", 16),
];

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/captures")
        .join(name)
}

fn decode(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("decode")
        .args(args)
        .arg(file)
        .output()
        .expect("run softnic")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A scratch directory for files made by one test, removed when dropped.
struct Scratch(PathBuf);
impl Scratch {
    fn new(test: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("softnic-decode-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Byte ranges of the frames of a little-endian pcap file (the repository's captures).
fn pcap_frames(b: &[u8]) -> Vec<std::ops::Range<usize>> {
    assert_eq!(&b[..4], &[0xD4, 0xC3, 0xB2, 0xA1], "little-endian pcap");
    let mut out = Vec::new();
    let mut off = 24;
    while off < b.len() {
        let incl = u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        out.push(off + 16..off + 16 + incl);
        off += 16 + incl;
    }
    out
}

fn assert_no_panic(o: &Output) {
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.status.code().is_some(), "killed by a signal: {o:?}");
}

#[test]
fn every_capture_decodes_with_all_icrcs_ok() {
    for &(name, n) in EXPECTED {
        let o = decode(&[], &capture(name));
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o.stderr));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), n, "{name}");
        let mut last = 0u64;
        for l in &lines {
            assert!(l.ends_with(" ICRC ok"), "{name}: {l}");
            assert!(l.contains(" → "), "{name}: {l}");
            let frame: u64 = l.split(' ').next().unwrap().parse().unwrap();
            assert!(frame > last, "{name}: frame numbers increase");
            last = frame;
        }
        assert!(
            text(&o.stderr).contains(&format!("{n} RoCEv2 packets (0 ICRC bad, 0 parse errors)")),
            "{name}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn json_lines_carry_the_documented_fields() {
    let mut seen_headers = std::collections::BTreeSet::new();
    for &(name, n) in EXPECTED {
        let o = decode(&["--json"], &capture(name));
        assert_eq!(o.status.code(), Some(0), "{name}");
        let out = text(&o.stdout);
        let mut count = 0;
        for l in out.lines() {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object");
            for k in [
                "frame",
                "opcode",
                "dest_qp",
                "psn",
                "pkey",
                "pad",
                "payload_len",
                "icrc",
            ] {
                assert!(v[k].is_u64(), "{name}: {k} in {l}");
            }
            for k in ["src", "dst", "opcode_name", "status"] {
                assert!(v[k].is_string(), "{name}: {k} in {l}");
            }
            for k in ["ack_req", "solicited", "fecn", "becn", "icrc_ok"] {
                assert!(v[k].is_boolean(), "{name}: {k} in {l}");
            }
            assert_eq!(v["status"], "ok");
            assert_eq!(v["icrc_ok"], true);
            assert!(v.get("error").is_none());
            for h in [
                "reth",
                "aeth",
                "deth",
                "imm",
                "ieth",
                "atomic_eth",
                "atomic_ack_eth",
            ] {
                if v.get(h).is_some() {
                    seen_headers.insert(h);
                }
            }
            if let Some(r) = v.get("reth") {
                assert!(r["va"].is_u64() && r["rkey"].is_u64() && r["dma_len"].is_u64());
            }
            if let Some(a) = v.get("aeth") {
                assert!(a["syndrome"].is_u64() && a["msn"].is_u64());
                assert!(
                    ["ACK", "RNR_NAK", "NAK", "RESERVED"].contains(&a["type"].as_str().unwrap())
                );
            }
            if let Some(d) = v.get("deth") {
                assert!(d["qkey"].is_u64() && d["src_qp"].is_u64());
            }
            if let Some(a) = v.get("atomic_eth") {
                for k in ["va", "rkey", "swap_add", "compare"] {
                    assert!(a[k].is_u64(), "{l}");
                }
            }
            if let Some(a) = v.get("atomic_ack_eth") {
                assert!(a["orig"].is_u64());
            }
            let op = v["opcode_name"].as_str().unwrap();
            if op.contains("IMMEDIATE") {
                assert!(v["imm"].is_u64(), "{l}");
            }
            if op.starts_with("UD_") {
                assert!(v.get("deth").is_some(), "{l}");
            }
            count += 1;
        }
        assert_eq!(count, n, "{name}");
    }
    // These captures hold RETH (write/read), AETH (acks), DETH (UD, CM), ImmDt (hw),
    // AtomicETH and AtomicAckETH (atomic_bw); no IETH.
    for h in [
        "reth",
        "aeth",
        "deth",
        "imm",
        "atomic_eth",
        "atomic_ack_eth",
    ] {
        assert!(seen_headers.contains(h), "no {h} in any capture");
    }
}

#[test]
fn pcapng_decodes_like_its_pcap_source() {
    for (ng, pcap) in [
        ("pcapng/rdma_atomic_bw.pcapng", "public/rdma_atomic_bw.pcap"),
        ("pcapng/rc_send_ipv6.pcapng", "rxe-lab/rc_send_ipv6.pcap"),
    ] {
        for args in [&[][..], &["--json"][..]] {
            let a = decode(args, &capture(ng));
            let b = decode(args, &capture(pcap));
            assert_eq!(a.status.code(), Some(0), "{ng}: {}", text(&a.stderr));
            assert!(!a.stdout.is_empty());
            assert_eq!(text(&a.stdout), text(&b.stdout), "{ng}");
        }
    }
}

#[test]
fn flipped_payload_byte_is_icrc_bad() {
    let s = Scratch::new("flip");
    let mut b = std::fs::read(capture("rxe-lab/rc_send.pcap")).unwrap();
    // The first RC SEND First (opcode 0x00, no extension headers) over IPv4: Ethernet
    // 14 + IPv4 20 + UDP 8, so the BTH starts at 42 and the payload at 54.
    let (idx, r) = pcap_frames(&b)
        .into_iter()
        .enumerate()
        .find(|(_, r)| {
            let f = &b[r.clone()];
            f.len() > 60
                && f[12..14] == [8, 0]
                && f[36..38] == 4791u16.to_be_bytes()
                && f[42] == 0x00
        })
        .expect("a SEND First in rc_send.pcap");
    b[r.start + 54] ^= 0x20;
    let p = s.write("flipped.pcap", &b);
    let o = decode(&[], &p);
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    let frame = idx + 1;
    let out = text(&o.stdout);
    let bad: Vec<&str> = out.lines().filter(|l| l.contains("ICRC BAD")).collect();
    assert_eq!(bad.len(), 1, "{out}");
    assert!(bad[0].starts_with(&format!("{frame} ")), "{}", bad[0]);
    assert_eq!(
        out.lines().count(),
        64,
        "the other packets are still printed"
    );
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("frame {frame}: ICRC mismatch")),
        "{err}"
    );
    assert!(err.contains("1 ICRC bad"), "{err}");
    // JSON says the same.
    let o = decode(&["--json"], &p);
    assert_eq!(o.status.code(), Some(1));
    let v: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["status"] != "ok")
        .collect();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["status"], "bad_icrc");
    assert_eq!(v[0]["icrc_ok"], false);
    assert_eq!(v[0]["frame"], frame as u64);
}

#[test]
fn truncated_and_garbage_files_give_clear_errors() {
    let s = Scratch::new("trunc");
    let b = std::fs::read(capture("rxe-lab/rc_send.pcap")).unwrap();
    let frames = pcap_frames(&b);
    // Cut in the middle of the 20th frame's data.
    let cut = frames[19].start + 10;
    let o = decode(&[], &s.write("cut.pcap", &b[..cut]));
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("file truncated: pcap record data"), "{err}");
    // What came before the cut is still decoded.
    assert!(!o.stdout.is_empty());
    // Cut inside the file header, and inside a record header.
    for n in [3, 10, frames[5].start - 4] {
        let o = decode(&[], &s.write("cut2.pcap", &b[..n]));
        assert_no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "cut at {n}");
        assert!(text(&o.stderr).contains("truncated"), "{}", text(&o.stderr));
    }
    // Garbage: not a capture at all, an empty file, a pcapng header followed by noise.
    let mut noise = vec![0u8; 4096];
    let mut x = 0x1234_5678u32;
    for v in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *v = x as u8;
    }
    let o = decode(&[], &s.write("garbage.pcap", &noise));
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("not a pcap or pcapng file"));
    let o = decode(&[], &s.write("empty.pcap", &[]));
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    let mut ng = std::fs::read(capture("pcapng/rdma_atomic_bw.pcapng")).unwrap();
    let half = ng.len() / 2;
    let rest = ng.len() - half;
    ng[half..].copy_from_slice(&noise[..rest]);
    let o = decode(&[], &s.write("noisy.pcapng", &ng));
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("malformed") || text(&o.stderr).contains("truncated"));
    // A file that does not exist; a missing argument is a usage error (2).
    let o = decode(&[], &s.0.join("missing.pcap"));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("missing.pcap"));
    let o = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("decode")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn port_option_decodes_a_non_standard_port() {
    let s = Scratch::new("port");
    let mut b = std::fs::read(capture("rxe-lab/ud_send.pcap")).unwrap();
    let mut moved = 0;
    for r in pcap_frames(&b) {
        let f = &mut b[r];
        if f.len() < 42 || f[12..14] != [8, 0] || f[36..38] != 4791u16.to_be_bytes() {
            continue;
        }
        // The ICRC covers the UDP destination port: move it and re-seal the packet.
        f[36..38].copy_from_slice(&5000u16.to_be_bytes());
        let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
        let (ip, rest) = f[14..14 + total].split_at_mut(20);
        let (udp, roce) = rest.split_at_mut(8);
        let c = wire::icrc::compute_from_headers(ip, udp, roce).unwrap();
        let n = roce.len();
        roce[n - 4..].copy_from_slice(&c.to_le_bytes());
        moved += 1;
    }
    assert_eq!(moved, 16);
    let p = s.write("port5000.pcap", &b);
    let o = decode(&["--port", "5000"], &p);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(out.lines().count(), 16);
    assert!(
        out.lines()
            .all(|l| l.contains(":5000 UD_SEND_ONLY") && l.ends_with("ICRC ok")),
        "{out}"
    );
    // On the default port there is no RoCEv2 traffic left.
    let o = decode(&[], &p);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout.is_empty());
    assert!(text(&o.stderr).contains("0 RoCEv2 packets"));
    // A port that is not a number is a usage error.
    let o = decode(&["--port", "x"], &p);
    assert_eq!(o.status.code(), Some(2));
}

/// Every CM MAD of the rxe `rdma_cm` capture is named, with its key fields, in text and
/// JSON (the ladder REQ → REP → RTU … DREQ → DREP, and the IP CM header of the REQ).
#[test]
fn cm_mads_are_named_with_their_fields() {
    let f = capture("rxe-lab/rdma_cm.pcap");
    let o = decode(&[], &f);
    assert_eq!(o.status.code(), Some(0));
    let names: Vec<String> = text(&o.stdout)
        .lines()
        .filter_map(|l| l.split(" cm(").nth(1))
        .map(|c| c.split(' ').next().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        names,
        [
            "ConnectRequest",
            "ConnectReply",
            "ReadyToUse",
            "DisconnectRequest",
            "DisconnectReply"
        ]
    );
    let out = text(&o.stdout);
    assert!(
        out.contains("cm(ConnectRequest tid=0x28242b0cb comm=0xcbb04282 sid=0x0000000001061c06 qpn=0x000011 start_psn=7621068 rr=1 depth=1 ip=198.18.0.12:34694→198.18.0.11)"),
        "{out}"
    );
    let o = decode(&["--json"], &f);
    let reps: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["cm"]["msg"] == "ConnectReply")
        .collect();
    assert_eq!(reps.len(), 1);
    let c = &reps[0]["cm"];
    assert_eq!(c["attribute_id"], 0x13);
    assert_eq!(c["local_comm_id"], 0x28a6_3f57);
    assert_eq!(c["remote_comm_id"], 0xcbb0_4282_u32);
    assert_eq!(c["qpn"], 0x11);
    assert_eq!(c["psn"], 3_551_311);
}
