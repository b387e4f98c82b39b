//! Mixed pairs: an unmodified Debian binary (perftest, ibverbs-utils) on softnic's
//! drop-in `libibverbs.so.1` (through `softnic exec`) against softnic's own tools on
//! the other NIC — `softnic perf` (which speaks perftest's TCP exchange) and verbs-api's
//! `rc_pingpong` example (rdma-core's pingpong exchange) — in both roles.
//!
//! These tests FAIL (never skip) when a stock binary is missing (`.ci/run` installs
//! `ibverbs-utils` and `perftest`) or the example is not built (`cargo test
//! --workspace` builds it; alone: `cargo build -p verbs-api --examples`).

mod nic_support;
mod stock_support;

use std::path::PathBuf;
use std::process::Command;

use nic_support::{example, softnic_dir, NicProc};
use stock_support::tcp_port;

/// Two NICs at the RoCEv2 port, on a 127.x range of this test binary's own.
fn nic_pair(tag: &str, host: u8) -> (NicProc, NicProc) {
    stock_support::nic_pair(200, tag, host)
}

/// A stock binary, which must be installed.
fn stock(name: &str) -> PathBuf {
    stock_support::stock(name, "ibverbs-utils and perftest")
}

/// `softnic perf TEST -d NIC` with this test's `$SOFTNIC_DIR`.
fn softnic_perf(test: &str, nic: &NicProc) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softnic"));
    c.args(["perf", test, "-d", &nic.name, "--timeout", "30"])
        .env("SOFTNIC_DIR", softnic_dir());
    c
}

/// Who runs on the stock side of a mixed pair.
#[derive(Clone, Copy, Debug)]
enum StockRole {
    Server,
    Client,
}

/// Runs stock `prog ARGS` on `stock_nic` against `own(nic)` (softnic's tool, already
/// given its own arguments) on `own_nic`, the stock binary in `role`; both get
/// `-p PORT` and the client `127.0.0.1`. Returns (stock output, own tool's output).
fn mixed_run(
    prog: &str,
    args: &[&str],
    own: &dyn Fn(&NicProc) -> Command,
    stock_nic: &NicProc,
    own_nic: &NicProc,
    role: StockRole,
    port: u16,
) -> (String, String) {
    let bin = stock(prog);
    let stock_side = |p: &str, peer: Option<&str>| {
        let mut c = stock_support::exec_on(stock_nic, &bin);
        c.args(["-p", p]).args(args).args(peer);
        c
    };
    let own_side = |p: &str, peer: Option<&str>| {
        let mut c = own(own_nic);
        c.args(["-p", p]).args(peer);
        c
    };
    let what = format!("stock {prog} {args:?} as {role:?}");
    match role {
        StockRole::Server => stock_support::pair_run_with(
            &what,
            &|p| stock_side(p, None),
            &|p| own_side(p, Some("127.0.0.1")),
            port,
        ),
        StockRole::Client => {
            let (own_out, stock_out) = stock_support::pair_run_with(
                &what,
                &|p| own_side(p, None),
                &|p| stock_side(p, Some("127.0.0.1")),
                port,
            );
            (stock_out, own_out)
        }
    }
}

/// Stock `ib_write_bw`, `ib_read_bw`, `ib_send_bw` and `ib_send_lat` against `softnic
/// perf write_bw|read_bw|send_bw|send_lat`, the stock binary as server and as client,
/// on NICs alternating: both sides run to their result table over perftest's exchange.
#[test]
fn stock_perftest_against_softnic_perf() {
    use StockRole::{Client, Server};
    let (a, b) = nic_pair("mixed-perf", 2);
    let bw: &[&str] = &["-s", "65536", "-n", "50"];
    // (stock, softnic perf, arguments, the stock role in which softnic perf is where
    // the data lands and checks it with `--verify`)
    let cases = [
        ("ib_write_bw", "write_bw", bw, Some(Client)),
        ("ib_read_bw", "read_bw", bw, Some(Server)),
        ("ib_send_bw", "send_bw", bw, Some(Client)),
        (
            "ib_send_lat",
            "send_lat",
            &["-s", "8", "-n", "20"][..],
            None,
        ),
    ];
    let mut k = 0u16;
    for (prog, test, args, verify_when) in cases {
        for role in [Server, Client] {
            let (stock_nic, own_nic) = if k.is_multiple_of(2) {
                (&a, &b)
            } else {
                (&b, &a)
            };
            let mut all = vec!["-x", "1", "-F"];
            all.extend_from_slice(args);
            let verify = verify_when
                .is_some_and(|r| matches!((r, role), (Server, Server) | (Client, Client)));
            let own = |nic: &NicProc| {
                let mut c = softnic_perf(test, nic);
                c.args(args);
                if verify {
                    c.arg("--verify");
                }
                c
            };
            let (s, o) = mixed_run(prog, &all, &own, stock_nic, own_nic, role, tcp_port());
            k += 1;
            let context = format!(
                "{prog} vs softnic perf {test}, stock {role:?}\n=== stock\n{s}\n=== softnic perf\n{o}"
            );
            // The client prints the result table: (size, iterations, ...).
            let client_out = if matches!(role, Server) { &o } else { &s };
            let has_row = client_out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 5 && f[0] == args[1] && f[1] == args[3]
            });
            assert!(has_row, "no result row: {context}");
            // A stock peer's bytes are rand(): softnic perf checks that they landed.
            if verify {
                let note = o.lines().find(|l| l.starts_with(" softnic verify: "));
                let note = note.unwrap_or_else(|| panic!("not verified: {context}"));
                println!("stock {prog} as {role:?}:{note}");
            }
        }
    }
}

/// Stock `ibv_rc_pingpong` against verbs-api's `rc_pingpong` example, each as server
/// and as client, with both data checks on (`-c`): every iteration on both sides.
#[test]
fn stock_rc_pingpong_against_the_example() {
    let (a, b) = nic_pair("mixed-rc", 4);
    let exe = example("rc_pingpong");
    let cases: [&[&str]; 4] = [
        &["-g", "1", "-c", "-n", "100"],
        &["-g", "1", "-c", "-n", "100"],
        &["-g", "1", "-c", "-n", "20", "-s", "65536", "-m", "4096"],
        &["-g", "1", "-c", "-n", "50", "-s", "1", "-m", "1024"],
    ];
    for (i, args) in cases.into_iter().enumerate() {
        let role = if i % 2 == 0 {
            StockRole::Server
        } else {
            StockRole::Client
        };
        let (stock_nic, own_nic) = if i < 2 { (&a, &b) } else { (&b, &a) };
        let own = |nic: &NicProc| {
            let mut c = Command::new(&exe);
            c.args(["-d", &nic.name])
                .args(args)
                .env("SOFTNIC_DIR", softnic_dir());
            c
        };
        let (s, o) = mixed_run(
            "ibv_rc_pingpong",
            args,
            &own,
            stock_nic,
            own_nic,
            role,
            tcp_port(),
        );
        let n = args[args.iter().position(|x| *x == "-n").unwrap() + 1];
        for out in [&s, &o] {
            assert!(
                out.contains(&format!("{n} iters in")),
                "stock {role:?} {args:?}\n=== stock\n{s}\n=== example\n{o}"
            );
        }
    }
}
