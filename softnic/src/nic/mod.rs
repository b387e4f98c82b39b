//! The NIC process (being written).
use std::process::ExitCode;

/// Arguments of `softnic run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {}

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
