//! XRC through verbs-api's own Rust API between two NICs (the C ABI's test is
//! `tests/ibverbs/xrc.c`): domains opened from a file, XRC SRQs, XRC send and receive
//! QPs taken to RTS by `to_init`/`to_rtr`/`to_rts` (which must pick each type's
//! attributes), SENDs and an RDMA WRITE naming the remote SRQ, and the refusals of
//! the API: a send without an SRQ number, receives posted to XRC QPs, sends posted to
//! a receive QP, `Xrcd::close` while in use, `O_EXCL` on a file with a domain.

mod nic_support;

use std::os::fd::AsFd;

use nic_support::*;
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Device, Error, MemoryRegion, Mtu, PostError, QpCap,
    QpType, QueuePair, RecvWr, SendWr, SharedReceiveQueue, SrqInitAttr, WcOpcode, WcStatus,
    WrOpcode, XrcSendQpInitAttr, Xrcd, XrcdFlags,
};

/// One side: a context with a PD-less XRC receive QP in its domain, an XRC SRQ of the
/// domain (completing to `cq`) and an XRC send QP.
struct Host {
    ctx: Context,
    mr: MemoryRegion,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    send: QueuePair,
    recv: QueuePair,
    xrcd: Xrcd,
    file: std::fs::File,
    path: std::path::PathBuf,
}

fn host(nic: &NicProc) -> Host {
    let ctx = Device::open(&nic.name).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let mr = pd.alloc_mr(8192, AccessFlags::ALL).expect("mr");
    let cq = ctx.create_cq(64).expect("cq");
    let path =
        std::env::temp_dir().join(format!("softnic-vxrc-{}-{}", nic.name, std::process::id()));
    let file = std::fs::File::create(&path).expect("domain file");
    let create = XrcdFlags {
        create: true,
        exclusive: true,
    };
    let xrcd = ctx
        .open_xrcd(Some(file.as_fd()), create)
        .expect("open_xrcd");
    let srq = pd
        .create_xrc_srq(
            &xrcd,
            &cq,
            &SrqInitAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("XRC SRQ");
    assert!(srq.is_xrc() && srq.srq_num() != 0 && srq.srq_num() < 1 << 24);
    let send = pd
        .create_xrc_send_qp(&XrcSendQpInitAttr {
            send_cq: &cq,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .expect("XRC send QP");
    assert_eq!((send.cap().max_recv_wr, send.cap().max_recv_sge), (0, 0));
    let recv = xrcd.create_recv_qp().expect("XRC receive QP");
    assert_eq!(
        (send.qp_type(), recv.qp_type()),
        (QpType::XrcSend, QpType::XrcRecv)
    );
    Host {
        ctx,
        mr,
        cq,
        srq,
        send,
        recv,
        xrcd,
        file,
        path,
    }
}

/// `x`'s send QP to `y`'s receive QP, through the helpers that pick each type's
/// required attributes.
fn connect(x: &mut Host, y: &mut Host, a: &NicProc, b: &NicProc) {
    x.send.to_init(AccessFlags::NONE).expect("send init");
    y.recv.to_init(AccessFlags::ALL).expect("recv init");
    x.send
        .to_rtr(&b.endpoint(y.recv.qp_num(), 5), Mtu::Mtu1024)
        .expect("send rtr");
    y.recv
        .to_rtr(&a.endpoint(x.send.qp_num(), 9), Mtu::Mtu1024)
        .expect("recv rtr");
    x.send.to_rts(9).expect("send rts");
    y.recv.to_rts(5).expect("recv rts");
}

/// `from` SENDs `len` bytes of `seed` to `to`'s SRQ; both completions are checked.
fn send(from: &mut Host, to: &mut Host, wr_id: u64, len: usize, seed: u8) {
    let data = pattern(len, seed);
    from.mr.write(0, &data);
    let rs = [to.mr.sge(4096, len as u32)];
    to.srq
        .post_recv(&[RecvWr::new(wr_id, &rs)])
        .expect("post srq");
    let ss = [from.mr.sge(0, len as u32)];
    let wr = SendWr::new(wr_id, WrOpcode::Send, &ss)
        .signaled()
        .to_xrc_srq(to.srq.srq_num());
    from.send.post_send(&[wr]).expect("post XRC send");
    let s = poll_one(&mut from.cq);
    assert_eq!(
        (s.status, s.opcode, s.qp_num, s.wr_id),
        (WcStatus::Success, WcOpcode::Send, from.send.qp_num(), wr_id)
    );
    let r = poll_one(&mut to.cq);
    assert_eq!(
        (r.status, r.opcode, r.byte_len, r.wr_id),
        (WcStatus::Success, WcOpcode::Recv, len as u32, wr_id)
    );
    assert_eq!(
        r.qp_num,
        to.recv.qp_num(),
        "the receive names the XRC receive QP"
    );
    assert_eq!(to.mr.read_vec(4096, len), data);
}

#[test]
fn xrc_through_verbs_api() {
    let (a, b) = NicProc::pair("vxrc");
    let (mut x, mut y) = (host(&a), host(&b));
    connect(&mut x, &mut y, &a, &b);
    connect(&mut y, &mut x, &b, &a);
    send(&mut x, &mut y, 1, 1000, 3);
    send(&mut y, &mut x, 2, 64, 7);

    // An RDMA WRITE into y's region, with the key of the SRQ's PD.
    let data = pattern(512, 11);
    x.mr.write(1024, &data);
    let ws = [x.mr.sge(1024, 512)];
    let write = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr() + 2048,
        rkey: y.mr.rkey(),
    };
    let wr = SendWr::new(3, write, &ws)
        .signaled()
        .to_xrc_srq(y.srq.srq_num());
    x.send.post_send(&[wr]).expect("post XRC WRITE");
    let wc = poll_one(&mut x.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(y.mr.read_vec(2048, 512), data);

    // The API's refusals, none of which posts anything.
    let no_srqn = SendWr::new(4, WrOpcode::Send, &ws);
    match x.send.post_send(&[no_srqn]) {
        Err(Error::Post {
            index: 0,
            wr_id: 4,
            reason: PostError::Unsupported(_),
        }) => {}
        other => panic!("a send without the SRQ number: {other:?}"),
    }
    let rs = [x.mr.sge(0, 8)];
    for q in [&mut x.send, &mut x.recv] {
        assert!(
            matches!(
                q.post_recv(&[RecvWr::new(5, &rs)]),
                Err(Error::Post { index: 0, .. })
            ),
            "post_recv on a {:?} QP",
            q.qp_type()
        );
    }
    let to_srq = SendWr::new(6, WrOpcode::Send, &ws).to_xrc_srq(y.srq.srq_num());
    assert!(matches!(
        x.recv.post_send(&[to_srq]),
        Err(Error::Post { index: 0, .. })
    ));

    // O_EXCL on a file that has a domain; a plain open of it shares it.
    let excl = XrcdFlags {
        create: true,
        exclusive: true,
    };
    assert!(matches!(
        x.ctx.open_xrcd(Some(x.file.as_fd()), excl),
        Err(Error::Nic {
            code: verbs_api::abi::control::ErrorCode::InvalidArgument,
            ..
        })
    ));
    let again = x
        .ctx
        .open_xrcd(Some(x.file.as_fd()), XrcdFlags::default())
        .expect("a second open of the file");
    assert_eq!(again.file(), x.xrcd.file());
    again
        .close()
        .map_err(|(_, e)| e)
        .expect("close the second open");

    // Closing an open its SRQ and QP use is refused, and the open stays usable.
    let Host {
        ctx,
        srq,
        recv,
        xrcd,
        path,
        ..
    } = x;
    let (xrcd, e) = xrcd.close().expect_err("close while in use");
    assert!(matches!(e, Error::Busy(_)), "{e}");
    drop((srq, recv));
    xrcd.close().map_err(|(_, e)| e).expect("close once unused");
    // The file has no domain any more: opening it without O_CREAT is refused.
    let file = std::fs::File::open(&path).expect("reopen");
    assert!(ctx
        .open_xrcd(Some(file.as_fd()), XrcdFlags::default())
        .is_err());
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&y.path);
}
