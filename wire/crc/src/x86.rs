//! The x86-64 kernel: four 512-bit accumulators (16 lanes of 128 bits) folded with
//! VPCLMULQDQ over 256-byte rounds, then **one parallel end fold**: every lane (and
//! each 64-byte chunk and 16-byte block left after the last whole round) is multiplied
//! by the constant of its own distance to the last lane, all at once, and the products
//! are XORed
//! together — a tree two multiplies deep instead of crc32fast's chain of 15 dependent
//! 128-bit folds. Then the 128 → 32-bit Barrett reduction (Intel paper § 4).
//!
//! The same loop is the fused copy when `COPY` is set: each 64-byte chunk is loaded
//! once into a register, that register is stored to the destination and folded, so the
//! CRC is that of exactly the bytes stored, whatever another process writes to the
//! source meanwhile.
//!
//! Every function here needs AVX-512F, AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.1; the
//! caller checks them once ([`available`]). The intrinsics for the 512-bit ones were
//! stabilized in Rust 1.89, after the workspace MSRV, hence `incompatible_msrv` allowed
//! below and the whole module behind `softnic_crc_vpclmul` (build.rs).
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::consts::{K_64, K_96, LANE_KEYS, MAX_LANES, MU_REFLECTED, P_REFLECTED, STRIDE_KEYS};

/// The least length the kernel takes: one round of 256 bytes fills the accumulators.
pub const MIN_LEN: usize = crate::WIDE_MIN_LEN;

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
/// set (non-empty), which answers no as on a CPU without them. Out of line: the hot
/// path is [`available`]'s load.
#[cold]
#[inline(never)]
fn detect() -> bool {
    let forced = std::env::var_os(crate::FORCE_FALLBACK_ENV).is_some_and(|v| !v.is_empty());
    !forced
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("vpclmulqdq")
        && is_x86_feature_detected!("pclmulqdq")
        && is_x86_feature_detected!("sse4.1")
}

/// Loads the 16 bytes at `at` of `src` and, with `COPY`, stores them at `at` of `dst`.
///
/// # Safety
/// As [`chunk`], for bytes `[at, at + 16)`.
#[inline]
#[target_feature(enable = "sse2")]
pub(crate) unsafe fn block<const COPY: bool>(src: *const u8, dst: *mut u8, at: usize) -> __m128i {
    // SAFETY: as in `chunk`: 16 readable source bytes, one unaligned load of each.
    let v = unsafe { _mm_loadu_si128(src.add(at).cast()) };
    if COPY {
        // SAFETY: the caller guarantees the 16 destination bytes are writable.
        unsafe { _mm_storeu_si128(dst.add(at).cast(), v) };
    }
    v
}

/// Loads 64-byte chunk `i` of `src` and, with `COPY`, stores it to chunk `i` of `dst`.
///
/// # Safety
/// The CPU has the module's features; `src` is valid for reads and (with `COPY`) `dst`
/// for writes of bytes `[64 i, 64 i + 64)`, and they do not overlap.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn chunk<const COPY: bool>(src: *const u8, dst: *mut u8, i: usize) -> __m512i {
    // SAFETY: the caller guarantees the 64 source bytes are readable; `loadu` has no
    // alignment requirement. One load per source byte: the value folded is the value
    // stored. A concurrent writer of the (shared) source can only change which bytes
    // this load sees, as with `ptr::copy_nonoverlapping` in softnic's memory module.
    let v = unsafe { _mm512_loadu_si512(src.add(64 * i).cast()) };
    if COPY {
        // SAFETY: the caller guarantees the 64 destination bytes are writable.
        unsafe { _mm512_storeu_si512(dst.add(64 * i).cast(), v) };
    }
    v
}

/// `acc ^ a·keys` with each 128-bit lane of `a` moved by its lane's keys (low half
/// times the low key, high half times the high key).
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold(a: __m512i, keys: __m512i, acc: __m512i) -> __m512i {
    let lo = _mm512_clmulepi64_epi128(a, keys, 0x00);
    let hi = _mm512_clmulepi64_epi128(a, keys, 0x11);
    _mm512_ternarylogic_epi64(lo, hi, acc, 0x96)
}

/// The keys of lanes `first..first + 4` of `lanes` at the end fold.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_keys(lanes: usize, first: usize) -> __m512i {
    let at = MAX_LANES - lanes + first;
    let keys = &LANE_KEYS[at..at + 4];
    // SAFETY: `keys` is four `[u64; 2]`, 64 readable bytes; `loadu` needs no alignment.
    unsafe { _mm512_loadu_si512(keys.as_ptr().cast()) }
}

/// Folds the whole 16-byte blocks of `len` bytes at `src` (copying them to `dst` with
/// `COPY`) into `crc`; returns the new CRC and how many bytes it covered (`len` rounded
/// down to 16). The caller does the rest.
///
/// # Safety
/// The CPU has the module's features ([`available`]); `len >= MIN_LEN`; `src` is valid
/// for reads of `len` bytes; with `COPY`, `dst` is valid for writes of `len` bytes and
/// does not overlap `src` (without `COPY`, `dst` is not used).
#[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq,sse4.1")]
pub unsafe fn chunks<const COPY: bool>(
    crc: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> (u32, usize) {
    assert!(len >= MIN_LEN);
    let n = len / 64;
    // Every `chunk` index below is < n, so its 64 bytes lie in `[0, len)`, which the
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
    // The initial CRC goes into the first 32 bits of the message (inverted, as CRC-32
    // starts from all ones and crc32fast's `update` takes the finished value).
    v[0] = _mm512_xor_si512(v[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32)));

    let extra = (n - 4) % 4;
    let rounds_end = n - extra;
    let stride = _mm512_broadcast_i32x4(keys128(STRIDE_KEYS));
    let mut i = 4;
    while i < rounds_end {
        for (k, acc) in v.iter_mut().enumerate() {
            // SAFETY: i + k < rounds_end <= n.
            let next = unsafe { chunk::<COPY>(src, dst, i + k) };
            *acc = fold(*acc, stride, next);
        }
        i += 4;
    }

    // The end fold: registers v[0..4], the `extra` chunks, then the `blocks` 16-byte
    // blocks, each lane moved onto the last lane, which is XORed in as it is.
    let z = 4 + extra;
    let blocks = len % 64 / 16;
    let lanes = 4 * z + blocks;
    let mut acc = _mm512_setzero_si512();
    let mut last = v[3];
    for (m, r) in v.iter().enumerate() {
        acc = fold(*r, lane_keys(lanes, 4 * m), acc);
    }
    for m in 4..z {
        // SAFETY: rounds_end + m - 4 < rounds_end + extra = n.
        last = unsafe { chunk::<COPY>(src, dst, rounds_end + m - 4) };
        acc = fold(last, lane_keys(lanes, 4 * m), acc);
    }
    if blocks == 0 {
        acc = _mm512_mask_xor_epi64(acc, 0b1100_0000, acc, last);
    }
    let half = _mm256_xor_si256(
        _mm512_castsi512_si256(acc),
        _mm512_extracti64x4_epi64::<1>(acc),
    );
    let mut x = _mm_xor_si128(
        _mm256_castsi256_si128(half),
        _mm256_extracti128_si256::<1>(half),
    );
    for j in 0..blocks {
        // SAFETY: 64 n + 16 j + 16 <= 64 n + 16 blocks <= len.
        let b = unsafe { block::<COPY>(src, dst, 64 * n + 16 * j) };
        x = if j + 1 < blocks {
            let k = keys128(LANE_KEYS[MAX_LANES - blocks + j]);
            let lo = _mm_clmulepi64_si128(b, k, 0x00);
            let hi = _mm_clmulepi64_si128(b, k, 0x11);
            _mm_xor_si128(x, _mm_xor_si128(lo, hi))
        } else {
            _mm_xor_si128(x, b)
        };
    }
    (reduce(x), 64 * n + 16 * blocks)
}

/// A 128-bit register of two 64-bit keys (low, high).
#[inline]
#[target_feature(enable = "sse4.1")]
pub(crate) fn keys128(k: [u64; 2]) -> __m128i {
    _mm_set_epi64x(k[1] as i64, k[0] as i64)
}

/// The CRC of a 128-bit remainder `x`: 128 → 96 → 64 bits by two folds, then Barrett
/// reduction to 32 bits (the reflected variant of the Intel paper's § 4), inverted.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
pub(crate) fn reduce(x: __m128i) -> u32 {
    let low32 = _mm_set_epi32(0, 0, 0, -1);
    // The low 64 bits (the high-degree half) times x^96-ish onto the high half.
    let x = _mm_xor_si128(
        _mm_clmulepi64_si128(x, keys128([K_96, 0]), 0x00),
        _mm_srli_si128::<8>(x),
    );
    // The low 32 bits onto the next 64.
    let x = _mm_xor_si128(
        _mm_clmulepi64_si128(_mm_and_si128(x, low32), keys128([K_64, 0]), 0x00),
        _mm_srli_si128::<4>(x),
    );
    // Barrett: T1 = (R mod x^32)·μ', T2 = (T1 mod x^32)·P', CRC = high 32 bits of R ^ T2.
    let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, low32), keys128([MU_REFLECTED, 0]), 0x00);
    let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, low32), keys128([P_REFLECTED, 0]), 0x00);
    !(_mm_extract_epi32::<1>(_mm_xor_si128(x, t2)) as u32)
}
