//! An external oracle: Wireshark's InfiniBand dissector (tshark) and `softnic decode
//! --json` must agree, packet by packet, on every capture in `tests/data/captures/`.
//!
//! Skipped, with a note on stderr, when `tshark` is not on PATH (CI installs it with
//! apt). tshark never validates the ICRC, so only the carried value is compared; the
//! ICRC verdict is the subject of `wire/tests/captures.rs`.
//!
//! tshark quirks this test works around (checked with Wireshark 4.0.17):
//! 1. UDP picks the dissector of the *lower* port first. `hw_send_imm.pcap` sends from
//!    UDP source port 69, so tshark decodes those RoCEv2 packets as TFTP and the
//!    `infiniband` filter misses 37 of them: `--disable-protocol tftp`.
//! 2. Heuristic payload dissectors grab SEND payloads: rping's 4- and 16-byte messages
//!    are taken for RPC-over-RDMA, fail as "Malformed Packet", and the exception also
//!    drops the Invariant CRC field. So the payload heuristics are disabled
//!    (`--disable-protocol` for each; unknown names are ignored by tshark).
//! 3. ImmDt is added to the tree twice, so `infiniband.immdt` has two occurrences;
//!    `-E occurrence=f` keeps the first. (This is also why the separator is `|`: with
//!    `,` an aggregated field would be indistinguishable from the next column.)
//! 4. For atomics (Compare&Swap, Fetch&Add) tshark reports the AtomicETH VA and R_Key
//!    under `infiniband.reth.va` / `infiniband.reth.r_key` (with no `dmalen`); only
//!    the operands have `infiniband.atomiceth.*` names.
//! 5. Formatting: QPNs, R_Keys, Q_Keys, VAs and the ICRC come as `0x…` hex; PSN, MSN,
//!    syndrome, DMA length and the atomic operands as decimal; ImmDt as bare hex bytes;
//!    booleans as `1`/`0` (older versions print `True`/`False`: both are accepted).
//! 6. Payload length: tshark has no field for it; `data.len` exists only when the payload
//!    went to the generic data dissector. CM MADs on QP1 are dissected as MADs
//!    instead (always 256 bytes, IBTA 13.4.2), so for QP1 without `data.len` the
//!    payload must be 256; otherwise no `data.len` means no payload.
//! 7. `data.len` counts the pad bytes too (tshark does not strip them), so it is
//!    compared with payload + pad.
//! 8. The ICRC is shown as its wire bytes read big-endian, which is how `softnic decode`
//!    reports `icrc` too.

mod prereq;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The fields asked of tshark, in column order.
const FIELDS: &[&str] = &[
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.syndrome.opcode",
    "infiniband.aeth.syndrome.credit_count",
    "infiniband.aeth.syndrome.timer",
    "infiniband.aeth.syndrome.error_code",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.invariant.crc",
    "data.len",
];

/// Dissectors that would take the UDP port or the InfiniBand payload away from the
/// fields compared here (quirks 1 and 2).
const DISABLE: &[&str] = &[
    "tftp",
    "rpcordma",
    "smb_direct",
    "nvme-rdma",
    "iser",
    "lnet",
    "smc",
    "infiniband_sdp",
    "fcoib",
];

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn captures() -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "pcap" || x == "pcapng") {
                out.push(p);
            }
        }
    }
    let mut v = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/captures"),
        &mut v,
    );
    v.sort();
    v
}

/// tshark's view: frame number → field name → value (empty fields left out).
fn tshark(file: &Path) -> BTreeMap<u64, BTreeMap<&'static str, String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file);
    for p in DISABLE {
        cmd.args(["--disable-protocol", p]);
    }
    cmd.args(["-Y", "infiniband", "-T", "fields"]);
    cmd.args(["-E", "separator=|", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("run tshark");
    assert!(o.status.success(), "tshark failed on {}", file.display());
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols.len(), FIELDS.len(), "{line}");
        let row: BTreeMap<&'static str, String> = FIELDS
            .iter()
            .zip(cols)
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (*k, v.to_owned()))
            .collect();
        let n = num(&row["frame.number"]);
        out.insert(n, row);
    }
    out
}

/// `softnic decode --json`'s view: frame number → JSON object.
fn softnic(file: &Path) -> BTreeMap<u64, Value> {
    let o = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .args(["decode", "--json"])
        .arg(file)
        .output()
        .expect("run softnic");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["frame"].as_u64().unwrap(), v)
        })
        .collect()
}

/// A tshark number: `0x…` hex, `True`/`False`, or decimal (quirk 5).
fn num(s: &str) -> u64 {
    match s {
        "True" => 1,
        "False" => 0,
        _ => match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => s.parse(),
        }
        .unwrap_or_else(|e| panic!("tshark value {s:?}: {e}")),
    }
}

/// A JSON field as a number (booleans as 0/1), or `None` when absent.
fn ours(v: &Value, path: &[&str]) -> Option<u64> {
    let mut x = v;
    for p in path {
        x = x.get(p)?;
    }
    x.as_u64().or_else(|| x.as_bool().map(u64::from))
}

/// The AETH NAK code that a NAK name stands for (IBTA 9.7.5.1 table 44).
fn nak_code(name: &str) -> u64 {
    match name {
        "PSN_SEQUENCE_ERROR" => 0,
        "INVALID_REQUEST" => 1,
        "REMOTE_ACCESS_ERROR" => 2,
        "REMOTE_OPERATIONAL_ERROR" => 3,
        "INVALID_RD_REQUEST" => 4,
        other => panic!("NAK {other}"),
    }
}

/// Compares one packet; returns the mismatches.
fn compare(t: &BTreeMap<&'static str, String>, s: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let mut eq = |what: &str, theirs: Option<u64>, mine: Option<u64>| {
        if theirs != mine {
            bad.push(format!("{what}: tshark {theirs:?}, softnic {mine:?}"));
        }
    };
    let tv = |k: &str| t.get(k).map(|v| num(v));
    eq("opcode", tv("infiniband.bth.opcode"), ours(s, &["opcode"]));
    eq("se", tv("infiniband.bth.se"), ours(s, &["solicited"]));
    eq("m", tv("infiniband.bth.m"), ours(s, &["mig_req"]));
    eq("pad", tv("infiniband.bth.padcnt"), ours(s, &["pad"]));
    eq("pkey", tv("infiniband.bth.p_key"), ours(s, &["pkey"]));
    eq(
        "dest_qp",
        tv("infiniband.bth.destqp"),
        ours(s, &["dest_qp"]),
    );
    eq("ack_req", tv("infiniband.bth.a"), ours(s, &["ack_req"]));
    eq("psn", tv("infiniband.bth.psn"), ours(s, &["psn"]));
    // Quirk 4: an AtomicETH's VA and R_Key appear as RETH fields.
    let va_rkey_from = if s.get("atomic_eth").is_some() {
        "atomic_eth"
    } else {
        "reth"
    };
    eq(
        "va",
        tv("infiniband.reth.va"),
        ours(s, &[va_rkey_from, "va"]),
    );
    eq(
        "rkey",
        tv("infiniband.reth.r_key"),
        ours(s, &[va_rkey_from, "rkey"]),
    );
    eq(
        "dma_len",
        tv("infiniband.reth.dmalen"),
        ours(s, &["reth", "dma_len"]),
    );
    eq(
        "syndrome",
        tv("infiniband.aeth.syndrome"),
        ours(s, &["aeth", "syndrome"]),
    );
    eq("msn", tv("infiniband.aeth.msn"), ours(s, &["aeth", "msn"]));
    if let Some(a) = s.get("aeth") {
        // The decoded syndrome: tshark's 2-bit "opcode" (0 ACK, 1 RNR NAK, 3 NAK).
        let kind = match a["type"].as_str().unwrap_or("") {
            "ACK" => Some(0),
            "RNR_NAK" => Some(1),
            "NAK" => Some(3),
            _ => Some(2),
        };
        eq("aeth type", tv("infiniband.aeth.syndrome.opcode"), kind);
        eq(
            "credits",
            tv("infiniband.aeth.syndrome.credit_count"),
            ours(a, &["credits"]),
        );
        eq(
            "rnr timer",
            tv("infiniband.aeth.syndrome.timer"),
            ours(a, &["rnr_timer"]),
        );
        eq(
            "nak code",
            tv("infiniband.aeth.syndrome.error_code"),
            a["nak"].as_str().map(nak_code),
        );
    }
    eq(
        "qkey",
        tv("infiniband.deth.q_key"),
        ours(s, &["deth", "qkey"]),
    );
    eq(
        "src_qp",
        tv("infiniband.deth.srcqp"),
        ours(s, &["deth", "src_qp"]),
    );
    eq(
        "swap_add",
        tv("infiniband.atomiceth.swapdt"),
        ours(s, &["atomic_eth", "swap_add"]),
    );
    eq(
        "compare",
        tv("infiniband.atomiceth.cmpdt"),
        ours(s, &["atomic_eth", "compare"]),
    );
    eq(
        "orig",
        tv("infiniband.atomicacketh.origremdt"),
        ours(s, &["atomic_ack_eth", "orig"]),
    );
    // Quirk 5: ImmDt as bare hex bytes.
    eq(
        "imm",
        t.get("infiniband.immdt")
            .map(|h| u64::from_str_radix(h, 16).expect("immdt hex")),
        ours(s, &["imm"]),
    );
    // Quirk 8, and quirk 2 made sure the field is there.
    eq("icrc", tv("infiniband.invariant.crc"), ours(s, &["icrc"]));
    // Quirks 6 and 7.
    let pad = ours(s, &["pad"]).unwrap_or(0);
    let want_payload = match tv("data.len") {
        Some(n) => n.checked_sub(pad),
        None if ours(s, &["dest_qp"]) == Some(1) => Some(256),
        None => Some(0),
    };
    eq("payload_len", want_payload, ours(s, &["payload_len"]));
    bad
}

#[test]
fn tshark_and_softnic_agree_packet_by_packet() {
    if !tshark_available() {
        prereq::missing("tshark (the oracle this test compares against)");
        return;
    }
    let mut total = 0;
    let mut problems = Vec::new();
    for file in captures() {
        let name = file.display().to_string();
        let t = tshark(&file);
        let s = softnic(&file);
        let tk: Vec<u64> = t.keys().copied().collect();
        let sk: Vec<u64> = s.keys().copied().collect();
        assert_eq!(tk, sk, "{name}: frame numbers (tshark vs softnic)");
        assert!(!tk.is_empty(), "{name}: no RoCEv2 packets");
        for (n, row) in &t {
            for p in compare(row, &s[n]) {
                problems.push(format!("{name} frame {n}: {p}"));
            }
        }
        total += t.len();
    }
    assert!(
        problems.is_empty(),
        "{} mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // 1,007 packets in the pcap files plus the 42 of the two pcapng copies.
    assert_eq!(total, 1007 + 10 + 32);
}
