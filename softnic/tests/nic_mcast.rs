//! UD multicast between two NICs on loopback (`ibv_attach_mcast`): a datagram sent to
//! a group reaches every attached QP with the group's Q_Key on every NIC, once, with
//! the group as the GRH's destination; detached and destroyed QPs stop receiving; the
//! verbs refuse what rxe refuses. Each test uses its own group and addresses. IPv6
//! groups need an interface with multicast, which Linux's `lo` is not: that test runs
//! over a veth into a network namespace it creates (root; CI fails without it).

mod nic_support;
mod prereq;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{
    AccessFlags, CompletionQueue, Device, Gid, QpType, RecvWr, SendWr, UdAddress, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};

const GRH: usize = 40;
const QKEY: u32 = 0x1111_1111; // verbs_api::qp::DEFAULT_QKEY, set by to_init for UD
const MCAST_QPN: u32 = 0xFF_FFFF;

/// A UD QP in RTS on its own context of `nic` (`side_of`), with Q_Key `qkey` or the
/// default.
fn ud(nic: &NicProc, qkey: Option<u32>) -> Side {
    let mut s = side_of(Device::open(&nic.name).expect("open"), QpType::Ud, 8192, 8);
    s.qp.to_init(AccessFlags::NONE).expect("init");
    if let Some(k) = qkey {
        let attr = verbs_api::QpAttr {
            qkey: Some(k),
            ..Default::default()
        };
        s.qp.modify(&attr).expect("qkey");
    }
    s.qp.to_rtr(&nic.endpoint(0, 0), verbs_api::Mtu::Mtu1024)
        .expect("rtr");
    s.qp.to_rts(0).expect("rts");
    s
}

/// Receiving and sending on a [`ud`] side.
trait Ud {
    fn post_recv(&mut self, wr_id: u64);
    fn send(&mut self, wr_id: u64, to: UdAddress, data: &[u8]);
}

impl Ud for Side {
    fn post_recv(&mut self, wr_id: u64) {
        self.mr.fill(0, self.mr.len(), 0);
        let rs = [self.mr.sge(0, (GRH + 1024) as u32)];
        self.qp.post_recv(&[RecvWr::new(wr_id, &rs)]).expect("recv");
    }

    fn send(&mut self, wr_id: u64, to: UdAddress, data: &[u8]) {
        self.mr.write(0, data);
        let ss = [self.mr.sge(0, data.len() as u32)];
        self.qp
            .post_send(&[SendWr::new(wr_id, WrOpcode::Send, &ss).signaled().to(to)])
            .expect("send");
        let c = poll_one(&mut self.cq);
        assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::Success), "{c:?}");
    }
}

/// Nothing arrives on `cq` for a while (the receive stays posted).
fn quiet(cq: &mut CompletionQueue) -> Option<WorkCompletion> {
    let end = Instant::now() + Duration::from_millis(200);
    let mut wc = [WorkCompletion::default(); 1];
    while Instant::now() < end {
        if cq.poll(&mut wc).expect("poll") > 0 {
            return Some(wc[0]);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn group_dest(group: IpAddr, qpn: u32) -> UdAddress {
    UdAddress {
        gid: Gid::from_ip(group),
        udp_port: 4791,
        qpn,
        qkey: QKEY,
        traffic_class: 0,
    }
}

/// Checks a receive of `data` from `src` (NIC address `from`, QP `src_qp`) sent to
/// `group`: the completion, the payload after the GRH, and the GRH's IPv4 header
/// (bytes 20..40) naming the sender and the group.
fn check_received(r: &mut Side, wr_id: u64, data: &[u8], from: IpAddr, src_qp: u32, group: IpAddr) {
    let c = poll_one(&mut r.cq);
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (wr_id, WcStatus::Success, WcOpcode::Recv),
        "{c:?}"
    );
    assert_eq!(c.byte_len as usize, GRH + data.len());
    assert!(c.has_grh());
    assert_eq!(c.src_qp, src_qp);
    assert_eq!(c.qp_num, r.qp.qp_num());
    assert!(
        r.mr.read_vec(GRH, data.len()) == data,
        "payload after the GRH"
    );
    match (from, group) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = r.mr.read_vec(20, 20);
            assert_eq!(ip[0], 0x45);
            assert_eq!(&ip[12..16], &s.octets(), "GRH source is the sender");
            assert_eq!(&ip[16..20], &d.octets(), "GRH destination is the group");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = r.mr.read_vec(0, 40);
            assert_eq!(ip[0] >> 4, 6);
            assert_eq!(&ip[8..24], &s.octets(), "GRH source is the sender");
            assert_eq!(&ip[24..40], &d.octets(), "GRH destination is the group");
        }
        _ => panic!("mixed families"),
    }
}

#[test]
fn a_datagram_to_a_group_reaches_every_attached_qp_on_every_nic_once() {
    let a = NicProc::start("mc-a", "127.0.9.40", 4791, &[]);
    let b = NicProc::start("mc-b", "127.0.9.41", 4791, &[]);
    let group: IpAddr = "239.77.0.1".parse().unwrap();
    let g = Gid::from_ip(group);
    let mut tx = ud(&a, None);
    // Receivers: one beside the sender on NIC a, two on NIC b, and one on b with
    // another Q_Key (attached, but the datagrams are not for it).
    let mut ra = ud(&a, None);
    let mut rb1 = ud(&b, None);
    let mut rb2 = ud(&b, None);
    let mut other_key = ud(&b, Some(0x2222));
    for r in [&ra, &rb1, &rb2, &other_key] {
        r.qp.attach_mcast(g).expect("attach");
    }
    rb1.qp.attach_mcast(g).expect("attaching twice is no error");

    for (i, len) in [1usize, 200, 1024].into_iter().enumerate() {
        let i = i as u64;
        let data = pattern(len, 0x40 + i as u8);
        for r in [&mut ra, &mut rb1, &mut rb2, &mut other_key] {
            r.post_recv(100 + i);
        }
        tx.send(i, group_dest(group, MCAST_QPN), &data);
        for r in [&mut ra, &mut rb1, &mut rb2] {
            check_received(r, 100 + i, &data, a.addr, tx.qp.qp_num(), group);
        }
    }
    assert!(
        quiet(&mut other_key.cq).is_none(),
        "a QP of another Q_Key receives nothing"
    );
    for r in [&mut ra, &mut rb1, &mut rb2] {
        assert!(quiet(&mut r.cq).is_none(), "one copy each, not two");
    }
    assert!(b.stat("rx_mcast_datagrams") >= 3);
    assert!(b.stat("qp_drop_bad_qkey") >= 3);

    // Detached, a QP stops receiving; the others go on.
    rb2.qp.detach_mcast(g).expect("detach");
    assert!(rb2.qp.detach_mcast(g).is_err(), "not attached any more");
    ra.qp.detach_mcast(g).expect("detach");
    // ra and rb2 hold the receives posted above (i = 3 never sent): post one for rb1.
    rb1.post_recv(7);
    let data = pattern(64, 9);
    tx.send(7, group_dest(group, MCAST_QPN), &data);
    check_received(&mut rb1, 7, &data, a.addr, tx.qp.qp_num(), group);
    assert!(quiet(&mut rb2.cq).is_none(), "detached: nothing");
    assert!(quiet(&mut ra.cq).is_none(), "detached: nothing");

    // A datagram to the group for a QPN other than the multicast QPN is dropped and
    // counted, even when that QPN is an attached QP's.
    let before = b.stat("rx_drop_mcast_qpn");
    rb1.post_recv(8);
    tx.send(8, group_dest(group, rb1.qp.qp_num()), &data);
    assert!(quiet(&mut rb1.cq).is_none(), "not for the multicast QPN");
    assert_eq!(b.stat("rx_drop_mcast_qpn"), before + 1);

    // Destroying a QP detaches it: rb1's receive posted above now waits for a
    // datagram that a group without members on b never delivers there.
    drop(other_key);
    drop(rb1);
    rb2.qp.attach_mcast(g).expect("re-attach");
    rb2.post_recv(9);
    tx.send(9, group_dest(group, MCAST_QPN), &data);
    check_received(&mut rb2, 9, &data, a.addr, tx.qp.qp_num(), group);
}

#[test]
fn attach_refuses_what_the_verbs_refuse() {
    let a = NicProc::start("mc-refuse", "127.0.9.42", 4791, &[]);
    let x = ud(&a, None);
    let group = Gid::from_ip("239.77.0.2".parse().unwrap());
    // Not a multicast group of the NIC's family.
    for bad in ["127.0.9.43", "ff0e::1", "0.0.0.0"] {
        let e = x.qp.attach_mcast(Gid::from_ip(bad.parse().unwrap()));
        assert!(e.is_err(), "{bad}: {e:?}");
    }
    assert!(x.qp.detach_mcast(group).is_err(), "never attached");
    // Only UD QPs attach.
    let s = side(&a, 4096, 4);
    let e = s.qp.attach_mcast(group);
    assert!(
        matches!(&e, Err(verbs_api::Error::Nic { code, .. })
            if *code == verbs_api::abi::control::ErrorCode::InvalidArgument),
        "{e:?}"
    );
    // The group limit: each group is a socket of the NIC's.
    let max = verbs_api::abi::MAX_MCAST_GRP;
    for n in 0..max {
        let g = Gid::from_ip(IpAddr::from([239, 78, (n >> 8) as u8, n as u8]));
        x.qp.attach_mcast(g).expect("within the limit");
    }
    let e = x.qp.attach_mcast(group);
    assert!(
        matches!(&e, Err(verbs_api::Error::Nic { code, .. })
            if *code == verbs_api::abi::control::ErrorCode::NoResources),
        "{e:?}"
    );
    // Leaving one group makes room.
    x.qp.detach_mcast(Gid::from_ip("239.78.0.0".parse().unwrap()))
        .unwrap();
    x.qp.attach_mcast(group).expect("room again");
}

#[test]
fn an_ipv6_group_over_a_link_reaches_both_nics() {
    if !prereq::network_lab(&["ip"]) {
        return;
    }
    let pid = std::process::id();
    let lab = veth::VethLab::new("snmc");
    let net = format!("fd7c:{:x}::", pid % 0xffff);
    let (ia, ib) = (format!("{net}1"), format!("{net}2"));
    // nodad: usable at once, not "tentative" for the duplicate address detection.
    lab.add_addr(false, &format!("{ia}/64"), &["nodad"]);
    lab.add_addr(true, &format!("{ib}/64"), &["nodad"]);
    let a = NicProc::start("mc6-a", &ia, 4791, &[]);
    let b = NicProc::start_in(Some(&lab.ns), "mc6-b", &ib, 4791, &[]);
    let group: IpAddr = format!("ff0e::7c:{:x}", pid % 0xffff).parse().unwrap();
    let g = Gid::from_ip(group);
    let mut tx = ud(&a, None);
    // One receiver across the link, one beside the sender (the loopback copy).
    let mut rb = ud(&b, None);
    let mut ra = ud(&a, None);
    for r in [&rb, &ra] {
        r.qp.attach_mcast(g).expect("attach");
    }
    for (i, len) in [1usize, 1000].into_iter().enumerate() {
        let i = i as u64;
        let data = pattern(len, 0x60 + i as u8);
        rb.post_recv(10 + i);
        ra.post_recv(10 + i);
        tx.send(i, group_dest(group, MCAST_QPN), &data);
        for r in [&mut rb, &mut ra] {
            check_received(r, 10 + i, &data, a.addr, tx.qp.qp_num(), group);
        }
    }
    assert_eq!(b.stat("rx_mcast_datagrams"), 2);
}
