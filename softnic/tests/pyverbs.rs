//! rdma-core's own test suite (Debian's `python3-pyverbs`, tests from
//! `/usr/share/doc/rdma-core/tests`) against one softnic NIC, through `softnic exec`:
//! `tests/pyverbs/run` runs it and compares every test's outcome with
//! `tests/pyverbs/expected.tsv` (the table of `docs/pyverbs.md`).
//!
//! It FAILS (never skips) when pyverbs is missing (`.ci/run` installs it), when the
//! script cannot make its namespaces (`unshare`, `ip`: it runs the NIC and the suite in
//! user, network and mount namespaces of its own, `docs/pyverbs.md`), when a test
//! recorded as passing does not pass, or when fewer tests pass than recorded. The suite
//! takes about 10 s here and is deterministic on softnic (checked over repeated runs:
//! its random QP attributes are all within what softnic accepts).

use std::path::Path;
use std::process::Command;

#[test]
fn rdma_core_test_suite_passes_what_is_recorded() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(root.join("tests/pyverbs/run"))
        .env("SOFTNIC", env!("CARGO_BIN_EXE_softnic"))
        .env_remove("SOFTNIC_IBVERBS_DIR")
        .output()
        .expect("run tests/pyverbs/run");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "tests/pyverbs/run failed ({})\n--- stdout\n{out}--- stderr\n{err}",
        o.status
    );
    // The counts line is the script's own report: the whole recorded suite ran.
    let recorded = std::fs::read_to_string(root.join("tests/pyverbs/expected.tsv"))
        .expect("read tests/pyverbs/expected.tsv")
        .lines()
        .count();
    assert!(
        out.contains(&format!("pyverbs: {recorded} tests:")),
        "expected {recorded} tests, report:\n{out}"
    );
}
