//! The x86-64 kernel, written once ([`kernel!`]) and built at two register widths:
//! [`zmm`] (512 bits, AVX-512F) and [`ymm`] (256 bits, AVX2, for CPUs with VPCLMULQDQ but
//! no AVX-512 such as AMD Zen 3). Four accumulators (16 lanes of 128 bits at 512 bits, 8
//! at 256) are folded with VPCLMULQDQ over rounds of four registers (256 or 128 bytes),
//! then **one parallel end fold**: every lane (and each register-sized chunk and 16-byte
//! block left after the last whole round) is multiplied by the constant of its own
//! distance to the last lane, all at once, and the products are XORed together — a tree
//! two multiplies deep instead of crc32fast's chain of 15 dependent 128-bit folds. Then
//! the 128 → 32-bit Barrett reduction (Intel paper § 4), shared by both widths.
//!
//! The same loop is the fused copy when `COPY` is set: each chunk is loaded once into a
//! register, that register is stored to the destination and folded, so the CRC is that
//! of exactly the bytes stored, whatever another process writes to the source meanwhile.
//!
//! **Why a macro and not a trait over the vector type.** A width is its vector type and
//! a handful of intrinsics (`zmm.rs`, `ymm.rs`); the macro writes each width's
//! operations and kernel as safe `#[target_feature]` functions enabling exactly the
//! features its run-time check detects (both from one list), so the compiler checks
//! that the 256-bit kernel calls nothing that needs AVX-512 (a Zen 4, which has both,
//! could not catch that by running the tests: an AVX-512 intrinsic there fails to
//! build, tried). Rust allows `#[target_feature]` on trait methods only when they are
//! `unsafe fn`: a body generic over a trait would call every intrinsic in an `unsafe`
//! block vouched for by a token, and that check would be lost.
//! The 512-bit expansion compiles to the same instructions as session 9's hand-written
//! kernel did, and the 256-bit one differs from session 11's only in its end-fold tail
//! (docs/perf.md, "softnic-crc", session 12).
//!
//! The 512-bit and VPCLMULQDQ intrinsics were stabilized in Rust 1.89, after
//! the workspace MSRV, hence `incompatible_msrv` allowed below and the whole module
//! behind `softnic_crc_vpclmul` (build.rs).
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::consts::{K_64, K_96, MU_REFLECTED, P_REFLECTED};

pub mod ymm;
pub mod zmm;

/// The least length the kernel takes: one round fills the accumulators (256 bytes at
/// 512 bits; the 256-bit kernel's round is 128 bytes, and it takes the same threshold).
pub const MIN_LEN: usize = crate::WIDE_MIN_LEN;

/// Whether [`crate::FORCE_FALLBACK_ENV`] is set (non-empty): then no width is available,
/// as on a CPU without the features.
fn forced_fallback() -> bool {
    std::env::var_os(crate::FORCE_FALLBACK_ENV).is_some_and(|v| !v.is_empty())
}

/// `detect()`'s answer, computed at the first call and then one relaxed load of `state`
/// (0 not yet known, 1 no, 2 yes).
#[inline]
fn cached(state: &AtomicU8, detect: fn() -> bool) -> bool {
    match state.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = detect();
            state.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Loads the 16 bytes at `at` of `src` and, with `COPY`, stores them at `at` of `dst`.
///
/// # Safety
/// `src` is valid for reads and (with `COPY`) `dst` for writes of bytes
/// `[at, at + 16)`, and they do not overlap.
#[inline]
#[target_feature(enable = "sse2")]
pub(crate) unsafe fn block<const COPY: bool>(src: *const u8, dst: *mut u8, at: usize) -> __m128i {
    // SAFETY: the caller guarantees the 16 source bytes are readable; `loadu` has no
    // alignment requirement. One load of each source byte, as for the chunks.
    let v = unsafe { _mm_loadu_si128(src.add(at).cast()) };
    if COPY {
        // SAFETY: the caller guarantees the 16 destination bytes are writable.
        unsafe { _mm_storeu_si128(dst.add(at).cast(), v) };
    }
    v
}

/// A 128-bit register of two 64-bit keys (low, high).
#[inline]
#[target_feature(enable = "sse2")]
pub(crate) fn keys128(k: [u64; 2]) -> __m128i {
    _mm_set_epi64x(k[1] as i64, k[0] as i64)
}

/// `acc ^ b·k`: the 16-byte block `b` moved by the keys `k` (low half times the low
/// key, high half times the high key).
#[inline]
#[target_feature(enable = "pclmulqdq")]
pub(crate) fn fold128(b: __m128i, k: __m128i, acc: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128(b, k, 0x00);
    let hi = _mm_clmulepi64_si128(b, k, 0x11);
    _mm_xor_si128(acc, _mm_xor_si128(lo, hi))
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

/// The kernel at one register width, expanded in that width's module: its `available`
/// (the run-time check of `features`), the width's operations and `chunks` (the kernel),
/// every function with `features` enabled and no more. A width is its vector type and
/// intrinsics:
/// - `load`, `store`, `zero`, `broadcast`, `clmul`: its unaligned load and store, zero
///   register, broadcast of a 128-bit register to every lane, and carry-less multiply
///   of each lane;
/// - `xor3`: `a ^ b ^ c`;
/// - `xor_low`: `v` with the 128-bit `x` XORed into its lowest lane;
/// - `xor_top_lane`: `acc` with the highest lane of `last` XORed into the same lane;
/// - `to128`: the XOR of the lanes of `acc`.
macro_rules! kernel {
    (
        features: [$($feature:tt),+ $(,)?],
        vector: $V:ty,
        load: $load:path,
        store: $store:path,
        zero: $zero:path,
        broadcast: $broadcast:path,
        clmul: $clmul:path,
        xor3: |$a:ident, $b:ident, $c:ident| $xor3:expr,
        xor_low: |$v:ident, $x:ident| $xor_low:expr,
        xor_top_lane: |$acc:ident, $last:ident| $xor_top_lane:expr,
        to128: |$y:ident| $to128:expr $(,)?
    ) => {
        /// Bytes per register, the size of one chunk of the input.
        const BYTES: usize = ::core::mem::size_of::<$V>();
        /// 128-bit lanes per register.
        const LANES: usize = BYTES / 16;
        /// The keys of a round's stride: four registers, so each lane moves `32 · BYTES`
        /// bits.
        const STRIDE_KEYS: [u64; 2] = $crate::consts::fold_keys(32 * BYTES as u32);

        /// Whether this CPU runs this width's kernel; detected once, then one relaxed
        /// load.
        pub fn available() -> bool {
            static STATE: ::std::sync::atomic::AtomicU8 = ::std::sync::atomic::AtomicU8::new(0);
            $crate::x86::cached(&STATE, detect)
        }

        /// The features [`chunks`] enables, unless [`crate::FORCE_FALLBACK_ENV`] is set.
        /// Out of line: the hot path is [`available`]'s load.
        #[cold]
        #[inline(never)]
        fn detect() -> bool {
            !$crate::x86::forced_fallback() $(&& ::std::is_x86_feature_detected!($feature))+
        }

        /// `a ^ b ^ c`.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn xor3($a: $V, $b: $V, $c: $V) -> $V {
            $xor3
        }

        /// `v` with the 128-bit `x` XORed into its lowest lane.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn xor_low($v: $V, $x: ::core::arch::x86_64::__m128i) -> $V {
            $xor_low
        }

        /// `acc` with the highest lane of `last` XORed into that lane.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn xor_top_lane($acc: $V, $last: $V) -> $V {
            $xor_top_lane
        }

        /// The XOR of the lanes of a register.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn to128($y: $V) -> ::core::arch::x86_64::__m128i {
            $to128
        }

        /// `acc ^ a·keys`, each 128-bit lane of `a` moved by its lane's keys (low half
        /// times the low key, high half times the high key).
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn fold(a: $V, keys: $V, acc: $V) -> $V {
            xor3($clmul(a, keys, 0x00), $clmul(a, keys, 0x11), acc)
        }

        /// Loads chunk `i` of `src` (`BYTES` bytes) and, with `COPY`, stores it to chunk
        /// `i` of `dst`.
        ///
        /// # Safety
        /// The CPU has the features; `src` is valid for reads and (with `COPY`) `dst`
        /// for writes of bytes `[BYTES i, BYTES i + BYTES)`, and they do not overlap.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        unsafe fn chunk<const COPY: bool>(src: *const u8, dst: *mut u8, i: usize) -> $V {
            // SAFETY: the caller guarantees the source bytes are readable; `loadu` has
            // no alignment requirement. One load per source byte: the value folded is
            // the value stored. A concurrent writer of the (shared) source can only
            // change which bytes this load sees, as with `ptr::copy_nonoverlapping` in
            // softnic's memory module.
            let v = unsafe { $load(src.add(BYTES * i).cast()) };
            if COPY {
                // SAFETY: the caller guarantees the destination bytes are writable.
                unsafe { $store(dst.add(BYTES * i).cast(), v) };
            }
            v
        }

        /// The keys of lanes `first..first + LANES` of `lanes` at the end fold.
        #[inline]
        $(#[target_feature(enable = $feature)])+
        fn lane_keys(lanes: usize, first: usize) -> $V {
            let at = $crate::consts::MAX_LANES - lanes + first;
            let keys = &$crate::consts::LANE_KEYS[at..at + LANES];
            // SAFETY: `keys` is `LANES` `[u64; 2]`, `BYTES` readable bytes; `loadu` needs
            // no alignment.
            unsafe { $load(keys.as_ptr().cast()) }
        }

        /// Folds the whole 16-byte blocks of `len` bytes at `src` (copying them to `dst`
        /// with `COPY`) into `crc`; returns the new CRC and how many bytes it covered
        /// (`len` rounded down to 16). The caller does the rest.
        ///
        /// # Safety
        /// The CPU has the features ([`available`]); `len >= MIN_LEN`; `src` is valid
        /// for reads of `len` bytes; with `COPY`, `dst` is valid for writes of `len`
        /// bytes and does not overlap `src` (without `COPY`, `dst` is not used).
        $(#[target_feature(enable = $feature)])+
        pub unsafe fn chunks<const COPY: bool>(
            crc: u32,
            src: *const u8,
            dst: *mut u8,
            len: usize,
        ) -> (u32, usize) {
            use ::core::arch::x86_64::{_mm_cvtsi32_si128, _mm_xor_si128};
            use $crate::consts::{LANE_KEYS, MAX_LANES};
            use $crate::x86::{block, fold128, keys128, reduce};

            assert!(len >= $crate::x86::MIN_LEN);
            let n = len / BYTES;
            // Every `chunk` index below is < n, so its bytes lie in `[0, len)`, which
            // the caller guarantees readable (and writable with `COPY`).
            // SAFETY: indices 0..4 < n (len >= MIN_LEN = 4 · 64 >= 4 · BYTES).
            let mut v = unsafe {
                [
                    chunk::<COPY>(src, dst, 0),
                    chunk::<COPY>(src, dst, 1),
                    chunk::<COPY>(src, dst, 2),
                    chunk::<COPY>(src, dst, 3),
                ]
            };
            // The initial CRC goes into the first 32 bits of the message (inverted, as
            // CRC-32 starts from all ones and crc32fast's `update` takes the finished
            // value).
            v[0] = xor_low(v[0], _mm_cvtsi32_si128(!crc as i32));

            let extra = (n - 4) % 4;
            let rounds_end = n - extra;
            let stride = $broadcast(keys128(STRIDE_KEYS));
            let mut i = 4;
            while i < rounds_end {
                for (k, acc) in v.iter_mut().enumerate() {
                    // SAFETY: i + k < rounds_end <= n.
                    let next = unsafe { chunk::<COPY>(src, dst, i + k) };
                    *acc = fold(*acc, stride, next);
                }
                i += 4;
            }

            // The end fold: registers v[0..4], the `extra` chunks, then the `blocks`
            // 16-byte blocks (at most `LANES - 1`), each lane moved onto the last lane,
            // which is XORed in as it is (its key is zero).
            let z = 4 + extra;
            let blocks = len % BYTES / 16;
            let lanes = LANES * z + blocks;
            let mut acc = $zero();
            let mut last = v[3];
            for (m, r) in v.iter().enumerate() {
                acc = fold(*r, lane_keys(lanes, LANES * m), acc);
            }
            for m in 4..z {
                // SAFETY: rounds_end + m - 4 < rounds_end + extra = n.
                last = unsafe { chunk::<COPY>(src, dst, rounds_end + m - 4) };
                acc = fold(last, lane_keys(lanes, LANES * m), acc);
            }
            if blocks == 0 {
                // The highest lane of the last chunk is the last lane.
                acc = xor_top_lane(acc, last);
            }
            let mut x = to128(acc);
            for j in 0..blocks {
                // SAFETY: BYTES n + 16 j + 16 <= BYTES n + 16 blocks <= len.
                let b = unsafe { block::<COPY>(src, dst, BYTES * n + 16 * j) };
                x = if j + 1 < blocks {
                    fold128(b, keys128(LANE_KEYS[MAX_LANES - blocks + j]), x)
                } else {
                    _mm_xor_si128(x, b)
                };
            }
            (reduce(x), BYTES * n + 16 * blocks)
        }
    };
}
pub(crate) use kernel;
