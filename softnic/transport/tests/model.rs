//! Model-based property test: random mixes of operations in both directions against
//! random loss / reordering / duplication / corruption schedules. Checks exactly-once,
//! in-order delivery, intact bytes, exactly one completion per signaled WR with the
//! right fields, and final memory equal to a plain model (atomics included).
//!
//! Memory layout of each node's one region (so that the expected result does not
//! depend on timing — RC orders one direction's requests, but a retried READ re-reads
//! memory, so READ sources are never written):
//! * `[0, SRC)` — gather source for SEND/WRITE, never written;
//! * `[SRC, WT)` — targets of the peer's WRITEs and atomics (atomic cells first);
//! * `[WT, RS)` — source of the peer's READs, never written;
//! * `[RS, LEN)` — landing buffers: receives, READ destinations, atomic results,
//!   one fresh piece per operation.

mod common;

use common::*;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use softnic_transport::memory::Access;
use softnic_transport::qp::{RxeCompat, PATH_MTUS};
use softnic_transport::testing::{Faults, Pair, PairConfig};
use softnic_transport::wr::{Completion, Queue, SendOp, WcOpcode, WcStatus};

const SRC: usize = 64 << 10;
const WT: usize = 128 << 10;
const RS: usize = 192 << 10;
const LEN: usize = 1 << 20;
const ATOMIC_CELLS: usize = 4;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CompSwap,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    from_b: bool,
    kind: Kind,
    size: usize,
    /// Source / target offset selector.
    off: usize,
    /// Atomic operand selector.
    arg: u64,
    signaled: bool,
}

fn op_strategy(mtu: usize) -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(Kind::Send),
        Just(Kind::SendImm),
        Just(Kind::Write),
        Just(Kind::WriteImm),
        Just(Kind::Read),
        Just(Kind::FetchAdd),
        Just(Kind::CompSwap),
    ];
    let size = prop_oneof![
        4 => 0..=(3 * mtu + 7),
        1 => Just(0usize),
        1 => 0usize..20_000,
    ];
    (
        any::<bool>(),
        kind,
        size,
        any::<usize>(),
        any::<u64>(),
        any::<u8>(),
    )
        .prop_map(|(from_b, kind, size, off, arg, s)| Op {
            from_b,
            kind,
            size,
            off,
            arg,
            signaled: s % 4 != 0,
        })
}

/// What one side expects.
#[derive(Default)]
struct Expect {
    send: Vec<(u64, WcOpcode, u32)>,
    recv: Vec<(u64, WcOpcode, u32, Option<u32>)>,
}

fn run(seed: u64, mtu: u32, faults: Faults, ops: Vec<Op>) -> Result<(), TestCaseError> {
    run_with(seed, mtu, faults, ops, false, false)
}

/// `fused`: both sides receive through the single pass (`Pair::fused_receive`: payloads
/// placed where `Qp::placement` says before their ICRC is checked), and every placed
/// packet's handling must make exactly the placed write.
fn run_with(
    seed: u64,
    mtu: u32,
    faults: Faults,
    ops: Vec<Op>,
    retry_forever: bool,
    fused: bool,
) -> Result<(), TestCaseError> {
    let cfg = PairConfig {
        mtu,
        timeout: 6,
        retry_cnt: 7,
        rd_atomic: 4,
        ..PairConfig::default()
    };
    let mut p = Pair::connect(cfg, seed);
    p.faults = faults;
    p.fused_receive = fused;
    if retry_forever {
        let compat = RxeCompat {
            retry_cnt_7_is_infinite: true,
        };
        p.a.qp.set_rxe_compat(compat);
        p.b.qp.set_rxe_compat(compat);
    }
    let ba = region(&mut p.a, 0x10_0000_0000, LEN, Access::ALL);
    let bb = region(&mut p.b, 0x7F_0000_0000, LEN, Access::ALL);
    // Models of both memories.
    let mut model = [vec![0u8; LEN], vec![0u8; LEN]];
    for (i, (node, b)) in [(&mut p.a, &ba), (&mut p.b, &bb)].into_iter().enumerate() {
        let src = pattern(seed ^ (i as u64 + 1), SRC);
        let rsrc = pattern(seed ^ (i as u64 + 11), RS - WT);
        fill(node, b, 0, &src);
        fill(node, b, WT, &rsrc);
        model[i][..SRC].copy_from_slice(&src);
        model[i][WT..RS].copy_from_slice(&rsrc);
    }
    let mut expect = [Expect::default(), Expect::default()];
    let mut land = [RS, RS];
    for (n, op) in ops.iter().enumerate() {
        let wr_id = n as u64;
        let (s, t) = if op.from_b { (1, 0) } else { (0, 1) };
        let (sbuf, tbuf) = if op.from_b { (bb, ba) } else { (ba, bb) };
        let size = op.size;
        let src_off = op.off % (SRC - size.min(SRC));
        let src = model[s][src_off..src_off + size].to_vec();
        let imm = (op.arg as u32) | 1;
        // Room check: skip operations that would overflow the landing zone.
        if land[s] + size + 8 > LEN || land[t] + size + 8 > LEN {
            continue;
        }
        let (w, send_op, send_len) = match op.kind {
            Kind::Send | Kind::SendImm => {
                let r = land[t];
                land[t] += size;
                let recv_wr = recv(wr_id, &[tbuf.sge(r, size)]);
                (if op.from_b { &mut p.a } else { &mut p.b })
                    .qp
                    .post_recv(recv_wr)
                    .unwrap();
                model[t][r..r + size].copy_from_slice(&src);
                let (sop, with) = match op.kind {
                    Kind::Send => (SendOp::Send, None),
                    _ => (SendOp::SendWithImm(imm), Some(imm)),
                };
                expect[t]
                    .recv
                    .push((wr_id, WcOpcode::Recv, size as u32, with));
                (
                    wr(wr_id, sop, &[sbuf.sge(src_off, size)]),
                    WcOpcode::Send,
                    size,
                )
            }
            Kind::Write | Kind::WriteImm => {
                let span = WT - SRC;
                let size = size.min(span);
                let src = &src[..size];
                let dst = SRC + op.off % (span - size + 1);
                model[t][dst..dst + size].copy_from_slice(src);
                let sop = match op.kind {
                    Kind::Write => SendOp::Write,
                    _ => {
                        (if op.from_b { &mut p.a } else { &mut p.b })
                            .qp
                            .post_recv(recv(wr_id, &[]))
                            .unwrap();
                        expect[t].recv.push((
                            wr_id,
                            WcOpcode::RecvRdmaWithImm,
                            size as u32,
                            Some(imm),
                        ));
                        SendOp::WriteWithImm(imm)
                    }
                };
                (
                    rdma(wr_id, sop, &[sbuf.sge(src_off, size)], &tbuf, dst),
                    WcOpcode::RdmaWrite,
                    size,
                )
            }
            Kind::Read => {
                let span = RS - WT;
                let size = size.min(span);
                let from = WT + op.off % (span - size + 1);
                let r = land[s];
                land[s] += size;
                let data = model[t][from..from + size].to_vec();
                model[s][r..r + size].copy_from_slice(&data);
                (
                    rdma(wr_id, SendOp::Read, &[sbuf.sge(r, size)], &tbuf, from),
                    WcOpcode::RdmaRead,
                    size,
                )
            }
            Kind::FetchAdd | Kind::CompSwap => {
                let cell = SRC + 8 * (op.off % ATOMIC_CELLS);
                let r = (land[s] + 7) & !7;
                land[s] = r + 8;
                let orig = u64::from_ne_bytes(model[t][cell..cell + 8].try_into().unwrap());
                let (sop, new, opc) = if matches!(op.kind, Kind::FetchAdd) {
                    let add = op.arg % 1000;
                    (
                        SendOp::FetchAdd { add },
                        orig.wrapping_add(add),
                        WcOpcode::FetchAdd,
                    )
                } else {
                    // Compare against the current value half of the time.
                    let compare = if op.arg % 2 == 0 { orig } else { op.arg };
                    let swap = op.arg >> 1;
                    let new = if compare == orig { swap } else { orig };
                    (
                        SendOp::CompareSwap { compare, swap },
                        new,
                        WcOpcode::CompSwap,
                    )
                };
                model[t][cell..cell + 8].copy_from_slice(&new.to_ne_bytes());
                model[s][r..r + 8].copy_from_slice(&orig.to_ne_bytes());
                (rdma(wr_id, sop, &[sbuf.sge(r, 8)], &tbuf, cell), opc, 8)
            }
        };
        let mut w = w;
        w.signaled = op.signaled;
        if op.signaled {
            expect[s].send.push((wr_id, send_op, send_len as u32));
        }
        (if op.from_b { &mut p.b } else { &mut p.a })
            .qp
            .post_send(w)
            .unwrap();
    }
    if std::env::var("MODEL_TRACE").is_ok() {
        p.filter = Some(Box::new(|s| {
            let r = &s.repr;
            eprintln!(
                "#{} {:?} {} psn={} ack_req={} aeth={:?}",
                s.index,
                s.from,
                r.bth.opcode,
                r.bth.psn.value(),
                r.bth.ack_req,
                r.aeth
            );
            softnic_transport::testing::Verdict::Pass
        }));
    }
    p.drive(3_000_000);
    if std::env::var("MODEL_TRACE").is_ok() {
        eprintln!("NET {:?}", p.stats);
        eprintln!(
            "A {:?} {:?}\nB {:?} {:?}",
            p.a.qp.state(),
            p.a.qp.counters(),
            p.b.qp.state(),
            p.b.qp.counters()
        );
    }
    prop_assert_eq!(p.stats.place_mismatch, 0, "{:?}", p.stats);
    PLACED.fetch_add(p.stats.placed, Ordering::Relaxed);
    for (i, (node, b)) in [(&mut p.a, &ba), (&mut p.b, &bb)].into_iter().enumerate() {
        let got: Vec<Completion> = drain(node);
        let sends: Vec<_> = got
            .iter()
            .filter(|c| c.queue == Queue::Send)
            .map(|c| {
                prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c);
                Ok((c.wr_id, c.opcode, c.byte_len))
            })
            .collect::<Result<_, TestCaseError>>()?;
        prop_assert_eq!(&sends, &expect[i].send, "send completions of node {}", i);
        let recvs: Vec<_> = got
            .iter()
            .filter(|c| c.queue == Queue::Recv)
            .map(|c| {
                prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c);
                Ok((c.wr_id, c.opcode, c.byte_len, c.imm))
            })
            .collect::<Result<_, TestCaseError>>()?;
        prop_assert_eq!(&recvs, &expect[i].recv, "recv completions of node {}", i);
        let mem = read(node, b, 0, LEN);
        if mem != model[i] {
            let first = mem.iter().zip(&model[i]).position(|(x, y)| x != y);
            return Err(TestCaseError::fail(format!(
                "memory of node {i} differs from the model, first at {first:?}"
            )));
        }
        prop_assert_eq!(node.qp.send_queue_len(), 0);
        prop_assert_eq!(node.qp.recv_queue_len(), 0);
    }
    Ok(())
}

fn faults() -> impl Strategy<Value = Faults> {
    (0.0..0.04f64, 0.0..0.20f64, 0.0..0.15f64, 0.0..0.02f64).prop_map(
        |(loss, reorder, duplicate, corrupt)| Faults {
            loss,
            reorder,
            duplicate,
            corrupt,
        },
    )
}

/// Heavy faults: up to 30% loss, only survivable with unlimited retries.
fn harsh_faults() -> impl Strategy<Value = Faults> {
    (0.0..0.30f64, 0.0..0.30f64, 0.0..0.30f64, 0.0..0.10f64).prop_map(
        |(loss, reorder, duplicate, corrupt)| Faults {
            loss,
            reorder,
            duplicate,
            corrupt,
        },
    )
}

fn case() -> impl Strategy<Value = (u64, u32, Faults, Vec<Op>)> {
    case_with(faults())
}

fn case_with(
    faults: impl Strategy<Value = Faults>,
) -> impl Strategy<Value = (u64, u32, Faults, Vec<Op>)> {
    (
        any::<u64>(),
        prop::sample::select(PATH_MTUS.to_vec()),
        faults,
    )
        .prop_flat_map(|(seed, mtu, f)| {
            (
                Just(seed),
                Just(mtu),
                Just(f),
                prop::collection::vec(op_strategy(mtu as usize), 1..40),
            )
        })
}

/// 2000 cases by default (about 10 s at opt-level 1); PROPTEST_CASES overrides.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// A fixed seed (reproducible runs); MODEL_SEED explores others.
fn seed() -> proptest::test_runner::RngSeed {
    let s = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x50F7_41C0);
    proptest::test_runner::RngSeed::Fixed(s)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        rng_seed: seed(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        .. ProptestConfig::default()
    })]

    #[test]
    fn rc_matches_the_model_under_faults((seed, mtu, faults, ops) in case()) {
        run(seed, mtu, faults, ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases() / 4,
        rng_seed: seed(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        .. ProptestConfig::default()
    })]

    /// Up to 30% loss with unlimited retries (the rxe opt-in): still exactly once.
    #[test]
    fn rc_matches_the_model_under_heavy_faults((seed, mtu, faults, ops) in case_with(harsh_faults())) {
        run_with(seed, mtu, faults, ops, true, false)?;
    }

    /// The receiver's single pass (`qp::placement`) under the same faults, corruption
    /// included: payloads written before their ICRC is checked — corrupt ones too —
    /// leave memory equal to the model, and handling makes exactly each placed write.
    #[test]
    fn rc_matches_the_model_with_the_single_pass((seed, mtu, faults, ops) in case()) {
        run_with(seed, mtu, faults, ops, false, true)?;
    }
}

/// Packets placed before their ICRC check, over all cases run in this process.
static PLACED: AtomicU64 = AtomicU64::new(0);

/// The single-pass property above places packets at all (else it tests nothing).
#[test]
fn the_single_pass_property_places_packets() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let before = PLACED.load(Ordering::Relaxed);
    runner
        .run(&case(), |(seed, mtu, faults, ops)| {
            run_with(seed, mtu, faults, ops, false, true)
        })
        .unwrap();
    assert!(
        PLACED.load(Ordering::Relaxed) > before,
        "nothing was placed"
    );
}

/// The same property without faults, as a baseline that isolates model bugs.
#[test]
fn model_without_faults() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strat =
        (any::<u64>(), prop::sample::select(PATH_MTUS.to_vec())).prop_flat_map(|(seed, mtu)| {
            (
                Just(seed),
                Just(mtu),
                prop::collection::vec(op_strategy(mtu as usize), 1..30),
            )
        });
    runner
        .run(&strat, |(seed, mtu, ops)| {
            run(seed, mtu, Faults::default(), ops)
        })
        .unwrap();
}

/// A schedule the property found at 7.5% loss + 4% corruption: the First response of
/// a READ was lost or corrupted in 8 consecutive rounds, so with retry_cnt 7 the READ
/// fails with IBV_WC_RETRY_EXC_ERR — correct, and the reason the strict property
/// keeps loss low. With unlimited retries the same schedule delivers exactly once.
#[test]
fn regression_read_first_response_lost_repeatedly() {
    let (seed, mtu, faults, ops) = (
        2194404067496693865,
        256,
        Faults {
            loss: 0.07458358552968065,
            reorder: 0.1717980554882234,
            duplicate: 0.01741852126236068,
            corrupt: 0.0389219127115355,
        },
        [
            Op {
                from_b: false,
                kind: Kind::Read,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 513,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Send,
                size: 16129,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Send,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Read,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 513,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Send,
                size: 769,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Read,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::FetchAdd,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::FetchAdd,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Read,
                size: 513,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::FetchAdd,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::FetchAdd,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 257,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: false,
                kind: Kind::Send,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::FetchAdd,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
            Op {
                from_b: true,
                kind: Kind::Read,
                size: 0,
                off: 0,
                arg: 0,
                signaled: false,
            },
        ],
    );
    run_with(seed, mtu, faults, ops.to_vec(), true, false).unwrap();
}
