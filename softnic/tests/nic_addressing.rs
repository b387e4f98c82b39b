//! NICs told apart by UDP port on one address, and NICs over IPv6: the GID, the
//! endpoint and the ICRC (ports and addresses are covered by it) all follow.

mod nic_support;
mod prereq;

use nic_support::*;
use verbs_api::{Mtu, RecvWr, SendWr, WcStatus, WrOpcode};

fn exchange(a: &NicProc, b: &NicProc) {
    let (mut x, mut y) = rc_pair(a, b, Mtu::Mtu2048, 1 << 16, 8);
    let data = pattern(5000, 3);
    x.mr.write(0, &data);
    let sge = [x.mr.sge(0, 5000)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(1, op, &sge).signaled()])
        .expect("post");
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    assert!(y.mr.read_vec(0, 5000) == data[..]);
    let rs = [x.mr.sge(0, 100)];
    x.qp.post_recv(&[RecvWr::new(2, &rs)]).expect("recv");
    let ss = [y.mr.sge(0, 100)];
    y.qp.post_send(&[SendWr::new(3, verbs_api::WrOpcode::Send, &ss).signaled()])
        .expect("send");
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    let r = poll_one(&mut x.cq);
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 100));
    assert_eq!(b.stat("rx_drop_bad_icrc") + a.stat("rx_drop_bad_icrc"), 0);
}

#[test]
fn two_nics_on_one_address_with_different_ports() {
    let a = NicProc::start("port-a", "127.0.0.15", 0, &[]);
    let b = NicProc::start("port-b", "127.0.0.15", 0, &[]);
    exchange(&a, &b);
    assert!(b.stat("rx_icrc_id0") > 0);
}

#[test]
fn two_nics_over_ipv6() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        prereq::missing(&format!("an IPv6 loopback ([::1] cannot be bound: {e})"));
        return;
    }
    let a = NicProc::start("v6-a", "::1", 0, &[]);
    let b = NicProc::start("v6-b", "::1", 0, &[]);
    exchange(&a, &b);
    assert!(b.stat("rx_icrc_ipv6") > 0);
    assert_eq!(b.stat("rx_icrc_id0"), 0);
}
