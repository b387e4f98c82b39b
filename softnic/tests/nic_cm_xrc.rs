//! XRC connections through rdma_cm for Rust users (`verbs_api::cm`, `RDMA_PS_IB`)
//! between two NICs: an XRC initiator's id connects to a listener of QP type
//! `XrcRecv`, whose connection accepts with an XRC target; the target's QP number
//! reaches the initiator through the REP (in its EE context field) and its SRQ number
//! through the REP's private data, and a SEND naming that SRQ arrives. Then the
//! refusals: an RC REQ to the XRC listener is rejected before the listener sees it
//! (REJ reason 28, counted), an XRC id cannot connect an RC QP, an RC QP cannot
//! accept an XRC request. And XRC QPs connected through `RDMA_PS_TCP` ids, with RC
//! REQs, as Linux's CM allows and libfabric's verbs provider does.

mod nic_support;

use std::net::SocketAddr;

use nic_support::*;
use verbs_api::cm::{CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, EventChannel, PortSpace};
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Error, MemoryRegion, QpCap, QpType, QueuePair, RecvWr,
    SendWr, SharedReceiveQueue, SrqInitAttr, WcOpcode, WcStatus, WrOpcode, XrcSendQpInitAttr, Xrcd,
    XrcdFlags,
};

fn event(ch: &EventChannel) -> CmEvent {
    ch.get_event_timeout(WAIT)
        .expect("get_event")
        .expect("an event within WAIT")
}

/// Two NICs for one test, on addresses of its own.
fn nics(tag: &str, host: u8) -> (NicProc, NicProc) {
    let at = |side: &str, h: u8| {
        NicProc::start(&format!("{tag}-{side}"), &format!("127.0.0.{h}"), 0, &[])
    };
    (at("a", host), at("b", host + 1))
}

/// A listener of `qp_type` in `ps` on `nic`'s `port`.
fn listener(ch: &EventChannel, ps: PortSpace, qp_type: QpType, nic: &NicProc, port: u16) -> CmId {
    let mut l = CmId::with_qp_type(ch, ps, qp_type).unwrap();
    l.bind_addr(SocketAddr::new(nic.addr, port)).unwrap();
    l.listen(4).unwrap();
    l
}

/// An id of `qp_type` in `ps` on `nic`, its route to `server`'s `port` resolved.
fn client(
    ch: &EventChannel,
    ps: PortSpace,
    qp_type: QpType,
    (nic, server): (&NicProc, &NicProc),
    port: u16,
) -> CmId {
    let mut id = CmId::with_qp_type(ch, ps, qp_type).unwrap();
    let dst = SocketAddr::new(server.addr, port);
    id.resolve_addr(
        Some(SocketAddr::new(nic.addr, 0)),
        dst,
        Some(server.port),
        WAIT,
    )
    .unwrap();
    assert_eq!(event(ch).kind, CmEventKind::AddrResolved);
    id.resolve_route(WAIT).unwrap();
    assert_eq!(event(ch).kind, CmEventKind::RouteResolved);
    id
}

/// A client id of `ps` and `qp_type` (route resolved to `server`'s `port`) connects
/// an XRC initiator; the listener's channel `sch` shows the request. Returns the
/// client id, its initiator and the connection's id on the server.
fn request(
    (cch, sch): (&EventChannel, &EventChannel),
    (ps, qp_type): (PortSpace, QpType),
    nics: (&NicProc, &NicProc),
    port: u16,
) -> (CmId, Initiator, CmId) {
    let mut cid = client(cch, ps, qp_type, nics, port);
    let mut ini = initiator(&cid.context().unwrap().clone());
    cid.init_qp(&mut ini.qp).unwrap();
    cid.connect(&ini.qp, &ConnParam::default()).unwrap();
    let mut req = event(sch);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    let CmEventParam::Conn(p) = &req.param else {
        panic!("{req:?}")
    };
    assert_eq!(p.qp_num, ini.qp.qp_num());
    let sid = req.new_id.take().unwrap();
    (cid, ini, sid)
}

/// An XRC initiator on `ctx`, with a region to send from.
struct Initiator {
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn initiator(ctx: &Context) -> Initiator {
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::ALL).unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let init = XrcSendQpInitAttr {
        send_cq: &cq,
        cap,
        sq_sig_all: false,
    };
    let qp = pd.create_xrc_send_qp(&init).unwrap();
    Initiator { mr, cq, qp }
}

/// An XRC target on `ctx`: a receive QP in a domain of its own, and an XRC SRQ of the
/// domain completing to `cq`, with one 256-byte receive (`wr_id` 9) posted.
struct Target {
    mr: MemoryRegion,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    qp: QueuePair,
    _xrcd: Xrcd,
}

fn target(ctx: &Context) -> Target {
    let flags = XrcdFlags {
        create: true,
        exclusive: false,
    };
    let xrcd = ctx.open_xrcd(None, flags).unwrap();
    let qp = xrcd.create_recv_qp().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::ALL).unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let attr = SrqInitAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let mut srq = pd.create_xrc_srq(&xrcd, &cq, &attr).unwrap();
    let rs = [mr.sge(0, 256)];
    srq.post_recv(&[RecvWr::new(9, &rs)]).unwrap();
    Target {
        mr,
        cq,
        srq,
        qp,
        _xrcd: xrcd,
    }
}

/// `from` SENDs `len` patterned bytes to `to`'s SRQ, number `srqn`; both completions
/// and the bytes are checked.
fn send(from: &mut Initiator, to: &mut Target, srqn: u32, len: usize) {
    from.qp.query().unwrap();
    let data = pattern(len, 5);
    from.mr.write(0, &data);
    let ss = [from.mr.sge(0, len as u32)];
    let wr = SendWr::new(1, WrOpcode::Send, &ss)
        .signaled()
        .to_xrc_srq(srqn);
    from.qp.post_send(&[wr]).unwrap();
    let wc = poll_one(&mut from.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
    let wc = poll_one(&mut to.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len, wc.wr_id, wc.qp_num),
        (
            WcStatus::Success,
            WcOpcode::Recv,
            len as u32,
            9,
            to.qp.qp_num()
        )
    );
    assert_eq!(to.mr.read_vec(0, len), data);
}

/// Must fail with the NIC's refusal.
fn refused(r: verbs_api::Result<()>, what: &str) {
    match r {
        Err(Error::Nic { .. }) => {}
        r => panic!("{what}: {r:?}"),
    }
}

#[test]
fn xrc_connects_through_rdma_cm() {
    let (a, b) = nics("cmxrc", 2);
    let (cch, sch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let _l = listener(&sch, PortSpace::Ib, QpType::XrcRecv, &b, 7600);

    // The initiator: an XRC send QP, moved by the CM. The target: the connection's id
    // takes the listener's port space and QP type.
    let xrc = (PortSpace::Ib, QpType::XrcSend);
    let (cid, mut ini, mut sid) = request((&cch, &sch), xrc, (&a, &b), 7600);
    assert_eq!(cid.qp_type(), QpType::XrcSend);
    let cctx = cid.context().unwrap().clone();
    assert_eq!(
        (sid.port_space(), sid.qp_type()),
        (PortSpace::Ib, QpType::XrcRecv)
    );
    let mut tgt = target(&sid.context().unwrap().clone());
    sid.init_qp(&mut tgt.qp).unwrap();
    let accept = ConnParam {
        private_data: tgt.srq.srq_num().to_be_bytes().to_vec(),
        ..ConnParam::default()
    };
    sid.accept(&tgt.qp, &accept).unwrap();

    let est = event(&cch);
    assert_eq!((est.kind, est.id), (CmEventKind::Established, cid.key()));
    let CmEventParam::Conn(p) = &est.param else {
        panic!("{est:?}")
    };
    assert_eq!(p.qp_num, tgt.qp.qp_num(), "the target's QP, from the REP");
    let srqn = u32::from_be_bytes(p.private_data[..4].try_into().unwrap());
    assert_eq!(srqn, tgt.srq.srq_num());
    let est = event(&sch);
    assert_eq!(est.kind, CmEventKind::Established);
    assert!(
        matches!(&est.param, CmEventParam::Conn(p) if p.private_data.is_empty() && p.qp_num == 0),
        "the passive side's ESTABLISHED carries nothing: {est:?}"
    );
    send(&mut ini, &mut tgt, srqn, 200);

    // An RC initiator to the XRC listener: refused before the listener hears of it.
    let mut rc = client(&cch, PortSpace::Ib, QpType::Rc, (&a, &b), 7600);
    let mut side = side_on(cctx.clone(), 4096, 4);
    rc.init_qp(&mut side.qp).unwrap();
    rc.connect(&side.qp, &ConnParam::default()).unwrap();
    let rej = event(&cch);
    assert_eq!(
        (rej.kind, rej.status),
        (CmEventKind::Rejected, 28),
        "{rej:?}"
    );
    assert_eq!(b.stat("cm_rej_wrong_transport"), 1);
    assert!(sch.try_get_event().unwrap().is_none());

    // An XRC id connects an XRC initiator only; XRC ids live in RDMA_PS_IB only.
    let mut x = client(&cch, PortSpace::Ib, QpType::XrcSend, (&a, &b), 7600);
    let mut rc_qp = side_on(cctx, 4096, 4);
    x.init_qp(&mut rc_qp.qp).unwrap();
    refused(
        x.connect(&rc_qp.qp, &ConnParam::default()),
        "an XRC id connected an RC QP",
    );
    assert!(CmId::with_qp_type(&cch, PortSpace::Tcp, QpType::XrcSend).is_err());
}

/// An XRC request cannot be accepted with an RC QP: the accept is refused, and the
/// connection can still be made with an XRC target.
#[test]
fn an_rc_qp_cannot_accept_an_xrc_request() {
    let (a, b) = nics("cmxrc-rc", 4);
    let (cch, sch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let _l = listener(&sch, PortSpace::Ib, QpType::XrcRecv, &b, 7601);
    let xrc = (PortSpace::Ib, QpType::XrcSend);
    let (_cid, mut ini, mut sid) = request((&cch, &sch), xrc, (&a, &b), 7601);
    let sctx = sid.context().unwrap().clone();
    let mut s = side_on(sctx.clone(), 4096, 4);
    sid.init_qp(&mut s.qp).unwrap();
    refused(
        sid.accept(&s.qp, &ConnParam::default()),
        "an RC QP accepted an XRC request",
    );
    let mut tgt = target(&sctx);
    sid.init_qp(&mut tgt.qp).unwrap();
    sid.accept(&tgt.qp, &ConnParam::default()).unwrap();
    assert_eq!(event(&cch).kind, CmEventKind::Established);
    assert_eq!(event(&sch).kind, CmEventKind::Established);
    let srqn = tgt.srq.srq_num();
    send(&mut ini, &mut tgt, srqn, 64);
}

/// XRC QPs connected through `RDMA_PS_TCP` ids: the REQ and REP are RC's (the ids'
/// type), the NIC moves the XRC send QP and the XRC receive QP with RC's transitions
/// less what each half lacks, and a SEND naming the target's SRQ arrives. Linux's CM
/// allows this and libfabric's verbs provider (`FI_VERBS_PREFER_XRC`) connects its
/// XRC endpoints so.
#[test]
fn xrc_qps_connect_through_rdma_ps_tcp_ids() {
    let (a, b) = nics("cmxrc-tcp", 6);
    let (cch, sch) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let _l = listener(&sch, PortSpace::Tcp, QpType::Rc, &b, 7602);
    let rc = (PortSpace::Tcp, QpType::Rc);
    let (_cid, mut ini, mut sid) = request((&cch, &sch), rc, (&a, &b), 7602);
    let mut tgt = target(&sid.context().unwrap().clone());
    sid.init_qp(&mut tgt.qp).unwrap();
    sid.accept(&tgt.qp, &ConnParam::default()).unwrap();
    let est = event(&cch);
    assert_eq!(est.kind, CmEventKind::Established);
    let CmEventParam::Conn(p) = &est.param else {
        panic!("{est:?}")
    };
    assert_eq!(p.qp_num, tgt.qp.qp_num(), "an RC REP's Local QPN");
    assert_eq!(event(&sch).kind, CmEventKind::Established);
    let srqn = tgt.srq.srq_num();
    send(&mut ini, &mut tgt, srqn, 100);
}
