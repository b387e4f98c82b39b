//! Shared receive queues between two real NICs: many RC and UD QPs on one SRQ (and one
//! SRQ shared by 64 QPs), completions naming their QP, the SRQ-limit event, RNR while
//! the SRQ is empty and recovery once it is refilled.

mod nic_support;

use nic_support::*;
use verbs_api::{
    AccessFlags, AsyncEvent, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu,
    ProtectionDomain, QpAttr, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendWr,
    SharedReceiveQueue, SrqInitAttr, UdAddress, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

const SLOT: usize = 4096;
const QKEY: u32 = 0x1111_1111;

fn cap(depth: u32) -> QpCap {
    QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// One NIC's client: context, PD, region, one CQ for everything.
struct Host {
    ctx: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
}

fn host(nic: &NicProc, mr_len: usize, cqe: u32) -> Host {
    let ctx = Device::open(&nic.name).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let mr = pd.alloc_mr(mr_len, AccessFlags::ALL).expect("mr");
    let cq = ctx.create_cq(cqe).expect("cq");
    Host { ctx, pd, mr, cq }
}

fn qp(h: &Host, t: QpType, srq: Option<&SharedReceiveQueue>) -> QueuePair {
    let attr = QpInitAttr {
        qp_type: t,
        send_cq: &h.cq,
        recv_cq: &h.cq,
        cap: cap(16),
        sq_sig_all: false,
    };
    match srq {
        Some(s) => h.pd.create_qp_with_srq(&attr, s),
        None => h.pd.create_qp(&attr),
    }
    .expect("create qp")
}

fn connect(x: &mut QueuePair, y: &mut QueuePair, a: &NicProc, b: &NicProc) {
    x.to_init(AccessFlags::ALL).expect("init");
    y.to_init(AccessFlags::ALL).expect("init");
    x.to_rtr(&b.endpoint(y.qp_num(), 7), Mtu::Mtu1024)
        .expect("rtr");
    y.to_rtr(&a.endpoint(x.qp_num(), 9), Mtu::Mtu1024)
        .expect("rtr");
    for (q, psn) in [(x, 9), (y, 7)] {
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        })
        .expect("rts");
    }
}

fn ud_ready(q: &mut QueuePair, nic: &NicProc) {
    q.to_init(AccessFlags::NONE).expect("init");
    q.to_rtr(&nic.endpoint(0, 0), Mtu::Mtu1024).expect("rtr");
    q.to_rts(0).expect("rts");
}

fn post_srq(srq: &mut SharedReceiveQueue, mr: &MemoryRegion, ids: std::ops::Range<u64>) {
    for id in ids {
        let s = [mr.sge(id as usize * SLOT, SLOT as u32)];
        srq.post_recv(&[RecvWr::new(id, &s)]).expect("post srq");
    }
}

/// `n` QPs of type `t` on NIC `a`, each sending `per_qp` messages to its own QP on NIC
/// `b`, where all `n` receive from one SRQ. Every message carries its sender's index
/// as immediate data and as its first byte.
fn many_qps_on_one_srq(a: &NicProc, b: &NicProc, t: QpType, n: usize, per_qp: usize) {
    let total = n * per_qp;
    let mut x = host(a, n * 64, (2 * total) as u32);
    let mut y = host(b, total * SLOT, (2 * total) as u32);
    let mut srq =
        y.pd.create_srq(&SrqInitAttr {
            max_wr: total as u32,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("create srq");
    let mut xs: Vec<QueuePair> = (0..n).map(|_| qp(&x, t, None)).collect();
    let mut ys: Vec<QueuePair> = (0..n).map(|_| qp(&y, t, Some(&srq))).collect();
    for (qx, qy) in xs.iter_mut().zip(ys.iter_mut()) {
        match t {
            QpType::Ud => {
                ud_ready(qx, a);
                ud_ready(qy, b);
            }
            _ => connect(qx, qy, a, b),
        }
    }
    // Receives through the QP itself are refused: they belong to the SRQ.
    let s = [y.mr.sge(0, 8)];
    assert!(ys[0].post_recv(&[RecvWr::new(0, &s)]).is_err());
    post_srq(&mut srq, &y.mr, 0..total as u64);
    for (i, qx) in xs.iter_mut().enumerate() {
        x.mr.write(i * 64, &[i as u8]);
        let ss = [x.mr.sge(i * 64, 64)];
        for m in 0..per_qp {
            let mut wr = SendWr::new(m as u64, WrOpcode::SendWithImm(i as u32), &ss).signaled();
            if t == QpType::Ud {
                wr = wr.to(UdAddress {
                    gid: Gid::from_ip(b.addr),
                    udp_port: b.port,
                    qpn: ys[i].qp_num(),
                    qkey: QKEY,
                    traffic_class: 0,
                });
            }
            qx.post_send(&[wr]).expect("send");
        }
    }
    let sent = poll_n(&mut x.cq, total);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "{sent:?}"
    );
    let got: Vec<WorkCompletion> = poll_n(&mut y.cq, total);
    let off = if t == QpType::Ud { 40 } else { 0 };
    let mut used = vec![false; total];
    let mut per = vec![0usize; n];
    for c in &got {
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{c:?}"
        );
        let j = ys
            .iter()
            .position(|q| q.qp_num() == c.qp_num)
            .unwrap_or_else(|| panic!("completion for unknown QP {:#x}", c.qp_num));
        assert_eq!(c.imm_data, Some(j as u32), "message arrived at its own QP");
        assert!(!used[c.wr_id as usize], "SRQ WQE {} used twice", c.wr_id);
        used[c.wr_id as usize] = true;
        assert_eq!(
            y.mr.read_array::<1>(c.wr_id as usize * SLOT + off)[0],
            j as u8,
            "WQE {} holds QP {j}'s data",
            c.wr_id
        );
        per[j] += 1;
    }
    assert!(per.iter().all(|&k| k == per_qp), "{per:?}");
    assert!(used.iter().all(|&u| u));
}

#[test]
fn rc_and_ud_qps_share_one_srq() {
    let a = NicProc::start("srq-a", "127.0.0.71", 0, &[]);
    let b = NicProc::start("srq-b", "127.0.0.72", 0, &[]);
    many_qps_on_one_srq(&a, &b, QpType::Rc, 8, 4);
    many_qps_on_one_srq(&a, &b, QpType::Ud, 8, 4);
    assert_eq!(b.stat("rx_drop_bad_icrc"), 0);
}

#[test]
fn one_srq_shared_by_64_rc_qps() {
    let a = NicProc::start("srq64-a", "127.0.0.73", 0, &[]);
    let b = NicProc::start("srq64-b", "127.0.0.74", 0, &[]);
    many_qps_on_one_srq(&a, &b, QpType::Rc, 64, 2);
}

#[test]
fn srq_limit_event_and_rnr_when_empty_then_recovery() {
    let a = NicProc::start("srqlim-a", "127.0.0.75", 0, &[]);
    let b = NicProc::start("srqlim-b", "127.0.0.76", 0, &[]);
    let mut x = host(&a, 4096, 64);
    let mut y = host(&b, 8 * SLOT, 64);
    let mut srq =
        y.pd.create_srq(&SrqInitAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    assert_eq!(srq.query().expect("query").srq_limit, 0);
    let mut qx = qp(&x, QpType::Rc, None);
    let mut qy = qp(&y, QpType::Rc, Some(&srq));
    connect(&mut qx, &mut qy, &a, &b);
    post_srq(&mut srq, &y.mr, 0..4);
    srq.modify_limit(3).expect("arm");
    assert_eq!(srq.query().expect("query").srq_limit, 3);
    let ss = [x.mr.sge(0, 100)];
    let send = |qx: &mut QueuePair, id: u64| {
        qx.post_send(&[SendWr::new(id, WrOpcode::Send, &ss).signaled()])
            .expect("send");
    };
    // 4 → 3 WQEs: not below the limit.
    send(&mut qx, 1);
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut y.cq).wr_id, 0);
    assert!(y.ctx.poll_async_events().expect("events").is_empty());
    // 3 → 2: below. The event is raised once and the SRQ disarmed.
    send(&mut qx, 2);
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut y.cq).wr_id, 1);
    assert_eq!(
        y.ctx.poll_async_events().expect("events"),
        vec![AsyncEvent::SrqLimitReached { srq: srq.handle() }]
    );
    assert_eq!(srq.query().expect("query").srq_limit, 0);
    send(&mut qx, 3);
    send(&mut qx, 4);
    poll_n(&mut x.cq, 2);
    poll_n(&mut y.cq, 2);
    assert!(y.ctx.poll_async_events().expect("events").is_empty());
    // Empty SRQ: the RC responder answers RNR NAKs until a WQE is posted.
    let before = b.stat("qp_nak_rnr_sent");
    send(&mut qx, 5);
    let deadline = std::time::Instant::now() + WAIT;
    while b.stat("qp_nak_rnr_sent") < before + 2 {
        assert!(std::time::Instant::now() < deadline, "no RNR NAKs");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(x.cq.poll(&mut wc).expect("poll"), 0, "the SEND waits");
    post_srq(&mut srq, &y.mr, 7..8);
    let s = poll_one(&mut x.cq);
    assert_eq!((s.wr_id, s.status), (5, WcStatus::Success));
    let r = poll_one(&mut y.cq);
    assert_eq!((r.wr_id, r.byte_len, r.qp_num), (7, 100, qy.qp_num()));
    assert_eq!(qy.state(), QpState::Rts);
    // A QP on an SRQ moved to ERR: "last WQE reached", once; the SRQ keeps its WQEs.
    post_srq(&mut srq, &y.mr, 6..7);
    qy.modify(&QpAttr {
        qp_state: Some(QpState::Err),
        ..QpAttr::default()
    })
    .expect("to ERR");
    assert_eq!(
        y.ctx.poll_async_events().expect("events"),
        vec![AsyncEvent::QpLastWqeReached { qpn: qy.qp_num() }]
    );
    assert!(y.ctx.poll_async_events().expect("events").is_empty());
    assert_eq!(
        y.cq.poll(&mut wc).expect("poll"),
        0,
        "no SRQ WQE was flushed"
    );
}
