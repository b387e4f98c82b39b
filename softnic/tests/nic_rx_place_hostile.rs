//! The receiver's single pass on a live NIC against a peer that sends what it likes
//! (`nic/rx_place.rs`): the peer here is this test's own UDP socket, to which an RC QP
//! of the NIC is connected, so every packet it sends passes the source check.
//!
//! A WRITE's Middle that fails its ICRC is placed (its bytes land at the WRITE's
//! cursor, inside the RETH range — nowhere else) and then dropped with no other
//! trace: only `rx_drop_bad_icrc` and `rx_placed_bad_icrc` move, no ACK or NAK comes
//! back, the QP's counters stay where they were. A Last whose datagram runs longer
//! than the RETH range has room for is not placed at all. The same Middle sent intact,
//! and the Last, then complete the WRITE with one ACK and the right bytes.

mod nic_support;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use nic_support::*;
use verbs_api::{Gid, Mtu, QpEndpoint};
use wire::{BthRepr, Opcode, Operation, PacketRepr, Position, Psn, Qpn, RethRepr, Transport};

const CANARY: u8 = 0xA5;
const MTU: usize = 1024;
/// The peer's first PSN: the NIC's QP expects it.
const PSN: u32 = 0xFF_FFFE;
const PEER_QPN: u32 = 0xAB_CDEF;

/// The RC RDMA WRITE opcode at `pos`, from the table.
fn write_op(pos: Position) -> Opcode {
    Opcode::find(Transport::Rc, Operation::Write, pos, None).expect("an RC WRITE opcode")
}

fn packet(
    opcode: Opcode,
    qpn: u32,
    psn: u32,
    ack_req: bool,
    reth: Option<RethRepr>,
    payload: &[u8],
) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        mig_req: true,
        ack_req,
        ..BthRepr::new(opcode, Qpn::new(qpn), Psn::new(psn))
    });
    repr.reth = reth;
    repr.payload_len = payload.len();
    let mut buf = vec![0u8; 64 + payload.len()];
    let n = repr.emit(&mut buf, payload).expect("emit");
    buf.truncate(n);
    buf
}

/// Every counter but those a dropped packet moves (`rx_datagrams`, `rx_bytes`,
/// `rx_drop_bad_icrc`, `rx_placed_bad_icrc`) and those the `softnic stats` request
/// itself or idle time moves (control requests, the poller's wake-ups and sleeps, the
/// loop's passes, client connections).
fn quiet(nic: &NicProc) -> Vec<(String, u64)> {
    nic.stats()
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "rx_datagrams" | "rx_bytes" | "rx_drop_bad_icrc" | "rx_placed_bad_icrc"
            ) && ![
                "control",
                "poller",
                "async_event",
                "clients",
                "sleeps",
                "loop_",
            ]
            .iter()
            .any(|p| k.starts_with(p))
        })
        .collect()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_placed_packet_that_fails_its_icrc_leaves_only_its_bytes_and_the_drop_counters() {
    let nic = NicProc::start("place-hostile", "127.0.0.71", 0, &[]);
    let peer = UdpSocket::bind("127.0.0.72:0").expect("bind the peer");
    peer.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let from = peer.local_addr().unwrap();
    let to = SocketAddr::new(nic.addr, nic.port);

    let mut y = side(&nic, 16 * 1024, 8);
    y.mr.fill(0, y.mr.len(), CANARY);
    let access = verbs_api::AccessFlags::ALL;
    y.qp.to_init(access).expect("init");
    let us = QpEndpoint {
        lid: 0,
        qpn: PEER_QPN,
        psn: PSN,
        gid: Gid::from_ip(from.ip()),
        udp_port: from.port(),
    };
    y.qp.to_rtr(&us, Mtu::Mtu1024).expect("rtr");
    to_rts(&mut y.qp, 0, 14);
    let qpn = y.qp.qp_num();
    let send = |mut bytes: Vec<u8>, corrupt: Option<usize>| {
        fill_icrc_v4(&mut bytes, from, to);
        if let Some(at) = corrupt {
            bytes[at] ^= 0x40;
        }
        peer.send_to(&bytes, to).expect("send");
    };

    // A 3 KiB WRITE at offset 4096: First (valid, no AckReq), then a Middle whose
    // payload byte 100 is flipped after its ICRC was filled.
    let data = pattern(3 * MTU, 7);
    let base = 4096;
    let reth = RethRepr {
        va: y.mr.addr() + base as u64,
        rkey: y.mr.rkey(),
        dma_len: data.len() as u32,
    };
    let psn = |k: u32| Psn::new(PSN).wrapping_add(k).value();
    let first = packet(
        write_op(Position::First),
        qpn,
        psn(0),
        false,
        Some(reth),
        &data[..MTU],
    );
    send(first, None);
    wait_for("the First", || nic.stat("rx_datagrams") >= 1);
    let before = quiet(&nic);
    let middle = packet(
        write_op(Position::Middle),
        qpn,
        psn(1),
        true,
        None,
        &data[MTU..2 * MTU],
    );
    let header = PacketRepr::parse(&middle).unwrap().header_len;
    send(middle.clone(), Some(header + 100));
    wait_for("the corrupt Middle's drop", || {
        nic.stat("rx_drop_bad_icrc") >= 1
    });
    assert_eq!(
        nic.stat("rx_placed_bad_icrc"),
        1,
        "the Middle was not placed"
    );
    let mut buf = [0u8; 256];
    assert!(
        peer.recv_from(&mut buf).is_err(),
        "the NIC answered a packet that failed its ICRC"
    );
    assert_eq!(quiet(&nic), before, "a dropped packet changed a counter");
    // Its bytes lie at the WRITE's cursor (the corrupt byte among them), nowhere else.
    let m = y.mr.read_vec(0, y.mr.len());
    let mut corrupt = data[MTU..2 * MTU].to_vec();
    corrupt[100] ^= 0x40;
    assert!(m[base..base + MTU] == data[..MTU]);
    assert!(m[base + MTU..base + 2 * MTU] == corrupt[..]);
    assert!(m[..base]
        .iter()
        .chain(&m[base + 2 * MTU..])
        .all(|&b| b == CANARY));

    // The Middle again, intact; then a Last whose datagram runs 4 bytes longer (its
    // ICRC slot now holds 4 bytes that are not its ICRC): the payload it claims has
    // no room in the RETH range, so it is not placed, and it is dropped.
    send(middle, None);
    let mut last = packet(
        write_op(Position::Last),
        qpn,
        psn(2),
        true,
        None,
        &data[2 * MTU..],
    );
    fill_icrc_v4(&mut last, from, to);
    let mut long = last.clone();
    long.extend_from_slice(&[0; 4]);
    peer.send_to(&long, to).expect("send");
    wait_for("the second drop", || nic.stat("rx_drop_bad_icrc") >= 2);
    assert_eq!(
        nic.stat("rx_placed_bad_icrc"),
        1,
        "the long Last was placed"
    );
    let m = y.mr.read_vec(0, y.mr.len());
    assert!(m[base + 2 * MTU..].iter().all(|&b| b == CANARY));

    // Intact: the WRITE completes, with one ACK for each packet that asked (the
    // intact Middle and the Last; the corrupt ones had none), and its bytes.
    peer.send_to(&last, to).expect("send");
    for want in [psn(1), psn(2)] {
        let (n, src) = peer.recv_from(&mut buf).expect("an ACK");
        assert_eq!(src, to);
        let ack = PacketRepr::parse(&buf[..n]).expect("ACK parses");
        assert_eq!(ack.repr.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(ack.repr.bth.psn.value(), want);
    }
    assert!(
        peer.recv_from(&mut buf).is_err(),
        "more answers than the packets asked for"
    );
    let m = y.mr.read_vec(0, y.mr.len());
    assert!(m[base..base + data.len()] == data[..], "WRITE bytes differ");
    assert!(m[..base]
        .iter()
        .chain(&m[base + data.len()..])
        .all(|&b| b == CANARY));
    assert_eq!(nic.stat("rx_placed_fused"), 2, "Middle and Last placed");
    assert_eq!(nic.stat("rx_placed_mismatch"), 0);
    assert_eq!(nic.stat("rx_placed_bad_icrc"), 1);
}
