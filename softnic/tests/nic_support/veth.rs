//! A network namespace joined to the test's own by a veth pair, for tests that need a
//! real link (root only). Removed when the guard drops, also when a test fails.

use std::process::Command;

/// Runs a command that must succeed (`ip`, `ethtool`, ...).
pub fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespace `ns` holding `peer`, the other end of `veth` (in this namespace). Both ends
/// are up and have no addresses yet.
pub struct VethLab {
    pub ns: String,
    pub veth: String,
    pub peer: String,
}

impl VethLab {
    /// `tag` (at most 4 characters) and the PID keep concurrent tests apart.
    pub fn new(tag: &str) -> VethLab {
        let pid = std::process::id();
        let lab = VethLab {
            ns: format!("sn{tag}{pid}"),
            veth: format!("{tag}{}a", pid % 100_000),
            peer: format!("{tag}{}b", pid % 100_000),
        };
        run(&["ip", "netns", "add", &lab.ns]);
        run(&[
            "ip", "link", "add", &lab.veth, "type", "veth", "peer", "name", &lab.peer, "netns",
            &lab.ns,
        ]);
        run(&["ip", "link", "set", &lab.veth, "up"]);
        run(&["ip", "-n", &lab.ns, "link", "set", &lab.peer, "up"]);
        lab
    }

    /// Adds `cidr` to this namespace's end (`inside` false) or the namespace's.
    pub fn add_addr(&self, inside: bool, cidr: &str, extra: &[&str]) {
        let mut args = vec!["ip"];
        if inside {
            args.extend(["-n", self.ns.as_str()]);
        }
        let dev = if inside { &self.peer } else { &self.veth };
        args.extend(["addr", "add", cidr, "dev", dev]);
        args.extend_from_slice(extra);
        run(&args);
    }
}

impl Drop for VethLab {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}
