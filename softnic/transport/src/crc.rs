//! CRC-32 (crc32fast's, zlib's) for the gather's payload digest: softnic-crc's
//! (`wire/crc/`), whose copy variants read each source byte once, hashing as they copy.
//! The NIC takes `copy_update_raw` from here for its shared mappings (a raw source
//! pointer, never a `&[u8]` over client memory); this crate itself has no unsafe code.

pub use softnic_crc::{copy_update, copy_update_raw, copy_update_to_raw, update};
