//! The latency loops (`perftest_resources.c`): `run_iter_lat_write` (both sides WRITE
//! to each other and spin on the last byte of the peer's message), `run_iter_lat_send`
//! (SEND ping-pong; the server answers what it receives) and `run_iter_lat` (the client
//! READs, one at a time). Each returns the post timestamps; the report takes the gaps.

use std::time::{Duration, Instant};

use verbs_api::{RecvWr, SendWr, WorkCompletion, WrOpcode};

use super::args::Params;
use super::bw::Clock;
use super::exchange::Dest;
use super::resources::{check_recv_wc, check_wc, poll_some, Resources};

/// Spins until `cond` holds, failing after `timeout`.
fn spin_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let mut start: Option<Instant> = None;
    let mut spins = 0u64;
    // Bounded by `timeout` (checked at each yield).
    while !cond() {
        spins += 1;
        if spins.is_multiple_of(super::resources::YIELD_EVERY) {
            let t0 = *start.get_or_insert_with(Instant::now);
            if t0.elapsed() > timeout {
                return Err(format!("nothing arrived within {timeout:?} while {what}"));
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// WRITE ping-pong. The server writes first (perftest's server skips its first wait;
/// in `send_lat` it is the client that starts); each side waits until the last byte
/// of its landing slot carries the peer's counter, then writes its own.
pub fn run_write_lat(
    r: &mut Resources,
    p: &Params,
    rem: &Dest,
    size: u64,
    clock: &Clock,
) -> Result<Vec<u64>, String> {
    let iters = p.iters;
    let post_off = r.geo.local(0) + size as usize - 1;
    let poll_off = r.geo.remote(0) + size as usize - 1;
    let inline = p.inline_size > 0 && size <= u64::from(p.inline_size);
    let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
    let mut posted = Vec::with_capacity(iters as usize);
    let mut wc = [WorkCompletion::default(); 1];
    while scnt < iters || ccnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && p.is_server) {
            rcnt += 1;
            let want = rcnt as u8;
            let res = &*r;
            spin_until(p.timeout, "waiting for the peer's WRITE", || {
                res.read_byte(poll_off) == want
            })?;
        }
        if scnt < iters {
            posted.push(clock.now());
            scnt += 1;
            r.write_byte(post_off, scnt as u8);
            let sge = [r.sge(r.geo.local(0), size)];
            let op = WrOpcode::RdmaWrite {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            };
            let mut wr = SendWr::new(scnt, op, &sge).signaled();
            if inline {
                wr = wr.inline();
            }
            r.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
        }
        if ccnt < iters {
            poll_some(
                &mut r.send_cq,
                &mut wc,
                p.timeout,
                "waiting for a WRITE completion",
            )?;
            check_wc(&wc[0], &format!("send: scnt={scnt}, ccnt={ccnt}"))?;
            ccnt += 1;
        }
    }
    Ok(posted)
}

/// Posts the receives of a SEND latency run, all into the start of the landing slot.
pub fn post_lat_recvs(r: &mut Resources, p: &Params, size: u64) -> Result<u64, String> {
    let n = u64::from(p.rx_depth).min(p.iters);
    for i in 0..n {
        post_one_recv(r, size, i)?;
    }
    Ok(n)
}

fn post_one_recv(r: &mut Resources, size: u64, i: u64) -> Result<(), String> {
    let sge = [r.sge(r.geo.remote(0), size)];
    r.post_recv(0, &RecvWr::new(i, &sge))
        .map_err(|e| format!("Couldn't post recv: {e}"))
}

/// SEND ping-pong. The server waits first. Send completions are drained as they come
/// (every send is signaled) so the loop never waits for an ACK it does not need.
pub fn run_send_lat(
    r: &mut Resources,
    p: &Params,
    size: u64,
    mut rposted: u64,
    clock: &Clock,
) -> Result<Vec<u64>, String> {
    let iters = p.iters;
    let inline = p.inline_size > 0 && size <= u64::from(p.inline_size);
    let (mut scnt, mut rcnt, mut scomp) = (0u64, 0u64, 0u64);
    let sq = u64::from(r.sq_depth);
    let mut posted = Vec::with_capacity(iters as usize);
    let mut wc = [WorkCompletion::default(); 16];
    let mut stamps = Stamps::new(p.breakdown.is_some(), iters);
    while scnt < iters || rcnt < iters {
        // The client sends first.
        if rcnt < iters && (p.is_server || scnt >= 1) {
            poll_some(
                &mut r.recv_cq,
                &mut wc[..1],
                p.timeout,
                "waiting for the peer's SEND",
            )?;
            check_recv_wc(&wc[0], &format!("recv: rcnt={rcnt}"), &mut r.send_cq)?;
            stamps.note("seen", rcnt + 1);
            if u64::from(wc[0].byte_len) != size {
                return Err(format!(
                    "received {} bytes, expected {size}",
                    wc[0].byte_len
                ));
            }
            rcnt += 1;
            if rposted < iters {
                post_one_recv(r, size, rposted)?;
                rposted += 1;
            }
        }
        if scnt < iters {
            // Keep the send queue from filling with completed-but-unpolled sends.
            while scnt - scomp >= sq {
                let n = poll_some(
                    &mut r.send_cq,
                    &mut wc,
                    p.timeout,
                    "waiting for a SEND completion",
                )?;
                for c in wc.iter().take(n) {
                    check_wc(c, &format!("send: scnt={scnt}"))?;
                }
                scomp += n as u64;
            }
            posted.push(clock.now());
            scnt += 1;
            stamps.note("post", scnt);
            let sge = [r.sge(r.geo.local(0), size)];
            let mut wr = SendWr::new(scnt, WrOpcode::Send, &sge).signaled();
            if inline {
                wr = wr.inline();
            }
            r.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
        }
        let n = r
            .send_cq
            .poll(&mut wc)
            .map_err(|e| format!("poll CQ: {e}"))?;
        for c in wc.iter().take(n) {
            check_wc(c, &format!("send: scnt={scnt}"))?;
        }
        scomp += n as u64;
    }
    while scomp < scnt {
        let n = poll_some(
            &mut r.send_cq,
            &mut wc,
            p.timeout,
            "waiting for the last SEND completions",
        )?;
        for c in wc.iter().take(n) {
            check_wc(c, &format!("send: scnt={scnt}"))?;
        }
        scomp += n as u64;
    }
    if let Some(path) = &p.breakdown {
        stamps
            .write(path)
            .map_err(|e| format!("--breakdown {}: {e}", path.display()))?;
    }
    Ok(posted)
}

/// `--breakdown`: each iteration's post and receive-completion instants on
/// CLOCK_MONOTONIC, the clock of the NICs' latency traces (nic/trace.rs).
struct Stamps(Option<Vec<(&'static str, u64, u64)>>);

impl Stamps {
    fn new(on: bool, iters: u64) -> Self {
        Stamps(on.then(|| Vec::with_capacity(2 * iters as usize)))
    }

    #[inline]
    fn note(&mut self, what: &'static str, n: u64) {
        if let Some(v) = self.0.as_mut() {
            v.push((what, n, crate::nic::trace::mono_ns()));
        }
    }

    /// `what n ns` lines.
    fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (what, n, t) in self.0.iter().flatten() {
            writeln!(w, "{what} {n} {t}")?;
        }
        w.flush()
    }
}

/// READ latency (client only): one READ at a time from the peer's slot.
pub fn run_read_lat(
    r: &mut Resources,
    p: &Params,
    rem: &Dest,
    size: u64,
    clock: &Clock,
) -> Result<Vec<u64>, String> {
    let mut posted = Vec::with_capacity(p.iters as usize);
    let mut wc = [WorkCompletion::default(); 1];
    for n in 0..p.iters {
        posted.push(clock.now());
        let sge = [r.sge(r.geo.local(0), size)];
        let op = WrOpcode::RdmaRead {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        };
        r.qps[0]
            .post_send(&[SendWr::new(n, op, &sge).signaled()])
            .map_err(|e| format!("Couldn't post send: scnt={n}: {e}"))?;
        poll_some(
            &mut r.send_cq,
            &mut wc,
            p.timeout,
            "waiting for a READ completion",
        )?;
        check_wc(&wc[0], &format!("read: scnt={n}"))?;
    }
    Ok(posted)
}
