//! How many request PSNs an RC requester keeps in flight: the one owner of that limit.
//!
//! IBTA RC has no selective repeat: a responder drops every packet after a gap (IBTA
//! 9.7.5.1.2) and the requester goes back to the oldest unacknowledged PSN (9.7.5.2.1),
//! so each loss costs everything sent after it. With a fixed window of
//! [`MAX_OUTSTANDING_PSNS`] (Linux rxe's 128) and 5 % loss, nearly every go-back-N
//! resends the whole window and most of it is lost again behind the next gap: softnic
//! kept ~7 % of its lossless goodput. [`Cwnd`] applies TCP's answer (additive increase,
//! multiplicative decrease, RFC 5681): each retry halves the window, down to
//! [`MIN_CWND`]; acknowledged PSNs grow it back by one per window's worth, up to
//! [`MAX_OUTSTANDING_PSNS`]. A lossless QP never leaves the maximum, so it sends exactly
//! as before. The spec lets a requester send fewer packets than it may; nothing on the
//! wire changes but how many are outstanding.

use super::window::forward;
use wire::Psn;

/// Most request PSNs outstanding on an RC QP. Far below the 2^23 limit of IBTA 9.7.1.
/// 128 is what Linux rxe's requester allows itself (`RXE_MAX_UNACKED_PSNS`,
/// rxe_req.c): a larger window overran a slow rxe peer (go-back-N resent the whole
/// window into the same full queue until `retry_cnt` ran out; tests/interop
/// `write_bw_q4`). 128 packets of 4 KiB still cover a loopback path's bandwidth-delay
/// product.
pub const MAX_OUTSTANDING_PSNS: u32 = 128;

/// Smallest window a run of retries leaves.
pub const MIN_CWND: u32 = 8;

/// The in-flight limit; see the [module documentation](self).
#[derive(Debug, Clone, Copy)]
pub(super) struct Cwnd {
    cwnd: u32,
    /// PSNs acknowledged since the window last grew.
    acked: u32,
    /// Oldest unacknowledged PSN at the last progress.
    oldest: Psn,
}

impl Default for Cwnd {
    fn default() -> Self {
        Cwnd {
            cwnd: MAX_OUTSTANDING_PSNS,
            acked: 0,
            oldest: Psn::ZERO,
        }
    }
}

impl Cwnd {
    /// Entering RTS with the first PSN `sq_psn`.
    pub fn start(&mut self, sq_psn: Psn) {
        *self = Cwnd {
            oldest: sq_psn,
            ..Cwnd::default()
        };
    }

    /// Request PSNs that may be outstanding now.
    pub fn limit(&self) -> u32 {
        self.cwnd
    }

    /// The oldest unacknowledged PSN moved forward to `oldest`.
    pub fn on_progress(&mut self, oldest: Psn) {
        self.acked = self.acked.saturating_add(forward(self.oldest, oldest));
        self.oldest = oldest;
        while self.acked >= self.cwnd && self.cwnd < MAX_OUTSTANDING_PSNS {
            self.acked -= self.cwnd;
            self.cwnd += 1;
        }
        if self.cwnd == MAX_OUTSTANDING_PSNS {
            self.acked = 0;
        }
    }

    /// A go-back-N retry (NAK, implied NAK or timeout): a loss.
    pub fn on_retry(&mut self) {
        self.cwnd = (self.cwnd / 2).max(MIN_CWND);
        self.acked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_loss_and_grows_one_per_window() {
        let mut c = Cwnd::default();
        c.start(Psn::new(0xFF_FFF0));
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS);
        c.on_progress(Psn::new(0x10)); // 32 PSNs across the wrap: no change at the top
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS);
        for want in [64, 32, 16, 8, 8] {
            c.on_retry();
            assert_eq!(c.limit(), want);
        }
        c.on_progress(Psn::new(0x10 + 7));
        assert_eq!(c.limit(), 8);
        c.on_progress(Psn::new(0x10 + 8));
        assert_eq!(c.limit(), 9, "one window's worth acknowledged");
        c.on_progress(Psn::new(0x10 + 8 + 10_000));
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS, "capped");
    }
}
