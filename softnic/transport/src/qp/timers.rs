//! The QP's timers (the quinn `TimerTable` pattern): each is an optional deadline; the
//! caller sleeps until the earliest and calls `handle_timeout`.
//!
//! * Retransmit — the requester's Local ACK Timeout (IBTA 9.7.6.1.3): armed while
//!   request PSNs are outstanding, restarted on every forward progress, disabled
//!   when the `timeout` attribute is 0.
//! * RNR — the wait after an RNR NAK (IBTA 9.7.5.2.8) before the requester resends.

use crate::time::{Duration, Instant};

/// Pending deadlines.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Timers {
    /// Local ACK timeout deadline.
    pub retransmit: Option<Instant>,
    /// End of the RNR wait.
    pub rnr: Option<Instant>,
}

impl Timers {
    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        match (self.retransmit, self.rnr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Stops every timer.
    pub fn cancel_all(&mut self) {
        *self = Timers::default();
    }
}

/// The Local ACK Timeout for the `timeout` attribute: 4.096 µs × 2^timeout, or `None`
/// for 0, which IBTA 9.7.6.1.3 defines as an infinite timeout (no timer).
pub(super) fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << u32::from(timeout.min(31))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_values() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        // ibv_rc_pingpong's timeout 14: 4.096 µs × 16384 = 67.1 ms.
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(67_108_864)));
        assert!(ack_timeout(31).is_some());
    }
}
