//! The client library against the mock NIC of `mock/mod.rs`.

mod mock;

use std::os::fd::AsFd;

use mock::start;
use verbs_api::abi::slots::{send_flags, wc_flags, wc_opcode, wc_status, wr_opcode};
use verbs_api::abi::{Cqe, CQ_ARMED};
use verbs_api::*;

const CAP: QpCap = QpCap {
    max_send_wr: 2,
    max_recv_wr: 4,
    max_send_sge: 2,
    max_recv_sge: 1,
    max_inline_data: 64,
};

#[test]
fn open_query_and_list() {
    let _nic = start("mock-list");
    assert!(Device::list()
        .unwrap()
        .iter()
        .any(|d| d.name() == "mock-list"));
    let ctx = Device::open("mock-list").unwrap();
    // rxe's table: 0 link-local (from the node GUID), 1 the NIC's address.
    assert_eq!(ctx.query_gid(1).unwrap().to_string(), "::ffff:127.0.0.9");
    let ll = ctx.query_gid(0).unwrap();
    assert_eq!(ll.0[..8], [0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
    assert_eq!(ll.0[8..], (ctx.node_guid() ^ (0x02 << 56)).to_be_bytes());
    let e = ctx.query_gid(2).unwrap_err().to_string();
    assert!(e.contains("GID index 2 does not exist"), "{e}");
    assert_eq!(ctx.query_device().unwrap().mtu, 4096);
    let missing = Device::open("no-such-nic").unwrap_err().to_string();
    assert!(
        missing.contains("no softnic device \"no-such-nic\""),
        "{missing}"
    );
}

#[test]
fn memory_region_is_shared_with_the_nic() {
    let nic = start("mock-mr");
    let ctx = Device::open("mock-mr").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd
        .alloc_mr(10_000, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    assert_eq!(mr.len(), 10_000);
    assert_eq!(mr.rkey(), mr.lkey() | 0xAB00_0000);
    mr.write(9_990, b"0123456789");
    let n = nic.lock().unwrap();
    let map = &n.mrs[0].1;
    // SAFETY: 10_000 < mapping length; the client wrote these bytes above.
    let nic_view = unsafe { std::slice::from_raw_parts(map.as_ptr().add(9_990), 10) };
    assert_eq!(nic_view, b"0123456789");
    // SAFETY: as above; the "NIC" writes, the client reads.
    unsafe { *map.as_mut_ptr() = 0x5a };
    assert_eq!(mr.read_array::<1>(0)[0], 0x5a);
    mr.fill(3, 5, 0xC3);
    assert_eq!(mr.read_vec(2, 7), [0, 0xC3, 0xC3, 0xC3, 0xC3, 0xC3, 0]);
    assert_eq!(mr.read_vec(9_990, 10), b"0123456789");
    // Accesses outside the region panic (like slice indexing), before touching memory.
    let outside =
        |f: &mut dyn FnMut()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
    assert!(outside(&mut || mr.write(9_991, b"0123456789")));
    assert!(outside(&mut || {
        mr.read_vec(10_000, 1);
    }));
    assert!(outside(&mut || mr.fill(usize::MAX, 2, 0)));
    assert_eq!(mr.read_vec(9_990, 10), b"0123456789");
    let bad = pd
        .alloc_mr(16, AccessFlags::REMOTE_WRITE)
        .unwrap_err()
        .to_string();
    assert!(bad.contains("require LOCAL_WRITE"), "{bad}");
}

#[test]
fn qp_lifecycle_posts_and_completions() {
    let nic = start("mock-qp");
    let ctx = Device::open("mock-qp").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut cq = ctx.create_cq(10).unwrap();
    assert_eq!(cq.capacity(), 16);
    let mut qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: CAP,
            sq_sig_all: false,
        })
        .unwrap();
    assert_eq!(qp.qp_num(), 0x11);

    // Not yet RTS: the client refuses sends, names the state.
    let sge = [mr.sge(0, 64)];
    let e = qp
        .post_send(&[SendWr::new(1, WrOpcode::Send, &sge)])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "work request 0 (wr_id 0x1): the QP is in state Reset");
    // Illegal transition is caught before the NIC sees it.
    assert!(qp
        .to_rts(0)
        .unwrap_err()
        .to_string()
        .contains("Reset -> Rts is not a legal"));

    qp.to_init(AccessFlags::REMOTE_WRITE).unwrap();
    qp.post_recv(&[RecvWr::new(77, &[mr.sge(1024, 1024)])])
        .unwrap();
    let remote = QpEndpoint {
        lid: 0,
        qpn: 0x99,
        psn: 0x1234,
        gid: "::ffff:127.0.0.3".parse().unwrap(),
        udp_port: 0,
    };
    qp.to_rtr(&remote, Mtu::Mtu1024).unwrap();
    qp.to_rts(0x4321).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    {
        let n = nic.lock().unwrap();
        let rtr = &n.modifies[1].1;
        assert_eq!(rtr.remote, Some("127.0.0.3:4791".parse().unwrap()));
        assert_eq!(
            (rtr.dest_qpn, rtr.rq_psn, rtr.path_mtu),
            (Some(0x99), Some(0x1234), Some(1024))
        );
        assert_eq!(n.modifies[2].1.sq_psn, Some(0x4321));
    }

    // A WRITE lands in the SQ ring as the NIC expects it; the NIC is awake: no wake-up.
    let gather = [mr.sge(0, 100), mr.sge(200, 28)];
    qp.post_send(&[SendWr::new(
        5,
        WrOpcode::RdmaWrite {
            remote_addr: 0x7000,
            rkey: 0xbeef,
        },
        &gather,
    )
    .signaled()])
        .unwrap();
    {
        let mut n = nic.lock().unwrap();
        let wake = n.wake.as_ref().unwrap().as_fd();
        assert_eq!(verbs_api::os::eventfd_drain(wake).unwrap(), 0);
        let (_, sq, rq) = &mut n.qps[0];
        let w = sq.pop().unwrap().unwrap();
        sq.release();
        assert_eq!(
            (w.wr_id, w.opcode, w.flags, w.num_sge),
            (5, wr_opcode::RDMA_WRITE, send_flags::SIGNALED, 2)
        );
        assert_eq!((w.remote_addr, w.rkey), (0x7000, 0xbeef));
        assert_eq!(w.sges[1].addr, mr.addr() + 200);
        assert_eq!(w.sges[1].length, 28);
        let r = rq.pop().unwrap().unwrap();
        rq.release();
        assert_eq!(
            (r.wr_id, r.num_sge, r.sges[0].addr),
            (77, 1, mr.addr() + 1024)
        );
        // Both posts rang QP 0's doorbell (slot 0), once announced in the summary.
        let db = n.doorbell.as_ref().unwrap();
        assert_eq!((db.take_summary(0), db.take_word(0)), (1, 1));
        // The NIC goes to sleep.
        db.set_need_wakeup();
    }
    qp.post_send(&[SendWr::new(6, WrOpcode::Send, &[])])
        .unwrap();
    {
        let n = nic.lock().unwrap();
        assert_eq!(
            verbs_api::os::eventfd_drain(n.wake.as_ref().unwrap().as_fd()).unwrap(),
            1
        );
    }

    // Queue full: capacity 2, one slot already used by wr 6.
    let e = qp
        .post_send(&[
            SendWr::new(8, WrOpcode::Send, &[]),
            SendWr::new(9, WrOpcode::Send, &[]),
        ])
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Post {
                index: 1,
                wr_id: 9,
                reason: PostError::QueueFull { capacity: 2 }
            }
        ),
        "{e}"
    );

    // Bad key of an inline send (the library reads those bytes itself), named
    // precisely. Other SGEs' keys are the NIC's to check (a LOC_PROT_ERR completion).
    let bogus = [Sge {
        addr: mr.addr(),
        length: 8,
        lkey: 0x1234,
    }];
    let e = qp
        .post_send(&[SendWr::new(10, WrOpcode::Send, &bogus).inline()])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "work request 0 (wr_id 0xa): SGE 0: lkey 0x1234 is not a memory region of this protection domain");

    // Completions: none yet, then one with immediate data.
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert!(!cq.wait(Some(std::time::Duration::ZERO)).unwrap());
    {
        let mut n = nic.lock().unwrap();
        let (_, cqp, _) = &mut n.cqs[0];
        cqp.push(&Cqe {
            wr_id: 77,
            status: wc_status::SUCCESS,
            opcode: wc_opcode::RECV_RDMA_WITH_IMM,
            flags: wc_flags::WITH_IMM,
            byte_len: 0,
            imm: 0x1234_5678,
            qp_num: 0x11,
            ..Cqe::default()
        })
        .unwrap();
        cqp.publish();
    }
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id, 77);
    assert_eq!(wc[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc[0].imm_data, Some(0x1234_5678));
    assert!(wc[0].status.is_success());

    // Blocking wait: the "NIC" thread waits for CQ_ARMED, then completes and signals.
    let nic2 = nic.clone();
    let notifier = std::thread::spawn(move || {
        for _ in 0..10_000_000u32 {
            let mut n = nic2.lock().unwrap();
            let (_, cqp, ev) = &mut n.cqs[0];
            if cqp.ring().flags() & CQ_ARMED != 0 {
                cqp.push(&Cqe {
                    wr_id: 5,
                    status: wc_status::REM_ACCESS_ERR,
                    qp_num: 0x11,
                    ..Cqe::default()
                })
                .unwrap();
                assert!(cqp.publish_and_take(CQ_ARMED));
                ev.signal().unwrap();
                return;
            }
            drop(n);
            std::thread::yield_now();
        }
        panic!("the client never armed the CQ");
    });
    assert!(cq.wait(Some(std::time::Duration::from_secs(30))).unwrap());
    notifier.join().unwrap();
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    assert_eq!(wc[0].status.to_string(), "remote access error");

    drop(qp);
    assert!(nic
        .lock()
        .unwrap()
        .destroyed
        .contains(&"qp 0x11".to_string()));
}
