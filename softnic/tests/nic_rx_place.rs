//! The receiver's single pass between two NICs (`nic/rx_place.rs`): 64 KiB WRITEs,
//! SENDs and READs have their payloads placed in the pass that hashes them (WRITE
//! Middle/Last, SEND Middle, every READ response; `rx_placed_fused` > 0, so a silent
//! fallback to check-then-copy fails here), and with the sender corrupting packets after their ICRC was filled, placed packets
//! that fail their ICRC are dropped and counted (`rx_placed_bad_icrc`), and every
//! message still arrives once and intact after the retransmission.

mod nic_support;

use nic_support::*;
use verbs_api::{Mtu, RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode};

const LEN: usize = 65_536;

/// `n` rounds of a 64 KiB WRITE, SEND and READ from `x` to `y`, each completed once,
/// successfully, with its bytes intact.
fn write_send_read(x: &mut Side, y: &mut Side, n: usize) {
    for i in 0..n {
        let data = pattern(LEN, i as u8);
        x.mr.write(0, &data);
        let ss = [x.mr.sge(0, LEN as u32)];
        let op = WrOpcode::RdmaWrite {
            remote_addr: y.mr.addr() + LEN as u64,
            rkey: y.mr.rkey(),
        };
        x.qp.post_send(&[SendWr::new(1, op, &ss).signaled()])
            .expect("write");
        let c = poll_one(&mut x.cq);
        assert_eq!((c.wr_id, c.status), (1, WcStatus::Success), "{c:?}");
        assert!(y.mr.read_vec(LEN, LEN) == data, "WRITE {i} intact");

        let rs = [y.mr.sge(2 * LEN, LEN as u32)];
        y.qp.post_recv(&[RecvWr::new(2, &rs)]).expect("recv");
        x.qp.post_send(&[SendWr::new(2, WrOpcode::Send, &ss).signaled()])
            .expect("send");
        let c = poll_one(&mut x.cq);
        assert_eq!((c.wr_id, c.status), (2, WcStatus::Success), "{c:?}");
        let r = poll_one(&mut y.cq);
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len as usize),
            (2, WcStatus::Success, WcOpcode::Recv, LEN),
            "{r:?}"
        );
        assert!(y.mr.read_vec(2 * LEN, LEN) == data, "SEND {i} intact");

        x.mr.fill(0, LEN, 0);
        let op = WrOpcode::RdmaRead {
            remote_addr: y.mr.addr() + LEN as u64,
            rkey: y.mr.rkey(),
        };
        x.qp.post_send(&[SendWr::new(3, op, &ss).signaled()])
            .expect("read");
        let c = poll_one(&mut x.cq);
        assert_eq!((c.wr_id, c.status), (3, WcStatus::Success), "{c:?}");
        assert!(x.mr.read_vec(0, LEN) == data, "READ {i} intact");
    }
}

/// Without faults every WRITE places 15 of its 16 packets at B (not the First: it
/// carries the RETH), every SEND 14 (not the First, which takes the receive WQE, nor
/// the Last, whose length nothing validated bounds), and every READ 16 responses at A;
/// handling makes each placed write.
#[test]
fn large_writes_sends_and_reads_are_placed_in_one_pass() {
    let a = NicProc::start("rxplace-a", "127.0.0.131", 0, &[]);
    let b = NicProc::start("rxplace-b", "127.0.0.132", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu4096, 3 * LEN, 16);
    const N: u64 = 8;
    write_send_read(&mut x, &mut y, N as usize);
    assert_eq!(
        b.stat("rx_placed_fused"),
        N * (15 + 14),
        "WRITE + SEND at B"
    );
    assert_eq!(a.stat("rx_placed_fused"), N * 16, "READ responses at A");
    for nic in [&a, &b] {
        assert_eq!(nic.stat("rx_placed_mismatch"), 0);
        assert_eq!(nic.stat("rx_placed_bad_icrc"), 0);
        assert_eq!(nic.stat("rx_drop_bad_icrc"), 0);
    }
}

/// Both NICs flip one bit in 3 % of the packets they send, after the ICRC was filled
/// (`--corrupt`): a placed packet that fails its ICRC is dropped and counted, not
/// acknowledged, and the retransmission completes the message once and intact.
#[test]
fn placed_packets_that_fail_the_icrc_are_dropped_and_repaired() {
    let args = |seed: &'static str| ["--corrupt", "0.03", "--seed", seed];
    let a = NicProc::start("rxplacebad-a", "127.0.0.133", 0, &args("31"));
    let b = NicProc::start("rxplacebad-b", "127.0.0.134", 0, &args("32"));
    let (mut x, mut y) = rc_pair_with_timeout(&a, &b, Mtu::Mtu4096, 3 * LEN, 16, 10);
    write_send_read(&mut x, &mut y, 40);
    assert!(a.stat("fault_corrupted") > 0 && b.stat("fault_corrupted") > 0);
    assert!(
        b.stat("rx_placed_bad_icrc") > 0,
        "a corrupted Middle/Last payload was placed, then caught by the ICRC"
    );
    for nic in [&a, &b] {
        assert!(nic.stat("rx_placed_bad_icrc") <= nic.stat("rx_drop_bad_icrc"));
        assert_eq!(nic.stat("rx_placed_mismatch"), 0);
        assert!(nic.stat("rx_placed_fused") > 0);
    }
    assert!(
        a.stat("qp_retransmitted_packets") > 0,
        "repaired by retransmission"
    );
}
