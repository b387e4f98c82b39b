//! ConnectReject (REJ, IBTA 12.6.7, table 108) and MsgRcptAck (MRA, IBTA 12.6.6, table
//! 107): the two messages that answer "which message" with a 2-bit [`MessageKind`].

use super::field::*;

/// Bytes of private data in a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of additional rejection information in a REJ.
pub const REJ_ARI_LEN: usize = 72;
/// Bytes of private data in an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

/// Which message a REJ rejects or an MRA acknowledges (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageKind {
    /// The REQ.
    #[default]
    Req,
    /// The REP.
    Rep,
    /// Another message (a LAP for MRA; "no message" for a REJ in some states).
    Other,
    /// The reserved value 3.
    Reserved,
}

impl MessageKind {
    fn from_bits(v: u8) -> MessageKind {
        match v {
            0 => MessageKind::Req,
            1 => MessageKind::Rep,
            2 => MessageKind::Other,
            _ => MessageKind::Reserved,
        }
    }
    fn bits(self) -> u8 {
        match self {
            MessageKind::Req => 0,
            MessageKind::Rep => 1,
            MessageKind::Other => 2,
            MessageKind::Reserved => 3,
        }
    }
}

/// A REJ reason (IBTA 12.6.7.2, table 109).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available.
    pub const NO_QP: RejReason = RejReason(1);
    /// No resources.
    pub const NO_RESOURCES: RejReason = RejReason(3);
    /// Timeout: the sender gave up waiting for an answer.
    pub const TIMEOUT: RejReason = RejReason(4);
    /// Unsupported request.
    pub const UNSUPPORTED: RejReason = RejReason(5);
    /// Invalid communication ID: the message names no connection the sender knows.
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: RejReason = RejReason(7);
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    /// Stale connection: the QP or comm ID is still in use by an earlier connection.
    pub const STALE_CONN: RejReason = RejReason(10);
    /// Invalid GID.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// Invalid path MTU.
    pub const INVALID_MTU: RejReason = RejReason(26);
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: RejReason = RejReason(27);
    /// Consumer reject (`rdma_reject`).
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: RejReason = RejReason(29);
    /// Duplicate local comm ID.
    pub const DUPLICATE_LOCAL_COMM_ID: RejReason = RejReason(30);
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: RejReason = RejReason(31);

    /// The name IBTA gives the reason, or "reason" for one softnic does not name.
    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid comm ID",
            7 => "invalid comm instance",
            8 => "invalid service ID",
            9 => "invalid transport type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            24 => "port CM redirect",
            25 => "port redirect",
            26 => "invalid MTU",
            27 => "insufficient responder resources",
            28 => "consumer reject",
            29 => "invalid RNR retry",
            30 => "duplicate local comm ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            _ => "reason",
        }
    }
}

/// A REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// The sender's communication ID (0 if it has none, e.g. no listener).
    pub local_comm_id: u32,
    /// The receiver's communication ID (from the rejected message).
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageKind,
    /// Bytes of `ari` that are meaningful (7 bits).
    pub reject_info_length: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional rejection information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data, zero-padded.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Reads a REJ from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> RejRepr {
        RejRepr {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            message_rejected: MessageKind::from_bits(get_bits(b, 8, 0, 2)),
            reject_info_length: get_bits(b, 9, 0, 7),
            reason: RejReason(get_u16(b, 10)),
            ari: get_array(b, 12),
            private_data: get_array(b, 84),
        }
    }

    /// Writes the REJ into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_bits(b, 8, 0, 2, self.message_rejected.bits());
        put_bits(b, 9, 0, 7, self.reject_info_length);
        put_u16(b, 10, self.reason.0);
        put_slice(b, 12, &self.ari);
        put_slice(b, 84, &self.private_data);
    }
}

/// An MRA: "your message arrived, the answer takes longer" (IBTA 12.6.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MessageKind,
    /// How long the answer may take, 4.096 µs × 2^n (5 bits).
    pub service_timeout: u8,
    /// Private data, zero-padded.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Reads an MRA from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> MraRepr {
        MraRepr {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            message_mraed: MessageKind::from_bits(get_bits(b, 8, 0, 2)),
            service_timeout: get_bits(b, 9, 0, 5),
            private_data: get_array(b, 10),
        }
    }

    /// Writes the MRA into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_bits(b, 8, 0, 2, self.message_mraed.bits());
        put_bits(b, 9, 0, 5, self.service_timeout);
        put_slice(b, 10, &self.private_data);
    }
}
