//! CRC-32 (crc32fast's, zlib's) for the gather's payload digest.
//!
//! A STAND-IN with the signatures of the `softnic_crc` crate (`wire/crc/`, being written
//! in parallel): a plain copy followed by crc32fast, so it reads each byte twice. When
//! that crate is on main this file becomes `pub use softnic_crc::{update, copy_update}`
//! — its fused copy reads each byte once. (The raw-pointer variant the NIC needs for
//! shared mappings lives in the NIC: this crate has no unsafe code.)

/// Continues the CRC `crc` (a finished value; 0 to start) over `data`:
/// `update(0, d) == crc32fast::hash(d)`, and updates chain.
pub fn update(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// Copies `src` into `dst` (equal lengths) and returns `update(crc, src)`.
///
/// # Panics
/// If the lengths differ (as `copy_from_slice`).
pub fn copy_update(crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    dst.copy_from_slice(src);
    update(crc, dst)
}
