//! The NIC process behind `softnic run`, and `softnic stats`.
//!
//! ```text
//!   clients ──Unix socket──► control.rs (threads) ──channel──► runtime.rs (one thread)
//!   client rings (shared memory) ◄──────────────── rings.rs, cq.rs ◄─┤
//!   registered memory (shared memory) ◄──────────── memory.rs ◄──────┤ softnic_transport::Qp
//!   UDP :4791 ◄──► udp.rs ◄── fault.rs ◄── pcap.rs ◄── rx_icrc.rs ◄──┘
//! ```
//!
//! One job per file: [`config`] (options), [`udp`] (socket and I/O seam), [`rx_icrc`]
//! (receive-side ICRC without the IP header), [`source`] (connected QPs take packets
//! from their peer only), [`pcap`] (capture), [`fault`] (fault
//! injection), [`memory`] (memory regions: the DMA), [`wqe`] (ring entries → work
//! requests), [`rings`] (one QP with its rings), [`ready`] (which QPs the loop visits:
//! the active set and the deadline heap), [`doorbells`] (a client's doorbell page: which
//! rings to drain), [`cq`] (completion queues), [`state`]
//! (the object tables and control requests), [`quota`] (per-user quotas), [`handles`]
//! (handle numbers that never alias), [`control`] (the control socket server),
//! [`runtime`] (the loop), [`counters`] (what `softnic stats` prints), [`gid`],
//! [`clock`], [`trace`] (latency stamps, off by default), [`rng`] (seeded, for fault
//! injection), [`secret`] (keys and QPNs from the OS generator), [`signals`],
//! [`async_events`] (which objects have asynchronous events, and the client's pipe),
//! [`xrc`] (XRC domains and XRC SRQ numbers).

use std::process::ExitCode;

pub mod async_events;
pub mod clock;
pub mod cm;
pub mod config;
pub mod control;
pub mod copy_mr;
pub mod counters;
pub mod cq;
pub mod doorbells;
pub mod fault;
pub mod gid;
pub mod handles;
pub mod mcast;
pub mod memory;
pub mod mr_view;
pub mod mw;
mod mw_control;
pub mod pcap;
pub mod peers;
pub mod quota;
pub mod ready;
pub mod rings;
pub mod rng;
pub mod runtime;
pub mod rx_icrc;
pub mod rx_place;
pub mod secret;
pub mod signals;
pub mod source;
pub mod srq;
pub mod starved;
pub mod state;
pub mod sysv_mr;
pub mod trace;
pub mod udp;
pub mod wqe;
pub mod xrc;

pub use config::RunArgs;

use verbs_api::abi::control::{call, socket_path, Reply, Request, Response};

/// Arguments of `softnic stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Device name of the running NIC.
    #[arg(long, default_value = "softnic0")]
    pub name: String,
    /// Print one JSON object instead of `counter value` lines.
    #[arg(long)]
    pub json: bool,
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `softnic run`: exit 0 after SIGINT/SIGTERM, 2 on a bad option, 1 on a runtime
/// error (e.g. the address is not local or the port is taken).
pub fn run_main(a: RunArgs) -> ExitCode {
    init_logging();
    let cfg = match config::Config::from_args(&a, verbs_api::abi::control::softnic_dir()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softnic run: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match runtime::Runtime::start(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "softnic run: cannot start NIC {:?} on {}: {e}",
                cfg.name, cfg.bind
            );
            return ExitCode::FAILURE;
        }
    };
    match rt.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softnic run: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Fetches a running NIC's counters over its control socket.
pub fn fetch_stats(name: &str) -> Result<Vec<(String, u64)>, String> {
    config::check_name(name).map_err(|e| e.to_string())?;
    let path = socket_path(name);
    let sock = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach NIC {name:?} at {}: {e} (is `softnic run --name {name}` running? SOFTNIC_DIR must match)",
            path.display()
        )
    })?;
    let _ = sock.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    match call(&sock, &Request::Stats, &[]) {
        Ok((Response::Ok(Reply::Stats { counters }), _)) => Ok(counters),
        Ok((Response::Err { code, message }, _)) => Err(format!("{code:?}: {message}")),
        Ok((other, _)) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `softnic stats`.
pub fn stats_main(a: StatsArgs) -> ExitCode {
    match fetch_stats(&a.name) {
        Ok(list) => {
            if a.json {
                println!("{}", counters::to_json(&list));
            } else {
                print!("{}", counters::to_text(&list));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("softnic stats: {e}");
            ExitCode::FAILURE
        }
    }
}
