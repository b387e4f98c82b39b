//! Parse errors. Every way a buffer can be rejected has its own variant, so that a NIC
//! can count drops by reason and a decoder can say exactly what was wrong.

use core::fmt;

/// The header (or layer) an error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Ethernet II header.
    Ethernet,
    /// IEEE 802.1Q VLAN tag.
    Vlan,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// Base Transport Header.
    Bth,
    /// RDMA Extended Transport Header.
    Reth,
    /// ACK Extended Transport Header.
    Aeth,
    /// Datagram Extended Transport Header.
    Deth,
    /// Immediate data.
    ImmDt,
    /// Invalidate Extended Transport Header.
    Ieth,
    /// Atomic Extended Transport Header.
    AtomicEth,
    /// Atomic ACK Extended Transport Header.
    AtomicAckEth,
    /// Flush Extended Transport Header.
    Feth,
    /// XRC Extended Transport Header.
    XrcEth,
    /// Congestion Notification Packet body.
    Cnp,
    /// The payload, pad bytes and ICRC.
    Payload,
    /// A management datagram (IBTA 13.4: 24-byte common header + 232 bytes of data).
    Mad,
}

/// Why a buffer was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the header does.
    Truncated {
        /// Which header was cut short.
        layer: Layer,
        /// Bytes the header needs from its start.
        need: usize,
        /// Bytes available from its start.
        have: usize,
    },
    /// The BTH opcode is not one softnic knows: a reserved code of any transport, an RD
    /// opcode, or a vendor-specific one (IBTA 9.2 table 38). XRC opcodes are known.
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0 (IBTA 9.2: TVer must be 0).
    BadTver(u8),
    /// The pad count does not fit the payload, or payload + pad is not a multiple of 4
    /// (IBTA 9.2: the padded payload is a whole number of 4-byte words).
    BadPad {
        /// Pad count from the BTH.
        pad: u8,
        /// Bytes between the last header and the ICRC.
        padded_len: usize,
    },
    /// An opcode that carries no payload arrived with payload bytes.
    UnexpectedPayload {
        /// The opcode.
        opcode: u8,
        /// Bytes that should not be there.
        len: usize,
    },
    /// The ICRC does not match the packet.
    BadIcrc {
        /// ICRC computed over the packet.
        computed: u32,
        /// ICRC carried by the packet.
        carried: u32,
    },
    /// An outer header is not what a RoCEv2 frame carries (not IP, not UDP, wrong port,
    /// fragmented, inconsistent lengths).
    NotRoce(&'static str),
    /// The output buffer is too small for `emit`.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// A representation is inconsistent with its opcode (e.g. a RETH given for an
    /// opcode that does not carry one), so it cannot be emitted.
    Inconsistent(&'static str),
    /// A MAD on QP1 that is not a CM message softnic reads (wrong base or class
    /// version, another management class, an attribute the CM does not define).
    BadMad(&'static str),
}

/// Result of a wire operation.
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { layer, need, have } => {
                write!(f, "truncated {layer:?}: need {need} bytes, have {have}")
            }
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::BadTver(v) => write!(f, "BTH transport version {v} (must be 0)"),
            Error::BadPad { pad, padded_len } => {
                write!(
                    f,
                    "pad count {pad} inconsistent with {padded_len} payload bytes"
                )
            }
            Error::UnexpectedPayload { opcode, len } => {
                write!(
                    f,
                    "opcode {opcode:#04x} carries no payload but has {len} bytes"
                )
            }
            Error::BadIcrc { computed, carried } => {
                write!(
                    f,
                    "ICRC mismatch: computed {computed:#010x}, carried {carried:#010x}"
                )
            }
            Error::NotRoce(why) => write!(f, "not a RoCEv2 frame: {why}"),
            Error::BufferTooSmall { need, have } => {
                write!(f, "output buffer too small: need {need}, have {have}")
            }
            Error::Inconsistent(why) => write!(f, "inconsistent packet representation: {why}"),
            Error::BadMad(why) => write!(f, "not a CM MAD softnic reads: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Checks that `buf` holds at least `need` bytes for `layer`.
pub(crate) fn check_len(layer: Layer, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            layer,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
