//! The fuzzing loop. One *batch* is one connection: the exchange, the liveness probe,
//! then sequences until the batch's packet budget is spent or the peer's QP dies, then a
//! terminating request and the TCP close (stock servers such as `ibv_rc_pingpong` exit
//! when their QP fails; servers restarted in a loop are then ready for the next
//! connection). The *liveness probe* — one valid WRITE (or SEND, when the exchange gives
//! no region) on the fresh connection, which must be answered with an ACK (or an RNR
//! NAK) — thereby checks the peer after every batch; no exchange or no answer is a
//! finding: the previous batch's packets are saved (pcap and replay file) and
//! minimised by delta debugging, each trial a fresh connection and a probe.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use wire::aeth::AethRepr;
use wire::{AtomicEthRepr, BthRepr, Msn, Opcode, PacketRepr, Psn, Qpn, RethRepr, Syndrome};

use super::answer::{classify, Answer, Class};
use super::coverage::{Corpus, Coverage, Entry};
use super::finding::{Replay, REPLAY_VERSION};
use super::gen::{self, Aim};
use super::link::{connect, Conn, ConnectSpec, Link};
use super::minimize::{ddmin, Outcome};
use super::seq::{rebase_all, Ctx, Pkt};
use crate::nic::rng::SplitMix64;

/// The liveness probe's request. A stock server's QP allows only the remote access its
/// test needs (an `ib_read_bw` server's QP refuses a WRITE with an invalid-request NAK,
/// IBTA 9.7.4.2.2, and the QP fails), so the probe must be an operation the peer's QP
/// allows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Probe {
    /// A 4-byte RDMA WRITE into the peer's region when the exchange gave one, else a
    /// zero-length SEND.
    #[default]
    Auto,
    /// A zero-length SEND (the peer must have a receive posted, or answer RNR NAK).
    Send,
    /// A 4-byte RDMA WRITE into the peer's region.
    Write,
    /// A 4-byte RDMA READ of the peer's region, answered by a READ response.
    Read,
    /// A FETCH_ADD of 0 at the peer's region (changes nothing), answered by an atomic ACK.
    Atomic,
}

/// A run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// How to reach the server.
    pub spec: ConnectSpec,
    /// The UDP address the fuzzer binds (its RoCEv2 address).
    pub bind: SocketAddr,
    /// Seed of every random choice.
    pub seed: u64,
    /// Stop after this many fuzz packets.
    pub packets: u64,
    /// Stop after this long.
    pub duration: Duration,
    /// Packets per second, at most (every packet: fuzz, heartbeat, probe).
    pub rate: f64,
    /// Fuzz packets per connection.
    pub batch: u64,
    /// Path MTU the generator assumes.
    pub mtu: usize,
    /// How long to wait for answers after a sequence.
    pub answer_wait: Duration,
    /// How long the liveness probe waits for its ACK.
    pub probe_timeout: Duration,
    /// Which request the liveness probe is.
    pub probe: Probe,
    /// Where findings go.
    pub out_dir: PathBuf,
    /// Minimise findings.
    pub minimize: bool,
    /// Most minimisation trials.
    pub max_trials: usize,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Fuzz packets sent (not counting heartbeats, probes, terminators, ACKs).
    pub packets: u64,
    /// Every datagram sent.
    pub datagrams: u64,
    /// Sequences sent.
    pub sequences: u64,
    /// Connections made (batches, probes, trials).
    pub connections: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Answer classes reached.
    pub coverage: Coverage,
    /// Corpus size at the end.
    pub corpus: usize,
    /// Replay files written (the finding, then its minimised form).
    pub findings: Vec<PathBuf>,
    /// Packets of the minimised finding, if minimised.
    pub minimized_len: Option<usize>,
}

/// Spaces sends at most `rate` per second.
struct Pacer {
    per: Duration,
    next: Instant,
}

impl Pacer {
    fn new(rate: f64) -> Self {
        let per = if rate > 0.0 {
            Duration::from_secs_f64(1.0 / rate)
        } else {
            Duration::ZERO
        };
        Pacer {
            per,
            next: Instant::now(),
        }
    }

    fn wait(&mut self) {
        let now = Instant::now();
        if self.next > now {
            std::thread::sleep(self.next - now);
        }
        self.next = self.next.max(now) + self.per;
    }
}

/// One connection being fuzzed.
struct Session {
    conn: Conn,
    /// The PSN the peer's responder expects next, as its answers tell us.
    epsn: u32,
    /// Every packet sent to the peer's QP on this connection, as made.
    log: Vec<Pkt>,
    /// MSN of our ACKs to the peer's own requests.
    msn: u32,
}

/// The fuzzer.
pub struct Fuzzer {
    cfg: Config,
    link: Link,
    rng: SplitMix64,
    pacer: Pacer,
    corpus: Corpus,
    history: Vec<Pkt>,
    report: Report,
}

/// A request with AckReq set and the given extension headers and payload.
fn request(
    op: Opcode,
    qpn: u32,
    psn: u32,
    reth: Option<RethRepr>,
    atomic_eth: Option<AtomicEthRepr>,
    payload: &[u8],
) -> Pkt {
    let mut r = PacketRepr::new(BthRepr {
        ack_req: true,
        ..BthRepr::new(op, Qpn::new(qpn), Psn::new(psn))
    });
    r.reth = reth;
    r.atomic_eth = atomic_eth;
    r.payload_len = payload.len();
    let mut buf = vec![0u8; r.total_len().unwrap_or(16)];
    let _ = r.emit(&mut buf, payload);
    Pkt::new(buf)
}

/// A packet with one BTH, AckReq set, and a RETH with 4 payload bytes or none
/// (SEND_ONLY, WRITE_ONLY).
fn simple(op: Opcode, qpn: u32, psn: u32, reth: Option<RethRepr>) -> Pkt {
    let payload: &[u8] = if reth.is_some() { &[0x5a; 4] } else { &[] };
    request(op, qpn, psn, reth, None, payload)
}

/// The liveness probe at `psn` on the connection `c`: a valid request of the kind
/// `probe` asks for. [`Probe::Auto`] is a 4-byte WRITE when the exchange gave a region
/// (a perftest WRITE server posts no receives), else a zero-length SEND.
fn probe_packet(probe: Probe, c: &Ctx, psn: u32) -> Pkt {
    let region = c.rkey != 0 || c.va != 0;
    let reth = RethRepr {
        va: c.va,
        rkey: c.rkey,
        dma_len: 4,
    };
    let qpn = c.peer_qpn;
    match probe {
        Probe::Auto if region => simple(Opcode::RC_RDMA_WRITE_ONLY, qpn, psn, Some(reth)),
        Probe::Write => simple(Opcode::RC_RDMA_WRITE_ONLY, qpn, psn, Some(reth)),
        Probe::Auto | Probe::Send => simple(Opcode::RC_SEND_ONLY, qpn, psn, None),
        Probe::Read => request(
            Opcode::RC_RDMA_READ_REQUEST,
            qpn,
            psn,
            Some(reth),
            None,
            &[],
        ),
        Probe::Atomic => {
            let add = AtomicEthRepr {
                va: c.va & !7,
                rkey: c.rkey,
                swap_add: 0,
                compare: 0,
            };
            request(Opcode::RC_FETCH_ADD, qpn, psn, None, Some(add), &[])
        }
    }
}

/// True when PSN `a` is after `b` in 24-bit serial arithmetic.
fn psn_after(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b) & 0xFF_FFFF;
    d != 0 && d < 0x80_0000
}

impl Fuzzer {
    /// Binds the UDP socket.
    pub fn new(cfg: Config) -> Result<Fuzzer, String> {
        let link = Link::bind(cfg.bind).map_err(|e| format!("bind {}: {e}", cfg.bind))?;
        Ok(Fuzzer {
            rng: SplitMix64::new(cfg.seed),
            pacer: Pacer::new(cfg.rate),
            link,
            cfg,
            corpus: Corpus::default(),
            history: Vec::new(),
            report: Report::default(),
        })
    }

    fn send(&mut self, s: &mut Session, p: &Pkt) {
        self.pacer.wait();
        self.link.send(p, s.conn.peer);
        self.report.datagrams += 1;
        s.log.push(p.clone());
    }

    /// Acknowledges a request of the peer's own (so `ibv_rc_pingpong`'s SENDs complete
    /// instead of retrying until its QP fails).
    fn ack_peer(&mut self, s: &mut Session, psn: u32) {
        s.msn = s.msn.wrapping_add(1);
        let mut r = PacketRepr::new(BthRepr::new(
            Opcode::RC_ACKNOWLEDGE,
            Qpn::new(s.conn.ctx.peer_qpn),
            Psn::new(psn),
        ));
        r.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credits: 0x1F },
            msn: Msn::new(s.msn),
        });
        let mut buf = vec![0u8; r.total_len().unwrap_or(20)];
        if r.emit(&mut buf, &[]).is_ok() {
            self.link.send(&Pkt::new(buf), s.conn.peer);
            self.report.datagrams += 1;
        }
    }

    /// Answers from the peer until `wait` passes, or shortly after the packet with PSN
    /// `last_psn` is answered. Updates the expected PSN from what the answers say.
    fn collect(&mut self, s: &mut Session, wait: Duration, last_psn: Option<u32>) -> Vec<Answer> {
        let mut out = Vec::new();
        let mut deadline = Instant::now() + wait;
        while let Some(r) = self.link.recv_until(deadline) {
            if r.from.ip() != s.conn.peer.ip() {
                continue;
            }
            let a = classify(&r.bytes, r.icrc.is_some());
            match a.class {
                Class::PeerRequest if a.wants_ack => self.ack_peer(s, a.psn),
                Class::Ack | Class::AtomicAck | Class::ReadResponse => {
                    let next = a.psn.wrapping_add(1) & 0xFF_FFFF;
                    if psn_after(next, s.epsn) {
                        s.epsn = next;
                    }
                }
                Class::Nak(_) | Class::RnrNak => s.epsn = a.psn,
                _ => {}
            }
            // Done soon after the last packet is answered, or after a NAK (a responder
            // sends one and then drops what follows until the PSN it asked for, or dies).
            let settled = matches!(a.class, Class::Nak(_) | Class::RnrNak)
                || (a.class != Class::PeerRequest
                    && a.class != Class::Malformed
                    && Some(a.psn) == last_psn);
            if settled {
                deadline = deadline.min(Instant::now() + Duration::from_millis(2));
            }
            out.push(a);
        }
        out
    }

    /// Is the QP still answering? A zero-length SEND at the last PSN it acknowledged — a
    /// duplicate, which a live RC responder re-acknowledges without executing it. After
    /// a fatal NAK one short try (the QP should be in the error state); after silence
    /// two longer ones.
    fn heartbeat(&mut self, s: &mut Session, after_fatal: bool) -> bool {
        let psn = s.epsn.wrapping_sub(1) & 0xFF_FFFF;
        let p = simple(Opcode::RC_SEND_ONLY, s.conn.ctx.peer_qpn, psn, None);
        let (tries, wait) = if after_fatal {
            (1, self.cfg.answer_wait)
        } else {
            (2, self.cfg.answer_wait * 2)
        };
        for _ in 0..tries {
            self.send(s, &p);
            let answers = self.collect(s, wait, Some(psn));
            if answers
                .iter()
                .any(|a| !matches!(a.class, Class::PeerRequest | Class::Malformed))
            {
                return true;
            }
        }
        false
    }

    /// Ends a connection: a request that fails the R_Key check (fatal to an RC
    /// responder, so a server waiting on its QP sees an error and exits), then the TCP
    /// close.
    fn terminate(&mut self, s: Session) {
        let reth = RethRepr {
            va: 0,
            rkey: !s.conn.ctx.rkey,
            dma_len: 4,
        };
        let p = simple(
            Opcode::RC_RDMA_WRITE_ONLY,
            s.conn.ctx.peer_qpn,
            s.epsn,
            Some(reth),
        );
        self.pacer.wait();
        self.link.send(&p, s.conn.peer);
        self.report.datagrams += 1;
        drop(s);
    }

    fn open(&mut self, our_psn: u32) -> Result<Session, String> {
        let conn = connect(&self.cfg.spec, our_psn)?;
        self.report.connections += 1;
        Ok(Session {
            epsn: our_psn,
            conn,
            log: Vec::new(),
            msn: 0,
        })
    }

    /// A first PSN: a quarter of connections start just before the 24-bit wrap.
    fn first_psn(&mut self) -> u32 {
        if self.rng.chance(0.25) {
            0xFF_FFFF - self.rng.below(32) as u32
        } else {
            self.rng.next_u32() & 0xFF_FFFF
        }
    }

    /// A fresh connection whose first packet is the liveness probe: one valid request
    /// at the first PSN, which must be answered.
    fn open_probed(&mut self, psn: u32) -> Result<Session, String> {
        let mut s = self
            .open(psn)
            .map_err(|e| format!("liveness probe: no exchange: {e}"))?;
        let c = s.conn.ctx;
        let p = probe_packet(self.cfg.probe, &c, psn);
        let wait = self.cfg.probe_timeout / 3;
        for _ in 0..3 {
            self.send(&mut s, &p);
            let answers = self.collect(&mut s, wait, Some(psn));
            // An RNR NAK answers too: the peer is alive, only out of receives.
            if answers.iter().any(|a| {
                a.psn == psn
                    && matches!(
                        a.class,
                        Class::Ack | Class::RnrNak | Class::ReadResponse | Class::AtomicAck
                    )
            }) {
                return Ok(s);
            }
        }
        self.terminate(s);
        Err(format!(
            "liveness probe: no answer to a valid request on a fresh connection within {:?}",
            self.cfg.probe_timeout
        ))
    }

    /// The liveness probe on a connection of its own.
    pub fn probe(&mut self) -> Result<(), String> {
        let psn = self.rng.next_u32() & 0xFF_FFFF;
        let s = self.open_probed(psn)?;
        self.terminate(s);
        Ok(())
    }

    fn done(&self, start: Instant) -> bool {
        self.report.packets >= self.cfg.packets || start.elapsed() >= self.cfg.duration
    }

    /// The next sequence: a mutant of a corpus entry half the time, else a fresh one.
    fn next_seq(&mut self, aim: &Aim) -> Vec<Pkt> {
        if !self.corpus.is_empty() && self.rng.chance(0.5) {
            if let Some(e) = self.corpus.pick(&mut self.rng) {
                let (mut q, from) = (e.seq.clone(), e.ctx);
                rebase_all(&mut q, &from, &aim.ctx);
                return gen::mutate(aim, &mut self.rng, q, &self.history);
            }
        }
        gen::fresh(aim, &mut self.rng, &self.history)
    }

    /// One batch on `s`.
    fn batch(&mut self, s: &mut Session, start: Instant) {
        let mut sent = 0u64;
        while sent < self.cfg.batch && !self.done(start) {
            let aim = Aim {
                ctx: Ctx {
                    base_psn: s.epsn,
                    ..s.conn.ctx
                },
                our_qpn: self.cfg.spec.our_qpn,
                mtu: self.cfg.mtu,
            };
            let mut seq = self.next_seq(&aim);
            // `--packets` is exact: the last sequence is cut to what is left.
            seq.truncate((self.cfg.packets - self.report.packets) as usize);
            for p in &seq {
                self.send(s, p);
            }
            sent += seq.len() as u64;
            self.report.packets += seq.len() as u64;
            self.report.sequences += 1;
            let last = seq.last().map_or(0, |p| p.opcode().0);
            let answers = self.collect(s, self.cfg.answer_wait, seq.last().and_then(Pkt::psn));
            let mut pairs: Vec<(u8, Class)> = answers
                .iter()
                .map(|a| {
                    let op = seq
                        .iter()
                        .rev()
                        .find(|p| p.psn() == Some(a.psn))
                        .map_or(last, |p| p.opcode().0);
                    (op, a.class)
                })
                .collect();
            let responded = answers
                .iter()
                .any(|a| !matches!(a.class, Class::PeerRequest | Class::Malformed));
            if answers.is_empty() {
                pairs.push((last, Class::Silence));
            }
            let fatal = answers.iter().any(|a| a.class.is_fatal_nak());
            let dead = (!responded || fatal) && !self.heartbeat(s, fatal);
            if dead {
                pairs.push((last, Class::QpDeath));
            }
            if self.report.coverage.record(&pairs, self.report.packets) {
                self.corpus.add(
                    Entry {
                        seq: seq.clone(),
                        ctx: aim.ctx,
                    },
                    &mut self.rng,
                );
            }
            self.history.extend(seq);
            let n = self.history.len();
            if n > 64 {
                self.history.drain(..n - 64);
            }
            if dead {
                break;
            }
        }
    }

    /// Sends `packets` (made for `from`) on a fresh connection whose first PSN is
    /// `from.base_psn`, ends it, and probes. `Fails` when the probe fails.
    pub fn trial(&mut self, from: &Ctx, packets: &[Pkt]) -> Outcome {
        let mut s = match self.open(from.base_psn) {
            Ok(s) => s,
            Err(_) => return Outcome::Unresolved,
        };
        let mut q = packets.to_vec();
        rebase_all(&mut q, from, &s.conn.ctx);
        for p in &q {
            self.send(&mut s, p);
            // Answer the peer's requests as a batch would.
            let _ = self.collect(&mut s, Duration::ZERO, None);
        }
        let _ = self.collect(&mut s, self.cfg.answer_wait, None);
        self.terminate(s);
        match self.probe() {
            Ok(()) => Outcome::Passes,
            Err(_) => Outcome::Fails,
        }
    }

    fn replay_of(&self, why: &str, ctx: Ctx, packets: Vec<Pkt>) -> Replay {
        Replay {
            softnic_fuzz_replay: REPLAY_VERSION,
            why: why.to_string(),
            target: self.cfg.spec.target.clone(),
            exchange: self.cfg.spec.exchange,
            local: self.cfg.bind.ip(),
            udp_port: self.cfg.bind.port(),
            our_qpn: self.cfg.spec.our_qpn,
            mtu: self.cfg.spec.mtu,
            probe: self.cfg.probe,
            ctx,
            seed: self.cfg.seed,
            packets,
        }
    }

    /// Saves a finding and, if configured, its minimised form.
    fn finding(
        &mut self,
        why: &str,
        ctx: Ctx,
        peer: SocketAddr,
        log: Vec<Pkt>,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        std::fs::create_dir_all(&self.cfg.out_dir)
            .map_err(|e| format!("{}: {e}", self.cfg.out_dir.display()))?;
        let n = self.report.findings.len() + 1;
        let stem = self.cfg.out_dir.join(format!("finding-{n}"));
        let path = self.replay_of(why, ctx, log.clone()).save(&stem, peer)?;
        let _ = writeln!(
            out,
            "FINDING: {why}\n  {} packets on the connection before it: {}\n  replay: softnic fuzz replay {}",
            log.len(),
            stem.with_extension("pcap").display(),
            path.display()
        );
        self.report.findings.push(path);
        if !self.cfg.minimize {
            return Ok(());
        }
        let _ = writeln!(
            out,
            "  minimising (at most {} trials)…",
            self.cfg.max_trials
        );
        // The whole sequence must reproduce before it is worth reducing.
        if self.trial(&ctx, &log) != Outcome::Fails {
            let _ = writeln!(
                out,
                "  the full sequence did not reproduce on a fresh connection; not minimised"
            );
            return Ok(());
        }
        let max = self.cfg.max_trials;
        let (min, trials) = ddmin(&log, max, |cand| self.trial(&ctx, cand));
        let stem = self.cfg.out_dir.join(format!("finding-{n}-min"));
        let path = self.replay_of(why, ctx, min.clone()).save(&stem, peer)?;
        let _ = writeln!(
            out,
            "  minimised to {} packets in {trials} trials: {}\n  replay: softnic fuzz replay {}",
            min.len(),
            stem.with_extension("pcap").display(),
            path.display()
        );
        self.report.minimized_len = Some(min.len());
        self.report.findings.push(path);
        Ok(())
    }

    /// The run: batches until a bound or a finding. Every connection opens with the
    /// liveness probe, which thereby checks the peer after the previous batch; a final
    /// probe follows the last.
    pub fn run(mut self, out: &mut dyn Write) -> Result<Report, String> {
        let start = Instant::now();
        let mut prev: Option<(Ctx, SocketAddr, Vec<Pkt>)> = None;
        loop {
            let psn = self.first_psn();
            let mut s = match self.open_probed(psn) {
                Ok(s) => s,
                Err(why) => match prev {
                    Some((ctx, peer, log)) => {
                        self.finding(&why, ctx, peer, log, out)?;
                        break;
                    }
                    None => {
                        return Err(format!(
                            "the target does not pass the liveness probe before fuzzing: {why}"
                        ))
                    }
                },
            };
            if self.done(start) {
                self.terminate(s);
                break;
            }
            self.batch(&mut s, start);
            let ctx = Ctx {
                base_psn: psn,
                ..s.conn.ctx
            };
            prev = Some((ctx, s.conn.peer, std::mem::take(&mut s.log)));
            self.terminate(s);
        }
        self.report.elapsed = start.elapsed();
        self.report.corpus = self.corpus.len();
        Ok(self.report)
    }

    /// Replays a saved finding once: `Fails` when the peer fails the probe after it.
    pub fn replay(mut self, r: &Replay) -> (Outcome, Report) {
        let o = self.trial(&r.ctx, &r.packets);
        (o, self.report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each probe is the valid request it names, at the PSN asked for, aimed at the
    /// peer's QP and region, with AckReq set (the peer must answer it).
    #[test]
    fn probes_are_the_requests_they_name() {
        let with_region = Ctx {
            peer_qpn: 0x11,
            base_psn: 0,
            rkey: 0x1234,
            va: 0x7f00_0000_1003,
        };
        let no_region = Ctx {
            rkey: 0,
            va: 0,
            ..with_region
        };
        let cases = [
            (Probe::Auto, with_region, Opcode::RC_RDMA_WRITE_ONLY),
            (Probe::Auto, no_region, Opcode::RC_SEND_ONLY),
            (Probe::Send, with_region, Opcode::RC_SEND_ONLY),
            (Probe::Write, with_region, Opcode::RC_RDMA_WRITE_ONLY),
            (Probe::Read, with_region, Opcode::RC_RDMA_READ_REQUEST),
            (Probe::Atomic, with_region, Opcode::RC_FETCH_ADD),
        ];
        for (probe, c, op) in cases {
            let p = probe_packet(probe, &c, 0xFF_FFFF);
            let r = PacketRepr::parse(&p.bytes).expect("probe parses").repr;
            assert_eq!(r.bth.opcode, op, "{probe:?}");
            assert_eq!(r.bth.psn.value(), 0xFF_FFFF);
            assert_eq!(r.bth.dest_qpn.value(), 0x11);
            assert!(r.bth.ack_req);
            match op {
                Opcode::RC_RDMA_WRITE_ONLY | Opcode::RC_RDMA_READ_REQUEST => {
                    let reth = r.reth.expect("RETH");
                    assert_eq!((reth.va, reth.rkey, reth.dma_len), (c.va, c.rkey, 4));
                    let payload = if op == Opcode::RC_RDMA_WRITE_ONLY {
                        4
                    } else {
                        0
                    };
                    assert_eq!(r.payload_len, payload);
                }
                Opcode::RC_FETCH_ADD => {
                    let a = r.atomic_eth.expect("AtomicETH");
                    // 8-byte aligned (IBTA 9.4.5) and adding 0: the probe changes nothing.
                    assert_eq!((a.va, a.rkey, a.swap_add), (0x7f00_0000_1000, c.rkey, 0));
                }
                _ => assert_eq!(r.payload_len, 0),
            }
        }
    }
}
