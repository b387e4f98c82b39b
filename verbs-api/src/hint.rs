//! Cache prefetch hints: ask the CPU to start fetching lines that are about to be
//! used, so that several misses overlap instead of being taken one after another.
//!
//! Why: with thousands of QPs each one's state and rings are cold when its turn comes
//! (issue 12, "Many QPs"; docs/perf.md). The code that then walks them takes its misses
//! in series, each waiting for the one before (a branch on a loaded field, the next
//! field's load); a burst of hints first turns them into one round trip to memory.
//! The NIC also uses them to fetch a region's next page ahead of a bulk copy
//! (`softnic/src/nic/memory.rs`).
//!
//! Hints only: a prefetch reads and writes nothing, raises no fault whatever the
//! address, and is a no-op on architectures without one here. So these functions take
//! any pointer, in or out of a mapping, and are safe to call.

/// Cache line size assumed for stepping through a range (every x86-64 and most
/// aarch64 CPUs).
pub const LINE: usize = 64;

/// Hints that the line holding `p` will be read soon (PREFETCHT0 on x86-64).
#[inline]
pub fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: PREFETCHT0 (SSE, which every x86-64 CPU has) is a hint: it reads and
        // writes nothing and raises no fault whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints that the line holding `p` will be written soon (PREFETCHW on x86-64: fetched
/// for ownership, so the store that follows does not wait for it).
#[inline]
pub fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW is a hint as above (an x86-64 CPU without it runs it as a
    // no-op).
    unsafe {
        core::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints every line of the `len` bytes at `p` ([`prefetch_write`] when `write`).
#[inline]
pub fn prefetch_range(p: *const u8, len: usize, write: bool) {
    if len == 0 {
        return;
    }
    // From the line holding the first byte to the one holding the last.
    let lead = p as usize % LINE;
    let lines = lead.saturating_add(len).div_ceil(LINE);
    let first = p.wrapping_sub(lead);
    for k in 0..lines {
        let q = first.wrapping_add(k * LINE);
        if write {
            prefetch_write(q);
        } else {
            prefetch_read(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_take_any_address_without_faulting() {
        // Null, unmapped and the top of the address space: a hint never faults.
        for p in [0usize, 0x1000, usize::MAX - 63, usize::MAX] {
            prefetch_read(p as *const u8);
            prefetch_write(p as *const u8);
            prefetch_range(p as *const u8, 200, true);
            prefetch_range(p as *const u8, 200, false);
        }
        let v = [7u8; 300];
        prefetch_range(v.as_ptr(), v.len(), false);
        assert_eq!(v[299], 7, "a hint changes nothing");
    }
}
