//! The requester's PSN window: the one owner of the send-side PSN arithmetic.
//!
//! PSNs are 24-bit and wrap. IBTA 9.7.1 orders two PSNs by the half-space rule: `b` is
//! after `a` when the forward distance from `a` to `b` is below 2^23. PSNs 2^23 or more
//! apart have no order at all ([`wire::Psn::distance_to`] returns −2^23 for exactly
//! half), so a requester whose unacknowledged PSNs span 2^23 cannot tell an old
//! response from a new one: a 2 GiB READ at path MTU 256 (2^23 response PSNs) made
//! softnic's window look empty and the requester wait forever.
//!
//! [`SendWindow`] keeps the four PSNs the requester needs, in window order,
//!
//! ```text
//!   oldest_unacked ≤ cursor ≤ next        oldest_unacked ≤ sent_end ≤ next
//!   next − oldest_unacked ≤ MAX_SPAN = 2^23 − 1
//! ```
//!
//! * `oldest_unacked` — the completer's expected PSN (IBTA 9.7.5.1);
//! * `cursor` — the PSN the next packet carries (behind `sent_end` while resending);
//! * `sent_end` — one past the highest PSN ever sent;
//! * `next` — one past the last PSN given to a started work request.
//!
//! Every position is measured as an unsigned forward offset from `oldest_unacked`,
//! never as a signed distance, and the span bound makes every offset in the window
//! unambiguous. PSNs outside the window (stale, or never sent: a hostile or confused
//! peer) are refused by [`SendWindow::contains`] / [`SendWindow::offset`]; the
//! mutators refuse them too and leave the window unchanged, so no packet can break the
//! invariant. [`SendWindow::assign`] refuses a message that would stretch the span past
//! [`MAX_SPAN`]; [`max_msg_len`] is the longest message that can ever fit.

use wire::types::MASK_24;
use wire::Psn;

/// Most PSNs the window may span (next − oldest unacknowledged): one less than half the
/// PSN space, the largest span in which every pair of PSNs is ordered (IBTA 9.7.1).
pub const MAX_SPAN: u32 = (1 << 23) - 1;

/// Longest message in bytes (IBTA 9.4.1: a DMA length of at most 2^31).
pub const MAX_MSG_BYTES: u32 = 1 << 31;

/// Longest message a QP with path MTU `mtu` can carry: at most 2^31 bytes (IBTA 9.4.1),
/// and at most [`MAX_SPAN`] packets (request packets for SEND/WRITE, response packets
/// for READ), so that one message never spans 2^23 PSNs. Only MTU 256 is limited by
/// the PSNs: (2^23 − 1) × 256 = 2^31 − 256 bytes; from MTU 512 up it is 2^31.
pub const fn max_msg_len(mtu: u32) -> u32 {
    let by_psn = MAX_SPAN as u64 * mtu as u64;
    if by_psn < MAX_MSG_BYTES as u64 {
        by_psn as u32
    } else {
        MAX_MSG_BYTES
    }
}

/// Forward distance from `from` to `to` modulo 2^24 (0 ..= 2^24 − 1): how many PSNs
/// `to` is past `from` when `to` is known not to be behind it.
pub const fn forward(from: Psn, to: Psn) -> u32 {
    to.value().wrapping_sub(from.value()) & MASK_24
}

/// The requester's PSN window; see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWindow {
    oldest: Psn,
    cursor: Psn,
    sent: Psn,
    next: Psn,
}

impl Default for SendWindow {
    fn default() -> Self {
        SendWindow::new(Psn::ZERO)
    }
}

impl SendWindow {
    /// An empty window whose first PSN is `start` (the `sq_psn` attribute).
    pub const fn new(start: Psn) -> SendWindow {
        SendWindow {
            oldest: start,
            cursor: start,
            sent: start,
            next: start,
        }
    }

    /// Oldest PSN not yet acknowledged.
    pub const fn oldest_unacked(&self) -> Psn {
        self.oldest
    }

    /// PSN of the next packet to (re)send.
    pub const fn cursor(&self) -> Psn {
        self.cursor
    }

    /// One past the highest PSN ever sent.
    pub const fn sent_end(&self) -> Psn {
        self.sent
    }

    /// One past the last PSN given to a message: where the next message starts.
    pub const fn next(&self) -> Psn {
        self.next
    }

    /// PSNs given to messages and not yet acknowledged (always ≤ [`MAX_SPAN`]).
    pub const fn span(&self) -> u32 {
        forward(self.oldest, self.next)
    }

    /// True while some PSN is sent and not acknowledged.
    pub fn outstanding(&self) -> bool {
        self.sent != self.oldest
    }

    /// Offset of `psn` from the oldest unacknowledged PSN if it lies in
    /// `oldest_unacked ..= next`, else `None`.
    pub const fn offset(&self, psn: Psn) -> Option<u32> {
        let o = forward(self.oldest, psn);
        if o <= self.span() {
            Some(o)
        } else {
            None
        }
    }

    /// True when every PSN before `end` is acknowledged: `end` is the oldest
    /// unacknowledged PSN, or the window has moved past it. What an early expiry's
    /// probe waits for, with `end` one past the last PSN sent before the expiry.
    pub const fn acknowledged_before(&self, end: Psn) -> bool {
        match self.offset(end) {
            Some(o) => o == 0,
            None => true,
        }
    }

    /// True when `psn` is sent and unacknowledged (`oldest_unacked .. sent_end`): the
    /// only PSNs a response may answer. Older ones are stale duplicates, newer ones
    /// were never sent.
    pub const fn contains(&self, psn: Psn) -> bool {
        forward(self.oldest, psn) < forward(self.oldest, self.sent)
    }

    /// True when a packet with `psn` was sent before (a retransmission).
    pub const fn is_resend(&self, psn: Psn) -> bool {
        self.contains(psn)
    }

    /// Whether `n` more PSNs fit without the span passing [`MAX_SPAN`].
    pub const fn can_assign(&self, n: u32) -> bool {
        n <= MAX_SPAN - self.span()
    }

    /// Gives the next `n` PSNs to a message; returns the first. `None` (window
    /// unchanged) if the span would pass [`MAX_SPAN`]: the message must wait until
    /// older PSNs are acknowledged, or, if it can never fit (`n > MAX_SPAN`), be
    /// refused. The cursor is not moved.
    pub fn assign(&mut self, n: u32) -> Option<Psn> {
        if !self.can_assign(n) {
            return None;
        }
        let first = self.next;
        self.next = first.wrapping_add(n);
        Some(first)
    }

    /// Moves the cursor to `psn` if it lies in `oldest_unacked ..= next`; returns
    /// whether it did.
    pub fn seek(&mut self, psn: Psn) -> bool {
        if self.offset(psn).is_none() {
            return false;
        }
        self.cursor = psn;
        true
    }

    /// A packet was sent and the next one goes at `end` (one past the PSNs it used; a
    /// READ request uses all its response PSNs). `sent_end` moves up to `end` if it
    /// is further. Refused (false, unchanged) if `end` is outside the window.
    pub fn record_sent(&mut self, end: Psn) -> bool {
        let Some(o) = self.offset(end) else {
            return false;
        };
        if o > forward(self.oldest, self.sent) {
            self.sent = end;
        }
        self.cursor = end;
        true
    }

    /// Every PSN before `to` is acknowledged: `oldest_unacked` moves to `to`, and the
    /// cursor with it if it was behind (what is acknowledged is not resent). Returns
    /// true on progress; `to` outside `oldest_unacked ..= sent_end` changes nothing
    /// (only sent PSNs can be acknowledged).
    pub fn advance(&mut self, to: Psn) -> bool {
        let o = forward(self.oldest, to);
        if o == 0 || o > forward(self.oldest, self.sent) {
            return false;
        }
        if forward(self.oldest, self.cursor) < o {
            self.cursor = to;
        }
        self.oldest = to;
        true
    }

    /// Go-back-N (IBTA 9.7.5.2.1): the next packet sent is the oldest unacknowledged.
    pub fn rewind(&mut self) {
        self.cursor = self.oldest;
    }

    /// Gives up every assigned PSN: nothing will acknowledge them (UC/UD moving to
    /// SQE flushes the send queue). The window is empty at `next`.
    pub fn abandon(&mut self) {
        self.oldest = self.next;
        self.cursor = self.next;
        self.sent = self.next;
    }

    /// Checks the invariant (for tests: it holds after every public call).
    pub fn invariant_holds(&self) -> bool {
        let span = self.span();
        span <= MAX_SPAN
            && forward(self.oldest, self.cursor) <= span
            && forward(self.oldest, self.sent) <= span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_msg_len_per_mtu() {
        assert_eq!(max_msg_len(256), (1 << 31) - 256);
        for mtu in [512, 1024, 2048, 4096] {
            assert_eq!(max_msg_len(mtu), 1 << 31);
        }
    }

    #[test]
    fn a_span_of_2_pow_23_is_refused() {
        let mut w = SendWindow::new(Psn::new(0xFF_FFF0));
        assert_eq!(w.assign(1 << 23), None);
        assert_eq!(w.assign(MAX_SPAN), Some(Psn::new(0xFF_FFF0)));
        assert_eq!(w.assign(1), None);
        assert!(w.record_sent(w.next()));
        assert!(w.outstanding());
        // The last PSN of the message is still answerable: no −2^23 ambiguity.
        assert!(w.contains(Psn::new(0xFF_FFF0).wrapping_add(MAX_SPAN - 1)));
        assert!(w.advance(w.next()));
        assert!(!w.outstanding());
        assert!(w.invariant_holds());
    }
}
