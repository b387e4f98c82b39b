//! UC (no ACKs; a PSN gap drops the message in progress) and UD (DETH, Q_Key, GRH).

mod common;

use common::*;
use softnic_transport::qp::{QpState, QpType, GRH_LEN, PATH_MTUS};
use softnic_transport::testing::{PairConfig, Verdict};
use softnic_transport::wr::{SendOp, WcOpcode, WcStatus};
use wire::Operation;

const STEPS: u64 = 1_000_000;

fn uc(mtu: u32) -> PairConfig {
    PairConfig {
        qp_type: QpType::Uc,
        mtu,
        ..PairConfig::default()
    }
}

fn udc(mtu: u32) -> PairConfig {
    PairConfig {
        qp_type: QpType::Ud,
        mtu,
        ..PairConfig::default()
    }
}

#[test]
fn uc_send_and_write_every_size() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            let (mut p, a, b) = pair(uc(mtu), 1);
            let data = pattern(size as u64, size);
            fill(&mut p.a, &a, 0, &data);
            p.b.qp.post_recv(recv(1, &[b.sge(0, size)])).unwrap();
            p.b.qp.post_recv(recv(2, &[])).unwrap();
            p.a.qp
                .post_send(wr(10, SendOp::SendWithImm(7), &[a.sge(0, size)]))
                .unwrap();
            p.a.qp
                .post_send(rdma(
                    11,
                    SendOp::WriteWithImm(8),
                    &[a.sge(0, size)],
                    &b,
                    MIB,
                ))
                .unwrap();
            p.drive(STEPS);
            let sc = drain(&mut p.a);
            assert_eq!(
                ids(&sc),
                vec![(10, WcStatus::Success), (11, WcStatus::Success)]
            );
            let rc = drain(&mut p.b);
            assert_eq!(
                rc.iter()
                    .map(|c| (c.wr_id, c.opcode, c.byte_len as usize, c.imm))
                    .collect::<Vec<_>>(),
                vec![
                    (1, WcOpcode::Recv, size, Some(7)),
                    (2, WcOpcode::RecvRdmaWithImm, size, Some(8))
                ]
            );
            assert!(read(&p.b, &b, 0, size) == data);
            assert!(read(&p.b, &b, MIB, size) == data);
            // UC never acknowledges.
            assert_eq!(p.b.qp.counters().acks_sent, 0);
        }
    }
}

#[test]
fn uc_psn_gap_drops_the_message_and_reuses_the_receive() {
    let (mut p, a, b) = pair(uc(256), 2);
    let first = pattern(1, 3 * 256);
    let second = pattern(2, 100);
    fill(&mut p.a, &a, 0, &first);
    fill(&mut p.a, &a, 4096, &second);
    // Lose the middle packet of the first message (PSN 101).
    p.filter = Some(Box::new(|s| {
        if s.repr.bth.psn.value() == 101 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    p.b.qp.post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 3 * 256)]))
        .unwrap();
    p.a.qp
        .post_send(wr(2, SendOp::Send, &[a.sge(4096, 100)]))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a).len(), 2, "the UC sender cannot know");
    let rc = drain(&mut p.b);
    assert_eq!(rc.len(), 1, "{rc:?}");
    assert_eq!((rc[0].wr_id, rc[0].byte_len), (1, 100));
    assert_eq!(read(&p.b, &b, 0, 100), second);
    assert_eq!(p.b.qp.counters().drop_uc_message, 1);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

#[test]
fn uc_lost_last_packet_of_write_with_imm_gives_no_completion() {
    let (mut p, a, b) = pair(uc(256), 3);
    p.filter = Some(Box::new(|s| {
        if s.repr.bth.psn.value() == 102 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    p.b.qp.post_recv(recv(1, &[])).unwrap();
    p.a.qp
        .post_send(rdma(1, SendOp::WriteWithImm(1), &[a.sge(0, 600)], &b, 0))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::WriteWithImm(2), &[a.sge(0, 10)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let rc = drain(&mut p.b);
    assert_eq!(
        rc.iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>(),
        vec![(1, Some(2))],
        "only the second message completes, into the first receive WQE"
    );
}

#[test]
fn ud_send_writes_grh_then_payload_and_reports_src_qp() {
    for mtu in PATH_MTUS {
        for size in [0, 1, mtu as usize - 1, mtu as usize] {
            let (mut p, a, b) = pair(udc(mtu), 4);
            let data = pattern(size as u64, size);
            fill(&mut p.a, &a, 0, &data);
            p.b.qp.post_recv(recv(5, &[b.sge(0, 40 + size)])).unwrap();
            let dest = p.b.addr;
            let qpn_b = p.b.qp.qpn();
            p.a.qp
                .post_send(ud(
                    wr(9, SendOp::SendWithImm(0xABCD), &[a.sge(0, size)]),
                    qpn_b,
                    0x1111,
                    dest,
                ))
                .unwrap();
            p.drive(STEPS);
            let sc = drain(&mut p.a);
            assert_eq!((sc[0].wr_id, sc[0].status), (9, WcStatus::Success));
            let rc = drain(&mut p.b);
            assert_eq!(rc.len(), 1);
            let c = rc[0];
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.imm, c.src_qp),
                (
                    5,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    Some(0xABCD),
                    p.a.qp.qpn()
                )
            );
            assert_eq!(c.byte_len as usize, GRH_LEN as usize + size);
            let grh = read(&p.b, &b, 0, 40);
            assert_eq!(&grh[..20], &[0u8; 20]);
            assert_eq!(grh[20], 0x45, "IPv4 header in bytes 20..40");
            assert_eq!(&grh[32..36], &[127, 0, 0, 1], "source address");
            assert_eq!(&grh[36..40], &[127, 0, 0, 2], "destination address");
            assert!(read(&p.b, &b, 40, size) == data);
        }
    }
}

#[test]
fn ud_qkey_mismatch_and_missing_receive_are_dropped() {
    let (mut p, a, b) = pair(udc(1024), 5);
    let dest = p.b.addr;
    let qpn_b = p.b.qp.qpn();
    p.b.qp.post_recv(recv(1, &[b.sge(0, 200)])).unwrap();
    p.a.qp
        .post_send(ud(
            wr(1, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x2222,
            dest,
        ))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(p.b.qp.counters().drop_bad_qkey, 1);
    assert!(drain(&mut p.b).is_empty());
    // A Q_Key with the high bit set means "the sender QP's own Q_Key" (0x1111).
    p.a.qp
        .post_send(ud(
            wr(2, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x8000_0000,
            dest,
        ))
        .unwrap();
    p.a.qp
        .post_send(ud(
            wr(3, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.b).len(), 1);
    assert_eq!(p.b.qp.counters().drop_no_recv_wqe, 1);
    assert_eq!(drain(&mut p.a).len(), 3);
}

#[test]
fn ud_receive_buffer_without_room_for_grh_is_a_length_error() {
    let (mut p, a, b) = pair(udc(1024), 6);
    let dest = p.b.addr;
    let qpn_b = p.b.qp.qpn();
    p.b.qp.post_recv(recv(1, &[b.sge(0, 100)])).unwrap();
    p.a.qp
        .post_send(ud(
            wr(1, SendOp::Send, &[a.sge(0, 80)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    p.drive(STEPS);
    let rc = drain(&mut p.b);
    assert_eq!((rc[0].wr_id, rc[0].status), (1, WcStatus::LocLenErr));
    assert_eq!(read(&p.b, &b, 0, 100), vec![0; 100], "nothing written");
    let _ = Operation::Send;
}

#[test]
fn ud_send_error_moves_to_sqe_and_rts_resumes() {
    let (mut p, a, b) = pair(udc(1024), 7);
    let dest = p.b.addr;
    let qpn_b = p.b.qp.qpn();
    // Longer than the MTU: a local length error (IBTA: a UD message is one packet).
    p.a.qp
        .post_send(ud(
            wr(1, SendOp::Send, &[a.sge(0, 2000)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    p.a.qp
        .post_send(ud(
            wr(2, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    p.drive(STEPS);
    let sc = ids(&drain(&mut p.a));
    assert_eq!(
        sc,
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.qp.state(), QpState::Sqe);
    // The receive side still works in SQE.
    p.a.qp.post_recv(recv(9, &[a.sge(4096, 100)])).unwrap();
    let dest_a = p.a.addr;
    let qpn_a = p.a.qp.qpn();
    p.b.qp
        .post_send(ud(
            wr(3, SendOp::Send, &[b.sge(0, 10)]),
            qpn_a,
            0x1111,
            dest_a,
        ))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(
        drain(&mut p.a).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![9]
    );
    // Posts in SQE are flushed; SQE -> RTS resumes.
    p.a.qp
        .post_send(ud(
            wr(4, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::WrFlushErr);
    p.a.qp
        .modify(
            p.now,
            &softnic_transport::qp::QpAttr {
                state: Some(QpState::Rts),
                ..Default::default()
            },
        )
        .unwrap();
    p.b.qp.post_recv(recv(5, &[b.sge(0, 100)])).unwrap();
    p.a.qp
        .post_send(ud(
            wr(5, SendOp::Send, &[a.sge(0, 10)]),
            qpn_b,
            0x1111,
            dest,
        ))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    assert_eq!(
        drain(&mut p.b).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![3, 5]
    );
}
