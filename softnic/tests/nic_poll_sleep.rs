//! Hybrid polling against two real NICs (`verbs_api::poll_idle`): a program polling an
//! empty CQ sleeps once nothing came for the spin window, and the NIC wakes it when it
//! publishes a completion — to the CQ it sleeps on or to *another* CQ of its context.
//!
//! How each test can fail: the pollers' contexts get a single-sleep bound of 5 s
//! (`Context::set_poll_spin`), so without the NIC's `futex_wake` a sleeper would see
//! its completion only after its sleep times out, and the bound of [`WOKEN_WITHIN`]
//! fails; the NIC's `poller_wakes` counter must also have moved. The poller must have
//! slept before the completion was sent (it counts its sleeps), or the test proves
//! nothing and fails.

mod nic_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::poll_idle::RECV_QUIET;
use verbs_api::{
    CompletionQueue, Device, Mtu, QpCap, QpInitAttr, QpType, QueuePair, RecvWr, SendWr, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};

/// Spin window of the sleeping side (short, so the test reaches the sleep at once).
const WINDOW: Duration = Duration::from_micros(50);
/// Single-sleep bound of the sleeping side: far longer than [`WOKEN_WITHIN`].
const LONG_SLEEP: Duration = Duration::from_secs(5);
/// A woken poller has its completion this soon after the SEND was posted (a loopback
/// round trip is tens of µs; the rest is slack for a loaded 2-core host).
const WOKEN_WITHIN: Duration = Duration::from_millis(1500);
/// Longest wait for anything in these tests.
const LIMIT: Duration = Duration::from_secs(30);

/// The receiving side: its QP completes sends into `send_cq` and receives into
/// `recv_cq` (two CQs of one context).
struct Receiver {
    _side: Side,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qp: verbs_api::QueuePair,
}

/// x on NIC `a` (two CQs, a RECV posted) connected to y on NIC `b`.
fn setup(a: &NicProc, b: &NicProc) -> (Receiver, Side) {
    let side_x = side(a, 4096, 4);
    let mut y = side(b, 4096, 4);
    let send_cq = side_x.ctx.create_cq(4).expect("send cq");
    let recv_cq = side_x.ctx.create_cq(4).expect("recv cq");
    let mut qp = side_x
        .pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .expect("create qp");
    connect_rc(
        (&mut qp, a),
        (&mut y.qp, b),
        Mtu::Mtu1024,
        (0x100, 0x200),
        14,
    );
    let rsge = [side_x.mr.sge(0, 64)];
    qp.post_recv(&[RecvWr::new(7, &rsge)]).expect("recv");
    side_x.ctx.set_poll_spin(Some(WINDOW), LONG_SLEEP);
    (
        Receiver {
            _side: side_x,
            send_cq,
            recv_cq,
            qp,
        },
        y,
    )
}

/// Runs `poller` (which returns the receive completion) on its own thread, waits
/// until it has slept twice, sends one SEND from `y`, and checks the completion came
/// within [`WOKEN_WITHIN`] and that NIC `a` counted a wake.
fn sleeps_then_is_woken(
    a: &NicProc,
    y: &mut Side,
    poller: impl FnOnce(Arc<AtomicU32>) -> WorkCompletion + Send + 'static,
) {
    let wakes_before = a.stat("poller_wakes");
    let slept = Arc::new(AtomicU32::new(0));
    let t = {
        let slept = slept.clone();
        thread::spawn(move || {
            let wc = poller(slept);
            (wc, Instant::now())
        })
    };
    let start = Instant::now();
    while slept.load(Ordering::Acquire) < 2 {
        assert!(start.elapsed() < LIMIT, "the poller never slept");
        thread::sleep(Duration::from_millis(1));
    }
    let sge = [y.mr.sge(0, 8)];
    let posted = Instant::now();
    y.qp.post_send(&[SendWr::new(1, WrOpcode::Send, &sge).signaled()])
        .expect("send");
    let (wc, seen) = t.join().expect("poller thread");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::Recv)
    );
    let took = seen.duration_since(posted);
    assert!(
        took < WOKEN_WITHIN,
        "the sleeping poller saw its completion {took:?} after the SEND (not woken?)"
    );
    assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
    let wakes = a.stat("poller_wakes") - wakes_before;
    assert!(wakes >= 1, "NIC a woke no poller");
    println!("completion seen {took:?} after the SEND; NIC a woke {wakes} poller(s)");
}

/// Polls `cqs` in turn until one yields a completion, calling `idle` on `cqs[0]` after
/// each round that found nothing, and counting the sleeps in `slept`.
fn poll_in_turn(cqs: &mut [CompletionQueue], slept: &AtomicU32) -> WorkCompletion {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        for cq in cqs.iter_mut() {
            if cq.poll(&mut wc).expect("poll") == 1 {
                return wc[0];
            }
        }
        if cqs[0].idle() {
            slept.fetch_add(1, Ordering::Release);
        }
        assert!(start.elapsed() < LIMIT, "no completion within {LIMIT:?}");
    }
}

/// Sets up NICs `{tag}-a`/`-b` and runs [`sleeps_then_is_woken`] with a poller that
/// polls x's receive CQ, after x's send CQ first when `send_cq_first` (then it sleeps
/// in the send CQ's idle step, and the completion comes to the other CQ).
fn woken(tag: &str, send_cq_first: bool) {
    let (a, b) = NicProc::pair(tag);
    let (x, mut y) = setup(&a, &b);
    let Receiver {
        _side,
        send_cq,
        recv_cq,
        qp,
    } = x;
    sleeps_then_is_woken(&a, &mut y, move |slept| {
        let _qp = qp;
        if send_cq_first {
            poll_in_turn(&mut [send_cq, recv_cq], &slept)
        } else {
            poll_in_turn(&mut [recv_cq], &slept)
        }
    });
}

#[test]
fn a_sleeping_poller_is_woken_by_a_completion_on_its_cq() {
    woken("psleep1", false);
}

/// The poller sleeps in the idle step of its (empty) send CQ; the completion goes to
/// the receive CQ of the same context, which the program polls in turn.
#[test]
fn a_completion_on_the_other_cq_of_the_context_wakes_the_sleeper() {
    woken("psleep2", true);
}

/// Control: with the default spin window but sleeping turned off, the poller never
/// sleeps (so the tests above do measure the sleep).
#[test]
fn a_poller_with_sleep_off_never_sleeps() {
    let (a, _b) = NicProc::pair("psleep3");
    let ctx = Device::open(&a.name).expect("open");
    ctx.set_poll_spin(None, LONG_SLEEP);
    let cq = ctx.create_cq(4).expect("cq");
    let start = Instant::now();
    let mut slept = 0;
    while start.elapsed() < Duration::from_millis(20) {
        slept += u32::from(cq.idle());
    }
    assert_eq!(slept, 0);
    ctx.set_poll_spin(Some(WINDOW), Duration::from_millis(1));
    while start.elapsed() < Duration::from_millis(40) {
        slept += u32::from(cq.idle());
    }
    assert!(slept > 0, "with a window, an idle poller sleeps");
}

/// Keeps `depth` RDMA WRITEs of `len` bytes from x to y outstanding (every one
/// signaled, as `write_bw` above 8 KiB) until `total` completed, polling x's CQ with
/// `idle` between empty polls; returns the naps x's context took.
fn write_stream(x: &mut Side, y: &Side, len: u32, depth: u32, total: u32) -> u64 {
    write_stream_to(x, (y.mr.addr(), y.mr.rkey()), len, depth, total).0
}

/// [`write_stream`] to a remote region given as (address, rkey). A receive
/// completion on x's CQ (a SEND from y) is not counted: its receive is posted again.
/// Returns the naps, and how many of them began less than [`RECV_QUIET`] after the
/// poll that found a receive completion (measured from before that poll, so that a
/// nap the rule allows is never counted).
fn write_stream_to(
    x: &mut Side,
    (addr, rkey): (u64, u32),
    len: u32,
    depth: u32,
    total: u32,
) -> (u64, u64) {
    let before = x.ctx.poll_naps();
    let (mut last_recv, mut early) = (None::<Instant>, 0u64);
    let op = WrOpcode::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    let sge = [x.mr.sge(0, len)];
    let (mut posted, mut done) = (0u32, 0u32);
    let mut wc = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while done < total {
        while posted < total && posted - done < depth {
            x.qp.post_send(&[SendWr::new(u64::from(posted), op, &sge).signaled()])
                .expect("post write");
            posted += 1;
        }
        let polled_at = Instant::now();
        let n = x.cq.poll(&mut wc).expect("poll");
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "completion {}", c.wr_id);
            if c.opcode == WcOpcode::Recv {
                last_recv = Some(polled_at);
                let rsge = [x.mr.sge(8, 8)];
                x.qp.post_recv(&[RecvWr::new(c.wr_id, &rsge)])
                    .expect("repost recv");
            } else {
                done += 1;
            }
        }
        if n == 0 {
            let naps = x.ctx.poll_naps();
            x.cq.idle();
            // The nap began before idle() returned.
            let napped = x.ctx.poll_naps() != naps;
            early += u64::from(napped && last_recv.is_some_and(|t| t.elapsed() < RECV_QUIET));
        }
        assert!(
            start.elapsed() < LIMIT,
            "{done} of {total} writes in {LIMIT:?}"
        );
    }
    let naps = x.ctx.poll_naps() - before;
    println!(
        "{total} × {len} B, {depth} outstanding: {:?}, {naps} naps ({early} within \
         {RECV_QUIET:?} of a receive)",
        start.elapsed()
    );
    (naps, early)
}

/// A poller with deep queued work naps (`verbs_api::poll_idle::nap_for`): 64 KiB
/// WRITEs, 128 outstanding, are milliseconds of work for the NIC. Fails when the NIC
/// does not count retired sends on the doorbell page (no rate: no nap) or the poller
/// does not nap; and with naps turned off, it must not nap.
#[test]
fn a_poller_with_deep_queued_work_naps() {
    let (a, b) = NicProc::pair("pnap1");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 64 << 10, 128);
    assert!(
        write_stream(&mut x, &y, 64 << 10, 128, 3000) > 0,
        "a deep queue of 64 KiB WRITEs: the poller never napped"
    );
    x.ctx.set_poll_nap(None);
    assert_eq!(write_stream(&mut x, &y, 64 << 10, 128, 1000), 0, "naps off");
    x.ctx
        .set_poll_nap(Some(verbs_api::poll_idle::DEFAULT_NAP_MIN));
    x.ctx.set_poll_spin(None, Duration::from_millis(1));
    assert_eq!(
        write_stream(&mut x, &y, 64 << 10, 128, 1000),
        0,
        "sleep off (SOFTNIC_POLL_SPIN_US=off): no naps either"
    );
}

/// A poller that also receives does not nap within [`RECV_QUIET`] of a receive
/// completion, however deep its send queue: y SENDs to x (about one every 100 µs)
/// while x streams 64 KiB WRITEs as in the test above. Fails when receive
/// completions are not noted (x would nap as above, between receives). Naps later
/// than that after a receive are allowed: on a loaded host y's sender is sometimes
/// descheduled for longer.
#[test]
fn a_poller_that_receives_does_not_nap() {
    use std::sync::atomic::AtomicBool;
    let (a, b) = NicProc::pair("pnap3");
    let (mut x, mut y) = rc_pair(&a, &b, Mtu::Mtu4096, 64 << 10, 128);
    let rsge = [x.mr.sge(8, 8)];
    for i in 0..64 {
        x.qp.post_recv(&[RecvWr::new(1_000_000 + i, &rsge)])
            .expect("recv");
    }
    let remote = (y.mr.addr(), y.mr.rkey());
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        thread::spawn(move || {
            let sge = [y.mr.sge(0, 8)];
            let mut sent = 0u32;
            while !stop.load(Ordering::Relaxed) {
                y.qp.post_send(&[SendWr::new(1, WrOpcode::Send, &sge).signaled()])
                    .expect("send");
                assert_eq!(poll_one(&mut y.cq).status, WcStatus::Success);
                sent += 1;
                thread::sleep(Duration::from_micros(100));
            }
            sent
        })
    };
    let (_, early) = write_stream_to(&mut x, remote, 64 << 10, 128, 3000);
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    println!("y sent {sent} SENDs to x meanwhile");
    assert!(sent > 10, "y's SENDs did not overlap the stream ({sent})");
    assert_eq!(early, 0, "a poller receiving SENDs napped");
}

/// Control: a ping-pong (one WRITE at a time) never naps, and a stream of 8 B WRITEs
/// with 32 outstanding (≈ 30 µs of work for the NIC, as `write_bw -s 8` has after a
/// completion) hardly ever, so that the test above measures the queue's depth: only
/// when the NIC is preempted for milliseconds (seen at load 3.5 with the other tests
/// of this file running: 9 naps in 50,000 WRITEs) does its pace make a nap; a poller
/// that napped regardless of the work's length would nap at most yield points. (With
/// 128 outstanding, ≈ 130 µs of work, a nap is one preempted NIC away: a NIC slowed
/// 3× for a millisecond makes it 400 µs of work, and the poller naps 100 µs. That
/// case is measured as a rate, docs/perf.md "Naps while deep work is queued".)
#[test]
fn a_ping_pong_and_a_small_write_stream_do_not_nap() {
    let (a, b) = NicProc::pair("pnap2");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 64 << 10, 128);
    assert_eq!(write_stream(&mut x, &y, 8, 1, 2000), 0, "ping-pong");
    let naps = write_stream(&mut x, &y, 8, 32, 50_000);
    assert!(naps < 500, "8 B stream: {naps} naps in 50,000 WRITEs");
}

/// Creates on x's context an RC QP whose peer (on `b`) is destroyed once connected,
/// posts 128 64 KiB WRITEs on it (never acknowledged) and hands it to `then` while
/// they are still outstanding.
fn with_unanswered_writes(
    x: &Side,
    y: &Side,
    (a, b): (&NicProc, &NicProc),
    then: impl FnOnce(QueuePair),
) {
    let cq = x.ctx.create_cq(256).expect("cq");
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let attr = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap,
        sq_sig_all: false,
    };
    let mut z = x.pd.create_qp(&attr).expect("qp");
    let mut w = side(b, 4096, 1);
    connect_rc((&mut z, a), (&mut w.qp, b), Mtu::Mtu4096, (0, 0), 14);
    drop(w);
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    let sge = [x.mr.sge(0, 64 << 10)];
    for i in 0..128 {
        z.post_send(&[SendWr::new(i, op, &sge)]).expect("post");
    }
    thread::sleep(Duration::from_millis(5)); // the NIC takes them; none retire
    then(z);
}

/// A QP destroyed with send work still queued ahead of the NIC leaves none of it
/// counted as queued (`QueuePair`'s drop takes off the WQEs whose slots the NIC never
/// gave back): a one-at-a-time WRITE loop on the same context afterwards does not
/// nap. Fails when the destroyed QP's 128 WRITEs stay counted (the loop would see
/// ≥ 129 queued at a round trip each and nap ≈ 1 ms at its yield points).
#[test]
fn a_destroyed_qps_unretired_sends_are_not_queued_work() {
    let (a, b) = NicProc::pair("pnap4");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 64 << 10, 128);
    with_unanswered_writes(&x, &y, (&a, &b), drop);
    assert_eq!(
        write_stream(&mut x, &y, 8, 1, 2000),
        0,
        "a destroyed QP's unacknowledged WRITEs still counted as queued"
    );
}

/// The same for a QP moved to RESET with its WRITEs outstanding (IBTA 10.3.1.1: the
/// queues are emptied, without completions) and kept there.
#[test]
fn a_reset_qps_dropped_sends_are_not_queued_work() {
    let (a, b) = NicProc::pair("pnap5");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu4096, 64 << 10, 128);
    let mut kept = None;
    with_unanswered_writes(&x, &y, (&a, &b), |mut z| {
        z.modify(&verbs_api::QpAttr {
            qp_state: Some(verbs_api::QpState::Reset),
            ..Default::default()
        })
        .expect("reset");
        kept = Some(z);
    });
    assert_eq!(
        write_stream(&mut x, &y, 8, 1, 2000),
        0,
        "a reset QP's dropped WRITEs still counted as queued"
    );
    drop(kept);
}
