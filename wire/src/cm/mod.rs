//! Communication Management MADs (IBTA Vol 1 ch. 12 and 13.4), as the Linux CM (`ib_cm`)
//! and hardware RNICs send them on the GSI QP (QP1) in UD SEND Only packets with
//! Q_Key [`crate::deth::GSI_QKEY`].
//!
//! A MAD is always 256 bytes (IBTA 13.4.2): the 24-byte common header ([`Mad`],
//! [`MadHeaderRepr`]) and 232 bytes of message. [`CmMadRepr`] is a whole CM MAD; its
//! [`CmMessage`] is one of REQ ([`ReqRepr`]), MRA/REJ ([`MraRepr`], [`RejRepr`]), REP
//! ([`RepRepr`]), RTU/DREQ/DREP ([`RtuRepr`], [`DreqRepr`], [`DrepRepr`]) and SIDR
//! REQ/REP ([`SidrReqRepr`], [`SidrRepRepr`]). Every field is kept, reserved bits are
//! ignored on parse (IBTA 13.4.2: "reserved fields … shall be ignored by the receiver")
//! and written as zero, so the MADs of the rxe capture re-emit byte for byte.
//!
//! The RDMA IP CM service (IBTA Annex A11, what `rdma_cm` uses) adds [`CmaHeader`] at
//! the start of a REQ's private data and [`ip_service_id`] as the REQ's service ID.
//!
//! Parsing never panics and never allocates; private data is kept in fixed arrays of
//! the field's size (the MAD does not carry its length: it is zero-padded).

mod field;
mod ip;
mod rej;
mod rep;
mod req;
mod short;
mod sidr;

pub use ip::{ip_service_id, service_port_space, CmaHeader, CMA_HEADER_LEN};
pub use rej::{MessageKind, MraRepr, RejReason, RejRepr};
pub use rej::{MRA_PRIVATE_DATA_LEN, REJ_PRIVATE_DATA_LEN};
pub use rep::{RepRepr, PRIVATE_DATA_LEN as REP_PRIVATE_DATA_LEN};
pub use req::{PathRepr, ReqRepr, PRIVATE_DATA_LEN as REQ_PRIVATE_DATA_LEN};
pub use short::{DrepRepr, DreqRepr, RtuRepr, DREQ_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN};
pub use sidr::{SidrRepRepr, SidrReqRepr, SidrStatus};
pub use sidr::{SIDR_REP_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN};

use crate::error::{Error, Layer, Result};
use crate::view::header_view;
use field::*;

header_view!(
    /// A zero-copy view of a 256-byte MAD: the common header accessors and the
    /// 232-byte message ([`Mad::data`]).
    Mad,
    Layer::Mad,
    256
);

/// Bytes in a MAD (IBTA 13.4.2).
pub const MAD_LEN: usize = HEADER_LEN;
/// Bytes in the MAD common header (IBTA 13.4.2, table 145).
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of message after the common header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// MAD base version (IBTA 13.4.2: 1).
pub const MAD_BASE_VERSION: u8 = 1;
/// Management class of the communication manager (IBTA 13.4.4, table 146).
pub const CM_MGMT_CLASS: u8 = 0x07;
/// The CM class version Linux and IBTA 1.2+ use.
pub const CM_CLASS_VERSION: u8 = 2;
/// The only method CM messages use: Send (IBTA 12.6.2).
pub const CM_METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (IBTA 12.6, table 104), one per message.
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (not read by softnic).
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (not read by softnic).
    pub const APR: u16 = 0x001A;
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Base version.
    pub fn base_version(&self) -> u8 {
        get_u8(self.buffer.as_ref(), 0)
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        get_u8(self.buffer.as_ref(), 1)
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        get_u8(self.buffer.as_ref(), 2)
    }
    /// Method (R bit included).
    pub fn method(&self) -> u8 {
        get_u8(self.buffer.as_ref(), 3)
    }
    /// Status.
    pub fn status(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }
    /// Class-specific.
    pub fn class_specific(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }
    /// Transaction ID.
    pub fn transaction_id(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 8)
    }
    /// Attribute ID: which CM message.
    pub fn attribute_id(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 16)
    }
    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 20)
    }
    /// The 232 bytes after the common header (fewer if unchecked and short).
    pub fn data(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(MAD_HEADER_LEN..MAD_LEN)
            .unwrap_or(&[])
    }
}

/// The MAD common header (IBTA 13.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeaderRepr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class (0x07 for the CM).
    pub mgmt_class: u8,
    /// Class version (2).
    pub class_version: u8,
    /// Method (0x03 Send).
    pub method: u8,
    /// Status (0 in CM messages).
    pub status: u16,
    /// Class-specific (0 in CM messages).
    pub class_specific: u16,
    /// Transaction ID: the same for a message and its retransmissions, chosen by the
    /// sender of a REQ/DREQ/SIDR REQ; replies reuse the request's.
    pub transaction_id: u64,
    /// Attribute ID (see [`attr`]).
    pub attribute_id: u16,
    /// Attribute modifier (0 in CM messages).
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// A CM header (base version 1, class 0x07 version 2, method Send) for `attribute_id`.
    pub fn cm(attribute_id: u16, transaction_id: u64) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_MGMT_CLASS,
            class_version: CM_CLASS_VERSION,
            method: CM_METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Reads the header of a checked view.
    pub fn parse<T: AsRef<[u8]>>(v: &Mad<T>) -> Result<MadHeaderRepr> {
        crate::error::check_len(Layer::Mad, v.header_bytes(), MAD_LEN)?;
        Ok(MadHeaderRepr {
            base_version: v.base_version(),
            mgmt_class: v.mgmt_class(),
            class_version: v.class_version(),
            method: v.method(),
            status: v.status(),
            class_specific: v.class_specific(),
            transaction_id: v.transaction_id(),
            attribute_id: v.attribute_id(),
            attribute_modifier: v.attribute_modifier(),
        })
    }

    fn emit(&self, b: &mut [u8]) {
        put_u8(b, 0, self.base_version);
        put_u8(b, 1, self.mgmt_class);
        put_u8(b, 2, self.class_version);
        put_u8(b, 3, self.method);
        put_u16(b, 4, self.status);
        put_u16(b, 6, self.class_specific);
        put_u64(b, 8, self.transaction_id);
        put_u16(b, 16, self.attribute_id);
        put_u16(b, 18, 0);
        put_u32(b, 20, self.attribute_modifier);
    }
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a MAD is 256 bytes; boxing would allocate
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The message's attribute ID.
    pub fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as IBTA and Wireshark give it.
    pub fn name(&self) -> &'static str {
        attribute_name(self.attribute_id())
    }
}

/// The name of a CM attribute ID ("ConnectRequest" …), or "unknown".
pub fn attribute_name(id: u16) -> &'static str {
    match id {
        attr::REQ => "ConnectRequest",
        attr::MRA => "MsgRcptAck",
        attr::REJ => "ConnectReject",
        attr::REP => "ConnectReply",
        attr::RTU => "ReadyToUse",
        attr::DREQ => "DisconnectRequest",
        attr::DREP => "DisconnectReply",
        attr::SIDR_REQ => "ServiceIDResReq",
        attr::SIDR_REP => "ServiceIDResReqResp",
        attr::LAP => "LoadAlternatePath",
        attr::APR => "AlternatePathResponse",
        _ => "unknown",
    }
}

/// A whole CM MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMadRepr {
    /// The common header. On emit, its attribute ID is taken from `msg`.
    pub header: MadHeaderRepr,
    /// The message.
    pub msg: CmMessage,
}

impl CmMadRepr {
    /// A CM MAD with a fresh header for `msg`.
    pub fn new(transaction_id: u64, msg: CmMessage) -> CmMadRepr {
        CmMadRepr {
            header: MadHeaderRepr::cm(msg.attribute_id(), transaction_id),
            msg,
        }
    }

    /// Parses a MAD (the UD payload of a packet to QP1). Refuses anything that is not
    /// a CM message of base version 1, class version 2, method Send, with an attribute
    /// softnic reads (LAP/APR are refused: softnic has no alternate paths).
    pub fn parse(buf: &[u8]) -> Result<CmMadRepr> {
        let v = Mad::new_checked(buf)?;
        let header = MadHeaderRepr::parse(&v)?;
        if header.base_version != MAD_BASE_VERSION {
            return Err(Error::BadMad("base version is not 1"));
        }
        if header.mgmt_class != CM_MGMT_CLASS {
            return Err(Error::BadMad("management class is not the CM's (0x07)"));
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(Error::BadMad("CM class version is not 2"));
        }
        if header.method != CM_METHOD_SEND {
            return Err(Error::BadMad("method is not Send"));
        }
        let d = v.data();
        let msg = match header.attribute_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(d)),
            attr::MRA => CmMessage::Mra(MraRepr::parse(d)),
            attr::REJ => CmMessage::Rej(RejRepr::parse(d)),
            attr::REP => CmMessage::Rep(RepRepr::parse(d)),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(d)),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(d)),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(d)),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(d)),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(d)),
            _ => return Err(Error::BadMad("attribute is not a CM message softnic reads")),
        };
        Ok(CmMadRepr { header, msg })
    }

    /// Writes the 256-byte MAD into `buf`; returns [`MAD_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let Some(b) = buf.get_mut(..MAD_LEN) else {
            return Err(Error::BufferTooSmall {
                need: MAD_LEN,
                have: buf.len(),
            });
        };
        b.fill(0);
        let mut header = self.header;
        header.attribute_id = self.msg.attribute_id();
        header.emit(b);
        let (_, d) = b.split_at_mut(MAD_HEADER_LEN);
        match &self.msg {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
        }
        Ok(MAD_LEN)
    }
}

#[cfg(test)]
mod tests;
