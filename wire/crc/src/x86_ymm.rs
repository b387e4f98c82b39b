//! The 256-bit kernel, for x86-64 CPUs with VPCLMULQDQ and AVX2 but no AVX-512 (AMD Zen 3,
//! Intel Alder Lake and later client cores): the same algorithm as `x86.rs` at half the
//! register width — four 256-bit accumulators (8 lanes of 128 bits) folded over 128-byte
//! rounds, one parallel end fold, the same Barrett reduction — and the same fused copy
//! with `COPY` (each 32-byte chunk loaded once, stored, and that register folded).
//!
//! Why: without it such a CPU took crc32fast, whose 128-bit PCLMULQDQ loop is about half
//! as fast per byte, after a separate copy (two passes over every payload byte; on the
//! Zen 3 of session 11 the 64 KiB `dataplane` figure was 5.1 GB/s). Numbers:
//! docs/perf.md, "The sending NIC at 64 KiB", session 11.
//!
//! A second copy of `x86.rs`'s loop rather than one loop generic over the register: the
//! 512-bit kernel's codegen is what session 9 measured on Zen 4, and a machine without
//! AVX-512 cannot re-measure it after such a refactor.
//!
//! Every function here needs AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.1; the caller checks
//! them once ([`available`]). Behind `softnic_crc_vpclmul` as `x86.rs` is (VPCLMULQDQ's
//! intrinsics were stabilized in Rust 1.89).
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::consts::{fold_keys, LANE_KEYS, MAX_LANES};
use crate::x86::{block, keys128, reduce};

/// The least length the kernel takes (the crate's threshold; one round is 128 bytes).
pub const MIN_LEN: usize = crate::WIDE_MIN_LEN;

/// The keys of the 128-byte stride of the main loop (four 256-bit accumulators, so
/// each lane moves 1024 bits per round).
const STRIDE_KEYS: [u64; 2] = fold_keys(1024);

/// Whether this CPU runs the kernel; detected once, then one relaxed load.
pub fn available() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = detect();
            STATE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// The features every function here enables, unless [`crate::FORCE_FALLBACK_ENV`] is
/// set (non-empty).
#[cold]
#[inline(never)]
fn detect() -> bool {
    let forced = std::env::var_os(crate::FORCE_FALLBACK_ENV).is_some_and(|v| !v.is_empty());
    !forced
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("vpclmulqdq")
        && is_x86_feature_detected!("pclmulqdq")
        && is_x86_feature_detected!("sse4.1")
}

/// Loads 32-byte chunk `i` of `src` and, with `COPY`, stores it to chunk `i` of `dst`.
///
/// # Safety
/// The CPU has the module's features; `src` is valid for reads and (with `COPY`) `dst`
/// for writes of bytes `[32 i, 32 i + 32)`, and they do not overlap.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn chunk<const COPY: bool>(src: *const u8, dst: *mut u8, i: usize) -> __m256i {
    // SAFETY: the caller guarantees the 32 source bytes are readable; `loadu` has no
    // alignment requirement. One load per source byte: the value folded is the value
    // stored, whatever a concurrent writer of the shared source does (as in `x86.rs`).
    let v = unsafe { _mm256_loadu_si256(src.add(32 * i).cast()) };
    if COPY {
        // SAFETY: the caller guarantees the 32 destination bytes are writable.
        unsafe { _mm256_storeu_si256(dst.add(32 * i).cast(), v) };
    }
    v
}

/// `acc ^ a·keys`, each 128-bit lane of `a` moved by its lane's keys.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold(a: __m256i, keys: __m256i, acc: __m256i) -> __m256i {
    let lo = _mm256_clmulepi64_epi128(a, keys, 0x00);
    let hi = _mm256_clmulepi64_epi128(a, keys, 0x11);
    _mm256_xor_si256(acc, _mm256_xor_si256(lo, hi))
}

/// The keys of lanes `first..first + 2` of `lanes` at the end fold.
#[inline]
#[target_feature(enable = "avx2")]
fn lane_keys(lanes: usize, first: usize) -> __m256i {
    let at = MAX_LANES - lanes + first;
    let keys = &LANE_KEYS[at..at + 2];
    // SAFETY: `keys` is two `[u64; 2]`, 32 readable bytes; `loadu` needs no alignment.
    unsafe { _mm256_loadu_si256(keys.as_ptr().cast()) }
}

/// Folds the whole 16-byte blocks of `len` bytes at `src` (copying them to `dst` with
/// `COPY`) into `crc`; returns the new CRC and how many bytes it covered (`len` rounded
/// down to 16). The caller does the rest.
///
/// # Safety
/// The CPU has the module's features ([`available`]); `len >= MIN_LEN`; `src` is valid
/// for reads of `len` bytes; with `COPY`, `dst` is valid for writes of `len` bytes and
/// does not overlap `src` (without `COPY`, `dst` is not used).
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.1")]
pub unsafe fn chunks<const COPY: bool>(
    crc: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> (u32, usize) {
    assert!(len >= MIN_LEN);
    let n = len / 32;
    // Every `chunk` index below is < n, so its 32 bytes lie in `[0, len)`, which the
    // caller guarantees readable (and writable with `COPY`).
    // SAFETY: indices 0..4 < n (len >= MIN_LEN).
    let mut v = unsafe {
        [
            chunk::<COPY>(src, dst, 0),
            chunk::<COPY>(src, dst, 1),
            chunk::<COPY>(src, dst, 2),
            chunk::<COPY>(src, dst, 3),
        ]
    };
    // The initial CRC goes into the first 32 bits of the message, inverted (as x86.rs).
    v[0] = _mm256_xor_si256(v[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(!crc as i32)));

    let extra = (n - 4) % 4;
    let rounds_end = n - extra;
    let stride = _mm256_broadcastsi128_si256(keys128(STRIDE_KEYS));
    let mut i = 4;
    while i < rounds_end {
        for (k, acc) in v.iter_mut().enumerate() {
            // SAFETY: i + k < rounds_end <= n.
            let next = unsafe { chunk::<COPY>(src, dst, i + k) };
            *acc = fold(*acc, stride, next);
        }
        i += 4;
    }

    // The end fold: registers v[0..4], the `extra` chunks, then at most one 16-byte
    // block, each lane moved onto the last lane, which is XORed in as it is (its key
    // is zero).
    let z = 4 + extra;
    let blocks = len % 32 / 16;
    let lanes = 2 * z + blocks;
    let mut acc = _mm256_setzero_si256();
    let mut last = v[3];
    for (m, r) in v.iter().enumerate() {
        acc = fold(*r, lane_keys(lanes, 2 * m), acc);
    }
    for m in 4..z {
        // SAFETY: rounds_end + m - 4 < rounds_end + extra = n.
        last = unsafe { chunk::<COPY>(src, dst, rounds_end + m - 4) };
        acc = fold(last, lane_keys(lanes, 2 * m), acc);
    }
    if blocks == 0 {
        // The high lane of the last chunk is the last lane.
        acc = _mm256_xor_si256(
            acc,
            _mm256_blend_epi32::<0b1111_0000>(_mm256_setzero_si256(), last),
        );
    }
    let mut x = _mm_xor_si128(
        _mm256_castsi256_si128(acc),
        _mm256_extracti128_si256::<1>(acc),
    );
    if blocks == 1 {
        // SAFETY: 32 n + 16 <= len.
        let b = unsafe { block::<COPY>(src, dst, 32 * n) };
        x = _mm_xor_si128(x, b);
    }
    (reduce(x), 32 * n + 16 * blocks)
}
