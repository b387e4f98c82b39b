//! UC between two NICs with 5 % of the sender's packets lost: a message that lost a
//! packet is dropped whole (IBTA 9.8.3, counted as `qp_drop_uc_message`), and every
//! message that completes is complete — never delivered torn.

mod nic_support;

use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{
    AccessFlags, Device, Mtu, QpCap, QpInitAttr, QpType, RecvWr, SendWr, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

const MSG: usize = 8192; // 8 packets at MTU 1024
const N: usize = 200;

#[test]
fn uc_under_loss_drops_whole_messages_never_torn_ones() {
    let a = NicProc::start(
        "ucloss-a",
        "127.0.0.77",
        0,
        &["--loss", "0.05", "--seed", "21"],
    );
    let b = NicProc::start("ucloss-b", "127.0.0.78", 0, &[]);
    let open = |nic: &NicProc| {
        let ctx = Device::open(&nic.name).expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        let mr = pd.alloc_mr(N * MSG, AccessFlags::LOCAL_WRITE).expect("mr");
        let cq = ctx.create_cq(2 * N as u32).expect("cq");
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Uc,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: N as u32,
                    max_recv_wr: N as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .expect("qp");
        (ctx, pd, mr, cq, qp)
    };
    let (_ca, _pa, mut mx, mut cqx, mut qx) = open(&a);
    let (_cb, _pb, mut my, mut cqy, mut qy) = open(&b);
    qx.to_init(AccessFlags::NONE).expect("init");
    qy.to_init(AccessFlags::NONE).expect("init");
    qx.to_rtr(&b.endpoint(qy.qp_num(), 5), Mtu::Mtu1024)
        .expect("rtr");
    qy.to_rtr(&a.endpoint(qx.qp_num(), 3), Mtu::Mtu1024)
        .expect("rtr");
    qx.to_rts(3).expect("rts");
    qy.to_rts(5).expect("rts");
    my.fill(0, my.len(), 0xEE);
    for j in 0..N {
        let s = [my.sge(j * MSG, MSG as u32)];
        qy.post_recv(&[RecvWr::new(j as u64, &s)]).expect("recv");
    }
    for k in 0..N {
        mx.write(k * MSG, &pattern(MSG, k as u8));
        let s = [mx.sge(k * MSG, MSG as u32)];
        qx.post_send(&[SendWr::new(k as u64, WrOpcode::SendWithImm(k as u32), &s).signaled()])
            .expect("send");
    }
    let sent = poll_n(&mut cqx, N);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "the UC sender cannot know"
    );
    // Receive until quiet (bounded).
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    let mut last = Instant::now();
    let mut wc = [WorkCompletion::default(); 16];
    while Instant::now() < deadline && last.elapsed() < Duration::from_millis(500) {
        let n = cqy.poll(&mut wc).expect("poll");
        got.extend_from_slice(&wc[..n]);
        if n > 0 {
            last = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let dropped = b.stat("qp_drop_uc_message");
    assert!(a.stat("fault_dropped") > 0, "loss was injected");
    assert!(dropped > 0, "some messages lost a packet");
    assert!(got.len() < N, "{} of {N} completed", got.len());
    assert!(
        got.len() > N / 4,
        "most messages get through: {}",
        got.len()
    );
    let mut seen = [false; N];
    for c in &got {
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{c:?}"
        );
        assert_eq!(c.byte_len as usize, MSG, "{c:?}");
        let k = c.imm_data.expect("immediate") as usize;
        assert!(k < N && !seen[k], "message {k} delivered once");
        seen[k] = true;
        let j = c.wr_id as usize;
        assert!(
            my.read_vec(j * MSG, MSG) == pattern(MSG, k as u8)[..],
            "receive {j} holds message {k} whole"
        );
    }
    // Receives were consumed in order, one per delivered message: the dropped
    // messages' WQEs served the next ones.
    let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..got.len() as u64).collect::<Vec<_>>());
    eprintln!(
        "UC at 5% loss: {} of {N} messages of {MSG} bytes delivered whole, {dropped} dropped whole",
        got.len()
    );
}
