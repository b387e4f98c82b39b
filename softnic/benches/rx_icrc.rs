#![allow(missing_docs)] // criterion macros generate undocumented items
//! The NIC's receive ICRC check (`softnic::nic::rx_icrc::verify`) with its per-peer
//! `PreparedIcrc` cache, against the reference in the same run: building the peer's
//! `IcrcParams` and verifying without preparation, per packet, as the NIC did before.
//! A third case has 256 peers take turns (a sender spraying source ports), so every
//! packet misses the 64-slot cache: the cache's worst case, which should cost about
//! what the reference costs (misses are hashed unprepared, see `PreparedCache`). Its
//! 256 packets are a bigger working set than the reference's one, which at 4112 B
//! adds cache misses of the CPU's own. (4112 B: a 4096-byte-MTU SEND Middle.)
//!
//! Last, at the same sizes, a GSO segment (IPv4 ID 5): checked at its GRO position 5
//! (`verify_segment`: the ID-0 CRC and a few XORs) against solving its ID (`verify`, as
//! for an rxe peer's packet); `{size}B_cached_prepared` above is the ID-0 packet, the
//! cost of the CRC alone.
//!
//! And a GRO buffer of 16 segments verified with a look-up of the sender per datagram
//! against one per buffer (`IdSolver::sender`, `verify_from`).
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softnic::nic::rx_icrc::{self, IdSolver};

/// A `total`-byte RoCEv2 UDP payload (BTH SEND Only + payload + ICRC) from `peer`.
fn packet(total: usize, local: SocketAddr, peer: SocketAddr) -> Vec<u8> {
    packet_with_id(total, local, peer, 0)
}

/// As [`packet`], its ICRC computed for IPv4 ID `id`.
fn packet_with_id(total: usize, local: SocketAddr, peer: SocketAddr, id: u16) -> Vec<u8> {
    let mut v = vec![0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 0, 1];
    v.extend((0..total - 12 - 4).map(|i| i as u8));
    v.extend_from_slice(&[0; 4]);
    rx_icrc::params(local, peer, id)
        .unwrap()
        .fill(&mut v)
        .unwrap();
    v
}

fn bench(c: &mut Criterion) {
    let local: SocketAddr = "127.0.0.3:4791".parse().unwrap();
    let peer: SocketAddr = "127.0.0.2:49441".parse().unwrap();
    let mut g = c.benchmark_group("nic_rx_icrc");
    // 64 B shows the ID paths' own cost; at 4112 B the CRC dominates.
    let sizes = [64usize, 4112];
    for total in sizes {
        let pkt = packet(total, local, peer);
        g.throughput(Throughput::Bytes(total as u64));
        g.bench_function(format!("{total}B_per_packet_params"), |b| {
            b.iter(|| {
                let p = rx_icrc::params(local, std::hint::black_box(peer), 0).unwrap();
                p.verify(std::hint::black_box(&pkt)).unwrap()
            })
        });
        let mut solver = IdSolver::new();
        g.bench_function(format!("{total}B_cached_prepared"), |b| {
            b.iter(|| {
                rx_icrc::verify(&mut solver, local, std::hint::black_box(peer), &pkt).unwrap()
            })
        });
        let peers: Vec<(SocketAddr, Vec<u8>)> = (0..256u16)
            .map(|k| {
                let p = SocketAddr::new(peer.ip(), 40000 + k);
                (p, packet(total, local, p))
            })
            .collect();
        let mut solver = IdSolver::new();
        let mut k = 0;
        g.bench_function(format!("{total}B_256_peers_all_misses"), |b| {
            b.iter(|| {
                let (p, pkt) = &peers[k % peers.len()];
                k += 1;
                rx_icrc::verify(&mut solver, local, *p, pkt).unwrap()
            })
        });
    }
    for total in sizes {
        let seg = packet_with_id(total, local, peer, 5);
        g.throughput(Throughput::Bytes(total as u64));
        let mut solver = IdSolver::new();
        g.bench_function(format!("{total}B_gso_segment_id5_at_position5"), |b| {
            b.iter(|| {
                let p = std::hint::black_box(5);
                rx_icrc::verify_segment(&mut solver, local, peer, &seg, p).unwrap()
            })
        });
        let mut solver = IdSolver::new();
        g.bench_function(format!("{total}B_gso_segment_id5_solved"), |b| {
            b.iter(|| {
                rx_icrc::verify(&mut solver, local, std::hint::black_box(peer), &seg).unwrap()
            })
        });
    }
    // A GRO buffer of 16 GSO segments (IDs 0..15, as a 64 KiB WRITE arrives): each
    // datagram looked up and verified on its own (`verify_segment`, the NIC before
    // session 9) against one look-up of the sender for the buffer (`IdSolver::sender`,
    // then `verify_from` per datagram, as `runtime::receive` does now).
    for total in sizes {
        let run: Vec<Vec<u8>> = (0..16u16)
            .map(|k| packet_with_id(total, local, peer, k))
            .collect();
        g.throughput(Throughput::Bytes(16 * total as u64));
        let mut solver = IdSolver::new();
        g.bench_function(format!("{total}B_gro16_per_datagram_look_up"), |b| {
            b.iter(|| {
                let peer = std::hint::black_box(peer);
                for (k, seg) in run.iter().enumerate() {
                    rx_icrc::verify_segment(&mut solver, local, peer, seg, k).unwrap();
                }
            })
        });
        let mut solver = IdSolver::new();
        g.bench_function(format!("{total}B_gro16_one_sender_look_up"), |b| {
            b.iter(|| {
                let from = solver.sender(local, std::hint::black_box(peer)).unwrap();
                for (k, seg) in run.iter().enumerate() {
                    solver.verify_from(&from, seg, k).unwrap();
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
