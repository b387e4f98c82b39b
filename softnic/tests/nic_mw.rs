//! Memory windows between two NICs (IBTA 10.6.7): a peer reaches exactly the window's
//! bytes with its R_Key and rights, and nothing once the window is rebound, unbound,
//! invalidated or deallocated — each refused access is a Remote Access Error NAK,
//! completed at the requester as `IBV_WC_REM_ACCESS_ERR`.

mod nic_support;

use nic_support::*;
use verbs_api::{
    MemoryWindow, Mtu, MwBindInfo, QpType, QueuePair, SendWr, WcOpcode, WcStatus, WrOpcode,
};

const REMOTE_WRITE: u32 = 2;
const REMOTE_READ: u32 = 4;

/// x's window over bytes [256, 512) of x's region.
fn window_info(x: &Side, access: u32) -> MwBindInfo {
    MwBindInfo {
        mr: x.mr.handle(),
        addr: x.mr.addr() + 256,
        len: 256,
        access,
    }
}

/// y writes 8 bytes of `seed` at `addr` with `rkey`; returns the completion status.
fn write(y: &mut Side, addr: u64, rkey: u32, seed: u8) -> WcStatus {
    y.mr.write(0, &pattern(8, seed));
    let sge = [y.mr.sge(0, 8)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    y.qp.post_send(&[SendWr::new(1, op, &sge).signaled()])
        .expect("post write");
    poll_one(&mut y.cq).status
}

fn bound_type1(a: &NicProc, b: &NicProc, access: u32) -> (Side, Side, MemoryWindow, u32) {
    let (mut x, y) = rc_pair(a, b, Mtu::Mtu1024, 4096, 8);
    let mut mw = x.pd.alloc_mw(1).expect("alloc_mw");
    let info = window_info(&x, access);
    let rkey = x.qp.bind_mw(7, true, &mut mw, &info).expect("bind");
    let wc = poll_one(&mut x.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), rkey);
    (x, y, mw, rkey)
}

#[test]
fn type1_window_reaches_its_range_only() {
    let a = NicProc::start("mw1-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw1-b", "127.0.0.1", 0, &[]);
    let (x, mut y, _mw, rkey) = bound_type1(&a, &b, REMOTE_WRITE);
    let base = x.mr.addr() + 256;
    assert_eq!(write(&mut y, base, rkey, 1), WcStatus::Success);
    assert_eq!(write(&mut y, base + 248, rkey, 2), WcStatus::Success);
    assert_eq!(x.mr.read_vec(256, 8), pattern(8, 1));
    assert_eq!(x.mr.read_vec(504, 8), pattern(8, 2));
    // One byte past the window (still inside the region): refused.
    assert_eq!(write(&mut y, base + 249, rkey, 3), WcStatus::RemAccessErr);
    assert_eq!(
        x.mr.read_vec(505, 8)[7],
        0,
        "nothing written past the window"
    );
}

#[test]
fn type1_window_checks_rights_and_revocation() {
    let a = NicProc::start("mw1r-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw1r-b", "127.0.0.1", 0, &[]);
    // Read-only window: a write is refused.
    let (x, mut y, _mw, rkey) = bound_type1(&a, &b, REMOTE_READ);
    assert_eq!(
        write(&mut y, x.mr.addr() + 256, rkey, 1),
        WcStatus::RemAccessErr
    );
    drop((x, y));
    // Rebinding with length 0 (the next R_Key) unbinds: neither key works.
    let (mut x, mut y, mut mw, rkey) = bound_type1(&a, &b, REMOTE_WRITE);
    let unbind = MwBindInfo {
        len: 0,
        access: 0,
        ..window_info(&x, 0)
    };
    let k2 = x.qp.bind_mw(8, true, &mut mw, &unbind).expect("unbind");
    assert_ne!(k2, rkey);
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    assert_eq!(
        write(&mut y, x.mr.addr() + 256, k2, 1),
        WcStatus::RemAccessErr
    );
    drop((x, y, mw));
    // Deallocation revokes.
    let (x, mut y, mw, rkey) = bound_type1(&a, &b, REMOTE_WRITE);
    drop(mw);
    assert_eq!(
        write(&mut y, x.mr.addr() + 256, rkey, 1),
        WcStatus::RemAccessErr
    );
}

/// An RC pair whose x side has a type 2 window bound by an `IBV_WR_BIND_MW` WR.
fn bound_type2(a: &NicProc, b: &NicProc) -> (Side, Side, MemoryWindow, u32) {
    let (mut x, y) = rc_pair(a, b, Mtu::Mtu1024, 4096, 8);
    let mw = x.pd.alloc_mw(2).expect("alloc_mw");
    let rkey = verbs_api::mw::inc_rkey(mw.rkey());
    let info = window_info(&x, REMOTE_WRITE);
    x.qp.post_bind_mw(3, true, mw.handle(), rkey, &info)
        .expect("bind");
    let wc = poll_one(&mut x.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    (x, y, mw, rkey)
}

#[test]
fn type2_window_bound_by_wr_and_invalidated_locally() {
    let a = NicProc::start("mw2-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw2-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y, mw, rkey) = bound_type2(&a, &b);
    let info = window_info(&x, REMOTE_WRITE);
    // A bound type 2 window cannot be bound again before it is invalidated.
    assert!(x
        .qp
        .post_bind_mw(4, true, mw.handle(), rkey, &info)
        .is_err());
    assert_eq!(write(&mut y, x.mr.addr() + 300, rkey, 5), WcStatus::Success);
    assert_eq!(x.mr.read_vec(300, 8), pattern(8, 5));
    x.qp.post_local_inv(9, true, rkey).expect("local inv");
    let wc = poll_one(&mut x.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(
        write(&mut y, x.mr.addr() + 300, rkey, 6),
        WcStatus::RemAccessErr
    );
    assert_eq!(x.mr.read_vec(300, 8), pattern(8, 5));
}

#[test]
fn type2_window_invalidated_by_the_peers_send_with_invalidate() {
    let a = NicProc::start("mw2i-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw2i-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y, _mw, rkey) = bound_type2(&a, &b);
    assert_eq!(write(&mut y, x.mr.addr() + 256, rkey, 1), WcStatus::Success);
    // y sends 16 bytes with Invalidate(rkey): x's receive completes WITH_INV.
    let rsge = [x.mr.sge(1024, 64)];
    x.qp.post_recv(&[verbs_api::RecvWr::new(40, &rsge)])
        .expect("recv");
    y.mr.write(0, &pattern(16, 9));
    let sge = [y.mr.sge(0, 16)];
    y.qp.post_send(&[SendWr::new(41, WrOpcode::SendWithInv(rkey), &sge).signaled()])
        .expect("send with inv");
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    let wc = poll_one(&mut x.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (40, WcStatus::Success, WcOpcode::Recv, 16)
    );
    assert_eq!(
        wc.wc_flags & verbs_api::abi::slots::wc_flags::WITH_INV,
        verbs_api::abi::slots::wc_flags::WITH_INV
    );
    assert_eq!(wc.imm_data, Some(rkey), "the invalidated R_Key");
    assert_eq!(x.mr.read_vec(1024, 16), pattern(16, 9));
    assert_eq!(
        write(&mut y, x.mr.addr() + 256, rkey, 2),
        WcStatus::RemAccessErr
    );
}

/// A second connection of x's PD: a new RC QP of x (its PD and CQ) connected with a
/// new side on `b`.
fn second_connection(a: &NicProc, b: &NicProc, x: &Side) -> (QueuePair, Side) {
    let mut qp = qp_on(&x.pd, &x.cq, QpType::Rc, 8);
    let mut z = side(b, 4096, 8);
    connect_rc(
        (&mut qp, a),
        (&mut z.qp, b),
        Mtu::Mtu1024,
        (0x3000, 0x4000),
        14,
    );
    (qp, z)
}

/// IBTA type 2B (as rxe): a type 2 window answers only the QP it was bound on. The peer
/// of another connection of the same PD that learns its R_Key reaches nothing with it,
/// and cannot invalidate it with a SEND with Invalidate; the window's own peer still
/// can.
#[test]
fn a_type2_window_is_no_key_on_another_connection_of_its_pd() {
    let a = NicProc::start("mw2b-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw2b-b", "127.0.0.1", 0, &[]);
    let (x, mut y, _mw, rkey) = bound_type2(&a, &b);
    let (_qp2, mut z) = second_connection(&a, &b, &x);
    assert_eq!(
        write(&mut z, x.mr.addr() + 256, rkey, 1),
        WcStatus::RemAccessErr
    );
    assert_eq!(x.mr.read_vec(256, 8), vec![0; 8], "nothing written");
    let (mut qp3, mut w) = second_connection(&a, &b, &x);
    let rsge = [x.mr.sge(1024, 64)];
    qp3.post_recv(&[verbs_api::RecvWr::new(50, &rsge)])
        .expect("recv");
    let sge = [w.mr.sge(0, 8)];
    w.qp.post_send(&[SendWr::new(51, WrOpcode::SendWithInv(rkey), &sge).signaled()])
        .expect("send with inv");
    assert_eq!(poll_one(&mut w.cq).status, WcStatus::RemAccessErr);
    // Still bound, for the connection it was bound on.
    assert_eq!(write(&mut y, x.mr.addr() + 256, rkey, 2), WcStatus::Success);
    assert_eq!(x.mr.read_vec(256, 8), pattern(8, 2));
}

#[test]
fn send_with_invalidate_of_an_unknown_rkey_is_a_remote_access_error() {
    let a = NicProc::start("mw2u-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mw2u-b", "127.0.0.1", 0, &[]);
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let rsge = [x.mr.sge(0, 64)];
    x.qp.post_recv(&[verbs_api::RecvWr::new(1, &rsge)])
        .expect("recv");
    let sge = [y.mr.sge(0, 8)];
    // x's region R_Key is not a window's: nothing to invalidate.
    let op = WrOpcode::SendWithInv(x.mr.rkey());
    y.qp.post_send(&[SendWr::new(2, op, &sge).signaled()])
        .expect("post");
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::RemAccessErr);
}

#[test]
fn a_bind_completes_after_the_work_requests_posted_before_it() {
    let a = NicProc::start("mwo-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mwo-b", "127.0.0.1", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let mut mw = x.pd.alloc_mw(1).expect("alloc_mw");
    let info = window_info(&x, REMOTE_WRITE);
    for round in 0..20u64 {
        // Four WRITEs to y, then the bind: the bind waits for their ACKs.
        let sge = [x.mr.sge(0, 64)];
        for k in 0..4 {
            let op = WrOpcode::RdmaWrite {
                remote_addr: y.mr.addr(),
                rkey: y.mr.rkey(),
            };
            x.qp.post_send(&[SendWr::new(round * 10 + k, op, &sge).signaled()])
                .expect("write");
        }
        x.qp.bind_mw(round * 10 + 9, true, &mut mw, &info)
            .expect("bind");
        let ids: Vec<u64> = poll_n(&mut x.cq, 5).iter().map(|w| w.wr_id).collect();
        let want: Vec<u64> = [0, 1, 2, 3, 9].iter().map(|k| round * 10 + k).collect();
        assert_eq!(ids, want, "completions in posting order");
    }
}

#[test]
fn a_region_without_mw_bind_takes_no_window() {
    let a = NicProc::start("mwb-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("mwb-b", "127.0.0.1", 0, &[]);
    let (mut x, _y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 8);
    let plain =
        x.pd.alloc_mr(4096, verbs_api::AccessFlags::LOCAL_WRITE)
            .expect("mr");
    let mut mw = x.pd.alloc_mw(1).expect("alloc_mw");
    let info = MwBindInfo {
        mr: plain.handle(),
        addr: plain.addr(),
        len: 64,
        access: REMOTE_WRITE,
    };
    let e = x.qp.bind_mw(1, true, &mut mw, &info).unwrap_err();
    assert!(e.to_string().contains("MW_BIND"), "{e}");
}
