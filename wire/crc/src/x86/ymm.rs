//! The kernel at 256 bits, for x86-64 CPUs with VPCLMULQDQ and AVX2 but no AVX-512 (AMD
//! Zen 3, Intel Alder Lake and later client cores): four 256-bit accumulators (8 lanes),
//! 128-byte rounds, at most one 16-byte block after the last 32-byte chunk.
//!
//! Why: without it such a CPU took crc32fast, whose 128-bit PCLMULQDQ loop is about half
//! as fast per byte, after a separate copy (two passes over every payload byte; on the
//! Zen 3 of session 11 the 64 KiB `dataplane` figure was 5.1 GB/s). Numbers:
//! docs/perf.md, "The sending NIC at 64 KiB", session 11. Nothing here may need AVX-512:
//! every function enables only the features below, so the compiler rejects a call of an
//! intrinsic that does.

use core::arch::x86_64::*;

super::kernel! {
    features: ["avx2", "vpclmulqdq", "pclmulqdq", "sse4.1"],
    vector: __m256i,
    load: _mm256_loadu_si256, store: _mm256_storeu_si256, zero: _mm256_setzero_si256,
    broadcast: _mm256_broadcastsi128_si256, clmul: _mm256_clmulepi64_epi128,
    xor3: |a, b, c| _mm256_xor_si256(c, _mm256_xor_si256(a, b)),
    xor_low: |v, x| _mm256_xor_si256(v, _mm256_zextsi128_si256(x)),
    // The high lane of `last` (a blend with zero) XORed in.
    xor_top_lane: |acc, last| {
        _mm256_xor_si256(acc, _mm256_blend_epi32::<0b1111_0000>(_mm256_setzero_si256(), last))
    },
    to128: |y| _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256::<1>(y)),
}
