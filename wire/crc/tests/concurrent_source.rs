//! `copy_update_raw` while another thread rewrites the source, as a client may write its
//! memory region while the NIC gathers from it: on every path the returned CRC must be
//! that of the bytes that landed in the destination. A path that reads the source twice
//! — once to copy, once more for the CRC (a second pass, or a tail hashed from the
//! source) — folds bytes it did not store whenever a write falls between the two reads,
//! and this test catches it. It fails, too, if too few calls overlapped a write to have
//! shown anything (the writer thread must get a core while the copies run).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use softnic_crc::{copy_update_raw_on, Path};

/// Source words (8 bytes each): room for the longest case at its offset.
const WORDS: usize = 600;
/// (source offset, length): every part of the kernel — 256-byte rounds, extra 64-byte
/// chunks, 16-byte blocks, the < 16-byte tail — and the fallback below 256 bytes.
const CASES: [(usize, usize); 6] = [(3, 4139), (0, 300), (5, 271), (5, 255), (1, 1000), (7, 511)];
/// Calls that overlapped a writer's sweep, per path, before the test is content.
const RACED_WANTED: usize = 5000;
/// Fewer than this many overlapping calls within [`MAX_TIME`] fails the test.
const RACED_MIN: usize = 200;
/// Upper bound of the copying per path (the loop normally ends on `RACED_WANTED`).
const MAX_TIME: Duration = Duration::from_secs(10);

fn reference(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// Sets the flag when dropped, so the writer stops even when an assertion panics
/// (else the scope would wait for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn race(path: Path) {
    let src: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    // The words the writer sweeps (those of the current case, so that each of its bytes
    // changes as often as possible) and the number of the sweep under way.
    let span = AtomicUsize::new(WORDS);
    let sweep = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Sweep g writes byte value g into every word of the span, so a copy that
            // overlaps it holds two values.
            let mut g: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                g = g.wrapping_add(1);
                sweep.store(g, Ordering::Relaxed);
                let w = (g & 0xFF) * 0x0101_0101_0101_0101;
                for word in &src[..span.load(Ordering::Relaxed)] {
                    word.store(w, Ordering::Relaxed);
                }
            }
        });
        let _stop = StopOnDrop(&stop);
        let base = src.as_ptr().cast::<u8>();
        let mut dst = vec![0u8; WORDS * 8];
        let (mut calls, mut raced) = (0usize, 0usize);
        let start = Instant::now();
        while raced < RACED_WANTED && start.elapsed() < MAX_TIME {
            for (off, len) in CASES {
                span.store((off + len).div_ceil(8), Ordering::Relaxed);
                let dst = &mut dst[..len];
                let crc = (calls as u32).wrapping_mul(0x9E37_79B9);
                let before = sweep.load(Ordering::Relaxed);
                // SAFETY: `off + len <= 8 * WORDS` bytes of `src`, readable (atomics,
                // written by the other thread: the concurrent write the contract allows),
                // not overlapping `dst`.
                let got = unsafe { copy_update_raw_on(path, crc, base.add(off), dst) };
                raced += usize::from(sweep.load(Ordering::Relaxed) != before);
                calls += 1;
                assert_eq!(
                    got,
                    reference(crc, dst),
                    "{path:?}: CRC is not that of the bytes copied (len {len}, call {calls})"
                );
            }
        }
        eprintln!("{path:?}: {calls} calls, {raced} overlapped a sweep");
        assert!(
            raced >= RACED_MIN,
            "{path:?}: only {raced} of {calls} calls overlapped a write: too few to test"
        );
    });
}

#[test]
fn crc_is_of_the_bytes_copied_under_concurrent_writes() {
    for path in Path::runnable() {
        race(path);
    }
}
