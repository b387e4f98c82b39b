//! Two NICs on IPv6 link-local addresses (`--addr fe80::a%IFACE`), one in a network
//! namespace this test creates, joined by a veth pair: the GIDs are the link-local
//! addresses, which carry no scope, so each NIC must send to its peer's GID over its own
//! link (RFC 4007). An RC WRITE and a READ of 64 KiB cross the link intact.
//!
//! Needs root and `ip`: CI (root, SOFTNIC_CI=1) fails without them; elsewhere the test
//! says it did not run (see `prereq`).

mod nic_support;
mod prereq;

use nic_support::veth::VethLab;
use nic_support::*;
use verbs_api::{Gid, Mtu, SendWr, WcStatus, WrOpcode};

#[test]
fn rc_write_and_read_between_link_local_ipv6_nics() {
    if !prereq::network_lab(&["ip"]) {
        return;
    }
    let lab = VethLab::new("snll");
    // nodad: usable at once, not "tentative" for the duplicate address detection.
    lab.add_addr(false, "fe80::a/64", &["nodad"]);
    lab.add_addr(true, "fe80::b/64", &["nodad"]);
    let a = NicProc::start("ll-a", &format!("fe80::a%{}", lab.veth), 4791, &[]);
    let b = NicProc::start_in(
        Some(&lab.ns),
        "ll-b",
        &format!("fe80::b%{}", lab.peer),
        4791,
        &[],
    );
    assert_eq!(
        a.endpoint(0, 0).gid,
        Gid::from_ip("fe80::a".parse().unwrap())
    );

    const LEN: usize = 64 << 10;
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 2 * LEN, 4);
    let data = pattern(LEN, 7);
    x.mr.write(0, &data);
    let sge = [x.mr.sge(0, LEN as u32)];
    let write = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(1, write, &sge).signaled()])
        .expect("post WRITE");
    let c = poll_one(&mut x.cq);
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success), "{c:?}");
    assert!(y.mr.read_vec(0, LEN) == data, "WRITE landed over the link");

    // And back: B READs what A wrote into B's first half into B's second half.
    let sge = [y.mr.sge(LEN, LEN as u32)];
    let read = WrOpcode::RdmaRead {
        remote_addr: x.mr.addr(),
        rkey: x.mr.rkey(),
    };
    y.qp.post_send(&[SendWr::new(2, read, &sge).signaled()])
        .expect("post READ");
    let c = poll_one(&mut y.cq);
    assert_eq!((c.wr_id, c.status), (2, WcStatus::Success), "{c:?}");
    assert!(y.mr.read_vec(LEN, LEN) == data, "READ response landed");
    assert!(b.stat("rx_datagrams") > 0 && a.stat("rx_datagrams") > 0);
}
