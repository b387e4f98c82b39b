//! The folding and reduction constants, computed here at compile time from the
//! polynomial, with the derivation of each (Gopal et al., "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009, §§ 3–4; the
//! bit-reflected variant, as CRC-32/IEEE 802.3 is reflected).
//!
//! In the reflected domain a 128-bit register holds a polynomial of degree < 128 with
//! its *lowest* bit the *highest* coefficient (the first bit on the wire). Moving such a
//! register forward by `D` bits of message — so that it can be XORed onto the block
//! `D` bits later — multiplies it by x^D mod P. With the register split into its low
//! 64-bit half (the high-degree half, D + 64 bits from the target) and its high half
//! (D bits from it), and a carry-less multiply of reflected operands adding one
//! degree, the two multipliers are [`fold_keys`]`(D)` = (c(D + 32), c(D − 32)), where
//! c(n) = reflect32(x^n mod P) << 1 is a 33-bit value.

/// CRC-32/IEEE generator polynomial P(x), with its x^32 term (normal bit order).
const POLY: u64 = 0x1_04C1_1DB7;

/// x^n mod P(x), normal bit order (bit i = coefficient of x^i), degree < 32.
pub const fn xpow_mod(n: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= POLY;
        }
        i += 1;
    }
    r as u32
}

/// c(n) = reflect32(x^n mod P) << 1: the multiplier that moves a 64-bit half register
/// by n + 32 bits (see the module docs).
pub const fn c(n: u32) -> u64 {
    (xpow_mod(n).reverse_bits() as u64) << 1
}

/// The (low half, high half) multipliers that move a 128-bit register forward by
/// `d` bits of message (`d` ≥ 64).
pub const fn fold_keys(d: u32) -> [u64; 2] {
    [c(d + 32), c(d - 32)]
}

/// P(x) reflected into 33 bits (the Barrett modulus P').
pub const P_REFLECTED: u64 = (POLY.reverse_bits() >> 31) & 0x1_FFFF_FFFF;

/// μ = floor(x^64 / P(x)), reflected into 33 bits (the Barrett multiplier μ').
pub const MU_REFLECTED: u64 = {
    // Long division of x^64 by P over GF(2): the quotient has degree 32.
    let mut rem: u128 = 1 << 64;
    let mut q: u64 = 0;
    let mut s = 32;
    loop {
        if rem & (1u128 << (s + 32)) != 0 {
            rem ^= (POLY as u128) << s;
            q |= 1 << s;
        }
        if s == 0 {
            break;
        }
        s -= 1;
    }
    (q.reverse_bits() >> 31) & 0x1_FFFF_FFFF
};

/// Number of 128-bit lanes the end fold can bring together: the 16 lanes of the four
/// accumulators, up to three more 64-byte chunks (12 lanes) and up to three 16-byte
/// blocks after them.
pub const MAX_LANES: usize = 31;

/// `LANE_KEYS[i]` moves a lane that is `MAX_LANES - 1 - i` lanes (of 128 bits) before
/// the last lane onto it; the last entry (distance 0) is zero, because the last lane is
/// XORed in unmoved. Descending distance, so four consecutive entries are the keys of
/// the four lanes of one 512-bit register in memory order.
pub static LANE_KEYS: [[u64; 2]; MAX_LANES] = {
    let mut t = [[0u64; 2]; MAX_LANES];
    let mut i = 0;
    while i < MAX_LANES - 1 {
        t[i] = fold_keys(128 * (MAX_LANES - 1 - i) as u32);
        i += 1;
    }
    t
};

/// The 128 → 64-bit steps of the final reduction: the low half moves by 64 bits
/// (c(96) multiplies it by x^128 relative to the low half of the result…), then the
/// low 32 bits by 32 (c(64)).
pub const K_96: u64 = c(96);
/// See [`K_96`].
pub const K_64: u64 = c(64);

#[cfg(test)]
mod tests {
    use super::*;

    /// The values published in the Intel paper and used by zlib, Linux and crc32fast
    /// for CRC-32/IEEE: our derivation must reproduce them.
    #[test]
    fn constants_match_the_published_ones() {
        assert_eq!(fold_keys(512), [0x1_5444_2bd4, 0x1_c6e4_1596]);
        assert_eq!(fold_keys(128), [0x1_7519_97d0, 0x0_ccaa_009e]);
        assert_eq!(K_64, 0x1_63cd_6124);
        assert_eq!(P_REFLECTED, 0x1_DB71_0641);
        assert_eq!(MU_REFLECTED, 0x1_F701_1641);
        // The 256-bit kernel's 128-byte stride (`x86/ymm.rs`): Intel's published pair
        // for a 1024-bit fold.
        assert_eq!(fold_keys(1024), [0x1_e88e_f372, 0x1_4a7f_e880]);
        assert_eq!(LANE_KEYS[MAX_LANES - 1], [0, 0]);
        assert_eq!(LANE_KEYS[MAX_LANES - 2], fold_keys(128));
        assert_eq!(LANE_KEYS[0], fold_keys(128 * 30));
    }

    #[test]
    fn xpow_mod_basics() {
        assert_eq!(xpow_mod(0), 1);
        assert_eq!(xpow_mod(31), 1 << 31);
        assert_eq!(xpow_mod(32), 0x04C1_1DB7);
    }
}
