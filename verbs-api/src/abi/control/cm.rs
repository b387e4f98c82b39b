//! Control messages of the connection manager (`verbs_api::cm` ↔ the NIC's CM on QP1).
//!
//! A client opens an *event channel* once per NIC ([`CmRequest::OpenChannel`]: the NIC
//! makes a pipe and hands out its read end), creates ids on it, and drives them with
//! listen/connect/accept/reject/disconnect. The NIC queues each id's events on its
//! channel and writes a byte to the pipe when the queue goes from empty to not empty;
//! the client reads the pipe empty, then fetches the events with
//! [`CmRequest::GetEvents`]. Ids and channels belong to the client's connection and die
//! with it.
//!
//! [`CmRequest::AttachChannel`], which made the NIC write 8 bytes per event to a
//! descriptor the client sent (its own eventfd), is refused: whatever a client sends
//! can be made to block (a full blocking pipe, a blocking eventfd near its maximum),
//! and the NIC's write would then hold every client.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{Handle, QpAttr, QpType};

/// The most events one [`CmRequest::GetEvents`] answer carries. Bounded so that the
/// answer fits a control frame ([`super::MAX_FRAME`]) whatever the events hold: a
/// channel may have thousands queued (one id per QP, thousands of QPs), each with up
/// to 224 bytes of private data, and an answer too long to send would end the
/// connection and every id on it.
pub const MAX_EVENTS_PER_REPLY: usize = 32;

/// What a connect or accept offers (`struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmConnParam {
    /// The user's private data (a connect's ≤ 56 bytes: the NIC prepends the 36-byte IP
    /// CM header; an accept's ≤ 196).
    pub private_data: Vec<u8>,
    /// READ/atomics served at once.
    pub responder_resources: u8,
    /// READ/atomics issued at once.
    pub initiator_depth: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// End-to-end flow control bit.
    pub flow_control: bool,
    /// The QP uses an SRQ.
    pub srq: bool,
}

/// A CM request (inside [`super::Request::Cm`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmRequest {
    /// Refused (`InvalidArgument`, the descriptor closed): the NIC no longer writes to
    /// a descriptor a client sent. Use [`CmRequest::OpenChannel`].
    AttachChannel,
    /// A new id on `channel`. Reply: [`CmReply::Id`].
    CreateId {
        /// The channel its events go to.
        channel: Handle,
    },
    /// Forgets an id (a connected one sends a DREQ first). Reply: `Done`.
    DestroyId {
        /// The id.
        id: Handle,
    },
    /// Listens on `port` of port space `port_space` (`RDMA_PS_TCP`, `RDMA_PS_UDP` or
    /// `RDMA_PS_IB`; 0 = a free ephemeral port; a port the id reserved with
    /// [`CmRequest::Bind`] is its own) for connections of `qp_type`, the id's QP type
    /// (`rdma_create_id`'s): RC in `RDMA_PS_TCP`, UD in `RDMA_PS_UDP`, RC or
    /// `XrcRecv` in `RDMA_PS_IB`. A REQ for another transport is rejected. Reply:
    /// [`CmReply::Port`].
    Listen {
        /// The id.
        id: Handle,
        /// `rdma_port_space`.
        port_space: u16,
        /// The port.
        port: u16,
        /// Most connection requests waiting for accept/reject.
        backlog: u32,
        /// The id's QP type.
        qp_type: QpType,
    },
    /// Sends a REQ to the listener on `dst_port` of the NIC at `dest`, binding QP
    /// `qpn` (RESET or INIT: the NIC moves it to INIT) — or, in `RDMA_PS_UDP`, a SIDR
    /// REQ (UD QP `qpn`, left alone). The REQ's transport is the id's (`qp_type`):
    /// RC, or in `RDMA_PS_IB` XRC for an `XrcSend` id; an RC connection binds an RC
    /// QP or an XRC initiator, an XRC one an XRC initiator. Reply: `Done`; the
    /// outcome is an event.
    Connect {
        /// The id.
        id: Handle,
        /// The QP (this client's).
        qpn: u32,
        /// The peer NIC (IP and RoCE UDP port).
        dest: SocketAddr,
        /// `rdma_port_space`.
        port_space: u16,
        /// The listener's port.
        dst_port: u16,
        /// Our source port, for the IP CM header.
        src_port: u16,
        /// What we offer.
        param: CmConnParam,
        /// The id's QP type.
        qp_type: QpType,
    },
    /// Accepts a connection request, binding QP `qpn` for the REQ's transport (for RC
    /// an RC QP or an XRC target, for XRC an XRC target), or answering a SIDR REQ with
    /// UD QP `qpn` and Q_Key 0x01234567. Reply: `Done`.
    Accept {
        /// The id (from the CONNECT_REQUEST event).
        id: Handle,
        /// The QP.
        qpn: u32,
        /// What we offer.
        param: CmConnParam,
    },
    /// Rejects a connection request. Reply: `Done`.
    Reject {
        /// The id.
        id: Handle,
        /// REJ private data (≤ 148 bytes).
        private_data: Vec<u8>,
    },
    /// Sends a DREQ. Reply: `Done`.
    Disconnect {
        /// The id.
        id: Handle,
    },
    /// Takes the channel's oldest pending events, at most [`MAX_EVENTS_PER_REPLY`]
    /// (never blocks). Reply: [`CmReply::Events`]. When more are left the NIC writes
    /// the channel's pipe again, so the client asks again.
    GetEvents {
        /// The channel.
        channel: Handle,
    },
    /// `rdma_migrate_id`: the id's events go to `channel` (another of this client's)
    /// from now on, and its events still queued move there with it, in order, with
    /// the connection requests queued for it as a listener (their new ids follow
    /// them), as Linux's `ucma_migrate_id` moves a context and its events to another
    /// file. Reply: `Done`.
    MigrateId {
        /// The id.
        id: Handle,
        /// The channel it moves to.
        channel: Handle,
    },
    /// The RTR and RTS attributes of the id's connection (`rdma_init_qp_attr`), for a
    /// program that moves its own QP. Reply: [`CmReply::QpAttrs`]; `InvalidState`
    /// before the peer's REQ (passive) or REP (active) is known.
    QpAttrs {
        /// The id.
        id: Handle,
    },
    /// The program moves the QP of this id's connection itself (`rdma_connect` /
    /// `rdma_accept` on an id without `rdma_create_qp`, the QP named by
    /// `conn_param->qp_num`): the NIC leaves that QP's state alone — no INIT at connect,
    /// no RTR/RTS, no ERR at disconnect — as the kernel CM does for a user's QP.
    /// Send before `Connect`/`Accept`. Reply: `Done`.
    OwnQp {
        /// The id.
        id: Handle,
    },
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK timeout (4.096 µs ×
    /// 2^`timeout`, at most 31) this id's QP gets at RTS, in place of the one the peer's
    /// REQ or REP offers — as Linux's CM applies `id_priv->timeout` (`rdma_init_qp_attr`
    /// answers it too). InvalidArgument past 31. Reply: `Done`.
    SetAckTimeout {
        /// The id.
        id: Handle,
        /// The exponent.
        timeout: u8,
    },
    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class (IP TOS: DSCP and ECN)
    /// of this id's connection — its REQ's primary path carries it, and the QPs of both
    /// sides send with it (`rdma_init_qp_attr` answers it in `ah_attr.grh`), as Linux's
    /// CM routes an id with its TOS. Set before `rdma_connect`. Reply: `Done`.
    SetTos {
        /// The id.
        id: Handle,
        /// The IP TOS byte.
        tos: u8,
    },
    /// A new event channel. Reply: [`CmReply::Channel`] + the read end of the pipe the
    /// NIC writes a byte to when the channel's queue goes from empty to not empty.
    /// Read the pipe empty *before* [`CmRequest::GetEvents`], so an event queued after
    /// the answer writes again. The NIC keeps the write end (non-blocking, an open file
    /// of its own: nothing a client does to its descriptor makes the NIC wait; a full
    /// pipe is skipped). End of file on the pipe means the NIC is gone.
    OpenChannel,
    /// Reserves `port` of port space `port_space` for the id (`rdma_bind_addr`; 0 = a
    /// free ephemeral port), as Linux's CM does at bind: `rdma_get_src_port` right
    /// after the bind names the port a later listen uses (qperf sends it to its
    /// client before it listens), and a port another id holds is refused here
    /// (`Busy`, EADDRINUSE), not at the listen. Released when the id is destroyed.
    /// Reply: [`CmReply::Port`].
    Bind {
        /// The id.
        id: Handle,
        /// `rdma_port_space`.
        port_space: u16,
        /// The port.
        port: u16,
    },
}

/// What the peer sent, for an event (`rdma_cm_event.param.conn`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventConn {
    /// Private data: after the IP CM header for a REQ, the whole field otherwise.
    pub private_data: Vec<u8>,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control bit.
    pub flow_control: bool,
    /// Retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ bit.
    pub srq: bool,
    /// The peer's QPN.
    pub qp_num: u32,
    /// The peer's starting PSN.
    pub psn: u32,
}

/// One CM event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventMsg {
    /// The id (for a connection request: the new id, created on the listener's
    /// channel).
    pub id: Handle,
    /// For a connection request: the listener.
    pub listen_id: Option<Handle>,
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// 0, the REJ reason, or a negative errno.
    pub status: i32,
    /// The peer's parameters.
    pub conn: Option<CmEventConn>,
    /// For a connection request: the requester's IP and source port (IP CM header).
    pub peer: Option<SocketAddr>,
    /// For a connection request: our address it was sent to.
    pub local: Option<SocketAddr>,
    /// For a connection request: its listener's port space and QP type, which the new
    /// id takes (as Linux's `ucma_process_conn_req` gives it the listener's).
    #[serde(default)]
    pub space: Option<(u16, QpType)>,
    /// UD (`RDMA_PS_UDP`): the service's QP (ESTABLISHED) or the requester's NIC
    /// (CONNECT_REQUEST, QPN 0).
    #[serde(default)]
    pub ud: Option<CmEventUd>,
}

/// What a UD event tells (`rdma_cm_event.param.ud`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventUd {
    /// The peer's UD QP (0 in a CONNECT_REQUEST).
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Its NIC (IP and RoCE UDP port).
    pub dest: SocketAddr,
    /// The traffic class of the address: the id's TOS (`CmRequest::SetTos`) on the
    /// active side's ESTABLISHED, as Linux's CM puts the route's in `ah_attr`; 0 in a
    /// CONNECT_REQUEST.
    pub traffic_class: u8,
}

/// A CM reply (inside [`super::Reply::Cm`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmReply {
    /// To OpenChannel.
    Channel {
        /// The channel's handle.
        channel: Handle,
    },
    /// To CreateId.
    Id {
        /// The id's handle.
        id: Handle,
    },
    /// To Listen: the port listened on.
    Port {
        /// The port.
        port: u16,
    },
    /// To GetEvents, oldest first.
    Events(Vec<CmEventMsg>),
    /// To QpAttrs: INIT → RTR and RTR → RTS, exactly what the NIC applies to a QP it
    /// moves itself (`remote` is the peer NIC).
    QpAttrs {
        /// INIT → RTR.
        rtr: QpAttr,
        /// RTR → RTS.
        rts: QpAttr,
    },
}

#[cfg(test)]
mod tests {
    use super::super::{encode, Reply};
    use super::*;

    /// [`MAX_EVENTS_PER_REPLY`] of the longest events there are (private data longer
    /// than any CM message carries, every number at its widest, IPv6 addresses with
    /// scope IDs) encode as one frame.
    #[test]
    fn a_full_events_answer_fits_a_control_frame() {
        let v6: SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535"
            .parse()
            .unwrap();
        let widest = CmEventMsg {
            id: Handle::MAX,
            listen_id: Some(Handle::MAX),
            kind: u32::MAX,
            status: i32::MIN,
            conn: Some(CmEventConn {
                private_data: vec![255; 256],
                responder_resources: u8::MAX,
                initiator_depth: u8::MAX,
                flow_control: true,
                retry_count: u8::MAX,
                rnr_retry_count: u8::MAX,
                srq: true,
                qp_num: u32::MAX,
                psn: u32::MAX,
            }),
            peer: Some(v6),
            local: Some(v6),
            space: Some((u16::MAX, QpType::XrcRecv)),
            ud: Some(CmEventUd {
                qp_num: u32::MAX,
                qkey: u32::MAX,
                dest: v6,
                traffic_class: u8::MAX,
            }),
        };
        let answer = Reply::Cm(CmReply::Events(vec![widest; MAX_EVENTS_PER_REPLY]));
        let frame = encode(&super::super::Response::Ok(answer)).expect("fits one frame");
        assert!(frame.len() <= super::super::MAX_FRAME, "{}", frame.len());
    }
}
