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
