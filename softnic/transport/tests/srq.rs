//! Shared receive queues: the pool and its checks, RC/UC/UD QPs taking WQEs from it,
//! RNR when it is empty, the one-shot limit event, and the flush rules (a QP's error
//! flushes only the WQE it owns; the SRQ's error hands back the pool).

mod common;

use core::net::SocketAddr;

use common::*;
use softnic_transport::memory::Access;
use softnic_transport::qp::{PostError, Qp, QpAttr, QpCaps, QpEvent, QpState, QpType, GRH_LEN};
use softnic_transport::srq::{Srq, SrqAttr, SrqCaps, SrqEvent, SrqModifyError, SrqQuery};
use softnic_transport::testing::{connect_qp, MemVec, Pair, PairConfig, Verdict};
use softnic_transport::time::Instant;
use softnic_transport::wr::{SendOp, WcOpcode, WcStatus};

const STEPS: u64 = 1_000_000;

fn caps(max_wr: u32) -> SrqCaps {
    SrqCaps { max_wr, max_sge: 2 }
}

/// A pair whose B side receives from an SRQ of `max_wr`, with 2 MiB + 64 KiB regions.
fn srq_pair(cfg: PairConfig, max_wr: u32, seed: u64) -> (Pair, Buf, Buf) {
    let mut p = Pair::connect_srq(cfg, seed, caps(max_wr));
    let len = (2 << 20) + (64 << 10);
    let a = region(&mut p.a, 0x1000_0000, len, Access::ALL);
    let b = region(&mut p.b, 0x7f00_0000_0000, len, Access::ALL);
    (p, a, b)
}

fn srq(p: &mut Pair) -> &mut Srq {
    p.b.srq.as_mut().expect("B has an SRQ")
}

#[test]
fn pool_checks_shape_capacity_and_modify() {
    let mut s = Srq::new(
        7,
        1,
        SrqCaps {
            max_wr: 2,
            max_sge: 1,
        },
    );
    assert_eq!(
        s.query(),
        SrqQuery {
            max_wr: 2,
            max_sge: 1,
            srq_limit: 0
        }
    );
    let b = Buf {
        key: 1,
        addr: 0,
        len: 64,
    };
    assert_eq!(
        s.post_recv(recv(1, &[b.sge(0, 8), b.sge(8, 8)])),
        Err(PostError::TooManySge)
    );
    s.post_recv(recv(1, &[b.sge(0, 8)])).unwrap();
    s.post_recv(recv(2, &[b.sge(0, 8)])).unwrap();
    assert_eq!(s.post_recv(recv(3, &[])), Err(PostError::QueueFull));
    // A limit above max_wr, or shrinking below what the pool holds, changes nothing.
    assert_eq!(
        s.modify(&SrqAttr {
            srq_limit: Some(3),
            ..Default::default()
        }),
        Err(SrqModifyError::Limit(3))
    );
    assert_eq!(
        s.modify(&SrqAttr {
            max_wr: Some(1),
            srq_limit: Some(1),
        }),
        Err(SrqModifyError::MaxWr(1))
    );
    assert_eq!(s.query().srq_limit, 0);
    // Growing, and arming in the same call.
    s.modify(&SrqAttr {
        max_wr: Some(4),
        srq_limit: Some(3),
    })
    .unwrap();
    assert_eq!(
        s.query(),
        SrqQuery {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 3
        }
    );
    s.post_recv(recv(3, &[])).unwrap();
    // Arming below the level raises nothing until a QP takes a WQE.
    assert_eq!(s.poll_event(), None);
    assert_eq!(s.len(), 3);
}

#[test]
fn a_qp_on_an_srq_refuses_its_own_posts() {
    let mut qp = Qp::new_with_srq(
        0x30,
        QpType::Rc,
        1,
        QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_sge: 1,
            max_inline: 0,
        },
        7,
    );
    assert_eq!(qp.srq(), Some(7));
    qp.modify(
        Instant::ZERO,
        &QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access: Some(Access::ALL),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qp.post_recv(recv(1, &[])), Err(PostError::UsesSrq));
    // Reset keeps the association.
    qp.modify(
        Instant::ZERO,
        &QpAttr {
            state: Some(QpState::Reset),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qp.srq(), Some(7));
}

#[test]
fn rc_sends_take_srq_wqes_in_order() {
    let (mut p, a, b) = srq_pair(rc(1024), 16, 1);
    for i in 0..4u64 {
        let off = i as usize * 8192;
        srq(&mut p)
            .post_recv(recv(100 + i, &[b.sge(off, 8192)]))
            .unwrap();
    }
    let sizes = [1usize, 1024, 3000, 8192];
    for (i, &n) in sizes.iter().enumerate() {
        fill(&mut p.a, &a, i * 8192, &pattern(i as u64, n));
        p.a.qp
            .post_send(wr(i as u64, SendOp::Send, &[a.sge(i * 8192, n)]))
            .unwrap();
    }
    p.drive(STEPS);
    assert_eq!(
        ids(&drain(&mut p.a)),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let rc = drain(&mut p.b);
    assert_eq!(
        rc.iter()
            .map(|c| (c.wr_id, c.byte_len as usize, c.opcode))
            .collect::<Vec<_>>(),
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (100 + i as u64, n, WcOpcode::Recv))
            .collect::<Vec<_>>()
    );
    for (i, &n) in sizes.iter().enumerate() {
        assert!(read(&p.b, &b, i * 8192, n) == pattern(i as u64, n));
    }
    let s = srq(&mut p);
    assert!(s.is_empty());
    assert_eq!((s.counters().posted, s.counters().consumed), (4, 4));
}

#[test]
fn rc_write_without_immediate_leaves_the_srq_alone() {
    let (mut p, a, b) = srq_pair(rc(256), 4, 2);
    srq(&mut p).post_recv(recv(1, &[b.sge(0, 64)])).unwrap();
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 1000)], &b, 4096))
        .unwrap();
    p.a.qp
        .post_send(rdma(2, SendOp::WriteWithImm(9), &[a.sge(0, 10)], &b, 4096))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(
        ids(&drain(&mut p.a)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rc = drain(&mut p.b);
    assert_eq!(
        rc.iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>(),
        vec![(1, Some(9))],
        "only the WRITE with immediate consumed a WQE"
    );
    assert_eq!(srq(&mut p).counters().consumed, 1);
}

#[test]
fn rc_rnr_when_the_srq_is_empty_then_recovery() {
    let (mut p, a, b) = srq_pair(rc(1024), 4, 3);
    fill(&mut p.a, &a, 0, &pattern(8, 3000));
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 3000)]))
        .unwrap();
    for _ in 0..1000 {
        p.step();
        if p.a.qp.counters().rnr_retries == 2 {
            break;
        }
    }
    assert_eq!(p.b.qp.counters().nak_rnr_sent, 2);
    assert_eq!(srq(&mut p).counters().empty, 2);
    assert!(drain(&mut p.a).is_empty());
    srq(&mut p).post_recv(recv(7, &[b.sge(0, 3000)])).unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), vec![(1, WcStatus::Success)]);
    let rc = drain(&mut p.b);
    assert_eq!((rc[0].wr_id, rc[0].byte_len), (7, 3000));
    assert_eq!(read(&p.b, &b, 0, 3000), pattern(8, 3000));
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

#[test]
fn the_limit_event_fires_once_when_the_pool_drops_below_it() {
    let (mut p, a, b) = srq_pair(rc(1024), 8, 4);
    for i in 0..5 {
        srq(&mut p).post_recv(recv(i, &[b.sge(0, 64)])).unwrap();
    }
    srq(&mut p)
        .modify(&SrqAttr {
            srq_limit: Some(3),
            ..Default::default()
        })
        .unwrap();
    let send = |p: &mut Pair, id: u64| {
        p.a.qp
            .post_send(wr(id, SendOp::Send, &[a.sge(0, 8)]))
            .unwrap();
        p.drive(STEPS);
    };
    send(&mut p, 1); // 4 left
    send(&mut p, 2); // 3 left: not below 3
    assert_eq!(srq(&mut p).poll_event(), None);
    assert_eq!(srq(&mut p).query().srq_limit, 3);
    send(&mut p, 3); // 2 left: below
    assert_eq!(srq(&mut p).poll_event(), Some(SrqEvent::LimitReached));
    assert_eq!(srq(&mut p).query().srq_limit, 0, "disarmed");
    send(&mut p, 4); // 1 left: no second event
    assert_eq!(srq(&mut p).poll_event(), None);
    // Re-armed, it fires again on the next WQE taken.
    srq(&mut p)
        .modify(&SrqAttr {
            srq_limit: Some(2),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(srq(&mut p).poll_event(), None);
    send(&mut p, 5);
    assert_eq!(srq(&mut p).poll_event(), Some(SrqEvent::LimitReached));
    assert_eq!(srq(&mut p).counters().limit_events, 2);
    assert_eq!(drain(&mut p.b).len(), 5);
}

#[test]
fn a_qp_error_flushes_only_the_wqe_it_owns() {
    let (mut p, a, b) = srq_pair(rc(256), 8, 5);
    for i in 0..3 {
        srq(&mut p)
            .post_recv(recv(10 + i, &[b.sge(0, 4096)]))
            .unwrap();
    }
    // Deliver only the first packet of a 3-packet SEND: the QP holds WQE 10.
    p.filter = Some(Box::new(|s| {
        if s.from == softnic_transport::testing::Side::A && s.repr.bth.psn.value() > 100 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 700)]))
        .unwrap();
    for _ in 0..20 {
        p.step();
    }
    assert_eq!(srq(&mut p).len(), 2);
    let now = p.now;
    p.b.qp
        .modify(
            now,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        )
        .unwrap();
    let rc = drain(&mut p.b);
    assert_eq!(ids(&rc), vec![(10, WcStatus::WrFlushErr)]);
    assert_eq!(srq(&mut p).len(), 2, "the pool keeps WQEs 11 and 12");
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::LastWqeReached));
    assert_eq!(p.b.qp.poll_event(), None, "raised once");
    // A QP without an SRQ has no such event.
    let now = p.now;
    p.a.qp
        .modify(
            now,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(p.a.qp.poll_event(), None);
}

/// The NIC's QP_FATAL comes after the move to Err that raised LAST_WQE_REACHED, yet
/// is taken first (why the QP entered Err, then what that meant for the SRQ), and no
/// event is given twice or lost whatever else is raised later.
#[test]
fn fatal_is_taken_before_last_wqe_and_each_event_once() {
    let (mut p, _, _) = srq_pair(rc(256), 4, 7);
    let now = p.now;
    let to_err = QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    p.b.qp.modify(now, &to_err).unwrap();
    p.b.qp.raise_fatal();
    assert!(p.b.qp.has_event());
    // A second error and a second move to Err add nothing.
    p.b.qp.raise_fatal();
    p.b.qp.modify(now, &to_err).unwrap();
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::Fatal));
    p.b.qp.raise_fatal();
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::LastWqeReached));
    assert_eq!(p.b.qp.poll_event(), None);
    assert!(!p.b.qp.has_event());
}

#[test]
fn a_refused_request_gives_the_borrowed_wqe_back() {
    let (mut p, a, b) = srq_pair(rc(1024), 8, 6);
    for i in 0..2 {
        srq(&mut p).post_recv(recv(i, &[b.sge(0, 64)])).unwrap();
    }
    // A READ of an R_Key that does not exist: Remote Access NAK, responder to Err. The
    // READ needs no receive WQE, so the one lent for the packet goes back unflushed.
    p.a.qp
        .post_send(rdma(1, SendOp::Read, &[a.sge(0, 16)], &bad_key(), 0))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert!(drain(&mut p.b).is_empty(), "no WQE of the pool was flushed");
    // Why it entered Err (IBTA 11.6.3.2), then the SRQ's last-WQE event, each once.
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::AccessErr));
    assert_eq!(p.b.qp.poll_event(), Some(QpEvent::LastWqeReached));
    assert_eq!(p.b.qp.poll_event(), None);
    let s = srq(&mut p);
    assert_eq!((s.len(), s.counters().consumed), (2, 0));
}

#[test]
fn a_write_with_immediate_that_fails_flushes_the_wqe_it_took() {
    let (mut p, a, b) = srq_pair(rc(1024), 8, 6);
    for i in 0..2 {
        srq(&mut p).post_recv(recv(i, &[b.sge(0, 64)])).unwrap();
    }
    // Resources are checked before the R_Key (IBTA 9.7.4.2.4 before 9.7.4.2.6): the
    // WRITE with immediate took WQE 0, which is now the QP's and is flushed with it;
    // WQE 1 stays in the pool.
    p.a.qp
        .post_send(rdma(
            1,
            SendOp::WriteWithImm(3),
            &[a.sge(0, 16)],
            &bad_key(),
            0,
        ))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), vec![(1, WcStatus::RemAccessErr)]);
    let rc = drain(&mut p.b);
    assert_eq!(ids(&rc), vec![(0, WcStatus::WrFlushErr)]);
    assert_eq!(srq(&mut p).len(), 1);
}

fn bad_key() -> Buf {
    Buf {
        key: 0xdead,
        addr: 0,
        len: 0,
    }
}

#[test]
fn uc_abandoned_message_returns_its_wqe_to_the_pool() {
    let (mut p, a, b) = srq_pair(uc(256), 8, 7);
    p.filter = Some(Box::new(|s| {
        if s.repr.bth.psn.value() == 101 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    srq(&mut p).post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
    srq(&mut p).post_recv(recv(2, &[b.sge(0, 4096)])).unwrap();
    fill(&mut p.a, &a, 4096, &pattern(2, 100));
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 3 * 256)]))
        .unwrap();
    p.a.qp
        .post_send(wr(2, SendOp::Send, &[a.sge(4096, 100)]))
        .unwrap();
    p.drive(STEPS);
    let rc = drain(&mut p.b);
    assert_eq!(
        rc.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        vec![(1, 100)],
        "the torn message is dropped and WQE 1 serves the next one"
    );
    assert_eq!(read(&p.b, &b, 0, 100), pattern(2, 100));
    assert_eq!(srq(&mut p).len(), 1);
    assert_eq!(p.b.qp.counters().drop_uc_message, 1);
}

#[test]
fn ud_on_an_srq_drops_silently_when_empty() {
    let (mut p, a, b) = srq_pair(ud_cfg(1024), 4, 8);
    let dest = p.b.addr;
    let qpn_b = p.b.qp.qpn();
    fill(&mut p.a, &a, 0, &pattern(3, 500));
    let send = |p: &mut Pair, id: u64| {
        p.a.qp
            .post_send(ud(
                wr(id, SendOp::Send, &[a.sge(0, 500)]),
                qpn_b,
                0x1111,
                dest,
            ))
            .unwrap();
        p.drive(STEPS);
    };
    send(&mut p, 1);
    assert_eq!(p.b.qp.counters().drop_no_recv_wqe, 1);
    assert_eq!(srq(&mut p).counters().empty, 1);
    assert_eq!(p.b.qp.counters().nak_rnr_sent, 0, "UD never NAKs");
    srq(&mut p)
        .post_recv(recv(5, &[b.sge(0, 40 + 500)]))
        .unwrap();
    send(&mut p, 2);
    let rc = drain(&mut p.b);
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].byte_len, rc[0].src_qp),
        (5, GRH_LEN + 500, p.a.qp.qpn())
    );
    assert_eq!(read(&p.b, &b, 40, 500), pattern(3, 500));
}

#[test]
fn an_srq_in_error_hands_back_its_pool_and_refuses_posts() {
    let mut s = Srq::new(1, 1, caps(4));
    for i in 0..3 {
        s.post_recv(recv(i, &[])).unwrap();
    }
    let back: Vec<u64> = s.enter_error().iter().map(|w| w.wr_id).collect();
    assert_eq!(back, vec![0, 1, 2]);
    assert_eq!(s.poll_event(), Some(SrqEvent::Error));
    assert_eq!(s.post_recv(recv(9, &[])), Err(PostError::SrqInError));
    assert_eq!(
        s.modify(&SrqAttr {
            srq_limit: Some(1),
            ..Default::default()
        }),
        Err(SrqModifyError::InError)
    );
    assert!(s.is_empty());
}

#[test]
fn handle_packet_srq_with_the_wrong_srq_drops() {
    let (mut p, a, b) = srq_pair(rc(1024), 4, 9);
    // Swap B's SRQ for another one: packets are dropped, counted, the pool untouched.
    let mut other = Srq::new(99, 1, caps(4));
    other.post_recv(recv(1, &[b.sge(0, 64)])).unwrap();
    let real = p.b.srq.replace(other).expect("srq");
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, 8)]))
        .unwrap();
    p.drive(STEPS);
    assert_eq!(ids(&drain(&mut p.a)), vec![(1, WcStatus::RetryExcErr)]);
    assert!(p.b.qp.counters().drop_bad_state > 0);
    assert_eq!(srq(&mut p).len(), 1);
    drop(real);
}

fn uc(mtu: u32) -> PairConfig {
    PairConfig {
        qp_type: QpType::Uc,
        mtu,
        ..PairConfig::default()
    }
}

fn ud_cfg(mtu: u32) -> PairConfig {
    PairConfig {
        qp_type: QpType::Ud,
        mtu,
        ..PairConfig::default()
    }
}

/// N requester QPs on node A, each connected (RC or UC) or sending (UD) to its own
/// QP on node B; every B QP takes WQEs from one SRQ. Lossless, in-order delivery by
/// destination QPN.
struct Hub {
    a: Vec<Qp>,
    b: Vec<Qp>,
    srq: Srq,
    mem_a: MemVec,
    mem_b: MemVec,
    addr_a: SocketAddr,
    addr_b: SocketAddr,
}

const A_QPN0: u32 = 0x100;
const B_QPN0: u32 = 0x400;

impl Hub {
    fn new(n: u32, qp_type: QpType, srq_wr: u32) -> Hub {
        let cfg = PairConfig {
            qp_type,
            ..PairConfig::default()
        };
        let addr_a: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let addr_b: SocketAddr = "127.0.0.2:4791".parse().unwrap();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for i in 0..n {
            let mut qa = Qp::new(A_QPN0 + i, qp_type, 1, cfg.caps);
            let mut qb = Qp::new_with_srq(B_QPN0 + i, qp_type, 1, cfg.caps, 3);
            connect_qp(&mut qa, &cfg, B_QPN0 + i, addr_b, 1000 + i, 7 * i);
            connect_qp(&mut qb, &cfg, A_QPN0 + i, addr_a, 7 * i, 1000 + i);
            qb.set_local_addr(addr_b);
            a.push(qa);
            b.push(qb);
        }
        Hub {
            a,
            b,
            srq: Srq::new(3, 1, caps(srq_wr)),
            mem_a: MemVec::default(),
            mem_b: MemVec::default(),
            addr_a,
            addr_b,
        }
    }

    /// Moves packets until nothing is left to send (bounded).
    fn run(&mut self) {
        let mut buf = vec![0u8; 4096 + 128];
        for _ in 0..100_000 {
            let mut moved = false;
            for i in 0..self.a.len() {
                while let Some(t) = self.a[i].poll_transmit(Instant::ZERO, &mut buf, &self.mem_a) {
                    moved = true;
                    let pkt = wire::PacketRepr::parse(&buf[..t.len]).expect("parse");
                    let j = (pkt.repr.bth.dest_qpn.value() - B_QPN0) as usize;
                    self.b[j].handle_packet_srq(
                        Instant::ZERO,
                        self.addr_a,
                        &pkt,
                        &mut self.mem_b,
                        &mut self.srq,
                    );
                }
            }
            for j in 0..self.b.len() {
                while let Some(t) = self.b[j].poll_transmit(Instant::ZERO, &mut buf, &self.mem_b) {
                    moved = true;
                    let pkt = wire::PacketRepr::parse(&buf[..t.len]).expect("parse");
                    let i = (pkt.repr.bth.dest_qpn.value() - A_QPN0) as usize;
                    self.a[i].handle_packet(Instant::ZERO, self.addr_b, &pkt, &mut self.mem_a);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("hub did not go idle");
    }
}

fn many_qps_share_one_srq(qp_type: QpType, n: u32) {
    let mut h = Hub::new(n, qp_type, 4 * n);
    let ka = h.mem_a.register(1, 0x1000, 64 * 1024, Access::ALL);
    let kb = h
        .mem_b
        .register(1, 0x9000_0000, (4 * n as usize) * 2048, Access::ALL);
    let bufb = Buf {
        key: kb,
        addr: 0x9000_0000,
        len: 0,
    };
    let bufa = Buf {
        key: ka,
        addr: 0x1000,
        len: 0,
    };
    for w in 0..(2 * n as u64) {
        h.srq
            .post_recv(recv(w, &[bufb.sge(w as usize * 2048, 2048)]))
            .unwrap();
    }
    // Each A QP sends two messages whose first byte names it.
    for i in 0..n as usize {
        h.mem_a.bytes_mut(ka)[i * 16] = i as u8;
        for m in 0..2u64 {
            let mut w = wr(m, SendOp::SendWithImm(i as u32), &[bufa.sge(i * 16, 100)]);
            if qp_type == QpType::Ud {
                w = ud(w, B_QPN0 + i as u32, 0x1111, h.addr_b);
            }
            h.a[i].post_send(w).unwrap();
        }
    }
    h.run();
    let off = if qp_type == QpType::Ud { 40 } else { 0 };
    let mut seen_wqe = vec![false; 2 * n as usize];
    let mut per_qp = vec![0u32; n as usize];
    for (j, qb) in h.b.iter_mut().enumerate() {
        while let Some(c) = qb.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            assert_eq!(c.imm, Some(j as u32), "the message came to the right QP");
            assert!(!seen_wqe[c.wr_id as usize], "WQE {} used twice", c.wr_id);
            seen_wqe[c.wr_id as usize] = true;
            let first = h.mem_b.bytes(kb)[c.wr_id as usize * 2048 + off];
            assert_eq!(first, j as u8, "WQE {} holds QP {j}'s data", c.wr_id);
            per_qp[j] += 1;
        }
    }
    assert!(
        seen_wqe.iter().all(|&s| s),
        "every pooled WQE was used once"
    );
    assert!(per_qp.iter().all(|&k| k == 2), "{per_qp:?}");
    for qa in &mut h.a {
        let cs: Vec<_> = std::iter::from_fn(|| qa.poll_completion()).collect();
        assert_eq!(
            ids(&cs),
            vec![(0, WcStatus::Success), (1, WcStatus::Success)]
        );
    }
    assert!(h.srq.is_empty());
    assert_eq!(h.srq.counters().consumed, 2 * u64::from(n));
}

#[test]
fn sixty_four_rc_qps_share_one_srq() {
    many_qps_share_one_srq(QpType::Rc, 64);
}

#[test]
fn many_ud_qps_share_one_srq() {
    many_qps_share_one_srq(QpType::Ud, 16);
}

#[test]
fn many_uc_qps_share_one_srq() {
    many_qps_share_one_srq(QpType::Uc, 16);
}
