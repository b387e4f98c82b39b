//! Real CM traffic: every MAD on QP1 in `tests/data/captures/` (Linux rxe's `rdma_cm`,
//! rping) parses as a CM message and re-emits byte for byte; each REQ's IP CM header
//! names the frame's own addresses, and its primary path the same GIDs.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;

use support::all_packets;
use wire::cm::{service_port_space, CmMadRepr, CmMessage, CmaHeader, MAD_LEN};
use wire::frame::parse_ethernet;
use wire::{PacketRepr, Qpn, ROCEV2_UDP_PORT};

/// CM MADs per capture and message, as tshark names them
/// (`tshark -Y infiniband.bth.destqp==1 -T fields -e infiniband.mad.attributeid`).
const EXPECTED: &[(&str, &str, usize)] = &[
    ("public/rdma_cm.pcap", "ConnectReply", 2),
    ("public/rdma_cm.pcap", "ConnectRequest", 2),
    ("public/rdma_cm.pcap", "DisconnectReply", 3),
    ("public/rdma_cm.pcap", "DisconnectRequest", 3),
    ("public/rdma_cm.pcap", "ReadyToUse", 2),
    ("public/rping.pcap", "ConnectReply", 1),
    ("public/rping.pcap", "ConnectRequest", 1),
    ("public/rping.pcap", "DisconnectReply", 1),
    ("public/rping.pcap", "DisconnectRequest", 1),
    ("public/rping.pcap", "ReadyToUse", 1),
    ("rxe-lab/rdma_cm.pcap", "ConnectReply", 1),
    ("rxe-lab/rdma_cm.pcap", "ConnectRequest", 1),
    ("rxe-lab/rdma_cm.pcap", "DisconnectReply", 1),
    ("rxe-lab/rdma_cm.pcap", "DisconnectRequest", 1),
    ("rxe-lab/rdma_cm.pcap", "ReadyToUse", 1),
];

/// The listener's port in each capture's REQs: rping's default 7174, and 18515 in the
/// public tutorial's `rdma_cm` run.
const PORTS: &[(&str, u16)] = &[
    ("public/rdma_cm.pcap", 18515),
    ("public/rping.pcap", 7174),
    ("rxe-lab/rdma_cm.pcap", 7174),
];

fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

#[test]
fn every_cm_mad_parses_and_re_emits_byte_exact() {
    let mut seen: BTreeMap<(String, &'static str), usize> = BTreeMap::new();
    let mut ports: BTreeMap<String, u16> = BTreeMap::new();
    for p in all_packets() {
        let f = parse_ethernet(&p.frame, ROCEV2_UDP_PORT).unwrap();
        let pkt = PacketRepr::parse(f.roce).unwrap();
        let PacketRepr { bth, deth, .. } = pkt.repr;
        if bth.dest_qpn != Qpn::GSI {
            continue;
        }
        let at = format!("{} frame {}", p.file, p.number);
        assert_eq!(deth.map(|d| d.qkey), Some(wire::deth::GSI_QKEY), "{at}");
        assert_eq!(pkt.payload.len(), MAD_LEN, "{at}");
        let mad = CmMadRepr::parse(pkt.payload).unwrap_or_else(|e| panic!("{at}: {e}"));
        let mut out = [0u8; MAD_LEN];
        mad.emit(&mut out).unwrap();
        assert_eq!(
            out[..],
            pkt.payload[..],
            "{at}: {} re-emitted",
            mad.msg.name()
        );
        if let CmMessage::Req(req) = &mad.msg {
            let (ps, port) = service_port_space(req.service_id).expect("an IP CM service ID");
            assert_eq!(ps, 0x0106, "{at}: RDMA_PS_TCP");
            ports.insert(p.file.clone(), port);
            let cma = CmaHeader::parse(&req.private_data).expect("IP CM header");
            assert_eq!((cma.src, cma.dst), (f.src, f.dst), "{at}");
            assert_eq!(gid_ip(req.primary.local_gid), f.src, "{at}");
            assert_eq!(gid_ip(req.primary.remote_gid), f.dst, "{at}");
        }
        *seen.entry((p.file.clone(), mad.msg.name())).or_default() += 1;
    }
    let want: BTreeMap<(String, &str), usize> = EXPECTED
        .iter()
        .map(|&(f, m, n)| ((f.to_string(), m), n))
        .collect();
    assert_eq!(seen, want);
    let want_ports: BTreeMap<String, u16> =
        PORTS.iter().map(|&(f, p)| (f.to_string(), p)).collect();
    assert_eq!(ports, want_ports);
}
