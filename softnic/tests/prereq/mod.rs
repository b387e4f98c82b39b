//! What a test does when something it needs from the machine is missing (tshark, an
//! IPv6 loopback): in CI, which provides all of them, it fails; elsewhere it says loudly
//! that it did not run. A test that cannot run where CI provides its environment must
//! not pass as "skipped".
#![allow(dead_code)]

/// True when this is a CI run: `.ci/run` exports `SOFTNIC_CI=1`; hosted CI services set
/// `CI=true`.
pub fn in_ci() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("SOFTNIC_CI") || set("CI")
}

/// Reports that `what` is missing: panics in CI, else prints a notice. Returns so that
/// the caller can `return` from the test outside CI.
pub fn missing(what: &str) {
    if in_ci() {
        panic!("{what} is missing, but CI provides it: failing instead of skipping");
    }
    eprintln!("NOTE: {what} is missing; this test did NOT run (it fails in CI, SOFTNIC_CI=1)");
}

/// Whether this test may build a network lab: root (for network namespaces) and each of
/// `tools` on the PATH. What is missing goes to [`missing`]: the caller returns on
/// `false` (outside CI).
pub fn network_lab(tools: &[&str]) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing("root (to create a network namespace)");
        return false;
    }
    for tool in tools {
        // Spawning is the test: any exit status means the tool is there.
        let found = std::process::Command::new(tool)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok();
        if !found {
            missing(tool);
            return false;
        }
    }
    true
}
