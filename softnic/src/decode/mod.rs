//! `softnic decode` (being written).
use std::process::ExitCode;

/// Arguments of `softnic decode`.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// The pcap or pcapng file.
    pub file: std::path::PathBuf,
}

/// Runs `softnic decode`.
pub fn main(_a: DecodeArgs) -> ExitCode {
    ExitCode::FAILURE
}
