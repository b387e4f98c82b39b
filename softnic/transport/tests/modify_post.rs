//! The modify table and the post paths, without traffic.

use softnic_transport::memory::Access;
use softnic_transport::qp::{
    AttrMask, ModifyError, PostError, Qp, QpAttr, QpCaps, QpState, QpType, TransitionError,
};
use softnic_transport::time::Instant;
use softnic_transport::wr::{Queue, RecvWr, SendOp, SendWr, Sge, WcStatus, MAX_SGE};

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_sge: 4,
        max_inline: 64,
    }
}

fn init_attr() -> QpAttr {
    QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        access: Some(Access::ALL),
        ..Default::default()
    }
}

fn rtr_attr() -> QpAttr {
    QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(1024),
        dest_qpn: Some(0x12),
        rq_psn: Some(7),
        remote: Some("127.0.0.2:4791".parse().unwrap()),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(12),
        ..Default::default()
    }
}

fn rts_attr() -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(9),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..Default::default()
    }
}

fn send(wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send,
        sges: [Sge::default(); MAX_SGE],
        num_sge: 0,
        inline: None,
        remote_addr: 0,
        rkey: 0,
        signaled: true,
        solicited: false,
        ud: None,
        xrc_srqn: 0,
    }
}

fn recv(wr_id: u64) -> RecvWr {
    RecvWr {
        wr_id,
        sges: [Sge::default(); MAX_SGE],
        num_sge: 0,
    }
}

#[test]
fn rc_reset_init_rtr_rts() {
    let now = Instant::ZERO;
    let mut qp = Qp::new(0x11, QpType::Rc, 1, caps());
    assert_eq!(qp.state(), QpState::Reset);
    assert_eq!(
        qp.modify(now, &rts_attr()),
        Err(ModifyError::Transition(TransitionError::Illegal {
            from: QpState::Reset,
            to: QpState::Rts
        }))
    );
    qp.modify(now, &init_attr()).unwrap();
    let mut bad = rtr_attr();
    bad.dest_qpn = None;
    assert_eq!(
        qp.modify(now, &bad),
        Err(ModifyError::Transition(TransitionError::Missing {
            from: QpState::Init,
            to: QpState::Rtr,
            missing: AttrMask::DEST_QPN
        }))
    );
    let mut bad = rtr_attr();
    bad.path_mtu = Some(1000);
    assert!(matches!(
        qp.modify(now, &bad),
        Err(ModifyError::InvalidValue {
            attr: "path_mtu",
            ..
        })
    ));
    assert_eq!(
        qp.state(),
        QpState::Init,
        "a refused modify changes nothing"
    );
    qp.modify(now, &rtr_attr()).unwrap();
    let mut extra = rts_attr();
    extra.path_mtu = Some(1024);
    assert!(matches!(
        qp.modify(now, &extra),
        Err(ModifyError::Transition(TransitionError::NotAllowed { .. }))
    ));
    qp.modify(now, &rts_attr()).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    assert_eq!(qp.attrs().rq_psn, 7);
    assert_eq!(qp.attrs().sq_psn, 9);
    // RTS -> RTS with an optional attribute.
    qp.modify(
        now,
        &QpAttr {
            min_rnr_timer: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qp.attrs().min_rnr_timer, 3);
}

#[test]
fn posts_follow_the_state() {
    let now = Instant::ZERO;
    let mut qp = Qp::new(0x11, QpType::Rc, 1, caps());
    assert_eq!(
        qp.post_recv(recv(1)),
        Err(PostError::InvalidState(QpState::Reset))
    );
    qp.modify(now, &init_attr()).unwrap();
    qp.post_recv(recv(1)).unwrap();
    assert_eq!(
        qp.post_send(send(1)),
        Err(PostError::InvalidState(QpState::Init))
    );
    qp.modify(now, &rtr_attr()).unwrap();
    qp.modify(now, &rts_attr()).unwrap();
    for i in 0..4 {
        qp.post_send(send(i)).unwrap();
    }
    assert_eq!(qp.post_send(send(9)), Err(PostError::QueueFull));
    assert_eq!(qp.send_queue_len(), 4);
    let mut ud = send(5);
    ud.ud = Some(softnic_transport::wr::UdDest {
        qpn: 1,
        qkey: 1,
        addr: "127.0.0.1:4791".parse().unwrap(),
        traffic_class: 0,
    });
    let mut uc = Qp::new(0x13, QpType::Uc, 1, caps());
    uc.modify(now, &init_attr()).unwrap();
    let mut r = rtr_attr();
    r.max_dest_rd_atomic = None;
    r.min_rnr_timer = None;
    uc.modify(now, &r).unwrap();
    uc.modify(
        now,
        &QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let mut read = send(6);
    read.op = SendOp::Read;
    assert_eq!(uc.post_send(read), Err(PostError::UnsupportedOp));
    assert_eq!(uc.post_send(ud), Err(PostError::BadUdDest));
}

#[test]
fn error_flushes_in_order_and_reset_forgets() {
    let now = Instant::ZERO;
    let mut qp = Qp::new(0x11, QpType::Rc, 1, caps());
    qp.modify(now, &init_attr()).unwrap();
    qp.post_recv(recv(10)).unwrap();
    qp.post_recv(recv(11)).unwrap();
    qp.modify(now, &rtr_attr()).unwrap();
    qp.modify(now, &rts_attr()).unwrap();
    let mut unsignaled = send(2);
    unsignaled.signaled = false;
    qp.post_send(send(1)).unwrap();
    qp.post_send(unsignaled).unwrap();
    qp.modify(
        now,
        &QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        },
    )
    .unwrap();
    let got: Vec<_> = std::iter::from_fn(|| qp.poll_completion())
        .map(|c| (c.queue, c.wr_id, c.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (Queue::Send, 1, WcStatus::WrFlushErr),
            (Queue::Send, 2, WcStatus::WrFlushErr),
            (Queue::Recv, 10, WcStatus::WrFlushErr),
            (Queue::Recv, 11, WcStatus::WrFlushErr),
        ]
    );
    // Posting in Err flushes at once.
    qp.post_send(send(3)).unwrap();
    qp.post_recv(recv(12)).unwrap();
    assert_eq!(qp.poll_completion().map(|c| c.wr_id), Some(3));
    assert_eq!(qp.poll_completion().map(|c| c.wr_id), Some(12));
    qp.modify(
        now,
        &QpAttr {
            state: Some(QpState::Reset),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    assert_eq!(qp.send_queue_len() + qp.recv_queue_len(), 0);
    assert!(qp.poll_completion().is_none());
}
