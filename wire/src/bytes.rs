//! Big-endian field access on byte slices whose length the caller has already checked.
//!
//! Every view calls these only after its `check_len` succeeded, so the fixed-size
//! conversions below cannot fail; they still avoid `unwrap` by falling back to zero.

pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_be_bytes(a)
}

pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 3) {
        a[1..].copy_from_slice(s);
    }
    u32::from_be_bytes(a)
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_be_bytes(a)
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_be_bytes(a)
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    if let Some(s) = b.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn put_u24(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 3) {
        s.copy_from_slice(&v.to_be_bytes()[1..]);
    }
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn get_u8(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

pub(crate) fn put_u8(b: &mut [u8], at: usize, v: u8) {
    if let Some(x) = b.get_mut(at) {
        *x = v;
    }
}
