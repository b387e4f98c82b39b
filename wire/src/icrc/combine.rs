//! Continuing a CRC over bytes whose own CRC is already known, without reading them.
//!
//! A sender that copies a packet's payload out of registered memory can compute the
//! payload's CRC during that copy (one read of each byte). The ICRC then needs the
//! headers hashed, the payload *combined* in by its CRC and length, and the pad hashed
//! ([`super::PreparedIcrc::compute_with_payload`]).
//!
//! Why that works: with `R(r, M)` the raw CRC-32 register after message `M` from
//! register `r` (no inversions), the register is linear over GF(2) in both `r` and `M`,
//! so `R(r, A‖B) = S_|B|(R(r, A)) ⊕ R(0, B)`, where `S_n` — running the register over
//! `n` zero bytes — is multiplication by `x^(8n)` modulo the CRC polynomial. With
//! crc32fast's (zlib's) finished values, `update(c, M) = !R(!c, M)`, the two inversions
//! cancel the same way: `update(c, M) = S_|M|(c) ⊕ update(0, M)` (zlib's
//! `crc32_combine`). So the CRC of the headers followed by a payload is the headers' CRC
//! shifted by the payload's length, XORed with the payload's CRC from zero.
//!
//! `S_n` is a 32×32 bit matrix; applied through four 256-entry tables (one per byte of
//! the register) it costs four look-ups. This module keeps such tables for every power
//! of two `n = 2^k` bytes, `k < 16` (64 KiB of constants built at compile time), and
//! applies `S_n` as the product of the tables of `n`'s set bits: one step (four
//! look-ups) for the MTU-sized payloads that carry bulk data (256 … 4096 bytes), at
//! most 16 for any datagram — no per-length state, no allocation, nothing a peer or a
//! client can make the NIC build.

use super::POLY;

/// `a · b mod P` in the reflected representation (bit 31 is `x^0`), zlib's `multmodp`.
const fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// Four byte tables of one linear map: `t[i][v]` is the image of `v << (8 i)`.
type Tables = [[u32; 256]; 4];

/// Steps kept: `2^0 … 2^15` bytes. A UDP datagram's payload is shorter than `2^16`.
const STEPS: usize = 16;

/// The tables of `S_{2^k}` for each `k < STEPS`.
const fn build() -> [Tables; STEPS] {
    let mut out = [[[0u32; 256]; 4]; STEPS];
    // x^8 (one zero byte), reflected: bit 31 - 8.
    let mut xpow = 1u32 << (31 - 8);
    let mut k = 0;
    while k < STEPS {
        // Image of each register bit, then every byte value as the XOR of its bits'.
        let mut t = 0;
        while t < 4 {
            let mut v = 1;
            while v < 256 {
                let low = v & (v - 1); // v without its lowest set bit
                let bit = (v ^ low) as u32;
                out[k][t][v] = out[k][t][low] ^ multmodp(xpow, bit << (8 * t));
                v += 1;
            }
            t += 1;
        }
        xpow = multmodp(xpow, xpow); // x^(8·2^(k+1))
        k += 1;
    }
    out
}

static SHIFT: [Tables; STEPS] = build();

#[inline]
fn apply(t: &Tables, c: u32) -> u32 {
    t[0][(c & 0xFF) as usize]
        ^ t[1][((c >> 8) & 0xFF) as usize]
        ^ t[2][((c >> 16) & 0xFF) as usize]
        ^ t[3][(c >> 24) as usize]
}

/// `S_n(crc)`: `crc` (a finished CRC-32, as crc32fast returns) carried over `n` zero
/// bytes' worth of register steps, so that `shift(update(0, A), |B|) ^ update(0, B)`
/// is `update(0, A‖B)` — more generally `update(c, B) = shift(c, |B|) ^ update(0, B)`.
/// `None` when `n ≥ 64 KiB` (no datagram carries that much).
#[inline]
pub fn shift(mut crc: u32, n: usize) -> Option<u32> {
    if n >> STEPS != 0 {
        return None;
    }
    let mut bits = n;
    while bits != 0 {
        let k = bits.trailing_zeros() as usize;
        crc = apply(SHIFT.get(k)?, crc);
        bits &= bits - 1;
    }
    Some(crc)
}

/// `update(c, B)` from `c`, `update(0, B)` and `|B|` (module docs).
#[inline]
pub fn combine(crc: u32, tail_crc: u32, tail_len: usize) -> Option<u32> {
    Some(shift(crc, tail_len)? ^ tail_crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(c: u32, d: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(c);
        h.update(d);
        h.finalize()
    }

    #[test]
    fn combine_is_chaining() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for &c in &[0u32, 1, 0xFFFF_FFFF, 0x1234_5678] {
            for n in (0..300).chain([4095, 4096, 4097, 1904, 9000, 65_535]) {
                let b = &data[..n];
                assert_eq!(
                    combine(c, update(0, b), n),
                    Some(update(c, b)),
                    "c {c:#x} n {n}"
                );
            }
        }
        assert_eq!(shift(5, 1 << 16), None);
    }

    #[test]
    fn shift_is_zero_bytes_without_inversions() {
        // S_n(c) = update(c, 0^n) ^ update(0, 0^n): the register's linear part only.
        let zeros = [0u8; 5000];
        for n in [1, 2, 3, 8, 255, 256, 4096, 4999] {
            let c = 0xDEAD_BEEF;
            let want = update(c, &zeros[..n]) ^ update(0, &zeros[..n]);
            assert_eq!(shift(c, n), Some(want), "n {n}");
        }
    }
}
