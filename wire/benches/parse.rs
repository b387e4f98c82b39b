#![allow(missing_docs)] // criterion macros generate undocumented items
//! Parse + ICRC verify cost per packet (issue target: ≤ 30 ns at 64 B, ≤ 150 ns at 4 KiB).
use core::net::Ipv4Addr;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use wire::{BthRepr, IcrcParams, IpParams, Opcode, PacketRepr, Psn, Qpn, RethRepr};

fn packet(payload_len: usize, params: &IcrcParams) -> Vec<u8> {
    let mut r = PacketRepr::new(BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(0x11), Psn::new(1))
    });
    r.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x1234,
        dma_len: payload_len as u32,
    });
    r.payload_len = payload_len;
    let mut buf = vec![0u8; r.total_len().unwrap()];
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    r.emit(&mut buf, &payload).unwrap();
    params.fill(&mut buf).unwrap();
    buf
}

fn bench(c: &mut Criterion) {
    let params = IcrcParams {
        ip: IpParams::V4 {
            src: Ipv4Addr::new(127, 0, 0, 2),
            dst: Ipv4Addr::new(127, 0, 0, 3),
            id: 0,
            dont_fragment: true,
        },
        src_port: 0xC011,
        dst_port: 4791,
    };
    let prepared = params.prepare();
    let mut g = c.benchmark_group("parse_and_icrc_verify");
    // 64-byte and 4096-byte packets (whole UDP payload, headers + payload + ICRC).
    for total in [64usize, 4096] {
        let pkt = packet(total - 12 - 16 - 4, &params);
        assert_eq!(pkt.len(), total);
        g.throughput(Throughput::Bytes(total as u64));
        // The NIC's receive path: the flow's ICRC prefix is prepared once per peer.
        g.bench_function(format!("{total}B"), |b| {
            b.iter(|| {
                let p = PacketRepr::parse(std::hint::black_box(&pkt)).unwrap();
                prepared.verify(&pkt).unwrap();
                p.repr.payload_len
            })
        });
        // Without preparation: the IP/UDP pseudo-headers are built and hashed per packet.
        g.bench_function(format!("{total}B_unprepared"), |b| {
            b.iter(|| {
                let p = PacketRepr::parse(std::hint::black_box(&pkt)).unwrap();
                params.verify(&pkt).unwrap();
                p.repr.payload_len
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
