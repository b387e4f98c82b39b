//! Two CMs wired back to back in virtual time: the whole ladder, rejects, loss and
//! retries, and forged messages.

use std::net::SocketAddr;

use wire::cm::{CmMadRepr, CmMessage, RejReason};

use super::*;
use crate::time::Duration;

const SID: u64 = 0x0000_0000_0106_1c06;

fn cfg(addr: &str) -> CmConfig {
    CmConfig {
        local: addr.parse().unwrap(),
        ca_guid: 0x0200_7f00_0002_12b7,
        cm_response_timeout: 14, // 67 ms
        max_cm_retries: 3,
        path_mtu: 3,
        timewait: Duration::from_millis(100),
    }
}

struct Pair {
    a: Cm,
    b: Cm,
    now: Instant,
    /// Every MAD that crossed, in order, with its direction (true = a → b).
    log: Vec<(bool, CmMadRepr)>,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            a: Cm::new(cfg("127.0.0.2:5000"), 1),
            b: Cm::new(cfg("127.0.0.3:5001"), 2),
            now: Instant::ZERO,
            log: Vec::new(),
        }
    }

    /// Delivers queued MADs both ways until none are left; `drop(a_to_b, mad)` says
    /// which ones the network loses.
    fn pump_lossy(&mut self, mut drop: impl FnMut(bool, &CmMadRepr) -> bool) {
        for _ in 0..100 {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                assert_eq!(t.dest, self.b.cfg.local);
                moved = true;
                self.log.push((true, t.mad));
                if !drop(true, &t.mad) {
                    self.b.handle_mad(self.now, self.a.cfg.local, &t.mad);
                }
            }
            while let Some(t) = self.b.poll_transmit() {
                assert_eq!(t.dest, self.a.cfg.local);
                moved = true;
                self.log.push((false, t.mad));
                if !drop(false, &t.mad) {
                    self.a.handle_mad(self.now, self.b.cfg.local, &t.mad);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the CMs keep talking");
    }

    fn pump(&mut self) {
        self.pump_lossy(|_, _| false)
    }

    /// Jumps to the earliest deadline of either side and handles it.
    fn tick(&mut self) {
        let t = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("a deadline");
        self.now = t;
        self.a.handle_timeout(t);
        self.b.handle_timeout(t);
    }

    fn names(&self) -> Vec<(bool, &'static str)> {
        self.log.iter().map(|(d, m)| (*d, m.msg.name())).collect()
    }
}

fn params(qpn: u32, psn: u32) -> ConnParams {
    ConnParams {
        qpn,
        psn,
        responder_resources: 4,
        initiator_depth: 2,
        retry_count: 7,
        rnr_retry_count: 6,
        private_data: b"hello".to_vec(),
        ..ConnParams::default()
    }
}

fn route(p: &Pair) -> Route {
    Route {
        dest: p.b.cfg.local,
        local_gid: [1; 16],
        remote_gid: [2; 16],
        // The id's TOS: the REQ carries it to the passive side.
        traffic_class: 0x48,
    }
}

fn events(cm: &mut Cm) -> Vec<Event> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

fn actions(cm: &mut Cm) -> Vec<QpAction> {
    std::iter::from_fn(|| cm.poll_qp_action()).collect()
}

/// Listens on b, connects from a; returns (a's id, b's listener, b's new id).
fn request(p: &mut Pair) -> (IdHandle, IdHandle, IdHandle) {
    let l = p.b.create_id();
    p.b.listen(l, SID, None, 4).unwrap();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(p), SID, params(0x11, 0x1000))
        .unwrap();
    p.pump();
    let ev = events(&mut p.b);
    let [Event::ConnectRequest { listener, id, peer }] = &ev[..] else {
        panic!("{ev:?}");
    };
    assert_eq!(*listener, l);
    assert_eq!((peer.qpn, peer.psn, peer.service_id), (0x11, 0x1000, SID));
    assert_eq!(&peer.private_data[..5], b"hello");
    assert_eq!(p.b.state(*id), Some(CmState::ReqRcvd));
    (a, l, *id)
}

#[test]
fn connect_accept_rtu_then_disconnect_drep_timewait() {
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    p.b.accept(p.now, b, params(0x22, 0x2000)).unwrap();
    // The passive QP goes to RTR and RTS before the REP leaves. Each starting PSN is
    // the one its sender expects to receive (Linux ib_cm, hence rxe): the passive QP
    // sends from the REQ's 0x1000 and expects the REP's 0x2000 — the other way round,
    // softnic's QPs sent PSNs rxe took as duplicates and no RC packet got through.
    let acts = actions(&mut p.b);
    assert_eq!(
        acts,
        [
            QpAction {
                id: b,
                qpn: 0x22,
                step: QpStep::Rtr {
                    dest_qpn: 0x11,
                    rq_psn: 0x2000,
                    path_mtu: 3,
                    dest: p.a.cfg.local,
                    traffic_class: 0x48,
                    max_dest_rd_atomic: 4,
                    min_rnr_timer: 12
                }
            },
            QpAction {
                id: b,
                qpn: 0x22,
                step: QpStep::Rts {
                    sq_psn: 0x1000,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 6,
                    max_rd_atomic: 2
                }
            }
        ]
    );
    p.pump();
    let acts = actions(&mut p.a);
    assert_eq!(acts.len(), 2);
    assert!(matches!(
        acts[0].step,
        QpStep::Rtr {
            dest_qpn: 0x22,
            rq_psn: 0x1000,
            traffic_class: 0x48,
            ..
        }
    ));
    assert!(matches!(
        acts[1].step,
        QpStep::Rts {
            sq_psn: 0x2000,
            max_rd_atomic: 2,
            rnr_retry: 6,
            ..
        }
    ));
    let ev = events(&mut p.a);
    assert!(matches!(&ev[..], [Event::Established { id, peer }] if *id == a && peer.qpn == 0x22));
    // The passive side's ESTABLISHED carries nothing, as Linux's CM reports the RTU.
    assert!(matches!(&events(&mut p.b)[..],
        [Event::Established { id, peer }] if *id == b && *peer == PeerParams::default()));
    assert_eq!(
        p.names(),
        [
            (true, "ConnectRequest"),
            (false, "ConnectReply"),
            (true, "ReadyToUse")
        ]
    );
    // Every message of one connection carries the REQ's transaction ID.
    assert!(p
        .log
        .iter()
        .all(|(_, m)| m.header.transaction_id == p.log[0].1.header.transaction_id));

    p.a.disconnect(p.now, a, &[]).unwrap();
    assert_eq!(actions(&mut p.a)[0].step, QpStep::Err);
    p.pump();
    assert_eq!(actions(&mut p.b)[0].step, QpStep::Err);
    assert!(matches!(&events(&mut p.a)[..], [Event::Disconnected { id }] if *id == a));
    assert!(matches!(&events(&mut p.b)[..], [Event::Disconnected { id }] if *id == b));
    assert_eq!(p.a.state(a), Some(CmState::TimeWait));
    // The other end asks too, after the DREQ reached it (perftest -R disconnects both
    // ends): nothing more to send, and no error, as on Linux; asking twice likewise.
    let sent = p.log.len();
    assert_eq!(p.b.disconnect(p.now, b, &[]), Ok(()));
    assert_eq!(p.a.disconnect(p.now, a, &[]), Ok(()));
    p.pump();
    assert_eq!(
        p.log.len(),
        sent,
        "no DREQ or DREP after the first exchange"
    );
    assert!(actions(&mut p.a).is_empty() && actions(&mut p.b).is_empty());
    p.tick();
    assert_eq!(p.a.state(a), Some(CmState::Closed));
    assert_eq!(
        p.a.disconnect(p.now, a, &[]),
        Ok(()),
        "closed: nothing to do"
    );
    assert!(matches!(
        &events(&mut p.a)[..],
        [Event::TimewaitExit { .. }]
    ));
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.b.poll_timeout(), None);
    assert_eq!(p.a.counters().tx_retries + p.b.counters().tx_retries, 0);
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut p = Pair::new();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, params(0x11, 1))
        .unwrap();
    p.pump();
    let ev = events(&mut p.a);
    assert!(
        matches!(&ev[..], [Event::Rejected { id, reason: 8, .. }] if *id == a),
        "{ev:?}"
    );
    assert_eq!(p.b.counters().rej_no_listener, 1);
    assert_eq!(p.a.state(a), Some(CmState::Closed));
    assert_eq!(p.a.poll_timeout(), None, "no retry after a REJ");
    assert!(actions(&mut p.a).is_empty());
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut p = Pair::new();
    let (a, l, b) = request(&mut p);
    p.b.reject(b, b"go away").unwrap();
    p.pump();
    let ev = events(&mut p.a);
    let [Event::Rejected {
        id,
        reason,
        private_data,
    }] = &ev[..]
    else {
        panic!("{ev:?}");
    };
    assert_eq!((*id, *reason), (a, RejReason::CONSUMER_DEFINED.0));
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(private_data.len(), 148);
    // The listener's backlog slot is free again: the same service takes a new REQ.
    let a2 = p.a.create_id();
    p.a.connect(p.now, a2, route(&p), SID, params(0x12, 1))
        .unwrap();
    p.pump();
    assert!(
        matches!(&events(&mut p.b)[..], [Event::ConnectRequest { listener, .. }] if *listener == l)
    );
}

#[test]
fn lost_req_is_retried_and_a_dead_peer_is_unreachable() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, SID, None, 4).unwrap();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, params(0x11, 1))
        .unwrap();
    let mut first = true;
    p.pump_lossy(|_, _| std::mem::take(&mut first)); // the first REQ is lost
    assert!(events(&mut p.b).is_empty());
    let t0 = p.now;
    p.tick();
    assert_eq!(p.now - t0, super::timer::timeout(14));
    p.pump();
    assert!(matches!(
        &events(&mut p.b)[..],
        [Event::ConnectRequest { .. }]
    ));
    assert_eq!(p.a.counters().tx_retries, 1);
    assert_eq!(p.log[0].1, p.log[1].1, "the retry is the same REQ");

    // Now a peer that never answers: 1 + max_cm_retries REQs, then REJ(timeout).
    let mut p = Pair::new();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, params(0x11, 1))
        .unwrap();
    for _ in 0..4 {
        p.pump_lossy(|_, _| true);
        p.tick();
    }
    p.pump_lossy(|_, _| true);
    let names = p.names();
    assert_eq!(names.iter().filter(|n| n.1 == "ConnectRequest").count(), 4);
    assert_eq!(names.last(), Some(&(true, "ConnectReject")));
    assert!(matches!(&events(&mut p.a)[..], [Event::Unreachable { id }] if *id == a));
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.a.poll_timeout(), None);
    let _ = a;
}

#[test]
fn lost_rtu_makes_the_rep_resend_and_the_rtu_answer_again() {
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    p.b.accept(p.now, b, params(0x22, 2)).unwrap();
    p.pump_lossy(|a_to_b, m| a_to_b && matches!(m.msg, CmMessage::Rtu(_)));
    assert!(matches!(&events(&mut p.a)[..], [Event::Established { .. }]));
    assert_eq!(p.b.state(b), Some(CmState::RepSent));
    p.tick(); // b resends the REP
    p.pump();
    assert!(matches!(&events(&mut p.b)[..], [Event::Established { .. }]));
    assert_eq!(p.a.counters().rx_duplicates, 1);
    assert_eq!(actions(&mut p.a).len(), 2, "a duplicate REP moves no QP");
    let _ = a;
}

#[test]
fn forged_replies_do_not_touch_a_connection() {
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    // A REP naming a's connection, from a third host.
    let req = match p.log[0].1.msg {
        CmMessage::Req(r) => r,
        _ => unreachable!(),
    };
    let mut forged = wire::cm::RepRepr {
        local_comm_id: 0xdead_beef,
        remote_comm_id: req.local_comm_id,
        local_qkey: 0,
        local_qpn: 0x666,
        local_eecn: 0,
        starting_psn: 0,
        vendor_id: 0,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0,
        private_data: [0; 196],
    };
    let evil: SocketAddr = "127.0.0.66:5001".parse().unwrap();
    let mad = CmMadRepr::new(1, CmMessage::Rep(forged));
    p.a.handle_mad(p.now, evil, &mad);
    assert_eq!(p.a.counters().rx_drop_wrong_peer, 1);
    // From the right host but naming a connection a does not have.
    forged.remote_comm_id ^= 1;
    p.a.handle_mad(
        p.now,
        p.b.cfg.local,
        &CmMadRepr::new(1, CmMessage::Rep(forged)),
    );
    assert_eq!(p.a.counters().rx_drop_unknown_comm_id, 1);
    assert!(actions(&mut p.a).is_empty());
    assert!(events(&mut p.a).is_empty());
    assert_eq!(p.a.state(a), Some(CmState::ReqSent));

    // The real connection still completes; then a forged RTU/DREQ with the wrong peer
    // comm ID is dropped.
    p.b.accept(p.now, b, params(0x22, 2)).unwrap();
    p.pump();
    assert_eq!(p.a.state(a), Some(CmState::Established));
    let ours = p.log.iter().find_map(|(_, m)| match m.msg {
        CmMessage::Rep(r) => Some(r),
        _ => None,
    });
    let rep = ours.unwrap();
    let dreq = wire::cm::DreqRepr {
        local_comm_id: rep.local_comm_id ^ 0x10,
        remote_comm_id: rep.remote_comm_id,
        remote_qpn: 0x11,
        private_data: [0; 220],
    };
    p.a.handle_mad(
        p.now,
        p.b.cfg.local,
        &CmMadRepr::new(1, CmMessage::Dreq(dreq)),
    );
    assert_eq!(p.a.counters().rx_drop_wrong_remote_comm_id, 1);
    // The right comm IDs but another QP.
    let dreq = wire::cm::DreqRepr {
        local_comm_id: rep.local_comm_id,
        remote_qpn: 0x99,
        ..dreq
    };
    p.a.handle_mad(
        p.now,
        p.b.cfg.local,
        &CmMadRepr::new(1, CmMessage::Dreq(dreq)),
    );
    assert_eq!(p.a.counters().rx_drop_unexpected, 1);
    assert_eq!(p.a.state(a), Some(CmState::Established));
    let acts = actions(&mut p.a);
    assert!(acts.iter().all(|x| x.step != QpStep::Err), "{acts:?}");
}

#[test]
fn a_qp_binds_to_one_connection_and_private_data_is_bounded() {
    let mut p = Pair::new();
    let (_, _, b) = request(&mut p);
    let a2 = p.a.create_id();
    assert_eq!(
        p.a.connect(p.now, a2, route(&p), SID, params(0x11, 1)),
        Err(CmError::QpInUse)
    );
    let mut big = params(0x13, 1);
    big.private_data = vec![0; 93];
    assert_eq!(
        p.a.connect(p.now, a2, route(&p), SID, big),
        Err(CmError::PrivateDataTooLong)
    );
    assert_eq!(p.b.reject(b, &[0; 149]), Err(CmError::PrivateDataTooLong));
    let l2 = p.b.create_id();
    assert_eq!(p.b.listen(l2, SID, None, 1), Err(CmError::AddressInUse));
    assert_eq!(
        p.b.disconnect(p.now, b, &[]),
        Err(CmError::InvalidState(CmState::ReqRcvd))
    );
}

#[test]
fn a_full_backlog_leaves_reqs_unanswered() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, SID, None, 1).unwrap();
    for qpn in [0x11, 0x12] {
        let a = p.a.create_id();
        p.a.connect(p.now, a, route(&p), SID, params(qpn, 1))
            .unwrap();
    }
    p.pump();
    assert_eq!(events(&mut p.b).len(), 1);
    assert_eq!(p.b.counters().rx_drop_backlog, 1);
    assert_eq!(p.names().len(), 2, "no REJ for the second REQ");
}

#[test]
fn destroying_an_id_answers_for_it() {
    // An unanswered connection request is rejected (consumer reject) ...
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    p.b.destroy_id(p.now, b);
    p.pump();
    let ev = events(&mut p.a);
    assert!(
        matches!(&ev[..], [Event::Rejected { id, reason: 28, .. }] if *id == a),
        "{ev:?} {:?}",
        p.names()
    );
    assert_eq!(p.b.state(b), None);
    // ... and an established one disconnects: the peer sees DISCONNECTED.
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    p.b.accept(p.now, b, params(0x22, 2)).unwrap();
    p.pump();
    let _ = (events(&mut p.a), events(&mut p.b));
    p.a.destroy_id(p.now, a);
    p.pump();
    assert!(matches!(&events(&mut p.b)[..], [Event::Disconnected { id }] if *id == b));
    assert!(
        events(&mut p.a).is_empty(),
        "a destroyed id has nobody to tell"
    );
    assert_eq!(
        p.a.counters().rx_drop_unknown_comm_id,
        1,
        "the DREP finds no id"
    );
}

const UD_SID: u64 = 0x0000_0000_0111_1c06;

#[test]
fn sidr_resolves_a_ud_service_or_says_why_not() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, UD_SID, None, 4).unwrap();
    let a = p.a.create_id();
    p.a.sidr_request(p.now, a, route(&p), UD_SID, b"ud please")
        .unwrap();
    p.pump();
    let ev = events(&mut p.b);
    let [Event::ConnectRequest { listener, id, peer }] = &ev[..] else {
        panic!("{ev:?}");
    };
    assert_eq!((*listener, peer.service_id), (l, UD_SID));
    assert_eq!(&peer.private_data[..9], b"ud please");
    p.b.sidr_reply(*id, Some((0x33, 0x0123_4567)), b"here")
        .unwrap();
    p.pump();
    let ev = events(&mut p.a);
    let [Event::UdResolved {
        id,
        qpn,
        qkey,
        dest,
        private_data,
    }] = &ev[..]
    else {
        panic!("{ev:?}");
    };
    assert_eq!(
        (*id, *qpn, *qkey, *dest),
        (a, 0x33, 0x0123_4567, p.b.cfg.local)
    );
    assert_eq!(&private_data[..4], b"here");
    assert!(
        actions(&mut p.a).is_empty() && actions(&mut p.b).is_empty(),
        "UD QPs are not moved"
    );
    assert_eq!(
        p.names(),
        [(true, "ServiceIDResReq"), (false, "ServiceIDResReqResp")]
    );

    // Refused by the consumer: status 2 (reject); nobody listening: status 1.
    let a2 = p.a.create_id();
    p.a.sidr_request(p.now, a2, route(&p), UD_SID, &[]).unwrap();
    p.pump();
    let Some(Event::ConnectRequest { id, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.sidr_reply(id, None, &[]).unwrap();
    p.pump();
    assert!(matches!(&events(&mut p.a)[..], [Event::Rejected { id, reason: 2, .. }] if *id == a2));
    let a3 = p.a.create_id();
    p.a.sidr_request(p.now, a3, route(&p), UD_SID + 1, &[])
        .unwrap();
    p.pump();
    assert!(matches!(&events(&mut p.a)[..], [Event::Rejected { id, reason: 1, .. }] if *id == a3));

    // No answer at all: retried, then unreachable.
    let a4 = p.a.create_id();
    p.a.sidr_request(p.now, a4, route(&p), UD_SID, &[]).unwrap();
    for _ in 0..4 {
        p.pump_lossy(|_, _| true);
        p.tick();
    }
    assert!(matches!(&events(&mut p.a)[..], [Event::Unreachable { id }] if *id == a4));
}

/// `qp_steps` (`rdma_init_qp_attr` for a program's own QP) answers exactly the
/// transitions the CM applies to a bound QP, on both sides, and only once the peer's
/// REQ (passive) or REP (active) is in; before the accept, for the PSN the REP will
/// carry and the REQ's resources turned around (as Linux's CM assumes).
#[test]
fn qp_steps_are_the_transitions_the_cm_applies() {
    let mut p = Pair::new();
    let (a, _, b) = request(&mut p);
    assert_eq!(p.a.qp_steps(a, 0), None, "no REP yet");
    let Some(
        [QpStep::Rtr {
            rq_psn,
            dest_qpn,
            max_dest_rd_atomic,
            ..
        }, QpStep::Rts {
            sq_psn,
            max_rd_atomic,
            ..
        }],
    ) = p.b.qp_steps(b, 0x2000)
    else {
        panic!("a REQ is in: the passive side answers");
    };
    // The REQ offered responder resources 4, initiator depth 2.
    assert_eq!((rq_psn, dest_qpn, sq_psn), (0x2000, 0x11, 0x1000));
    assert_eq!((max_dest_rd_atomic, max_rd_atomic), (2, 4));
    p.b.accept(p.now, b, params(0x22, 0x2000)).unwrap();
    let applied_b: Vec<QpStep> = actions(&mut p.b).into_iter().map(|x| x.step).collect();
    assert_eq!(p.b.qp_steps(b, 0x9999).map(Vec::from), Some(applied_b));
    p.pump();
    let applied_a: Vec<QpStep> = actions(&mut p.a).into_iter().map(|x| x.step).collect();
    let steps_a = p.a.qp_steps(a, 0).expect("a REP is in");
    assert_eq!(Vec::from(steps_a), applied_a);
    // The starting-PSN rule across the two sides: each sends what the other expects.
    let [QpStep::Rtr { rq_psn: a_rq, .. }, QpStep::Rts { sq_psn: a_sq, .. }] = steps_a else {
        panic!("{steps_a:?}");
    };
    assert_eq!((a_rq, a_sq), (0x1000, 0x2000));
}

/// Found by the hostile-input driver (`fuzzing.rs`): destroying a SIDR request the
/// consumer had not answered left its listener's backlog slot taken for good, so after
/// `backlog` such requests the service dropped every SIDR REQ (and the requester heard
/// nothing until it gave up). Destroying it answers "reject" and frees the slot, as
/// Linux's `cm_destroy_id` does (`cm_reject_sidr_req(IB_SIDR_REJECT)`).
#[test]
fn destroying_an_unanswered_sidr_request_frees_its_backlog_slot() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, UD_SID, None, 1).unwrap();
    let a = p.a.create_id();
    p.a.sidr_request(p.now, a, route(&p), UD_SID, &[]).unwrap();
    p.pump();
    let Some(Event::ConnectRequest { id, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.destroy_id(p.now, id);
    p.pump();
    assert!(
        matches!(&events(&mut p.a)[..], [Event::Rejected { id, reason: 2, .. }] if *id == a),
        "the requester is told at once"
    );
    let a2 = p.a.create_id();
    p.a.sidr_request(p.now, a2, route(&p), UD_SID, &[]).unwrap();
    p.pump();
    assert_eq!(p.b.counters().rx_drop_backlog, 0);
    assert!(matches!(
        &events(&mut p.b)[..],
        [Event::ConnectRequest { listener, .. }] if *listener == l
    ));
}

/// Found by the hostile-input driver: `qp_failed` on a connection request not yet
/// accepted rejected it but kept its listener's backlog slot, so the listener took one
/// REQ fewer for good. (The NIC calls `qp_failed` only after an accept has queued QP
/// transitions, so this needs a caller outside the contract; the slot is freed anyway.)
#[test]
fn a_failed_request_frees_its_backlog_slot() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, SID, None, 1).unwrap();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, params(0x11, 1))
        .unwrap();
    p.pump();
    let Some(Event::ConnectRequest { id, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.qp_failed(p.now, id);
    assert!(matches!(
        &events(&mut p.b)[..],
        [Event::ConnectError { .. }]
    ));
    p.pump();
    let a2 = p.a.create_id();
    p.a.connect(p.now, a2, route(&p), SID, params(0x12, 1))
        .unwrap();
    p.pump();
    assert_eq!(p.b.counters().rx_drop_backlog, 0);
    assert!(matches!(
        &events(&mut p.b)[..],
        [Event::ConnectRequest { listener, .. }] if *listener == l
    ));
}

fn xrc(p: ConnParams) -> ConnParams {
    ConnParams {
        transport: CmTransport::Xrc,
        ..p
    }
}

/// The REQ and REP of the connection in `p`'s log.
fn req_rep(p: &Pair) -> (wire::cm::ReqRepr, wire::cm::RepRepr) {
    let req = p.log.iter().find_map(|(_, m)| match m.msg {
        CmMessage::Req(r) => Some(r),
        _ => None,
    });
    let rep = p.log.iter().find_map(|(_, m)| match m.msg {
        CmMessage::Rep(r) => Some(r),
        _ => None,
    });
    (req.expect("a REQ"), rep.expect("a REP"))
}

/// An XRC initiator connects to an XRC target as Linux's CM does it: the REQ names
/// transport 3, extended transport 1 and leaves the target's receive-side fields
/// zero; the REP carries the target's QP number in the Local EE Context Number field
/// (its Local QPN zero) with the SRQ bit set, and the initiator's RTR takes that number.
#[test]
fn xrc_connects_with_the_target_qp_in_the_eecn_field() {
    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, SID, Some(CmTransport::Xrc), 4).unwrap();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, xrc(params(0x11, 0x1000)))
        .unwrap();
    p.pump();
    let ev = events(&mut p.b);
    let [Event::ConnectRequest { id: b, peer, .. }] = &ev[..] else {
        panic!("{ev:?}");
    };
    assert_eq!((peer.transport, peer.qpn), (CmTransport::Xrc, 0x11));
    let b = *b;
    // An RC QP cannot take the XRC connection.
    assert_eq!(
        p.b.accept(p.now, b, params(0x22, 0x2000)),
        Err(CmError::WrongTransport)
    );
    p.b.accept(p.now, b, xrc(params(0x22, 0x2000))).unwrap();
    p.pump();
    assert_eq!(p.a.state(a), Some(CmState::Established));
    assert_eq!(p.b.state(b), Some(CmState::Established));
    let (req, rep) = req_rep(&p);
    assert_eq!((req.transport_type, req.extended_transport_type), (3, 1));
    assert_eq!(
        (req.local_qpn, req.responder_resources, req.retry_count),
        (0x11, 0, 0)
    );
    assert_eq!(
        (req.rnr_retry_count, req.srq, req.initiator_depth),
        (0, false, 2)
    );
    assert_eq!((rep.local_qpn, rep.local_eecn, rep.srq), (0, 0x22, true));
    assert_eq!((rep.initiator_depth, rep.responder_resources), (0, 4));
    let acts = actions(&mut p.a);
    assert!(
        matches!(
            acts[..],
            [
                QpAction {
                    qpn: 0x11,
                    step: QpStep::Rtr {
                        dest_qpn: 0x22,
                        rq_psn: 0x1000,
                        ..
                    },
                    ..
                },
                QpAction {
                    step: QpStep::Rts { sq_psn: 0x2000, .. },
                    ..
                }
            ]
        ),
        "{acts:?}"
    );
    let acts = actions(&mut p.b);
    assert!(
        matches!(
            acts[..],
            [
                QpAction {
                    qpn: 0x22,
                    step: QpStep::Rtr { dest_qpn: 0x11, .. },
                    ..
                },
                _
            ]
        ),
        "{acts:?}"
    );
}

/// A listener takes REQs of its own transport only: an RC REQ to an XRC listener and
/// an XRC REQ to an RC listener are refused with REJ "consumer defined" (what
/// Linux's rdma_cm answers, `cma_check_req_qp_type`) and counted, with no event
/// for the listener; a listener that names none takes both. A REQ naming an unknown
/// extended transport is dropped.
#[test]
fn a_listener_takes_reqs_of_its_own_transport_only() {
    for (takes, asks, ok) in [
        (Some(CmTransport::Xrc), CmTransport::Rc, false),
        (Some(CmTransport::Rc), CmTransport::Xrc, false),
        (Some(CmTransport::Rc), CmTransport::Rc, true),
        (None, CmTransport::Xrc, true),
    ] {
        let mut p = Pair::new();
        let l = p.b.create_id();
        p.b.listen(l, SID, takes, 4).unwrap();
        let a = p.a.create_id();
        let ask = ConnParams {
            transport: asks,
            ..params(0x11, 1)
        };
        p.a.connect(p.now, a, route(&p), SID, ask).unwrap();
        p.pump();
        let (ev_a, ev_b) = (events(&mut p.a), events(&mut p.b));
        if ok {
            assert!(
                matches!(&ev_b[..], [Event::ConnectRequest { .. }]),
                "{ev_b:?}"
            );
            continue;
        }
        assert!(ev_b.is_empty(), "{takes:?} {asks:?}: {ev_b:?}");
        assert!(
            matches!(&ev_a[..], [Event::Rejected { id, reason: 28, .. }] if *id == a),
            "{ev_a:?}"
        );
        assert_eq!(p.b.counters().rej_wrong_transport, 1);
        assert_eq!(p.a.state(a), Some(CmState::Closed));
    }

    let mut p = Pair::new();
    let l = p.b.create_id();
    p.b.listen(l, SID, None, 4).unwrap();
    let a = p.a.create_id();
    p.a.connect(p.now, a, route(&p), SID, xrc(params(0x11, 1)))
        .unwrap();
    let mut mad = p.a.poll_transmit().unwrap().mad;
    let CmMessage::Req(ref mut req) = mad.msg else {
        panic!("{mad:?}");
    };
    req.extended_transport_type = 2;
    p.b.handle_mad(p.now, p.a.cfg.local, &mad);
    assert_eq!(p.b.counters().rx_drop_bad_req, 1);
    assert!(events(&mut p.b).is_empty() && p.b.poll_transmit().is_none());
}
