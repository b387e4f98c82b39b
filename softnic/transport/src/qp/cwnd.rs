//! How many request PSNs an RC requester keeps in flight: the one owner of that limit.
//!
//! IBTA RC has no selective repeat: a responder drops every packet after a gap (IBTA
//! 9.7.5.1.3) and the requester goes back to the oldest unacknowledged PSN (9.7.5.2.1),
//! so each loss costs everything sent after it. With a fixed window of
//! [`MAX_OUTSTANDING_PSNS`] (Linux rxe's 128) and 5 % loss, nearly every go-back-N
//! resends the whole window and most of it is lost again behind the next gap: softnic
//! kept ~7 % of its lossless goodput. [`Cwnd`] applies TCP's answer (additive increase,
//! multiplicative decrease, RFC 5681): each retry halves the window, down to
//! [`MIN_CWND`]; acknowledged PSNs grow it back by one per window's worth, up to
//! [`MAX_OUTSTANDING_PSNS`]. A lossless QP never leaves the maximum, so it sends exactly
//! as before. The spec lets a requester send fewer packets than it may; nothing on the
//! wire changes but how many are outstanding.
//!
//! The floor is not TCP's: at random (non-congestion) loss p, halving on every retry
//! holds the window near TCP's `1.22 / sqrt(p)` — 5.5 packets at 5 % — so it sat at the
//! floor almost always, and a floor of 8 left the QP waiting for ACKs most of each round
//! trip. A go-back-N costs what is in flight past the loss *and* a round trip; the
//! window only trades the first against idle time. Measured (`softnic perf write_bw -s
//! 65536`, 5 % loss on both NICs, alternating builds on one loaded 2-core host): floor
//! 8 / 16 / 32 / 64 (fixed) / 128 (fixed) gave median 161 / 273 / 344 / 247 / 83 MB/s
//! while a recovery still often waited for a millisecond timer (issue 12, session 5).
//! Re-measured in session 7, with NAK recoveries of ~75 µs and lost NAKs NAKed again
//! (ten alternating rounds, load ~5): floors 16 / 24 / 32 / 48 gave median 585 / 585 /
//! 612 / 647 MB/s, per-round ratios to 32 of 0.84 / 1.01 / 0.91 — no difference this
//! host can show. A 128-packet window resends most of itself into the next gap (and
//! overran slow rxe peers, see [`MAX_OUTSTANDING_PSNS`]), so halving from the top
//! stays; the floor is 32, about one loopback bandwidth-delay product of 4 KiB
//! packets. Reducing once per loss episode (RFC 6582's recovery point) made no
//! measurable difference at 5 % loss: the window sits at the floor either way. The
//! requester asks for an ACK at least twice per window and with the packet that fills
//! a shrunk one (`requester.rs`), so a full window always has an ACK coming.

use super::window::forward;
use wire::Psn;

/// Most request PSNs outstanding on an RC QP. Far below the 2^23 limit of IBTA 9.7.1.
/// 128 is what Linux rxe's requester allows itself (`RXE_MAX_UNACKED_PSNS`,
/// rxe_req.c): a larger window overran a slow rxe peer (go-back-N resent the whole
/// window into the same full queue until `retry_cnt` ran out; tests/interop
/// `write_bw_q4`). 128 packets of 4 KiB still cover a loopback path's bandwidth-delay
/// product.
pub const MAX_OUTSTANDING_PSNS: u32 = 128;

/// Smallest window a run of retries leaves (see the [module documentation](self) for
/// why 32 and not TCP's small floor).
pub const MIN_CWND: u32 = 32;

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

    /// At 5 % random loss a retry comes every ~20 packets, before a window's worth is
    /// acknowledged: the window must still cover a loopback bandwidth-delay product.
    #[test]
    fn random_loss_leaves_at_least_32_in_flight() {
        let mut c = Cwnd::default();
        c.start(Psn::ZERO);
        let mut oldest = Psn::ZERO;
        for _ in 0..100 {
            oldest = oldest.wrapping_add(20);
            c.on_progress(oldest);
            c.on_retry();
            assert!(c.limit() >= 32, "{}", c.limit());
        }
        assert_eq!(c.limit(), 32);
    }

    #[test]
    fn halves_on_loss_and_grows_one_per_window() {
        let mut c = Cwnd::default();
        c.start(Psn::new(0xFF_FFF0));
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS);
        c.on_progress(Psn::new(0x10)); // 32 PSNs across the wrap: no change at the top
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS);
        for want in [64, 32, 32, 32] {
            c.on_retry();
            assert_eq!(c.limit(), want);
        }
        c.on_progress(Psn::new(0x10 + 31));
        assert_eq!(c.limit(), 32);
        c.on_progress(Psn::new(0x10 + 32));
        assert_eq!(c.limit(), 33, "one window's worth acknowledged");
        c.on_progress(Psn::new(0x10 + 32 + 10_000));
        assert_eq!(c.limit(), MAX_OUTSTANDING_PSNS, "capped");
    }
}
