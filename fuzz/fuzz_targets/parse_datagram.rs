//! Whole-datagram parse: any bytes given to `PacketRepr::parse` (as a RoCEv2 UDP
//! payload) or to `frame::parse_ethernet` (as a captured frame) must give `Ok` or `Err`,
//! never a panic, and what `parse` accepts must add up to the input length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::{frame, PacketRepr, ROCEV2_UDP_PORT};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PacketRepr::parse(data) {
        let pad = usize::from(p.repr.bth.pad_count);
        assert_eq!(p.header_len + p.payload.len() + pad + 4, data.len());
        assert_eq!(p.repr.payload_len, p.payload.len());
    }
    if let Ok(f) = frame::parse_ethernet(data, ROCEV2_UDP_PORT) {
        let _ = f.verify_icrc();
        let _ = f.icrc_params().verify(f.roce);
        let _ = PacketRepr::parse(f.roce);
    }
    let _ = frame::parse_ip(data, ROCEV2_UDP_PORT);
});
