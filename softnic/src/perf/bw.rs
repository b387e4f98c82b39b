//! The bandwidth loops: the requester (`run_iter_bw`: keep `tx_depth` operations in
//! flight per QP, one signaled every `cq_mod`) and the SEND receiver
//! (`run_iter_bw_server`: keep `rx_depth` receives posted, re-post as they complete).

use std::time::Instant;

use verbs_api::{RecvWr, SendWr, WorkCompletion, WrOpcode};

use super::args::{AtomicKind, Params, Verb};
use super::exchange::Dest;
use super::report::BwTimes;
use super::resources::{check_wc, poll_some, Resources};
use super::verify::AtomicCheck;

/// Nanoseconds since a common origin.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    /// Starts now.
    pub fn new() -> Clock {
        Clock(Instant::now())
    }

    /// Nanoseconds since the start.
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// `wr_id` of operation `n` of QP `q`.
fn wr_id(q: usize, n: u64) -> u64 {
    ((q as u64) << 48) | (n & 0xffff_ffff_ffff)
}

fn split_wr_id(id: u64) -> (usize, u64) {
    ((id >> 48) as usize, id & 0xffff_ffff_ffff)
}

/// Completions polled at once (`CTX_POLL_BATCH`).
const POLL_BATCH: usize = 16;

/// Runs `p.iters` operations of `size` bytes on every QP towards `rem`, returning the
/// timestamps. `atomics` (with `--verify`) checks every returned original value.
pub fn run_requester(
    r: &mut Resources,
    p: &Params,
    rem: &[Dest],
    size: u64,
    clock: &Clock,
    mut atomics: Option<&mut AtomicCheck>,
) -> Result<BwTimes, String> {
    let qn = r.qps.len();
    let geo = r.geo;
    let iters = p.iters;
    let tot = iters * qn as u64;
    let depth = u64::from(p.tx_depth.min(r.sq_depth));
    let cq_mod = u64::from(p.cq_mod.max(1));
    let is_atomic = p.verb == Verb::Atomic;
    let inline = matches!(p.verb, Verb::Send | Verb::Write)
        && p.inline_size > 0
        && size <= u64::from(p.inline_size);
    // Atomic results go to distinct 8-byte slots so each can be read at its completion.
    let result_slots = (geo.buff / 8).max(1) as u64;
    if atomics.is_some() && depth > result_slots {
        return Err(format!("--verify needs tx depth ≤ {result_slots}"));
    }
    let mut times = BwTimes {
        posted: Vec::with_capacity(tot as usize),
        completed: Vec::with_capacity((tot / cq_mod + qn as u64 + 1) as usize),
    };
    let mut scnt = vec![0u64; qn];
    let mut ccnt = vec![0u64; qn];
    let (mut totscnt, mut totccnt) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); POLL_BATCH];
    let mut last_progress = Instant::now();
    let mut idle = 0u64;
    // Bounded: every pass posts, completes, or counts towards the timeout below.
    while totscnt < tot || totccnt < tot {
        for q in 0..qn {
            while scnt[q] < iters && scnt[q] - ccnt[q] < depth {
                let n = scnt[q];
                let rem_q = rem.get(q).ok_or("missing remote QP")?;
                let off = geo.offset(size, n, is_atomic) as usize;
                let (local, len) = if is_atomic {
                    (geo.local(q) + (n % result_slots) as usize * 8, 8)
                } else {
                    (geo.local(q) + off, size)
                };
                let sge = [r.sge(local, len)];
                let remote_addr = rem_q.vaddr + off as u64;
                let rkey = rem_q.rkey;
                let opcode = match (p.verb, p.atomic) {
                    (Verb::Write, _) => WrOpcode::RdmaWrite { remote_addr, rkey },
                    (Verb::Read, _) => WrOpcode::RdmaRead { remote_addr, rkey },
                    (Verb::Send, _) => WrOpcode::Send,
                    (Verb::Atomic, AtomicKind::FetchAndAdd) => WrOpcode::AtomicFetchAndAdd {
                        remote_addr,
                        rkey,
                        add: 1,
                    },
                    (Verb::Atomic, AtomicKind::CmpAndSwap) => WrOpcode::AtomicCmpAndSwp {
                        remote_addr,
                        rkey,
                        compare: 0,
                        swap: 0,
                    },
                };
                let mut wr = SendWr::new(wr_id(q, n), opcode, &sge);
                if (n + 1).is_multiple_of(cq_mod) || n + 1 == iters {
                    wr = wr.signaled();
                }
                if inline {
                    wr = wr.inline();
                }
                times.posted.push(clock.now());
                r.qps[q]
                    .post_send(&[wr])
                    .map_err(|e| format!("Couldn't post send: qp {q} scnt={n}: {e}"))?;
                scnt[q] += 1;
                totscnt += 1;
            }
        }
        if totccnt < tot {
            let ne = r
                .send_cq
                .poll(&mut wc)
                .map_err(|e| format!("poll CQ: {e}"))?;
            if ne == 0 {
                idle += 1;
                if idle.is_multiple_of(super::resources::YIELD_EVERY)
                    && last_progress.elapsed() > p.timeout
                {
                    return Err(format!(
                        "no completion within {:?}: posted {totscnt}, completed {totccnt} of {tot}",
                        p.timeout
                    ));
                }
                // Spin, yield, or sleep until the NIC publishes (hybrid polling).
                r.send_cq.idle();
                continue;
            }
            idle = 0;
            last_progress = Instant::now();
            let now = clock.now();
            for c in wc.iter().take(ne) {
                check_wc(c, &format!("send: scnt={totscnt}, ccnt={totccnt}"))?;
                let (q, n) = split_wr_id(c.wr_id);
                let done = ccnt.get_mut(q).ok_or("completion for an unknown QP")?;
                let covered = (n + 1).saturating_sub(*done);
                *done = n + 1;
                totccnt += covered;
                times
                    .completed
                    .push((totccnt.saturating_sub(1) as usize, now));
                if let Some(chk) = atomics.as_deref_mut() {
                    let off = geo.local(q) + (n % result_slots) as usize * 8;
                    let v =
                        r.mr.atomic_u64(off)
                            .map_err(|e| e.to_string())?
                            .load(std::sync::atomic::Ordering::Acquire);
                    let word = (geo.offset(8, n, true) / geo.inc(8)) as usize;
                    chk.check(q, word, v)?;
                }
            }
        }
    }
    Ok(times)
}

/// Posts the receives of a SEND test (`ctx_set_recv_wqes`): `rx_depth` per QP,
/// walking the landing slot like the sender walks its source. Returns how many were
/// posted per QP.
pub fn post_initial_recvs(r: &mut Resources, p: &Params, size: u64) -> Result<Vec<u64>, String> {
    let mut posted = vec![0u64; r.qps.len()];
    for (q, count) in posted.iter_mut().enumerate() {
        for _ in 0..p.rx_depth {
            post_recv(r, q, size, *count)?;
            *count += 1;
        }
    }
    Ok(posted)
}

fn post_recv(r: &mut Resources, q: usize, size: u64, n: u64) -> Result<(), String> {
    let off = r.geo.remote(q) + r.geo.offset(size, n, false) as usize;
    let sge = [r.sge(off, size)];
    r.post_recv(q, &RecvWr::new(wr_id(q, n), &sge))
        .map_err(|e| format!("Couldn't post recv: qp {q} n={n}: {e}"))
}

/// The SEND receiver: waits for `iters` messages per QP, re-posting receives while
/// fewer than `iters` are posted. perftest reports from the first arrival to the last
/// completion, without a peak.
pub fn run_send_receiver(
    r: &mut Resources,
    p: &Params,
    size: u64,
    posted: &mut [u64],
    clock: &Clock,
) -> Result<BwTimes, String> {
    let qn = r.qps.len();
    let tot = p.iters * qn as u64;
    let mut rcnt = 0u64;
    let mut times = BwTimes::default();
    let mut wc = [WorkCompletion::default(); POLL_BATCH];
    while rcnt < tot {
        let ne = poll_some(&mut r.recv_cq, &mut wc, p.timeout, "waiting for SENDs")?;
        let now = clock.now();
        if times.posted.is_empty() {
            times.posted.push(now);
        }
        for c in wc.iter().take(ne) {
            check_wc(c, &format!("recv: rcnt={rcnt}"))?;
            if u64::from(c.byte_len) != size {
                return Err(format!("received {} bytes, expected {size}", c.byte_len));
            }
            let (q, _) = split_wr_id(c.wr_id);
            rcnt += 1;
            let count = posted
                .get_mut(q)
                .ok_or("receive completion for an unknown QP")?;
            if *count < p.iters {
                let n = *count;
                post_recv(r, q, size, n)?;
                *count += 1;
            }
        }
        if rcnt >= tot {
            times.completed.push((tot as usize - 1, now));
        }
    }
    Ok(times)
}
