//! The traffic class (the IP TOS / IPv6 traffic class, DSCP and ECN) of what a QP
//! sends: a connected QP's address vector's (`ibv_qp_attr.ah_attr.grh.traffic_class`)
//! on every packet, its requests and its ACKs and READ responses alike, as rxe
//! (`prepare4` / `prepare6` take `av->grh.traffic_class`) and hardware RNICs mark
//! them; a UD work request's address handle's on its datagram.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use softnic_transport::qp::{Qp, QpType};
use softnic_transport::testing::{connect_qp, PairConfig, Side, Verdict};
use softnic_transport::wr::{SendOp, WcStatus};

const STEPS: u64 = 1_000_000;

/// A's class on A's packets, B's on B's.
const A_CLASS: u8 = 0x60; // DSCP 24 (CS3)
const B_CLASS: u8 = 0xB9; // DSCP 46 (EF), ECN ECT(1)

/// Records (sender, traffic class, opcode) of every packet.
fn record(p: &mut softnic_transport::testing::Pair) -> Arc<Mutex<Vec<(Side, u8, u8)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    p.filter = Some(Box::new(move |s| {
        log.lock()
            .unwrap()
            .push((s.from, s.tclass, s.repr.bth.opcode.0));
        Verdict::Pass
    }));
    seen
}

#[test]
fn each_side_sends_everything_with_its_own_class() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let cfg = PairConfig {
            qp_type,
            traffic_class: A_CLASS,
            ..rc(1024)
        };
        let (mut p, a, b) = pair(cfg, 1);
        // B's QP again, with its own class.
        let mut qb = Qp::new(cfg.qpns.1, qp_type, 1, cfg.caps);
        let cfg_b = PairConfig {
            traffic_class: B_CLASS,
            ..cfg
        };
        connect_qp(
            &mut qb, &cfg_b, cfg.qpns.0, p.a.addr, cfg.psns.0, cfg.psns.1,
        );
        qb.set_port_mtu(cfg.mtu);
        qb.set_local_addr(p.b.addr);
        p.b.qp = qb;
        let seen = record(&mut p);
        fill(&mut p.a, &a, 0, &pattern(1, 3000));
        p.b.qp.post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
        p.a.qp
            .post_send(wr(1, SendOp::Send, &[a.sge(0, 3000)]))
            .unwrap();
        p.a.qp
            .post_send(rdma(2, SendOp::Write, &[a.sge(0, 3000)], &b, 8192))
            .unwrap();
        if qp_type == QpType::Rc {
            p.a.qp
                .post_send(rdma(3, SendOp::Read, &[a.sge(8192, 3000)], &b, 8192))
                .unwrap();
        }
        p.drive(STEPS);
        let done = drain(&mut p.a);
        assert!(
            done.iter().all(|c| c.status == WcStatus::Success) && done.len() >= 2,
            "{done:?}"
        );
        let seen = seen.lock().unwrap();
        let from = |side| seen.iter().filter(move |s| s.0 == side);
        assert!(from(Side::A).count() >= 6, "{qp_type:?}: {seen:?}");
        assert!(
            from(Side::A).all(|s| s.1 == A_CLASS),
            "{qp_type:?}: A's packets {seen:?}"
        );
        if qp_type == QpType::Rc {
            // ACKs and the three READ responses.
            assert!(from(Side::B).count() >= 4, "{seen:?}");
        }
        assert!(
            from(Side::B).all(|s| s.1 == B_CLASS),
            "{qp_type:?}: B's packets {seen:?}"
        );
    }
}

#[test]
fn a_ud_datagram_carries_its_work_requests_class() {
    let cfg = PairConfig {
        qp_type: QpType::Ud,
        // A UD QP has no address vector: the class comes with each destination.
        traffic_class: A_CLASS,
        ..rc(1024)
    };
    let (mut p, a, b) = pair(cfg, 2);
    let seen = record(&mut p);
    for (id, class) in [(1u64, 0u8), (2, B_CLASS), (3, 0x02)] {
        p.b.qp.post_recv(recv(id, &[b.sge(0, 4096)])).unwrap();
        let mut w = ud(
            wr(id, SendOp::Send, &[a.sge(0, 100)]),
            cfg.qpns.1,
            cfg.qkey,
            p.b.addr,
        );
        if let Some(d) = w.ud.as_mut() {
            d.traffic_class = class;
        }
        p.a.qp.post_send(w).unwrap();
    }
    p.drive(STEPS);
    assert_eq!(drain(&mut p.b).len(), 3);
    let classes: Vec<u8> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(classes, [0, B_CLASS, 0x02]);
}
