//! Unmodified Debian binaries (ibverbs-utils, perftest) on softnic's drop-in
//! `libibverbs.so.1`, started through `softnic exec` as a user would.
//!
//! These tests FAIL (never skip) when a stock binary, the C compiler or the rdma-core
//! headers are missing: `.ci/run` installs `ibverbs-utils`, `perftest` and
//! `libibverbs-dev`.

mod nic_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nic_support::{softnic_dir, NicProc};

/// `softnic exec [ARGS…]` with this test's `$SOFTNIC_DIR`.
fn exec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("exec")
        .args(args)
        .env("SOFTNIC_DIR", softnic_dir())
        .env_remove(softnic::exec::LIB_DIR_ENV)
        .output()
        .expect("run softnic exec")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A stock binary, which must be installed.
fn stock(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: install ibverbs-utils and perftest (.ci/run does)",
        p.display()
    );
    p
}

fn guid_hex(nic: &NicProc) -> String {
    format!(
        "{:016x}",
        verbs_api::gid::node_guid(std::net::SocketAddr::new(nic.addr, nic.port))
    )
}

#[test]
fn ibv_devices_lists_running_nics_only() {
    let a = NicProc::start("ibvstock-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("ibvstock-b", "127.0.0.1", 0, &[]);
    // A socket nobody listens on (a NIC that died) is not a device.
    let stale = softnic_dir().join("ibvstock-dead.sock");
    let _ = std::fs::remove_file(&stale);
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let bin = stock("ibv_devices");
    let o = exec(&["--", bin.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for nic in [&a, &b] {
        let line = format!("{}\t{}", nic.name, guid_hex(nic));
        assert!(
            String::from_utf8_lossy(&o.stdout).lines().any(|l| l
                .split_whitespace()
                .collect::<Vec<_>>()
                .join("\t")
                == line),
            "no line `{line}`:\n{out}"
        );
    }
    assert!(!out.contains("ibvstock-dead"), "{out}");
    // -d limits the list.
    let o = exec(&["-d", "ibvstock-b", "--", bin.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success() && out.contains("ibvstock-b"), "{out}");
    assert!(!out.contains("ibvstock-a"), "{out}");
}

#[test]
fn ibv_devinfo_verbose_describes_the_nic() {
    let nic = NicProc::start("ibvstock-info", "127.0.0.1", 0, &[]);
    let bin = stock("ibv_devinfo");
    let o = exec(&["-d", &nic.name, "--", bin.to_str().unwrap(), "-v"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let g = guid_hex(&nic);
    let guid = format!("{}:{}:{}:{}", &g[0..4], &g[4..8], &g[8..12], &g[12..16]);
    let ll = verbs_api::gid::gid_table(std::net::SocketAddr::new(nic.addr, nic.port))[0];
    for want in [
        format!("hca_id:\t{}", nic.name),
        "transport:\t\t\tInfiniBand (0)".to_string(),
        format!("node_guid:\t\t\t{guid}"),
        "vendor_id:\t\t\t0xffffff".to_string(),
        "phys_port_cnt:\t\t\t1".to_string(),
        "atomic_cap:\t\t\tATOMIC_HCA (1)".to_string(),
        "state:\t\t\tPORT_ACTIVE (4)".to_string(),
        "link_layer:\t\tEthernet".to_string(),
        "gid_tbl_len:\t\t2".to_string(),
        format!("GID[  0]:\t\t{ll}, RoCE v2"),
        "GID[  1]:\t\t::ffff:127.0.0.1, RoCE v2".to_string(),
    ] {
        assert!(out.contains(&want), "missing `{want}`:\n{out}");
    }
}

/// The pingpong programs start, find and open the device, then stop at the first verb
/// not implemented yet (PDs) with rdma-core's own "not supported" answer — not a crash.
/// (Update this test when PDs land.)
#[test]
fn pingpongs_stop_cleanly_at_the_first_missing_verb() {
    let nic = NicProc::start("ibvstock-pp", "127.0.0.1", 0, &[]);
    for name in ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong"] {
        let bin = stock(name);
        let o = exec(&["--", bin.to_str().unwrap(), "-d", &nic.name, "-g", "1"]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {out}");
        assert!(out.contains("Couldn't allocate PD"), "{name}: {out}");
    }
}

/// Every symbol (and version node) that the installed stock binaries import resolves
/// against the drop-in directory: they are BIND_NOW, so one missing symbol stops them
/// from starting at all.
#[test]
fn every_stock_binary_links_against_the_drop_in() {
    let o = exec(&["--print-lib-dir"]);
    assert!(o.status.success(), "{}", text(&o));
    let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
    for name in [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_asyncwatch",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
    ] {
        let bin = stock(name);
        let o = Command::new("ldd")
            .arg("-r")
            .arg(&bin)
            .env("LD_LIBRARY_PATH", &dir)
            .output()
            .expect("run ldd");
        let out = text(&o);
        assert!(o.status.success(), "{name}: {out}");
        assert!(
            !out.contains("undefined symbol") && !out.contains("not found"),
            "{name}: {out}"
        );
        assert!(
            out.contains(&format!("libibverbs.so.1 => {dir}/libibverbs.so.1")),
            "{name} does not load softnic's libibverbs: {out}"
        );
        if out.contains("libmlx5.so.1") {
            assert!(
                out.contains(&format!("libmlx5.so.1 => {dir}/libmlx5.so.1")),
                "{out}"
            );
            assert!(
                out.contains(&format!("libefa.so.1 => {dir}/libefa.so.1")),
                "{out}"
            );
        }
    }
}

/// `tests/ibverbs/probe.c`, compiled against the real `<infiniband/verbs.h>`: queries
/// at every caller size (with canaries), the GID table, P_Keys, and EOPNOTSUPP from the
/// verbs not implemented yet.
#[test]
fn c_abi_probe() {
    let nic = NicProc::start("ibvstock-probe", "127.0.0.1", 0, &[]);
    let dir = softnic_dir().join("probe-build");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("probe");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ibverbs/probe.c"))
        .arg("-libverbs")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    assert!(
        o.status.success(),
        "compiling probe.c (libibverbs-dev?): {}",
        text(&o)
    );
    let o = exec(&["-d", &nic.name, "--", exe.to_str().unwrap(), &nic.name]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let ll = verbs_api::gid::gid_table(std::net::SocketAddr::new(nic.addr, nic.port))[0];
    let eop = libc::EOPNOTSUPP;
    let einval = libc::EINVAL;
    for want in [
        "num_devices 1".to_string(),
        format!("device {} index 0 guid {}", nic.name, guid_hex(&nic)),
        "node_type 1 transport 0".into(),
        "num_comp_vectors 1".into(),
        "async_fd_valid 1".into(),
        "extended 1".into(),
        "query_device 0".into(),
        "vendor_id 0xffffff part 0 ports 1 max_qp 4096 atomic 1".into(),
        "query_device_ex 0".into(),
        "device_ex_canary 1 zero_tail 1 same_vendor 1".into(),
        format!("query_device_ex_bad_input {einval}"),
        "query_port 0".into(),
        "port state 4 link_layer 2 active_mtu 5 gid_tbl_len 2 pkey_tbl_len 1 lid 0 canary 1".into(),
        format!("query_port_2 {einval}"),
        "compat_query_port 0 state 4 link_layer 2 written_48 1 canary_after_48 1".into(),
        "op_query_port_8 0 canary_after_8 1".into(),
        format!("gid 0 rc 0 {ll}"),
        "gid 1 rc 0 ::ffff:127.0.0.1".into(),
        "gid 2 rc -1 -".into(),
        "gid_ex rc 0 index 1 port 1 type 2".into(),
        format!("gid_ex_bad_index {einval}"),
        "gid_table 2".into(),
        format!("gid_table_small -{einval}"),
        "pkey rc 0 0xffff pkey1 -1".into(),
        "fork 2 init 0".into(),
        format!("alloc_pd null errno {eop}"),
        format!("create_cq null errno {eop}"),
        format!("create_comp_channel null errno {eop}"),
        format!("create_cq_ex null errno {eop}"),
        format!("alloc_mw null errno {eop}"),
        "close 0".into(),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "missing line `{want}`:\n{out}"
        );
    }
}
