//! Measurements, not tests (ignored by default; nothing here asserts a speed). Run:
//! `cargo test --release -p softnic --test nic_bench -- --ignored --nocapture --test-threads 1`
//!
//! * WRITE 64 KiB throughput between two NICs, next to one TCP stream over loopback
//!   with 64 KiB writes measured in the same run;
//! * client-side cost of `post_send` (ns per call) and the round trip of a small WRITE;
//! * the 8 B WRITE rate of one QP pair while each NIC also holds 0, 1,000 and 10,000
//!   idle QPs (what an idle QP costs the loop);
//! * the aggregate 8 B WRITE rate over 1, 1,000 and 10,000 *connected* RC QP pairs
//!   (round robin), and the memory each QP costs the NIC and the client (RSS deltas);
//! * `qps_figures`: issue 12's many-QP figures alone, as `key value` lines for
//!   `tests/perf/run --only qps` (bursts of 16 over 1,000 and 10,000 connected QPs, the
//!   memory per QP, one pair with and without 10,000 idle QPs per NIC);
//! * `qps_pattern`: one of those patterns alone, for a profiler and the NICs' counters.

mod nic_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{
    AccessFlags, CompletionQueue, Device, Mtu, QpCap, QpInitAttr, QpType, QueuePair, SendWr,
    WcStatus, WrOpcode,
};

const RUN: Duration = Duration::from_secs(3);

fn tcp_gbps(chunk: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let buf = vec![7u8; chunk];
    let t = Instant::now();
    while t.elapsed() < RUN {
        s.write_all(&buf).expect("write");
    }
    drop(s);
    let n = reader.join().expect("reader");
    n as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn write_64k_throughput_vs_tcp() {
    let tcp = tcp_gbps(64 << 10);
    println!("TCP loopback, one stream, 64 KiB writes: {tcp:.2} Gbit/s");
    write_64k(&["--no-gso", "--no-gro"], 14);
    write_64k(&[], 14);
    let tcp = tcp_gbps(64 << 10);
    println!("TCP loopback, one stream, 64 KiB writes: {tcp:.2} Gbit/s");
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn write_64k_goodput_under_loss() {
    for p in ["0", "0.01", "0.05", "0.2"] {
        write_64k(&["--loss", p, "--seed", "5", "--retry-cnt-7-infinite"], 10);
    }
}

/// WRITE 64 KiB throughput with `args` on both NICs and ACK timeout exponent
/// `timeout` (10 ≈ 4 ms for lossy runs).
fn write_64k(args: &[&str], timeout: u8) {
    let a = NicProc::start("bench-a", "127.0.0.20", 0, args);
    let b = NicProc::start("bench-b", "127.0.0.21", 0, args);
    const MSG: usize = 64 << 10;
    const DEPTH: u64 = 16;
    let (mut x, y) = rc_pair_with_timeout(&a, &b, Mtu::Mtu4096, MSG * DEPTH as usize, 64, timeout);
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let sges: Vec<_> = (0..DEPTH as usize)
        .map(|i| [x.mr.sge(i * MSG, MSG as u32)])
        .collect();
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Instant::now();
    while t.elapsed() < RUN || done < posted {
        while posted - done < DEPTH && t.elapsed() < RUN {
            let s = &sges[(posted % DEPTH) as usize];
            x.qp.post_send(&[SendWr::new(posted, op, s).signaled()])
                .expect("post");
            posted += 1;
        }
        let c = poll_one(&mut x.cq);
        assert_eq!(c.status, WcStatus::Success);
        done += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let gbps = done as f64 * MSG as f64 * 8.0 / secs / 1e9;
    println!(
        "WRITE 64 KiB {args:?}, {DEPTH} outstanding, MTU 4096: {done} messages in {secs:.2} s = {gbps:.2} Gbit/s"
    );
    print_traffic_stats("a", &a);
    print_traffic_stats("b", &b);
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn post_send_cost_and_small_write_round_trip() {
    let a = NicProc::start("lat-a", "127.0.0.22", 0, &[]);
    let b = NicProc::start("lat-b", "127.0.0.23", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 4096, 256);
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let sge = [x.mr.sge(0, 8)];
    // post_send cost: batches of 128 single-WR posts, only the last signaled.
    let mut in_post = Duration::ZERO;
    let mut posts = 0u64;
    for round in 0..200u64 {
        for i in 0..128u64 {
            let mut wr = SendWr::new(round * 128 + i, op, &sge).inline();
            if i == 127 {
                wr = wr.signaled();
            }
            let t = Instant::now();
            x.qp.post_send(&[wr]).expect("post");
            in_post += t.elapsed();
            posts += 1;
        }
        assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    }
    println!(
        "post_send (8-byte inline WRITE, one WR per call): {:.0} ns per call over {posts} calls",
        in_post.as_nanos() as f64 / posts as f64
    );
    // Round trip: post one signaled 8-byte WRITE, spin on the CQ.
    let mut samples = Vec::with_capacity(10_000);
    for i in 0..10_000u64 {
        let t = Instant::now();
        x.qp.post_send(&[SendWr::new(i, op, &sge).signaled()])
            .expect("post");
        assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
        samples.push(t.elapsed());
    }
    samples.sort();
    println!(
        "8-byte WRITE post→completion: median {:.1} µs, p99 {:.1} µs",
        samples[samples.len() / 2].as_secs_f64() * 1e6,
        samples[samples.len() * 99 / 100].as_secs_f64() * 1e6
    );
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn small_write_rate_with_idle_qps() {
    let mut base = None;
    for idle in [0u32, 1_000, 10_000] {
        let a = NicProc::start("idle-a", "127.0.0.24", 0, &QP_LIMITS);
        let b = NicProc::start("idle-b", "127.0.0.25", 0, &QP_LIMITS);
        let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 4096, 256);
        let parked = park_idle_qps(&x, &y, idle);
        let mpps = one_pair_rate(&mut x, &y, RUN);
        let b0 = *base.get_or_insert(mpps);
        println!(
            "8 B WRITE, one QP pair, {idle} idle QPs per NIC: {mpps:.3} Mpps ({:.2}x the 0-idle rate)",
            mpps / b0
        );
        drop(parked);
    }
}

/// Room for 10,000 QPs and more per NIC (the default quota is lower).
const QP_LIMITS: [&str; 4] = ["--max-qps-per-user", "20000", "--max-cqs-per-user", "20000"];

/// Unused QPs and their CQs (kept alive; the QPs drop first).
struct IdleQps {
    _qps: Vec<QueuePair>,
    _cqs: [CompletionQueue; 2],
}

/// `idle` RC QPs on each of the NICs of `x` and `y` (created, never used), with one CQ
/// per NIC for all of them.
fn park_idle_qps(x: &Side, y: &Side, idle: u32) -> IdleQps {
    let cqs = [
        x.ctx.create_cq(16).expect("cq"),
        y.ctx.create_cq(16).expect("cq"),
    ];
    let mut qps = Vec::new();
    for (pd, cq) in [(&x.pd, &cqs[0]), (&y.pd, &cqs[1])] {
        for _ in 0..idle {
            let attr = QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            };
            qps.push(pd.create_qp(&attr).expect("idle qp"));
        }
    }
    IdleQps {
        _qps: qps,
        _cqs: cqs,
    }
}

/// Drives the pair `x` → `y` for `run`: 8 B WRITEs, [`DEPTH`] outstanding, every 32nd
/// signaled (as perftest's CQ moderation does) and the one that fills the window.
/// Returns Mpps; every WR posted has completed when it returns.
fn one_pair_rate(x: &mut Side, y: &Side, run: Duration) -> f64 {
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let sge = [x.mr.sge(0, 8)];
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Instant::now();
    while t.elapsed() < run || done < posted {
        // The clock is read once per refill, which then fills the window: so the last
        // WR posted is always a signaled one (a refill cut short by the clock could end
        // on an unsignaled WR, whose completion never comes).
        let open = t.elapsed() < run;
        while posted - done < DEPTH && open {
            let mut wr = SendWr::new(posted, op, &sge);
            if posted % 32 == 31 || posted - done == DEPTH - 1 {
                wr = wr.signaled();
            }
            x.qp.post_send(&[wr]).expect("post");
            posted += 1;
        }
        let c = poll_one(&mut x.cq);
        assert_eq!(c.status, WcStatus::Success);
        done = c.wr_id + 1;
    }
    done as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// `field` (kB) of /proc/`pid`/status, in bytes.
fn proc_status_bytes(pid: &str, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .map_or(0, |kb: u64| kb * 1024)
}

/// (RssAnon, RssShmem) of process `pid` ("self" for this one).
fn rss(pid: &str) -> (u64, u64) {
    (
        proc_status_bytes(pid, "RssAnon:"),
        proc_status_bytes(pid, "RssShmem:"),
    )
}

fn nic_rss(nic: &NicProc) -> (u64, u64) {
    rss(&nic.pid().expect("NIC pid").to_string())
}

/// CPU time (user + system) of `nic` so far, in seconds (/proc/PID/stat).
fn nic_cpu_seconds(nic: &NicProc) -> f64 {
    let pid = nic.pid().expect("NIC pid");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("NIC stat");
    // The fields after the command name, which is in parentheses: utime and stime are
    // the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').expect("stat format").1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf(3) reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11] + f[12]) as f64 / hz
}

/// `n` RC QPs on each of two NICs, pairwise connected, with one PD, MR and CQ per side.
struct ManyQps {
    xs: Vec<QueuePair>,
    /// The peers (kept alive).
    _ys: Vec<QueuePair>,
    cq: [CompletionQueue; 2],
    mr: [verbs_api::MemoryRegion; 2],
    _pd: [verbs_api::ProtectionDomain; 2],
}

/// `n` RC QPs with `sq` send slots on each of `a` and `b`, pairwise connected.
fn connected_qps(a: &NicProc, b: &NicProc, n: u32, sq: u32) -> ManyQps {
    let ctx = [
        Device::open(&a.name).expect("open a"),
        Device::open(&b.name).expect("open b"),
    ];
    let pd = [
        ctx[0].alloc_pd().expect("pd"),
        ctx[1].alloc_pd().expect("pd"),
    ];
    let mr = [
        pd[0].alloc_mr(4096, AccessFlags::ALL).expect("mr"),
        pd[1].alloc_mr(4096, AccessFlags::ALL).expect("mr"),
    ];
    let cq = [
        ctx[0].create_cq(512).expect("cq"),
        ctx[1].create_cq(16).expect("cq"),
    ];
    let make = |side: usize| -> Vec<QueuePair> {
        (0..n)
            .map(|_| {
                let attr = QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: &cq[side],
                    recv_cq: &cq[side],
                    cap: QpCap {
                        max_send_wr: sq,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                };
                pd[side].create_qp(&attr).expect("qp")
            })
            .collect()
    };
    let (mut xs, mut ys) = (make(0), make(1));
    for (x, y) in xs.iter_mut().zip(ys.iter_mut()) {
        connect_rc((x, a), (y, b), Mtu::Mtu4096, (0, 0), 14);
    }
    ManyQps {
        xs,
        _ys: ys,
        cq,
        mr,
        _pd: pd,
    }
}

/// Drives `q` for `run`: 8 B WRITEs, [`DEPTH`] outstanding in all, posted in bursts of
/// `burst` WRs to one QP (the last one signaled), the QPs in round robin. A QP takes a
/// new burst once its previous ones completed (at most `per_qp` in flight). Returns
/// Mpps; every WR posted has completed when it returns.
fn drive(q: &mut ManyQps, burst: u64, per_qp: u64, run: Duration) -> f64 {
    drive_depth(q, burst, per_qp, DEPTH, run)
}

/// [`drive`] with `depth` WRITEs outstanding in all instead of [`DEPTH`].
fn drive_depth(q: &mut ManyQps, burst: u64, per_qp: u64, depth: u64, run: Duration) -> f64 {
    let op = WrOpcode::RdmaWrite {
        remote_addr: q.mr[1].addr(),
        rkey: q.mr[1].rkey(),
    };
    let sge = [q.mr[0].sge(0, 8)];
    let mut inflight = vec![0u64; q.xs.len()];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut next = 0usize;
    let mut wrs = Vec::with_capacity(burst as usize);
    let t = Instant::now();
    while t.elapsed() < run || done < posted {
        while posted - done + burst <= depth && t.elapsed() < run {
            if inflight[next] < per_qp {
                // wr_id: the QP's index in the high half, to find it on completion.
                wrs.clear();
                wrs.extend((0..burst).map(|k| {
                    let w = SendWr::new((next as u64) << 32 | k, op, &sge);
                    if k == burst - 1 {
                        w.signaled()
                    } else {
                        w
                    }
                }));
                q.xs[next].post_send(&wrs).expect("post");
                inflight[next] += 1;
                posted += burst;
            }
            next = (next + 1) % q.xs.len();
        }
        if done < posted {
            let c = poll_one(&mut q.cq[0]);
            assert_eq!(c.status, WcStatus::Success);
            inflight[(c.wr_id >> 32) as usize] -= 1;
            done += burst;
        }
    }
    done as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// WRITEs in flight in [`drive`] and [`one_pair_rate`].
const DEPTH: u64 = 128;

/// The upper median (the middle one of an odd count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `num` over `den`, round by round.
fn per_round(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter().zip(den).map(|(y, x)| y / x).collect()
}

/// What [`rate_over_qps`] measured. The QPs drop before the NICs.
struct QpsRate {
    /// Mpps of the N pairs and of the one pair, per round.
    many: Vec<f64>,
    one: Vec<f64>,
    /// Bytes per QP: NIC A's private and shared (RssAnon and RssShmem deltas over its N
    /// QPs), and the client's (over both sides' 2N QPs, all in this process).
    nic: (f64, f64),
    client: (f64, f64),
    _qps: [ManyQps; 2],
    a: NicProc,
    b: NicProc,
}

impl QpsRate {
    /// What one QP costs in all: the NIC's private share, its ring segment (one memfd
    /// mapped by both the NIC and the client, so counted in both RSS figures: the
    /// larger of the two shares, once) and the client's private share.
    fn bytes_per_qp(&self) -> f64 {
        self.nic.0 + self.nic.1.max(self.client.1) + self.client.0
    }
}

/// The aggregate 8 B WRITE rate over `n` connected QP pairs against one pair, both sets
/// on the same two NICs and measured alternately (1 s each, five times), so that the
/// load of a shared machine hits both alike; and the memory the `n` QPs cost.
fn rate_over_qps(n: u32, burst: u64, extra: &[&str]) -> QpsRate {
    let mut args = QP_LIMITS.to_vec();
    args.extend_from_slice(extra);
    let a = NicProc::start("many-a", "127.0.0.26", 0, &args);
    let b = NicProc::start("many-b", "127.0.0.27", 0, &args);
    let mut one = connected_qps(&a, &b, 1, DEPTH as u32);
    let before = (nic_rss(&a), rss("self"));
    let mut many = connected_qps(&a, &b, n, burst as u32);
    let after = (nic_rss(&a), rss("self"));
    let (mut r1, mut rn) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        r1.push(drive(
            &mut one,
            burst,
            DEPTH / burst,
            Duration::from_secs(1),
        ));
        rn.push(drive(&mut many, burst, 1, Duration::from_secs(1)));
    }
    let per = |x: u64, y: u64, k: u32| x.saturating_sub(y) as f64 / f64::from(k);
    let ((na, ns), (ca, cs)) = (after.0, after.1);
    let ((na0, ns0), (ca0, cs0)) = (before.0, before.1);
    QpsRate {
        many: rn,
        one: r1,
        nic: (per(na, na0, n), per(ns, ns0, n)),
        client: (per(ca, ca0, 2 * n), per(cs, cs0, 2 * n)),
        _qps: [many, one],
        a,
        b,
    }
}

/// [`rate_over_qps`], printed.
fn write_rate_over_qps(n: u32, burst: u64, extra: &[&str]) {
    let r = rate_over_qps(n, burst, extra);
    let ratios = per_round(&r.many, &r.one);
    let ratios: Vec<String> = ratios.iter().map(|q| format!("{q:.2}")).collect();
    let (m1, mn) = (median(&r.one), median(&r.many));
    println!(
        "8 B WRITE, bursts of {burst} (last signaled), {DEPTH} outstanding: {n} connected QP pairs {mn:.3} Mpps, 1 pair {m1:.3} Mpps (medians of 5 alternating 1 s runs): {:.2}x (per round: {})",
        mn / m1,
        ratios.join(" ")
    );
    print_traffic_stats("A", &r.a);
    print_traffic_stats("B", &r.b);
    println!(
        "  memory per QP (send queue {burst}, receive queue 1): NIC A private {:.0} B + shared segment {:.0} B; \
         client (both sides' QPs) private {:.0} B + shared {:.0} B",
        r.nic.0, r.nic.1, r.client.0, r.client.1,
    );
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn small_write_rate_over_many_connected_qps() {
    // Default NICs, then with the IBTA's fixed Local ACK Timeout instead of the
    // adaptive (RTT-estimated) one.
    for extra in [&[][..], &["--strict-ack-timeout"][..]] {
        println!("NIC arguments {extra:?}:");
        // As perftest -q: each QP keeps its own burst in flight (ACKs coalesce per
        // QP); then the worst case: every message on another QP, each with its own ACK.
        for burst in [16, 1] {
            for n in [1_000, 10_000] {
                write_rate_over_qps(n, burst, extra);
            }
        }
    }
}

/// One pair's 8 B WRITE rate ([`one_pair_rate`]) on two NICs that also hold `idle`
/// unused QPs each, against one pair on two other NICs that hold none, driven
/// alternately for 1 s each, five times. Returns the per-round rates (with, without)
/// and the CPU the NICs with idle QPs used while the other pair ran, in % of one core
/// (their sum): what is not in their own rate, and would slow the other pair.
fn idle_qps_rounds(idle: u32) -> (Vec<f64>, Vec<f64>, f64) {
    let start = |name, addr| NicProc::start(name, addr, 0, &QP_LIMITS);
    let (a0, b0) = (
        start("idle0-a", "127.0.0.28"),
        start("idle0-b", "127.0.0.29"),
    );
    let (a1, b1) = (
        start("idle1-a", "127.0.0.30"),
        start("idle1-b", "127.0.0.31"),
    );
    let (mut x0, y0) = rc_pair(&a0, &b0, Mtu::Mtu4096, 4096, 256);
    let (mut x1, y1) = rc_pair(&a1, &b1, Mtu::Mtu4096, 4096, 256);
    let _parked = park_idle_qps(&x1, &y1, idle);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut cpu, mut secs) = (0.0, 0.0);
    for _ in 0..5 {
        with.push(one_pair_rate(&mut x1, &y1, Duration::from_secs(1)));
        let (c, t) = (nic_cpu_seconds(&a1) + nic_cpu_seconds(&b1), Instant::now());
        without.push(one_pair_rate(&mut x0, &y0, Duration::from_secs(1)));
        cpu += nic_cpu_seconds(&a1) + nic_cpu_seconds(&b1) - c;
        secs += t.elapsed().as_secs_f64();
    }
    (with, without, 100.0 * cpu / secs)
}

/// The figures `tests/perf/run --only qps` reads (issue 12's many-QP goals), as `key
/// value` lines, all keys starting `qps_`: the 8 B WRITE rate over 1,000 and 10,000
/// connected QP pairs in the perftest pattern (bursts of 16 per QP, the last signaled;
/// default NICs) against one pair on the same NICs, alternating, as
/// [`small_write_rate_over_many_connected_qps`] measures it, with the memory per QP;
/// then one pair's rate with 10,000 idle QPs per NIC against one pair without
/// ([`idle_qps_rounds`]). Rates are medians of the rounds, ratios the medians of the
/// per-round ratios. A figure that cannot be taken fails the test.
#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn qps_figures() {
    for n in [1_000, 10_000] {
        let r = rate_over_qps(n, 16, &[]);
        print_traffic_stats("A", &r.a);
        print_traffic_stats("B", &r.b);
        let k = format!("qps_{n}");
        println!("{k}_mpps {:.4}", median(&r.many));
        println!("{k}_one_pair_mpps {:.4}", median(&r.one));
        println!("{k}_ratio {:.3}", median(&per_round(&r.many, &r.one)));
        println!("{k}_nic_private_bytes_per_qp {:.0}", r.nic.0);
        println!("{k}_nic_shared_bytes_per_qp {:.0}", r.nic.1);
        println!("{k}_client_private_bytes_per_qp {:.0}", r.client.0);
        println!("{k}_client_shared_bytes_per_qp {:.0}", r.client.1);
        println!("{k}_bytes_per_qp {:.0}", r.bytes_per_qp());
    }
    let (with, without, cpu) = idle_qps_rounds(10_000);
    println!("qps_idle_10000_mpps {:.4}", median(&with));
    println!("qps_idle_0_mpps {:.4}", median(&without));
    println!("qps_idle_ratio {:.3}", median(&per_round(&with, &without)));
    println!("qps_idle_10000_cpu_percent_meanwhile {cpu:.2}");
}

/// One pattern of [`qps_figures`] alone on fresh NICs, for a profiler and for the NICs'
/// counters (docs/perf.md, "Many QPs", session 17: an ACK per burst): `QPS_PATTERN_N`
/// connected pairs (default 1,000) driven in bursts of 16 per QP, or with
/// `QPS_PATTERN_ONE=1` one pair; `QPS_PATTERN_DEPTH` WRITEs outstanding in all (default
/// 128, as the bench); one warm-up second, then `QPS_PATTERN_SECONDS` (default 6). The
/// line `measuring` marks the start of the timed phase (for `perf record` to begin); the
/// rate and both NICs' traffic counters follow (NIC B's `tx_datagrams` are its ACKs). A
/// pattern that cannot run fails the test.
#[test]
#[ignore = "measurement; run with --ignored --nocapture in release"]
fn qps_pattern() {
    let var = |k: &str, d: u64| std::env::var(k).ok().map_or(d, |v| v.parse().expect(k));
    let (n, one, secs, depth) = (
        var("QPS_PATTERN_N", 1_000) as u32,
        var("QPS_PATTERN_ONE", 0) == 1,
        var("QPS_PATTERN_SECONDS", 6),
        var("QPS_PATTERN_DEPTH", DEPTH),
    );
    let trace = std::env::var("QPS_PATTERN_TRACE").ok();
    let args = |side: &str| {
        let mut v: Vec<String> = QP_LIMITS.iter().map(|s| s.to_string()).collect();
        if let Some(dir) = &trace {
            v.extend(["--trace-lat".to_string(), format!("{dir}/{side}.txt")]);
        }
        v
    };
    let (xa, xb) = (args("a"), args("b"));
    let xa: Vec<&str> = xa.iter().map(String::as_str).collect();
    let xb: Vec<&str> = xb.iter().map(String::as_str).collect();
    let a = NicProc::start("pattern-a", "127.0.0.32", 0, &xa);
    let b = NicProc::start("pattern-b", "127.0.0.33", 0, &xb);
    let (mut q, burst, per_qp) = if one {
        (connected_qps(&a, &b, 1, depth as u32), 16, depth / 16)
    } else {
        (connected_qps(&a, &b, n, 16), 16, 1)
    };
    let run = |q: &mut ManyQps, s| drive_depth(q, burst, per_qp, depth, Duration::from_secs(s));
    run(&mut q, 1);
    println!("measuring");
    std::io::stdout().flush().expect("stdout");
    let mpps = run(&mut q, secs);
    let what = if one {
        "one pair".to_string()
    } else {
        format!("{n} QPs")
    };
    println!("{what}, {depth} outstanding: {mpps:.3} Mpps over {secs} s (counters include the warm-up second)");
    print_traffic_stats("A", &a);
    print_traffic_stats("B", &b);
}
