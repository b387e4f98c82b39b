//! One connection's state (IBTA 12.9, the RC subset), and what each side offered.

use std::net::SocketAddr;

use super::timer::Retry;
use super::IdHandle;

/// Where a connection is in IBTA 12.9's state diagram (RC only; no LAP/APR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Created; not listening or connecting.
    Idle,
    /// Listening for REQs.
    Listen,
    /// Active: REQ sent, waiting for REP/REJ.
    ReqSent,
    /// Passive: REQ received, waiting for the consumer to accept or reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Both: connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Closed; waiting out stray packets before the comm ID and QP are reused.
    TimeWait,
    /// UD: SIDR REQ sent, waiting for the SIDR REP.
    SidrReqSent,
    /// UD: SIDR REQ received, waiting for the consumer's answer.
    SidrReqRcvd,
    /// Finished (rejected, unreachable, or out of TimeWait).
    Closed,
}

/// The transport service a connection runs: what its REQ's Transport Service Type
/// (IBTA 12.6.5, table 104: 0 RC, 1 UC, 3 "extended") and, for 3, Extended Transport
/// Type (IBTA Annex A14, XRC: 1) name. Linux's CM reads them so (`cm_req_get_qp_type`)
/// and answers an XRC REQ with an XRC target's REP, whose QP number travels in the
/// Local EE Context Number field (`cm_format_rep`, `cm_rep_get_qpn`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CmTransport {
    /// Reliable connection.
    #[default]
    Rc,
    /// XRC: an XRC initiator (active side) to an XRC target (passive side).
    Xrc,
}

impl CmTransport {
    /// The transport a REQ's two fields name; `None` for what softnic does not
    /// connect (UC, RD, an unknown extended type).
    pub fn of_req(transport_type: u8, extended_transport_type: u8) -> Option<CmTransport> {
        match (transport_type, extended_transport_type) {
            (0, _) => Some(CmTransport::Rc),
            (3, 1) => Some(CmTransport::Xrc),
            _ => None,
        }
    }

    /// A REQ's (Transport Service Type, Extended Transport Type) for this transport.
    pub fn req_fields(self) -> (u8, u8) {
        match self {
            CmTransport::Rc => (0, 0),
            CmTransport::Xrc => (3, 1),
        }
    }
}

/// What the consumer asks for in a connect or accept (`rdma_conn_param` + the QP).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParams {
    /// The transport: an RC QP, or an XRC initiator (connect) / target (accept).
    pub transport: CmTransport,
    /// The QP to bind.
    pub qpn: u32,
    /// The starting PSN this side puts in its REQ or REP (24 bits): the first PSN its QP
    /// *expects to receive*, which the peer's QP starts sending with. That is how the
    /// Linux CM reads the field (`ib_send_cm_req` keeps the REQ's as its `rq_psn`,
    /// `cm_req_handler` takes it as the passive side's `sq_psn`; the REP's likewise), and
    /// so rxe and every RNIC driven by it: a CM that used its own send PSN here would
    /// have each side send with a PSN the other does not expect.
    pub psn: u32,
    /// READ/atomics it serves at once.
    pub responder_resources: u8,
    /// READ/atomics it issues at once.
    pub initiator_depth: u8,
    /// Transport retry count (connect).
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// End-to-end flow control bit.
    pub flow_control: bool,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Private data (the IP CM header included, for a REQ).
    pub private_data: Vec<u8>,
}

/// What the peer sent (REQ or REP fields), for events and the QP transitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerParams {
    /// The transport the REQ named (a REP's is the connection's own).
    pub transport: CmTransport,
    /// The peer's QPN (an XRC target's from the REP's Local EE Context Number field).
    pub qpn: u32,
    /// The starting PSN of the peer's REQ or REP: the first PSN our QP sends with.
    pub psn: u32,
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// The peer's retry count (REQ only).
    pub retry_count: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's flow control bit.
    pub flow_control: bool,
    /// The peer's SRQ bit.
    pub srq: bool,
    /// Path MTU (IBTA encoding) from the REQ.
    pub path_mtu: u8,
    /// Local ACK timeout from the REQ's primary path.
    pub local_ack_timeout: u8,
    /// The REQ's service ID.
    pub service_id: u64,
    /// The peer's private data (the whole field as received).
    pub private_data: Vec<u8>,
}

/// One connection identifier.
#[derive(Debug)]
pub struct CmId {
    /// Its handle.
    pub handle: IdHandle,
    /// Where it is.
    pub state: CmState,
    /// Our communication ID (0 until it connects or receives a REQ).
    pub local_comm_id: u32,
    /// The peer's, once known.
    pub remote_comm_id: Option<u32>,
    /// Transaction ID of the REQ (used by REQ, REP, RTU, REJ, MRA) or of our DREQ.
    pub tid: u64,
    /// Where the peer NIC receives RoCE packets.
    pub peer: Option<SocketAddr>,
    /// The bound QP.
    pub qpn: Option<u32>,
    /// What we offered.
    pub ours: ConnParams,
    /// What the peer offered.
    pub theirs: PeerParams,
    /// The service this id listens on.
    pub listen_service_id: Option<u64>,
    /// The transport a listener takes REQs for (`None`: any), as Linux's CM takes a
    /// REQ only for the listening id's QP type (`cma_check_req_qp_type`).
    pub listen_transport: Option<CmTransport>,
    /// Connections of this listener not yet accepted or rejected.
    pub pending: u32,
    /// Most pending connections.
    pub backlog: u32,
    /// For a connection made by a REQ: its listener.
    pub listener: Option<IdHandle>,
    /// The message to resend and when (REQ, REP, DREQ), or TimeWait's end.
    pub retry: Option<Retry>,
    /// The primary path's traffic class (the IP TOS of the QP's packets): the route's
    /// on the active side (`rdma_set_option(RDMA_OPTION_ID_TOS)`), the REQ's on the
    /// passive side, as Linux's CM sets the address vector from the REQ's path.
    pub traffic_class: u8,
}

impl CmId {
    /// A new idle id.
    pub fn new(handle: IdHandle) -> CmId {
        CmId {
            handle,
            state: CmState::Idle,
            local_comm_id: 0,
            remote_comm_id: None,
            tid: 0,
            peer: None,
            qpn: None,
            ours: ConnParams::default(),
            theirs: PeerParams::default(),
            listen_service_id: None,
            listen_transport: None,
            pending: 0,
            backlog: 0,
            listener: None,
            retry: None,
            traffic_class: 0,
        }
    }
}

/// `v` in a fixed-size private data field, zero-padded (the caller checked the length).
pub(crate) fn padded<const N: usize>(v: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = v.len().min(N);
    a[..n].copy_from_slice(&v[..n]);
    a
}
