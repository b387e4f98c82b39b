//! XRC (eXtended Reliable Connected, IBTA 1.2.1; opcodes in 9.2 table 38): an XRC send QP's requests
//! carry the target's XRC SRQ number in an XRCETH and use the XRC opcodes; the XRC
//! receive QP takes each request's receive WQE from that SRQ, makes memory accesses
//! under the SRQ's protection domain, answers with XRC responses, and tags each
//! receive completion with the SRQ whose CQ takes it.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::*;
use softnic_transport::memory::Access;
use softnic_transport::qp::state::{check_transition, TransitionError};
use softnic_transport::qp::{AttrMask, PostError, QpEvent, QpState, QpType};
use softnic_transport::srq::{Srq, SrqCaps};
use softnic_transport::testing::{Pair, Seen, Side, Verdict, PAIR_SRQN};
use softnic_transport::wr::{Queue, SendOp, WcOpcode, WcStatus};
use wire::{Opcode, Transport};

const STEPS: u64 = 1_000_000;

fn caps() -> SrqCaps {
    SrqCaps {
        max_wr: 64,
        max_sge: 2,
    }
}

/// Every packet's sender and headers, as the pair's filter saw them.
type Log = Rc<RefCell<Vec<(Side, wire::PacketRepr)>>>;

/// An XRC pair (A sends, B receives through SRQ [`PAIR_SRQN`]) with 2 MiB + 64 KiB
/// regions of PD 1 on each side, and a log of every packet.
fn xrc_pair(mtu: u32) -> (Pair, Buf, Buf, Log) {
    let mut p = Pair::connect_xrc(rc(mtu), 7, caps());
    let len = (2 << 20) + (64 << 10);
    let a = region(&mut p.a, 0x1000_0000, len, Access::ALL);
    let b = region(&mut p.b, 0x7f00_0000_0000, len, Access::ALL);
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    p.filter = Some(Box::new(move |s: &Seen| {
        l.borrow_mut().push((s.from, s.repr));
        Verdict::Pass
    }));
    (p, a, b, log)
}

fn xrc(mut w: softnic_transport::wr::SendWr) -> softnic_transport::wr::SendWr {
    w.xrc_srqn = PAIR_SRQN;
    w
}

fn srq(p: &mut Pair) -> &mut Srq {
    p.b.srq.as_mut().expect("B has an XRC SRQ")
}

/// Every request A sent is an XRC request naming the SRQ; every response B sent is an
/// XRC response without an XRCETH.
fn check_wire(log: &[(Side, wire::PacketRepr)]) {
    assert!(!log.is_empty());
    for (from, r) in log {
        let info = r.bth.opcode.info().expect("known opcode");
        assert_eq!(info.transport, Transport::Xrc, "{:?}", r.bth.opcode);
        match from {
            Side::A => {
                assert!(info.is_request(), "{:?}", r.bth.opcode);
                assert_eq!(r.xrceth.map(|x| x.srqn), Some(PAIR_SRQN));
            }
            Side::B => {
                assert!(!info.is_request(), "{:?}", r.bth.opcode);
                assert_eq!(r.xrceth, None);
            }
        }
    }
}

#[test]
fn sends_of_every_size_land_in_srq_wqes_and_complete_on_the_srq() {
    for mtu in [256, 4096] {
        let (mut p, a, b, log) = xrc_pair(mtu);
        for (i, len) in sizes(mtu).into_iter().enumerate() {
            let data = pattern(i as u64, len);
            fill(&mut p.a, &a, 0, &data);
            srq(&mut p)
                .post_recv(recv(100 + i as u64, &[b.sge(0, len.max(1))]))
                .unwrap();
            p.a.qp
                .post_send(xrc(wr(i as u64, SendOp::Send, &[a.sge(0, len)])))
                .unwrap();
            p.drive(STEPS);
            assert_eq!(ids(&drain(&mut p.a)), [(i as u64, WcStatus::Success)]);
            let got = drain(&mut p.b);
            assert_eq!(got.len(), 1, "mtu {mtu} len {len}");
            let c = got[0];
            assert_eq!((c.wr_id, c.status), (100 + i as u64, WcStatus::Success));
            assert_eq!((c.queue, c.opcode), (Queue::Recv, WcOpcode::Recv));
            assert_eq!(c.byte_len as usize, len);
            assert_eq!(c.srqn, PAIR_SRQN, "the completion names its SRQ");
            assert!(read(&p.b, &b, 0, len) == data, "mtu {mtu} len {len}");
        }
        check_wire(&log.borrow());
        let acks = log
            .borrow()
            .iter()
            .filter(|(_, r)| r.bth.opcode == Opcode(0xB1))
            .count();
        assert!(acks > 0, "XRC ACKNOWLEDGE (0xB1) answers");
    }
}

#[test]
fn rdma_read_write_and_atomics_through_xrc() {
    let (mut p, a, b, log) = xrc_pair(1024);
    let data = pattern(3, 5000);
    fill(&mut p.a, &a, 0, &data);
    p.a.qp
        .post_send(xrc(rdma(1, SendOp::Write, &[a.sge(0, 5000)], &b, 64)))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::Success)]);
    assert!(read(&p.b, &b, 64, 5000) == data);
    assert!(drain(&mut p.b).is_empty(), "a WRITE takes no WQE");

    let back = pattern(4, 3000);
    fill(&mut p.b, &b, 8192, &back);
    p.a.qp
        .post_send(xrc(rdma(2, SendOp::Read, &[a.sge(16384, 3000)], &b, 8192)))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(2, WcStatus::Success)]);
    assert!(read(&p.a, &a, 16384, 3000) == back);

    fill(&mut p.b, &b, 0, &40u64.to_le_bytes());
    p.a.qp
        .post_send(xrc(rdma(
            3,
            SendOp::FetchAdd { add: 2 },
            &[a.sge(32768, 8)],
            &b,
            0,
        )))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(3, WcStatus::Success)]);
    assert_eq!(read(&p.a, &a, 32768, 8), 40u64.to_le_bytes());
    assert_eq!(read(&p.b, &b, 0, 8), 42u64.to_le_bytes());

    // WRITE with immediate consumes an SRQ WQE and completes on the SRQ.
    srq(&mut p).post_recv(recv(77, &[])).unwrap();
    p.a.qp
        .post_send(xrc(rdma(
            4,
            SendOp::WriteWithImm(0xAB),
            &[a.sge(0, 100)],
            &b,
            0,
        )))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(4, WcStatus::Success)]);
    let c = drain(&mut p.b);
    assert_eq!(ids(&c), [(77, WcStatus::Success)]);
    assert_eq!((c[0].imm, c[0].srqn), (Some(0xAB), PAIR_SRQN));

    check_wire(&log.borrow());
    let ops: Vec<u8> = log.borrow().iter().map(|(_, r)| r.bth.opcode.0).collect();
    // READ request 0xAC, its responses 0xAD..=0xAF (3 packets at MTU 1024), the
    // atomic 0xB4 and its ACK 0xB2.
    for op in [0xAC, 0xAD, 0xAE, 0xAF, 0xB4, 0xB2, 0xAB] {
        assert!(ops.contains(&op), "opcode {op:#x} in {ops:x?}");
    }
}

#[test]
fn memory_is_reached_under_the_pd_of_the_srq_the_request_names() {
    let (mut p, a, b, _) = xrc_pair(1024);
    // B's SRQ of PD 2: B's region (PD 1) is another domain's memory for it.
    p.b.srq = Some(Srq::new(PAIR_SRQN, 2, caps()));
    p.a.qp
        .post_send(xrc(rdma(1, SendOp::Write, &[a.sge(0, 64)], &b, 0)))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
}

#[test]
fn an_unknown_srq_takes_nothing_and_an_empty_one_is_rnr() {
    let (mut p, a, b, _) = xrc_pair(1024);
    // Named SRQ absent at B (the NIC finds none in the QP's domain): NAK Remote
    // Access Error, both QPs in Err, B's SRQ untouched.
    srq(&mut p).post_recv(recv(5, &[b.sge(0, 8)])).unwrap();
    let mut w = xrc(wr(1, SendOp::Send, &[a.sge(0, 8)]));
    w.xrc_srqn = PAIR_SRQN + 1;
    p.a.qp.post_send(w).unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::AccessErr));
    assert_eq!(p.b.qp.counters().nak_remote_access_sent, 1);
    assert_eq!(srq(&mut p).len(), 1);
    assert!(drain(&mut p.b).is_empty());

    // The right SRQ, empty: RNR NAKs until a WQE is posted.
    let (mut p, a, b2, _) = xrc_pair(1024);
    let _ = b;
    p.a.qp
        .post_send(xrc(wr(2, SendOp::Send, &[a.sge(0, 8)])))
        .unwrap();
    assert!(!p.drive_bounded(2_000), "still waiting for a WQE");
    assert!(drain(&mut p.a).is_empty());
    assert!(p.b.qp.counters().nak_rnr_sent > 0);
    srq(&mut p).post_recv(recv(9, &[b2.sge(0, 8)])).unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), [(2, WcStatus::Success)]);
    assert_eq!(ids(&drain(&mut p.b)), [(9, WcStatus::Success)]);
}

#[test]
fn each_half_refuses_the_other_halfs_work_and_packets() {
    let (mut p, a, b, _) = xrc_pair(1024);
    // The send QP has no receive queue, the receive QP no send queue.
    assert_eq!(
        p.a.qp.post_recv(recv(1, &[a.sge(0, 8)])),
        Err(PostError::UsesSrq)
    );
    assert_eq!(
        p.b.qp.post_recv(recv(1, &[b.sge(0, 8)])),
        Err(PostError::UsesSrq)
    );
    assert_eq!(
        p.b.qp.post_send(xrc(wr(1, SendOp::Send, &[b.sge(0, 8)]))),
        Err(PostError::UnsupportedOp)
    );
    // An RC SEND to the XRC receive QP, and an XRC request to the XRC send QP, are
    // opcodes of the wrong service or the wrong half: dropped.
    let mut rc = Pair::connect(rc(1024), 1);
    let ra = region(&mut rc.a, 0x1000, 64, Access::ALL);
    rc.a.qp
        .post_send(wr(1, SendOp::Send, &[ra.sge(0, 8)]))
        .unwrap();
    let mut buf = vec![0u8; 4096 + 128];
    let t =
        rc.a.qp
            .poll_transmit(rc.now, &mut buf, &rc.a.mem)
            .expect("a packet");
    let pkt = wire::PacketRepr::parse(&buf[..t.len]).expect("parses");
    let before = p.b.qp.counters().drop_bad_opcode;
    let s = p.b.srq.as_mut().expect("srq");
    let ip = softnic_transport::qp::ReceivedIp::default();
    p.b.qp
        .handle_packet_xrc(p.now, p.a.addr, &ip, &pkt, &mut p.b.mem, s);
    assert_eq!(p.b.qp.counters().drop_bad_opcode, before + 1);

    p.a.qp
        .post_send(xrc(wr(2, SendOp::Send, &[a.sge(0, 8)])))
        .unwrap();
    let t =
        p.a.qp
            .poll_transmit(p.now, &mut buf, &p.a.mem)
            .expect("xrc");
    let pkt = wire::PacketRepr::parse(&buf[..t.len]).expect("parses");
    let before = p.a.qp.counters().drop_bad_opcode;
    p.a.qp.handle_packet(p.now, p.b.addr, &pkt, &mut p.a.mem);
    assert_eq!(p.a.qp.counters().drop_bad_opcode, before + 1);
    // And an XRC receive QP takes nothing through the plain SRQ entry point.
    let s = p.b.srq.as_mut().expect("srq");
    let before = p.b.qp.counters().drop_bad_state;
    p.b.qp
        .handle_packet_srq(p.now, p.a.addr, &pkt, &mut p.b.mem, s);
    assert_eq!(p.b.qp.counters().drop_bad_state, before + 1);
}

#[test]
fn a_message_keeps_the_srq_of_its_first_packet() {
    // Two SRQs at B, swapped between messages: each completion names the SRQ its WQE
    // came from, and the WQE of a message in progress is flushed to its own SRQ's CQ
    // when the QP fails.
    let (mut p, a, b, _) = xrc_pair(256);
    srq(&mut p).post_recv(recv(1, &[b.sge(0, 1000)])).unwrap();
    p.a.qp
        .post_send(xrc(wr(1, SendOp::Send, &[a.sge(0, 100)])))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(drain(&mut p.b)[0].srqn, PAIR_SRQN);

    let other = 0x9;
    let mut s2 = Srq::new(other, 1, caps());
    s2.post_recv(recv(2, &[b.sge(0, 1000)])).unwrap();
    p.b.srq = Some(s2);
    let mut w = xrc(wr(2, SendOp::Send, &[a.sge(0, 100)]));
    w.xrc_srqn = other;
    p.a.qp.post_send(w).unwrap();
    p.drive(STEPS);
    let c = drain(&mut p.b);
    assert_eq!((c[0].wr_id, c[0].srqn), (2, other));

    // A three-packet SEND whose last two packets are lost: B holds SRQ `other`'s WQE;
    // moving B to Err flushes it with that SRQ's number.
    p.b.srq
        .as_mut()
        .expect("srq")
        .post_recv(recv(3, &[b.sge(0, 1000)]))
        .unwrap();
    let mut w = xrc(wr(3, SendOp::Send, &[a.sge(0, 700)]));
    w.xrc_srqn = other;
    let mut first = true;
    p.filter = Some(Box::new(move |s: &Seen| {
        if s.from == Side::A && !first {
            return Verdict::Drop;
        }
        first = false;
        Verdict::Pass
    }));
    p.a.qp.post_send(w).unwrap();
    p.drive(200);
    let err = softnic_transport::qp::QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    p.b.qp.modify(p.now, &err).unwrap();
    let c = drain(&mut p.b);
    assert_eq!(ids(&c), [(3, WcStatus::WrFlushErr)]);
    assert_eq!(c[0].srqn, other);
}

#[test]
fn transitions_follow_the_kernel_table_for_both_halves() {
    use AttrMask as A;
    let rtr_ini = A::AV.or(A::PATH_MTU).or(A::DEST_QPN).or(A::RQ_PSN);
    check_transition(QpType::XrcSend, QpState::Init, QpState::Rtr, rtr_ini).unwrap();
    // The send half needs no responder attributes; the receive half does.
    assert!(matches!(
        check_transition(QpType::XrcRecv, QpState::Init, QpState::Rtr, rtr_ini),
        Err(TransitionError::Missing { .. })
    ));
    let rts_tgt = A::TIMEOUT.or(A::SQ_PSN);
    check_transition(QpType::XrcRecv, QpState::Rtr, QpState::Rts, rts_tgt).unwrap();
    assert!(matches!(
        check_transition(
            QpType::XrcRecv,
            QpState::Rtr,
            QpState::Rts,
            rts_tgt.or(A::RETRY_CNT)
        ),
        Err(TransitionError::NotAllowed { .. })
    ));
    assert!(matches!(
        check_transition(QpType::XrcSend, QpState::Rtr, QpState::Rts, rts_tgt),
        Err(TransitionError::Missing { .. })
    ));
    // No SQE for a reliable service.
    assert!(check_transition(QpType::XrcSend, QpState::Sqe, QpState::Rts, A::NONE).is_err());
}

#[test]
fn xrc_survives_loss_reordering_and_duplication() {
    let (mut p, a, b, _) = xrc_pair(1024);
    p.faults = softnic_transport::testing::Faults {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.05,
        corrupt: 0.0,
    };
    let mut expect = Vec::new();
    for i in 0..20u64 {
        let len = 100 + 700 * i as usize;
        let data = pattern(i, len);
        fill(&mut p.a, &a, (i as usize) * 16384, &data);
        srq(&mut p)
            .post_recv(recv(i, &[b.sge((i as usize) * 16384, len)]))
            .unwrap();
        p.a.qp
            .post_send(xrc(wr(
                i,
                SendOp::Send,
                &[a.sge((i as usize) * 16384, len)],
            )))
            .unwrap();
        expect.push((i, data));
    }
    p.drive(50 * STEPS);
    let sent = drain(&mut p.a);
    assert_eq!(sent.len(), 20);
    assert!(sent.iter().all(|c| c.status == WcStatus::Success));
    let got = drain(&mut p.b);
    assert_eq!(
        got.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>(),
        "exactly once, in order"
    );
    for (i, data) in expect {
        assert!(read(&p.b, &b, (i as usize) * 16384, data.len()) == data);
    }
}

#[test]
fn a_later_packet_naming_another_srq_is_refused() {
    // A three-packet SEND; its first packet reaches B with SRQ PAIR_SRQN, its second as
    // if it named another SRQ of B's domain: NAK Remote Access Error, B in Err, the
    // message's WQE flushed to the first SRQ's CQ, the other SRQ untouched.
    let (mut p, a, b, _) = xrc_pair(256);
    srq(&mut p).post_recv(recv(1, &[b.sge(0, 1000)])).unwrap();
    let mut other = Srq::new(0x9, 1, caps());
    other.post_recv(recv(2, &[b.sge(0, 1000)])).unwrap();
    p.a.qp
        .post_send(xrc(wr(1, SendOp::Send, &[a.sge(0, 700)])))
        .unwrap();
    let mut buf = vec![0u8; 4096 + 128];
    let mut pkts = Vec::new();
    for _ in 0..2 {
        let t =
            p.a.qp
                .poll_transmit(p.now, &mut buf, &p.a.mem)
                .expect("packet");
        pkts.push(buf[..t.len].to_vec());
    }
    let ip = softnic_transport::qp::ReceivedIp::default();
    let first = wire::PacketRepr::parse(&pkts[0]).expect("parses");
    let s = p.b.srq.as_mut().expect("srq");
    p.b.qp
        .handle_packet_xrc(p.now, p.a.addr, &ip, &first, &mut p.b.mem, s);
    assert_eq!(p.b.qp.state(), QpState::Rts);
    let second = wire::PacketRepr::parse(&pkts[1]).expect("parses");
    p.b.qp
        .handle_packet_xrc(p.now, p.a.addr, &ip, &second, &mut p.b.mem, &mut other);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(p.b.qp.counters().nak_remote_access_sent, 1);
    assert_eq!(other.len(), 1, "the other SRQ lent nothing");
    let c = drain(&mut p.b);
    assert_eq!(ids(&c), [(1, WcStatus::WrFlushErr)]);
    assert_eq!(c[0].srqn, PAIR_SRQN);
}

#[test]
fn attributes_a_half_does_not_have_are_ignored_not_refused() {
    // `ibv_modify_qp` with RC's masks on both halves (perftest `-c XRC`): the kernel
    // strips what each half lacks (uverbs `modify_qp_mask`) and so does the QP.
    use softnic_transport::qp::{Qp, QpAttr, QpCaps};
    use softnic_transport::time::Instant;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_sge: 1,
        max_inline: 0,
    };
    for mut qp in [
        Qp::new(0x11, QpType::XrcSend, 1, caps),
        Qp::new_xrc_recv(0x22, caps),
    ] {
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access: Some(Access::ALL),
            ..Default::default()
        };
        qp.modify(Instant::ZERO, &init).unwrap();
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(1024),
            dest_qpn: Some(0x33),
            rq_psn: Some(1),
            remote: Some("127.0.0.2:4791".parse().unwrap()),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(12),
            ..Default::default()
        };
        qp.modify(Instant::ZERO, &rtr).unwrap();
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(2),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        };
        qp.modify(Instant::ZERO, &rts).unwrap();
        assert_eq!(qp.state(), QpState::Rts, "{:?}", qp.qp_type());
    }
}

/// A READ whose response is lost is replayed under the protection domain it was
/// served under, even when a later message bound the XRC receive QP to an SRQ of
/// another PD meanwhile: a replay checked under the QP's current PD would be refused
/// and dropped, and the READ would fail after its retries.
#[test]
fn a_read_replay_reads_under_the_pd_it_was_served_under() {
    let (mut p, a, b, _) = xrc_pair(1024);
    fill(&mut p.b, &b, 0, &pattern(5, 64));
    let mut dropped = false;
    p.filter = Some(Box::new(move |s: &Seen| {
        if s.from == Side::B
            && !dropped
            && s.repr
                .bth
                .opcode
                .info()
                .is_some_and(|i| i.operation == wire::Operation::ReadResponse)
        {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    p.a.qp
        .post_send(xrc(rdma(1, SendOp::Read, &[a.sge(0, 64)], &b, 0)))
        .unwrap();
    for _ in 0..1000 {
        if p.b.qp.counters().read_responses_sent > 0 {
            break;
        }
        p.step();
    }
    assert_eq!(p.b.qp.counters().read_responses_sent, 1);
    // B's SRQ is now one of PD 2 (its own region), and a SEND binds B's QP to it.
    let other = 0x9;
    let key = p.b.mem.register(2, 0x3000_0000, 4096, Access::ALL);
    let c = Buf {
        key,
        addr: 0x3000_0000,
        len: 4096,
    };
    let mut s2 = Srq::new(other, 2, caps());
    s2.post_recv(recv(2, &[c.sge(0, 100)])).unwrap();
    p.b.srq = Some(s2);
    let mut w = xrc(wr(2, SendOp::Send, &[a.sge(1024, 10)]));
    w.xrc_srqn = other;
    p.a.qp.post_send(w).unwrap();
    p.drive(STEPS);
    assert_eq!(
        ids(&drain(&mut p.a)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(read(&p.a, &a, 0, 64), pattern(5, 64));
    assert!(p.b.qp.counters().duplicate_requests >= 1);
}
