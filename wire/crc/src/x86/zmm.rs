//! The kernel at 512 bits (AVX-512F): four 512-bit accumulators, 16 lanes, 256-byte
//! rounds, up to three 16-byte blocks after the last 64-byte chunk. The width session 9
//! measured on a Zen 4 against 256 and 128 bits (docs/perf.md, "softnic-crc").

use core::arch::x86_64::*;

super::kernel! {
    features: ["avx512f", "avx2", "vpclmulqdq", "pclmulqdq", "sse4.1"],
    vector: __m512i,
    load: _mm512_loadu_si512, store: _mm512_storeu_si512, zero: _mm512_setzero_si512,
    broadcast: _mm512_broadcast_i32x4, clmul: _mm512_clmulepi64_epi128,
    // One ternary-logic op for both XORs.
    xor3: |a, b, c| _mm512_ternarylogic_epi64(a, b, c, 0x96),
    xor_low: |v, x| _mm512_xor_si512(v, _mm512_zextsi128_si512(x)),
    // One masked XOR of the two 64-bit words of the top lane.
    xor_top_lane: |acc, last| _mm512_mask_xor_epi64(acc, 0b1100_0000, acc, last),
    to128: |y| {
        let half = _mm256_xor_si256(_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64::<1>(y));
        _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256::<1>(half))
    },
}
