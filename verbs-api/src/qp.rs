//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send`, `ibv_post_recv`).
//!
//! A QP's send and receive queues are two rings in one client-created memfd (layout
//! [`crate::abi::QpLayout`]). Posting validates each work request, writes its slot,
//! publishes the ring, rings the QP's doorbell ([`crate::abi::doorbell`]: the NIC reads
//! only rings that were rung), and — only if the NIC has set NEED_WAKEUP because it is
//! about to sleep — writes the context's wake pipe. The usual post makes no syscall.
//!
//! Ownership: a `QueuePair` is the single producer of both rings, so `post_send` and
//! `post_recv` take `&mut self` (no lock on the data path). Move it to the thread that
//! posts (`QueuePair: Send`). State changes go through the NIC, which enforces the
//! state machine (IBTA 10.3.1); the client checks the same table first so a mistake
//! is reported with the missing attribute's name.

use std::fmt;
use std::os::fd::AsFd;
use std::sync::Arc;

use crate::abi::control::{self, Reply, Request};
use crate::abi::{Producer, QpLayout, RecvWqe, SendWqe, MAX_INLINE, MAX_SGE};
use crate::cq::{CompletionQueue, CqShared};
use crate::device::Context;
use crate::error::{io, Error, PostError, Result};
use crate::gid::{Gid, ROCE_V2_PORT};
use crate::mr::AccessFlags;
use crate::os;
use crate::pd::{PdShared, ProtectionDomain};
use crate::srq::{SharedReceiveQueue, SrqShared};
use crate::wr::{build_recv_wqe, build_send_wqe, QpLimits, RecvWr, SendWr};
use crate::xrc::{Xrcd, XrcdShared};

pub use crate::abi::control::{QpState, QpType};

/// Q_Key used by [`QueuePair::to_init`] for UD QPs (the value of `ibv_ud_pingpong`).
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// From a byte count (what `ibv_rc_pingpong -m` takes); only the five IB MTUs.
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Some(match b {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// Requested queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// SGEs per send work request (≤ 4).
    pub max_send_sge: u32,
    /// SGEs per receive work request (≤ 4).
    pub max_recv_sge: u32,
    /// Inline bytes per send (≤ 256).
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Service type.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a CompletionQueue,
    /// CQ for receive completions (may be the same CQ).
    pub recv_cq: &'a CompletionQueue,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send work request is signaled, whatever its flags.
    pub sq_sig_all: bool,
}

/// Address vector (`struct ibv_ah_attr` with its GRH, as RoCE needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID: the peer NIC's address.
    pub dgid: Gid,
    /// Source GID index: must be [`crate::gid::ADDRESS_GID_INDEX`] (1, the default).
    pub sgid_index: u8,
    /// IP TTL / hop limit (informational).
    pub hop_limit: u8,
    /// IP TOS / IPv6 traffic class (DSCP and ECN) of every packet the QP sends.
    pub traffic_class: u8,
    /// Peer NIC's UDP port; 0 = 4791 (softnic extension for several NICs on one
    /// address).
    pub udp_port: u16,
}

/// An all-zero address from the NIC's address GID ([`crate::gid::ADDRESS_GID_INDEX`]).
impl Default for AhAttr {
    fn default() -> AhAttr {
        AhAttr {
            dgid: Gid::default(),
            sgid_index: crate::gid::ADDRESS_GID_INDEX as u8,
            hop_limit: 0,
            traffic_class: 0,
            udp_port: 0,
        }
    }
}

/// `struct ibv_qp_attr` with its mask folded in: `None` = not in the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// IBV_QP_STATE: the state to move to.
    pub qp_state: Option<QpState>,
    /// IBV_QP_PATH_MTU.
    pub path_mtu: Option<Mtu>,
    /// IBV_QP_DEST_QPN.
    pub dest_qp_num: Option<u32>,
    /// IBV_QP_RQ_PSN: first PSN expected from the peer.
    pub rq_psn: Option<u32>,
    /// IBV_QP_SQ_PSN: first PSN this QP sends.
    pub sq_psn: Option<u32>,
    /// IBV_QP_AV: the peer's address.
    pub ah_attr: Option<AhAttr>,
    /// IBV_QP_TIMEOUT: local ACK timeout, 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: Option<u8>,
    /// IBV_QP_RETRY_CNT (0..=7).
    pub retry_cnt: Option<u8>,
    /// IBV_QP_RNR_RETRY (0..=7, 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// IBV_QP_MIN_RNR_TIMER (0..=31, IBTA table 45 encoding).
    pub min_rnr_timer: Option<u8>,
    /// IBV_QP_MAX_QP_RD_ATOMIC: outstanding READ/atomics this QP initiates.
    pub max_rd_atomic: Option<u8>,
    /// IBV_QP_MAX_DEST_RD_ATOMIC: outstanding READ/atomics this QP serves.
    pub max_dest_rd_atomic: Option<u8>,
    /// IBV_QP_ACCESS_FLAGS: remote operations the peer may perform (RC/UC).
    pub qp_access_flags: Option<AccessFlags>,
    /// IBV_QP_QKEY (UD).
    pub qkey: Option<u32>,
    /// IBV_QP_PKEY_INDEX (softnic has one P_Key, index 0).
    pub pkey_index: Option<u16>,
    /// IBV_QP_PORT (softnic has port 1).
    pub port_num: Option<u8>,
}

/// What the other side tells us out of band (`struct pingpong_dest`), plus the UDP
/// port of its NIC (not in the pingpong wire format; 0 = 4791).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpEndpoint {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// GID of the QP's NIC.
    pub gid: Gid,
    /// UDP port of the QP's NIC (0 = 4791).
    pub udp_port: u16,
}

/// An attribute of the modify mask, named as in `enum ibv_qp_attr_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrId {
    /// IBV_QP_STATE.
    State,
    /// IBV_QP_PKEY_INDEX.
    PkeyIndex,
    /// IBV_QP_PORT.
    Port,
    /// IBV_QP_ACCESS_FLAGS.
    AccessFlags,
    /// IBV_QP_QKEY.
    Qkey,
    /// IBV_QP_AV.
    Av,
    /// IBV_QP_PATH_MTU.
    PathMtu,
    /// IBV_QP_DEST_QPN.
    DestQpn,
    /// IBV_QP_RQ_PSN.
    RqPsn,
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    MaxDestRdAtomic,
    /// IBV_QP_MIN_RNR_TIMER.
    MinRnrTimer,
    /// IBV_QP_SQ_PSN.
    SqPsn,
    /// IBV_QP_TIMEOUT.
    Timeout,
    /// IBV_QP_RETRY_CNT.
    RetryCnt,
    /// IBV_QP_RNR_RETRY.
    RnrRetry,
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    MaxQpRdAtomic,
}

impl fmt::Display for AttrId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            AttrId::State => "IBV_QP_STATE",
            AttrId::PkeyIndex => "IBV_QP_PKEY_INDEX",
            AttrId::Port => "IBV_QP_PORT",
            AttrId::AccessFlags => "IBV_QP_ACCESS_FLAGS",
            AttrId::Qkey => "IBV_QP_QKEY",
            AttrId::Av => "IBV_QP_AV",
            AttrId::PathMtu => "IBV_QP_PATH_MTU",
            AttrId::DestQpn => "IBV_QP_DEST_QPN",
            AttrId::RqPsn => "IBV_QP_RQ_PSN",
            AttrId::MaxDestRdAtomic => "IBV_QP_MAX_DEST_RD_ATOMIC",
            AttrId::MinRnrTimer => "IBV_QP_MIN_RNR_TIMER",
            AttrId::SqPsn => "IBV_QP_SQ_PSN",
            AttrId::Timeout => "IBV_QP_TIMEOUT",
            AttrId::RetryCnt => "IBV_QP_RETRY_CNT",
            AttrId::RnrRetry => "IBV_QP_RNR_RETRY",
            AttrId::MaxQpRdAtomic => "IBV_QP_MAX_QP_RD_ATOMIC",
        };
        f.write_str(s)
    }
}

impl QpAttr {
    fn has(&self, a: AttrId) -> bool {
        match a {
            AttrId::State => self.qp_state.is_some(),
            AttrId::PkeyIndex => self.pkey_index.is_some(),
            AttrId::Port => self.port_num.is_some(),
            AttrId::AccessFlags => self.qp_access_flags.is_some(),
            AttrId::Qkey => self.qkey.is_some(),
            AttrId::Av => self.ah_attr.is_some(),
            AttrId::PathMtu => self.path_mtu.is_some(),
            AttrId::DestQpn => self.dest_qp_num.is_some(),
            AttrId::RqPsn => self.rq_psn.is_some(),
            AttrId::MaxDestRdAtomic => self.max_dest_rd_atomic.is_some(),
            AttrId::MinRnrTimer => self.min_rnr_timer.is_some(),
            AttrId::SqPsn => self.sq_psn.is_some(),
            AttrId::Timeout => self.timeout.is_some(),
            AttrId::RetryCnt => self.retry_cnt.is_some(),
            AttrId::RnrRetry => self.rnr_retry.is_some(),
            AttrId::MaxQpRdAtomic => self.max_rd_atomic.is_some(),
        }
    }

    /// The control-message form (GID → UDP endpoint of the peer NIC).
    pub fn to_control(&self) -> control::QpAttr {
        control::QpAttr {
            state: self.qp_state,
            path_mtu: self.path_mtu.map(Mtu::bytes),
            dest_qpn: self.dest_qp_num,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            remote: self.ah_attr.map(|ah| {
                let port = if ah.udp_port == 0 {
                    ROCE_V2_PORT
                } else {
                    ah.udp_port
                };
                ah.dgid.to_socket_addr(port)
            }),
            traffic_class: self.ah_attr.map_or(0, |ah| ah.traffic_class),
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            access: self.qp_access_flags.map(AccessFlags::bits),
            qkey: self.qkey,
            pkey_index: self.pkey_index,
            port_num: self.port_num,
        }
    }

    /// The inverse of [`QpAttr::to_control`], for attributes the NIC gives (the
    /// connection's, from `rdma_init_qp_attr`): the peer NIC's UDP endpoint becomes an
    /// address vector with its GID and port, and the IP default TTL as hop limit, as
    /// Linux's RoCE route has it.
    pub fn from_control(c: &control::QpAttr) -> QpAttr {
        QpAttr {
            qp_state: c.state,
            path_mtu: c.path_mtu.and_then(Mtu::from_bytes),
            dest_qp_num: c.dest_qpn,
            rq_psn: c.rq_psn,
            sq_psn: c.sq_psn,
            ah_attr: c.remote.map(|r| AhAttr {
                dgid: Gid::from_ip(r.ip()),
                hop_limit: 64,
                traffic_class: c.traffic_class,
                udp_port: r.port(),
                ..AhAttr::default()
            }),
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            min_rnr_timer: c.min_rnr_timer,
            max_rd_atomic: c.max_rd_atomic,
            max_dest_rd_atomic: c.max_dest_rd_atomic,
            qp_access_flags: c.access.map(AccessFlags),
            qkey: c.qkey,
            pkey_index: c.pkey_index,
            port_num: c.port_num,
        }
    }
}

/// True when `from → to` is a transition of the QP state diagram (IBTA 10.3.1, figure
/// 124; `ibv_modify_qp(3)`). Reset and Err are reachable from every state.
pub fn transition_allowed(from: QpState, to: QpState) -> bool {
    use QpState::*;
    matches!(
        (from, to),
        (_, Reset)
            | (_, Err)
            | (Reset, Init)
            | (Init, Init)
            | (Init, Rtr)
            | (Rtr, Rts)
            | (Rts, Rts)
            | (Rts, Sqd)
            | (Sqd, Sqd)
            | (Sqd, Rts)
            | (Sqe, Rts)
    )
}

/// The attributes `ibv_modify_qp(3)` requires for `from → to` on `qp_type` (besides
/// IBV_QP_STATE).
pub fn required_attrs(qp_type: QpType, from: QpState, to: QpState) -> &'static [AttrId] {
    use AttrId::*;
    use QpState::*;
    // The kernel's table (`qp_state_table` in drivers/infiniband/core/verbs.c): an XRC
    // initiator is an RC requester without a responder (so no responder attributes at
    // RTR), an XRC target an RC responder without a requester (so, at RTS, only the
    // timeout and the PSN of the ACKs it sends).
    match (from, to, qp_type) {
        (Reset, Init, QpType::Rc | QpType::Uc | QpType::XrcSend | QpType::XrcRecv) => {
            &[PkeyIndex, Port, AccessFlags]
        }
        (Reset, Init, QpType::Ud) => &[PkeyIndex, Port, Qkey],
        (Init, Rtr, QpType::Rc | QpType::XrcRecv) => {
            &[Av, PathMtu, DestQpn, RqPsn, MaxDestRdAtomic, MinRnrTimer]
        }
        (Init, Rtr, QpType::Uc | QpType::XrcSend) => &[Av, PathMtu, DestQpn, RqPsn],
        (Rtr, Rts, QpType::Rc | QpType::XrcSend) => {
            &[SqPsn, Timeout, RetryCnt, RnrRetry, MaxQpRdAtomic]
        }
        (Rtr, Rts, QpType::XrcRecv) => &[Timeout, SqPsn],
        (Rtr, Rts, QpType::Uc | QpType::Ud) => &[SqPsn],
        _ => &[],
    }
}

/// Everything about a modify that the client can check: transition, required
/// attributes, value ranges. `port_mtu` is the device's MTU, `max_rd_atom` its limit.
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
    port_mtu: u32,
    max_rd_atom: u32,
) -> std::result::Result<(), String> {
    let to = attr.qp_state.unwrap_or(current);
    if !transition_allowed(current, to) {
        return Err(format!(
            "{current:?} -> {to:?} is not a legal QP state transition (IBTA 10.3.1)"
        ));
    }
    let missing: Vec<String> = required_attrs(qp_type, current, to)
        .iter()
        .filter(|a| !attr.has(**a))
        .map(|a| a.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{current:?} -> {to:?} on a {qp_type:?} QP requires {}",
            missing.join(", ")
        ));
    }
    let range = |name: &str, v: Option<u8>, max: u8| match v {
        Some(v) if v > max => Err(format!("{name} {v} is outside 0..={max}")),
        _ => Ok(()),
    };
    range("timeout", attr.timeout, 31)?;
    range("retry_cnt", attr.retry_cnt, 7)?;
    range("rnr_retry", attr.rnr_retry, 7)?;
    range("min_rnr_timer", attr.min_rnr_timer, 31)?;
    for (name, v) in [
        ("rq_psn", attr.rq_psn),
        ("sq_psn", attr.sq_psn),
        ("dest_qp_num", attr.dest_qp_num),
    ] {
        if let Some(v) = v {
            if v > 0xFF_FFFF {
                return Err(format!("{name} {v:#x} does not fit in 24 bits"));
            }
        }
    }
    for (name, v) in [
        ("max_rd_atomic", attr.max_rd_atomic),
        ("max_dest_rd_atomic", attr.max_dest_rd_atomic),
    ] {
        if let Some(v) = v {
            if u32::from(v) > max_rd_atom {
                return Err(format!(
                    "{name} {v} exceeds the device's max_qp_rd_atom {max_rd_atom}"
                ));
            }
        }
    }
    if let Some(m) = attr.path_mtu {
        if m.bytes() > port_mtu {
            return Err(format!(
                "path_mtu {} exceeds the port's active MTU {port_mtu}",
                m.bytes()
            ));
        }
    }
    if let Some(p) = attr.port_num {
        if p != 1 {
            return Err(format!("port {p} does not exist: softnic has port 1"));
        }
    }
    if let Some(i) = attr.pkey_index {
        if i != 0 {
            return Err(format!(
                "pkey_index {i} does not exist: softnic has one P_Key (index 0)"
            ));
        }
    }
    if let Some(a) = attr.qp_access_flags {
        if a.bits() & !AccessFlags::ALL.bits() != 0 {
            return Err(format!("qp_access_flags {:#x} has unknown bits", a.bits()));
        }
    }
    if let Some(ah) = attr.ah_attr {
        if u32::from(ah.sgid_index) != crate::gid::ADDRESS_GID_INDEX {
            return Err(format!(
                "sgid_index {} cannot source RoCEv2 traffic: softnic sends from its \
                 address, GID index {} (index 0 is the link-local GID, listed as rxe \
                 lists it but not routable)",
                ah.sgid_index,
                crate::gid::ADDRESS_GID_INDEX
            ));
        }
        if ah.dgid.is_zero() {
            return Err("ah_attr.dgid is all zeros: set the peer's GID".into());
        }
    }
    Ok(())
}

/// A queue pair (`struct ibv_qp`). `Send`; single producer (`&mut self` to post).
pub struct QueuePair {
    qpn: u32,
    /// Its slot on the context's doorbell page.
    doorbell: u32,
    qp_type: QpType,
    state: QpState,
    cap: QpCap,
    sq_sig_all: bool,
    sq: Producer<SendWqe>,
    rq: Producer<RecvWqe>,
    ctx: Context,
    /// Its PD; `None` for an XRC target QP, which has none (its requests use the PD of
    /// the XRC SRQ each names).
    pd: Option<Arc<PdShared>>,
    /// `None` for an XRC target QP.
    _send_cq: Option<Arc<CqShared>>,
    /// `None` for both XRC types: an initiator receives nothing, a target's receive
    /// completions go to the CQ of the XRC SRQ each request names.
    _recv_cq: Option<Arc<CqShared>>,
    /// The SRQ this QP receives from (kept alive while the QP exists).
    srq: Option<Arc<SrqShared>>,
    /// An XRC target QP's domain (kept open while the QP exists).
    _xrcd: Option<Arc<XrcdShared>>,
}

/// Everything [`QueuePair::build`] needs, for every QP type.
struct NewQp<'a> {
    ctx: &'a Context,
    pd: Option<&'a ProtectionDomain>,
    qp_type: QpType,
    send_cq: Option<&'a CompletionQueue>,
    recv_cq: Option<&'a CompletionQueue>,
    /// What the program asked for (and is told it got).
    cap: QpCap,
    /// What the NIC is asked for (the ring sizes of the segment).
    caps: control::QpCaps,
    sq_sig_all: bool,
    srq: Option<&'a SharedReceiveQueue>,
    xrcd: Option<&'a Xrcd>,
}

/// `struct ibv_qp_init_attr_ex` for an XRC initiator QP (`IBV_QPT_XRC_SEND`): a send
/// CQ and send-queue sizes; it has no receive queue (`cap.max_recv_*` are ignored, and
/// reported as 0).
#[derive(Debug, Clone, Copy)]
pub struct XrcSendQpInitAttr<'a> {
    /// CQ for send completions.
    pub send_cq: &'a CompletionQueue,
    /// Send-queue sizes.
    pub cap: QpCap,
    /// Every send work request is signaled, whatever its flags.
    pub sq_sig_all: bool,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &format_args!("{:#x}", self.qpn))
            .field("qp_type", &self.qp_type)
            .field("state", &self.state)
            .field("cap", &self.cap)
            .finish()
    }
}

/// Checks requested capabilities against the device and the ABI.
pub(crate) fn check_cap(cap: &QpCap, dev: &control::DeviceAttr) -> std::result::Result<(), String> {
    let max_wr = dev.max_qp_wr.min(crate::abi::MAX_RING_ENTRIES);
    for (name, v) in [
        ("max_send_wr", cap.max_send_wr),
        ("max_recv_wr", cap.max_recv_wr),
    ] {
        // 0 is allowed (a queue the QP never uses), and granted one entry
        // (`layout::wq_capacity`).
        if v > max_wr {
            return Err(format!("{name} {v} is outside 0..={max_wr}"));
        }
    }
    let max_sge = dev.max_sge.min(MAX_SGE as u32);
    for (name, v) in [
        ("max_send_sge", cap.max_send_sge),
        ("max_recv_sge", cap.max_recv_sge),
    ] {
        if v > max_sge {
            return Err(format!("{name} {v} exceeds the device's max_sge {max_sge}"));
        }
    }
    let max_inline = dev.max_inline.min(MAX_INLINE as u32);
    if cap.max_inline_data > max_inline {
        return Err(format!(
            "max_inline_data {} exceeds the device's {max_inline}",
            cap.max_inline_data
        ));
    }
    Ok(())
}

impl QueuePair {
    pub(crate) fn create(
        pd: &ProtectionDomain,
        attr: &QpInitAttr<'_>,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<Self> {
        if matches!(attr.qp_type, QpType::XrcSend | QpType::XrcRecv) {
            return Err(Error::InvalidArgument(format!(
                "a {:?} QP is created with ProtectionDomain::create_xrc_send_qp or \
                 Xrcd::create_recv_qp",
                attr.qp_type
            )));
        }
        let mut cap = attr.cap;
        if let Some(s) = srq {
            if !s.same_pd(pd) {
                return Err(Error::InvalidArgument(
                    "the SRQ belongs to another protection domain".into(),
                ));
            }
            if s.is_xrc() {
                return Err(Error::InvalidArgument(
                    "an XRC SRQ serves the XRC receive QPs of its domain, not a QP created \
                     on it"
                        .into(),
                ));
            }
            // Receive WQEs go to the SRQ; the QP's own RQ ring is a 1-slot stub.
            cap.max_recv_wr = 1;
            cap.max_recv_sge = s.attr().max_sge;
        }
        let caps = control::QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_sge: cap.max_send_sge.max(cap.max_recv_sge),
            max_inline: cap.max_inline_data,
        };
        Self::build(NewQp {
            ctx: &pd.inner.ctx,
            pd: Some(pd),
            qp_type: attr.qp_type,
            send_cq: Some(attr.send_cq),
            recv_cq: Some(attr.recv_cq),
            cap,
            caps,
            sq_sig_all: attr.sq_sig_all,
            srq,
            xrcd: None,
        })
    }

    /// An XRC initiator QP on `pd` ([`ProtectionDomain::create_xrc_send_qp`]). Its
    /// receive ring is unused and asked for with one entry, as `CreateQp::xrcd`
    /// specifies.
    pub(crate) fn create_xrc_send(
        pd: &ProtectionDomain,
        attr: &XrcSendQpInitAttr<'_>,
    ) -> Result<Self> {
        let cap = QpCap {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..attr.cap
        };
        let caps = control::QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: 1,
            max_sge: cap.max_send_sge,
            max_inline: cap.max_inline_data,
        };
        Self::build(NewQp {
            ctx: &pd.inner.ctx,
            pd: Some(pd),
            qp_type: QpType::XrcSend,
            send_cq: Some(attr.send_cq),
            recv_cq: None,
            cap,
            caps,
            sq_sig_all: attr.sq_sig_all,
            srq: None,
            xrcd: None,
        })
    }

    /// An XRC target QP in `xrcd` ([`Xrcd::create_recv_qp`]): no PD, no CQs, and rings
    /// the NIC never reads, asked for at their smallest (1 send and 1 receive entry of
    /// one SGE, no inline room), as `CreateQp::xrcd` specifies.
    pub(crate) fn create_xrc_recv(xrcd: &Xrcd) -> Result<Self> {
        Self::build(NewQp {
            ctx: xrcd.context(),
            pd: None,
            qp_type: QpType::XrcRecv,
            send_cq: None,
            recv_cq: None,
            cap: QpCap::default(),
            caps: control::QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_sge: 1,
                max_inline: 0,
            },
            sq_sig_all: false,
            srq: None,
            xrcd: Some(xrcd),
        })
    }

    /// Checks `n` against the device, creates the QP's segment and asks the NIC for
    /// the QP.
    fn build(n: NewQp<'_>) -> Result<Self> {
        let ctx = n.ctx;
        let mut cap = n.cap;
        check_cap(&cap, ctx.inner.attr()).map_err(Error::InvalidArgument)?;
        for cq in [n.send_cq, n.recv_cq].into_iter().flatten() {
            if !Arc::ptr_eq(&cq.shared.ctx.inner, &ctx.inner) {
                return Err(Error::InvalidArgument(
                    "the CQ belongs to another device context".into(),
                ));
            }
        }
        if n.xrcd.is_some_and(|x| !x.same_context(ctx)) {
            return Err(Error::InvalidArgument(
                "the XRC domain belongs to another device context".into(),
            ));
        }
        let caps = n.caps;
        let shape = caps.sq_shape(n.qp_type);
        let layout = QpLayout::new(caps.max_send_wr, caps.max_recv_wr, shape)?;
        if n.qp_type != QpType::XrcRecv {
            // The inline room the NIC grants from the same shape: at least what was
            // asked and at least the gather list's, as rxe (`SqShape::inline_capacity`).
            cap.max_inline_data = shape.inline_capacity();
        }
        let fd = os::memfd("softnic-qp", layout.len).map_err(io("creating the QP memfd"))?;
        let map = Arc::new(os::map_shared(fd.as_fd(), layout.len).map_err(io("mapping the QP"))?);
        let (sq, rq) = layout.rings(map)?;
        sq.init();
        rq.init();
        let req = Request::CreateQp {
            pd: n.pd.map_or(0, |p| p.inner.handle),
            qp_type: n.qp_type,
            send_cq: n.send_cq.map_or(0, |c| c.shared.handle),
            recv_cq: n.recv_cq.map_or(0, |c| c.shared.handle),
            caps,
            srq: n.srq.map(|s| s.handle()),
            xrcd: n.xrcd.map(|x| x.handle()),
        };
        let (reply, _) = ctx.inner.call("ibv_create_qp", &req, &[fd.as_fd()])?;
        let (qpn, doorbell) = match reply {
            Reply::Qp { qpn, doorbell, .. } => (qpn, doorbell),
            other => return Err(Error::Protocol(format!("CreateQp answered with {other:?}"))),
        };
        Ok(QueuePair {
            qpn,
            doorbell,
            qp_type: n.qp_type,
            state: QpState::Reset,
            cap,
            sq_sig_all: n.sq_sig_all,
            sq: sq.into_producer(),
            rq: rq.into_producer(),
            ctx: ctx.clone(),
            pd: n.pd.map(|p| p.inner.clone()),
            _send_cq: n.send_cq.map(|c| c.shared.clone()),
            _recv_cq: n.recv_cq.map(|c| c.shared.clone()),
            srq: n.srq.map(|s| s.shared.clone()),
            _xrcd: n.xrcd.map(|x| x.shared.clone()),
        })
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Service type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// State as of the last modify/query by this client (the NIC may since have moved
    /// it to Err; [`Self::query`] refreshes).
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Capabilities.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// Changes attributes and/or state (`ibv_modify_qp`).
    pub fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let dev = self.ctx.inner.attr();
        check_modify(self.qp_type, self.state, attr, dev.mtu, dev.max_qp_rd_atom).map_err(
            |what| Error::InvalidState {
                qpn: self.qpn,
                state: self.state,
                what,
            },
        )?;
        let req = Request::ModifyQp {
            qpn: self.qpn,
            attr: attr.to_control(),
        };
        match self.ctx.inner.call("ibv_modify_qp", &req, &[])?.0 {
            Reply::Done => {}
            other => return Err(Error::Protocol(format!("ModifyQp answered with {other:?}"))),
        }
        if let Some(s) = attr.qp_state {
            self.state = s;
        }
        Ok(())
    }

    /// Asks the NIC for the QP's state and attributes (`ibv_query_qp`).
    pub fn query(&mut self) -> Result<(QpState, control::QpAttr)> {
        let req = Request::QueryQp { qpn: self.qpn };
        match self.ctx.inner.call("ibv_query_qp", &req, &[])?.0 {
            Reply::QpInfo { state, attr } => {
                self.state = state;
                Ok((state, attr))
            }
            other => Err(Error::Protocol(format!("QueryQp answered with {other:?}"))),
        }
    }

    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`; RoCE has
    /// no LIDs): from now on it receives a copy of every datagram sent to the group
    /// with its Q_Key, with the group's GID as the GRH's destination. A RoCEv2 group
    /// is an IP multicast address: IPv4 `224.0.0.0/4` as `::ffff:a.b.c.d`, or an IPv6
    /// `ff00::/8` address, of the NIC's family. Send to it with an address handle
    /// whose GID is the group and the remote QPN 0xFFFFFF. Attaching twice is no
    /// error.
    pub fn attach_mcast(&self, gid: Gid) -> Result<()> {
        let req = Request::AttachMcast {
            qpn: self.qpn,
            gid: gid.raw(),
        };
        self.call_done("ibv_attach_mcast", &req)
    }

    /// Detaches this QP from the multicast group `gid` (`ibv_detach_mcast`); an error
    /// if it was not attached. Destroying the QP detaches it from every group.
    pub fn detach_mcast(&self, gid: Gid) -> Result<()> {
        let req = Request::DetachMcast {
            qpn: self.qpn,
            gid: gid.raw(),
        };
        self.call_done("ibv_detach_mcast", &req)
    }

    /// Sends `req` for `verb`; the NIC must answer `Done`.
    fn call_done(&self, verb: &'static str, req: &Request) -> Result<()> {
        match self.ctx.inner.call(verb, req, &[])?.0 {
            Reply::Done => Ok(()),
            other => Err(Error::Protocol(format!("{verb} answered with {other:?}"))),
        }
    }

    /// RESET → INIT with P_Key index 0, port 1 and `access` (RC, UC, XRC) or
    /// [`DEFAULT_QKEY`] (UD), as `ibv_rc_pingpong` does.
    pub fn to_init(&mut self, access: AccessFlags) -> Result<()> {
        let mut a = QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            ..QpAttr::default()
        };
        if self.qp_type == QpType::Ud {
            a.qkey = Some(DEFAULT_QKEY);
        } else {
            a.qp_access_flags = Some(access);
        }
        self.modify(&a)
    }

    /// INIT → RTR towards `remote`, with `ibv_rc_pingpong`'s defaults
    /// (max_dest_rd_atomic 1, min_rnr_timer 12, for the responders: RC and XRC
    /// target QPs).
    pub fn to_rtr(&mut self, remote: &QpEndpoint, mtu: Mtu) -> Result<()> {
        let mut a = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        if self.qp_type != QpType::Ud {
            a.path_mtu = Some(mtu);
            a.dest_qp_num = Some(remote.qpn);
            a.rq_psn = Some(remote.psn);
            a.ah_attr = Some(AhAttr {
                dgid: remote.gid,
                sgid_index: crate::gid::ADDRESS_GID_INDEX as u8,
                hop_limit: 1,
                traffic_class: 0,
                udp_port: remote.udp_port,
            });
        }
        if matches!(self.qp_type, QpType::Rc | QpType::XrcRecv) {
            a.max_dest_rd_atomic = Some(1);
            a.min_rnr_timer = Some(12);
        }
        self.modify(&a)
    }

    /// RTR → RTS with first PSN `sq_psn` and `ibv_rc_pingpong`'s defaults (timeout 14,
    /// retry_cnt 7, rnr_retry 7, max_rd_atomic 1; an XRC target QP takes only the
    /// timeout).
    pub fn to_rts(&mut self, sq_psn: u32) -> Result<()> {
        let mut a = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            ..QpAttr::default()
        };
        match self.qp_type {
            QpType::Rc | QpType::XrcSend => {
                a.timeout = Some(14);
                a.retry_cnt = Some(7);
                a.rnr_retry = Some(7);
                a.max_rd_atomic = Some(1);
            }
            // A target sends only ACKs and responses: their timeout, no retries.
            QpType::XrcRecv => a.timeout = Some(14),
            QpType::Uc | QpType::Ud => {}
        }
        self.modify(&a)
    }

    fn limits(&self) -> QpLimits {
        QpLimits {
            qp_type: self.qp_type,
            state: self.state,
            max_send_sge: self.cap.max_send_sge,
            max_recv_sge: self.cap.max_recv_sge,
            max_inline: self.cap.max_inline_data,
            sq_sig_all: self.sq_sig_all,
        }
    }

    /// Posts send work requests (`ibv_post_send`). On error, the requests before the
    /// refused one are posted ([`Error::Post`] says which, like `bad_wr`). No syscall
    /// unless the NIC is asleep (NEED_WAKEUP on the doorbell page).
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.ctx.inner.check_nic_alive()?;
        let Some(pd) = &self.pd else {
            return refuse_all(
                wrs.first().map(|w| w.wr_id),
                "an XRC receive QP has no send queue",
            );
        };
        let q = self.limits();
        let mut result = Ok(());
        let mut pushed = 0usize;
        // With many QPs this one's ring is cold: fetch the slots the batch fills at once
        // (issue 12, "Many QPs"; docs/perf.md).
        self.sq
            .prefetch(u32::try_from(wrs.len()).unwrap_or(u32::MAX));
        {
            // Held across the inline copies so no region can be unmapped meanwhile.
            let mrs = pd.mrs.read().unwrap_or_else(|e| e.into_inner());
            // Each WR is built in this one slot and copied once, into the ring
            // (`build_send_wqe`).
            let mut wqe = SendWqe::default();
            for (index, wr) in wrs.iter().enumerate() {
                // SAFETY: the table's entries are live mappings while its lock is held
                // (a MemoryRegion removes its entry before unmapping).
                let built = unsafe { build_send_wqe(wr, &q, &mrs, &mut wqe) };
                let pushed_one = built.and_then(|()| {
                    let capacity = self.sq.ring().capacity();
                    self.sq.push(&wqe).map_err(|e| push_error(e, capacity))
                });
                if let Err(reason) = pushed_one {
                    result = Err(Error::Post {
                        index,
                        wr_id: wr.wr_id,
                        reason,
                    });
                    break;
                }
                pushed += 1;
            }
        }
        if pushed > 0 {
            self.sq.publish();
            let ctx = &self.ctx.inner;
            ctx.poll.note_posted(pushed as u32);
            ctx.ring_doorbell(self.doorbell)?;
        }
        result
    }

    /// Posts receive work requests (`ibv_post_recv`), same conventions as
    /// [`Self::post_send`].
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.ctx.inner.check_nic_alive()?;
        if matches!(self.qp_type, QpType::XrcSend | QpType::XrcRecv) {
            // An initiator receives nothing; a target's receive WQEs come from the XRC
            // SRQ each request names (post to that SRQ).
            return refuse_all(
                wrs.first().map(|w| w.wr_id),
                "an XRC QP has no receive queue (post to the XRC SRQ)",
            );
        }
        if self.srq.is_some() {
            return Err(Error::InvalidState {
                qpn: self.qpn,
                state: self.state,
                what: "ibv_post_recv on a QP created with an SRQ (post to the SRQ)".into(),
            });
        }
        let q = self.limits();
        let mut result = Ok(());
        let mut pushed = 0usize;
        {
            for (index, wr) in wrs.iter().enumerate() {
                let pushed_one = build_recv_wqe(wr, &q).and_then(|wqe| {
                    let capacity = self.rq.ring().capacity();
                    self.rq.push(&wqe).map_err(|e| push_error(e, capacity))
                });
                if let Err(reason) = pushed_one {
                    result = Err(Error::Post {
                        index,
                        wr_id: wr.wr_id,
                        reason,
                    });
                    break;
                }
                pushed += 1;
            }
        }
        if pushed > 0 {
            self.rq.publish();
            self.ctx.inner.ring_doorbell(self.doorbell)?;
        }
        result
    }

    /// Runs `request` (a memory-window bind or invalidation, [`crate::mw`]) once the
    /// send queue has room, then posts the WQE (`opcode`, no data) that the NIC
    /// completes in order with the send queue's other work requests.
    pub(crate) fn post_local(
        &mut self,
        verb: &'static str,
        request: &Request,
        wr_id: u64,
        opcode: u8,
        signaled: bool,
    ) -> Result<()> {
        if self.qp_type == QpType::XrcRecv {
            return refuse_all(Some(wr_id), "an XRC receive QP has no send queue");
        }
        let capacity = self.sq.ring().capacity();
        let full = |reason| Error::Post {
            index: 0,
            wr_id,
            reason,
        };
        if self.sq.free(1).map_err(|e| full(push_error(e, capacity)))? == 0 {
            return Err(full(PostError::QueueFull { capacity }));
        }
        self.ctx.inner.call(verb, request, &[])?;
        let mut wqe = SendWqe {
            wr_id,
            opcode,
            ..SendWqe::default()
        };
        if signaled || self.sq_sig_all {
            wqe.flags = crate::abi::slots::send_flags::SIGNALED;
        }
        self.sq
            .push(&wqe)
            .map_err(|e| full(push_error(e, capacity)))?;
        self.sq.publish();
        self.ctx.inner.poll.note_posted(1);
        self.ctx.inner.ring_doorbell(self.doorbell)?;
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let ctx = &self.ctx.inner;
        let _ = ctx.call("ibv_destroy_qp", &Request::DestroyQp { qpn: self.qpn }, &[]);
        // Send WQEs the NIC never retired (their slots were not given back) are no
        // longer queued ahead of it: hybrid polling's count must not keep them.
        if let Ok(n) = self.sq.unconsumed() {
            ctx.poll.note_abandoned(n);
        }
    }
}

/// A post to a queue the QP does not have: the first work request (`first`, its
/// `wr_id`) is refused with `why` and nothing is posted; posting nothing succeeds.
fn refuse_all(first: Option<u64>, why: &str) -> Result<()> {
    match first {
        None => Ok(()),
        Some(wr_id) => Err(Error::Post {
            index: 0,
            wr_id,
            reason: PostError::Unsupported(why.into()),
        }),
    }
}

/// The post error for a failed push onto a work queue of `capacity` entries.
fn push_error(e: crate::abi::RingError, capacity: u32) -> PostError {
    match e {
        crate::abi::RingError::Full => PostError::QueueFull { capacity },
        e => PostError::Ring(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtr_attr() -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qp_num: Some(0x12),
            rq_psn: Some(0x345),
            ah_attr: Some(AhAttr {
                dgid: "::ffff:127.0.0.2".parse().unwrap(),
                ..AhAttr::default()
            }),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        }
    }

    #[test]
    fn legal_and_illegal_transitions() {
        use QpState::*;
        assert!(transition_allowed(Reset, Init));
        assert!(transition_allowed(Rts, Err));
        assert!(transition_allowed(Err, Reset));
        assert!(!transition_allowed(Reset, Rts));
        assert!(!transition_allowed(Init, Rts));
        assert!(!transition_allowed(Err, Rts));
        let e = check_modify(
            QpType::Rc,
            Reset,
            &QpAttr {
                qp_state: Some(Rts),
                ..QpAttr::default()
            },
            4096,
            16,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "Reset -> Rts is not a legal QP state transition (IBTA 10.3.1)"
        );
    }

    #[test]
    fn missing_required_attributes_are_named() {
        let mut a = rtr_attr();
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &a, 4096, 16),
            Ok(())
        );
        a.rq_psn = None;
        a.min_rnr_timer = None;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &a, 4096, 16).unwrap_err(),
            "Init -> Rtr on a Rc QP requires IBV_QP_RQ_PSN, IBV_QP_MIN_RNR_TIMER"
        );
        // UC does not need the RC-only attributes.
        a.rq_psn = Some(1);
        a.max_dest_rd_atomic = None;
        assert_eq!(
            check_modify(QpType::Uc, QpState::Init, &a, 4096, 16),
            Ok(())
        );
        // UD needs only the state.
        let ud = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        assert_eq!(
            check_modify(QpType::Ud, QpState::Init, &ud, 4096, 16),
            Ok(())
        );
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            ..QpAttr::default()
        };
        assert!(check_modify(QpType::Rc, QpState::Reset, &init, 4096, 16)
            .unwrap_err()
            .contains("IBV_QP_ACCESS_FLAGS"));
        assert!(check_modify(QpType::Ud, QpState::Reset, &init, 4096, 16)
            .unwrap_err()
            .contains("IBV_QP_QKEY"));
    }

    /// The XRC rows of the kernel's table: an initiator needs no responder attributes
    /// at RTR, a target only the timeout and SQ PSN at RTS.
    #[test]
    fn xrc_transitions_need_the_kernels_attributes() {
        use AttrId::*;
        use QpState::*;
        for t in [QpType::XrcSend, QpType::XrcRecv] {
            assert_eq!(
                required_attrs(t, Reset, Init),
                &[PkeyIndex, Port, AccessFlags]
            );
        }
        assert_eq!(
            required_attrs(QpType::XrcSend, Init, Rtr),
            &[Av, PathMtu, DestQpn, RqPsn]
        );
        assert_eq!(
            required_attrs(QpType::XrcRecv, Init, Rtr),
            &[Av, PathMtu, DestQpn, RqPsn, MaxDestRdAtomic, MinRnrTimer]
        );
        assert_eq!(
            required_attrs(QpType::XrcSend, Rtr, Rts),
            required_attrs(QpType::Rc, Rtr, Rts)
        );
        assert_eq!(required_attrs(QpType::XrcRecv, Rtr, Rts), &[Timeout, SqPsn]);
        let rts = QpAttr {
            qp_state: Some(Rts),
            sq_psn: Some(1),
            timeout: Some(14),
            ..QpAttr::default()
        };
        assert_eq!(check_modify(QpType::XrcRecv, Rtr, &rts, 4096, 16), Ok(()));
        assert!(check_modify(QpType::XrcSend, Rtr, &rts, 4096, 16)
            .unwrap_err()
            .contains("IBV_QP_RETRY_CNT"));
        let mut rtr = rtr_attr();
        rtr.max_dest_rd_atomic = None;
        rtr.min_rnr_timer = None;
        assert_eq!(check_modify(QpType::XrcSend, Init, &rtr, 4096, 16), Ok(()));
        assert!(check_modify(QpType::XrcRecv, Init, &rtr, 4096, 16)
            .unwrap_err()
            .contains("IBV_QP_MAX_DEST_RD_ATOMIC"));
    }

    #[test]
    fn ranges_are_checked() {
        let base = rtr_attr();
        let cases: Vec<(QpAttr, &str)> = vec![
            (
                QpAttr {
                    rq_psn: Some(1 << 24),
                    ..base
                },
                "rq_psn 0x1000000 does not fit in 24 bits",
            ),
            (
                QpAttr {
                    dest_qp_num: Some(u32::MAX),
                    ..base
                },
                "dest_qp_num 0xffffffff does not fit in 24 bits",
            ),
            (
                QpAttr {
                    path_mtu: Some(Mtu::Mtu4096),
                    ..base
                },
                "path_mtu 4096 exceeds the port's active MTU 1024",
            ),
            (
                QpAttr {
                    max_dest_rd_atomic: Some(17),
                    ..base
                },
                "max_dest_rd_atomic 17 exceeds the device's max_qp_rd_atom 16",
            ),
            (
                QpAttr {
                    min_rnr_timer: Some(32),
                    ..base
                },
                "min_rnr_timer 32 is outside 0..=31",
            ),
            (
                QpAttr {
                    ah_attr: Some(AhAttr::default()),
                    ..base
                },
                "ah_attr.dgid is all zeros: set the peer's GID",
            ),
        ];
        for (a, want) in cases {
            assert_eq!(
                check_modify(QpType::Rc, QpState::Init, &a, 1024, 16).unwrap_err(),
                want
            );
        }
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(8),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &rts, 1024, 16).unwrap_err(),
            "retry_cnt 8 is outside 0..=7"
        );
    }

    #[test]
    fn control_form_maps_gid_to_udp_endpoint() {
        let mut a = rtr_attr();
        let c = a.to_control();
        assert_eq!(c.remote, Some("127.0.0.2:4791".parse().unwrap()));
        assert_eq!(c.path_mtu, Some(1024));
        assert_eq!(c.state, Some(QpState::Rtr));
        a.ah_attr = Some(AhAttr {
            dgid: "fd00::1".parse().unwrap(),
            udp_port: 4792,
            ..AhAttr::default()
        });
        assert_eq!(
            a.to_control().remote,
            Some("[fd00::1]:4792".parse().unwrap())
        );
    }

    /// `from_control` undoes `to_control` for every field, on both address families.
    #[test]
    fn control_form_round_trips() {
        let full = QpAttr {
            qp_state: Some(QpState::Rts),
            path_mtu: Some(Mtu::Mtu4096),
            dest_qp_num: Some(0xab_cdef),
            rq_psn: Some(0x12_3456),
            sq_psn: Some(0x65_4321),
            ah_attr: Some(AhAttr {
                dgid: "::ffff:127.0.0.2".parse().unwrap(),
                hop_limit: 64,
                udp_port: 4792,
                ..AhAttr::default()
            }),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(6),
            min_rnr_timer: Some(12),
            max_rd_atomic: Some(3),
            max_dest_rd_atomic: Some(4),
            qp_access_flags: Some(AccessFlags::ALL),
            qkey: Some(0x0123_4567),
            pkey_index: Some(0),
            port_num: Some(1),
        };
        let mut v6 = full;
        v6.ah_attr = Some(AhAttr {
            dgid: "fd00::1".parse().unwrap(),
            ..full.ah_attr.unwrap()
        });
        for a in [full, v6, rtr_attr_with_ttl(), QpAttr::default()] {
            let c = a.to_control();
            assert_eq!(QpAttr::from_control(&c), a);
            assert_eq!(QpAttr::from_control(&c).to_control(), c);
        }
        // What the NIC sends: an endpoint and an MTU in bytes.
        let c = full.to_control();
        assert_eq!(c.remote, Some("127.0.0.2:4792".parse().unwrap()));
        assert_eq!(c.path_mtu, Some(4096));
    }

    fn rtr_attr_with_ttl() -> QpAttr {
        let mut a = rtr_attr();
        a.ah_attr = Some(AhAttr {
            hop_limit: 64,
            udp_port: ROCE_V2_PORT,
            ..a.ah_attr.unwrap()
        });
        a
    }

    #[test]
    fn caps_are_checked_against_the_device() {
        let dev = control::DeviceAttr {
            name: "t".into(),
            gid: [0; 16],
            addr: "127.0.0.1".parse().unwrap(),
            port: 4791,
            mtu: 4096,
            max_qp: 16,
            max_qp_wr: 1024,
            max_sge: 4,
            max_cqe: 1024,
            max_inline: 256,
            max_mr: 16,
            max_mr_size: 1 << 30,
            max_qp_rd_atom: 16,
            max_msg_sz: (1 << 31) - 256,
        };
        let ok = QpCap {
            max_send_wr: 1,
            max_recv_wr: 500,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        assert_eq!(check_cap(&ok, &dev), Ok(()));
        assert_eq!(
            check_cap(
                &QpCap {
                    max_recv_wr: 2000,
                    ..ok
                },
                &dev
            )
            .unwrap_err(),
            "max_recv_wr 2000 is outside 0..=1024"
        );
        assert!(check_cap(
            &QpCap {
                max_send_sge: 5,
                ..ok
            },
            &dev
        )
        .is_err());
        assert!(check_cap(
            &QpCap {
                max_inline_data: 257,
                ..ok
            },
            &dev
        )
        .is_err());
        // An empty work queue is allowed (qperf's senders and receivers ask for one).
        for (s, r) in [(0, 1), (1, 0), (0, 0)] {
            let cap = QpCap {
                max_send_wr: s,
                max_recv_wr: r,
                ..ok
            };
            assert_eq!(check_cap(&cap, &dev), Ok(()));
        }
    }

    #[test]
    fn mtu_bytes_round_trip() {
        for b in [256, 512, 1024, 2048, 4096] {
            assert_eq!(Mtu::from_bytes(b).unwrap().bytes(), b);
        }
        assert_eq!(Mtu::from_bytes(1500), None);
    }
}
