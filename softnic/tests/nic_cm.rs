//! rdma_cm for Rust users (`verbs_api::cm`) between two NICs on loopback: the IBTA CM
//! on QP1 connects RC QPs by IP address and port, and the connected QPs carry an RDMA
//! WRITE and a SEND; a refused connection and a missing listener surface as REJECTED.

mod nic_support;

use std::net::SocketAddr;

use nic_support::*;
use verbs_api::cm::{CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, EventChannel, PortSpace};
use verbs_api::{RecvWr, SendWr, WcOpcode, WcStatus, WrOpcode};

fn event(ch: &EventChannel) -> CmEvent {
    ch.get_event_timeout(WAIT)
        .expect("get_event")
        .expect("an event within WAIT")
}

fn param(private_data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// A client id on `nic`'s address with its route to `server`'s port resolved.
fn client(ch: &EventChannel, nic: &NicProc, server: &NicProc, port: u16) -> CmId {
    let mut id = CmId::new(ch, PortSpace::Tcp).unwrap();
    let src = SocketAddr::new(nic.addr, 0);
    let dst = SocketAddr::new(server.addr, port);
    id.resolve_addr(Some(src), dst, Some(server.port), WAIT)
        .unwrap();
    assert_eq!(event(ch).kind, CmEventKind::AddrResolved);
    id.resolve_route(WAIT).unwrap();
    assert_eq!(event(ch).kind, CmEventKind::RouteResolved);
    id
}

fn listener(ch: &EventChannel, nic: &NicProc, port: u16) -> CmId {
    let mut l = CmId::new(ch, PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(nic.addr, port)).unwrap();
    l.listen(4).unwrap();
    assert_eq!(l.local_addr(), Some(SocketAddr::new(nic.addr, port)));
    l
}

#[test]
fn connect_accept_write_send_disconnect() {
    let a = NicProc::start("cm-conn-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("cm-conn-b", "127.0.0.3", 0, &[]);
    let (cch, sch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let l = listener(&sch, &b, 7174);
    let mut cid = client(&cch, &a, &b, 7174);
    let mut c = side_on(cid.context().unwrap().clone(), 4096, 8);
    cid.init_qp(&mut c.qp).unwrap();
    cid.connect(&c.qp, &param(b"hello from a")).unwrap();

    let mut req = event(&sch);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l.key()));
    let CmEventParam::Conn(p) = &req.param else {
        panic!("{req:?}")
    };
    assert_eq!(&p.private_data[..12], b"hello from a");
    assert_eq!(
        p.private_data.len(),
        56,
        "the REQ's 92 bytes less the IP CM header"
    );
    assert_eq!(p.qp_num, c.qp.qp_num());
    let mut sid = req.new_id.take().expect("the connection's id");
    assert_eq!(sid.key(), req.id);
    assert_eq!(sid.peer_addr().map(|p| p.ip()), Some(a.addr));
    let mut s = side_on(sid.context().unwrap().clone(), 4096, 8);
    sid.init_qp(&mut s.qp).unwrap();
    // The server tells the client where to write, in the REP's private data.
    let mut rep_data = s.mr.addr().to_be_bytes().to_vec();
    rep_data.extend_from_slice(&s.mr.rkey().to_be_bytes());
    let recv_sge = [s.mr.sge(1024, 64)];
    s.qp.post_recv(&[RecvWr::new(7, &recv_sge)]).unwrap();
    sid.accept(&s.qp, &param(&rep_data)).unwrap();

    let est = event(&cch);
    assert_eq!((est.kind, est.id), (CmEventKind::Established, cid.key()));
    let CmEventParam::Conn(p) = &est.param else {
        panic!("{est:?}")
    };
    assert_eq!(p.qp_num, s.qp.qp_num());
    let addr = u64::from_be_bytes(p.private_data[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(p.private_data[8..12].try_into().unwrap());
    let est = event(&sch);
    assert_eq!((est.kind, est.id), (CmEventKind::Established, sid.key()));

    // The NIC moved both QPs to RTS; refresh the cached state before posting.
    c.qp.query().unwrap();
    s.qp.query().unwrap();
    let data = pattern(512, 3);
    c.mr.write(0, &data);
    c.mr.write(600, b"a SEND over rdma_cm");
    let w = [c.mr.sge(0, 512)];
    let m = [c.mr.sge(600, 19)];
    c.qp.post_send(&[
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            &w,
        )
        .signaled(),
        SendWr::new(2, WrOpcode::Send, &m).signaled(),
    ])
    .unwrap();
    for wc in poll_n(&mut c.cq, 2) {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let wc = poll_one(&mut s.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.wr_id),
        (WcStatus::Success, WcOpcode::Recv, 7)
    );
    assert_eq!(s.mr.read_vec(0, 512), data);
    assert_eq!(s.mr.read_vec(1024, 19), b"a SEND over rdma_cm");

    cid.disconnect().unwrap();
    let d = event(&cch);
    assert_eq!((d.kind, d.id), (CmEventKind::Disconnected, cid.key()));
    let d = event(&sch);
    assert_eq!((d.kind, d.id), (CmEventKind::Disconnected, sid.key()));
    assert_eq!(c.qp.query().unwrap().0, verbs_api::QpState::Err);
    assert_eq!(s.qp.query().unwrap().0, verbs_api::QpState::Err);
    assert_eq!(a.stat("cm_tx_retries") + b.stat("cm_tx_retries"), 0);
    assert_eq!(b.stat("cm_rx_mads"), 3, "REQ, RTU and DREQ reached b");
    assert_eq!(a.stat("cm_rx_mads"), 2, "REP and DREP reached a");
}

#[test]
fn consumer_reject_and_missing_listener_are_rejected() {
    let a = NicProc::start("cm-rej-a", "127.0.0.4", 0, &[]);
    let b = NicProc::start("cm-rej-b", "127.0.0.5", 0, &[]);
    let (cch, sch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let _l = listener(&sch, &b, 18515);

    let mut cid = client(&cch, &a, &b, 18515);
    let mut c = side_on(cid.context().unwrap().clone(), 4096, 4);
    cid.init_qp(&mut c.qp).unwrap();
    cid.connect(&c.qp, &param(b"let me in")).unwrap();
    let mut req = event(&sch);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    req.new_id.take().unwrap().reject(b"not today").unwrap();
    let rej = event(&cch);
    assert_eq!((rej.kind, rej.status), (CmEventKind::Rejected, 28));
    let CmEventParam::Conn(p) = &rej.param else {
        panic!("{rej:?}")
    };
    assert_eq!(&p.private_data[..9], b"not today");

    // Nobody listens on 18516: the peer's CM answers REJ "invalid service ID" (8).
    let mut cid2 = client(&cch, &a, &b, 18516);
    let mut c2 = side_on(cid2.context().unwrap().clone(), 4096, 4);
    cid2.init_qp(&mut c2.qp).unwrap();
    cid2.connect(&c2.qp, &param(b"")).unwrap();
    let rej = event(&cch);
    assert_eq!(
        (rej.kind, rej.status, rej.id),
        (CmEventKind::Rejected, 8, cid2.key())
    );
    assert_eq!(b.stat("cm_rej_no_listener"), 1);
    drop(cid);
}
