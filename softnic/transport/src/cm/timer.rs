//! Response timeouts and bounded retries (IBTA 12.4 and 12.6.5): a REQ, REP or DREQ is
//! resent when no answer came within the CM response timeout (plus, for a REQ, the
//! time the peer said it needs in an MRA), at most Max CM Retries times; then the
//! connection is given up.

use wire::cm::CmMadRepr;

use crate::time::{Duration, Instant};

/// A message waiting for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// What to resend (`None` for TimeWait, which only waits).
    pub mad: Option<CmMadRepr>,
    /// When to resend or give up.
    pub deadline: Instant,
    /// Resends left.
    pub left: u8,
}

/// 4.096 µs × 2^`exp` (IBTA's encoding of CM and ACK timeouts), capped at 2^31.
pub fn timeout(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(exp.min(31)))
}

impl Retry {
    /// Waits for the answer to `mad`, resending it `retries` times.
    pub fn new(now: Instant, mad: CmMadRepr, exp: u8, retries: u8) -> Retry {
        Retry {
            mad: Some(mad),
            deadline: now + timeout(exp),
            left: retries,
        }
    }

    /// Just waits (TimeWait).
    pub fn wait(now: Instant, d: Duration) -> Retry {
        Retry {
            mad: None,
            deadline: now + d,
            left: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibta_timeout_encoding() {
        assert_eq!(timeout(0), Duration::from_nanos(4096));
        assert_eq!(timeout(20), Duration::from_nanos(4_294_967_296)); // ≈ 4.3 s, Linux's
        assert_eq!(timeout(31), timeout(200));
    }
}
