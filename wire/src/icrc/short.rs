//! CRC-32 of the short pieces of a packet — the pseudo-headers, the masked BTH, the
//! extension headers, a small payload, the pad — without a `crc32fast::Hasher`.
//!
//! A hasher per packet costs its CPU-feature check on every construction, and its short
//! path hashes the 12-byte BTH through a byte loop: together ≈ 5 % of the 64 KiB
//! `dataplane` bench's profile (docs/perf.md, session 9). Here a slice-by-8 table walk
//! (8 KiB of tables built at compile time) does the same in a few loads per 8 bytes.
//! The semantics are crc32fast's: `update(c, d)` is
//! `Hasher::new_with_initial(c)` updated with `d` and finalized.

use super::POLY;

/// `T[k][b]`: the CRC register after byte `b` followed by `k` zero bytes.
const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

static T: [[u32; 256]; 8] = tables();

/// Advances the (inverted) register `r` over eight bytes read as a little-endian word.
#[inline(always)]
fn step8(r: u32, w: u64) -> u32 {
    let x = w ^ u64::from(r);
    let b = |i: u32| usize::from((x >> (8 * i)) as u8);
    T[7][b(0)]
        ^ T[6][b(1)]
        ^ T[5][b(2)]
        ^ T[4][b(3)]
        ^ T[3][b(4)]
        ^ T[2][b(5)]
        ^ T[1][b(6)]
        ^ T[0][b(7)]
}

/// Advances the register `r` over four bytes read as a little-endian word.
#[inline(always)]
fn step4(r: u32, w: u32) -> u32 {
    let x = w ^ r;
    let b = |i: u32| usize::from((x >> (8 * i)) as u8);
    T[3][b(0)] ^ T[2][b(1)] ^ T[1][b(2)] ^ T[0][b(3)]
}

/// Advances the register `r` over `data`.
#[inline(always)]
fn raw(mut r: u32, data: &[u8]) -> u32 {
    let (words, rest) = data.as_chunks::<8>();
    for w in words {
        r = step8(r, u64::from_le_bytes(*w));
    }
    let rest = match rest.split_first_chunk::<4>() {
        Some((w, rest)) => {
            r = step4(r, u32::from_le_bytes(*w));
            rest
        }
        None => rest,
    };
    for &byte in rest {
        r = (r >> 8) ^ T[0][usize::from(r as u8 ^ byte)];
    }
    r
}

/// CRC-32 of `data` continued from the finished CRC `crc` (`update(0, d)` is
/// `crc32fast::hash(d)`). Meant for inputs of up to a few hundred bytes; longer ones are
/// faster through crc32fast or softnic-crc.
#[inline]
pub(super) fn update(crc: u32, data: &[u8]) -> u32 {
    !raw(!crc, data)
}

/// [`update`] over a BTH with byte 4 (FECN, BECN, reserved) read as all ones (IBTA
/// A17.4.1.1), straight from the packet's bytes: no masked copy to store and reload.
#[inline]
pub(super) fn update_masked_bth(crc: u32, bth: &[u8; 12]) -> u32 {
    let (lo, hi) = bth.split_at(8);
    let mut w = [0u8; 8];
    w.copy_from_slice(lo);
    let mut v = [0u8; 4];
    v.copy_from_slice(hi);
    let r = step8(!crc, u64::from_le_bytes(w) | 0xFF << 32);
    !step4(r, u32::from_le_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(crc: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        h.finalize()
    }

    #[test]
    fn every_length_up_to_300() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 151 + 7) as u8).collect();
        for n in 0..=data.len() {
            for crc in [0, 1, 0xFFFF_FFFF, 0x1234_5678] {
                assert_eq!(update(crc, &data[..n]), reference(crc, &data[..n]), "{n}");
            }
        }
        assert_eq!(update(0, b"123456789"), 0xCBF4_3926); // the CRC-32 check value
    }

    proptest! {
        #[test]
        fn equals_crc32fast(crc in any::<u32>(), data in proptest::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(update(crc, &data), reference(crc, &data));
        }

        #[test]
        fn masked_bth_equals_masked_copy(crc in any::<u32>(), bth in any::<[u8; 12]>()) {
            let mut masked = bth;
            masked[4] = 0xFF;
            prop_assert_eq!(update_masked_bth(crc, &bth), reference(crc, &masked));
        }
    }
}
