//! What `softnic decode` reports about one RoCEv2 packet: a plain struct built once per
//! packet and rendered as a text line or a JSON object by [`super::format`].
//!
//! Field names are the JSON field names and are stable (documented in docs/decode.md).
//! All numbers are JSON numbers; 64-bit fields (virtual addresses, atomic operands) can
//! exceed 2^53, so a JSON reader must keep them as 64-bit integers (Python, Rust and
//! jq ≥ 1.7 do).

use std::net::SocketAddr;

use serde::Serialize;
use wire::frame::RoceFrame;
use wire::{NakCode, PacketRepr, Syndrome};

/// Overall verdict on a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Parsed, and the ICRC verified.
    Ok,
    /// Parsed, but the ICRC does not match.
    BadIcrc,
    /// The packet (or its outer headers) could not be parsed.
    ParseError,
}

/// RDMA Extended Transport Header (IBTA 9.3.3).
#[derive(Debug, Clone, Serialize)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub dma_len: u32,
}

/// ACK Extended Transport Header (IBTA 9.3.5), syndrome decoded (IBTA 9.7.5.1).
#[derive(Debug, Clone, Serialize)]
pub struct Aeth {
    /// The raw syndrome byte.
    pub syndrome: u8,
    /// `ACK`, `RNR_NAK`, `NAK` or `RESERVED`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// ACK: the end-to-end credit count (31 = not limited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits: Option<u8>,
    /// RNR NAK: the 5-bit timer code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rnr_timer: Option<u8>,
    /// RNR NAK: the timer's minimum delay in microseconds (IBTA table 45).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rnr_timer_us: Option<u32>,
    /// NAK: the code's name, e.g. `PSN_SEQUENCE_ERROR`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nak: Option<&'static str>,
    /// Message sequence number.
    pub msn: u32,
}

/// Datagram Extended Transport Header (IBTA 9.3.2).
#[derive(Debug, Clone, Serialize)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number.
    pub src_qp: u32,
}

/// Atomic Extended Transport Header (IBTA 9.3.4).
#[derive(Debug, Clone, Serialize)]
pub struct AtomicEth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (compare & swap) or addend (fetch & add).
    pub swap_add: u64,
    /// Compare value (compare & swap only; 0 otherwise).
    pub compare: u64,
}

/// Atomic ACK Extended Transport Header (IBTA 9.3.6).
#[derive(Debug, Clone, Serialize)]
pub struct AtomicAckEth {
    /// The original remote data.
    pub orig: u64,
}

/// Invalidate Extended Transport Header (IBTA 9.3.7).
#[derive(Debug, Clone, Serialize)]
pub struct Ieth {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

/// Flush Extended Transport Header (IBTA 1.5 memory placement extensions).
#[derive(Debug, Clone, Serialize)]
pub struct Feth {
    /// Selectivity level.
    pub selectivity: u8,
    /// Placement type.
    pub placement: u8,
}

/// XRC Extended Transport Header (IBTA 9.3): the SRQ at the target that an XRC request
/// is for.
#[derive(Debug, Clone, Serialize)]
pub struct XrcEth {
    /// The XRC SRQ number (24 bits).
    pub srqn: u32,
}

/// The headers of a packet that parsed.
#[derive(Debug, Clone, Serialize)]
pub struct Headers {
    /// BTH opcode value.
    pub opcode: u8,
    /// Opcode name with transport prefix, e.g. `RC_SEND_ONLY`.
    pub opcode_name: String,
    /// Solicited event bit.
    pub solicited: bool,
    /// Migration request bit.
    pub mig_req: bool,
    /// Pad count.
    pub pad: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN bit.
    pub fecn: bool,
    /// Backward ECN bit.
    pub becn: bool,
    /// Destination QP number.
    pub dest_qp: u32,
    /// Acknowledge-request bit.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: u32,
    /// XRCETH, when present (every XRC request; it comes first after the BTH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xrceth: Option<XrcEth>,
    /// RETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<Reth>,
    /// AETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<Aeth>,
    /// DETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<Deth>,
    /// Immediate data, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imm: Option<u32>,
    /// IETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<Ieth>,
    /// AtomicETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_eth: Option<AtomicEth>,
    /// AtomicAckETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// FETH, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feth: Option<Feth>,
    /// Payload bytes, without pad and ICRC.
    pub payload_len: usize,
    /// The CM MAD of a UD packet to QP1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cm: Option<super::cm::Cm>,
}

/// Everything reported about one RoCEv2 packet.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// 1-based frame number in the file (tshark's `frame.number`).
    pub frame: u64,
    /// Source address and UDP port (empty when they could not be read).
    pub src: String,
    /// Destination address and UDP port (empty when they could not be read).
    pub dst: String,
    /// Outermost VLAN ID, if tagged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// IPv4 Identification (absent for IPv6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4_id: Option<u16>,
    /// Overall verdict.
    pub status: Status,
    /// Why the packet is not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The headers, when they parsed.
    #[serde(flatten)]
    pub headers: Option<Headers>,
    /// The ICRC carried by the packet, as Wireshark shows it (wire bytes read
    /// big-endian), when the packet was long enough to carry one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc: Option<u32>,
    /// Whether the ICRC verified against the frame's own IP and UDP headers.
    pub icrc_ok: bool,
}

fn nak_name(c: NakCode) -> &'static str {
    match c {
        NakCode::PsnSequenceError => "PSN_SEQUENCE_ERROR",
        NakCode::InvalidRequest => "INVALID_REQUEST",
        NakCode::RemoteAccessError => "REMOTE_ACCESS_ERROR",
        NakCode::RemoteOperationalError => "REMOTE_OPERATIONAL_ERROR",
        NakCode::InvalidRdRequest => "INVALID_RD_REQUEST",
        NakCode::Reserved(_) => "RESERVED",
    }
}

fn aeth(a: &wire::AethRepr) -> Aeth {
    let mut out = Aeth {
        syndrome: a.syndrome.to_u8(),
        kind: "RESERVED",
        credits: None,
        rnr_timer: None,
        rnr_timer_us: None,
        nak: None,
        msn: a.msn.value(),
    };
    match a.syndrome {
        Syndrome::Ack { credits } => {
            out.kind = "ACK";
            out.credits = Some(credits);
        }
        Syndrome::RnrNak { timer } => {
            out.kind = "RNR_NAK";
            out.rnr_timer = Some(timer);
            out.rnr_timer_us = Some(wire::aeth::rnr_timer_us(timer));
        }
        Syndrome::Nak(c) => {
            out.kind = "NAK";
            out.nak = Some(nak_name(c));
        }
        Syndrome::Reserved(_) => {}
    }
    out
}

fn headers(r: &PacketRepr, payload: &[u8]) -> Headers {
    let b = &r.bth;
    Headers {
        opcode: b.opcode.0,
        opcode_name: b.opcode.to_string(),
        solicited: b.solicited,
        mig_req: b.mig_req,
        pad: b.pad_count,
        pkey: b.pkey,
        fecn: b.fecn,
        becn: b.becn,
        dest_qp: b.dest_qpn.value(),
        ack_req: b.ack_req,
        psn: b.psn.value(),
        xrceth: r.xrceth.map(|x| XrcEth { srqn: x.srqn }),
        reth: r.reth.map(|x| Reth {
            va: x.va,
            rkey: x.rkey,
            dma_len: x.dma_len,
        }),
        aeth: r.aeth.as_ref().map(aeth),
        deth: r.deth.map(|x| Deth {
            qkey: x.qkey,
            src_qp: x.src_qpn.value(),
        }),
        imm: r.immdt.map(|x| x.imm),
        ieth: r.ieth.map(|x| Ieth { rkey: x.rkey }),
        atomic_eth: r.atomic_eth.map(|x| AtomicEth {
            va: x.va,
            rkey: x.rkey,
            swap_add: x.swap_add,
            compare: x.compare,
        }),
        atomic_ack_eth: r.atomic_ack_eth.map(|x| AtomicAckEth { orig: x.orig }),
        feth: r.feth.map(|x| Feth {
            selectivity: x.selectivity,
            placement: x.placement,
        }),
        payload_len: r.payload_len,
        cm: super::cm::cm(r, payload),
    }
}

/// The ICRC bytes at the end of `roce`, read big-endian as Wireshark displays them.
fn carried_icrc(roce: &[u8]) -> Option<u32> {
    let tail = roce.get(roce.len().checked_sub(wire::ICRC_LEN)?..)?;
    Some(u32::from_be_bytes(tail.try_into().ok()?))
}

impl Record {
    /// Decodes the RoCEv2 packet of frame `number` and verifies its ICRC.
    pub fn from_frame(number: u64, f: &RoceFrame<'_>) -> Record {
        let parsed = PacketRepr::parse(f.roce);
        // The ICRC is checked even when the headers do not parse: a corrupted opcode
        // shows up as both errors.
        let icrc = f.verify_icrc();
        let ipv4_id = f.src.is_ipv4().then_some(f.ipv4_id);
        let (status, error) = match (&parsed, &icrc) {
            (Err(e), _) => (Status::ParseError, Some(e.to_string())),
            (Ok(_), Err(e)) => (Status::BadIcrc, Some(e.to_string())),
            (Ok(_), Ok(())) => (Status::Ok, None),
        };
        Record {
            frame: number,
            src: SocketAddr::new(f.src, f.src_port).to_string(),
            dst: SocketAddr::new(f.dst, f.dst_port).to_string(),
            vlan: f.vlan,
            ipv4_id,
            status,
            error,
            headers: parsed.ok().map(|p| headers(&p.repr, p.payload)),
            icrc: (f.roce.len() >= wire::bth::HEADER_LEN + wire::ICRC_LEN)
                .then(|| carried_icrc(f.roce))
                .flatten(),
            icrc_ok: icrc.is_ok(),
        }
    }

    /// A record for a frame addressed to the RoCEv2 port whose outer headers are broken.
    /// `ends` are its addresses, when they could be read.
    pub fn broken(number: u64, e: &wire::Error, ends: Option<(SocketAddr, SocketAddr)>) -> Record {
        let (src, dst) = match ends {
            Some((s, d)) => (s.to_string(), d.to_string()),
            None => (String::new(), String::new()),
        };
        Record {
            frame: number,
            src,
            dst,
            vlan: None,
            ipv4_id: None,
            status: Status::ParseError,
            error: Some(e.to_string()),
            headers: None,
            icrc: None,
            icrc_ok: false,
        }
    }
}
