//! ConnectRequest (REQ, IBTA 12.6.5, table 106): what the active side asks for — its QP,
//! starting PSN, RDMA read resources, timeouts and retry counts, the path, and 92 bytes
//! of private data (where the RDMA IP CM service puts its [`super::CmaHeader`]).

use super::field::*;

/// Bytes of private data in a REQ.
pub const PRIVATE_DATA_LEN: usize = 92;
const PRIVATE_DATA_AT: usize = 140;
const PRIMARY_PATH_AT: usize = 52;
const ALTERNATE_PATH_AT: usize = 96;

/// One path of a REQ (primary at byte 52, alternate at byte 96): 44 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID (0xFFFF, the permissive LID, on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID: the active side's address (`::ffff:a.b.c.d` for IPv4).
    pub local_gid: [u8; 16],
    /// Remote port GID: the passive side's address.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA table 205 encoding).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

impl PathRepr {
    fn parse(b: &[u8], at: usize) -> PathRepr {
        PathRepr {
            local_lid: get_u16(b, at),
            remote_lid: get_u16(b, at + 2),
            local_gid: get_array(b, at + 4),
            remote_gid: get_array(b, at + 20),
            flow_label: get_u32(b, at + 36) >> 12,
            packet_rate: get_bits(b, at + 39, 2, 6),
            traffic_class: get_u8(b, at + 40),
            hop_limit: get_u8(b, at + 41),
            sl: get_bits(b, at + 42, 0, 4),
            subnet_local: get_flag(b, at + 42, 4),
            local_ack_timeout: get_bits(b, at + 43, 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8], at: usize) {
        put_u16(b, at, self.local_lid);
        put_u16(b, at + 2, self.remote_lid);
        put_slice(b, at + 4, &self.local_gid);
        put_slice(b, at + 20, &self.remote_gid);
        put_u32(b, at + 36, (self.flow_label & 0xF_FFFF) << 12);
        put_bits(b, at + 39, 2, 6, self.packet_rate);
        put_u8(b, at + 40, self.traffic_class);
        put_u8(b, at + 41, self.hop_limit);
        put_bits(b, at + 42, 0, 4, self.sl);
        put_flag(b, at + 42, 4, self.subnet_local);
        put_bits(b, at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// A REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// The active side's communication ID for this connection.
    pub local_comm_id: u32,
    /// Vendor ID (24 bits; Linux's ECE vendor ID, usually 0).
    pub vendor_id: u32,
    /// The service asked for ([`super::ip_service_id`] for `rdma_cm`).
    pub service_id: u64,
    /// The active side's CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (unused for RC; 0).
    pub local_qkey: u32,
    /// The active side's QP number (24 bits).
    pub local_qpn: u32,
    /// RDMA READ/atomics the active side serves at once.
    pub responder_resources: u8,
    /// Local EE context (RD only; 0).
    pub local_eecn: u32,
    /// RDMA READ/atomics the active side issues at once.
    pub initiator_depth: u8,
    /// Remote EE context (RD only; 0).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer, 4.096 µs × 2^n (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits): 0 RC, 1 UC, 3 extended.
    pub transport_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The first PSN the active side sends (24 bits).
    pub starting_psn: u32,
    /// How long the active side takes to answer, 4.096 µs × 2^n (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBTA encoding: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// How many times the CM will resend this REQ (4 bits).
    pub max_cm_retries: u8,
    /// The active side's QP takes receives from an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 0 unless XRC).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary: PathRepr,
    /// The alternate path (all zero: none).
    pub alternate: PathRepr,
    /// SAP supported (byte 139, bit 5).
    pub sap_supported: bool,
    /// Private data, zero-padded.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Reads a REQ from the 232 bytes after the MAD header (never panics: a short
    /// buffer reads as zeros; [`super::CmMadRepr::parse`] checks the length first).
    pub fn parse(b: &[u8]) -> ReqRepr {
        ReqRepr {
            local_comm_id: get_u32(b, 0),
            vendor_id: get_u24(b, 5),
            service_id: get_u64(b, 8),
            local_ca_guid: get_u64(b, 16),
            local_qkey: get_u32(b, 28),
            local_qpn: get_u24(b, 32),
            responder_resources: get_u8(b, 35),
            local_eecn: get_u24(b, 36),
            initiator_depth: get_u8(b, 39),
            remote_eecn: get_u24(b, 40),
            remote_cm_response_timeout: get_bits(b, 43, 0, 5),
            transport_type: get_bits(b, 43, 5, 2),
            end_to_end_flow_control: get_flag(b, 43, 7),
            starting_psn: get_u24(b, 44),
            local_cm_response_timeout: get_bits(b, 47, 0, 5),
            retry_count: get_bits(b, 47, 5, 3),
            pkey: get_u16(b, 48),
            path_mtu: get_bits(b, 50, 0, 4),
            rdc_exists: get_flag(b, 50, 4),
            rnr_retry_count: get_bits(b, 50, 5, 3),
            max_cm_retries: get_bits(b, 51, 0, 4),
            srq: get_flag(b, 51, 4),
            extended_transport_type: get_bits(b, 51, 5, 3),
            primary: PathRepr::parse(b, PRIMARY_PATH_AT),
            alternate: PathRepr::parse(b, ALTERNATE_PATH_AT),
            sap_supported: get_flag(b, ALTERNATE_PATH_AT + 43, 5),
            private_data: get_array(b, PRIVATE_DATA_AT),
        }
    }

    /// Writes the REQ into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u24(b, 5, self.vendor_id);
        put_u64(b, 8, self.service_id);
        put_u64(b, 16, self.local_ca_guid);
        put_u32(b, 28, self.local_qkey);
        put_u24(b, 32, self.local_qpn);
        put_u8(b, 35, self.responder_resources);
        put_u24(b, 36, self.local_eecn);
        put_u8(b, 39, self.initiator_depth);
        put_u24(b, 40, self.remote_eecn);
        put_bits(b, 43, 0, 5, self.remote_cm_response_timeout);
        put_bits(b, 43, 5, 2, self.transport_type);
        put_flag(b, 43, 7, self.end_to_end_flow_control);
        put_u24(b, 44, self.starting_psn);
        put_bits(b, 47, 0, 5, self.local_cm_response_timeout);
        put_bits(b, 47, 5, 3, self.retry_count);
        put_u16(b, 48, self.pkey);
        put_bits(b, 50, 0, 4, self.path_mtu);
        put_flag(b, 50, 4, self.rdc_exists);
        put_bits(b, 50, 5, 3, self.rnr_retry_count);
        put_bits(b, 51, 0, 4, self.max_cm_retries);
        put_flag(b, 51, 4, self.srq);
        put_bits(b, 51, 5, 3, self.extended_transport_type);
        self.primary.emit(b, PRIMARY_PATH_AT);
        self.alternate.emit(b, ALTERNATE_PATH_AT);
        put_flag(b, ALTERNATE_PATH_AT + 43, 5, self.sap_supported);
        put_slice(b, PRIVATE_DATA_AT, &self.private_data);
    }
}
