//! `softnic`: the NIC process and its tools.
//!
//! Subcommands: `run` (the NIC), `decode` (pcap/pcapng → one line per RoCEv2 packet),
//! `stats` (a running NIC's counters), `perf` (perftest-compatible benchmarks), `exec`
//! (run an unmodified libibverbs program on softnic), `fuzz` (a stateful RoCEv2 fuzzer
//! aimed at a live peer).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "softnic",
    version,
    about = "A userspace RDMA NIC speaking RoCEv2 over UDP 4791"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode the RoCEv2 packets of a pcap or pcapng file and verify their ICRCs.
    Decode(softnic::decode::DecodeArgs),
    /// Run a NIC: serve clients on its control socket and speak RoCEv2 on UDP.
    Run(softnic::nic::RunArgs),
    /// Print a running NIC's counters.
    Stats(softnic::nic::StatsArgs),
    /// perftest-compatible benchmarks (ib_write_bw & co.), pairing with stock perftest.
    Perf(softnic::perf::PerfArgs),
    /// Run an unmodified libibverbs program (ibv_devinfo, ibv_rc_pingpong, perftest…) on
    /// softnic: `softnic exec [-d NAME] -- CMD [ARGS…]`.
    Exec(softnic::exec::ExecArgs),
    /// Fuzz a live RDMA peer with structured RoCEv2 mutations (see docs/fuzzing.md).
    Fuzz(softnic::fuzz::FuzzArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(a) => softnic::decode::main(a),
        Command::Run(a) => softnic::nic::run_main(a),
        Command::Stats(a) => softnic::nic::stats_main(a),
        Command::Perf(a) => softnic::perf::main(a),
        Command::Exec(a) => softnic::exec::main(a),
        Command::Fuzz(a) => softnic::fuzz::main(a),
    }
}
