//! What the tests that run stock rdma-core / perftest binaries on softnic share: finding
//! the binary, printing a run, checking that it links against the drop-in libraries,
//! and a pair of NICs on the RoCEv2 port.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::nic_support::NicProc;

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

/// A spawned process, killed by PID on drop (also when the test fails).
struct Spawned(Option<std::process::Child>);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `server(PORT)` and then `client(PORT)` (the client's command already names
/// 127.0.0.1), both to completion; both must succeed. Returns (server, client) output.
/// The client is restarted while the server does not listen yet; PORT is `port`, or
/// another one if something else on the host holds it (the server then says "Couldn't
/// listen", "Address already in use" or, qperf, "unable to bind to listen port").
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
    panic!("{what}: no free TCP port for the exchange after 4 tries");
}

/// The longest a stock client may run before [`pair_run_with`] kills it: a client
/// that hangs (a lost completion, a missed event) fails its test instead of holding CI.
const CLIENT_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `cmd`'s output (stdin from /dev/null), killed by PID if it runs longer than `limit`;
/// its output then says so.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = child
        .stdout
        .take()
        .map(crate::nic_support::read_in_background);
    let err = child
        .stderr
        .take()
        .map(crate::nic_support::read_in_background);
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
        h.and_then(|h| h.join().ok()).unwrap_or_default()
    };
    let mut stderr = join(err);
    if !status.success() && std::time::Instant::now() > deadline {
        stderr.extend_from_slice(format!("\n[killed after {limit:?}]\n").as_bytes());
    }
    Output {
        status,
        stdout: join(out),
        stderr,
    }
}

/// One [`pair_run_with`] attempt; None when the server could not listen on `port`.
fn pair_attempt(
    what: &str,
    server: &dyn Fn(&str) -> Command,
    client: &dyn Fn(&str) -> Command,
    port: &str,
) -> Option<(String, String)> {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = server(port)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    // Read as it comes: a server that prints more than a pipe holds (perftest's
    // addresses of 1,000 QPs) would block until the client ended, and the client waits
    // for it.
    let out_reader = child
        .stdout
        .take()
        .map(crate::nic_support::read_in_background);
    let err_reader = child
        .stderr
        .take()
        .map(crate::nic_support::read_in_background);
    let mut srv = Spawned(Some(child));
    let deadline = Instant::now() + crate::nic_support::WAIT;
    let cli = loop {
        let o = output_within(&mut client(port), CLIENT_LIMIT);
        // The server may not listen yet: the pingpongs, perftest and qperf then exit at
        // once.
        let t = text(&o);
        let early = !o.status.success()
            && ["Couldn't connect", "Unable to", "failed to connect"]
                .iter()
                .any(|m| t.contains(m));
        let server_gone = srv.0.as_mut().unwrap().try_wait().unwrap().is_some();
        if early && !server_gone && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        break o;
    };
    let cli_text = text(&cli);
    // Bounded wait for the server (the client finished, so it has too, or soon).
    let deadline = Instant::now() + crate::nic_support::WAIT;
    let mut child = srv.0.take().unwrap();
    let status = loop {
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let srv_out = Output {
        status,
        stdout: out_reader.and_then(|h| h.join().ok()).unwrap_or_default(),
        stderr: err_reader.and_then(|h| h.join().ok()).unwrap_or_default(),
    };
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
