//! ConnectReply (REP, IBTA 12.6.8, table 110): the passive side's QP, starting PSN and
//! resources, answering a REQ; 196 bytes of private data.

use super::field::*;

/// Bytes of private data in a REP.
pub const PRIVATE_DATA_LEN: usize = 196;
const PRIVATE_DATA_AT: usize = 36;

/// A REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// The passive side's communication ID.
    pub local_comm_id: u32,
    /// The active side's communication ID (from the REQ).
    pub remote_comm_id: u32,
    /// Local Q_Key (unused for RC).
    pub local_qkey: u32,
    /// The passive side's QP number (24 bits).
    pub local_qpn: u32,
    /// Local EE context (RD only).
    pub local_eecn: u32,
    /// The first PSN the passive side sends (24 bits).
    pub starting_psn: u32,
    /// Vendor ID (24 bits, bytes 15, 19 and 23; Linux's ECE, usually 0).
    pub vendor_id: u32,
    /// RDMA READ/atomics the passive side serves at once.
    pub responder_resources: u8,
    /// RDMA READ/atomics the passive side issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The passive side's QP takes receives from an SRQ.
    pub srq: bool,
    /// The passive side's CA GUID.
    pub local_ca_guid: u64,
    /// Private data, zero-padded.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Reads a REP from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> RepRepr {
        RepRepr {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            local_qkey: get_u32(b, 8),
            local_qpn: get_u24(b, 12),
            local_eecn: get_u24(b, 16),
            starting_psn: get_u24(b, 20),
            vendor_id: u32::from(get_u8(b, 15)) << 16
                | u32::from(get_u8(b, 19)) << 8
                | u32::from(get_u8(b, 23)),
            responder_resources: get_u8(b, 24),
            initiator_depth: get_u8(b, 25),
            target_ack_delay: get_bits(b, 26, 0, 5),
            failover_accepted: get_bits(b, 26, 5, 2),
            end_to_end_flow_control: get_flag(b, 26, 7),
            rnr_retry_count: get_bits(b, 27, 0, 3),
            srq: get_flag(b, 27, 3),
            local_ca_guid: get_u64(b, 28),
            private_data: get_array(b, PRIVATE_DATA_AT),
        }
    }

    /// Writes the REP into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_u32(b, 8, self.local_qkey);
        put_u24(b, 12, self.local_qpn);
        put_u8(b, 15, (self.vendor_id >> 16) as u8);
        put_u24(b, 16, self.local_eecn);
        put_u8(b, 19, (self.vendor_id >> 8) as u8);
        put_u24(b, 20, self.starting_psn);
        put_u8(b, 23, self.vendor_id as u8);
        put_u8(b, 24, self.responder_resources);
        put_u8(b, 25, self.initiator_depth);
        put_bits(b, 26, 0, 5, self.target_ack_delay);
        put_bits(b, 26, 5, 2, self.failover_accepted);
        put_flag(b, 26, 7, self.end_to_end_flow_control);
        put_bits(b, 27, 0, 3, self.rnr_retry_count);
        put_flag(b, 27, 3, self.srq);
        put_u64(b, 28, self.local_ca_guid);
        put_slice(b, PRIVATE_DATA_AT, &self.private_data);
    }
}
