//! Bit fields of CM messages, numbered as IBTA Vol 1 ch. 12 tables number them: byte
//! offset, then bit offset counted from the most significant bit of that byte.
//!
//! Every accessor is total: a buffer too short yields zeros (reads) or is left alone
//! (writes), so a Repr's `parse`, which checks the length first, can never panic.

pub(crate) use crate::bytes::{get_u16, get_u24, get_u32, get_u64, get_u8};
pub(crate) use crate::bytes::{put_u16, put_u24, put_u32, put_u64, put_u8};

/// `width` bits of byte `at`, starting `off` bits below its most significant bit.
pub(crate) fn get_bits(b: &[u8], at: usize, off: u32, width: u32) -> u8 {
    let shift = 8 - off - width;
    (get_u8(b, at) >> shift) & mask(width)
}

/// ORs `v` (truncated to `width` bits) into byte `at` at bit offset `off` (MSB = 0).
/// The emitters zero the whole message first, so OR is a store.
pub(crate) fn put_bits(b: &mut [u8], at: usize, off: u32, width: u32, v: u8) {
    let shift = 8 - off - width;
    let old = get_u8(b, at);
    put_u8(b, at, old | ((v & mask(width)) << shift));
}

/// A flag: one bit.
pub(crate) fn get_flag(b: &[u8], at: usize, off: u32) -> bool {
    get_bits(b, at, off, 1) != 0
}

/// Sets a one-bit flag.
pub(crate) fn put_flag(b: &mut [u8], at: usize, off: u32, v: bool) {
    put_bits(b, at, off, 1, u8::from(v))
}

fn mask(width: u32) -> u8 {
    ((1u16 << width) - 1) as u8
}

/// `N` bytes from `at` (zeros where the buffer is short).
pub(crate) fn get_array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

/// Copies `v` to `at` (nothing if the buffer is short).
pub(crate) fn put_slice(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(s) = b.get_mut(at..at + v.len()) {
        s.copy_from_slice(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_numbered_from_the_msb() {
        // REQ byte 43 of the rxe capture: remote CM response timeout 0x14 (5 bits),
        // transport type 0 (2 bits), flow control 0.
        let b = [0xA0u8];
        assert_eq!(get_bits(&b, 0, 0, 5), 0x14);
        assert_eq!(get_bits(&b, 0, 5, 2), 0);
        assert!(!get_flag(&b, 0, 7));
        let mut out = [0u8];
        put_bits(&mut out, 0, 0, 5, 0x14);
        put_flag(&mut out, 0, 7, true);
        assert_eq!(out, [0xA1]);
        // Short buffers read zero and are not written.
        assert_eq!(get_bits(&[], 3, 0, 8), 0);
        put_bits(&mut [], 3, 0, 8, 0xFF);
    }
}
