//! `copy_update_to_raw` while another thread writes the destination, as a client may
//! write its memory region while the NIC places a packet's payload into it (the
//! receiver's single pass, `MrTable::write_remote_crc`): on every path the returned CRC
//! must be that of the source — the packet's payload, which the ICRC check then
//! vouches for — whatever lands in the destination. A path that hashed the destination
//! after storing to it (a second pass over the written bytes, or a tail read back)
//! folds the other thread's bytes whenever a write falls between the store and the
//! read, and this test catches it. It fails, too, if too few calls overlapped a write.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softnic_crc::{copy_update_to_raw_on, Path};

/// Destination words (8 bytes each): room for the longest case at its offset.
const WORDS: usize = 600;
/// (destination offset, length): the kernel's rounds, chunks, blocks and tail, and the
/// fallback below 256 bytes.
const CASES: [(usize, usize); 5] = [(3, 4139), (0, 4096), (5, 271), (5, 255), (7, 1000)];
const RACED_WANTED: usize = 5000;
const RACED_MIN: usize = 200;
const MAX_TIME: Duration = Duration::from_secs(10);

fn placed_crc_is_of_the_source(path: Path) {
    let dst: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
    let src: Vec<u8> = (0..WORDS * 8).map(|i| (i * 31 + 7) as u8).collect();
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let g = writes.fetch_add(1, Ordering::Relaxed) + 1;
                for word in &dst {
                    word.store(g.wrapping_mul(0x0101_0101_0101_0101), Ordering::Relaxed);
                }
            }
        });
        let base = dst.as_ptr().cast::<u8>().cast_mut();
        let (mut calls, mut raced) = (0usize, 0usize);
        let start = Instant::now();
        let mut failed = None;
        while failed.is_none() && raced < RACED_WANTED && start.elapsed() < MAX_TIME {
            for (off, len) in CASES {
                let crc = (calls as u32).wrapping_mul(0x9E37_79B9);
                let src = &src[off..off + len];
                let before = writes.load(Ordering::Relaxed);
                // SAFETY: `off + len <= 8 * WORDS` bytes of `dst` (atomics: interior
                // mutability, written by the other thread — the concurrent write the
                // contract allows), not overlapping `src`.
                let got = unsafe { copy_update_to_raw_on(path, crc, src, base.add(off)) };
                raced += usize::from(writes.load(Ordering::Relaxed) != before);
                calls += 1;
                let mut h = crc32fast::Hasher::new_with_initial(crc);
                h.update(src);
                if got != h.finalize() {
                    failed = Some((len, calls));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(failed, None, "{path:?}: CRC is not that of the source");
        eprintln!("{path:?}: {calls} calls, {raced} overlapped a write");
        assert!(
            raced >= RACED_MIN,
            "{path:?}: only {raced} of {calls} calls overlapped a write: too few to test"
        );
    });
}

#[test]
fn placed_crc_is_of_the_source_under_concurrent_destination_writes() {
    for path in Path::runnable() {
        placed_crc_is_of_the_source(path);
    }
}
