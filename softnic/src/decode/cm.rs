//! The CM MAD inside a packet to QP1 (IBTA ch. 12): its name and the fields a reader of
//! a connection ladder looks for — communication IDs, service ID, QPN, PSN, resources,
//! the REJ reason, and the IP CM header's addresses (IBTA Annex A11).

use serde::Serialize;
use wire::cm::{attribute_name, CmMadRepr, CmMessage, CmaHeader, Mad};
use wire::{PacketRepr, Qpn};

/// What `softnic decode` reports about a CM MAD (JSON field `cm`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cm {
    /// The message's name ("ConnectRequest", "ReadyToUse", …; "unknown").
    pub msg: &'static str,
    /// MAD attribute ID.
    pub attribute_id: u16,
    /// MAD transaction ID.
    pub tid: u64,
    /// The sender's communication ID (REQ/REP/RTU/REJ/MRA/DREQ/DREP) or SIDR request ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_comm_id: Option<u32>,
    /// The receiver's communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_comm_id: Option<u32>,
    /// Service ID (REQ, SIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u64>,
    /// QP number: the sender's (REQ, REP, SIDR REP) or the receiver's (DREQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    /// Starting PSN (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psn: Option<u32>,
    /// Responder resources (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responder_resources: Option<u8>,
    /// Initiator depth (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initiator_depth: Option<u8>,
    /// REJ reason (or SIDR REP status).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<u16>,
    /// The REJ reason's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_name: Option<&'static str>,
    /// The IP CM header of a REQ/SIDR REQ: `source address:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_src: Option<String>,
    /// The IP CM header's destination address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_dst: Option<String>,
    /// Why the MAD did not parse as a CM message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The CM MAD of a packet, if it is a UD SEND to QP1 with a payload; `None` otherwise.
pub fn cm(repr: &PacketRepr, payload: &[u8]) -> Option<Cm> {
    if repr.bth.dest_qpn != Qpn::GSI || repr.deth.is_none() || payload.is_empty() {
        return None;
    }
    let raw = Mad::new_unchecked(payload);
    let mut out = Cm {
        msg: attribute_name(raw.attribute_id()),
        attribute_id: raw.attribute_id(),
        tid: raw.transaction_id(),
        ..Cm::default()
    };
    let mad = match CmMadRepr::parse(payload) {
        Ok(m) => m,
        Err(e) => {
            out.error = Some(e.to_string());
            return Some(out);
        }
    };
    fill(&mut out, &mad.msg);
    Some(out)
}

fn ids(out: &mut Cm, local: u32, remote: u32) {
    out.local_comm_id = Some(local);
    out.remote_comm_id = Some(remote);
}

fn ip(out: &mut Cm, private_data: &[u8]) {
    if let Some(h) = CmaHeader::parse(private_data) {
        out.ip_src = Some(std::net::SocketAddr::new(h.src, h.src_port).to_string());
        out.ip_dst = Some(h.dst.to_string());
    }
}

fn fill(out: &mut Cm, msg: &CmMessage) {
    match msg {
        CmMessage::Req(m) => {
            out.local_comm_id = Some(m.local_comm_id);
            out.service_id = Some(m.service_id);
            out.qpn = Some(m.local_qpn);
            out.psn = Some(m.starting_psn);
            out.responder_resources = Some(m.responder_resources);
            out.initiator_depth = Some(m.initiator_depth);
            ip(out, &m.private_data);
        }
        CmMessage::Rep(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            out.qpn = Some(m.local_qpn);
            out.psn = Some(m.starting_psn);
            out.responder_resources = Some(m.responder_resources);
            out.initiator_depth = Some(m.initiator_depth);
        }
        CmMessage::Rej(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            out.reason = Some(m.reason.0);
            out.reason_name = Some(m.reason.name());
        }
        CmMessage::Mra(m) => ids(out, m.local_comm_id, m.remote_comm_id),
        CmMessage::Rtu(m) => ids(out, m.local_comm_id, m.remote_comm_id),
        CmMessage::Drep(m) => ids(out, m.local_comm_id, m.remote_comm_id),
        CmMessage::Dreq(m) => {
            ids(out, m.local_comm_id, m.remote_comm_id);
            out.qpn = Some(m.remote_qpn);
        }
        CmMessage::SidrReq(m) => {
            out.local_comm_id = Some(m.request_id);
            out.service_id = Some(m.service_id);
            ip(out, &m.private_data);
        }
        CmMessage::SidrRep(m) => {
            out.local_comm_id = Some(m.request_id);
            out.service_id = Some(m.service_id);
            out.qpn = Some(m.qpn);
            out.reason = Some(u16::from(m.status.0));
        }
    }
}

/// The text group for a CM MAD: `cm(ConnectRequest tid=… comm=… sid=… …)`.
pub fn text(c: &Cm) -> String {
    use std::fmt::Write as _;
    let mut s = format!("cm({} tid={:#x}", c.msg, c.tid);
    if let Some(v) = c.local_comm_id {
        let _ = write!(s, " comm={v:#010x}");
    }
    if let Some(v) = c.remote_comm_id {
        let _ = write!(s, " remote_comm={v:#010x}");
    }
    if let Some(v) = c.service_id {
        let _ = write!(s, " sid={v:#018x}");
    }
    if let Some(v) = c.qpn {
        let _ = write!(s, " qpn={v:#08x}");
    }
    if let Some(v) = c.psn {
        let _ = write!(s, " start_psn={v}");
    }
    if let (Some(r), Some(i)) = (c.responder_resources, c.initiator_depth) {
        let _ = write!(s, " rr={r} depth={i}");
    }
    if let Some(v) = c.reason {
        let _ = write!(s, " reason={v}");
        if let Some(n) = c.reason_name {
            let _ = write!(s, " ({n})");
        }
    }
    if let (Some(src), Some(dst)) = (&c.ip_src, &c.ip_dst) {
        let _ = write!(s, " ip={src}→{dst}");
    }
    if let Some(e) = &c.error {
        let _ = write!(s, " error: {e}");
    }
    s.push(')');
    s
}
