//! RoCEv2 packet formats, byte-exact.
//!
//! `wire` reads and writes the packets a RoCEv2 RNIC puts inside UDP datagrams on port
//! 4791: the Base Transport Header (BTH), its extension headers, the payload with its pad
//! bytes, and the 32-bit Invariant CRC (ICRC). It does no I/O, never panics on any input
//! given to a checked constructor or `parse`, and never allocates.
//!
//! # Two layers (the smoltcp `wire` pattern)
//!
//! * **Packet views** — [`Bth<T>`](bth::Bth), [`Reth<T>`](reth::Reth), … — are thin,
//!   zero-copy wrappers over a byte buffer `T: AsRef<[u8]>` with one accessor (and, for
//!   `T: AsMut<[u8]>`, one setter) per field. `new_checked` rejects a buffer too short
//!   for the header; after that, every accessor is in bounds.
//! * **Representations** — [`BthRepr`](bth::BthRepr), … , and the whole-packet
//!   [`PacketRepr`](packet::PacketRepr) — are plain owned structs with `parse` (from a
//!   view) and `emit` (into a view). They are what the transport logic works with.
//!
//! Which extension headers follow the BTH is decided by the opcode alone, and that
//! knowledge lives in one table, [`opcode::OPCODES`], not in `match` arms scattered over
//! the code (the model is `rxe_opcode.c` in Linux).
//!
//! # Layout of a RoCEv2 datagram (IBTA Annex A17)
//!
//! ```text
//! | Eth | IPv4/IPv6 | UDP dst 4791 | BTH | ext headers… | payload | pad | ICRC |
//!                                  `------------ UDP payload --------------'
//! ```
//!
//! [`frame`] parses the outer layers of a captured frame; [`icrc`] computes and verifies
//! the ICRC, which covers parts of the IP and UDP headers as well.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod error;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod packet;
pub mod reth;
pub mod types;
pub mod xrceth;

mod bytes;
mod view;

pub use aeth::{Aeth, AethRepr, NakCode, Syndrome};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use error::{Error, Layer, Result};
pub use feth::{Feth, FethRepr};
pub use icrc::{IcrcParams, IpParams};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{Header, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{PacketRepr, ParsedPacket};
pub use reth::{Reth, RethRepr};
pub use types::{Msn, Psn, Qpn};
pub use xrceth::{XrcEth, XrcEthRepr};

/// The IANA-assigned UDP destination port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Length of the ICRC trailer in bytes.
pub const ICRC_LEN: usize = 4;
