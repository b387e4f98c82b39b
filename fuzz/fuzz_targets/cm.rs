//! The communication manager under hostile peers: any input is a sequence of
//! operations on one `softnic_transport::cm::Cm` (consumer calls, structured, raw and
//! replayed MADs from hostile addresses, an honest second CM, time jumps), with the
//! round-trip, event, bounded-state, timer and termination oracles checked after every
//! one. The driver is `softnic_transport::cm::fuzzing` (also run by a proptest in
//! `cargo test`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softnic_transport::cm::fuzzing::run(data);
});
