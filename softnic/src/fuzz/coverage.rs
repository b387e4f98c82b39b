//! The feedback: which answer classes, and which (opcode, answer class) pairs, the run
//! has reached, and the corpus of sequences that first reached one. Sequences that
//! produced something new are mutated preferentially — the peer's answers stand in for
//! the code coverage a fuzzer of a local program would use.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::answer::Class;
use super::seq::{Ctx, Pkt};
use crate::nic::rng::SplitMix64;

/// Most corpus entries kept (a full corpus replaces a random entry).
pub const CORPUS_MAX: usize = 512;

/// A sequence that produced a new answer, with the connection fields it was made for.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The packets.
    pub seq: Vec<Pkt>,
    /// Their connection, `base_psn` = the PSN the peer expected at the sequence's start.
    pub ctx: Ctx,
}

/// Reached classes and pairs.
#[derive(Debug, Default, Clone)]
pub struct Coverage {
    /// Per class: how many sequences drew it, and the fuzz packet count when first seen.
    pub classes: BTreeMap<Class, (u64, u64)>,
    /// Per (opcode byte, class): how many times.
    pub pairs: BTreeMap<(u8, Class), u64>,
}

impl Coverage {
    /// Records one sequence's answers (`pairs` with the opcode each answered); returns
    /// true when a class or a pair is new.
    pub fn record(&mut self, pairs: &[(u8, Class)], at_packet: u64) -> bool {
        let mut new = false;
        let mut seen_here: Vec<Class> = Vec::new();
        for &(op, c) in pairs {
            if !seen_here.contains(&c) {
                seen_here.push(c);
                let e = self.classes.entry(c).or_insert_with(|| {
                    new = true;
                    (0, at_packet)
                });
                e.0 += 1;
            }
            *self.pairs.entry((op, c)).or_insert_with(|| {
                new = true;
                0
            }) += 1;
        }
        new
    }

    /// Whether `c` was reached.
    pub fn reached(&self, c: Class) -> bool {
        self.classes.contains_key(&c)
    }

    /// The coverage table: every listed class (reached or not) and any other class seen,
    /// with the number of sequences that drew it and when it was first seen.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<26} {:>10} {:>16}",
            "answer class", "sequences", "first at packet"
        );
        let mut rows: Vec<Class> = Class::LISTED.to_vec();
        for c in self.classes.keys() {
            if !rows.contains(c) {
                rows.push(*c);
            }
        }
        for c in rows {
            match self.classes.get(&c) {
                Some((n, first)) => {
                    let _ = writeln!(s, "{:<26} {:>10} {:>16}", c.name(), n, first);
                }
                None => {
                    let _ = writeln!(s, "{:<26} {:>10} {:>16}", c.name(), 0, "-");
                }
            }
        }
        let _ = writeln!(
            s,
            "classes reached: {}; (opcode, answer class) pairs reached: {}",
            self.classes.len(),
            self.pairs.len()
        );
        s
    }
}

/// The corpus.
#[derive(Debug, Default)]
pub struct Corpus {
    entries: Vec<Entry>,
}

impl Corpus {
    /// Adds an entry (replacing a random one when full).
    pub fn add(&mut self, e: Entry, rng: &mut SplitMix64) {
        if self.entries.len() < CORPUS_MAX {
            self.entries.push(e);
        } else {
            let i = rng.below(CORPUS_MAX as u64) as usize;
            self.entries[i] = e;
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// An entry to mutate: half the time one of the 16 newest (the frontier), else any.
    pub fn pick(&self, rng: &mut SplitMix64) -> Option<&Entry> {
        let n = self.entries.len();
        if n == 0 {
            return None;
        }
        let i = if rng.chance(0.5) {
            n - 1 - rng.below(n.min(16) as u64) as usize
        } else {
            rng.below(n as u64) as usize
        };
        self.entries.get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_classes_and_pairs_are_new_once() {
        let mut c = Coverage::default();
        assert!(c.record(&[(0x04, Class::Ack)], 1));
        assert!(!c.record(&[(0x04, Class::Ack)], 2));
        assert!(c.record(&[(0x0A, Class::Ack)], 3), "new pair");
        assert!(c.record(&[(0x0A, Class::Nak(1))], 4), "new class");
        assert_eq!(c.classes[&Class::Ack], (3, 1));
        let t = c.table();
        assert!(t.contains("NAK-INVALID-REQUEST"), "{t}");
        assert!(t.contains("QP-DEATH"), "unreached classes are listed: {t}");
        assert!(t.contains("pairs reached: 3"), "{t}");
    }
}
