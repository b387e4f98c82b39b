//! A live responder under attack: RC, UC and UD QPs in RTS with canaried memory and
//! posted receives, fed structured, ICRC-correct packets from a hostile peer through the
//! NIC's receive path (ICRC → parse → demux → `Qp::handle_packet`), with memory,
//! completion, output and termination oracles after every step. See
//! `fuzz/src/responder/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| wire_fuzz::responder::run(data));
