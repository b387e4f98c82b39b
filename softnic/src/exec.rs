//! `softnic exec [-d NAME] -- CMD…`: runs an unmodified libibverbs program on softnic.
//!
//! It puts the directory of softnic's drop-in `libibverbs.so.1` and `librdmacm.so.1`
//! (crates `softnic-ibverbs` and `softnic-rdmacm`, linked on demand by the latter's
//! builder next to this executable's build) first in `LD_LIBRARY_PATH` and `exec`s the
//! command, which then sees the NICs
//! running under `$SOFTNIC_DIR` as RDMA devices. `-d NAME` (repeatable) limits the
//! device list to those NICs, through `SOFTNIC_IBV_DEVICES` (`verbs_api::Device::list`
//! applies it), so a program that takes "the first device" uses NAME, and the RDMA CM
//! finds addresses on those NICs only. `SOFTNIC_IBVERBS_DIR` names a prebuilt library
//! directory instead (no C compiler needed then).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Environment variable naming a prebuilt library directory.
pub const LIB_DIR_ENV: &str = "SOFTNIC_IBVERBS_DIR";

/// Arguments of `softnic exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Show only this device (repeatable); default: every NIC under $SOFTNIC_DIR.
    #[arg(short = 'd', long = "device")]
    pub devices: Vec<String>,
    /// Print the library directory and exit.
    #[arg(long)]
    pub print_lib_dir: bool,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// The directory holding `libibverbs.so.1` & co. for this build of softnic.
pub fn lib_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os(LIB_DIR_ENV).filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return if d.join("libibverbs.so.1").exists() {
            Ok(d)
        } else {
            Err(format!(
                "${LIB_DIR_ENV}={} has no libibverbs.so.1",
                d.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating softnic: {e}"))?;
    softnic_rdmacm::builder::ensure(&softnic_ibverbs::builder::profile_dir_of(&exe))
}

/// `softnic exec`.
pub fn main(a: ExecArgs) -> ExitCode {
    let dir = match lib_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softnic exec: {e}");
            return ExitCode::from(2);
        }
    };
    if a.print_lib_dir {
        println!("{}", dir.display());
        return ExitCode::SUCCESS;
    }
    let Some((prog, args)) = a.command.split_first() else {
        eprintln!("softnic exec: no command given (softnic exec [-d NAME] -- CMD [ARGS…])");
        return ExitCode::from(2);
    };
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).env("LD_LIBRARY_PATH", path);
    if !a.devices.is_empty() {
        cmd.env(softnic_ibverbs::device::DEVICES_ENV, a.devices.join(","));
    }
    let e = cmd.exec();
    eprintln!("softnic exec: cannot run {}: {e}", prog.to_string_lossy());
    ExitCode::from(127)
}
