//! A client that writes garbage into its rings harms only itself: a raw client (the
//! shared-memory ABI without verbs-api's checks) posts an unknown opcode, then corrupts
//! its ring indices; its QP fails with the right completions, the NIC counts it and
//! keeps serving another client. A CQ whose consumer index is impossible moves its QP
//! to ERR with QP_FATAL.

mod nic_support;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nic_support::*;
use verbs_api::abi::control::{call, QpAttr, QpCaps, QpState, QpType, Reply, Request, Response};
use verbs_api::abi::ring::{Consumer, Producer};
use verbs_api::abi::slots::{send_flags, wc_status, wr_opcode};
use verbs_api::abi::{
    CqLayout, Cqe, Doorbell, QpLayout, Ring, SendWqe, ABI_VERSION, DOORBELL_SEGMENT_LEN,
};
use verbs_api::{Mtu, SendWr, WcStatus, WrOpcode};

fn ok(
    sock: &UnixStream,
    req: Request,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (Reply, Vec<std::os::fd::OwnedFd>) {
    match call(sock, &req, fds).expect("control call") {
        (Response::Ok(r), fds) => (r, fds),
        (Response::Err { code, message }, _) => panic!("{req:?}: {code:?} {message}"),
    }
}

struct RawQp {
    sock: UnixStream,
    wake: std::os::fd::OwnedFd,
    doorbell: Doorbell,
    slot: u32,
    sq: Producer<SendWqe>,
    sq_map: Arc<memmap2::MmapRaw>,
    cq: Consumer<Cqe>,
    cq_map: Arc<memmap2::MmapRaw>,
    qpn: u32,
}

/// Opens a raw connection: the socket, the wake pipe's write end and the doorbell page.
fn raw_open(nic: &NicProc) -> (UnixStream, std::os::fd::OwnedFd, Doorbell) {
    let sock =
        UnixStream::connect(softnic_dir().join(format!("{}.sock", nic.name))).expect("connect");
    let dfd = verbs_api::os::memfd("raw-doorbell", DOORBELL_SEGMENT_LEN).unwrap();
    let dmap = verbs_api::os::map_shared(dfd.as_fd(), DOORBELL_SEGMENT_LEN).unwrap();
    let doorbell = Doorbell::new(Arc::new(dmap)).unwrap();
    let (_, mut fds) = ok(
        &sock,
        Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: std::process::id(),
            program: "raw".into(),
        },
        &[dfd.as_fd()],
    );
    assert_eq!(fds.len(), 2, "the wake fd and the NIC's life sign");
    let wake = fds.swap_remove(0);
    (sock, wake, doorbell)
}

fn raw_qp(nic: &NicProc, peer: &NicProc, peer_qpn: u32) -> RawQp {
    let (sock, wake, doorbell) = raw_open(nic);
    let Reply::Pd { pd } = ok(&sock, Request::AllocPd, &[]).0 else {
        panic!()
    };
    let cl = CqLayout::new(16).unwrap();
    let cfd = verbs_api::os::memfd("raw-cq", cl.len).unwrap();
    let cmap = Arc::new(verbs_api::os::map_shared(cfd.as_fd(), cl.len).unwrap());
    let cring = Ring::<Cqe>::new(cmap.clone(), cl.offset, cl.capacity).unwrap();
    cring.init();
    let Reply::Cq { cq, .. } = ok(&sock, Request::CreateCq { depth: 16 }, &[cfd.as_fd()]).0 else {
        panic!()
    };
    // Four gather entries: a 112-byte stride, room for the garbage posted below (a
    // `num_sge` of 250 is copied as four entries).
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_sge: 4,
        max_inline: 0,
    };
    let ql = QpLayout::new(8, 8, caps.sq_shape(QpType::Rc)).unwrap();
    let qfd = verbs_api::os::memfd("raw-qp", ql.len).unwrap();
    let qmap = Arc::new(verbs_api::os::map_shared(qfd.as_fd(), ql.len).unwrap());
    let (sq, rq) = ql.rings(qmap.clone()).unwrap();
    sq.init();
    rq.init();
    let req = Request::CreateQp {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps,
        srq: None,
        xrcd: None,
    };
    let Reply::Qp {
        qpn,
        doorbell: slot,
        ..
    } = ok(&sock, req, &[qfd.as_fd()]).0
    else {
        panic!()
    };
    for attr in [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access: Some(0xF),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(1024),
            dest_qpn: Some(peer_qpn),
            rq_psn: Some(0),
            remote: Some(std::net::SocketAddr::new(peer.addr, peer.port)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        },
    ] {
        ok(&sock, Request::ModifyQp { qpn, attr }, &[]);
    }
    RawQp {
        sock,
        wake,
        doorbell,
        slot,
        sq: sq.into_producer(),
        sq_map: qmap,
        cq: cring.into_consumer(),
        cq_map: cmap,
        qpn,
    }
}

impl RawQp {
    fn post(&mut self, w: SendWqe) {
        self.sq.push(&w).expect("push");
        self.sq.publish();
        self.ring();
    }

    /// Rings the QP's doorbell, waking the NIC if it sleeps.
    fn ring(&self) {
        if self.doorbell.ring(self.slot) {
            verbs_api::os::eventfd_signal(self.wake.as_fd()).unwrap();
        }
    }

    fn next_cqe(&mut self) -> Cqe {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(c) = self.cq.pop().expect("cq") {
                self.cq.release();
                return c;
            }
            assert!(Instant::now() < deadline, "no CQE");
            std::thread::yield_now();
        }
    }
}

#[test]
fn garbage_in_a_clients_rings_harms_only_that_client() {
    let a = NicProc::start("junk-a", "127.0.0.13", 0, &[]);
    let b = NicProc::start("junk-b", "127.0.0.14", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);

    let mut raw = raw_qp(&a, &b, y.qp.qp_num());
    // An opcode that does not exist, then a valid SEND behind it.
    raw.post(SendWqe {
        wr_id: 77,
        opcode: 200,
        flags: send_flags::SIGNALED,
        num_sge: 250,
        ..SendWqe::default()
    });
    raw.post(SendWqe {
        wr_id: 78,
        opcode: wr_opcode::SEND,
        flags: send_flags::SIGNALED,
        ..SendWqe::default()
    });
    let c = raw.next_cqe();
    assert_eq!(
        (c.wr_id, c.status, c.qp_num),
        (77, wc_status::LOC_QP_OP_ERR, raw.qpn),
        "{c:?}"
    );
    assert_ne!(c.vendor_err, 0);
    let c = raw.next_cqe();
    assert_eq!((c.wr_id, c.status), (78, wc_status::WR_FLUSH_ERR), "{c:?}");
    assert_eq!(a.stat("wqe_invalid"), 1);

    // Now an impossible producer index (far beyond the capacity).
    // SAFETY: the SQ ring header starts the QP segment (offset 0) and its first field is
    // the producer index, an AtomicU32 at offset 0; the mapping is live and aligned.
    let producer = unsafe { &*(raw.sq_map.as_mut_ptr() as *const AtomicU32) };
    producer.store(
        producer.load(Ordering::Relaxed).wrapping_add(100_000),
        Ordering::Release,
    );
    raw.ring();
    verbs_api::os::eventfd_signal(raw.wake.as_fd()).unwrap();
    let deadline = Instant::now() + WAIT;
    while a.stat("ring_corrupt") < 1 {
        assert!(Instant::now() < deadline, "corrupt ring not noticed");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    // The other client is unaffected.
    let sge = [x.mr.sge(0, 100)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(1, op, &sge).signaled()])
        .expect("post");
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
}

/// A CQ whose consumer index the client made impossible: the completion the NIC then
/// cannot write moves its QP to ERR with IBV_EVENT_QP_FATAL (nothing more can be
/// written to that CQ, so the QP has nothing left to deliver and drops out of the
/// loop's active set: the event is noticed on the very pass that raised it).
#[test]
fn a_corrupt_cq_is_qp_fatal() {
    let a = NicProc::start("junk-e", "127.0.0.17", 0, &[]);
    let b = NicProc::start("junk-f", "127.0.0.18", 0, &[]);
    let mut y = side(&b, 4096, 8);
    let mut raw = raw_qp(&a, &b, y.qp.qp_num());
    y.qp.to_init(verbs_api::AccessFlags::ALL).expect("init");
    y.qp.to_rtr(&a.endpoint(raw.qpn, 0), Mtu::Mtu1024)
        .expect("rtr");
    y.qp.to_rts(0).expect("rts");
    let rsge = [y.mr.sge(0, 64)];
    let mut send = |raw: &mut RawQp, wr_id: u64| {
        y.qp.post_recv(&[verbs_api::RecvWr::new(wr_id, &rsge)])
            .expect("post recv");
        raw.post(SendWqe {
            wr_id,
            opcode: wr_opcode::SEND,
            flags: send_flags::SIGNALED,
            ..SendWqe::default()
        });
        assert_eq!(
            poll_one(&mut y.cq).status,
            WcStatus::Success,
            "SEND {wr_id}"
        );
    };
    // The NIC reads the consumer index again only when the ring looks full: fill the
    // CQ (16 slots) without polling it, then make the index impossible.
    let capacity = 16;
    for i in 0..capacity {
        send(&mut raw, i);
    }
    // SAFETY: the CQ ring header starts the CQ segment (offset 0); its consumer index
    // is an AtomicU32 at offset 64; the mapping is live and aligned.
    let consumer = unsafe { &*(raw.cq_map.as_mut_ptr().add(64) as *const AtomicU32) };
    consumer.store(100_000, Ordering::Release);
    send(&mut raw, capacity);
    let deadline = Instant::now() + WAIT;
    let events = loop {
        match ok(&raw.sock, Request::GetAsyncEvents, &[]).0 {
            Reply::AsyncEvents(v) if !v.is_empty() => break v,
            _ => assert!(Instant::now() < deadline, "no QP_FATAL"),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(
        events,
        vec![verbs_api::AsyncEvent::QpFatal { qpn: raw.qpn }]
    );
    let req = Request::QueryQp { qpn: raw.qpn };
    assert!(matches!(
        ok(&raw.sock, req, &[]).0,
        Reply::QpInfo {
            state: QpState::Err,
            ..
        }
    ));
}

/// The doorbell page is the client's memory: bits for slots that are none of its rings
/// are ignored and counted, and a client that sets every bit of its page without end
/// does not keep another client's WRITEs from completing.
#[test]
fn a_doorbell_page_full_of_garbage_is_counted_and_harms_no_one() {
    let a = NicProc::start("junk-c", "127.0.0.15", 0, &[]);
    let b = NicProc::start("junk-d", "127.0.0.16", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let (_sock, wake, doorbell) = raw_open(&a);
    // No rings at all: every bit names nothing.
    for slot in [0, 1, 63, 64, 5000, verbs_api::abi::DOORBELL_SLOTS - 1] {
        doorbell.ring(slot);
    }
    verbs_api::os::eventfd_signal(wake.as_fd()).unwrap();
    let deadline = Instant::now() + WAIT;
    while a.stat("doorbell_unknown_slot") < 6 {
        assert!(Instant::now() < deadline, "stray doorbells not counted");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Now every bit, over and over, while the other client writes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) && rounds < 1_000_000 {
                for slot in (0..verbs_api::abi::DOORBELL_SLOTS).step_by(61) {
                    doorbell.ring(slot);
                }
                rounds += 1;
                std::thread::yield_now();
            }
            drop(wake);
        })
    };
    let sge = [x.mr.sge(0, 100)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    for i in 0..200 {
        x.qp.post_send(&[SendWr::new(i, op, &sge).signaled()])
            .expect("post");
        assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    assert!(a.stat("doorbell_unknown_slot") > 6);
}
