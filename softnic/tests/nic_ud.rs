//! UD between two NICs: the destination comes from each work request's GID and port,
//! the receive buffer starts with the 40-byte GRH, the completion names the sender QP.

mod nic_support;

use nic_support::*;
use verbs_api::{
    AccessFlags, Device, Gid, QpCap, QpInitAttr, QpType, RecvWr, SendWr, UdAddress, WcOpcode,
    WcStatus, WrOpcode,
};

const GRH: usize = 40;
const QKEY: u32 = 0x1111_1111; // verbs_api::qp::DEFAULT_QKEY, set by to_init for UD

/// A context on `nic` with a PD, an 8 KiB region, a CQ and a UD QP in RTS.
fn open_ud(
    nic: &NicProc,
) -> (
    verbs_api::Context,
    verbs_api::ProtectionDomain,
    verbs_api::MemoryRegion,
    verbs_api::CompletionQueue,
    verbs_api::QueuePair,
) {
    let ctx = Device::open(&nic.name).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).expect("mr");
    let cq = ctx.create_cq(16).expect("cq");
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
        })
        .expect("qp");
    qp.to_init(AccessFlags::NONE).expect("init");
    qp.to_rtr(&nic.endpoint(0, 0), verbs_api::Mtu::Mtu1024)
        .expect("rtr");
    qp.to_rts(0).expect("rts");
    (ctx, pd, mr, cq, qp)
}

#[test]
fn ud_send_between_two_nics() {
    let a = NicProc::start("ud-a", "127.0.0.24", 0, &[]);
    let b = NicProc::start("ud-b", "127.0.0.25", 0, &[]);
    let (_ca, _pa, mut mx, mut cqx, mut qx) = open_ud(&a);
    let (_cb, _pb, mut my, mut cqy, mut qy) = open_ud(&b);
    for (i, len) in [0usize, 1, 1000, 1024].into_iter().enumerate() {
        let i = i as u64;
        let data = pattern(len, i as u8);
        mx.write(0, &data);
        my.fill(0, my.len(), 0);
        let rs = [my.sge(0, (GRH + 1024) as u32)];
        qy.post_recv(&[RecvWr::new(100 + i, &rs)]).expect("recv");
        let ss: Vec<_> = if len == 0 {
            vec![]
        } else {
            vec![mx.sge(0, len as u32)]
        };
        let dest = UdAddress {
            gid: Gid::from_ip(b.addr),
            udp_port: b.port,
            qpn: qy.qp_num(),
            qkey: QKEY,
            traffic_class: 0,
        };
        let op = if i.is_multiple_of(2) {
            WrOpcode::Send
        } else {
            WrOpcode::SendWithImm(0xAB00 + i as u32)
        };
        qx.post_send(&[SendWr::new(i, op, &ss).signaled().to(dest)])
            .expect("send");
        let s = poll_one(&mut cqx);
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i, WcStatus::Success, WcOpcode::Send),
            "{s:?}"
        );
        let r = poll_one(&mut cqy);
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (100 + i, WcStatus::Success, WcOpcode::Recv),
            "{r:?}"
        );
        assert_eq!(r.byte_len as usize, GRH + len, "byte_len counts the GRH");
        assert!(
            r.has_grh() && !s.has_grh(),
            "IBV_WC_GRH on the receive only"
        );
        assert_eq!(r.src_qp, qx.qp_num());
        assert_eq!(r.imm_data, (i % 2 == 1).then_some(0xAB00 + i as u32));
        assert!(my.read_vec(GRH, len) == data[..], "payload after the GRH");
    }
    // A destination of the other IP family is refused locally (LOC_QP_OP_ERR).
    let bad = UdAddress {
        gid: Gid::from_ip("fd00::1".parse().unwrap()),
        udp_port: 0,
        qpn: qy.qp_num(),
        qkey: QKEY,
        traffic_class: 0,
    };
    let ss = [mx.sge(0, 8)];
    qx.post_send(&[SendWr::new(99, WrOpcode::Send, &ss).signaled().to(bad)])
        .expect("post");
    let c = poll_one(&mut cqx);
    assert_eq!((c.wr_id, c.status), (99, WcStatus::LocQpOpErr), "{c:?}");
}

/// Over IPv6 the 40 bytes before the payload are the IPv6 header as rxe writes it for
/// RoCEv2: version 6, payload length (UDP header + BTH + DETH + payload + ICRC), next
/// header UDP, hop limit, source and destination addresses.
#[test]
fn ud_receive_over_ipv6_starts_with_the_ipv6_header() {
    let a = NicProc::start("ud6-a", "::1", 0, &[]);
    let b = NicProc::start("ud6-b", "::1", 0, &[]);
    let (_ca, _pa, mut mx, mut cqx, mut qx) = open_ud(&a);
    let (_cb, _pb, my, mut cqy, mut qy) = open_ud(&b);
    let len = 100usize;
    mx.write(0, &pattern(len, 6));
    let rs = [my.sge(0, (GRH + len) as u32)];
    qy.post_recv(&[RecvWr::new(1, &rs)]).expect("recv");
    let ss = [mx.sge(0, len as u32)];
    let dest = UdAddress {
        gid: Gid::from_ip(b.addr),
        udp_port: b.port,
        qpn: qy.qp_num(),
        qkey: QKEY,
        traffic_class: 0,
    };
    qx.post_send(&[SendWr::new(2, WrOpcode::Send, &ss).signaled().to(dest)])
        .expect("send");
    assert_eq!(poll_one(&mut cqx).status, WcStatus::Success);
    let r = poll_one(&mut cqy);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::Success), "{r:?}");
    assert_eq!(r.byte_len as usize, GRH + len);
    assert!(r.has_grh(), "IBV_WC_GRH");
    let g = &my.read_vec(0, GRH);
    assert_eq!(g[0] >> 4, 6, "IP version");
    // UDP 8 + BTH 12 + DETH 8 + payload + ICRC 4.
    let payload_len = u16::from_be_bytes([g[4], g[5]]) as usize;
    assert_eq!(payload_len, 8 + 12 + 8 + len + 4);
    assert_eq!(g[6], 17, "next header UDP");
    let loopback = std::net::Ipv6Addr::LOCALHOST.octets();
    assert_eq!(&g[8..24], &loopback, "source");
    assert_eq!(&g[24..40], &loopback, "destination");
    assert!(my.read_vec(GRH, len) == pattern(len, 6)[..]);
    assert!(b.stat("rx_icrc_ipv6") > 0);
}

/// The address handle's traffic class goes on the wire, and the receiver's GRH holds
/// the IP header as it arrived (as rxe copies it): over IPv4 the TOS, the TTL (64), the
/// Identification the ICRC check solved (0: softnic sends ID 0) and a valid header
/// checksum; over IPv6 the traffic class and the hop limit.
#[test]
fn the_grh_holds_the_traffic_class_and_ttl_the_datagram_arrived_with() {
    for (name, ip) in [("tc4", "127.0.0.26"), ("tc6", "::1")] {
        let a = NicProc::start(&format!("{name}-a"), ip, 0, &[]);
        let b = NicProc::start(&format!("{name}-b"), ip, 0, &[]);
        let (_ca, _pa, mut mx, mut cqx, mut qx) = open_ud(&a);
        let (_cb, _pb, mut my, mut cqy, mut qy) = open_ud(&b);
        mx.write(0, &pattern(64, 1));
        for (i, tclass) in [0xB9u8, 0, 0x60].into_iter().enumerate() {
            my.fill(0, GRH, 0xEE);
            let rs = [my.sge(0, (GRH + 64) as u32)];
            qy.post_recv(&[RecvWr::new(i as u64, &rs)]).expect("recv");
            let dest = UdAddress {
                gid: Gid::from_ip(b.addr),
                udp_port: b.port,
                qpn: qy.qp_num(),
                qkey: QKEY,
                traffic_class: tclass,
            };
            let ss = [mx.sge(0, 64)];
            qx.post_send(&[SendWr::new(i as u64, WrOpcode::Send, &ss)
                .signaled()
                .to(dest)])
                .expect("send");
            assert_eq!(poll_one(&mut cqx).status, WcStatus::Success);
            let r = poll_one(&mut cqy);
            assert_eq!((r.wr_id, r.status), (i as u64, WcStatus::Success), "{r:?}");
            let g = my.read_vec(0, GRH);
            if b.addr.is_ipv4() {
                let h = &g[20..40];
                assert_eq!(&g[..20], &[0u8; 20], "{name}: bytes 0..20");
                assert_eq!(
                    (h[0], h[1], h[8], h[9]),
                    (0x45, tclass, 64, 17),
                    "{name}: {h:02x?}"
                );
                assert_eq!(
                    u16::from_be_bytes([h[4], h[5]]),
                    0,
                    "{name}: the ID softnic sent"
                );
                let sum = h
                    .chunks(2)
                    .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                    .sum::<u32>();
                let folded = (sum & 0xFFFF) + (sum >> 16);
                assert_eq!(folded, 0xFFFF, "{name}: header checksum {h:02x?}");
            } else {
                let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
                assert_eq!(
                    (flow >> 28, (flow >> 20) as u8, flow & 0xF_FFFF, g[7]),
                    (6, tclass, 0, 64),
                    "{name}: {g:02x?}"
                );
            }
        }
    }
}
