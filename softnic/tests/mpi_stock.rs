//! Open MPI (Debian's `openmpi-bin` 4.1) on softnic: an MPI program whose two ranks
//! run on two softnic NICs, each under `softnic exec -d NIC`, talking through Open
//! MPI's OFI matching transport (`--mca pml cm --mca mtl ofi`) over libfabric's
//! `verbs;ofi_rxm` provider, which runs on softnic's drop-in `libibverbs.so.1` and
//! `librdmacm.so.1` (`docs/libfabric.md`). Nothing in Open MPI or libfabric is changed.
//!
//! The program (`tests/mpi/pingpong.c`, built with the stock `mpicc`) sends 1 byte to
//! 1 MiB each way with every byte checked, then an `MPI_Allreduce`. The test also
//! checks that both NICs received the traffic, so it cannot pass over another path.
//!
//! It FAILS (never skips) when `mpirun` or `mpicc` is missing: `.ci/run` installs
//! `openmpi-bin` and `libopenmpi-dev`.

mod nic_support;
mod stock_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nic_support::{softnic_dir, NicProc, Running};
use stock_support::text;

#[test]
fn open_mpi_ranks_on_two_nics_over_libfabric_verbs() {
    let mpirun = stock_support::stock("mpirun", "openmpi-bin");
    let mpicc = stock_support::stock("mpicc", "libopenmpi-dev");
    let dir = std::env::temp_dir().join(format!("softnic-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("pingpong");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/pingpong.c");
    let o = Command::new(&mpicc)
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(o.status.success(), "mpicc: {}", text(&o));

    // libfabric_stock's /24s (127.1–50.x.y), on hosts it does not use.
    let (a, b) = stock_support::nic_pair(1, "mpi", 20);
    let before = [a.stat("rx_datagrams"), b.stat("rx_datagrams")];
    let softnic = env!("CARGO_BIN_EXE_softnic");
    let rank = |nic: &NicProc| {
        vec![
            "-np".to_string(),
            "1".into(),
            softnic.into(),
            "exec".into(),
            "-d".into(),
            nic.name.clone(),
            "--".into(),
            exe.to_string_lossy().into_owned(),
        ]
    };
    let mut cmd = Command::new(&mpirun);
    // Root in CI; the flag is harmless otherwise. Two ranks on a 2-core machine.
    cmd.args(["--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
        .args(["--mca", "mtl_ofi_provider_include", "verbs;ofi_rxm"])
        .args(rank(&a))
        .arg(":")
        .args(rank(&b))
        .env("SOFTNIC_DIR", softnic_dir())
        .env_remove(softnic::exec::LIB_DIR_ENV)
        .stdin(std::process::Stdio::null());
    let (o, killed) = Running::spawn(&mut cmd).finish(Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!killed, "mpirun did not finish in 120 s: {}", text(&o));
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("ok sum=3 size=2"),
        "mpirun: {}",
        text(&o)
    );
    let after = [a.stat("rx_datagrams"), b.stat("rx_datagrams")];
    // 20 round trips of each size from 1 byte to 1 MiB: over 5,000 datagrams each way.
    assert!(
        after[0] > before[0] + 1000 && after[1] > before[1] + 1000,
        "the NICs received {before:?} -> {after:?} datagrams"
    );
}
