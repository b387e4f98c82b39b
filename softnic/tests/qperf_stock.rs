//! Unmodified Debian `qperf` on softnic's drop-in `libibverbs.so.1` + `librdmacm.so.1`,
//! started through `softnic exec` as a user would, between two softnic NICs on loopback.
//!
//! On RoCE qperf runs with `-cm1` (the RDMA CM sets up the connection). Its default
//! mode addresses the peer by LID alone, with no GRH, which a RoCE device cannot send:
//! the kernel refuses such an address for rxe too (`rdma_check_ah_attr`), so softnic
//! refuses it at RTR as they do; qperf lets only its RC tests use the CM, so its UC,
//! UD and XRC tests do not run on RoCE (`docs/ibverbs.md`).
//!
//! These tests FAIL (never skip) when qperf is missing: `.ci/run` installs it.

mod nic_support;
mod stock_support;

use std::path::PathBuf;

use nic_support::NicProc;
use stock_support::exec_on;

fn qperf() -> PathBuf {
    stock_support::stock("qperf", "qperf")
}

/// qperf loads softnic's two libraries from the drop-in directory, every symbol and
/// version node it imports resolving there.
#[test]
fn qperf_links_against_the_drop_in() {
    let dir = stock_support::drop_in_dir();
    stock_support::assert_links_against(&qperf(), &dir, &["librdmacm.so.1", "libibverbs.so.1"]);
}

/// Runs qperf's `tests` (then `quit`, which ends the server) from a client on `cli`
/// against a server on `srv`, both through `softnic exec -d`, the exchange on TCP
/// port `port` (another if that one is taken; `stock_support::pair_run_with`). Returns
/// the client's output; both must exit 0.
fn run(srv: &NicProc, cli: &NicProc, port: u16, tests: &[&str]) -> String {
    let server = |lp: &str| {
        let mut c = exec_on(srv, &qperf());
        c.args(["-lp", lp]);
        c
    };
    let client = |lp: &str| {
        let mut c = exec_on(cli, &qperf());
        c.args(["-lp", lp, "-cm1", "-t", "1"])
            .arg(srv.addr.to_string())
            .args(tests)
            .arg("quit");
        c
    };
    stock_support::pair_run_with(&format!("qperf {tests:?}"), &server, &client, port).1
}

/// The value qperf printed for `test` (`rc_bw:` then `    bw  =  5.77 GB/sec`):
/// `(quantity, value, unit)`.
fn result<'a>(out: &'a str, test: &str) -> (&'a str, f64, &'a str) {
    let head = format!("\n{test}:\n");
    let at = out
        .find(&head)
        .unwrap_or_else(|| panic!("no {test} result in:\n{out}"));
    let line = out[at + head.len()..].lines().next().unwrap_or("");
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some(q), Some("="), Some(v), Some(u)) => {
            let v: f64 = v
                .parse()
                .unwrap_or_else(|_| panic!("{test}: not a number in {line:?}"));
            (q, v, u)
        }
        _ => panic!("{test}: unexpected result line {line:?} in:\n{out}"),
    }
}

/// Every RC test qperf has, over the CM, server on one NIC and client on the other:
/// SEND/RECV bandwidth (one way and both ways) and latency, RDMA WRITE and READ
/// bandwidth and latency, WRITE polling latency, the atomics' message rates, and the
/// two atomics tests that check every returned value (`ver_rc_*`: qperf exits non-zero
/// on a wrong one). qperf's senders ask for no receive queue and its receivers for no
/// send queue (`max_recv_wr` / `max_send_wr` 0), and its server learns its CM port from
/// `rdma_get_src_port` right after `rdma_bind_addr` to port 0, before it listens. Then
/// three of them the other way.
///
/// And one bound on time, because it is a failure rather than a speed: in
/// `rc_rdma_write_poll_lat` both qperf sides wait for each WRITE by reading their
/// buffer in a loop that never yields, and on a 2-core machine the two NICs share the
/// cores with them. A NIC that only yield-spins then gets its core back once per
/// scheduler tick: 2–3 ms per round trip (HZ=250), against 9–12 µs for
/// `rc_rdma_write_lat`. The NIC notices and sleeps when idle instead, so that each
/// wake-up preempts the spinner (`nic/starved.rs`): 60–100 µs on that machine. The
/// bound is 1 ms, ten times that.
#[test]
fn qperf_rc_tests_over_rdma_cm() {
    let (a, b) = stock_support::nic_pair(50, "qperf", 40);
    let all = [
        ("rc_bw", "bw"),
        ("rc_bi_bw", "bw"),
        ("rc_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_rdma_write_poll_lat", "latency"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_compare_swap_mr", "msg_rate"),
        ("rc_fetch_add_mr", "msg_rate"),
        ("ver_rc_compare_swap", "msg_rate"),
        ("ver_rc_fetch_add", "msg_rate"),
    ];
    let some = [all[0], all[2], all[11]];
    for (srv, cli, tests, port) in [(&a, &b, &all[..], 21765), (&b, &a, &some[..], 22765)] {
        let names: Vec<&str> = tests.iter().map(|t| t.0).collect();
        let out = run(srv, cli, port, &names);
        for (test, quantity) in tests {
            let (q, v, unit) = result(&out, test);
            assert_eq!(q, *quantity, "{test}:\n{out}");
            assert!(v > 0.0, "{test}: {v} {unit}\n{out}");
            if *test == "rc_rdma_write_poll_lat" {
                eprintln!("{test}: {v} {unit}");
                let us = v * match unit {
                    "ns" => 1e-3,
                    "us" => 1.0,
                    "ms" => 1e3,
                    _ => 1e6,
                };
                assert!(
                    us < 1_000.0,
                    "{test}: {v} {unit} per round trip: the NICs wait for scheduler ticks \
                     behind qperf's polling loops\n{out}"
                );
            }
        }
    }
}
