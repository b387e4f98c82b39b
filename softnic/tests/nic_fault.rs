//! RC over the NICs' own fault injection: loss, reordering, duplication and corruption
//! on every packet both NICs send; every message still arrives exactly once, intact,
//! and the counters show the faults happened and were repaired.

mod nic_support;

use nic_support::*;
use verbs_api::{Mtu, RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode};

#[test]
fn rc_survives_loss_reordering_duplication_and_corruption() {
    let faults = [
        "--loss",
        "0.05",
        "--reorder",
        "0.05",
        "--duplicate",
        "0.05",
        "--corrupt",
        "0.02",
    ];
    let a = NicProc::start(
        "fault-a",
        "127.0.0.11",
        0,
        &[&faults[..], &["--seed", "11"]].concat(),
    );
    let b = NicProc::start(
        "fault-b",
        "127.0.0.12",
        0,
        &[&faults[..], &["--seed", "12"]].concat(),
    );
    // A short ACK timeout (4.096 µs × 2^10 ≈ 4 ms) keeps the test quick; the
    // ibv_rc_pingpong value 14 would spend 67 ms per lost tail packet.
    let (mut x, mut y) = rc_pair_with_timeout(&a, &b, Mtu::Mtu1024, 1 << 20, 64, 10);
    const N: u64 = 300;
    for i in 0..N {
        let len = 1 + (i as usize * 997) % 9000;
        let data = pattern(len, i as u8);
        x.mr.write(0, &data);
        let rs = [y.mr.sge(0, len as u32)];
        y.qp.post_recv(&[RecvWr::new(i, &rs)]).expect("recv");
        let ss = [x.mr.sge(0, len as u32)];
        let op = if i % 3 == 0 {
            WrOpcode::SendWithImm(i as u32)
        } else {
            WrOpcode::Send
        };
        x.qp.post_send(&[SendWr::new(i, op, &ss).signaled()])
            .expect("send");
        let s = poll_one(&mut x.cq);
        assert_eq!((s.wr_id, s.status), (i, WcStatus::Success), "{s:?}");
        let r = poll_one(&mut y.cq);
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (i, WcStatus::Success, WcOpcode::Recv),
            "{r:?}"
        );
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.imm_data, (i % 3 == 0).then_some(i as u32));
        assert!(y.mr.read_vec(0, len) == data[..], "message {i} intact");
        // READ back through the faulty path too.
        if i % 10 == 0 {
            x.mr.fill(0, len, 0);
            let op = WrOpcode::RdmaRead {
                remote_addr: y.mr.addr(),
                rkey: y.mr.rkey(),
            };
            x.qp.post_send(&[SendWr::new(1_000_000 + i, op, &ss).signaled()])
                .expect("read");
            let c = poll_one(&mut x.cq);
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert!(x.mr.read_vec(0, len) == data[..], "read {i} intact");
        }
    }
    let (sa, sb) = (a.stats(), b.stats());
    let get = |l: &Vec<(String, u64)>, n: &str| {
        l.iter().find(|(k, _)| k == n).map(|(_, v)| *v).unwrap_or(0)
    };
    for (n, l) in [("a", &sa), ("b", &sb)] {
        assert!(get(l, "fault_dropped") > 0, "{n}: faults injected");
        assert!(get(l, "fault_corrupted") > 0, "{n}: corruption injected");
        // GSO is on by default, but faults act on single RoCE packets: with fault
        // injection every packet is its own send (so IPv4 ID 0), never a GSO run.
        assert_eq!(get(l, "tx_gso_sends"), 0, "{n}: no GSO run under faults");
        assert_eq!(
            get(l, "rx_icrc_solved"),
            0,
            "{n}: every packet sent with ID 0"
        );
    }
    assert!(
        get(&sb, "rx_drop_bad_icrc") > 0,
        "corrupted packets caught by the ICRC"
    );
    assert!(
        get(&sa, "qp_retransmitted_packets") > 0,
        "losses repaired by retransmission"
    );
    assert!(
        get(&sb, "qp_duplicate_requests") > 0,
        "duplicates recognised"
    );
}
