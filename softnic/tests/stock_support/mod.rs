//! What the tests that run stock rdma-core / perftest binaries on softnic share: finding
//! the binary, printing a run, checking that it links against the drop-in libraries,
//! and a pair of NICs on the RoCEv2 port.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::nic_support::{NicProc, Running};

/// A stock binary, which must be installed (`.ci/run` installs `packages`).
pub fn stock(name: &str, packages: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: install {packages} (.ci/run does)",
        p.display()
    );
    p
}

/// A finished process's status and both outputs, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The directory of softnic's drop-in libraries (`softnic exec --print-lib-dir`, which
/// links them first if need be).
pub fn drop_in_dir() -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .args(["exec", "--print-lib-dir"])
        .env_remove(softnic::exec::LIB_DIR_ENV)
        .output()
        .expect("run softnic exec");
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// `ldd -r BIN` with `LD_LIBRARY_PATH=dir`: asserts that every symbol and version node
/// resolves (the stock binaries are BIND_NOW: one missing symbol and they do not start)
/// and that each of `libs` is loaded from `dir`. Returns ldd's report.
pub fn assert_links_against(bin: &Path, dir: &str, libs: &[&str]) -> String {
    let o = Command::new("ldd")
        .arg("-r")
        .arg(bin)
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .expect("run ldd");
    let out = text(&o);
    let name = bin.display();
    assert!(o.status.success(), "{name}: {out}");
    assert!(
        !out.contains("undefined symbol") && !out.contains("not found"),
        "{name}: {out}"
    );
    for lib in libs {
        assert!(
            out.contains(&format!("{lib} => {dir}/{lib}")),
            "{name} does not load softnic's {lib}: {out}"
        );
    }
    out
}

/// Two NICs on loopback addresses of their own, at the RoCEv2 port: stock programs
/// address a peer by its GID only, so the peer NIC must listen on UDP 4791. The second
/// octet starts at `base` (each test binary its own, so that binaries running at the
/// same time do not collide) and comes with the third from the process id; the last
/// is `host`.
pub fn nic_pair(base: u32, tag: &str, host: u8) -> (NicProc, NicProc) {
    let pid = std::process::id();
    let net = format!("127.{}.{}", base + pid % 50, 1 + (pid / 100) % 250);
    let a = NicProc::start(&format!("{tag}-a"), &format!("{net}.{host}"), 4791, &[]);
    let b = NicProc::start(
        &format!("{tag}-b"),
        &format!("{net}.{}", host + 1),
        4791,
        &[],
    );
    (a, b)
}

/// How many TCP ports for the stock programs' exchange each test process owns
/// ([`tcp_port`] hands them out).
pub const PORTS_PER_PROCESS: u16 = 100;

/// A TCP port for one exchange, never handed out before in this process: the tests of
/// this binary run in parallel, and a client started while another test's server holds
/// its port connects to that server (`pair_run_with` spawns the client without waiting
/// for its own server to listen). The process owns `PORTS_PER_PROCESS` ports from
/// `20000 + (pid % 400) * PORTS_PER_PROCESS` (within 20000..59999), so processes whose
/// ids differ modulo 400 never share one either.
pub fn tcp_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(
        n < PORTS_PER_PROCESS,
        "more than {PORTS_PER_PROCESS} TCP exchanges in one test process: raise PORTS_PER_PROCESS"
    );
    20000 + (std::process::id() % 400) as u16 * PORTS_PER_PROCESS + n
}

/// `softnic exec -d NIC -- BIN` with this test's `$SOFTNIC_DIR`: a stock binary on one
/// NIC, ready for its arguments.
pub fn exec_on(nic: &NicProc, bin: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softnic"));
    c.args(["exec", "-d", &nic.name, "--"])
        .arg(bin)
        .env("SOFTNIC_DIR", crate::nic_support::softnic_dir())
        .env_remove(softnic::exec::LIB_DIR_ENV);
    c
}

/// Runs `server(PORT)` and then `client(PORT)` (the client's command already names
/// 127.0.0.1), both to completion; both must succeed. Returns (server, client) output.
/// The client is restarted while the server does not listen yet; PORT is `port`, or
/// another one if something else on the host holds it (the server then says "Couldn't
/// listen", "Address already in use" or, qperf, "unable to bind to listen port").
/// The pair also starts over when qperf's client lost qperf's own listen race: its
/// server tells the client its CM port before it calls `rdma_listen`, so a quick REQ is
/// rejected (REJ reason 8) and the client prints "unexpected event from RDMA CM: Event
/// rejected" (docs/interop.md, where the rxe rows rerun on it too).
/// `what` names the pair in failure messages.
pub fn pair_run_with(
    what: &str,
    server: &dyn Fn(&str) -> Command,
    client: &dyn Fn(&str) -> Command,
    port: u16,
) -> (String, String) {
    for attempt in 0..4u32 {
        let p = 20000 + ((u32::from(port) - 20000 + attempt * 4999) % 40000) as u16;
        if let Some(outputs) = pair_attempt(what, server, client, &p.to_string()) {
            return outputs;
        }
    }
    panic!("{what}: 4 tries, each lost to a taken TCP port or to qperf's listen race");
}

/// The longest a stock client may run before [`pair_run_with`] kills it: a client
/// that hangs (a lost completion, a missed event) fails its test instead of holding CI.
const CLIENT_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One [`pair_run_with`] attempt; None when the server could not listen on `port`, or
/// the client lost qperf's listen race.
fn pair_attempt(
    what: &str,
    server: &dyn Fn(&str) -> Command,
    client: &dyn Fn(&str) -> Command,
    port: &str,
) -> Option<(String, String)> {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    // Output read as it comes: a server that prints more than a pipe holds (perftest's
    // addresses of 1,000 QPs) would block until the client ended, and the client waits
    // for it.
    let mut srv = Running::spawn(server(port).stdin(Stdio::null()));
    let deadline = Instant::now() + crate::nic_support::WAIT;
    let cli = loop {
        let (mut o, killed) =
            Running::spawn(client(port).stdin(Stdio::null())).finish(CLIENT_LIMIT);
        if killed {
            o.stderr
                .extend_from_slice(format!("\n[killed after {CLIENT_LIMIT:?}]\n").as_bytes());
        }
        // The server may not listen yet: the pingpongs, perftest and qperf then exit at
        // once.
        let t = text(&o);
        let early = !o.status.success()
            && ["Couldn't connect", "Unable to", "failed to connect"]
                .iter()
                .any(|m| t.contains(m));
        if early && !srv.exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        break o;
    };
    let cli_text = text(&cli);
    if !cli.status.success() && cli_text.contains("unexpected event from RDMA CM: Event rejected") {
        eprintln!("{what}: qperf's listen race (a REQ before rdma_listen); starting over");
        return None; // `srv` is killed (by PID) as it drops
    }
    // Bounded wait for the server (the client finished, so it has too, or soon).
    let (srv_out, _) = srv.finish(crate::nic_support::WAIT);
    let srv_text = text(&srv_out);
    if !srv_out.status.success()
        && [
            "Couldn't listen",
            "Address already in use",
            "unable to bind to listen port",
        ]
        .iter()
        .any(|m| srv_text.contains(m))
    {
        return None;
    }
    assert!(
        cli.status.success() && srv_out.status.success(),
        "{what}\n=== client\n{cli_text}\n=== server\n{srv_text}"
    );
    Some((srv_text, cli_text))
}

/// One packet of a [`LoCapture`] (on `lo` a GSO send is one packet).
#[derive(Debug, Clone, Copy)]
pub struct Captured {
    pub src: std::net::IpAddr,
    pub tos: u8,
    pub dest_qpn: u32,
    /// The frame's length on the wire.
    pub len: usize,
}

/// A tcpdump on `lo` of the RoCEv2 datagrams between two NICs of one /24.
pub struct LoCapture {
    child: std::process::Child,
    file: std::path::PathBuf,
    /// tcpdump's stderr, kept open (it reports its counts there as it ends).
    _err: std::io::BufReader<std::process::ChildStderr>,
}

impl LoCapture {
    /// Starts capturing the UDP datagrams to port 4791 between `a` and `b` (either
    /// way; other tests' NICs share the /24) and waits until tcpdump listens.
    pub fn start(a: std::net::IpAddr, b: std::net::IpAddr, tag: &str) -> LoCapture {
        use std::io::{BufRead, BufReader};
        let file = std::env::temp_dir().join(format!("softnic-{tag}-{}.pcap", std::process::id()));
        let mut child = std::process::Command::new("tcpdump")
            // Immediate mode: each packet is handed over as it comes, not when the
            // kernel's ring block fills or times out (a block still in the ring at
            // SIGTERM is lost: "38 packets received by filter, 0 captured").
            .args([
                "-i",
                "lo",
                "--immediate-mode",
                "-U",
                "-n",
                "-s",
                "128",
                "-w",
            ])
            .arg(&file)
            .arg(format!(
                "udp dst port 4791 and ((src host {a} and dst host {b}) or (src host {b} and dst host {a}))"
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start tcpdump");
        let mut err = BufReader::new(child.stderr.take().expect("tcpdump stderr"));
        let mut line = String::new();
        // tcpdump says "listening on lo, ..." once its filter is in place.
        let ready = err.read_line(&mut line).is_ok() && line.contains("listening");
        assert!(ready, "tcpdump did not start: {line}");
        LoCapture {
            child,
            file,
            _err: err,
        }
    }

    /// Stops the capture; each IPv4 packet's source address, IP TOS, BTH destination
    /// QPN and length on the wire.
    pub fn stop(mut self) -> Vec<Captured> {
        // Time to write what it has read.
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
        let pcap = std::fs::read(&self.file).expect("read the capture");
        let _ = std::fs::remove_file(&self.file);
        let mut out = Vec::new();
        let mut off = 24;
        while let Some(h) = pcap.get(off..off + 16) {
            let incl = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
            let len = u32::from_le_bytes([h[12], h[13], h[14], h[15]]) as usize;
            let Some(f) = pcap.get(off + 16..off + 16 + incl) else {
                break;
            };
            // Ethernet (14), IPv4 (20), UDP (8), then the BTH: dest QPN in bytes 5..8.
            if f.len() >= 14 + 20 + 8 + 12 && f[12..14] == [0x08, 0x00] {
                out.push(Captured {
                    src: std::net::Ipv4Addr::new(f[26], f[27], f[28], f[29]).into(),
                    tos: f[15],
                    dest_qpn: u32::from_be_bytes([0, f[47], f[48], f[49]]),
                    len,
                });
            }
            off += 16 + incl;
        }
        out
    }
}
