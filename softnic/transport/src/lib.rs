//! Sans-IO RoCEv2 transport: queue-pair state machines driven by packets, work requests
//! and the current time.
//!
//! Nothing in this crate touches a socket, a clock or shared memory. A [`qp::Qp`] takes
//! * work requests ([`wr::SendWr`], [`wr::RecvWr`]) already copied and validated by the
//!   NIC,
//! * parsed packets ([`wire::ParsedPacket`]) addressed to it,
//! * the current time ([`time::Instant`]), passed in by the caller,
//!
//! and gives back packets to send, completions, and the next instant at which it wants
//! [`qp::Qp::handle_timeout`] called. Registered memory is reached through the
//! [`memory::Memory`] trait, which the NIC implements over its shared-memory mappings and
//! tests implement over plain vectors. This is the quinn-proto model: loss, reordering,
//! duplication and timeouts are unit-testable, deterministic, with no sockets and no
//! sleeps.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cm;
pub mod crc;
pub mod memory;
pub mod qp;
pub mod sgl;
pub mod srq;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod wr;
