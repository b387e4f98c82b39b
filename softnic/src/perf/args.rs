//! `softnic perf` command line (perftest's flag letters) and the resolved parameters,
//! with perftest's defaults and dependencies (`perftest_parameters.c`: `init_perftest_params`,
//! `force_dependencies`).

use std::time::Duration;

use clap::ValueEnum;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TestName {
    /// ib_write_bw
    #[value(name = "write_bw")]
    WriteBw,
    /// ib_read_bw
    #[value(name = "read_bw")]
    ReadBw,
    /// ib_send_bw
    #[value(name = "send_bw")]
    SendBw,
    /// ib_atomic_bw
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// ib_write_lat
    #[value(name = "write_lat")]
    WriteLat,
    /// ib_send_lat
    #[value(name = "send_lat")]
    SendLat,
    /// ib_read_lat
    #[value(name = "read_lat")]
    ReadLat,
}

/// perftest's `VerbType` (the numbers matter: address lines switch on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND = 0.
    Send,
    /// WRITE = 1.
    Write,
    /// READ = 2.
    Read,
    /// ATOMIC = 3.
    Atomic,
}

impl Verb {
    /// `testsStr[]`.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic",
        }
    }
}

/// `-A`: the atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AtomicKind {
    /// IBV_WR_ATOMIC_FETCH_AND_ADD with 1 (`ATOMIC_ADD_VALUE`).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// IBV_WR_ATOMIC_CMP_AND_SWP with compare 0, swap 0 (`ATOMIC_SWAP_VALUE`).
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

impl AtomicKind {
    /// `atomicTypesStr[]`.
    pub fn name(self) -> &'static str {
        match self {
            AtomicKind::FetchAndAdd => "FETCH_AND_ADD",
            AtomicKind::CmpAndSwap => "CMP_AND_SWAP",
        }
    }
}

/// Arguments of `softnic perf` (perftest's flags; see docs/perf-tool.md).
#[derive(clap::Args, Debug, Clone)]
pub struct PerfArgs {
    /// Test: write_bw, read_bw, send_bw, atomic_bw, write_lat, send_lat, read_lat.
    pub test: TestName,
    /// Server to connect to (none: be the server).
    pub host: Option<String>,
    /// softnic device (default: the first found in $SOFTNIC_DIR).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Message size (default 65536 for BW, 2 for latency, 8 for atomics).
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Iterations (default 5000 for BW, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the device's).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// TCP port of the exchange. A server given 0 takes a free port and prints it
    /// (" TCP port of the exchange: N") before it waits: no race for a port between
    /// choosing and listening.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Number of QPs (BW tests only).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Run sizes 2 .. 2^23.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Outstanding READ/atomics (default: the device's maximum).
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u32>,
    /// GID index (1, the address GID; index 0 is the link-local GID, as on rxe).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// Accepted and ignored (perftest: do not fail on CPU frequency differences).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Send queue depth (default 128 for BW, 1 for latency).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (send tests; default 512).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Completion moderation: one signaled send every N (default 100).
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// Largest message sent inline (default 0).
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Atomic operation of atomic_bw.
    #[arg(short = 'A', long = "atomic_type")]
    pub atomic_type: Option<AtomicKind>,
    /// Connection type: RC (default) or UC (WRITE and SEND tests).
    #[arg(short = 'c', long = "connection")]
    pub connection: Option<String>,
    /// rdma_cm connection setup: not supported (refused with an error).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Bidirectional: not supported (refused with an error).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// softnic: check the data (pattern of written/read/sent bytes, atomic results).
    #[arg(long)]
    pub verify: bool,
    /// Receive through one shared receive queue (SEND tests).
    #[arg(long = "use-srq")]
    pub use_srq: bool,
    /// softnic: UDP port of the peer's NIC (perftest's exchange does not carry it).
    #[arg(long = "peer-udp-port", default_value_t = verbs_api::ROCE_V2_PORT)]
    pub peer_udp_port: u16,
    /// The traffic class (IP TOS) of the QPs' packets: `ah_attr.grh.traffic_class`.
    #[arg(long = "tclass", default_value_t = 0)]
    pub tclass: u8,
    /// softnic: longest wait, in seconds, for the peer or a completion.
    #[arg(long = "timeout", default_value_t = 60)]
    pub timeout: u64,
    /// softnic, send_lat only: write each iteration's CLOCK_MONOTONIC stamps (`post N
    /// ns` before each post, `seen N ns` when each peer SEND's completion is polled) to
    /// this file, for the round-trip breakdown of tests/perf/run (nic/trace.rs).
    #[arg(long, value_name = "FILE")]
    pub breakdown: Option<std::path::PathBuf>,
}

/// perftest's `DEF_SIZE_BW`, `DEF_SIZE_LAT`, `DEF_SIZE_ATOMIC`.
const DEF_SIZE_BW: u64 = 65536;
const DEF_SIZE_LAT: u64 = 2;
const DEF_SIZE_ATOMIC: u64 = 8;
/// `DEF_ITERS_WB`, `DEF_ITERS`.
const DEF_ITERS_BW: u64 = 5000;
const DEF_ITERS_LAT: u64 = 1000;
/// `DEF_TX_BW`, `DEF_TX_LAT`, `DEF_RX_SEND`, `DEF_CQ_MOD`.
const DEF_TX_BW: u32 = 128;
const DEF_TX_LAT: u32 = 1;
const DEF_RX_SEND: u32 = 512;
const DEF_CQ_MOD: u32 = 100;
/// perftest's `MSG_SIZE_CQ_MOD_LIMIT`: above this size, with no `-Q` and no `-a`, BW tests
/// signal every WR (`DISABLED_CQ_MOD_VALUE`, 1), and print `CQ Moderation : 1`.
const MSG_SIZE_CQ_MOD_LIMIT: u64 = 8192;
/// `MAX_SIZE`: the largest message of `-a` (2^23).
pub const MAX_SIZE: u64 = 1 << 23;

/// Most QPs of one run (`-q`): the QPN space (24 bits). perftest sets no limit of its
/// own; the device's `max_qp` (the NIC's per-user quota, `softnic run
/// --max-qps-per-user`) is checked when the QPs are created ([`super::resources`]).
pub const MAX_QPS: u32 = (1 << 24) - 1;

/// Resolved parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// The test.
    pub test: TestName,
    /// Its verb.
    pub verb: Verb,
    /// BW (true) or latency test.
    pub bw: bool,
    /// Server side (no host).
    pub is_server: bool,
    /// Host to connect to.
    pub host: Option<String>,
    /// Device name (None: first found).
    pub device: Option<String>,
    /// Message sizes to run, in order.
    pub sizes: Vec<u64>,
    /// Largest of `sizes` (buffers are laid out for it).
    pub max_size: u64,
    /// Iterations per QP.
    pub iters: u64,
    /// Requested MTU in bytes.
    pub mtu: Option<u32>,
    /// TCP port.
    pub port: u16,
    /// Number of QPs.
    pub qps: u32,
    /// Requested outstanding READ/atomics.
    pub outs: Option<u32>,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Receive queue depth.
    pub rx_depth: u32,
    /// Completion moderation.
    pub cq_mod: u32,
    /// Inline threshold.
    pub inline_size: u32,
    /// Atomic operation.
    pub atomic: AtomicKind,
    /// Data verification.
    pub verify: bool,
    /// Peer NIC's UDP port.
    pub peer_udp_port: u16,
    /// `--tclass`.
    pub tclass: u8,
    /// `-c`: RC or UC.
    pub connection: verbs_api::QpType,
    /// `--use-srq`.
    pub use_srq: bool,
    /// Longest wait.
    pub timeout: Duration,
    /// `-a`.
    pub all: bool,
    /// `--breakdown`: stamp file of send_lat.
    pub breakdown: Option<std::path::PathBuf>,
}

impl Params {
    /// Checks the flags and applies perftest's defaults. Errors say what is wrong.
    pub fn resolve(a: &PerfArgs) -> Result<Params, String> {
        use TestName::*;
        if a.rdma_cm {
            return Err(
                "-R (rdma_cm connection setup) is not supported by softnic perf: \
                        run both sides without -R (perftest's TCP exchange)"
                    .into(),
            );
        }
        if a.bidirectional {
            return Err("-b (bidirectional) is not supported by softnic perf".into());
        }
        let connection = match a.connection.as_deref() {
            None | Some("RC") => verbs_api::QpType::Rc,
            Some("UC") => verbs_api::QpType::Uc,
            Some(c) => {
                return Err(format!(
                    "connection type {c} is not supported: only RC and UC"
                ))
            }
        };
        if let Some(g) = a.gid_index {
            if g != verbs_api::gid::ADDRESS_GID_INDEX {
                return Err(format!(
                    "GID index {g} cannot be used: softnic sends from its address, GID \
                     index {} (index 0 is the link-local GID, not routable)",
                    verbs_api::gid::ADDRESS_GID_INDEX
                ));
            }
        }
        let (verb, bw) = match a.test {
            WriteBw => (Verb::Write, true),
            ReadBw => (Verb::Read, true),
            SendBw => (Verb::Send, true),
            AtomicBw => (Verb::Atomic, true),
            WriteLat => (Verb::Write, false),
            SendLat => (Verb::Send, false),
            ReadLat => (Verb::Read, false),
        };
        if a.use_srq && verb != Verb::Send {
            return Err("--use-srq is only for the SEND tests (send_bw, send_lat)".into());
        }
        // UC carries SEND and RDMA WRITE only (no READ or atomic opcodes exist for it).
        if connection == verbs_api::QpType::Uc && !matches!(verb, Verb::Write | Verb::Send) {
            return Err(format!(
                "{} is not available on UC: only the WRITE and SEND tests",
                verb.name()
            ));
        }
        if a.atomic_type.is_some() && verb != Verb::Atomic {
            return Err("-A is only for atomic_bw".into());
        }
        if a.outs.is_some() && !matches!(verb, Verb::Read | Verb::Atomic) {
            return Err("-o (outstanding reads) is only for READ and atomic tests".into());
        }
        if a.qps != 1 && !bw {
            return Err("Multiple QPs only available on bw tests".into());
        }
        if a.qps == 0 || a.qps > MAX_QPS {
            return Err(format!("-q {} is outside 1..={MAX_QPS}", a.qps));
        }
        if let Some(m) = a.mtu {
            if super::exchange::mtu_enum(m).is_none() {
                return Err(format!(
                    "invalid MTU {m}: choose 256, 512, 1024, 2048 or 4096"
                ));
            }
        }
        let def_size = match (verb, bw) {
            (Verb::Atomic, _) => DEF_SIZE_ATOMIC,
            (_, true) => DEF_SIZE_BW,
            (_, false) => DEF_SIZE_LAT,
        };
        let size = a.size.unwrap_or(def_size);
        if verb == Verb::Atomic && size != DEF_SIZE_ATOMIC {
            return Err("atomic operations are 8 bytes: -s must be 8".into());
        }
        if size == 0 || size > MAX_SIZE {
            return Err(format!("size {size} is outside 1..={MAX_SIZE}"));
        }
        let sizes: Vec<u64> = if a.all && verb != Verb::Atomic {
            (1..24).map(|i| 1u64 << i).collect()
        } else {
            vec![size]
        };
        let max_size = sizes.iter().copied().max().unwrap_or(size);
        let iters = a
            .iters
            .unwrap_or(if bw { DEF_ITERS_BW } else { DEF_ITERS_LAT });
        // Latency reports drop the two largest samples of iters - 1.
        let min_iters = if bw { 1 } else { 5 };
        if iters < min_iters || iters > 100_000_000 {
            return Err(format!(
                "iterations {iters} are outside {min_iters}..=100000000"
            ));
        }
        let mut tx_depth = a
            .tx_depth
            .unwrap_or(if bw { DEF_TX_BW } else { DEF_TX_LAT });
        if tx_depth == 0 || tx_depth > 8192 {
            return Err(format!("tx depth {tx_depth} is outside 1..=8192"));
        }
        if u64::from(tx_depth) > iters {
            tx_depth = iters as u32;
        }
        let mut rx_depth = a
            .rx_depth
            .unwrap_or(if verb == Verb::Send { DEF_RX_SEND } else { 1 });
        if rx_depth == 0 || rx_depth > 8192 {
            return Err(format!("rx depth {rx_depth} is outside 1..=8192"));
        }
        if verb == Verb::Send && u64::from(rx_depth) > iters {
            rx_depth = iters as u32;
        }
        let mut cq_mod = match (bw, a.cq_mod) {
            (false, _) => 1,
            (true, Some(q)) => q,
            (true, None) if size > MSG_SIZE_CQ_MOD_LIMIT && !a.all => 1,
            (true, None) => DEF_CQ_MOD,
        };
        if cq_mod == 0 {
            return Err("-Q must be at least 1".into());
        }
        cq_mod = cq_mod.min(tx_depth);
        if a.verify && verb == Verb::Atomic {
            // Checking atomics looks at every completion's original value.
            cq_mod = 1;
        }
        let inline_size = a.inline_size.unwrap_or(0);
        if inline_size > verbs_api::abi::MAX_INLINE as u32 {
            return Err(format!(
                "inline size {inline_size} exceeds softnic's {}",
                verbs_api::abi::MAX_INLINE
            ));
        }
        if a.timeout == 0 {
            return Err("--timeout must be at least 1 second".into());
        }
        if a.breakdown.is_some() && a.test != SendLat {
            return Err("--breakdown is for send_lat only".into());
        }
        Ok(Params {
            test: a.test,
            verb,
            bw,
            is_server: a.host.is_none(),
            host: a.host.clone(),
            device: a.ib_dev.clone(),
            sizes,
            max_size,
            iters,
            mtu: a.mtu,
            port: a.port,
            qps: a.qps,
            outs: a.outs,
            tx_depth,
            rx_depth,
            cq_mod,
            inline_size,
            atomic: a.atomic_type.unwrap_or(AtomicKind::FetchAndAdd),
            verify: a.verify,
            peer_udp_port: a.peer_udp_port,
            tclass: a.tclass,
            connection,
            use_srq: a.use_srq,
            timeout: Duration::from_secs(a.timeout),
            all: a.all,
            breakdown: a.breakdown.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: PerfArgs,
    }

    fn parse(args: &[&str]) -> Result<Params, String> {
        let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Params::resolve(&cli.a)
    }

    #[test]
    fn perftest_defaults() {
        let p = parse(&["write_bw"]).unwrap();
        assert_eq!(
            (p.sizes.clone(), p.iters, p.tx_depth, p.cq_mod),
            (vec![65536], 5000, 128, 1)
        );
        // perftest moderates completions only up to 8 KiB, with -a, or when asked.
        assert_eq!(parse(&["write_bw", "-s", "8192"]).unwrap().cq_mod, 100);
        assert_eq!(parse(&["write_bw", "-s", "8193"]).unwrap().cq_mod, 1);
        assert_eq!(parse(&["write_bw", "-a"]).unwrap().cq_mod, 100);
        let q = parse(&["write_bw", "-s", "65536", "-Q", "50"]).unwrap();
        assert_eq!(q.cq_mod, 50);
        assert!(p.is_server && p.bw);
        let p = parse(&["send_lat", "10.0.0.1"]).unwrap();
        assert_eq!((p.sizes.clone(), p.iters, p.tx_depth), (vec![2], 1000, 1));
        assert_eq!(p.host.as_deref(), Some("10.0.0.1"));
        let p = parse(&["atomic_bw", "-A", "CMP_AND_SWAP"]).unwrap();
        assert_eq!(
            (p.sizes.clone(), p.atomic),
            (vec![8], AtomicKind::CmpAndSwap)
        );
        let p = parse(&["read_bw", "-a", "-n", "10", "-F"]).unwrap();
        assert_eq!(p.sizes.len(), 23);
        assert_eq!((p.sizes[0], p.max_size, p.tx_depth), (2, 1 << 23, 10));
        let p = parse(&["send_bw", "-n", "100"]).unwrap();
        assert_eq!((p.rx_depth, p.tclass), (100, 0));
        assert_eq!(parse(&["write_bw", "--tclass=96"]).unwrap().tclass, 96);
        assert!(parse(&["write_bw", "--tclass", "256"]).is_err());
    }

    #[test]
    fn qps_beyond_the_default_quota() {
        // The NIC may be started with a larger quota: the device's max_qp decides.
        assert_eq!(parse(&["write_bw", "-q", "10000"]).unwrap().qps, 10000);
        assert!(parse(&["write_bw", "-q", "16777216"])
            .unwrap_err()
            .contains("1..=16777215"));
        assert!(parse(&["write_bw", "-q", "0"]).is_err());
    }

    #[test]
    fn unsupported_flags_are_clear_errors() {
        assert!(parse(&["write_bw", "-R"]).unwrap_err().contains("rdma_cm"));
        assert!(parse(&["write_lat", "-q", "2"])
            .unwrap_err()
            .contains("Multiple QPs"));
        assert!(parse(&["write_bw", "-m", "1000"])
            .unwrap_err()
            .contains("MTU"));
        assert!(parse(&["write_bw", "-A", "FETCH_AND_ADD"]).is_err());
        assert!(parse(&["write_bw", "-o", "4"]).is_err());
        assert!(parse(&["atomic_bw", "-s", "16"]).is_err());
        assert!(parse(&["write_bw", "-x", "0"]).is_err());
        assert!(parse(&["write_bw", "-x", "2"]).is_err());
        assert!(parse(&["write_bw", "-x", "1"]).is_ok());
        assert!(parse(&["write_bw", "-c", "UD"]).is_err());
        assert!(parse(&["write_bw", "-b"]).is_err());
        assert!(parse(&["write_lat", "--breakdown", "f"]).is_err());
        let p = parse(&["send_lat", "--breakdown", "f"]).unwrap();
        assert_eq!(p.breakdown.as_deref(), Some(std::path::Path::new("f")));
    }
}
