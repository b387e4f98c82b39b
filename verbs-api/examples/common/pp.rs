//! What the UC, UD and SRQ ping-pong examples share with rdma-core's `*_pingpong`
//! programs: the device choice, the address lines they print, the completion loop's
//! polling, and the closing throughput lines.

use std::time::Duration;

use verbs_api::*;

/// wr_id of every receive (`PINGPONG_RECV_WRID`).
pub const RECV_WRID: u64 = 1;
/// wr_id of every send (`PINGPONG_SEND_WRID`).
pub const SEND_WRID: u64 = 2;

/// Opens `-d <dev>`, or the first device found.
pub fn open(ib_dev: Option<&str>) -> Result<Context, String> {
    let name = match ib_dev {
        Some(d) => d.to_string(),
        None => Device::list()
            .map_err(|e| e.to_string())?
            .first()
            .map(|d| d.name().to_string())
            .ok_or("No IB devices found")?,
    };
    Device::open(&name).map_err(|e| format!("Couldn't get context for {name}: {e}"))
}

/// A random 24-bit PSN (`lrand48() & 0xffffff` in the C programs).
pub fn random_psn(salt: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u32(salt);
    (h.finish() & 0xff_ffff) as u32
}

/// `"  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::ffff:127.0.0.1"`
/// (`sep` is `","`, or `":"` where `ibv_ud_pingpong` prints a colon).
pub fn print_dest(which: &str, e: &QpEndpoint, sep: &str) {
    println!(
        "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        e.lid, e.qpn, e.psn, e.gid
    );
}

/// Polls `cq` until at least one completion (or, with `events`, waits for one CQ
/// event first). Spins as the C programs do, yielding now and then: two ping-pongs and
/// two NICs on a 2-core host otherwise wait a scheduler slice per message.
pub fn poll(
    cq: &mut CompletionQueue,
    wc: &mut [WorkCompletion],
    events: bool,
) -> Result<usize, String> {
    if events {
        cq.wait(Some(Duration::from_secs(10)))
            .map_err(|e| format!("Failed to get cq_event: {e}"))?;
    }
    let mut spins = 0u32;
    // Bounded by the NIC: a dead peer surfaces as error completions (RC) or, for
    // UC/UD, the caller's overall deadline.
    loop {
        let ne = cq.poll(wc).map_err(|e| format!("poll CQ failed: {e}"))?;
        if ne > 0 || events {
            return Ok(ne);
        }
        spins = spins.wrapping_add(1);
        if spins % 256 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Fails on an error completion, as the C programs print it.
pub fn check(w: &WorkCompletion) -> Result<(), String> {
    if w.status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "Failed status {} ({}) for wr_id {}",
            w.status,
            w.status.raw(),
            w.wr_id
        ))
    }
}

/// The two closing lines.
pub fn report(size: u32, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = u64::from(size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / f64::from(iters)
    );
}
