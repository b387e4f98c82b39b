//! A reproducer for goodput at 5 % loss both ways (issue 12, docs/perf.md "Goodput
//! under loss", session 12, h4): a stream of 64 KiB WRITEs at MTU 4096 from a send
//! queue kept 128 deep, as `softnic perf write_bw -s 65536` between two NICs run with
//! `--loss 0.05`, in virtual time through the `Pair` harness, one line per seed with
//! the time taken and A's retry counters. It asserts only that every WRITE completes;
//! it is a measuring tool, run by hand:
//!
//! ```text
//! cargo test --release -p softnic-transport --test loss_sweep -- --ignored --nocapture
//! ```
//!
//! Environment (all optional): `SEEDS` (50), `SEED0` (1), `MSGS` per seed (2000),
//! `DEPTH` (128), `TX_NS` — A sends one packet per this many ns, a NIC bound by its
//! own CPU (6000: ~680 MB/s of 4 KiB packets), `TXB_NS` the same for B (300),
//! `LAT_US` one-way latency (20), `LOSS_PCT` each packet's loss in either direction
//! (5), `RX_NS` — when set, B takes A's packets at most one per this many ns, a
//! responder slower than its requester, so a queue stands in front of it (0: none),
//! `TRACE=1` — every packet (send time, arrival, PSN, AckReq or syndrome, dropped).
//!
//! What it showed (session 12): with no queue, every seed alike (1–40: 452–469 MB/s,
//! ~0.9 NAKs ignored as echoes per go-back-N, no Local ACK Timeout); with a queue in
//! front of B (`RX_NS` 6500 / 8000) 296–335 / 198–207 MB/s and ~7 / ~25 echoes per
//! go-back-N: each go-back-N discards what is in flight behind the gap, about the
//! window (at least `MIN_CWND`, 32) once a queue holds it.

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use common::*;
use softnic_transport::qp::QpCaps;
use softnic_transport::testing::{PairConfig, Rng, Seen, Side, Verdict};
use softnic_transport::time::{Duration, Instant};
use softnic_transport::wr::{SendOp, WcStatus};

fn env(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

const LEN: usize = 64 << 10;

#[test]
#[ignore = "a measuring tool (module documentation)"]
fn write_64k_at_5_percent_loss_per_seed() {
    let seeds = env("SEEDS", 50);
    let first = env("SEED0", 1);
    let msgs = env("MSGS", 2000);
    let depth = env("DEPTH", 128);
    let lat_us = env("LAT_US", 20);
    let loss = env("LOSS_PCT", 5) as f64 / 100.0;
    let rx_ns = env("RX_NS", 0);
    let trace = env("TRACE", 0) == 1;
    for seed in first..first + seeds {
        let (mut p, a, b) = sampled_pair(PairConfig {
            timeout: 14,
            caps: QpCaps {
                max_send_wr: 512,
                max_recv_wr: 64,
                max_sge: 4,
                max_inline: 64,
            },
            ..rc(4096)
        });
        p.latency = Duration::from_micros(lat_us);
        p.pace = [
            Some(Duration::from_nanos(env("TX_NS", 6000))),
            Some(Duration::from_nanos(env("TXB_NS", 300))),
        ];
        let now = Rc::new(Cell::new(p.now));
        let log: Rc<RefCell<Vec<String>>> = Rc::new(RefCell::new(Vec::new()));
        let (now_f, log_f) = (now.clone(), log.clone());
        let mut rng = Rng::new(seed);
        let mut free = Instant::ZERO;
        p.filter = Some(Box::new(move |s: &Seen| {
            let t = now_f.get();
            let drop = rng.chance(loss);
            // A responder slower than its requester: a queue in front of B.
            let mut delay = Duration::ZERO;
            if rx_ns > 0 && s.from == Side::A && !drop {
                let start = free.max(t);
                free = start + Duration::from_nanos(rx_ns);
                delay = free.saturating_duration_since(t);
            }
            if trace {
                let what = match s.repr.aeth {
                    Some(a) => format!("{:?}", a.syndrome),
                    None => format!("req ack_req={}", s.repr.bth.ack_req),
                };
                log_f.borrow_mut().push(format!(
                    "{:>6} arr {:>6} {:?} psn={} {} {}",
                    t.as_nanos() / 1000,
                    (t + delay).as_nanos() / 1000 + lat_us,
                    s.from,
                    s.repr.bth.psn.value(),
                    what,
                    if drop { "DROP" } else { "" }
                ));
            }
            if drop {
                Verdict::Drop
            } else {
                Verdict::Delay(delay)
            }
        }));
        let c0 = *p.a.qp.counters();
        let t0 = p.now;
        let (mut posted, mut done) = (0u64, 0u64);
        for _ in 0..100_000_000u64 {
            if done == msgs {
                break;
            }
            while posted < msgs && posted - done < depth {
                let off = (posted as usize % 32) * LEN;
                p.a.qp
                    .post_send(rdma(posted, SendOp::Write, &[a.sge(off, LEN)], &b, off))
                    .unwrap();
                posted += 1;
            }
            now.set(p.now);
            assert!(p.step(), "idle with {done} of {msgs} done");
            while let Some(c) = p.a.qp.poll_completion() {
                assert_eq!(c.status, WcStatus::Success);
                done += 1;
            }
        }
        assert_eq!(done, msgs);
        let took = p.now.saturating_duration_since(t0);
        let c = *p.a.qp.counters();
        println!(
            "seed {seed:4} took {:>9.3} ms {:7.1} MB/s suppressed {:5} seq_nak_retries {:4} \
             early {:4} timeouts {:3} resent {:6} duplicate_responses {:5}",
            took.as_secs_f64() * 1e3,
            (msgs * LEN as u64) as f64 / took.as_secs_f64() / 1e6,
            c.retries_suppressed - c0.retries_suppressed,
            c.seq_nak_retries - c0.seq_nak_retries,
            c.early_retransmits - c0.early_retransmits,
            c.retransmit_timeouts - c0.retransmit_timeouts,
            c.retransmitted_packets - c0.retransmitted_packets,
            c.duplicate_responses - c0.duplicate_responses,
        );
        for l in log.borrow().iter() {
            println!("{l}");
        }
    }
}
