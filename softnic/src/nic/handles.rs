//! Handle numbers (PD, CQ, MR handles; control connection ids) that never name two
//! live objects at once.
//!
//! Handles count up and wrap. A plain wrapping counter would, after 2^32 allocations,
//! hand out a number that an old, still-live object holds — and the new object's owner
//! could then name the old one (or a request meant for one would reach the other). So
//! the allocator skips every number the caller reports live. Each skipped number is a
//! live object, so one allocation costs at most (live objects + 1) probes, and fails
//! only when every number in the range is live.

/// A wrapping counter over `1..=max` that skips live values (0 is never handed out: it
/// stands for "no object" in the ABI).
#[derive(Debug, Clone)]
pub struct HandleAlloc {
    next: u32,
    max: u32,
}

impl Default for HandleAlloc {
    fn default() -> Self {
        HandleAlloc::new()
    }
}

impl HandleAlloc {
    /// Handles `1..=u32::MAX`.
    pub fn new() -> Self {
        HandleAlloc::with_max(u32::MAX)
    }

    /// Handles `1..=max` (a small `max` lets tests reach the wrap; `max` ≥ 1).
    pub fn with_max(max: u32) -> Self {
        HandleAlloc {
            next: 1,
            max: max.max(1),
        }
    }

    /// The next value that `is_live` does not claim, or `None` when all `max` are live.
    pub fn alloc(&mut self, is_live: impl Fn(u32) -> bool) -> Option<u32> {
        // Bounded: at most `max` probes, and each probe that fails is a live object.
        for _ in 0..self.max {
            let h = self.next;
            self.next = if self.next >= self.max {
                1
            } else {
                self.next + 1
            };
            if !is_live(h) {
                return Some(h);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn wrap_skips_live_handles() {
        let mut a = HandleAlloc::with_max(4);
        let mut live = HashSet::new();
        for want in [1, 2, 3, 4] {
            let h = a.alloc(|h| live.contains(&h)).unwrap();
            assert_eq!(h, want);
            live.insert(h);
        }
        assert_eq!(a.alloc(|h| live.contains(&h)), None, "all four live");
        // Free 2 and 4: the counter has wrapped to 1, which is live, so 2 comes next;
        // then 3 (live) is skipped and 4 comes.
        live.remove(&2);
        live.remove(&4);
        let h = a.alloc(|h| live.contains(&h)).unwrap();
        assert_eq!(h, 2);
        live.insert(h);
        let h = a.alloc(|h| live.contains(&h)).unwrap();
        assert_eq!(h, 4);
        live.insert(h);
        assert_eq!(a.alloc(|h| live.contains(&h)), None);
    }

    #[test]
    fn never_hands_out_a_live_handle_over_many_wraps() {
        // 1000 allocations over 8 numbers, a random half of them freed each round:
        // every handle handed out was free at the time.
        let mut a = HandleAlloc::with_max(8);
        let mut live: HashSet<u32> = HashSet::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(2) && !live.is_empty() {
                let victim = *live.iter().nth((x as usize / 2) % live.len()).unwrap();
                live.remove(&victim);
            }
            if let Some(h) = a.alloc(|h| live.contains(&h)) {
                assert!((1..=8).contains(&h));
                assert!(live.insert(h), "handle {h} handed out while live");
            } else {
                assert_eq!(live.len(), 8);
            }
        }
    }
}
