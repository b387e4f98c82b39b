//! Per-QP counters: what a QP sent, received, retried and dropped, and why.
//!
//! Every packet a QP refuses is counted under one reason, so `softnic stats` can say
//! where traffic went. Counters only grow (wrapping is not a concern at u64).

/// Declares the counter struct and, from the same field list, `add` and `for_each`, so
/// totals and `softnic stats` can never miss a counter.
macro_rules! qp_counters {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: u64,)* }) => {
        $(#[$m])*
        pub struct $name { $($(#[$fm])* pub $f: u64,)* }

        impl $name {
            /// Adds every counter of `other` (totals over many QPs).
            pub fn add(&mut self, other: &$name) {
                $( self.$f = self.$f.wrapping_add(other.$f); )*
            }

            /// Calls `f(name, value)` for every counter, in declaration order.
            pub fn for_each(&self, mut f: impl FnMut(&'static str, u64)) {
                $( f(stringify!($f), self.$f); )*
            }
        }
    };
}

qp_counters! {
/// Counters of one QP. Field names are what `softnic stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCounters {
    /// Packets produced by `poll_transmit` (requests and responses).
    pub packets_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Packets handed to `handle_packet`.
    pub packets_received: u64,
    /// Payload bytes received in accepted packets.
    pub bytes_received: u64,
    /// Request packets sent again (go-back-N after a timeout, NAK or implied NAK).
    pub retransmitted_packets: u64,
    /// Local ACK Timeouts: timer expiries that cost one of `retry_cnt` and went back.
    pub retransmit_timeouts: u64,
    /// Adaptive-timer expiries, which cost no retry (`rto.rs`): each resends the last
    /// packet sent (`Qp::probe_tail`) or, when that cannot be, goes back N.
    pub early_retransmits: u64,
    /// Of those, expiries after which an ACK of everything sent before them came
    /// before any go-back-N: nothing was missing but, at most, the one packet the
    /// expiry resent (`Qp::probe_tail`; or, after an expiry that went back, its
    /// one-packet probe's answer, and the window is restored: `Requester::probe`).
    pub spurious_timeouts: u64,
    /// Go-back-N retries caused by a PSN sequence error NAK.
    pub seq_nak_retries: u64,
    /// Go-back-N retries caused by an implied NAK (a response skipping PSNs).
    pub implied_nak_retries: u64,
    /// NAKs and implied NAKs ignored because a go-back-N is already under way with no
    /// progress since (echoes of traffic sent before the rewind), and RNR NAKs that
    /// arrive while an RNR wait is under way (echoes of packets sent before it).
    pub retries_suppressed: u64,
    /// RNR NAKs received that led to a retry after the RNR timer.
    pub rnr_retries: u64,
    /// Acknowledges (positive) sent.
    pub acks_sent: u64,
    /// Acknowledges (positive) received.
    pub acks_received: u64,
    /// PSN sequence error NAKs sent.
    pub nak_psn_seq_sent: u64,
    /// RNR NAKs sent.
    pub nak_rnr_sent: u64,
    /// Invalid request NAKs sent.
    pub nak_invalid_request_sent: u64,
    /// Remote access error NAKs sent.
    pub nak_remote_access_sent: u64,
    /// Remote operational error NAKs sent.
    pub nak_remote_op_sent: u64,
    /// PSN sequence error NAKs received.
    pub nak_psn_seq_received: u64,
    /// RNR NAKs received.
    pub nak_rnr_received: u64,
    /// Invalid request NAKs received.
    pub nak_invalid_request_received: u64,
    /// Remote access error NAKs received.
    pub nak_remote_access_received: u64,
    /// Remote operational error NAKs received.
    pub nak_remote_op_received: u64,
    /// RDMA READ response packets sent.
    pub read_responses_sent: u64,
    /// Atomic acknowledges sent (including replays from the atomic cache).
    pub atomic_acks_sent: u64,
    /// Duplicate requests received (IBTA 9.7.5.1).
    pub duplicate_requests: u64,
    /// Duplicate atomics answered from the atomic result cache.
    pub atomic_replays: u64,
    /// Out-of-sequence requests received (PSN ahead of the expected PSN).
    pub out_of_sequence: u64,
    /// Dropped: the QP state does not accept this packet.
    pub drop_bad_state: u64,
    /// Dropped: opcode of another transport service, or one this QP does not handle.
    pub drop_bad_opcode: u64,
    /// Dropped: P_Key is not the default partition.
    pub drop_bad_pkey: u64,
    /// Dropped: UD Q_Key mismatch (IBTA 10.2.4).
    pub drop_bad_qkey: u64,
    /// Dropped: UD or UC message with no receive WQE posted.
    pub drop_no_recv_wqe: u64,
    /// Dropped: UC message cut by a PSN gap or error (IBTA 9.8.3).
    pub drop_uc_message: u64,
    /// Responses with a PSN already acknowledged (in the half of the PSN space behind
    /// the oldest unacknowledged): stale duplicates the protocol makes in normal
    /// operation (the responder re-acknowledges every duplicate request, IBTA
    /// 9.7.5.1.3), ignored. Not a drop.
    pub duplicate_responses: u64,
    /// Dropped: a response for a PSN never sent (a "ghost"), or malformed.
    pub drop_unexpected_response: u64,
    /// Dropped: a duplicate READ or atomic that could not be replayed (no READ or
    /// atomic remembered at its PSN, or too many replays queued).
    pub drop_duplicate: u64,
    /// Dropped: a duplicate READ or atomic that does not repeat the request served at
    /// its PSN (another R_Key, a READ range that is not the original's tail from that
    /// PSN, different atomic operands): forged or corrupt.
    pub drop_duplicate_mismatch: u64,
    /// Work completions with an error status (flushes included).
    pub completions_error: u64,
    /// Work completions with success status.
    pub completions_success: u64,
}
}
