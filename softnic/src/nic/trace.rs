//! Latency trace (`softnic run --trace-lat FILE`): CLOCK_MONOTONIC stamps of the NIC's
//! side of each packet, so one round trip can be split into stages (issue 12: which part
//! of an 8 B round trip is scheduling). Off by default; when off every hook is one
//! branch on a `bool`.
//!
//! What is stamped, per packet:
//! * **tx**: the loop instant the transmit pass that sent it began with (the iteration's
//!   start, or the moment the loop took the core back after handing it to the clients
//!   of completions it published: `runtime.rs` drains the rings again then), so for a
//!   ping-pong this is when the NIC picked the WQE up; the moment the `sendmsg` that
//!   sent it was called (softnic's own work — rings, transport, ICRC — lies before it,
//!   the kernel's send and loopback delivery after it: docs/perf.md, "Latency"); and
//!   the moment it returned;
//! * **rx**: the moment the receive call that returned it came back;
//! * **cqe**: each pass that wrote completions (before and after transmit), just
//!   before it publishes them to the clients (so a client never polls one before its
//!   stamp; the trace cannot tell which QP's; a ping-pong's receive completion is
//!   published in the same iteration that received its packet, so it is the first
//!   after that packet's rx).
//!
//! A loopback `sendmsg` hands the datagram to the peer's socket before it returns, so
//! the peer's rx stamp may precede the sender's tx stamp by a little: the breakdown's
//! kernel stage is then slightly negative for that message.
//!
//! Each event carries the packet's BTH opcode, destination QPN and PSN. The stamps are
//! kept in memory (a fixed capacity, no system call per event) and written as text when
//! the NIC stops: `kind opcode qpn psn t_start_ns t_call_ns t_ns` per line, kind `tx`,
//! `rx` or `cqe` (`t_call_ns` is the `sendmsg` call of a `tx`; for the others all three
//! stamps are the one moment). `softnic perf send_lat --breakdown FILE` writes the clients' stamps on the
//! same clock; `tests/perf/run` joins them.

use std::io::{self, Write};
use std::path::PathBuf;

use softnic_transport::time::Instant;
use wire::bth::Bth;

use super::clock::Clock;

/// Events kept (then recording stops): about 30 per 8 B round trip for both NICs'
/// packets including ACKs, so enough for a 20,000-iteration run; 32 bytes each.
const CAPACITY: usize = 1 << 20;

/// CLOCK_MONOTONIC in nanoseconds: the clock shared by every process of a trace.
pub fn mono_ns() -> u64 {
    verbs_api::os::monotonic_ns()
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Tx,
    Rx,
    Cqe,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    kind: Kind,
    opcode: u8,
    qpn: u32,
    psn: u32,
    start: u64,
    call: u64,
    at: u64,
}

/// The NIC's trace: disabled (no path) or recording into memory.
#[derive(Debug, Default)]
pub struct Trace {
    path: Option<PathBuf>,
    events: Vec<Event>,
    /// The NIC's clock, to convert loop instants to CLOCK_MONOTONIC.
    clock: Clock,
}

impl Trace {
    /// A trace written to `path` at [`Trace::finish`], or a disabled one.
    pub fn new(path: Option<PathBuf>, clock: &Clock) -> Self {
        let Some(path) = path else {
            return Trace::default();
        };
        Trace {
            path: Some(path),
            events: Vec::with_capacity(CAPACITY),
            clock: *clock,
        }
    }

    #[inline]
    fn on(&self) -> bool {
        self.path.is_some() && self.events.len() < CAPACITY
    }

    fn push(&mut self, kind: Kind, pkt: &[u8], (start, call, at): (u64, u64, u64)) {
        let (opcode, qpn, psn) = match Bth::new_checked(pkt) {
            Ok(b) => (b.opcode().0, b.dest_qpn().value(), b.psn().value()),
            Err(_) => (0, 0, 0),
        };
        self.events.push(Event {
            kind,
            opcode,
            qpn,
            psn,
            start,
            call,
            at,
        });
    }

    /// CLOCK_MONOTONIC now when tracing (the `call` of [`Trace::tx`]), else 0 (no
    /// clock read).
    #[inline]
    pub fn stamp(&self) -> u64 {
        if self.on() {
            mono_ns()
        } else {
            0
        }
    }

    /// Packets just sent: `run` holds segments of `seg` bytes; `iter` is the loop
    /// iteration's start, `call` the [`Trace::stamp`] taken just before the send call.
    #[inline]
    pub fn tx(&mut self, iter: Instant, call: u64, run: &[u8], seg: usize) {
        if !self.on() {
            return;
        }
        let (start, at) = (self.clock.monotonic_ns(iter), mono_ns());
        for pkt in run.chunks(seg.max(1)) {
            self.push(Kind::Tx, pkt, (start, call, at));
        }
    }

    /// A datagram just received.
    #[inline]
    pub fn rx(&mut self, pkt: &[u8]) {
        if self.on() {
            let at = mono_ns();
            self.push(Kind::Rx, pkt, (at, at, at));
        }
    }

    /// `n` completions written, about to be published.
    #[inline]
    pub fn cqe(&mut self, n: usize) {
        if self.on() && n > 0 {
            let at = mono_ns();
            self.events.push(Event {
                kind: Kind::Cqe,
                opcode: 0,
                qpn: 0,
                psn: n as u32,
                start: at,
                call: at,
                at,
            });
        }
    }

    /// Writes the events to the trace file (when tracing).
    pub fn finish(&mut self) {
        let Some(path) = self.path.take() else {
            return;
        };
        if let Err(e) = write_events(&path, &self.events) {
            tracing::warn!(error = %e, path = %path.display(), "trace not written");
        }
    }
}

fn write_events(path: &std::path::Path, events: &[Event]) -> io::Result<()> {
    let mut w = io::BufWriter::new(std::fs::File::create(path)?);
    for e in events {
        let kind = match e.kind {
            Kind::Tx => "tx",
            Kind::Rx => "rx",
            Kind::Cqe => "cqe",
        };
        writeln!(
            w,
            "{kind} {} {} {} {} {} {}",
            e.opcode, e.qpn, e.psn, e.start, e.call, e.at
        )?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_bth_fields_and_writes_lines() {
        let clock = Clock::new();
        let dir = std::env::temp_dir().join(format!("softnic-trace-{}", std::process::id()));
        let mut t = Trace::new(Some(dir.clone()), &clock);
        let mut pkt = [0u8; 16];
        pkt[0] = 0x04; // RC SEND_ONLY
        pkt[5..8].copy_from_slice(&[0, 1, 2]);
        pkt[9..12].copy_from_slice(&[0, 0, 7]);
        let iter = clock.now();
        let call = t.stamp();
        t.tx(iter, call, &pkt, 16);
        t.rx(&pkt);
        t.cqe(1);
        t.finish();
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("tx 4 258 7 "), "{}", lines[0]);
        assert!(lines[1].starts_with("rx 4 258 7 "), "{}", lines[1]);
        assert!(lines[2].starts_with("cqe 0 0 1 "), "{}", lines[2]);
        let f: Vec<u64> = lines[0]
            .split(' ')
            .skip(4)
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(f.len(), 3);
        assert!(
            f[0] <= f[1] && f[1] <= f[2],
            "the iteration starts before the send is called, which is before it returns"
        );
    }

    #[test]
    fn off_records_nothing() {
        let mut t = Trace::default();
        assert_eq!(t.stamp(), 0, "no clock read when off");
        t.rx(&[0u8; 16]);
        t.cqe(3);
        assert!(t.events.is_empty());
    }
}
