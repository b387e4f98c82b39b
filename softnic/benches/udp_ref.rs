//! Plain-UDP references for `tests/perf/run`: what the NIC's own socket code
//! (`softnic::nic::udp::UdpIo`, the same socket options and calls) achieves over loopback
//! with no RDMA work at all, so the NIC's figures can be given as ratios measured in
//! the same run.
//!
//! ```text
//! cargo bench -p softnic --bench udp_ref -- gso SECONDS    # 64 KiB-ish GSO sends → GRO receiver
//! cargo bench -p softnic --bench udp_ref -- write64k SECONDS # a 64 KiB WRITE's packets, as the NIC sends them
//! cargo bench -p softnic --bench udp_ref -- write64k-connected SECONDS # the same from a connected socket
//! cargo bench -p softnic --bench udp_ref -- msgrate SECONDS # small datagrams, one send each, and GSO runs of 16 and of 64
//! cargo bench -p softnic --bench udp_ref -- pingpong ITERS  # 8 B round trip, both sides spinning
//! ```
//!
//! Each mode prints `key value` lines (the script parses them). Every loop is bounded by
//! its time or iteration count; traffic stays on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softnic::nic::udp::{Offloads, PacketIo, RecvBatch, SendOutcome, UdpIo};

#[path = "common/cpu.rs"]
mod cpu;
use cpu::thread_cpu_ns;

/// A 4096-byte-MTU RDMA WRITE Middle packet as the NIC sends it: BTH 12 + payload 4096 +
/// ICRC 4.
const SEG_4K: usize = 12 + 4096 + 4;
/// An 8-byte RDMA WRITE Only packet: BTH 12 + RETH 16 + payload 8 + ICRC 4.
const SMALL: usize = 12 + 16 + 8 + 4;
/// Segments per GSO send (15 × 4112 fits under the 64 KiB datagram limit).
const SEGS: usize = 15;
/// A 4096-byte-MTU RDMA WRITE First packet: BTH 12 + RETH 16 + payload 4096 + ICRC 4.
/// Its payload is exactly the PMTU (IBTA 9.7.4.2.5), so with the RETH it is 16 bytes
/// longer than the Middle and Last packets that follow it.
const FIRST_4K: usize = 12 + 16 + 4096 + 4;
/// Packets of a 64 KiB WRITE at a 4096-byte MTU: First, 14 × Middle, Last.
const WRITE_64K_PACKETS: usize = 16;

const BOTH: Offloads = Offloads {
    gso: true,
    gro: true,
};

fn bind(off: Offloads) -> UdpIo {
    UdpIo::bind_with("127.0.0.1:0".parse().expect("addr"), off).expect("bind 127.0.0.1")
}

/// A receiving socket and the thread counting what it gets, for [`timed`] to stop.
struct Receiver {
    /// Where to send.
    dest: SocketAddr,
    h: std::thread::JoinHandle<(u64, u64)>,
    stop: Arc<AtomicBool>,
}

/// Binds a GRO socket on 127.0.0.1 and starts a thread counting (datagrams, bytes) on
/// it until stopped; it yields when idle, as the NIC does.
fn receiver() -> Receiver {
    let mut rx = bind(BOTH);
    let dest = rx.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let h = std::thread::spawn(move || {
        let mut batch = RecvBatch::with_slot(rx.recv_slot());
        let (mut n, mut bytes) = (0u64, 0u64);
        while !flag.load(Ordering::Relaxed) {
            let got = rx.recv_batch(&mut batch).expect("recv");
            if got == 0 {
                std::thread::yield_now();
            }
            for i in 0..got {
                if let Some((b, _, _, seg)) = batch.get(i) {
                    n += b.len().div_ceil(seg.max(1)) as u64;
                    bytes += b.len() as u64;
                }
            }
        }
        (n, bytes)
    });
    Receiver { dest, h, stop }
}

/// What a stream measured: datagrams and bytes received, wall seconds, and the
/// sending thread's CPU seconds.
struct Streamed {
    n: u64,
    bytes: u64,
    el: f64,
    tx_cpu: f64,
}

/// Repeats `sends` — each a buffer sent as `seg`-byte datagrams with one
/// `send_segments` call — for `secs`.
fn stream(secs: f64, tx_off: Offloads, sends: &[(&[u8], usize)]) -> Streamed {
    let rx = receiver();
    let dest = rx.dest;
    let mut tx = bind(tx_off);
    let send = || {
        for &(buf, seg) in sends {
            if tx.send_segments(buf, seg, dest, 0) == SendOutcome::Failed {
                panic!("send failed");
            }
        }
    };
    timed(secs, send, rx)
}

/// Calls `send` for `secs`, then lets the receiver `rx` drain what is queued and stops
/// it.
fn timed(secs: f64, mut send: impl FnMut(), rx: Receiver) -> Streamed {
    let (t, cpu0) = (Instant::now(), thread_cpu_ns());
    let run = Duration::from_secs_f64(secs);
    while t.elapsed() < run {
        send();
    }
    let tx_cpu = (thread_cpu_ns() - cpu0) as f64 / 1e9;
    std::thread::sleep(Duration::from_millis(20));
    let el = t.elapsed().as_secs_f64();
    rx.stop.store(true, Ordering::Relaxed);
    let (n, bytes) = rx.h.join().expect("receiver");
    Streamed {
        n,
        bytes,
        el,
        tx_cpu,
    }
}

/// Prints a 64 KiB WRITE pattern's figures under `key`: RDMA payload (65,536 bytes per
/// 16 datagrams received) in Gbit/s, and the sender's CPU time per message.
fn print_write64k(key: &str, r: &Streamed) {
    let messages = r.n / WRITE_64K_PACKETS as u64;
    let gbps = (messages * 65_536) as f64 * 8.0 / r.el / 1e9;
    println!("udp_write64k_{key}_payload_gbps {gbps:.3}");
    let us = r.tx_cpu * 1e6 / messages.max(1) as f64;
    println!("udp_write64k_{key}_sender_cpu_us_per_msg {us:.3}");
}

fn gso(secs: f64) {
    let buf = vec![0x5a; SEG_4K * SEGS];
    let Streamed { bytes, el, .. } = stream(secs, BOTH, &[(&buf, SEG_4K)]);
    println!("udp_gso_gro_gbps {:.3}", bytes as f64 * 8.0 / el / 1e9);
    println!("udp_gso_gro_gbytes_per_s {:.3}", bytes as f64 / el / 1e9);
}

/// The packets of 64 KiB RDMA WRITEs exactly as the NIC's GSO path sends them
/// (`runtime.rs`, `transmit_segments`): a run ends at a shorter packet, so the longer
/// First packet and one Middle go in one `sendmsg` ([4128, 4112]) and the other 13
/// Middles and the Last in a second one (14 × 4112). Reported as RDMA payload
/// (65,536 bytes per 16 datagrams received), the measure `softnic perf write_bw` gives.
/// The two sends of one 64 KiB WRITE: [First, Middle], then the other 14 packets.
fn write64k_bufs() -> (Vec<u8>, Vec<u8>) {
    (
        vec![0x5a; FIRST_4K + SEG_4K],
        vec![0x5a; SEG_4K * (WRITE_64K_PACKETS - 2)],
    )
}

fn write64k(secs: f64) {
    let (first_run, rest) = write64k_bufs();
    let r = stream(secs, BOTH, &[(&first_run, FIRST_4K), (&rest, SEG_4K)]);
    print_write64k("pattern", &r);
}

/// A `UDP_SEGMENT` control message (linux/udp.h) asking for `seg`-byte segments, laid
/// out as `CMSG_SPACE(2)` bytes of a `cmsghdr` (64-bit Linux) without `unsafe`.
fn gso_cmsg(seg: u16) -> [u8; 24] {
    assert_eq!(
        std::mem::size_of::<libc::cmsghdr>(),
        16,
        "64-bit cmsghdr layout"
    );
    let mut c = [0u8; 24];
    c[..8].copy_from_slice(&18u64.to_ne_bytes()); // cmsg_len = CMSG_LEN(2)
    c[8..12].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
    c[12..16].copy_from_slice(&softnic::nic::udp::UDP_SEGMENT.to_ne_bytes());
    c[16..18].copy_from_slice(&seg.to_ne_bytes());
    c
}

/// [`write64k`] from a *connected* socket (no `UdpIo`): the kernel then keeps the route
/// on the socket instead of looking it up on every `sendmsg`, which is what this
/// measures. The NIC cannot do this: Linux numbers a connected socket's IPv4 IDs from a
/// random per-socket counter, which the sender must know for the ICRC (`udp.rs`).
fn write64k_connected(secs: f64) {
    let rx = receiver();
    let tx =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("socket");
    tx.set_send_buffer_size(softnic::nic::udp::SOCKET_BUFFER)
        .expect("SO_SNDBUF");
    tx.connect(&rx.dest.into()).expect("connect");
    let (first_run, rest) = write64k_bufs();
    let sends = [
        (&first_run[..], gso_cmsg(FIRST_4K as u16)),
        (&rest[..], gso_cmsg(SEG_4K as u16)),
    ];
    let send = || {
        for (buf, cmsg) in &sends {
            let iov = [std::io::IoSlice::new(buf)];
            let msg = socket2::MsgHdr::new().with_buffers(&iov).with_control(cmsg);
            tx.sendmsg(&msg, 0).expect("sendmsg");
        }
    };
    print_write64k("connected", &timed(secs, send, rx));
}

fn msgrate(secs: f64) {
    let one = vec![0x5a; SMALL];
    let Streamed { n, el, .. } = stream(secs, Offloads::default(), &[(&one, SMALL)]);
    println!("udp_small_one_send_each_mpps {:.3}", n as f64 / el / 1e6);
    let run = vec![0x5a; SMALL * 16];
    let Streamed { n, el, .. } = stream(secs, BOTH, &[(&run, SMALL)]);
    println!("udp_small_gso16_mpps {:.3}", n as f64 / el / 1e6);
    // The NIC's longest run of small packets.
    let run = vec![0x5a; SMALL * softnic::nic::udp::GSO_MAX_SEGMENTS];
    let Streamed { n, el, .. } = stream(secs, BOTH, &[(&run, SMALL)]);
    println!("udp_small_gso64_mpps {:.3}", n as f64 / el / 1e6);
}

/// Spins on `io` until one datagram arrives (bounded by `limit`).
fn spin_recv(io: &mut UdpIo, batch: &mut RecvBatch, limit: Instant) -> bool {
    while Instant::now() < limit {
        if io.recv_batch(batch).expect("recv") > 0 {
            return true;
        }
    }
    false
}

fn pingpong(iters: usize) {
    let mut a = bind(Offloads::default());
    let b = bind(Offloads::default());
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    let limit = Instant::now() + Duration::from_secs(60);
    let echo = std::thread::spawn(move || {
        let mut b = b;
        let mut batch = RecvBatch::new();
        for _ in 0..iters {
            if !spin_recv(&mut b, &mut batch, limit) {
                return;
            }
            b.send(&[1u8; 8], a_addr, 0);
        }
    });
    let mut batch = RecvBatch::new();
    let mut rtts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.send(&[0u8; 8], b_addr, 0);
        if !spin_recv(&mut a, &mut batch, limit) {
            break;
        }
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().expect("echo");
    rtts.sort_by(f64::total_cmp);
    let med = rtts.get(rtts.len() / 2).copied().unwrap_or(f64::NAN);
    println!("udp_pingpong_rtt_median_us {med:.3}");
    println!("udp_pingpong_count {}", rtts.len());
}

fn main() {
    // `cargo bench` appends `--bench`; ignore flags.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let num = |i: usize, d: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("gso") => gso(num(1, 3.0)),
        Some("write64k") => write64k(num(1, 3.0)),
        Some("write64k-connected") => write64k_connected(num(1, 3.0)),
        Some("msgrate") => msgrate(num(1, 2.0)),
        Some("pingpong") => pingpong(num(1, 20_000.0) as usize),
        _ => {
            eprintln!(
                "usage: udp_ref gso SECONDS | write64k[-connected] SECONDS | msgrate SECONDS | pingpong ITERS"
            );
            std::process::exit(2);
        }
    }
}
