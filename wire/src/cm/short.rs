//! The three messages that are two communication IDs and private data: ReadyToUse
//! (RTU, IBTA 12.6.9, table 111), DisconnectRequest (DREQ, 12.6.10, table 112, which
//! also names the receiver's QP) and DisconnectReply (DREP, 12.6.11, table 113).

use super::field::*;

/// Bytes of private data in an RTU or a DREP.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Bytes of private data in a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

/// An RTU: the active side has moved its QP to RTS; the passive side may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtuRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, zero-padded.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

/// A DREP: the answer to a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrepRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, zero-padded.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

macro_rules! two_ids_and_data {
    ($t:ident, $what:literal) => {
        impl $t {
            #[doc = concat!("Reads ", $what, " from the 232 bytes after the MAD header (never panics).")]
            pub fn parse(b: &[u8]) -> $t {
                $t {
                    local_comm_id: get_u32(b, 0),
                    remote_comm_id: get_u32(b, 4),
                    private_data: get_array(b, 8),
                }
            }

            #[doc = concat!("Writes ", $what, " into a zeroed 232-byte message buffer.")]
            pub(crate) fn emit(&self, b: &mut [u8]) {
                put_u32(b, 0, self.local_comm_id);
                put_u32(b, 4, self.remote_comm_id);
                put_slice(b, 8, &self.private_data);
            }
        }
    };
}

two_ids_and_data!(RtuRepr, "an RTU");
two_ids_and_data!(DrepRepr, "a DREP");

/// A DREQ: the sender is leaving the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP number (24 bits): what the receiver checks it is its own.
    pub remote_qpn: u32,
    /// Private data, zero-padded.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Reads a DREQ from the 232 bytes after the MAD header (never panics).
    pub fn parse(b: &[u8]) -> DreqRepr {
        DreqRepr {
            local_comm_id: get_u32(b, 0),
            remote_comm_id: get_u32(b, 4),
            remote_qpn: get_u24(b, 8),
            private_data: get_array(b, 12),
        }
    }

    /// Writes the DREQ into a zeroed 232-byte message buffer.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        put_u32(b, 0, self.local_comm_id);
        put_u32(b, 4, self.remote_comm_id);
        put_u24(b, 8, self.remote_qpn);
        put_slice(b, 12, &self.private_data);
    }
}
