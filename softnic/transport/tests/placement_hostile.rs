//! The receiver's single pass under hostile and corrupted input (`qp::placement`): a
//! packet is written before its ICRC is checked only where the QP's own state fixes
//! the destination, so no unverified field may steer the bytes anywhere else.
//!
//! Each packet of a real message is offered to the receiving QP, before it is handled,
//! in every variant a corrupted or forged packet could take: every single bit of its
//! headers flipped (opcode, pad count, P_Key, QPN, PSN, AckReq, RETH, ImmDt, IETH,
//! AETH), every pad count, the datagram cut or extended by up to 8 bytes (the payload's
//! length is what the datagram's length leaves). Whatever `Qp::placement` answers for
//! a variant must lie where the message in progress writes: an RDMA WRITE at its
//! cursor inside the First packet's RETH range, a SEND at its cursor inside the
//! receive WQE's buffer, a READ response at exactly that response's bytes of the
//! READ's buffer. And the QP moved to Err, or reset and reconnected, or a region
//! deregistered between packets, places nothing.

mod common;

use common::*;
use softnic_transport::memory::Memory;
use softnic_transport::memory::{Access, Accessor};
use softnic_transport::qp::{Placed, Placement, QpAttr, QpState, QpType, Target};
use softnic_transport::testing::{connect_qp, Node, Pair, PairConfig};
use softnic_transport::wr::{SendOp, WcStatus};

/// Every variant of `bytes` a corrupted or forged packet could take (see the module
/// docs), the unmodified packet first.
fn variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![bytes.to_vec()];
    let header = wire::PacketRepr::parse(bytes).map_or(wire::bth::HEADER_LEN, |p| p.header_len);
    for bit in 0..header * 8 {
        let mut v = bytes.to_vec();
        v[bit / 8] ^= 1 << (bit % 8);
        out.push(v);
    }
    for pad in 0..4u8 {
        let mut v = bytes.to_vec();
        v[1] = (v[1] & !0x30) | (pad << 4);
        out.push(v);
    }
    for k in 1..=8 {
        out.push(bytes[..bytes.len() - k].to_vec());
        let mut v = bytes.to_vec();
        v.extend(std::iter::repeat_n(0xA5, k));
        out.push(v);
    }
    out
}

/// Where a message in progress may write its next packet: `key` and `target`, at
/// exactly `va` (the cursor), ending at most at `limit`.
#[derive(Debug, Clone, Copy)]
struct Dest {
    key: u32,
    target: Target,
    va: u64,
    limit: u64,
}

/// Offers every variant of `bytes` to `node`'s QP's placement query and checks each
/// answer against `dest` (`None`: nothing may be placed). Returns how many variants
/// were placed and, of those, how many end past `real_end` (the message's own bytes).
fn sweep(node: &Node, bytes: &[u8], dest: Option<Dest>, real_end: u64) -> (usize, usize) {
    let (mut placed, mut past) = (0, 0);
    for v in variants(bytes) {
        let Ok(pkt) = wire::PacketRepr::parse(&v) else {
            continue;
        };
        let Some(at) = node.qp.placement(&pkt) else {
            continue;
        };
        let d = dest.unwrap_or_else(|| {
            panic!(
                "placed with nothing to place: {at:?} for {:?}",
                pkt.repr.bth
            )
        });
        let end = at.va + pkt.payload.len() as u64;
        assert!(
            at.key == d.key && at.target == d.target && at.va == d.va && end <= d.limit,
            "{:?} (payload {}) placed at {at:?}, may go only at {d:?}",
            pkt.repr.bth,
            pkt.payload.len()
        );
        placed += 1;
        past += usize::from(end > real_end);
    }
    (placed, past)
}

/// The packets `node`'s QP sends now, each as the wire carries it (ICRC slot zero: the
/// placement query does not read it).
fn transmit(p: &mut Pair, side_a: bool) -> Vec<Vec<u8>> {
    let now = p.now;
    let node = if side_a { &mut p.a } else { &mut p.b };
    let mut buf = vec![0u8; 4096 + 128];
    let mut out = Vec::new();
    while let Some(t) = node.qp.poll_transmit(now, &mut buf, &node.mem) {
        out.push(buf[..t.len].to_vec());
    }
    out
}

fn handle(p: &mut Pair, to_a: bool, bytes: &[u8]) {
    let now = p.now;
    let pkt = wire::PacketRepr::parse(bytes).expect("a packet the QP sent parses");
    let (node, src) = if to_a {
        (&mut p.a, p.b.addr)
    } else {
        (&mut p.b, p.a.addr)
    };
    node.qp.handle_packet(now, src, &pkt, &mut node.mem);
}

/// What [`sweep_message`] saw.
struct Swept {
    packets: usize,
    /// Payload bytes of the real packets.
    cursor: u64,
    /// Variants placed.
    placed: usize,
    /// Variants placed past the real packet's end.
    past_end: usize,
}

/// Delivers A's request packets to B one by one (B's ACKs back to A), sweeping every
/// packet but the First before it is handled: `dest(cursor)` is where the message's
/// next bytes may go, `cursor` its bytes so far.
fn sweep_message(p: &mut Pair, dest: impl Fn(u64) -> Dest) -> Swept {
    let mut s = Swept {
        packets: 0,
        cursor: 0,
        placed: 0,
        past_end: 0,
    };
    loop {
        let out = transmit(p, true);
        if out.is_empty() {
            return s;
        }
        for bytes in out {
            let n = payload_len(&bytes);
            let d = (s.cursor > 0).then(|| dest(s.cursor));
            let real_end = d.map_or(0, |d| d.va + n);
            let (placed, past) = sweep(&p.b, &bytes, d, real_end);
            s.placed += placed;
            s.past_end += past;
            s.packets += 1;
            s.cursor += n;
            handle(p, false, &bytes);
        }
        for ack in transmit(p, false) {
            handle(p, true, &ack);
        }
    }
}

fn payload_len(bytes: &[u8]) -> u64 {
    wire::PacketRepr::parse(bytes).map_or(0, |p| p.payload.len() as u64)
}

/// An RDMA WRITE of 10 KiB + 300 B at MTU 1024 (11 packets), RC and UC: every variant
/// of every packet is placed, if at all, at the WRITE's cursor inside its RETH range —
/// the range the message overwrites. The First (RETH) is never placed.
#[test]
fn corrupted_write_packets_stay_at_the_cursor_inside_the_reth_range() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let cfg = PairConfig {
            qp_type,
            ..rc(1024)
        };
        let (mut p, a, b) = pair(cfg, 21);
        let len = 10 * 1024 + 300;
        fill(&mut p.a, &a, 0, &pattern(3, len));
        p.a.qp
            .post_send(rdma(1, SendOp::Write, &[a.sge(0, len)], &b, 4096))
            .unwrap();
        let base = b.at(4096);
        let limit = base + len as u64;
        let s = sweep_message(&mut p, |c| Dest {
            key: b.key,
            target: Target::Remote,
            va: base + c,
            limit,
        });
        assert_eq!(s.past_end, 0, "a WRITE placed past the message's own bytes");
        assert_eq!((s.packets, s.cursor), (11, len as u64), "{qp_type:?}");
        assert!(
            s.placed >= 10,
            "{qp_type:?}: the real Middle/Last were not placed"
        );
        assert_eq!(ids(&drain(&mut p.a)), [(1, WcStatus::Success)]);
        assert!(read(&p.b, &b, 4096, len) == pattern(3, len), "{qp_type:?}");
    }
}

/// A SEND of 4 KiB + 300 B at MTU 1024 into a 16 KiB receive buffer: every variant is
/// placed, if at all, at the message's cursor inside the receive WQE's buffer, and none
/// past the message's end: a SEND's Last is not placed (a corrupted pad count or
/// datagram length would make it longer than the real one), and a Middle's payload is
/// exactly the path MTU (docs/perf.md, "The receiver's single pass").
#[test]
fn corrupted_send_packets_stay_inside_the_receive_buffer() {
    let (mut p, a, b) = pair(rc(1024), 22);
    let len = 4 * 1024 + 300;
    let buf = 16 * 1024;
    fill(&mut p.a, &a, 0, &pattern(4, len));
    p.b.qp.post_recv(recv(7, &[b.sge(512, buf)])).unwrap();
    p.a.qp
        .post_send(wr(1, SendOp::Send, &[a.sge(0, len)]))
        .unwrap();
    let base = b.at(512);
    let s = sweep_message(&mut p, |c| Dest {
        key: b.key,
        target: Target::Local,
        va: base + c,
        limit: base + buf as u64,
    });
    let (cursor, total, past_end) = (s.cursor, s.placed, s.past_end);
    assert_eq!(cursor, len as u64);
    assert!(total >= 3, "the real Middle packets were not placed");
    assert_eq!(past_end, 0, "a SEND placed past the message's own bytes");
    let c = drain(&mut p.b);
    assert_eq!(ids(&c), [(7, WcStatus::Success)]);
    assert_eq!(c[0].byte_len as usize, len);
}

/// READ responses: every variant is placed, if at all, at exactly that response's
/// bytes of the READ's buffer (the requester knows each response's offset and length
/// from its PSN); nothing past the READ's length, and nothing once the READ completed.
#[test]
fn corrupted_read_responses_stay_at_their_own_bytes() {
    let (mut p, a, b) = pair(rc(1024), 23);
    let len = 3 * 1024 + 300;
    fill(&mut p.b, &b, 64, &pattern(9, len));
    p.a.qp
        .post_send(rdma(4, SendOp::Read, &[a.sge(8, len)], &b, 64))
        .unwrap();
    for req in transmit(&mut p, true) {
        handle(&mut p, false, &req);
    }
    let responses = transmit(&mut p, false);
    assert_eq!(responses.len(), 4);
    let mut cursor = 0u64;
    for bytes in &responses {
        let n = payload_len(bytes);
        let dest = Dest {
            key: a.key,
            target: Target::Local,
            va: a.at(8) + cursor,
            limit: a.at(8) + cursor + n,
        };
        let (placed, past) = sweep(&p.a, bytes, Some(dest), a.at(8) + cursor + n);
        assert!(placed >= 1 && past == 0);
        cursor += n;
        handle(&mut p, true, bytes);
    }
    assert_eq!(ids(&drain(&mut p.a)), [(4, WcStatus::Success)]);
    assert!(read(&p.a, &a, 8, len) == pattern(9, len));
    // The READ completed: its responses again (a duplicate, or the answer to a
    // retried READ arriving late) are placed nowhere.
    for bytes in &responses {
        assert_eq!(sweep(&p.a, bytes, None, 0), (0, 0));
    }
}

/// Between two packets of a WRITE (and of a READ's responses) the user moves the QP
/// to Err, or resets and reconnects it: nothing of the old message is placed any more.
#[test]
fn nothing_is_placed_after_the_qp_leaves_rts() {
    for reconnect in [false, true] {
        let (mut p, a, b) = pair(rc(1024), 24);
        let len = 4 * 1024;
        p.a.qp
            .post_send(rdma(1, SendOp::Write, &[a.sge(0, len)], &b, 0))
            .unwrap();
        let out = transmit(&mut p, true);
        assert!(out.len() >= 3);
        handle(&mut p, false, &out[0]);
        let dest = Dest {
            key: b.key,
            target: Target::Remote,
            va: b.at(1024),
            limit: b.at(len),
        };
        assert!(sweep(&p.b, &out[1], Some(dest), b.at(2048)).0 >= 1);
        to_err(&mut p.b);
        if reconnect {
            // The old message's next PSN is the expected one again.
            let psn = wire::PacketRepr::parse(&out[1]).unwrap().repr.bth.psn;
            reset_and_reconnect(&mut p, psn.value());
        }
        for bytes in &out[1..] {
            assert_eq!(sweep(&p.b, bytes, None, 0), (0, 0));
        }
    }
    // The requester side: a READ whose QP went to Err (its WQE flushed) places none
    // of its responses.
    let (mut p, a, b) = pair(rc(1024), 25);
    p.a.qp
        .post_send(rdma(4, SendOp::Read, &[a.sge(0, 3000)], &b, 0))
        .unwrap();
    for req in transmit(&mut p, true) {
        handle(&mut p, false, &req);
    }
    let responses = transmit(&mut p, false);
    handle(&mut p, true, &responses[0]);
    to_err(&mut p.a);
    for bytes in &responses[1..] {
        assert_eq!(sweep(&p.a, bytes, None, 0), (0, 0));
    }
}

/// The region a WRITE targets is deregistered between its packets: the query still
/// names the RETH's R_Key (it does not look at memory), but the write is refused and
/// nothing is written — the NIC then takes the usual order (`rx_place::place`), and
/// handling meets the same refusal.
#[test]
fn a_deregistered_region_takes_no_placed_bytes() {
    let (mut p, a, b) = pair(rc(1024), 26);
    fill(&mut p.a, &a, 0, &pattern(5, 4096));
    p.a.qp
        .post_send(rdma(1, SendOp::Write, &[a.sge(0, 4096)], &b, 0))
        .unwrap();
    let out = transmit(&mut p, true);
    handle(&mut p, false, &out[0]);
    let pkt = wire::PacketRepr::parse(&out[1]).unwrap();
    let at =
        p.b.qp
            .placement(&pkt)
            .expect("a Middle at the expected PSN");
    p.b.mem.regions.retain(|r| r.key != b.key);
    assert!(at.write(&mut p.b.mem, pkt.payload).is_err());
    // Registered again under another key: the old R_Key still reaches nothing.
    let again = region(&mut p.b, b.addr, b.len, Access::ALL);
    assert_ne!(again.key, b.key);
    assert!(at.write(&mut p.b.mem, pkt.payload).is_err());
    assert!(p.b.mem.bytes(again.key).iter().all(|&x| x == 0));
}

/// `Placed` skips exactly the placed write: a write of other bytes to the same place
/// first (another source pointer) goes through and the placed one is still skipped
/// after it; a payload written in two pieces matches nothing, both pieces go through,
/// and `skipped()` says the handling decided differently.
#[test]
fn placed_skips_exactly_the_placed_write() {
    let (mut p, _a, b) = pair(rc(1024), 27);
    let payload = pattern(6, 600);
    let by = Accessor { pd: 1, qpn: 0x11 };
    let at = Placement {
        by,
        key: b.key,
        va: b.at(100),
        target: Target::Remote,
    };
    // Other bytes (an equal copy, not the packet's own) to the same place: written.
    let copy = payload.clone();
    {
        let mut w = Placed::new(&mut p.b.mem, at, &payload);
        w.write_remote(by, b.key, b.at(100), &copy).unwrap();
        assert!(!w.skipped());
        // The same bytes through another QP of the PD: another writer, written.
        let other = Accessor { qpn: 0x12, ..by };
        w.write_remote(other, b.key, b.at(100), &payload).unwrap();
        assert!(!w.skipped());
        // A local write to the same key and address is another kind: written.
        w.write_local(1, b.key, b.at(100), &payload).unwrap();
        assert!(!w.skipped());
        // The placed write itself: skipped (no byte changes), once.
        let (mut before, mut after) = (vec![0; 1024], vec![0; 1024]);
        w.read_remote(by, b.key, b.at(0), &mut before).unwrap();
        w.write_remote(by, b.key, b.at(100), &payload).unwrap();
        assert!(w.skipped());
        w.read_remote(by, b.key, b.at(0), &mut after).unwrap();
        assert!(before == after);
    }
    // In two pieces: neither is the placed write.
    let mut mem = p.b.mem.clone();
    mem.bytes_mut(b.key).fill(0);
    {
        let mut w = Placed::new(&mut mem, at, &payload);
        w.write_remote(by, b.key, b.at(100), &payload[..300])
            .unwrap();
        w.write_remote(by, b.key, b.at(400), &payload[300..])
            .unwrap();
        assert!(!w.skipped());
    }
    assert!(mem.bytes(b.key)[100..700] == payload[..]);
    // The placed write made twice by a handler: the second one goes through (the
    // placement is skipped once).
    let mut mem = p.b.mem.clone();
    mem.bytes_mut(b.key).fill(0);
    {
        let mut w = Placed::new(&mut mem, at, &payload);
        w.write_remote(by, b.key, b.at(100), &payload).unwrap();
        assert!(w.skipped());
        w.write_remote(by, b.key, b.at(100), &payload).unwrap();
    }
    assert!(mem.bytes(b.key)[100..700] == payload[..]);
}

fn to_err(node: &mut Node) {
    let attr = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    node.qp
        .modify(softnic_transport::time::Instant::ZERO, &attr)
        .expect("to Err");
}

fn reset_and_reconnect(p: &mut Pair, epsn: u32) {
    let attr = QpAttr {
        state: Some(QpState::Reset),
        ..QpAttr::default()
    };
    p.b.qp
        .modify(softnic_transport::time::Instant::ZERO, &attr)
        .expect("to Reset");
    let cfg = rc(1024);
    let (a_qpn, a_addr) = (p.a.qp.qpn(), p.a.addr);
    connect_qp(&mut p.b.qp, &cfg, a_qpn, a_addr, epsn, 0);
}

/// SENDs into receive WQEs of an SRQ (each message's WQE lent to the QP at its First
/// packet), with loss, reordering, duplication and corruption on both directions and
/// every packet received through the single pass: each message arrives once and
/// intact in its own WQE's buffer, packets are placed, and every placed packet's
/// handling made exactly the placed write.
#[test]
fn sends_into_an_srq_through_the_single_pass_under_faults() {
    use softnic_transport::srq::SrqCaps;
    use softnic_transport::testing::Faults;
    let cfg = rc(1024);
    let mut p = Pair::connect_srq(
        cfg,
        28,
        SrqCaps {
            max_wr: 8,
            max_sge: 2,
        },
    );
    let len = (2 << 20) + (64 << 10);
    let a = region(&mut p.a, 0x1000_0000, len, Access::ALL);
    let b = region(&mut p.b, 0x7f00_0000_0000, len, Access::ALL);
    p.fused_receive = true;
    p.faults = Faults {
        loss: 0.02,
        reorder: 0.02,
        duplicate: 0.02,
        corrupt: 0.03,
    };
    let size = 5 * 1024 + 77;
    let n = 6;
    for i in 0..n {
        fill(&mut p.a, &a, i * 8192, &pattern(40 + i as u64, size));
        let srq = p.b.srq.as_mut().expect("B has an SRQ");
        srq.post_recv(recv(100 + i as u64, &[b.sge(i * 8192, 8192)]))
            .unwrap();
        p.a.qp
            .post_send(wr(i as u64, SendOp::Send, &[a.sge(i * 8192, size)]))
            .unwrap();
    }
    p.drive(2_000_000);
    let sent = drain(&mut p.a);
    assert_eq!(sent.len(), n);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = drain(&mut p.b);
    assert_eq!(got.len(), n, "{got:?}");
    for c in &got {
        assert_eq!((c.status, c.byte_len as usize), (WcStatus::Success, size));
        let i = (c.wr_id - 100) as usize;
        assert!(read(&p.b, &b, i * 8192, size) == pattern(40 + i as u64, size));
    }
    assert!(p.stats.placed >= n as u64 * 4, "{:?}", p.stats);
    assert!(
        p.stats.icrc_errors > 0,
        "no packet was corrupted: {:?}",
        p.stats
    );
    assert_eq!(p.stats.place_mismatch, 0, "{:?}", p.stats);
}
