//! softnic's own cost per message, without sockets: two RC QPs in one process, each
//! packet going transport → ICRC fill (the NIC's prepared per-peer path) → ICRC check
//! (`rx_icrc::verify`, as on receive) → parse → transport, the ACKs the same way back,
//! then the completion. No kernel, no threads, no sleeping.
//!
//! What this does **not** include yet: the client rings (WQE copy from the SQ ring,
//! CQE publication) and the runtime's per-iteration bookkeeping; memory is the
//! transport's `MemVec`, not a mapped memfd. So it is the transport + wire + ICRC part
//! of the data path, a lower bound of the NIC's code cost per message.
//!
//! ```text
//! cargo bench -p softnic --bench dataplane            # ns per 8 B WRITE, GB/s at 64 KiB
//! cargo bench -p softnic --bench dataplane -- small   # only the 8 B figure (or `big`)
//! ```
//! Prints `key value` lines (best of 7 rounds, to filter out time lost to other
//! processes on a shared machine).

use std::net::SocketAddr;
use std::time::Instant as WallClock;

use softnic::nic::runtime::tx_params;
use softnic::nic::rx_icrc::{self, IdSolver};
use softnic_transport::memory::Access;
use softnic_transport::qp::{Qp, QpType};
use softnic_transport::testing::{connect_qp, MemVec, PairConfig};
use softnic_transport::time::Instant;
use softnic_transport::wr::{SendOp, SendWr, Sge, WcStatus, MAX_SGE};
use wire::PacketRepr;

const REGION: u64 = 0x10_0000;

/// One side: a QP, its memory, its address and its ICRC state.
struct Side {
    qp: Qp,
    mem: MemVec,
    addr: SocketAddr,
    solver: IdSolver,
    key: u32,
}

/// Moves every packet `from` wants to send now into `to`, the way the two NICs'
/// runtimes would. Returns how many.
fn hop(from: &mut Side, to: &mut Side, now: Instant, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.qp.poll_transmit(now, buf, &from.mem) {
        let pkt = &mut buf[..t.len];
        let params = tx_params(from.addr, t.dest, 0).expect("same family");
        from.solver.fill(&params, pkt).expect("ICRC fill");
        rx_icrc::verify(&mut to.solver, to.addr, from.addr, pkt).expect("ICRC verifies");
        let parsed = PacketRepr::parse(pkt).expect("parses");
        to.qp.handle_packet(now, from.addr, &parsed, &mut to.mem);
        n += 1;
    }
    n
}

fn pair(msg: usize, depth: usize) -> (Side, Side) {
    let cfg = PairConfig {
        mtu: 4096,
        caps: softnic_transport::qp::QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 16,
            max_sge: 1,
            max_inline: 0,
        },
        ..PairConfig::default()
    };
    let (aa, ba): (SocketAddr, SocketAddr) = (
        "127.0.0.1:4791".parse().expect("addr"),
        "127.0.0.2:4791".parse().expect("addr"),
    );
    let side = |qpn, peer_qpn, addr, peer, rq, sq| {
        let mut qp = Qp::new(qpn, QpType::Rc, 1, cfg.caps);
        connect_qp(&mut qp, &cfg, peer_qpn, peer, rq, sq);
        qp.set_port_mtu(cfg.mtu);
        qp.set_local_addr(addr);
        let mut mem = MemVec::default();
        let key = mem.register(1, REGION, msg * depth, Access::ALL);
        Side {
            qp,
            mem,
            addr,
            solver: IdSolver::new(),
            key,
        }
    };
    let a = side(0x11, 0x22, aa, ba, 5000, 100);
    let b = side(0x22, 0x11, ba, aa, 100, 5000);
    (a, b)
}

/// Runs `rounds` × `depth` WRITEs of `msg` bytes from A to B (the last of each batch
/// signaled); returns the best seconds per message over 7 tries.
fn run(msg: usize, depth: usize, rounds: usize) -> f64 {
    let (mut a, mut b) = pair(msg, depth);
    let mut buf = vec![0u8; 4096 + 256];
    let now = Instant::ZERO;
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        let t = WallClock::now();
        for _ in 0..rounds {
            for i in 0..depth {
                let mut sges = [Sge::default(); MAX_SGE];
                sges[0] = Sge {
                    addr: REGION + (i * msg) as u64,
                    length: msg as u32,
                    lkey: a.key,
                };
                a.qp.post_send(SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write,
                    sges,
                    num_sge: 1,
                    inline: None,
                    remote_addr: REGION + (i * msg) as u64,
                    rkey: b.key,
                    signaled: i + 1 == depth,
                    solicited: false,
                    ud: None,
                })
                .expect("post");
            }
            let mut done = false;
            for _ in 0..100_000 {
                hop(&mut a, &mut b, now, &mut buf);
                hop(&mut b, &mut a, now, &mut buf);
                while let Some(c) = a.qp.poll_completion() {
                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                    done = true;
                }
                if done {
                    break;
                }
            }
            assert!(done, "the batch completed");
        }
        best = best.min(t.elapsed().as_secs_f64() / (rounds * depth) as f64);
    }
    assert_eq!(
        a.mem.bytes(a.key)[..msg],
        b.mem.bytes(b.key)[..msg],
        "data landed"
    );
    best
}

fn main() {
    // `cargo bench` appends `--bench`; `small` or `big` picks one figure (to profile it).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |w: &str| only.is_empty() || only.iter().any(|a| a == w);
    if want("small") {
        let small = run(8, 64, 2_000);
        println!("dataplane_write_8b_ns {:.1}", small * 1e9);
    }
    if want("big") {
        let big = run(64 << 10, 16, 60);
        println!(
            "dataplane_write_64k_gbytes_per_s {:.2}",
            65536.0 / big / 1e9
        );
    }
}
