//! `--verify`: cheap checks that data arrived intact.
//!
//! Bytes: the side whose memory the data comes from fills it with [`source`]`(offset
//! in slot)`, the side where it lands pre-fills the landing slot with [`landing`]
//! (which differs from `source` at every offset). After a run the landing side checks
//! the ranges the operations covered: equal to `source` → the peer was softnic and the
//! data is exact; otherwise (a stock perftest peer sends `rand()` bytes) at least 90%
//! of them must differ from the pre-fill — the data landed — and, for a single size,
//! every byte outside those ranges must still be the pre-fill (nothing strayed).
//!
//! Atomics: perftest's FETCH_AND_ADD adds 1 and CMP_AND_SWAP compares with 0 and swaps
//! in 0, each QP walking 64-byte-spaced words of the peer's slot. The requester checks
//! every returned original value: per word, each FETCH_AND_ADD returns the previous
//! one + 1, and each CMP_AND_SWAP returns the same value. The responder pre-fills its
//! words with 0 and checks at the end that the FETCH_AND_ADD counts sum to the
//! iterations and differ by at most one between words.

/// Byte `j` of a data source slot.
pub fn source(j: usize) -> u8 {
    let x = (j as u32).wrapping_mul(0x9E37_79B1) ^ (j as u32 >> 7);
    (x >> 24) as u8 ^ (j as u8)
}

/// Byte `j` of a landing slot before the run: never equal to `source(j)`.
pub fn landing(j: usize) -> u8 {
    !source(j)
}

/// Outcome of a byte check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByteCheck {
    /// Every covered byte is softnic's source pattern.
    Exact {
        /// Bytes checked.
        bytes: usize,
    },
    /// The data is not softnic's pattern (a stock peer) but it landed.
    Landed {
        /// Bytes checked.
        bytes: usize,
        /// Bytes that still hold the pre-fill.
        unchanged: usize,
    },
}

/// Checks one landing slot (`slot`, indexed from its start) after operations of `size`
/// bytes at `offsets`; `stray` also checks the bytes outside them.
pub fn check_landing(
    slot: &[u8],
    size: usize,
    offsets: &[usize],
    stray: bool,
) -> Result<ByteCheck, String> {
    let mut covered = vec![false; slot.len()];
    for &o in offsets {
        let end = o
            .checked_add(size)
            .filter(|&e| e <= slot.len())
            .ok_or_else(|| {
                format!(
                    "operation at offset {o} of {size} bytes is outside the {}-byte slot",
                    slot.len()
                )
            })?;
        covered
            .get_mut(o..end)
            .into_iter()
            .flatten()
            .for_each(|c| *c = true);
    }
    let mut bytes = 0usize;
    let mut not_source = 0usize;
    let mut unchanged = 0usize;
    let mut first_bad: Option<usize> = None;
    for (j, (&b, &c)) in slot.iter().zip(covered.iter()).enumerate() {
        if c {
            bytes += 1;
            if b != source(j) {
                not_source += 1;
                first_bad.get_or_insert(j);
            }
            if b == landing(j) {
                unchanged += 1;
            }
        } else if stray && b != landing(j) {
            return Err(format!(
                "byte {j} of the slot changed ({:#04x}, pre-fill {:#04x}) but no operation covered it",
                b,
                landing(j)
            ));
        }
    }
    if not_source == 0 {
        return Ok(ByteCheck::Exact { bytes });
    }
    // Random bytes equal the pre-fill with probability 1/256; 10% is far beyond that.
    if unchanged * 10 > bytes {
        return Err(format!(
            "{unchanged} of {bytes} covered bytes still hold the pre-fill (first differing from \
             softnic's pattern at offset {}): the data did not land",
            first_bad.unwrap_or(0)
        ));
    }
    Ok(ByteCheck::Landed { bytes, unchanged })
}

/// Requester-side check of atomic results, per QP and word.
#[derive(Debug, Clone)]
pub struct AtomicCheck {
    fetch_add: bool,
    last: Vec<Vec<Option<u64>>>,
    /// Results checked.
    pub checked: u64,
}

impl AtomicCheck {
    /// For `qps` QPs walking `words` words each.
    pub fn new(fetch_add: bool, qps: usize, words: usize) -> AtomicCheck {
        AtomicCheck {
            fetch_add,
            last: vec![vec![None; words]; qps],
            checked: 0,
        }
    }

    /// Checks the original value `v` returned by an operation on `word` of QP `q`.
    pub fn check(&mut self, q: usize, word: usize, v: u64) -> Result<(), String> {
        let slot = self
            .last
            .get_mut(q)
            .and_then(|w| w.get_mut(word))
            .ok_or_else(|| format!("QP {q} word {word} out of range"))?;
        if let Some(prev) = *slot {
            let want = if self.fetch_add {
                prev.wrapping_add(1)
            } else {
                prev
            };
            if v != want {
                return Err(format!(
                    "atomic result mismatch on QP {q} word {word}: got {v:#x}, expected {want:#x} \
                     (previous original value {prev:#x})"
                ));
            }
        }
        *slot = Some(v);
        self.checked += 1;
        Ok(())
    }
}

/// Responder-side check of the FETCH_AND_ADD counters in one slot: `words` 64-bit words
/// at `stride` bytes, pre-filled with 0, hit round-robin by `iters` operations.
pub fn check_fetch_add_counts(
    slot: &[u8],
    words: usize,
    stride: usize,
    iters: u64,
) -> Result<(), String> {
    let mut counts = Vec::with_capacity(words);
    for w in 0..words {
        let b = slot
            .get(w * stride..w * stride + 8)
            .ok_or_else(|| format!("word {w} outside the slot"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        counts.push(u64::from_ne_bytes(a));
    }
    let sum: u64 = counts.iter().fold(0u64, |s, &c| s.wrapping_add(c));
    if sum != iters {
        return Err(format!(
            "the FETCH_AND_ADD counters sum to {sum}, expected {iters} (one per operation)"
        ));
    }
    let base = iters / words as u64;
    let extra = (iters % words as u64) as usize;
    for (w, &c) in counts.iter().enumerate() {
        let want = base + u64::from(w < extra);
        if c != want {
            return Err(format!(
                "counter {w} is {c}, expected {want} (round-robin over {words} words)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landing_slot(n: usize) -> Vec<u8> {
        (0..n).map(landing).collect()
    }

    #[test]
    fn patterns_differ_everywhere() {
        assert!((0..1 << 16).all(|j| source(j) != landing(j)));
        // Not constant.
        assert!((1..256).any(|j| source(j) != source(0)));
    }

    #[test]
    fn exact_landed_and_failures() {
        let mut slot = landing_slot(256);
        for (j, b) in slot.iter_mut().enumerate().take(128).skip(64) {
            *b = source(j);
        }
        assert_eq!(
            check_landing(&slot, 64, &[64], true),
            Ok(ByteCheck::Exact { bytes: 64 })
        );
        // A stray byte outside the covered range.
        let mut stray = slot.clone();
        stray[200] ^= 1;
        assert!(check_landing(&stray, 64, &[64], true).is_err());
        assert!(check_landing(&stray, 64, &[64], false).is_ok());
        // Foreign data that landed.
        let mut foreign = landing_slot(256);
        for (j, b) in foreign.iter_mut().enumerate().take(128) {
            *b = landing(j).wrapping_add(1 + (j % 7) as u8);
        }
        assert!(matches!(
            check_landing(&foreign, 128, &[0], true),
            Ok(ByteCheck::Landed { .. })
        ));
        // Nothing arrived.
        assert!(check_landing(&landing_slot(256), 128, &[0], true).is_err());
        // Out-of-slot operation.
        assert!(check_landing(&slot, 64, &[250], true).is_err());
    }

    #[test]
    fn atomic_sequences() {
        let mut c = AtomicCheck::new(true, 1, 2);
        for (w, v) in [(0, 7), (1, 100), (0, 8), (1, 101), (0, 9)] {
            c.check(0, w, v).unwrap();
        }
        assert!(c.check(0, 1, 103).is_err());
        let mut s = AtomicCheck::new(false, 1, 1);
        s.check(0, 0, 5).unwrap();
        s.check(0, 0, 5).unwrap();
        assert!(s.check(0, 0, 6).is_err());
    }

    #[test]
    fn fetch_add_counts() {
        let mut slot = vec![0u8; 4 * 64];
        for (w, c) in [3u64, 3, 2, 2].iter().enumerate() {
            slot[w * 64..w * 64 + 8].copy_from_slice(&c.to_ne_bytes());
        }
        assert!(check_fetch_add_counts(&slot, 4, 64, 10).is_ok());
        assert!(check_fetch_add_counts(&slot, 4, 64, 11).is_err());
        slot[0] = 2;
        slot[128] = 3;
        assert!(check_fetch_add_counts(&slot, 4, 64, 10).is_err());
    }
}
