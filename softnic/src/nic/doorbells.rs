//! The NIC's side of one client's doorbell page (`verbs_api::abi::doorbell`): the
//! table of the client's rings by slot, and the per-iteration read of the page that
//! says which of them to drain.
//!
//! The page is client memory and hostile: a set bit is only a slot index, looked up in
//! this table, which the NIC alone fills (a slot per QP and per SRQ of this client,
//! given out at creation and taken back at destruction). A bit for a slot that names
//! nothing is ignored and counted (`doorbell_unknown_slot`). Each iteration reads at
//! most [`WORD_BUDGET`] bitmap words (64 slots each) per client, continuing where it
//! stopped the next time (summary bits not reached are put back), so a client that
//! sets every bit all the time gets the same bounded service as one that posts to that
//! many rings, and never delays the other clients by more than that.

use std::sync::atomic::{fence, Ordering};

use verbs_api::abi::doorbell::SUMMARY_WORDS;
use verbs_api::abi::{Doorbell, DOORBELL_SLOTS};

/// Bitmap words read per client per iteration (64 slots each).
pub const WORD_BUDGET: usize = 16;

/// What a slot rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Both rings of this QP.
    Qp(u32),
    /// The ring of this SRQ (handle).
    Srq(u32),
}

/// One client's doorbell page and slot table.
#[derive(Debug)]
pub struct Doorbells {
    page: Doorbell,
    slots: Vec<Option<Target>>,
    free: Vec<u32>,
    /// Summary word to start at next time (rotates when the budget runs out).
    cursor: usize,
}

impl Doorbells {
    /// Over the client's mapped page.
    pub fn new(page: Doorbell) -> Self {
        Doorbells {
            page,
            slots: Vec::new(),
            free: Vec::new(),
            cursor: 0,
        }
    }

    /// A slot for `t`, or `None` when the client has [`DOORBELL_SLOTS`] rings already.
    pub fn assign(&mut self, t: Target) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            if let Some(e) = self.slots.get_mut(s as usize) {
                *e = Some(t);
                return Some(s);
            }
        }
        let s = u32::try_from(self.slots.len()).ok()?;
        if s >= DOORBELL_SLOTS {
            return None;
        }
        self.slots.push(Some(t));
        Some(s)
    }

    /// Takes back `slot` (its ring is destroyed). A stale bit for it rings nothing.
    pub fn release(&mut self, slot: u32) {
        if let Some(e) = self.slots.get_mut(slot as usize) {
            if e.take().is_some() {
                self.free.push(slot);
            }
        }
    }

    /// The page (its CQs bump the completion sequence on it and wake pollers).
    pub fn page(&self) -> &Doorbell {
        &self.page
    }

    /// Slots in use (for the memory figure).
    pub fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Takes the rung slots (at most [`WORD_BUDGET`] words of them) and appends their
    /// targets to `out`. Returns how many bits named no ring of this client.
    pub fn poll(&mut self, out: &mut Vec<Target>) -> u64 {
        let mut unknown = 0;
        let mut words = WORD_BUDGET;
        for j in 0..SUMMARY_WORDS {
            let k = (self.cursor + j) % SUMMARY_WORDS;
            let mut s = self.page.take_summary(k);
            while s != 0 {
                if words == 0 {
                    // Out of budget: the rest of this summary word waits for next time,
                    // starting here (the words not swapped keep their bits).
                    self.page.restore_summary(k, s);
                    self.cursor = k;
                    return unknown;
                }
                words -= 1;
                let i = k * 64 + s.trailing_zeros() as usize;
                s &= s - 1;
                let mut w = self.page.take_word(i);
                while w != 0 {
                    let slot = i * 64 + w.trailing_zeros() as usize;
                    w &= w - 1;
                    match self.slots.get(slot) {
                        Some(Some(t)) => out.push(*t),
                        _ => unknown += 1,
                    }
                }
            }
        }
        self.cursor = (self.cursor + 1) % SUMMARY_WORDS;
        unknown
    }

    /// Before sleeping: sets NEED_WAKEUP, fences, and returns whether a doorbell was
    /// rung meanwhile (then do not sleep).
    pub fn arm(&self) -> bool {
        self.page.set_need_wakeup();
        fence(Ordering::SeqCst);
        self.page.pending()
    }

    /// Polling again: clears NEED_WAKEUP.
    pub fn disarm(&self) {
        self.page.clear_need_wakeup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::Arc;
    use verbs_api::abi::DOORBELL_SEGMENT_LEN;

    fn pair() -> (Doorbell, Doorbells) {
        let fd = verbs_api::os::memfd("db", DOORBELL_SEGMENT_LEN).unwrap();
        let map =
            |_| Arc::new(verbs_api::os::map_shared(fd.as_fd(), DOORBELL_SEGMENT_LEN).unwrap());
        (
            Doorbell::new(map(0)).unwrap(),
            Doorbells::new(Doorbell::new(map(1)).unwrap()),
        )
    }

    #[test]
    fn rung_slots_name_their_rings_and_stray_bits_are_counted() {
        let (client, mut nic) = pair();
        let q = nic.assign(Target::Qp(0x11)).unwrap();
        let s = nic.assign(Target::Srq(7)).unwrap();
        let gone = nic.assign(Target::Qp(0x22)).unwrap();
        nic.release(gone);
        client.ring(q);
        client.ring(s);
        client.ring(gone); // destroyed: rings nothing
        client.ring(5000); // never given out
        let mut out = Vec::new();
        assert_eq!(nic.poll(&mut out), 2);
        assert_eq!(out, vec![Target::Qp(0x11), Target::Srq(7)]);
        out.clear();
        assert_eq!(nic.poll(&mut out), 0, "taken: nothing left");
        assert!(out.is_empty());
        // The released slot is given out again.
        assert_eq!(nic.assign(Target::Qp(0x33)), Some(gone));
        assert_eq!(nic.in_use(), 3);
    }

    #[test]
    fn a_client_ringing_everything_gets_a_bounded_share_and_nothing_is_lost() {
        let (client, mut nic) = pair();
        for q in 0..DOORBELL_SLOTS {
            assert_eq!(nic.assign(Target::Qp(q)), Some(q));
        }
        assert_eq!(nic.assign(Target::Qp(0)), None, "table full");
        for q in 0..DOORBELL_SLOTS {
            client.ring(q);
        }
        let mut seen = vec![false; DOORBELL_SLOTS as usize];
        let mut rounds = 0;
        let mut out = Vec::new();
        while seen.iter().any(|s| !s) {
            out.clear();
            assert_eq!(nic.poll(&mut out), 0);
            assert!(out.len() <= WORD_BUDGET * 64, "bounded per iteration");
            for t in &out {
                let Target::Qp(q) = *t else { panic!() };
                assert!(!seen[q as usize], "each rung slot once");
                seen[q as usize] = true;
            }
            rounds += 1;
            assert!(rounds <= 64, "every slot served within 32768 / 1024 rounds");
        }
        assert_eq!(rounds, DOORBELL_SLOTS as usize / (WORD_BUDGET * 64));
        assert!(!nic.page.pending());
    }

    #[test]
    fn arm_sees_a_doorbell_rung_before_it_and_the_poster_sees_the_flag_after() {
        let (client, nic) = pair();
        assert!(!nic.arm(), "nothing rung: may sleep");
        assert!(
            client.ring(1),
            "NEED_WAKEUP seen: the poster writes the wake pipe"
        );
        assert!(nic.arm(), "rung: do not sleep");
        nic.disarm();
        assert!(!client.ring(2));
    }
}
