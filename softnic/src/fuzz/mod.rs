//! `softnic fuzz`: a stateful RoCEv2 fuzzer aimed at a live peer (another RDMA stack:
//! Linux rxe, a hardware RNIC, softnic itself). See `docs/fuzzing.md`.
//!
//! It connects to a stock server on the target the way the real tools do (the
//! `ibv_rc_pingpong` exchange, optionally with softnic's region message), learns the
//! server QP's QPN, PSN and GID (and R_Key and address), and then, from its own UDP
//! socket — no NIC — sends sequences of crafted packets, each valid enough to pass the
//! ICRC, QPN and PSN checks and then wrong in one structured way. The peer's answers
//! are the coverage signal; a peer that stops answering a fresh connection is a
//! finding, saved as a pcap and a replay file and minimised.
//!
//! One job per file: [`seq`] (packets and rebasing them onto a connection), [`gen`]
//! (the mutations), [`link`] (the exchange and the UDP socket), [`answer`] (answer
//! classes), [`coverage`] (table and corpus), [`engine`] (batches, probes, findings),
//! [`minimize`] (delta debugging), [`finding`] (pcap and replay files).

pub mod answer;
pub mod coverage;
pub mod engine;
pub mod finding;
pub mod gen;
pub mod link;
pub mod minimize;
pub mod seq;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

pub use engine::{Config, Fuzzer, Probe, Report};
pub use link::{ConnectSpec, Exchange};
use minimize::Outcome;

/// `softnic fuzz` arguments.
#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FuzzArgs {
    /// `softnic fuzz replay FILE`: send a saved finding again.
    #[command(subcommand)]
    pub command: Option<FuzzCommand>,
    /// The run's options.
    #[command(flatten)]
    pub run: RunOpts,
}

/// Subcommands of `softnic fuzz`.
#[derive(Subcommand, Debug, Clone)]
pub enum FuzzCommand {
    /// Replay a finding (its `.json` file) on a fresh connection and probe the peer.
    /// Exit 0: the peer survived; 2: the finding reproduced; 1: the replay could not run.
    Replay(ReplayArgs),
}

/// Where the target is and how to reach it (shared by a run and a replay).
#[derive(Args, Debug, Clone)]
pub struct TargetOpts {
    /// The server's exchange address, ADDR[:PORT] (port default 18515, `ibv_rc_pingpong`'s).
    #[arg(long)]
    pub target: Option<String>,
    /// Our RoCEv2 address: bound as LOCAL:UDP-PORT and announced as our GID. Must be
    /// an address the peer routes to us.
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// The RoCEv2 UDP port, ours and the peer's.
    #[arg(long)]
    pub udp_port: Option<u16>,
    /// The exchange the server speaks.
    #[arg(long, value_enum)]
    pub exchange: Option<Exchange>,
    /// How long to wait for the server to accept (servers restarting in a loop), ms.
    #[arg(long, default_value_t = 10_000)]
    pub connect_timeout_ms: u64,
    /// The liveness probe: `auto` (a 4-byte WRITE when the exchange gives a region, else
    /// a zero-length SEND), `send`, `write`, `read` or `atomic` (FETCH_ADD of 0) — an
    /// operation the server's QP allows (`read` for `ib_read_bw`, `atomic` for
    /// `ib_atomic_bw`).
    #[arg(long, value_enum)]
    pub probe: Option<Probe>,
    /// How long the liveness probe waits for its ACK, ms.
    #[arg(long, default_value_t = 1_000)]
    pub probe_timeout_ms: u64,
    /// How long to wait for answers after each sequence, ms.
    #[arg(long, default_value_t = 10)]
    pub answer_ms: u64,
    /// Packets per second, at most.
    #[arg(long, default_value_t = 20_000.0)]
    pub rate: f64,
}

/// `softnic fuzz --target …` options.
#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Where the target is.
    #[command(flatten)]
    pub target: TargetOpts,
    /// Seed: the same seed and the same answers give the same packets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many fuzz packets.
    #[arg(long, default_value_t = 100_000)]
    pub packets: u64,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub seconds: f64,
    /// Fuzz packets per connection (then a liveness probe on a fresh connection).
    #[arg(long, default_value_t = 500)]
    pub batch: u64,
    /// Path MTU (bytes) the mutations assume (the server's `-m`).
    #[arg(long, default_value_t = 1024)]
    pub mtu: usize,
    /// Where findings (pcap + replay file) are written.
    #[arg(long, default_value = "softnic-fuzz-findings")]
    pub out: PathBuf,
    /// Do not minimise findings.
    #[arg(long)]
    pub no_minimize: bool,
    /// Most minimisation trials (each: two connections).
    #[arg(long, default_value_t = 200)]
    pub max_trials: usize,
}

/// `softnic fuzz replay` arguments.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The replay file (`finding-N.json` or `finding-N-min.json`).
    pub file: PathBuf,
    /// Overrides of the target settings saved in the file.
    #[command(flatten)]
    pub target: TargetOpts,
}

/// Default exchange port.
const DEFAULT_TCP_PORT: u16 = verbs_api::oob::DEFAULT_PORT;

/// `ADDR` → `ADDR:18515`; `ADDR:PORT` and `[V6]:PORT` stay.
fn with_port(t: &str) -> String {
    if t.parse::<SocketAddr>().is_ok() {
        return t.to_string();
    }
    if t.parse::<IpAddr>().is_ok_and(|a| a.is_ipv6()) {
        return format!("[{t}]:{DEFAULT_TCP_PORT}");
    }
    if t.contains(':') {
        t.to_string()
    } else {
        format!("{t}:{DEFAULT_TCP_PORT}")
    }
}

/// A QPN for the fuzzer's fake QP, from the seed (24 bits, never 0 or 1).
fn our_qpn(seed: u64) -> u32 {
    let mut r = crate::nic::rng::SplitMix64::new(seed ^ 0x5EED_F022_0000);
    0x100 + (r.next_u32() % 0xFF_FE00)
}

fn config(o: &RunOpts) -> Result<Config, String> {
    let t = &o.target;
    let target = with_port(
        t.target
            .as_deref()
            .ok_or("--target ADDR[:PORT] is required")?,
    );
    let local = t
        .local
        .ok_or("--local IP is required (our RoCEv2 address, announced as our GID)")?;
    let udp_port = t.udp_port.unwrap_or(wire::ROCEV2_UDP_PORT);
    if o.mtu < 256 || o.mtu > 4096 || !o.mtu.is_power_of_two() {
        return Err(format!("--mtu {} is not an IB MTU (256..=4096)", o.mtu));
    }
    if !(o.seconds > 0.0 && o.seconds.is_finite()) || o.batch == 0 || o.packets == 0 {
        return Err("--seconds, --batch and --packets must be positive".into());
    }
    if !(t.rate > 0.0 && t.rate.is_finite()) {
        return Err("--rate must be positive".into());
    }
    Ok(Config {
        spec: ConnectSpec {
            target,
            exchange: t.exchange.unwrap_or(Exchange::Pingpong),
            local,
            udp_port,
            our_qpn: our_qpn(o.seed),
            timeout: Duration::from_millis(t.connect_timeout_ms),
            mtu: o.mtu as u32,
        },
        bind: SocketAddr::new(local, udp_port),
        seed: o.seed,
        packets: o.packets,
        duration: Duration::from_secs_f64(o.seconds),
        rate: t.rate,
        batch: o.batch,
        mtu: o.mtu,
        answer_wait: Duration::from_millis(t.answer_ms),
        probe_timeout: Duration::from_millis(t.probe_timeout_ms),
        probe: t.probe.unwrap_or_default(),
        out_dir: o.out.clone(),
        minimize: !o.no_minimize,
        max_trials: o.max_trials,
    })
}

/// What a run will do, printed before it starts.
pub fn describe(c: &Config) -> String {
    let secs = c.packets as f64 / c.rate;
    format!(
        "softnic fuzz: structured RoCEv2 mutations (opcode sequences, PSN window edges and wrap, \
         lengths/pads, RETH/AtomicETH/DETH/ImmDt/IETH fields, P_Key/Q_Key, duplicates, \
         bad ICRCs)\n  to:    the QP of the server at {} ({:?} exchange), RoCEv2 to its GID on UDP {}\n  \
         from:  {} (our GID, fake QPN {:#08x})\n  how fast: at most {} packets/s\n  how long: \
         {} fuzz packets or {:.0} s, whichever comes first (at least {:.1} s at that rate), \
         {} packets per connection, a liveness probe after each\n  seed {}; findings to {}",
        c.spec.target,
        c.spec.exchange,
        c.spec.udp_port,
        c.bind,
        c.spec.our_qpn,
        c.rate,
        c.packets,
        c.duration.as_secs_f64(),
        secs,
        c.batch,
        c.seed,
        c.out_dir.display()
    )
}

/// The run's closing summary.
pub fn summary(r: &Report) -> String {
    format!(
        "{} fuzz packets ({} datagrams) in {} sequences over {} connections, {:.1} s; corpus {}; findings {}\n{}",
        r.packets,
        r.datagrams,
        r.sequences,
        r.connections,
        r.elapsed.as_secs_f64(),
        r.corpus,
        r.findings.len(),
        r.coverage.table()
    )
}

/// Entry point of `softnic fuzz`.
pub fn main(a: FuzzArgs) -> ExitCode {
    let r = match &a.command {
        Some(FuzzCommand::Replay(r)) => return replay_main(r),
        None => config(&a.run),
    };
    let cfg = match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softnic fuzz: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", describe(&cfg));
    let mut out = std::io::stdout();
    let result = Fuzzer::new(cfg).and_then(|f| f.run(&mut out));
    match result {
        Ok(rep) => {
            println!("{}", summary(&rep));
            if rep.findings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("softnic fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay_main(a: &ReplayArgs) -> ExitCode {
    let r = match finding::Replay::load(&a.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("softnic fuzz replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    let t = &a.target;
    let local = t.local.unwrap_or(r.local);
    let udp_port = t.udp_port.unwrap_or(r.udp_port);
    let cfg = Config {
        spec: ConnectSpec {
            target: t
                .target
                .as_deref()
                .map_or_else(|| r.target.clone(), with_port),
            exchange: t.exchange.unwrap_or(r.exchange),
            local,
            udp_port,
            our_qpn: r.our_qpn,
            timeout: Duration::from_millis(t.connect_timeout_ms),
            mtu: r.mtu,
        },
        bind: SocketAddr::new(local, udp_port),
        seed: r.seed,
        packets: r.packets.len() as u64,
        duration: Duration::MAX,
        rate: t.rate,
        batch: u64::MAX,
        mtu: r.mtu as usize,
        answer_wait: Duration::from_millis(t.answer_ms),
        probe_timeout: Duration::from_millis(t.probe_timeout_ms),
        probe: t.probe.unwrap_or(r.probe),
        out_dir: PathBuf::new(),
        minimize: false,
        max_trials: 0,
    };
    println!(
        "softnic fuzz replay: {} packets ({}) to the server at {} from {}, at most {} packets/s; \
         then a liveness probe",
        r.packets.len(),
        r.why,
        cfg.spec.target,
        cfg.bind,
        cfg.rate
    );
    let f = match Fuzzer::new(cfg) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("softnic fuzz replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    match f.replay(&r).0 {
        Outcome::Fails => {
            println!("REPRODUCED: the peer failed the liveness probe after the replay");
            ExitCode::from(2)
        }
        Outcome::Passes => {
            println!("not reproduced: the peer answered the liveness probe");
            ExitCode::SUCCESS
        }
        Outcome::Unresolved => {
            eprintln!("softnic fuzz replay: no exchange with {}", r.target);
            ExitCode::FAILURE
        }
    }
}
