//! Rendering a [`Record`] as one text line or one JSON object (JSON Lines).
//!
//! The text line is for people: frame number, `src → dst`, opcode name, the BTH fields
//! a reader of a trace looks for, one `name(...)` group per extension header, payload
//! length and the ICRC verdict. Numbers that are keys or addresses are hex; counts and
//! sequence numbers are decimal, as in Wireshark's summary line.

use std::fmt::Write as _;

use super::record::{Record, Status};

/// The text line for a record (no trailing newline).
pub fn text_line(r: &Record) -> String {
    let mut s = String::with_capacity(160);
    let addr = |a: &str| {
        if a.is_empty() {
            "?".to_owned()
        } else {
            a.to_owned()
        }
    };
    let _ = write!(s, "{} {} → {}", r.frame, addr(&r.src), addr(&r.dst));
    if let Some(v) = r.vlan {
        let _ = write!(s, " vlan={v}");
    }
    if let Some(h) = &r.headers {
        let _ = write!(
            s,
            " {} qp={:#08x} psn={} ack_req={}",
            h.opcode_name,
            h.dest_qp,
            h.psn,
            u8::from(h.ack_req)
        );
        for (set, name) in [
            (h.solicited, "se"),
            (h.mig_req, "m"),
            (h.fecn, "fecn"),
            (h.becn, "becn"),
        ] {
            if set {
                let _ = write!(s, " {name}");
            }
        }
        // Wire order: the XRCETH is the first header after the BTH.
        if let Some(x) = &h.xrceth {
            let _ = write!(s, " xrceth(srqn={:#08x})", x.srqn);
        }
        if let Some(x) = &h.reth {
            let _ = write!(
                s,
                " reth(va={:#x} rkey={:#x} len={})",
                x.va, x.rkey, x.dma_len
            );
        }
        if let Some(x) = &h.aeth {
            let _ = write!(s, " aeth({}", x.kind);
            if let Some(c) = x.credits {
                let _ = write!(s, " credits={c}");
            }
            if let (Some(t), Some(us)) = (x.rnr_timer, x.rnr_timer_us) {
                let _ = write!(s, " timer={t} ({us} us)");
            }
            if let Some(n) = x.nak {
                let _ = write!(s, " {n}");
            }
            if x.kind == "RESERVED" {
                let _ = write!(s, " {:#04x}", x.syndrome);
            }
            let _ = write!(s, " msn={})", x.msn);
        }
        if let Some(x) = &h.deth {
            let _ = write!(s, " deth(qkey={:#x} src_qp={:#08x})", x.qkey, x.src_qp);
        }
        if let Some(x) = &h.atomic_eth {
            let _ = write!(
                s,
                " atomic(va={:#x} rkey={:#x} swap_add={:#x} compare={:#x})",
                x.va, x.rkey, x.swap_add, x.compare
            );
        }
        if let Some(x) = &h.atomic_ack_eth {
            let _ = write!(s, " atomic_ack(orig={:#x})", x.orig);
        }
        if let Some(x) = h.imm {
            let _ = write!(s, " imm={x:#010x}");
        }
        if let Some(x) = &h.ieth {
            let _ = write!(s, " ieth(rkey={:#x})", x.rkey);
        }
        if let Some(x) = &h.feth {
            let _ = write!(
                s,
                " feth(selectivity={} placement={})",
                x.selectivity, x.placement
            );
        }
        let _ = write!(s, " len={}", h.payload_len);
        if let Some(c) = &h.cm {
            let _ = write!(s, " {}", super::cm::text(c));
        }
    }
    match r.status {
        Status::Ok => s.push_str(" ICRC ok"),
        Status::BadIcrc => s.push_str(" ICRC BAD"),
        Status::ParseError => {
            if r.icrc_ok {
                s.push_str(" ICRC ok");
            } else if r.icrc.is_some() {
                s.push_str(" ICRC BAD");
            }
            s.push_str(" PARSE ERROR");
        }
    }
    if let Some(e) = &r.error {
        let _ = write!(s, " ({e})");
    }
    s
}

/// The JSON object for a record, on one line.
pub fn json_line(r: &Record) -> String {
    // Serializing plain structs of numbers, strings and options cannot fail.
    serde_json::to_string(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
