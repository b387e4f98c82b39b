//! Service ID resolution (IBTA 12.11): SIDR REQ (table 119) asks which UD QP and Q_Key
//! serve a service ID; SIDR REP (table 120) answers. `rdma_cm` uses it for
//! `RDMA_PS_UDP`.

use super::field::*;

/// Bytes of private data in a SIDR REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Bytes of private data in a SIDR REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of additional information in a SIDR REP.
pub const SIDR_REP_INFO_LEN: usize = 72;

/// A SIDR REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    /// The requester's ID for this request.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data, zero-padded.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Reads a SIDR REQ from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> SidrReqRepr {
        SidrReqRepr {
            request_id: get_u32(b, 0),
            pkey: get_u16(b, 4),
            service_id: get_u64(b, 8),
            private_data: get_array(b, 16),
        }
    }

    /// Writes the SIDR REQ into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.request_id);
        put_u16(b, 4, self.pkey);
        put_u64(b, 8, self.service_id);
        put_slice(b, 16, &self.private_data);
    }
}

/// SIDR REP status (IBTA table 121).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QP and Q_Key are valid.
    pub const OK: SidrStatus = SidrStatus(0);
    /// Nobody serves the service ID.
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// The service refused.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// No QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
}

/// A SIDR REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    /// The request's ID.
    pub request_id: u32,
    /// The answer.
    pub status: SidrStatus,
    /// Meaningful bytes of `additional_info`.
    pub additional_info_length: u8,
    /// Vendor ID (24 bits, bytes 6, 7 and 11).
    pub vendor_id: u32,
    /// The service's UD QP (24 bits).
    pub qpn: u32,
    /// The service ID answered.
    pub service_id: u64,
    /// The service QP's Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub additional_info: [u8; SIDR_REP_INFO_LEN],
    /// Private data, zero-padded.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Reads a SIDR REP from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> SidrRepRepr {
        SidrRepRepr {
            request_id: get_u32(b, 0),
            status: SidrStatus(get_u8(b, 4)),
            additional_info_length: get_u8(b, 5),
            vendor_id: u32::from(get_u16(b, 6)) << 8 | u32::from(get_u8(b, 11)),
            qpn: get_u24(b, 8),
            service_id: get_u64(b, 12),
            qkey: get_u32(b, 20),
            additional_info: get_array(b, 24),
            private_data: get_array(b, 96),
        }
    }

    /// Writes the SIDR REP into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.request_id);
        put_u8(b, 4, self.status.0);
        put_u8(b, 5, self.additional_info_length);
        put_u16(b, 6, (self.vendor_id >> 8) as u16);
        put_u24(b, 8, self.qpn);
        put_u8(b, 11, self.vendor_id as u8);
        put_u64(b, 12, self.service_id);
        put_u32(b, 20, self.qkey);
        put_slice(b, 24, &self.additional_info);
        put_slice(b, 96, &self.private_data);
    }
}
