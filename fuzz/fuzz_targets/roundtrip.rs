//! parse → emit → parse: whatever `PacketRepr::parse` accepts, `emit` must write back
//! into a packet that parses to the same headers and the same payload bytes (reserved
//! bits and the pad bytes' contents may differ: emit writes them as zero). The emitted
//! packet's ICRC, filled for fixed IPv4 and IPv6 parameters, must then verify.
#![no_main]

use core::net::{Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use wire::{IcrcParams, IpParams, PacketRepr, ROCEV2_UDP_PORT};

fuzz_target!(|data: &[u8]| {
    let Ok(first) = PacketRepr::parse(data) else {
        return;
    };
    let len = first.repr.total_len().expect("parsed opcode is known");
    assert_eq!(len, data.len(), "emit length differs from the parsed input");
    let mut buf = vec![0u8; len];
    let n = first
        .repr
        .emit(&mut buf, first.payload)
        .expect("a parsed repr emits");
    assert_eq!(n, len);
    let second = PacketRepr::parse(&buf).expect("an emitted packet parses");
    assert_eq!(second.repr, first.repr);
    assert_eq!(second.payload, first.payload);
    assert_eq!(second.header_len, first.header_len);

    for ip in [
        IpParams::V4 {
            src: Ipv4Addr::new(192, 0, 2, 1),
            dst: Ipv4Addr::new(192, 0, 2, 2),
            id: 0,
            dont_fragment: true,
        },
        IpParams::V6 {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        },
    ] {
        let params = IcrcParams {
            ip,
            src_port: 0xC000,
            dst_port: ROCEV2_UDP_PORT,
        };
        params.fill(&mut buf).expect("fill a parsed-length packet");
        params.verify(&buf).expect("a filled ICRC verifies");
    }
});
