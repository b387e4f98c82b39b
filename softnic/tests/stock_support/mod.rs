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
