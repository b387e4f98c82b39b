//! XRC between two real NICs, through the control protocol and the shared rings as a
//! raw client speaks them (no verbs library): an XRC send QP on one NIC, an XRC receive
//! QP with two XRC SRQs of its domain on the other. Each request lands on the XRC SRQ
//! its work request names (`ibv_post_send(3)`: `qp_type.xrc.remote_srqn`), its
//! completion on that SRQ's CQ (`ibv_create_srq_ex(3)`); an RDMA WRITE is checked
//! against the named SRQ's PD; a request naming an XRC SRQ of another domain is refused
//! (NAK Remote Access Error, counted in `rx_xrc_srq_refused`), and no memory or CQ of
//! that domain changes.

mod nic_support;

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use nic_support::*;
use verbs_api::abi::control::{
    call, Handle, QpAttr, QpCaps, QpState, QpType, Reply, Request, Response, SrqAttr, XrcSrqInit,
};
use verbs_api::abi::ring::{Consumer, Producer};
use verbs_api::abi::slots::{send_flags, wc_opcode, wc_status, wr_opcode};
use verbs_api::abi::{
    CqLayout, Cqe, Doorbell, QpLayout, RecvWqe, Ring, SendWqe, Sge, SrqLayout, ABI_VERSION,
    DOORBELL_SEGMENT_LEN,
};

fn ok(sock: &UnixStream, req: Request, fds: &[BorrowedFd<'_>]) -> (Reply, Vec<OwnedFd>) {
    match call(sock, &req, fds).expect("control call") {
        (Response::Ok(r), fds) => (r, fds),
        (Response::Err { code, message }, _) => panic!("{req:?}: {code:?} {message}"),
    }
}

/// A raw connection: the socket, the wake pipe's write end and the doorbell page.
struct Raw {
    sock: UnixStream,
    wake: OwnedFd,
    doorbell: Doorbell,
}

impl Raw {
    fn open(nic: &NicProc) -> Raw {
        let path = softnic_dir().join(format!("{}.sock", nic.name));
        let sock = UnixStream::connect(path).expect("connect");
        let dfd = verbs_api::os::memfd("raw-doorbell", DOORBELL_SEGMENT_LEN).unwrap();
        let dmap = verbs_api::os::map_shared(dfd.as_fd(), DOORBELL_SEGMENT_LEN).unwrap();
        let doorbell = Doorbell::new(Arc::new(dmap)).unwrap();
        let req = Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: std::process::id(),
            program: "raw-xrc".into(),
        };
        let (_, mut fds) = ok(&sock, req, &[dfd.as_fd()]);
        let wake = fds.swap_remove(0);
        Raw {
            sock,
            wake,
            doorbell,
        }
    }

    fn ok(&self, req: Request) -> Reply {
        ok(&self.sock, req, &[]).0
    }

    /// Rings doorbell `slot`, waking the NIC if it sleeps.
    fn ring(&self, slot: u32) {
        if self.doorbell.ring(slot) {
            verbs_api::os::eventfd_signal(self.wake.as_fd()).unwrap();
        }
    }

    fn pd(&self) -> Handle {
        let Reply::Pd { pd } = self.ok(Request::AllocPd) else {
            panic!()
        };
        pd
    }

    fn xrcd(&self) -> Handle {
        let req = Request::OpenXrcd {
            inode: None,
            create: true,
            exclusive: false,
        };
        let Reply::Xrcd { xrcd } = self.ok(req) else {
            panic!()
        };
        xrcd
    }

    fn cq(&self) -> (Handle, Consumer<Cqe>) {
        let l = CqLayout::new(16).unwrap();
        let fd = verbs_api::os::memfd("raw-cq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let ring = Ring::<Cqe>::new(map, l.offset, l.capacity).unwrap();
        ring.init();
        let Reply::Cq { cq, .. } = ok(&self.sock, Request::CreateCq { depth: 16 }, &[fd.as_fd()]).0
        else {
            panic!()
        };
        (cq, ring.into_consumer())
    }

    /// A 4096-byte region at iova 0: (lkey, rkey, the test's view).
    fn region(&self, pd: Handle) -> (u32, u32, MmapRaw) {
        let fd = verbs_api::os::memfd("raw-mr", 4096).unwrap();
        // Mapped before registering, which seals the memfd against new mappings.
        let view = verbs_api::os::map_shared(fd.as_fd(), 4096).unwrap();
        let req = Request::RegMr {
            pd,
            len: 4096,
            access: 0xF,
            iova: 0,
        };
        let Reply::Mr { lkey, rkey, .. } = ok(&self.sock, req, &[fd.as_fd()]).0 else {
            panic!()
        };
        (lkey, rkey, view)
    }

    /// An XRC SRQ of `xrcd` completing into `cq`: (handle, number, doorbell, ring).
    fn xrc_srq(
        &self,
        pd: Handle,
        xrcd: Handle,
        cq: Handle,
    ) -> (Handle, u32, u32, Producer<RecvWqe>) {
        let l = SrqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("raw-srq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let ring = Ring::<RecvWqe>::new(map, l.offset, l.capacity).unwrap();
        ring.init();
        let req = Request::CreateSrq {
            pd,
            attr: SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            xrc: Some(XrcSrqInit { xrcd, cq }),
        };
        let Reply::Srq {
            srq,
            srq_num,
            doorbell,
            ..
        } = ok(&self.sock, req, &[fd.as_fd()]).0
        else {
            panic!()
        };
        assert_ne!(srq_num, 0);
        (srq, srq_num, doorbell, ring.into_producer())
    }

    /// CreateQp: (QPN, doorbell, SQ ring).
    fn qp(&self, req: Request) -> (u32, u32, Producer<SendWqe>) {
        let Request::CreateQp { caps, qp_type, .. } = &req else {
            panic!()
        };
        let l = QpLayout::new(caps.max_send_wr, caps.max_recv_wr, caps.sq_shape(*qp_type)).unwrap();
        let fd = verbs_api::os::memfd("raw-qp", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let (sq, rq) = l.rings(map).unwrap();
        sq.init();
        rq.init();
        let Reply::Qp { qpn, doorbell, .. } = ok(&self.sock, req, &[fd.as_fd()]).0 else {
            panic!()
        };
        (qpn, doorbell, sq.into_producer())
    }

    fn modify(&self, qpn: u32, attrs: &[QpAttr]) {
        for &attr in attrs {
            assert_eq!(self.ok(Request::ModifyQp { qpn, attr }), Reply::Done);
        }
    }
}

fn init() -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        access: Some(0xF),
        ..QpAttr::default()
    }
}

fn rtr(dest_qpn: u32, remote: SocketAddr, responder: bool) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(1024),
        dest_qpn: Some(dest_qpn),
        rq_psn: Some(0),
        remote: Some(remote),
        max_dest_rd_atomic: responder.then_some(1),
        min_rnr_timer: responder.then_some(12),
        ..QpAttr::default()
    }
}

fn post_recv(p: &mut Producer<RecvWqe>, wr_id: u64, lkey: u32, addr: u64) {
    let mut w = RecvWqe {
        wr_id,
        num_sge: 1,
        ..RecvWqe::default()
    };
    w.sges[0] = Sge {
        addr,
        length: 1024,
        lkey,
    };
    p.push(&w).unwrap();
    p.publish();
}

fn next_cqe(cq: &mut Consumer<Cqe>) -> Cqe {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(c) = cq.pop().expect("cq") {
            cq.release();
            return c;
        }
        assert!(Instant::now() < deadline, "no CQE");
        std::thread::yield_now();
    }
}

fn read(view: &MmapRaw, at: usize, len: usize) -> Vec<u8> {
    assert!(at + len <= view.len());
    // SAFETY: within the test's live mapping of the region; the NIC writes it only
    // while handling a request, and the completions waited for say it is done.
    unsafe { std::slice::from_raw_parts(view.as_ptr().add(at), len).to_vec() }
}

fn write(view: &MmapRaw, at: usize, data: &[u8]) {
    assert!(at + data.len() <= view.len());
    // SAFETY: within the test's live mapping; the NIC reads it only for a posted send.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), view.as_mut_ptr().add(at), data.len()) }
}

/// A send WQE of the XRC send QP for the XRC SRQ numbered `srq_num`.
fn xrc_wqe(wr_id: u64, opcode: u8, srq_num: u32) -> SendWqe {
    let mut w = SendWqe {
        wr_id,
        opcode,
        flags: send_flags::SIGNALED | send_flags::XRC_SRQN,
        ..SendWqe::default()
    };
    w.ud.qpn = srq_num;
    w
}

#[test]
fn xrc_requests_land_on_the_srq_they_name_and_complete_on_its_cq() {
    let (a, b) = NicProc::pair("xrc");
    // The target: one domain with two XRC SRQs, each with its CQ, and the receive QP;
    // another domain with an SRQ of its own.
    let t = Raw::open(&b);
    let tpd = t.pd();
    let (tlkey, trkey, tview) = t.region(tpd);
    let xrcd = t.xrcd();
    let other = t.xrcd();
    let (cq1, mut cqe1) = t.cq();
    let (cq2, mut cqe2) = t.cq();
    let (cq3, mut cqe3) = t.cq();
    let (_, num1, db1, mut srq1) = t.xrc_srq(tpd, xrcd, cq1);
    let (_, num2, db2, mut srq2) = t.xrc_srq(tpd, xrcd, cq2);
    let (_, num3, db3, mut srq3) = t.xrc_srq(tpd, other, cq3);
    assert!(num1 != num2 && num2 != num3 && num1 != num3);
    for (p, db, wr_id, at) in [
        (&mut srq1, db1, 1, 0),
        (&mut srq2, db2, 2, 1024),
        (&mut srq3, db3, 3, 2048),
    ] {
        post_recv(p, wr_id, tlkey, at);
        t.ring(db);
    }
    let recv_caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_sge: 1,
        max_inline: 0,
    };
    let (recv, ..) = t.qp(Request::CreateQp {
        pd: 0,
        qp_type: QpType::XrcRecv,
        send_cq: 0,
        recv_cq: 0,
        caps: recv_caps,
        srq: None,
        xrcd: Some(xrcd),
    });
    // The initiator: an XRC send QP.
    let i = Raw::open(&a);
    let ipd = i.pd();
    let (ilkey, _, iview) = i.region(ipd);
    let (icq, mut icqe) = i.cq();
    let send_caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 1,
        max_sge: 1,
        max_inline: 64,
    };
    let (send, sdb, mut sq) = i.qp(Request::CreateQp {
        pd: ipd,
        qp_type: QpType::XrcSend,
        send_cq: icq,
        recv_cq: 0,
        caps: send_caps,
        srq: None,
        xrcd: None,
    });
    t.modify(
        recv,
        &[
            init(),
            rtr(send, SocketAddr::new(a.addr, a.port), true),
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(14),
                ..QpAttr::default()
            },
        ],
    );
    i.modify(
        send,
        &[
            init(),
            rtr(recv, SocketAddr::new(b.addr, b.port), false),
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(10),
                retry_cnt: Some(2),
                rnr_retry: Some(7),
                max_rd_atomic: Some(1),
                ..QpAttr::default()
            },
        ],
    );

    // An inline SEND to SRQ 2 (its bytes follow the destination area).
    let mut w = xrc_wqe(10, wr_opcode::SEND, num2);
    w.flags |= send_flags::INLINE;
    w.inline_len = 9;
    w.inline_area_mut()[..9].copy_from_slice(b"to srq 2!");
    sq.push(&w).unwrap();
    // A SEND from the region to SRQ 1.
    write(&iview, 0, b"to srq one");
    let mut w = xrc_wqe(11, wr_opcode::SEND, num1);
    w.num_sge = 1;
    w.sges[0] = Sge {
        addr: 0,
        length: 10,
        lkey: ilkey,
    };
    sq.push(&w).unwrap();
    // An RDMA WRITE, checked against SRQ 1's PD (the target's region is in it).
    write(&iview, 100, b"written through xrc");
    let mut w = xrc_wqe(12, wr_opcode::RDMA_WRITE, num1);
    w.remote_addr = 3000;
    w.rkey = trkey;
    w.num_sge = 1;
    w.sges[0] = Sge {
        addr: 100,
        length: 19,
        lkey: ilkey,
    };
    sq.push(&w).unwrap();
    sq.publish();
    i.ring(sdb);
    for wr_id in [10, 11, 12] {
        let c = next_cqe(&mut icqe);
        assert_eq!((c.wr_id, c.status), (wr_id, wc_status::SUCCESS), "{c:?}");
    }
    let c = next_cqe(&mut cqe2);
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len, c.qp_num),
        (2, wc_status::SUCCESS, wc_opcode::RECV, 9, recv),
        "{c:?}"
    );
    let c = next_cqe(&mut cqe1);
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len, c.qp_num),
        (1, wc_status::SUCCESS, wc_opcode::RECV, 10, recv),
        "{c:?}"
    );
    assert_eq!(read(&tview, 1024, 9), b"to srq 2!");
    assert_eq!(read(&tview, 0, 10), b"to srq one");
    assert_eq!(read(&tview, 3000, 19), b"written through xrc");

    // A SEND naming the other domain's SRQ: refused at the target (the initiator's
    // WQE completes with a remote access error), and that SRQ's WQE and CQ stay
    // untouched.
    let mut w = xrc_wqe(13, wr_opcode::SEND, num3);
    w.flags |= send_flags::INLINE;
    w.inline_len = 4;
    w.inline_area_mut()[..4].copy_from_slice(b"nope");
    sq.push(&w).unwrap();
    sq.publish();
    i.ring(sdb);
    let c = next_cqe(&mut icqe);
    assert_eq!(
        (c.wr_id, c.status),
        (13, wc_status::REM_ACCESS_ERR),
        "{c:?}"
    );
    assert_eq!(b.stat("rx_xrc_srq_refused"), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cqe3.pop().unwrap(), None);
    assert_eq!(read(&tview, 2048, 4), [0; 4]);
    assert_eq!(b.stat("cqe_drop_no_cq"), 0);
}
