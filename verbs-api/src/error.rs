//! Errors: every variant says what was wrong, with the numbers involved.

use std::fmt;
use std::io;

use crate::abi::control::{ControlError, ErrorCode};
use crate::abi::{LayoutError, RingError};
use crate::qp::QpState;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed verbs call.
#[derive(Debug)]
pub enum Error {
    /// No NIC socket for this device name.
    NoDevice {
        /// Device name asked for.
        name: String,
        /// Where its socket was expected.
        path: std::path::PathBuf,
        /// Why connecting failed.
        source: io::Error,
    },
    /// An OS call failed.
    Io {
        /// What we were doing.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The control connection to the NIC failed (the NIC died or spoke garbage).
    Control(ControlError),
    /// The NIC refused a request.
    Nic {
        /// The verb (e.g. "ibv_modify_qp").
        verb: &'static str,
        /// Class.
        code: ErrorCode,
        /// The NIC's explanation.
        message: String,
    },
    /// The NIC answered with something that does not fit the request.
    Protocol(String),
    /// A bad argument, caught before asking the NIC.
    InvalidArgument(String),
    /// The object is still in use by others made from it (an XRC domain with SRQs or
    /// receive QPs opened through it), caught before asking the NIC: closing it now
    /// would leave them without their domain. The kernel's answer there is EBUSY.
    Busy(String),
    /// An illegal QP state transition or a verb not allowed in the current state.
    InvalidState {
        /// QP number.
        qpn: u32,
        /// State the QP is in.
        state: QpState,
        /// What was attempted.
        what: String,
    },
    /// A segment layout is impossible (too deep a queue, ...).
    Layout(LayoutError),
    /// A work request was refused; the ones before it were posted (`bad_wr` in verbs).
    Post {
        /// Index of the refused work request in the slice.
        index: usize,
        /// Its wr_id.
        wr_id: u64,
        /// Why.
        reason: PostError,
    },
    /// The completion ring is corrupt (the NIC misbehaved).
    Ring(RingError),
    /// The NIC process has exited (stopped, crashed or killed), as its life sign says
    /// (`os::life_sign`): an empty CQ's poll and every post fail with this.
    NicGone,
}

/// Why a work request could not be posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// The ring has no free slot (the NIC has not taken `capacity` earlier requests).
    QueueFull {
        /// Ring capacity.
        capacity: u32,
    },
    /// More SGEs than the QP was created with.
    TooManySge {
        /// SGEs given.
        count: usize,
        /// The QP's max_sge.
        max: u32,
    },
    /// An SGE of an inline send (whose bytes the library copies at post) names a key
    /// that is not a memory region of this PD. Other SGEs are the NIC's to check when
    /// it executes the request: a completion with `WcStatus::LocProtErr`.
    BadLkey {
        /// SGE index.
        sge: usize,
        /// The key.
        lkey: u32,
    },
    /// An SGE of an inline send reaches outside its memory region (see `BadLkey`).
    OutOfRange {
        /// SGE index.
        sge: usize,
        /// SGE address.
        addr: u64,
        /// SGE length.
        length: u32,
        /// Region start.
        mr_addr: u64,
        /// Region length.
        mr_len: u64,
    },
    /// Inline data longer than the QP's max_inline.
    InlineTooLarge {
        /// Bytes.
        len: usize,
        /// The QP's max_inline.
        max: u32,
    },
    /// The operation needs something this one lacks, or is not valid on this QP type.
    Unsupported(String),
    /// An atomic's remote address is not 8-byte aligned (IBTA 9.4.5) or its SGE is
    /// not one 8-byte entry.
    BadAtomic(String),
    /// The QP is not in a state that accepts this queue's work requests.
    WrongState(QpState),
    /// The message is longer than 2^31 bytes (IBTA 9.7.5.1: DMA length is 31 bits).
    TooLong(u64),
    /// The ring is corrupt.
    Ring(RingError),
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::QueueFull { capacity } => write!(
                f,
                "queue full: {capacity} work requests are waiting for the NIC"
            ),
            PostError::TooManySge { count, max } => {
                write!(f, "{count} SGEs, but the QP was created with max_sge {max}")
            }
            PostError::BadLkey { sge, lkey } => write!(
                f,
                "SGE {sge}: lkey {lkey:#x} is not a memory region of this protection domain"
            ),
            PostError::OutOfRange {
                sge,
                addr,
                length,
                mr_addr,
                mr_len,
            } => write!(
                f,
                "SGE {sge}: [{addr:#x}, +{length}) is outside its memory region [{mr_addr:#x}, +{mr_len})"
            ),
            PostError::InlineTooLarge { len, max } => write!(
                f,
                "{len} bytes inline, but the QP was created with max_inline_data {max}"
            ),
            PostError::Unsupported(s) | PostError::BadAtomic(s) => f.write_str(s),
            PostError::WrongState(s) => write!(f, "the QP is in state {s:?}"),
            PostError::TooLong(n) => write!(f, "message of {n} bytes exceeds 2^31"),
            PostError::Ring(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDevice { name, path, source } => write!(
                f,
                "no softnic device {name:?} (socket {}: {source}); is `softnic run --name {name}` running?",
                path.display()
            ),
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::Control(e) => write!(f, "{e}"),
            Error::Nic {
                verb,
                code,
                message,
            } => write!(f, "{verb}: {message} ({code:?})"),
            Error::Protocol(s) => write!(f, "protocol error: {s}"),
            Error::InvalidArgument(s) | Error::Busy(s) => f.write_str(s),
            Error::InvalidState { qpn, state, what } => {
                write!(f, "QP {qpn:#x} is in state {state:?}: {what}")
            }
            Error::Layout(e) => write!(f, "{e}"),
            Error::Post {
                index,
                wr_id,
                reason,
            } => write!(f, "work request {index} (wr_id {wr_id:#x}): {reason}"),
            Error::Ring(e) => write!(f, "completion queue: {e}"),
            Error::NicGone => f.write_str("the NIC process has exited (stopped, crashed or killed)"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NoDevice { source, .. } | Error::Io { source, .. } => Some(source),
            Error::Control(e) => Some(e),
            Error::Layout(e) => Some(e),
            Error::Ring(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ControlError> for Error {
    fn from(e: ControlError) -> Self {
        Error::Control(e)
    }
}

impl From<LayoutError> for Error {
    fn from(e: LayoutError) -> Self {
        Error::Layout(e)
    }
}

pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { what, source }
}
