//! Lossless RC: every operation at sizes 0, 1, MTU−1, MTU, MTU+1 and 1 MiB at every
//! path MTU, with the bytes and every completion field checked.

mod common;

use common::*;
use softnic_transport::qp::{QpState, PATH_MTUS};
use softnic_transport::testing::{Pair, Verdict};
use softnic_transport::wr::{Inline, Queue, SendOp, WcOpcode, WcStatus};
use wire::{Opcode, Operation, Position};

const STEPS: u64 = 1_000_000;

/// (from A?, opcode, PSN, AckReq, AETH MSN) per packet.
type Log = std::rc::Rc<std::cell::RefCell<Vec<(bool, Opcode, u32, bool, Option<u32>)>>>;

fn send_case(mtu: u32, size: usize, imm: Option<u32>) {
    let (mut p, a, b) = pair(rc(mtu), size as u64 ^ u64::from(mtu));
    let data = pattern(size as u64 + 1, size);
    fill(&mut p.a, &a, 0, &data);
    // Receive buffer in two SGEs, to cross an SGE boundary mid-packet.
    let half = size / 2 + 3;
    p.b.qp
        .post_recv(recv(
            77,
            &[b.sge(0, half), b.sge(MIB + 4096, size + 8 - half.min(size))],
        ))
        .unwrap();
    let op = match imm {
        Some(i) => SendOp::SendWithImm(i),
        None => SendOp::Send,
    };
    p.a.qp.post_send(wr(5, op, &[a.sge(0, size)])).unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 1, "{sc:?}");
    assert_eq!(
        (sc[0].queue, sc[0].wr_id, sc[0].status, sc[0].opcode),
        (Queue::Send, 5, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(sc[0].byte_len as usize, size);
    let rc = drain(&mut p.b);
    assert_eq!(rc.len(), 1, "{rc:?}");
    let c = rc[0];
    assert_eq!(
        (
            c.queue,
            c.wr_id,
            c.status,
            c.opcode,
            c.byte_len as usize,
            c.imm
        ),
        (
            Queue::Recv,
            77,
            WcStatus::Success,
            WcOpcode::Recv,
            size,
            imm
        )
    );
    let first = half.min(size);
    let mut got = read(&p.b, &b, 0, first);
    got.extend(read(&p.b, &b, MIB + 4096, size - first));
    assert!(
        got == data,
        "SEND {size} bytes at MTU {mtu}: payload differs"
    );
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

fn write_case(mtu: u32, size: usize, imm: Option<u32>) {
    let (mut p, a, b) = pair(rc(mtu), 3);
    let data = pattern(size as u64 + 2, size);
    fill(&mut p.a, &a, 0, &data);
    if imm.is_some() {
        p.b.qp.post_recv(recv(88, &[])).unwrap();
    }
    let op = match imm {
        Some(i) => SendOp::WriteWithImm(i),
        None => SendOp::Write,
    };
    // Gather from two SGEs.
    let cut = size / 3;
    let sges = [a.sge(0, cut), a.sge(cut, size - cut)];
    p.a.qp.post_send(rdma(6, op, &sges, &b, 16)).unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 1, "{sc:?}");
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (6, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert!(read(&p.b, &b, 16, size) == data, "WRITE {size}@{mtu}");
    assert_eq!(
        read(&p.b, &b, 0, 16),
        vec![0; 16],
        "bytes before the target"
    );
    assert_eq!(read(&p.b, &b, 16 + size, 16), vec![0; 16], "bytes after");
    let rc = drain(&mut p.b);
    match imm {
        Some(i) => {
            assert_eq!(rc.len(), 1);
            assert_eq!(
                (rc[0].wr_id, rc[0].status, rc[0].opcode, rc[0].imm),
                (88, WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(i))
            );
            assert_eq!(rc[0].byte_len as usize, size);
        }
        None => assert!(rc.is_empty(), "{rc:?}"),
    }
}

fn read_case(mtu: u32, size: usize) {
    let (mut p, a, b) = pair(rc(mtu), 4);
    let data = pattern(size as u64 + 3, size);
    fill(&mut p.b, &b, 8, &data);
    let cut = size.saturating_sub(5);
    let sges = [a.sge(32, cut), a.sge(MIB + 4096, size - cut)];
    p.a.qp
        .post_send(rdma(7, SendOp::Read, &sges, &b, 8))
        .unwrap();
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 1, "{sc:?}");
    assert_eq!(
        (
            sc[0].wr_id,
            sc[0].status,
            sc[0].opcode,
            sc[0].byte_len as usize
        ),
        (7, WcStatus::Success, WcOpcode::RdmaRead, size)
    );
    let mut got = read(&p.a, &a, 32, cut);
    got.extend(read(&p.a, &a, MIB + 4096, size - cut));
    assert!(got == data, "READ {size}@{mtu}");
    assert!(drain(&mut p.b).is_empty());
}

#[test]
fn send_every_size_every_mtu() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            send_case(mtu, size, None);
        }
    }
}

#[test]
fn send_with_imm_every_size_every_mtu() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            send_case(mtu, size, Some(0xDEAD_0000 | size as u32 & 0xFFFF));
        }
    }
}

#[test]
fn write_every_size_every_mtu() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            write_case(mtu, size, None);
        }
    }
}

#[test]
fn write_with_imm_every_size_every_mtu() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            write_case(mtu, size, Some(0x1234_5678 ^ size as u32));
        }
    }
}

#[test]
fn read_every_size_every_mtu() {
    for mtu in PATH_MTUS {
        for size in sizes(mtu) {
            read_case(mtu, size);
        }
    }
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let (mut p, a, b) = pair(rc(1024), 5);
    p.b.mem.bytes_mut(b.key)[64..72].copy_from_slice(&40u64.to_ne_bytes());
    let ops = [
        (1, SendOp::FetchAdd { add: 2 }, 40u64, WcOpcode::FetchAdd),
        (
            2,
            SendOp::CompareSwap {
                compare: 42,
                swap: 1000,
            },
            42,
            WcOpcode::CompSwap,
        ),
        (
            3,
            SendOp::CompareSwap {
                compare: 42,
                swap: 5,
            },
            1000,
            WcOpcode::CompSwap,
        ),
        (
            4,
            SendOp::FetchAdd { add: u64::MAX },
            1000,
            WcOpcode::FetchAdd,
        ),
    ];
    for (i, (id, op, _, _)) in ops.iter().enumerate() {
        p.a.qp
            .post_send(rdma(*id, *op, &[a.sge(8 * i, 8)], &b, 64))
            .unwrap();
    }
    p.drive(STEPS);
    let sc = drain(&mut p.a);
    assert_eq!(sc.len(), 4, "{sc:?}");
    for (i, (id, _, orig, opc)) in ops.iter().enumerate() {
        assert_eq!(
            (sc[i].wr_id, sc[i].status, sc[i].opcode, sc[i].byte_len),
            (*id, WcStatus::Success, *opc, 8)
        );
        let got = u64::from_ne_bytes(read(&p.a, &a, 8 * i, 8).try_into().unwrap());
        assert_eq!(got, *orig, "original value of op {id}");
    }
    let fin = u64::from_ne_bytes(read(&p.b, &b, 64, 8).try_into().unwrap());
    assert_eq!(fin, 999);
}

/// Records (from-A?, opcode, psn, ack_req, aeth msn) of every packet.
fn trace(p: &mut Pair) -> Log {
    let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let l2 = log.clone();
    p.filter = Some(Box::new(move |s| {
        l2.borrow_mut().push((
            s.from == softnic_transport::testing::Side::A,
            s.repr.bth.opcode,
            s.repr.bth.psn.value(),
            s.repr.bth.ack_req,
            s.repr.aeth.map(|a| a.msn.value()),
        ));
        Verdict::Pass
    }));
    log
}

#[test]
fn segmentation_opcodes_psns_ackreq_and_msn() {
    let (mut p, a, b) = pair(rc(256), 6);
    let log = trace(&mut p);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 4096)])).unwrap();
    p.b.qp.post_recv(recv(2, &[b.sge(4096, 4096)])).unwrap();
    // 3 full packets + 1 byte: FIRST MIDDLE MIDDLE LAST.
    p.a.qp
        .post_send(wr(1, SendOp::SendWithImm(9), &[a.sge(0, 3 * 256 + 1)]))
        .unwrap();
    p.a.qp
        .post_send(wr(2, SendOp::Send, &[a.sge(0, 10)]))
        .unwrap();
    p.a.qp
        .post_send(rdma(3, SendOp::Write, &[a.sge(0, 512)], &b, 8192))
        .unwrap();
    p.a.qp
        .post_send(rdma(4, SendOp::Read, &[a.sge(0, 600)], &b, 8192))
        .unwrap();
    p.drive(STEPS);
    let log = log.borrow();
    let reqs: Vec<_> = log
        .iter()
        .filter(|e| e.0)
        .map(|e| (e.1, e.2, e.3))
        .collect();
    let f = |op, pos, imm: bool| {
        Opcode::find(
            wire::Transport::Rc,
            op,
            pos,
            imm.then_some(wire::Header::ImmDt),
        )
        .unwrap()
    };
    use Operation as O;
    use Position as P;
    assert_eq!(
        reqs,
        vec![
            (f(O::Send, P::First, false), 100, false),
            (f(O::Send, P::Middle, false), 101, false),
            (f(O::Send, P::Middle, false), 102, false),
            (f(O::Send, P::Last, true), 103, true),
            (f(O::Send, P::Only, false), 104, true),
            (f(O::Write, P::First, false), 105, false),
            (f(O::Write, P::Last, false), 106, true),
            (f(O::ReadRequest, P::Only, false), 107, true),
        ]
    );
    let resps: Vec<_> = log
        .iter()
        .filter(|e| !e.0)
        .map(|e| (e.1, e.2, e.4))
        .collect();
    let ack = Opcode::RC_ACKNOWLEDGE;
    // The three AckReqs (PSN 103, 104, 106) arrived in one burst: ACKs are cumulative,
    // so one ACK of 106 answers all three (coalescing). MSN counts completed messages;
    // READ responses First/Last carry the AETH, Middle does not.
    assert_eq!(
        resps,
        vec![
            (ack, 106, Some(3)),
            (f(O::ReadResponse, P::First, false), 107, Some(4)),
            (f(O::ReadResponse, P::Middle, false), 108, None),
            (f(O::ReadResponse, P::Last, false), 109, Some(4)),
        ]
    );
    assert_eq!(drain(&mut p.a).len(), 4);
}

#[test]
fn every_ackreq_is_answered_when_requests_arrive_apart() {
    let (mut p, a, b) = pair(rc(1024), 6);
    // 3 µs between a's packets: each AckReq reaches b in its own delivery batch.
    let log = trace(&mut p);
    for i in 0..3 {
        p.a.qp
            .post_send(rdma(i, SendOp::Write, &[a.sge(0, 10)], &b, 0))
            .unwrap();
        p.drive(STEPS);
    }
    let acks: Vec<_> = log
        .borrow()
        .iter()
        .filter(|e| !e.0)
        .map(|e| (e.2, e.4))
        .collect();
    assert_eq!(acks, vec![(100, Some(1)), (101, Some(2)), (102, Some(3))]);
}

#[test]
fn long_message_sets_ackreq_periodically() {
    let (mut p, a, b) = pair(rc(256), 7);
    let log = trace(&mut p);
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 200 * 256)], &b, 0))
        .unwrap();
    p.drive(STEPS);
    let log = log.borrow();
    let ackreq: Vec<u32> = log
        .iter()
        .filter(|e| e.0 && e.3)
        .map(|e| e.2 - 100)
        .collect();
    assert_eq!(ackreq, vec![63, 127, 191, 199]);
    assert_eq!(drain(&mut p.a).len(), 1);
}

#[test]
fn unsignaled_completes_silently_but_in_order() {
    let (mut p, a, b) = pair(rc(1024), 8);
    for i in 0..5 {
        let mut w = rdma(i, SendOp::Write, &[a.sge(0, 100)], &b, 0);
        w.signaled = i % 2 == 0;
        p.a.qp.post_send(w).unwrap();
    }
    p.drive(STEPS);
    let ids: Vec<u64> = drain(&mut p.a).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0, 2, 4]);
    assert_eq!(p.a.qp.send_queue_len(), 0);
}

#[test]
fn inline_send() {
    let (mut p, _a, b) = pair(rc(1024), 9);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 64)])).unwrap();
    let mut w = wr(1, SendOp::Send, &[]);
    w.inline = Inline::new(b"hello");
    p.a.qp.post_send(w).unwrap();
    p.drive(STEPS);
    assert_eq!(read(&p.b, &b, 0, 5), b"hello");
    assert_eq!(drain(&mut p.b)[0].byte_len, 5);
}

/// A message posted in answer to one just received (a ping-pong's reply) leaves before
/// the ACK of that message, and a queued ACK waits behind one request packet at most
/// (`Qp::poll_transmit`; issue 12, round-trip latency). Exactly-once as ever.
#[test]
fn a_reply_goes_ahead_of_the_ack_by_one_packet_at_most() {
    let (mut p, a, b) = pair(rc(1024), 12);
    let log = trace(&mut p);
    p.b.qp.post_recv(recv(1, &[b.sge(0, 64)])).unwrap();
    p.a.qp.post_recv(recv(2, &[a.sge(64, 64)])).unwrap();
    p.a.qp.post_recv(recv(3, &[a.sge(128, 64)])).unwrap();
    p.a.qp
        .post_send(wr(10, SendOp::Send, &[a.sge(0, 8)]))
        .unwrap();
    assert_eq!(p.transmit(), 1, "A's SEND");
    p.now = p.next_event().unwrap();
    assert_eq!(p.deliver(), 1, "B receives it and owes an ACK");
    // B answers with two messages before it transmits.
    p.b.qp
        .post_send(wr(20, SendOp::Send, &[b.sge(0, 8)]))
        .unwrap();
    p.b.qp
        .post_send(wr(21, SendOp::Send, &[b.sge(8, 8)]))
        .unwrap();
    p.transmit();
    let from_b: Vec<_> = log.borrow().iter().filter(|e| !e.0).map(|e| e.1).collect();
    let send = Opcode::find(wire::Transport::Rc, Operation::Send, Position::Only, None).unwrap();
    let ack = Opcode::find(
        wire::Transport::Rc,
        Operation::Acknowledge,
        Position::Only,
        None,
    )
    .unwrap();
    assert_eq!(from_b, vec![send, ack, send]);
    p.drive(STEPS);
    let done = |n: &mut softnic_transport::testing::Node| {
        let mut v: Vec<_> = drain(n)
            .iter()
            .map(|c| (c.wr_id, c.status == WcStatus::Success))
            .collect();
        v.sort();
        v
    };
    assert_eq!(done(&mut p.a), vec![(2, true), (3, true), (10, true)]);
    assert_eq!(done(&mut p.b), vec![(1, true), (20, true), (21, true)]);
}
