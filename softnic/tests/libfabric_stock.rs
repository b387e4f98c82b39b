//! Unmodified libfabric (Debian's `libfabric1` and `libfabric-bin`) on softnic: its
//! verbs provider runs on softnic's drop-in `librdmacm.so.1` + `libibverbs.so.1`,
//! started through `softnic exec` as a user would, between two softnic NICs on
//! loopback. `fi_pingpong -c` checks every message's bytes.
//!
//! The provider finds its device the way it does on Linux: it binds an RDMA CM id to
//! "localhost", which Linux's CM binds to the first RDMA device (`cma_bind_loopback`),
//! as softnic's does (`verbs_api::cm::find_device`), then creates its QPs with a PD
//! allocated on the `rdma_get_devices` context, which must be the ids' `verbs`; a
//! passive endpoint moves its id from a synchronous one to its event channel
//! (`rdma_migrate_id`).
//!
//! These tests FAIL (never skip) when `fi_info` or `fi_pingpong` is missing: `.ci/run`
//! installs `libfabric-bin`.

mod nic_support;
mod stock_support;

use std::path::PathBuf;
use std::process::Command;

use nic_support::NicProc;
use stock_support::text;

/// A libfabric tool, which must be installed.
fn tool(name: &str) -> PathBuf {
    stock_support::stock(name, "libfabric-bin")
}

/// Two NICs of this test binary's /24 (127.1–50.x.y, shared only with `mpi_stock`,
/// which uses other hosts).
fn nic_pair(tag: &str, host: u8) -> (NicProc, NicProc) {
    stock_support::nic_pair(1, tag, host)
}

/// `fi_info` through `softnic exec -d A`, for provider `prov`.
fn fi_info(nic: &NicProc, prov: &str) -> String {
    let o = stock_support::exec_on(nic, &tool("fi_info"))
        .args(["-p", prov])
        .output()
        .expect("run fi_info");
    assert!(o.status.success(), "fi_info -p {prov}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The verbs provider lists the NIC for each endpoint type it serves: MSG (RC through
/// the RDMA CM, domain NAME), DGRAM (UD, domain NAME-dgram), and RDM when `ofi_rxm`
/// layers over MSG; and nothing but that NIC under `softnic exec -d NAME` with two
/// NICs running.
#[test]
fn fi_info_lists_the_nic_for_each_endpoint_type() {
    let (a, b) = nic_pair("fabric-info", 2);
    let verbs = fi_info(&a, "verbs");
    for want in [
        format!("domain: {}\n", a.name),
        format!("domain: {}-dgram\n", a.name),
        "type: FI_EP_MSG".to_string(),
        "type: FI_EP_DGRAM".to_string(),
    ] {
        assert!(verbs.contains(&want), "no {want:?} in:\n{verbs}");
    }
    assert!(
        !verbs.contains(&b.name),
        "the other NIC is listed:\n{verbs}"
    );
    let rxm = fi_info(&a, "verbs;ofi_rxm");
    assert!(rxm.contains("type: FI_EP_RDM"), "{rxm}");
    assert!(rxm.contains(&format!("domain: {}\n", a.name)), "{rxm}");
}

/// `fi_pingpong -p PROV -e EP -c -I 100` with the server on `srv` and the client on
/// `cli` (which connects to the server NIC's address), every size from 64 bytes up:
/// each must show 100 sent and 100 acknowledged (`=100`), and both NICs must have
/// carried the traffic (the client's endpoint on its own NIC, not the first one).
fn pingpong(
    prov: &str,
    ep: &str,
    (srv, cli): (&NicProc, &NicProc),
    env: &[(&str, &str)],
    port: u16,
) {
    let before = [srv.stat("rx_datagrams"), cli.stat("rx_datagrams")];
    let bin = tool("fi_pingpong");
    let common = ["-p", prov, "-e", ep, "-I", "100", "-c"];
    let with_env = |mut c: Command| {
        for (k, v) in env {
            c.env(k, v);
        }
        c
    };
    let server = |p: &str| {
        let mut c = with_env(stock_support::exec_on(srv, &bin));
        c.args(common).args(["-B", p]);
        c
    };
    let client = |p: &str| {
        let mut c = with_env(stock_support::exec_on(cli, &bin));
        c.args(common).args(["-P", p]).arg(srv.addr.to_string());
        c
    };
    let what = format!("fi_pingpong -p {prov} -e {ep}");
    let (s, c) = stock_support::pair_run_with(&what, &server, &client, port);
    let sizes: &[&str] = if ep == "dgram" {
        // A datagram endpoint sends what fits one MTU-sized message.
        &["64 ", "256 ", "1k ", "4k "]
    } else {
        &["64 ", "256 ", "1k ", "4k ", "64k ", "1m "]
    };
    for out in [&s, &c] {
        for size in sizes {
            let row = out.lines().find(|l| l.starts_with(size));
            assert!(
                row.is_some_and(|r| r.contains("=100")),
                "{what}: no complete {size}row:\n{out}"
            );
        }
    }
    let after = [srv.stat("rx_datagrams"), cli.stat("rx_datagrams")];
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "{what}: the NICs received {before:?} -> {after:?} datagrams"
    );
}

/// MSG endpoints: RC QPs connected through the RDMA CM, both directions.
#[test]
fn fi_pingpong_msg_between_two_nics() {
    let (a, b) = nic_pair("fabric-msg", 4);
    pingpong("verbs", "msg", (&a, &b), &[], 47_592);
    pingpong("verbs", "msg", (&b, &a), &[], 47_592);
}

/// RDM endpoints: `ofi_rxm` over verbs MSG endpoints (its own connection management,
/// eager and rendezvous protocols).
#[test]
fn fi_pingpong_rdm_over_verbs_between_two_nics() {
    let (a, b) = nic_pair("fabric-rdm", 6);
    pingpong("verbs;ofi_rxm", "rdm", (&a, &b), &[], 47_692);
}

/// DGRAM endpoints: UD QPs, address handles from the peer's GID. The provider's
/// default source GID is index 0, the IPv6 link-local GID, which an IPv4 NIC cannot
/// send from (`ibv_create_ah` refuses it); `FI_VERBS_GID_IDX=1` names the NIC's own
/// RoCE v2 GID, as perftest's `-x 1` does on rxe.
#[test]
fn fi_pingpong_dgram_between_two_nics() {
    let (a, b) = nic_pair("fabric-dgram", 8);
    pingpong(
        "verbs",
        "dgram",
        (&a, &b),
        &[("FI_VERBS_GID_IDX", "1")],
        47_792,
    );
}
