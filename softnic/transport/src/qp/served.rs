//! What the responder remembers of the READs and atomics it executed, so that a
//! duplicate is answered only if it really duplicates one of them.
//!
//! A duplicate request (PSN behind the expected PSN, IBTA 9.7.4.2.1) is not executed
//! as a new request. A duplicate READ is answered again from the duplicate's PSN (a
//! retried READ asks only for the responses from its first missing PSN, IBTA
//! 9.7.5.2.1), and a duplicate atomic from the saved result, never executed twice.
//! Both must be the request they claim to repeat: a duplicate atomic identical to the
//! original, a duplicate READ the original or a part of it. Without the check, anything
//! that can put a packet with an old PSN on the wire reads with whatever RETH it likes
//! (any R_Key and range the QP's PD opens, none of which the peer asked for), and
//! learns an atomic's original value by naming its PSN.
//!
//! So each responder keeps, like Linux rxe's responder resources (`rxe_resp.c`,
//! `find_resource` / `duplicate_request`), the last READs it accepted
//! ([`ServedReads`]; `max_dest_rd_atomic` of them, which bounds the READs a
//! well-behaved requester has outstanding and can therefore retry, and at least
//! `SERVED_READS_MIN`) and the recent atomic results with their AtomicETH
//! ([`AtomicCache`]). A duplicate READ at PSN `first + k` is replayed only if it names the same
//! R_Key and the range that starts `k` path MTUs into the original and ends within it
//! (what a retry from response `k` asks for). rxe accepts any sub-range; softnic also
//! pins the start to the PSN, so a response PSN always carries the bytes it carried
//! the first time. Anything else is dropped and counted (rxe: "Class D error. Drop the
//! request"); a NAK would carry a PSN the requester has already acknowledged.

use std::collections::VecDeque;

use wire::{AtomicEthRepr, Operation, Psn, RethRepr};

use super::window::forward;

/// One READ the responder accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServedRead {
    first: Psn,
    npkts: u32,
    reth: RethRepr,
    /// The protection domain it was checked and read under: an XRC receive QP's
    /// changes with each message's SRQ, and a replay reads under the original's.
    pd: u32,
}

/// What a duplicate READ is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DupRead {
    /// It repeats a served READ from one of its response PSNs: answer it, under the
    /// protection domain the original was served under.
    Replay(u32),
    /// Its PSN is in no READ remembered (never a READ, or too old).
    NotServed,
    /// Its PSN is in a served READ but its R_Key or range is not that READ's.
    Mismatch,
}

/// The READs a responder served most recently, oldest first.
#[derive(Debug, Default)]
pub(super) struct ServedReads {
    ring: VecDeque<ServedRead>,
}

impl ServedReads {
    /// Records a READ accepted at PSN `first` using `npkts` response PSNs under
    /// protection domain `pd`, keeping at most `cap` (at least one).
    pub fn record(&mut self, first: Psn, npkts: u32, reth: RethRepr, pd: u32, cap: usize) {
        while self.ring.len() >= cap.max(1) {
            self.ring.pop_front();
        }
        self.ring.push_back(ServedRead {
            first,
            npkts,
            reth,
            pd,
        });
    }

    /// Classifies a duplicate READ at `psn` asking for `reth`, at path MTU `mtu`.
    pub fn check(&self, psn: Psn, reth: RethRepr, mtu: u32) -> DupRead {
        let Some(s) = self
            .ring
            .iter()
            .rev()
            .find(|s| forward(s.first, psn) < s.npkts)
        else {
            return DupRead::NotServed;
        };
        let off = u64::from(forward(s.first, psn)) * u64::from(mtu);
        let orig_len = u64::from(s.reth.dma_len);
        let ok = reth.rkey == s.reth.rkey
            && off <= orig_len
            && reth.va == s.reth.va.wrapping_add(off)
            && u64::from(reth.dma_len) <= orig_len - off;
        if ok {
            DupRead::Replay(s.pd)
        } else {
            DupRead::Mismatch
        }
    }

    /// Forgets everything (the QP left RTR/RTS).
    pub fn clear(&mut self) {
        self.ring.clear();
    }

    /// How many are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ring.len()
    }
}

/// One executed atomic: the request and the original value it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServedAtomic {
    psn: Psn,
    op: Operation,
    eth: AtomicEthRepr,
    orig: u64,
}

/// What a duplicate atomic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DupAtomic {
    /// Identical to an executed atomic: answer with its original value.
    Replay(u64),
    /// No atomic remembered at this PSN.
    NotServed,
    /// An atomic was executed at this PSN, but not this one.
    Mismatch,
}

/// Recent atomic results, oldest first.
#[derive(Debug, Default)]
pub(super) struct AtomicCache {
    ring: VecDeque<ServedAtomic>,
}

impl AtomicCache {
    /// Records an executed atomic, keeping at most `cap`.
    pub fn record(&mut self, psn: Psn, op: Operation, eth: AtomicEthRepr, orig: u64, cap: usize) {
        while self.ring.len() >= cap.max(1) {
            self.ring.pop_front();
        }
        self.ring.push_back(ServedAtomic { psn, op, eth, orig });
    }

    /// Classifies a duplicate atomic.
    pub fn check(&self, psn: Psn, op: Operation, eth: Option<AtomicEthRepr>) -> DupAtomic {
        let Some(a) = self.ring.iter().rev().find(|a| a.psn == psn) else {
            return DupAtomic::NotServed;
        };
        if a.op == op && eth == Some(a.eth) {
            DupAtomic::Replay(a.orig)
        } else {
            DupAtomic::Mismatch
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reth(va: u64, rkey: u32, dma_len: u32) -> RethRepr {
        RethRepr { va, rkey, dma_len }
    }

    #[test]
    fn duplicate_read_must_be_the_tail_of_a_served_read() {
        let mut s = ServedReads::default();
        // 1000 bytes at MTU 256: PSNs 0xFFFFFE, 0xFFFFFF, 0, 1 (wrapping).
        let first = Psn::new(0xFF_FFFE);
        s.record(first, 4, reth(0x1000, 7, 1000), 1, 2);
        let at = |k: u32| first.wrapping_add(k);
        assert_eq!(
            s.check(at(0), reth(0x1000, 7, 1000), 256),
            DupRead::Replay(1)
        );
        assert_eq!(
            s.check(at(2), reth(0x1200, 7, 488), 256),
            DupRead::Replay(1)
        );
        assert_eq!(s.check(at(3), reth(0x1300, 7, 0), 256), DupRead::Replay(1));
        // Other key, range past the original, start not at the PSN's offset.
        assert_eq!(
            s.check(at(0), reth(0x1000, 8, 1000), 256),
            DupRead::Mismatch
        );
        assert_eq!(
            s.check(at(0), reth(0x1000, 7, 1001), 256),
            DupRead::Mismatch
        );
        assert_eq!(s.check(at(2), reth(0x1000, 7, 100), 256), DupRead::Mismatch);
        assert_eq!(s.check(at(1), reth(0x1200, 7, 100), 256), DupRead::Mismatch);
        assert_eq!(s.check(at(4), reth(0x1000, 7, 1), 256), DupRead::NotServed);
        // A replay reads under the PD its original was served under.
        s.record(Psn::new(100), 1, reth(0x2000, 9, 8), 3, 4);
        assert_eq!(
            s.check(Psn::new(100), reth(0x2000, 9, 8), 256),
            DupRead::Replay(3)
        );
        // Bounded: the oldest is forgotten.
        s.record(Psn::new(10), 1, reth(0, 7, 1), 1, 2);
        s.record(Psn::new(20), 1, reth(0, 7, 1), 1, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.check(at(0), reth(0x1000, 7, 1000), 256),
            DupRead::NotServed
        );
    }

    #[test]
    fn duplicate_atomic_must_be_identical() {
        let mut c = AtomicCache::default();
        let eth = AtomicEthRepr {
            va: 8,
            rkey: 3,
            swap_add: 1,
            compare: 0,
        };
        c.record(Psn::new(5), Operation::FetchAdd, eth, 41, 4);
        assert_eq!(
            c.check(Psn::new(5), Operation::FetchAdd, Some(eth)),
            DupAtomic::Replay(41)
        );
        let other = AtomicEthRepr { va: 16, ..eth };
        assert_eq!(
            c.check(Psn::new(5), Operation::FetchAdd, Some(other)),
            DupAtomic::Mismatch
        );
        assert_eq!(
            c.check(Psn::new(5), Operation::CompareSwap, Some(eth)),
            DupAtomic::Mismatch
        );
        assert_eq!(
            c.check(Psn::new(6), Operation::FetchAdd, Some(eth)),
            DupAtomic::NotServed
        );
    }
}
