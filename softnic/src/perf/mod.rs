//! `softnic perf`: perftest-compatible benchmarks (`ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_send_lat`, `ib_read_lat`) over a
//! softnic device, speaking perftest 4.5's TCP exchange so either side can be a stock
//! perftest tool on a real RNIC or rxe. See docs/perf-tool.md.
//!
//! One job per file: [`args`] (flags and defaults), [`exchange`] (the TCP exchange,
//! byte-exact), [`resources`] (verbs objects and buffer layout), [`bw`] and [`lat`]
//! (the measurement loops), [`report`] (perftest's printed tables), [`peak`] (their BW
//! peak, without perftest's quadratic search), [`verify`] (`--verify` data checks).
//! This file sequences the exchange exactly as each perftest program does, since a peer
//! blocks on every step.

pub mod args;
pub mod bw;
pub mod exchange;
pub mod lat;
pub mod peak;
pub mod report;
pub mod resources;
pub mod verify;

use std::io::Write;
use std::process::ExitCode;

pub use args::PerfArgs;

use args::{AtomicKind, Params, TestName, Verb};
use bw::Clock;
use exchange::{BwReport, Comm, Dest};
use report::{RESULT_FMT_BW, RESULT_FMT_LAT, RESULT_LINE};
use resources::{Geometry, Resources};

/// perftest refuses peers older than this (`check_version_compatibility`).
const MIN_PEER_VERSION: f64 = 5.70;
/// Our cycle buffer (the page size) and cache line size, as perftest's sysconf.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// perftest computes no peak above this many iterations (`noPeak`).
const PEAK_MAX_ITERS: u64 = 20_000;
/// How long a UC `write_bw --verify` server waits for the client's last, unacknowledged
/// WRITEs to land before it reports what is missing.
const UC_LANDING_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Entry point of `softnic perf`.
pub fn main(a: PerfArgs) -> ExitCode {
    match run(&a) {
        Ok(notes) => {
            for n in notes {
                println!(" softnic verify: {n}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!(" {e}");
            ExitCode::FAILURE
        }
    }
}

/// A running session: parameters, the control socket, verbs objects, addresses.
struct Session {
    p: Params,
    comm: Comm,
    rem_version: f64,
    mtu_bytes: u32,
    r: Resources,
    my: Vec<Dest>,
    clock: Clock,
    notes: Vec<String>,
}

fn run(a: &PerfArgs) -> Result<Vec<String>, String> {
    let p = Params::resolve(a)?;
    let ctx = resources::open_device(&p)?;
    let device = ctx.name().to_string();
    let mut mtu_e = exchange::mtu_enum(resources::local_mtu(&ctx, &p))
        .ok_or("the device's MTU is not an IB MTU")?;
    if p.is_server {
        println!("\n************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
        let _ = std::io::stdout().flush();
    }
    let mut comm = match &p.host {
        Some(h) => Comm::connect(h, p.port, p.timeout),
        None => Comm::accept(p.port, p.timeout, |port| {
            if p.port == 0 {
                // Told only when asked for (`-p 0`): perftest prints no port.
                println!(" TCP port of the exchange: {port}");
                let _ = std::io::stdout().flush();
            }
        }),
    }
    .map_err(|e| format!("Unable to init the socket connection: {e}"))?;
    let err = |e: exchange::ExchangeError| {
        format!("Failed to exchange data between server and clients: {e}")
    };
    let rem_version = comm.exchange_versions().map_err(err)?;
    if rem_version < MIN_PEER_VERSION {
        return Err(format!(
            "Current implementation is not compatible with versions older than 5.70 (peer: {rem_version})"
        ));
    }
    let (cycle, cache_line) = comm
        .exchange_sys_data(rem_version, CYCLE_BUFFER, CACHE_LINE)
        .map_err(err)?;
    mtu_e = comm.exchange_mtu(rem_version, mtu_e).map_err(err)?;
    let mtu_bytes = exchange::mtu_bytes(mtu_e).ok_or("invalid MTU")?;
    let geo = Geometry {
        qps: p.qps as usize,
        buff: (p.max_size.max(u64::from(cycle))) as usize,
        cycle: u64::from(cycle.max(1)),
        cache_line: u64::from(cache_line.max(1)),
    };
    let mut r = Resources::create(ctx, &p, geo)?;
    prefill(&mut r, &p);
    let my = (0..geo.qps)
        .map(|q| r.my_dest(q))
        .collect::<Result<Vec<_>, _>>()?;
    print!("{}", report::test_info(&p, &device, mtu_bytes, r.out_reads));
    let mut s = Session {
        p,
        comm,
        rem_version,
        mtu_bytes,
        r,
        my,
        clock: Clock::new(),
        notes: Vec::new(),
    };
    match s.p.test {
        TestName::WriteBw | TestName::ReadBw | TestName::AtomicBw => s.rdma_bw()?,
        TestName::SendBw => s.send_bw()?,
        TestName::WriteLat => s.write_lat()?,
        TestName::SendLat => s.send_lat()?,
        TestName::ReadLat => s.read_lat()?,
    }
    let _ = std::io::stdout().flush();
    Ok(s.notes)
}

/// A byte pattern by offset in a slot.
type Fill = fn(usize) -> u8;

/// Fills the region: sources with [`verify::source`], landing slots with
/// [`verify::landing`], atomic targets and `write_lat` buffers with zeros (perftest
/// zeroes those; the WRITE latency test spins on a byte changing).
fn prefill(r: &mut Resources, p: &Params) {
    let geo = r.geo;
    for q in 0..geo.qps {
        let (local, remote): (Fill, Fill) = match (p.verb, p.is_server) {
            (Verb::Read, true) => (verify::source, verify::source),
            (Verb::Read, false) => (verify::landing, verify::landing),
            (Verb::Atomic, _) => (|_| 0, |_| 0),
            (Verb::Write, _) if !p.bw => (|_| 0, |_| 0),
            _ => (verify::source, verify::landing),
        };
        r.fill(geo.local(q), geo.buff, local);
        r.fill(geo.remote(q), geo.buff, remote);
    }
}

impl Session {
    fn err(e: exchange::ExchangeError) -> String {
        format!("Failed to exchange data between server and clients: {e}")
    }

    /// One `ctx_hand_shake` of QP 0's address (a synchronisation point).
    fn sync(&mut self) -> Result<Dest, String> {
        let my0 = *self.my.first().ok_or("no QP")?;
        self.comm.hand_shake(&my0).map_err(Self::err)
    }

    /// One hand shake per QP; prints the remote lines when `print`.
    fn exchange_all(&mut self, print: bool) -> Result<Vec<Dest>, String> {
        let mut rem = Vec::with_capacity(self.my.len());
        for q in 0..self.my.len() {
            let d = self.comm.hand_shake(&self.my[q]).map_err(Self::err)?;
            if print {
                print!("{}", report::address_lines("remote", &d, self.p.verb));
            }
            rem.push(d);
        }
        Ok(rem)
    }

    /// `ctx_check_gid_compatibility` + `ctx_connect` for every QP.
    fn connect(&mut self, rem: &[Dest], to_rts: bool) -> Result<(), String> {
        let v4 = |g: &[u8; 16]| g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
        if let (Some(m), Some(o)) = (self.my.first(), rem.first()) {
            if v4(&m.gid) != v4(&o.gid) {
                return Err("\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n".into());
            }
        }
        for (q, o) in rem.iter().enumerate() {
            let m = self.my[q];
            self.r.connect(
                q,
                &m,
                o,
                self.mtu_bytes,
                to_rts,
                (self.p.peer_udp_port, self.p.tclass),
            )?;
        }
        Ok(())
    }

    fn print_local(&self) {
        for d in &self.my {
            print!("{}", report::address_lines("local", d, self.p.verb));
        }
    }

    fn total(&self) -> u64 {
        self.p.iters * self.my.len() as u64
    }

    /// write_bw / read_bw / atomic_bw (`write_bw.c`, `read_bw.c`, `atomic_bw.c`).
    fn rdma_bw(&mut self) -> Result<(), String> {
        let rem = self.exchange_all(false)?;
        self.connect(&rem, !self.p.is_server)?;
        self.print_local();
        let rem = self.exchange_all(true)?;
        self.sync()?;
        print!("{RESULT_LINE}{RESULT_FMT_BW}");
        let _ = std::io::stdout().flush();
        if self.p.is_server {
            // The client's post-test hand shake: it has finished.
            self.sync()?;
            if self.p.verify {
                self.verify_target()?;
            }
            let theirs = self
                .comm
                .exchange_bw_reports(self.rem_version, &BwReport::default())
                .map_err(Self::err)?;
            print!("{}", report::bw_line(&theirs, None));
            self.close()?;
            print!("{RESULT_LINE}");
            return Ok(());
        }
        let mut last = BwReport::default();
        let fetch_add = self.p.atomic == AtomicKind::FetchAndAdd;
        for size in self.p.sizes.clone() {
            let words = self.r.geo.slots(8, true) as usize;
            let mut chk = (self.p.verify && self.p.verb == Verb::Atomic)
                .then(|| verify::AtomicCheck::new(fetch_add, self.my.len(), words));
            let times =
                bw::run_requester(&mut self.r, &self.p, &rem, size, &self.clock, chk.as_mut())?;
            let rep = report::bw_report(size, self.total(), &times, self.p.iters <= PEAK_MAX_ITERS);
            print!("{}", report::bw_line(&rep, None));
            let _ = std::io::stdout().flush();
            if let Some(c) = chk {
                self.notes.push(format!(
                    "{} {} original values consistent over {} QP(s)",
                    c.checked,
                    self.p.atomic.name(),
                    self.my.len()
                ));
            }
            if self.p.verify && self.p.verb == Verb::Read {
                self.verify_landing(size, false)?;
            }
            last = rep;
        }
        print!("{RESULT_LINE}");
        self.sync()?;
        self.comm
            .exchange_bw_reports(self.rem_version, &last)
            .map_err(Self::err)?;
        self.close()
    }

    /// send_bw (`send_bw.c`): receives are posted and both sides synchronise before each
    /// size; with `-a` (RUN_ALL) also after each size, without it the closing exchange
    /// follows directly (a stock `ib_send_bw` sends `done` there, so an extra hand shake
    /// would consume it — found by tests/interop `send_bw`). Both print their own line.
    fn send_bw(&mut self) -> Result<(), String> {
        let rem = self.exchange_all(false)?;
        self.connect(&rem, !self.p.is_server)?;
        self.sync()?;
        self.print_local();
        let rem = self.exchange_all(true)?;
        print!("{RESULT_LINE}{RESULT_FMT_BW}");
        let _ = std::io::stdout().flush();
        for size in self.p.sizes.clone() {
            let mut posted = if self.p.is_server {
                bw::post_initial_recvs(&mut self.r, &self.p, size)?
            } else {
                Vec::new()
            };
            self.sync()?;
            let rep = if self.p.is_server {
                let times =
                    bw::run_send_receiver(&mut self.r, &self.p, size, &mut posted, &self.clock)?;
                report::bw_report(size, self.total(), &times, false)
            } else {
                let times = bw::run_requester(&mut self.r, &self.p, &rem, size, &self.clock, None)?;
                report::bw_report(size, self.total(), &times, self.p.iters <= PEAK_MAX_ITERS)
            };
            print!("{}", report::bw_line(&rep, None));
            let _ = std::io::stdout().flush();
            if self.p.verify && self.p.is_server {
                self.verify_landing(size, true)?;
            }
            if self.p.all {
                self.sync()?;
            }
        }
        print!("{RESULT_LINE}");
        self.close()
    }

    /// write_lat (`write_lat.c`): no closing exchange.
    fn write_lat(&mut self) -> Result<(), String> {
        self.sync()?;
        let rem = self.exchange_all(false)?;
        self.connect(&rem, true)?;
        self.print_local();
        let rem = self.exchange_all(true)?;
        self.sync()?;
        let rem0 = *rem.first().ok_or("no remote QP")?;
        print!("{RESULT_LINE}{RESULT_FMT_LAT}");
        for size in self.p.sizes.clone() {
            let posted = lat::run_write_lat(&mut self.r, &self.p, &rem0, size, &self.clock)?;
            self.print_lat(size, &posted, 2.0)?;
        }
        print!("{RESULT_LINE}");
        Ok(())
    }

    /// send_lat (`send_lat.c`).
    fn send_lat(&mut self) -> Result<(), String> {
        let rem = self.exchange_all(false)?;
        self.connect(&rem, true)?;
        self.sync()?;
        self.print_local();
        self.exchange_all(true)?;
        print!("{RESULT_LINE}{RESULT_FMT_LAT}");
        for size in self.p.sizes.clone() {
            let rposted = lat::post_lat_recvs(&mut self.r, &self.p, size)?;
            self.sync()?;
            let posted = lat::run_send_lat(&mut self.r, &self.p, size, rposted, &self.clock)?;
            self.print_lat(size, &posted, 2.0)?;
        }
        print!("{RESULT_LINE}");
        self.close()
    }

    /// read_lat (`read_lat.c`): the server only closes once the client has finished.
    fn read_lat(&mut self) -> Result<(), String> {
        self.sync()?;
        let rem = self.exchange_all(false)?;
        self.connect(&rem, true)?;
        self.print_local();
        let rem = self.exchange_all(true)?;
        self.sync()?;
        if self.p.is_server {
            self.close()?;
            print!("{RESULT_LINE}");
            return Ok(());
        }
        let rem0 = *rem.first().ok_or("no remote QP")?;
        print!("{RESULT_LINE}{RESULT_FMT_LAT}");
        for size in self.p.sizes.clone() {
            let posted = lat::run_read_lat(&mut self.r, &self.p, &rem0, size, &self.clock)?;
            self.print_lat(size, &posted, 1.0)?;
            if self.p.verify {
                let slot = self.slot(self.r.geo.local(0));
                let c = verify::check_landing(&slot, size as usize, &[0], false)?;
                self.notes.push(format!("read_lat {size} B: {c:?}"));
            }
        }
        self.close()?;
        print!("{RESULT_LINE}");
        Ok(())
    }

    fn print_lat(&self, size: u64, posted: &[u64], rtt_factor: f64) -> Result<(), String> {
        let s = report::lat_stats(posted, rtt_factor).ok_or("too few latency samples")?;
        print!("{}", report::lat_line(size, self.p.iters, &s));
        let _ = std::io::stdout().flush();
        Ok(())
    }

    fn close(&mut self) -> Result<(), String> {
        let my0 = *self.my.first().ok_or("no QP")?;
        self.comm
            .close(&my0)
            .map_err(|e| format!("Failed to close connection between server and client: {e}"))
    }

    /// A copy of one slot of the region.
    fn slot(&self, start: usize) -> Vec<u8> {
        let len = self.r.geo.buff;
        if start.checked_add(len).is_some_and(|e| e <= self.r.mr.len()) {
            self.r.mr.read_vec(start, len)
        } else {
            Vec::new()
        }
    }

    /// Checks the landing slots (our `remote` slots for WRITE/SEND, our `local` slots
    /// for READ) after operations of `size` bytes.
    fn verify_landing(&mut self, size: u64, remote: bool) -> Result<(), String> {
        let geo = self.r.geo;
        let n = self.p.iters.min(geo.slots(size, false));
        let offsets: Vec<usize> = (0..n)
            .map(|i| geo.offset(size, i, false) as usize)
            .collect();
        let stray = self.p.sizes.len() == 1;
        for q in 0..geo.qps {
            let start = if remote { geo.remote(q) } else { geo.local(q) };
            let slot = self.slot(start);
            let c = verify::check_landing(&slot, size as usize, &offsets, stray)
                .map_err(|e| format!("--verify failed on QP {q}: {e}"))?;
            self.notes.push(format!("QP {q}, {size} B: {c:?}"));
        }
        Ok(())
    }

    /// Responder side of write_bw / atomic_bw, after the client finished.
    fn verify_target(&mut self) -> Result<(), String> {
        match self.p.verb {
            Verb::Write => {
                let size = self.p.sizes.last().copied().unwrap_or(0);
                if self.p.connection != verbs_api::QpType::Uc {
                    return self.verify_landing(size, true);
                }
                // UC WRITEs are never acknowledged (IBTA 9.7.1): the client's completions
                // mean "sent", so its closing hand shake over TCP can overtake the last
                // datagrams still queued for our NIC. Give them a bounded time to land.
                let deadline = std::time::Instant::now() + UC_LANDING_GRACE;
                let mark = self.notes.len();
                loop {
                    match self.verify_landing(size, true) {
                        Err(_) if std::time::Instant::now() < deadline => {
                            self.notes.truncate(mark);
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        r => return r,
                    }
                }
            }
            Verb::Atomic => {
                let geo = self.r.geo;
                let words = geo.slots(8, true) as usize;
                for q in 0..geo.qps {
                    let slot = self.slot(geo.remote(q));
                    match self.p.atomic {
                        AtomicKind::FetchAndAdd => verify::check_fetch_add_counts(
                            &slot,
                            words,
                            geo.inc(8) as usize,
                            self.p.iters,
                        )
                        .map_err(|e| format!("--verify failed on QP {q}: {e}"))?,
                        AtomicKind::CmpAndSwap => {
                            if slot.iter().any(|&b| b != 0) {
                                return Err(format!(
                                    "--verify failed on QP {q}: CMP_AND_SWAP(0, 0) changed a word"
                                ));
                            }
                        }
                    }
                    self.notes.push(format!(
                        "QP {q}: {} target words consistent with {} operations",
                        self.p.atomic.name(),
                        self.p.iters
                    ));
                }
                Ok(())
            }
            // Nothing lands on a READ responder.
            Verb::Read | Verb::Send => Ok(()),
        }
    }
}
