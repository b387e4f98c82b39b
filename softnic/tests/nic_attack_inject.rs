//! Attack: an off-path host injects into a connected QP (issue 9, item 2).
//!
//! Two NICs are connected by an RC QP pair. A third UDP socket — another host on
//! 127.0.0.63, then a socket on the peer's own address but another port — sends the
//! victim a well-formed RDMA WRITE ONLY with a correct ICRC, the victim QP's QPN, the
//! PSN it expects next, and the real R_Key and VA of its region: everything but the
//! source. The attacker is given every secret, so only the source check stands between
//! it and the victim's memory. The region (canary bytes throughout) must not change,
//! the drops must be counted under their reason, and the real connection must keep
//! working at the PSN the forgeries tried to take.

mod nic_support;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{Mtu, SendWr, WcStatus, WrOpcode};
use wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn, RethRepr};

const CANARY: u8 = 0xA5;

/// The first PSN `x` sends (see `rc_pair`): what `y`'s responder expects next.
const X_FIRST_PSN: u32 = 0x10_0000;

/// A complete RC RDMA WRITE ONLY from `src` to `dst`, ICRC filled as a RoCEv2 sender
/// would (IPv4, DF, ID 0).
fn forged_write(
    src: SocketAddr,
    dst: SocketAddr,
    qpn: u32,
    psn: u32,
    reth: RethRepr,
    payload: &[u8],
) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        mig_req: true,
        ack_req: true,
        ..BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(qpn), Psn::new(psn))
    });
    repr.reth = Some(reth);
    repr.payload_len = payload.len();
    let mut buf = vec![0u8; 256 + payload.len()];
    let n = repr.emit(&mut buf, payload).expect("emit");
    buf.truncate(n);
    fill_icrc_v4(&mut buf, src, dst);
    buf
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn spoofed_rdma_write_into_a_connected_qp_is_dropped_and_counted() {
    let a = NicProc::start("inject-a", "127.0.0.61", 0, &[]);
    let b = NicProc::start("inject-b", "127.0.0.62", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    y.mr.fill(0, y.mr.len(), CANARY);

    let victim = SocketAddr::new(b.addr, b.port);
    let reth = RethRepr {
        va: y.mr.addr() + 1024,
        rkey: y.mr.rkey(),
        dma_len: 64,
    };
    let before = b.stat("rx_datagrams");
    // Another host, and the peer's own address from a port that is not the peer's.
    let attackers = [
        UdpSocket::bind("127.0.0.63:0").expect("bind attacker"),
        UdpSocket::bind((a.addr, 0)).expect("bind attacker on the peer's address"),
    ];
    for s in &attackers {
        let src = s.local_addr().unwrap();
        assert_ne!(src, SocketAddr::new(a.addr, a.port));
        let pkt = forged_write(src, victim, y.qp.qp_num(), X_FIRST_PSN, reth, &[0x66; 64]);
        s.send_to(&pkt, victim).expect("send forged write");
    }
    wait_for("the NIC to receive both forgeries", || {
        b.stat("rx_datagrams") >= before + 2
    });
    // Give a NIC that accepted them time to execute the write.
    std::thread::sleep(Duration::from_millis(50));

    assert!(
        y.mr.read_vec(0, y.mr.len()).iter().all(|&v| v == CANARY),
        "the forged WRITE reached the victim's memory"
    );
    // Dropped for their source, not for a bad ICRC or header: the forgeries were sound.
    assert_eq!(b.stat("rx_drop_bad_icrc"), 0);
    assert_eq!(b.stat("rx_drop_source_address"), 1);
    assert_eq!(b.stat("rx_drop_source_port"), 1);

    // The real connection still works, at the PSN the forgeries tried to take.
    let data = pattern(64, 9);
    x.mr.write(0, &data);
    let sge = [x.mr.sge(0, 64)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr() + 1024,
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(1, op, &sge).signaled()])
        .expect("post");
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    let m = y.mr.read_vec(0, y.mr.len());
    assert!(m[1024..1088] == data[..]);
    assert!(
        m[..1024].iter().chain(&m[1088..]).all(|&v| v == CANARY),
        "bytes around the written range changed"
    );
    assert_eq!(b.stat("rx_drop_source_address"), 1);
    assert_eq!(b.stat("rx_drop_source_port"), 1);
}
