//! The `uc_pingpong`, `ud_pingpong` and `srq_pingpong` examples of verbs-api, run as
//! server and client pairs between two NICs, over their TCP exchange: both must finish
//! every iteration and print rdma-core's lines.
//!
//! The example binaries are built by `cargo test --workspace` (cargo builds every
//! example when it tests); run alone, build them first with
//! `cargo build -p verbs-api --examples`. A missing binary fails the test.

mod nic_support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nic_support::*;

/// Longest a pair may run.
const PAIR_WAIT: Duration = Duration::from_secs(60);

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn spawn(exe: &PathBuf, args: &[String]) -> Child {
    Command::new(exe)
        .args(args)
        .env("SOFTNIC_DIR", softnic_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn example")
}

/// Waits (bounded) for `c`; kills it (by its PID) at the deadline.
fn finish(mut c: Child, deadline: Instant) -> (bool, String, String) {
    loop {
        if let Some(st) = c.try_wait().expect("wait") {
            let mut out = String::new();
            let mut err = String::new();
            if let Some(mut o) = c.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (st.success(), out, err);
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            return (false, String::new(), "killed at the deadline".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `name` as server on `b` and client on `a` with `extra` flags; returns both
/// outputs.
fn run_pair(name: &str, a: &NicProc, b: &NicProc, extra: &[&str]) -> (String, String) {
    let exe = example(name);
    let deadline = Instant::now() + PAIR_WAIT;
    let tcp = free_tcp_port().to_string();
    let common: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let mut server_args = vec!["-d".into(), b.name.clone(), "-p".into(), tcp.clone()];
    server_args.extend(["-P".into(), a.port.to_string()]);
    server_args.extend(common.clone());
    let server = spawn(&exe, &server_args);
    let mut client_args = vec!["-d".into(), a.name.clone(), "-p".into(), tcp];
    client_args.extend(["-P".into(), b.port.to_string()]);
    client_args.extend(common);
    client_args.push("127.0.0.1".into());
    // The server may not listen yet: retry a client that could not connect (bounded).
    let (ok, cout, cerr) = loop {
        let r = finish(spawn(&exe, &client_args), deadline);
        if r.0 || !r.2.contains("Couldn't connect") || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (sok, sout, serr) = finish(server, deadline);
    assert!(ok, "{name} client failed: {cerr}\n{cout}");
    assert!(sok, "{name} server failed: {serr}\n{sout}");
    (sout, cout)
}

fn lines(out: &str, what: &str) -> usize {
    out.lines().filter(|l| l.contains(what)).count()
}

fn check_output(out: &str, qps: usize, iters: u32) {
    assert_eq!(lines(out, "local address:"), qps, "{out}");
    assert_eq!(lines(out, "remote address:"), qps, "{out}");
    assert!(out.contains(" Mbit/sec"), "{out}");
    assert!(out.contains(&format!("{iters} iters in ")), "{out}");
}

#[test]
fn uc_pingpong_pairs() {
    let a = NicProc::start("ex-uc-a", "127.0.0.81", 0, &[]);
    let b = NicProc::start("ex-uc-b", "127.0.0.82", 0, &[]);
    for size in ["1", "8192"] {
        let (s, c) = run_pair(
            "uc_pingpong",
            &a,
            &b,
            &["-s", size, "-n", "200", "-m", "1024"],
        );
        check_output(&s, 1, 200);
        check_output(&c, 1, 200);
    }
    assert_eq!(
        b.stat("qp_drop_uc_message") + a.stat("qp_drop_uc_message"),
        0
    );
}

#[test]
fn ud_pingpong_pairs() {
    let a = NicProc::start("ex-ud-a", "127.0.0.83", 0, &[]);
    let b = NicProc::start("ex-ud-b", "127.0.0.84", 0, &[]);
    for size in ["1", "1024", "4096"] {
        let (s, c) = run_pair("ud_pingpong", &a, &b, &["-s", size, "-n", "200"]);
        check_output(&s, 1, 200);
        check_output(&c, 1, 200);
    }
    // ibv_ud_pingpong's local line has a colon before the GID.
    let (s, _) = run_pair("ud_pingpong", &a, &b, &["-n", "1"]);
    assert!(
        s.contains("PSN 0x") && s.contains(": GID ::ffff:127.0.0.84"),
        "{s}"
    );
}

#[test]
fn srq_pingpong_pairs() {
    let a = NicProc::start("ex-srq-a", "127.0.0.85", 0, &[]);
    let b = NicProc::start("ex-srq-b", "127.0.0.86", 0, &[]);
    let (s, c) = run_pair(
        "srq_pingpong",
        &a,
        &b,
        &["-q", "4", "-n", "400", "-r", "64", "-s", "4096"],
    );
    check_output(&s, 4, 400);
    check_output(&c, 4, 400);
    assert_eq!(b.stat("srqs") + a.stat("srqs"), 0, "destroyed at exit");
}

#[test]
fn ud_and_srq_pingpong_over_ipv6() {
    let a = NicProc::start("ex6-a", "::1", 0, &[]);
    let b = NicProc::start("ex6-b", "::1", 0, &[]);
    let (s, c) = run_pair("ud_pingpong", &a, &b, &["-s", "1024", "-n", "100"]);
    check_output(&s, 1, 100);
    check_output(&c, 1, 100);
    assert!(c.contains("GID ::1"), "{c}");
    let (s, c) = run_pair(
        "srq_pingpong",
        &a,
        &b,
        &["-q", "2", "-n", "100", "-r", "16"],
    );
    check_output(&s, 2, 100);
    check_output(&c, 2, 100);
    assert_eq!(a.stat("rx_drop_bad_icrc") + b.stat("rx_drop_bad_icrc"), 0);
}
