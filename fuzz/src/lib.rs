//! Harness code shared by the fuzz targets (the targets themselves are in
//! `fuzz_targets/`). Only the `responder` target needs any: it builds a live victim
//! NIC in-process.

pub mod responder;
