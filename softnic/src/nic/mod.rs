//! The NIC process behind `softnic run` (being written).
use std::process::ExitCode;

pub mod clock;
pub mod config;
pub mod fault;
pub mod pcap;
pub mod rng;
pub mod rx_icrc;
pub mod udp;

pub use config::RunArgs;

/// Arguments of `softnic stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {}

/// Runs `softnic run`.
pub fn run_main(_a: RunArgs) -> ExitCode {
    ExitCode::FAILURE
}

/// Runs `softnic stats`.
pub fn stats_main(_a: StatsArgs) -> ExitCode {
    ExitCode::FAILURE
}
