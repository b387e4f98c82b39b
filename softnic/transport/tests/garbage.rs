//! Never panic on any packet: random but parseable packets (every opcode of every
//! transport, random header fields, PSNs near and far from the expected ones, keys
//! valid and not) into RTS QPs of each type, interleaved with posts, transmits and
//! timeouts. Whatever the QP sends back must parse.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use softnic_transport::memory::Access;
use softnic_transport::qp::{Qp, QpCounters, QpState, QpType};
use softnic_transport::testing::{connect_qp, MemVec, PairConfig};
use softnic_transport::time::{Duration, Instant};
use softnic_transport::wr::{Queue, SendOp};
use wire::opcode::OPCODES;
use wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Header, IethRepr,
    ImmDtRepr, Msn, PacketRepr, Psn, Qpn, RethRepr, Syndrome, XrcEthRepr,
};

#[derive(Debug, Clone)]
struct Junk {
    row: usize,
    psn_delta: i32,
    far_psn: Option<u32>,
    ack_req: bool,
    solicited: bool,
    pkey: u16,
    va_sel: u8,
    va_off: u64,
    len: u32,
    key_sel: u8,
    syndrome: u8,
    msn: u32,
    imm: u32,
    qkey_ok: bool,
    payload_len: usize,
    fill: u8,
    /// Interleaved action after the packet: 0 none, 1 transmit all, 2 timeout,
    /// 3 post recv, 4 post send.
    action: u8,
}

fn junk() -> impl Strategy<Value = Junk> {
    (
        (
            0..OPCODES.len(),
            -6i32..6,
            prop::option::weighted(0.1, any::<u32>()),
            any::<bool>(),
            any::<bool>(),
            prop_oneof![9 => Just(0xFFFFu16), 1 => any::<u16>()],
            any::<u8>(),
            0u64..70_000,
        ),
        (
            prop_oneof![3 => 0u32..5000, 1 => any::<u32>()],
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
            prop_oneof![4 => 0usize..64, 2 => 200usize..1100, 1 => 0usize..4200],
            any::<u8>(),
            0u8..5,
        ),
    )
        .prop_map(
            |(
                (row, psn_delta, far_psn, ack_req, solicited, pkey, va_sel, va_off),
                (len, key_sel, syndrome, msn, imm, qkey_ok, payload_len, fill, action),
            )| Junk {
                row,
                psn_delta,
                far_psn,
                ack_req,
                solicited,
                pkey,
                va_sel,
                va_off,
                len,
                key_sel,
                syndrome,
                msn,
                imm,
                qkey_ok,
                payload_len,
                fill,
                action,
            },
        )
}

struct Victim {
    qp: Qp,
    mem: MemVec,
    keys: Vec<(u32, u64)>,
    buf: Vec<u8>,
    now: Instant,
    posted: u64,
}

fn victim(t: QpType) -> Victim {
    let cfg = PairConfig {
        qp_type: t,
        mtu: 1024,
        ..PairConfig::default()
    };
    let mut qp = Qp::new(0x11, t, 1, cfg.caps);
    connect_qp(
        &mut qp,
        &cfg,
        0x22,
        "127.0.0.2:4791".parse().unwrap(),
        5000,
        100,
    );
    let mut mem = MemVec::default();
    let mut keys = Vec::new();
    for (i, acc) in [Access::ALL, Access::LOCAL_WRITE, Access::NONE]
        .into_iter()
        .enumerate()
    {
        let addr = 0x1000_0000 * (i as u64 + 1);
        keys.push((mem.register(1, addr, 65_536, acc), addr));
    }
    // A region of another protection domain.
    keys.push((mem.register(2, 0x9000_0000, 4096, Access::ALL), 0x9000_0000));
    Victim {
        qp,
        mem,
        keys,
        buf: vec![0; 4096 + 128],
        now: Instant::ZERO,
        posted: 0,
    }
}

fn build(j: &Junk, v: &Victim, base_psn: u32) -> Option<Vec<u8>> {
    let row = OPCODES.get(j.row)?;
    let psn = match j.far_psn {
        Some(p) => p,
        None => base_psn.wrapping_add(j.psn_delta as u32),
    };
    let (key, base) = v.keys[usize::from(j.key_sel) % v.keys.len()];
    let key = if j.key_sel > 200 { key ^ 0xFF } else { key };
    let va = match j.va_sel % 3 {
        0 => base + j.va_off,
        1 => base.wrapping_sub(j.va_off),
        _ => j.va_off.wrapping_mul(0x1_0001),
    };
    let mut r = PacketRepr::new(BthRepr {
        solicited: j.solicited,
        mig_req: true,
        pkey: j.pkey,
        ack_req: j.ack_req,
        ..BthRepr::new(row.opcode, Qpn::new(0x11), Psn::new(psn))
    });
    for h in row.headers {
        match h {
            Header::Reth => {
                r.reth = Some(RethRepr {
                    va,
                    rkey: key,
                    dma_len: j.len,
                })
            }
            Header::Aeth => {
                r.aeth = Some(AethRepr {
                    syndrome: Syndrome::from_u8(j.syndrome),
                    msn: Msn::new(j.msn),
                })
            }
            Header::Deth => {
                r.deth = Some(DethRepr {
                    qkey: if j.qkey_ok { 0x1111 } else { j.imm },
                    src_qpn: Qpn::new(j.msn),
                })
            }
            Header::ImmDt => r.immdt = Some(ImmDtRepr { imm: j.imm }),
            Header::Ieth => r.ieth = Some(IethRepr { rkey: key }),
            Header::AtomicEth => {
                r.atomic_eth = Some(AtomicEthRepr {
                    va,
                    rkey: key,
                    swap_add: u64::from(j.imm),
                    compare: u64::from(j.msn),
                })
            }
            Header::AtomicAckEth => {
                r.atomic_ack_eth = Some(AtomicAckEthRepr {
                    orig: u64::from(j.imm),
                })
            }
            Header::Feth => r.feth = Some(FethRepr::default()),
            Header::CnpPad => {}
            // Any SRQ number, named or not (the XRCETH carries its low 24 bits).
            Header::XrcEth => r.xrceth = Some(XrcEthRepr { srqn: j.msn }),
        }
    }
    let plen = if row.payload { j.payload_len } else { 0 };
    r.payload_len = plen;
    let payload = vec![j.fill; plen];
    let mut out = vec![0u8; r.total_len().ok()?];
    r.emit(&mut out, &payload).ok()?;
    Some(out)
}

fn drain_transmit(v: &mut Victim) {
    for _ in 0..10_000 {
        let Some(t) = v.qp.poll_transmit(v.now, &mut v.buf, &v.mem) else {
            return;
        };
        let parsed = wire::PacketRepr::parse(&v.buf[..t.len]);
        assert!(
            parsed.is_ok(),
            "QP emitted an unparsable packet: {parsed:?}"
        );
    }
    panic!("poll_transmit never ran dry");
}

/// Completions so far must name each WQE at most once.
fn check_completions(v: &mut Victim, seen: &mut std::collections::HashSet<(Queue, u64)>) {
    while let Some(c) = v.qp.poll_completion() {
        assert!(seen.insert((c.queue, c.wr_id)), "two completions for {c:?}");
    }
}

fn run(t: QpType, js: Vec<Junk>) -> (QpCounters, u32) {
    let mut v = victim(t);
    let src = "127.0.0.2:4791".parse().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut resets = 0;
    let mut total = QpCounters::default();
    for (i, j) in js.iter().enumerate() {
        // Garbage often kills the connection: collect, reset and reconnect so the
        // rest of the sequence still reaches an RTS QP.
        // UC/UD send errors leave the QP in SQE; bring it back as an application would.
        if v.qp.state() == QpState::Sqe {
            let rts = softnic_transport::qp::QpAttr {
                state: Some(QpState::Rts),
                ..Default::default()
            };
            v.qp.modify(v.now, &rts).unwrap();
        }
        if v.qp.state() == QpState::Err {
            drain_transmit(&mut v);
            check_completions(&mut v, &mut seen);
            add(&mut total, v.qp.counters());
            let cfg = PairConfig {
                qp_type: t,
                mtu: 1024,
                ..PairConfig::default()
            };
            v.qp = Qp::new(0x11, t, 1, cfg.caps);
            connect_qp(&mut v.qp, &cfg, 0x22, src, 5000, 100);
            resets += 1;
        }
        // Alternate the base PSN between the responder's and the requester's spaces.
        let base = if i % 2 == 0 { 5000 } else { 100 };
        if let Some(bytes) = build(j, &v, base) {
            if let Ok(p) = wire::PacketRepr::parse(&bytes) {
                v.qp.handle_packet(v.now, src, &p, &mut v.mem);
            }
        }
        match j.action {
            1 => drain_transmit(&mut v),
            2 => {
                v.now = v.qp.poll_timeout().unwrap_or(v.now) + Duration::from_nanos(1);
                v.qp.handle_timeout(v.now);
            }
            3 => {
                let (k, a) = v.keys[usize::from(j.key_sel) % 2];
                let _ = v.qp.post_recv(recv(
                    v.posted,
                    &[Buf {
                        key: k,
                        addr: a,
                        len: 0,
                    }
                    .sge(0, j.len as usize % 5000)],
                ));
                v.posted += 1;
            }
            4 => {
                let (k, a) = v.keys[usize::from(j.key_sel) % v.keys.len()];
                let b = Buf {
                    key: k,
                    addr: a,
                    len: 65_536,
                };
                let op = match j.syndrome % 5 {
                    0 => SendOp::Send,
                    1 => SendOp::WriteWithImm(j.imm),
                    2 => SendOp::Read,
                    3 => SendOp::FetchAdd { add: 1 },
                    _ => SendOp::CompareSwap {
                        compare: 0,
                        swap: 1,
                    },
                };
                let len = if matches!(op, SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }) {
                    8
                } else {
                    j.len as usize % 5000
                };
                let mut w = rdma(v.posted, op, &[b.sge(0, len)], &b, 0);
                if t == QpType::Ud {
                    w = ud(w, 0x22, 0x1111, src);
                }
                let _ = v.qp.post_send(w);
                v.posted += 1;
            }
            _ => {}
        }
    }
    drain_transmit(&mut v);
    check_completions(&mut v, &mut seen);
    add(&mut total, v.qp.counters());
    (total, resets)
}

/// Sums the counters this test looks at.
fn add(t: &mut QpCounters, c: &QpCounters) {
    t.packets_received += c.packets_received;
    t.bytes_received += c.bytes_received;
    t.duplicate_requests += c.duplicate_requests;
    t.out_of_sequence += c.out_of_sequence;
    t.drop_unexpected_response += c.drop_unexpected_response;
    t.drop_bad_pkey += c.drop_bad_pkey;
    t.nak_invalid_request_sent += c.nak_invalid_request_sent;
    t.nak_remote_access_sent += c.nak_remote_access_sent;
    t.acks_sent += c.acks_sent;
    t.completions_success += c.completions_success;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xBAD_F00D),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        .. ProptestConfig::default()
    })]

    #[test]
    fn rc_survives_garbage(js in prop::collection::vec(junk(), 1..80)) {
        run(QpType::Rc, js);
    }

    #[test]
    fn uc_survives_garbage(js in prop::collection::vec(junk(), 1..80)) {
        run(QpType::Uc, js);
    }

    #[test]
    fn ud_survives_garbage(js in prop::collection::vec(junk(), 1..80)) {
        run(QpType::Ud, js);
    }
}

/// The generator reaches the interesting paths: a long fixed run exercises
/// acceptance, duplicates, NAKs of every kind and responses.
#[test]
fn garbage_reaches_deep_paths() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strat = prop::collection::vec(junk(), 3000);
    let js = strat.new_tree(&mut runner).unwrap().current();
    let (c, resets) = run(QpType::Rc, js);
    eprintln!("{resets} resets, {c:?}");
    assert!(resets > 5);
    assert_eq!(c.packets_received, 3000);
    assert!(c.bytes_received > 0, "{c:?}");
    assert!(c.duplicate_requests > 0, "{c:?}");
    assert!(c.out_of_sequence > 0, "{c:?}");
    assert!(c.drop_unexpected_response > 0, "{c:?}");
    assert!(c.drop_bad_pkey > 0, "{c:?}");
    assert!(c.nak_invalid_request_sent > 0, "{c:?}");
    assert!(c.nak_remote_access_sent > 0, "{c:?}");
    assert!(c.acks_sent > 0, "{c:?}");
}
