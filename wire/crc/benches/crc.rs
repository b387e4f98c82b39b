//! ns per buffer (4 KiB unless a size is given) for crc32fast and softnic-crc, all in
//! the same run, in alternating rounds (the order rotates each round), so a shared
//! machine's load shifts all of them alike:
//!
//! ```text
//! cargo bench -p softnic-crc --bench crc            # 4096 bytes
//! cargo bench -p softnic-crc --bench crc -- 1024    # another size
//! cargo bench -p softnic-crc --bench crc -- ymm     # the 256-bit kernel (or `wide`, `fallback`)
//! cargo bench -p softnic-crc --bench crc -- dst=0   # the destination's offset in its line
//! ```
//! `update` and `copy_update` run on the path named (by default the one the public
//! functions take, [`softnic_crc::Path::auto`]); a path this CPU cannot run panics.
//! Each figure of a round is the best of 15 batches of calls (wall clock per call; the
//! best batch is the one no other process interrupted). Prints per function the median
//! and range over the rounds, and its ratio to `crc32fast::hash` taken round by round.
//! The source is 64-byte aligned (a memory region's page), the destination 28 bytes
//! into a 64-byte aligned buffer (a payload after BTH + RETH); `src=N` and `dst=N` put
//! them N bytes (mod 64) into a line instead (on Intel a 64-byte store that is not
//! aligned splits across two lines: docs/perf.md, session 13).

use std::hint::black_box;
use std::time::Instant;

use softnic_crc::Path;

const ROUNDS: usize = 9;
const BATCHES: usize = 15;

/// A 64-byte aligned buffer.
#[repr(C, align(64))]
struct Line([u8; 64]);

fn aligned(len: usize) -> Vec<Line> {
    (0..len.div_ceil(64) + 1)
        .map(|i| Line([i as u8; 64]))
        .collect()
}

fn bytes(v: &mut [Line]) -> &mut [u8] {
    let n = v.len() * 64;
    // SAFETY: `Line` is 64 plain bytes with no padding; the slice covers exactly them.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n) }
}

fn main() {
    let len: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(4096);
    let path = std::env::args()
        .find_map(|a| match a.as_str() {
            "wide" => Some(Path::Wide),
            "ymm" => Some(Path::Ymm),
            "fallback" => Some(Path::Fallback),
            _ => None,
        })
        .unwrap_or_else(Path::auto);
    let offset = |key: &str, default: usize| {
        std::env::args()
            .find_map(|a| a.strip_prefix(key)?.parse::<usize>().ok())
            .map_or(default, |o| o % 64)
    };
    let (src_off, dst_off) = (offset("src=", 0), offset("dst=", 28));
    let mut src_buf = aligned(len + src_off);
    let src_all = bytes(&mut src_buf);
    for (i, b) in src_all.iter_mut().enumerate() {
        *b = (i * 131 + 7) as u8;
    }
    let src: &[u8] = &src_all[src_off..src_off + len];
    let mut dst_buf = aligned(len + dst_off);
    let dst = &mut bytes(&mut dst_buf)[dst_off..dst_off + len];
    // Calls per batch: about 0.3 ms of work at ≈ 50 GB/s.
    let calls = (15_000_000 / len.max(64)).max(10);

    type Case<'a> = (&'a str, Box<dyn FnMut() + 'a>);
    let dst_ptr = dst.as_mut_ptr();
    let dst_len = dst.len();
    let view = move || {
        // SAFETY: `dst` lives for all of main and each case uses it alone, in turn.
        unsafe { std::slice::from_raw_parts_mut(dst_ptr, dst_len) }
    };
    let mut cases: Vec<Case> = vec![
        (
            "crc32fast::hash",
            Box::new(|| {
                black_box(crc32fast::hash(black_box(src)));
            }),
        ),
        (
            "update",
            Box::new(|| {
                black_box(softnic_crc::update_on(path, 0, black_box(src)));
            }),
        ),
        (
            "copy+crc32fast",
            Box::new(move || {
                let d = view();
                d.copy_from_slice(black_box(src));
                black_box(crc32fast::hash(black_box(&*d)));
            }),
        ),
        (
            "copy_update",
            Box::new(move || {
                black_box(softnic_crc::copy_update_on(path, 0, black_box(src), view()));
            }),
        ),
        (
            "copy",
            Box::new(move || {
                view().copy_from_slice(black_box(src));
                black_box(&*view());
            }),
        ),
    ];

    let mut ns = vec![Vec::new(); cases.len()];
    for round in 0..ROUNDS {
        for k in 0..cases.len() {
            let c = (k + round) % cases.len();
            let f = &mut cases[c].1;
            let mut best = f64::MAX;
            for _ in 0..BATCHES {
                let t = Instant::now();
                for _ in 0..calls {
                    f();
                }
                best = best.min(t.elapsed().as_nanos() as f64 / calls as f64);
            }
            ns[c].push(best);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "bytes {len}  path {path:?}  src +{src_off}  dst +{dst_off}  rounds {ROUNDS}  loadavg {}",
        load.trim()
    );
    println!(
        "{:<16} {:>8} {:>17} {:>8} {:>15}",
        "function", "ns", "range", "x hash", "range"
    );
    for (c, (name, _)) in cases.iter().enumerate() {
        let ratio: Vec<f64> = ns[c].iter().zip(&ns[0]).map(|(a, b)| a / b).collect();
        let (m, lo, hi) = stats(&ns[c]);
        let (rm, rlo, rhi) = stats(&ratio);
        println!("{name:<16} {m:>8.1} {lo:>8.1}..{hi:<8.1} {rm:>8.3} {rlo:>6.3}..{rhi:<6.3}");
    }
}

/// (median, min, max).
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s[s.len() / 2], s[0], s[s.len() - 1])
}
