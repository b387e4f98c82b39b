//! perftest's printed output: the test banner (`ctx_print_test_info`), the address
//! lines (`ctx_print_pingpong_data`), and the result tables with their arithmetic
//! (`print_report_bw`, `print_full_bw_report`, `print_report_lat` in
//! `perftest_parameters.c`), so that scripts parsing perftest output parse ours.

use super::args::{Params, Verb};
use super::exchange::{BwReport, Dest};

/// `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------\n";

/// `RESULT_FMT` + `RESULT_EXT`.
pub const RESULT_FMT_BW: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n";

/// `RESULT_FMT_LAT` + `RESULT_EXT`.
pub const RESULT_FMT_LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n";

/// The banner printed before the address exchange.
pub fn test_info(p: &Params, device: &str, mtu_bytes: u32, out_reads: u32) -> String {
    let mut s = String::from(RESULT_LINE);
    s.push_str("                    ");
    s.push_str(p.verb.name());
    s.push(' ');
    if p.verb == Verb::Atomic {
        s.push_str(p.atomic.name());
        s.push(' ');
    }
    s.push_str(if p.bw { "BW " } else { "Latency " });
    s.push_str("Test\n");
    s.push_str(&format!(
        " Dual-port       : OFF\t\tDevice         : {device}\n"
    ));
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : IB\n",
        p.qps
    ));
    let conn = match p.connection {
        verbs_api::QpType::Uc => "UC",
        verbs_api::QpType::Ud => "UD",
        verbs_api::QpType::Rc => "RC",
        verbs_api::QpType::XrcSend | verbs_api::QpType::XrcRecv => "XRC",
    };
    let srq = if p.use_srq { "ON" } else { "OFF" };
    s.push_str(&format!(
        " Connection type : {conn}\t\tUsing SRQ      : {srq}\n"
    ));
    s.push_str(" PCIe relax order: Unsupported\n");
    s.push_str(" ibv_wr* API     : OFF\n");
    if !p.is_server {
        s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    }
    if p.verb == Verb::Send && p.is_server {
        s.push_str(&format!(" RX depth        : {}\n", p.rx_depth));
    }
    if p.bw {
        s.push_str(&format!(" CQ Moderation   : {}\n", p.cq_mod));
    }
    s.push_str(&format!(" Mtu             : {mtu_bytes}[B]\n"));
    s.push_str(" Link type       : Ethernet\n");
    s.push_str(&format!(
        " GID index       : {}\n",
        verbs_api::gid::ADDRESS_GID_INDEX
    ));
    if matches!(p.verb, Verb::Read | Verb::Atomic) {
        s.push_str(&format!(" Outstand reads  : {out_reads}\n"));
    } else {
        s.push_str(&format!(" Max inline data : {}[B]\n", p.inline_size));
    }
    s.push_str(" rdma_cm QPs\t : OFF\n");
    s.push_str(" Data ex. method : Ethernet\n");
    s.push_str(RESULT_LINE);
    s
}

/// C's `%#0Nx`: zero-padded to N characters including the `0x`, which C omits for 0.
fn alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("0x{:0w$x}", v, w = width.saturating_sub(2))
    }
}

/// One address line pair (`BASIC_ADDR_FMT` [+ `READ_FMT`] [+ `RDMA_FMT`], then
/// `PERF_GID_FMT`, whose GID bytes perftest prints in decimal).
pub fn address_lines(side: &str, d: &Dest, verb: Verb) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        alt_hex(u64::from(d.lid), 4),
        alt_hex(u64::from(d.qpn), 6),
        alt_hex(u64::from(d.psn), 6)
    );
    if verb == Verb::Read {
        s.push_str(&format!(" OUT {}", alt_hex(u64::from(d.out_reads), 4)));
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            alt_hex(u64::from(d.rkey), 8),
            alt_hex(d.vaddr, 16)
        ));
    }
    s.push('\n');
    let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    s.push_str(&format!(" GID: {}\n", gid.join(":")));
    s
}

/// Timestamps of a BW run, in nanoseconds from a common origin.
#[derive(Debug, Default, Clone)]
pub struct BwTimes {
    /// Post time of every operation, in global post order.
    pub posted: Vec<u64>,
    /// (index of the last operation a completion covers, time), in completion order.
    pub completed: Vec<(usize, u64)>,
}

/// perftest's BW arithmetic over `times` for `total` operations of `size` bytes.
/// Peak: the best per-operation time over every window from a post to a later
/// completion ([`super::peak`]; perftest skips it, printing 0, beyond 20000 iterations
/// per QP).
pub fn bw_report(size: u64, total: u64, times: &BwTimes, peak: bool) -> BwReport {
    let first = times.posted.first().copied().unwrap_or(0);
    let last = times.completed.last().map_or(first, |&(_, t)| t);
    let secs = (last.saturating_sub(first)) as f64 / 1e9;
    let mut r = BwReport {
        size,
        iters: total,
        ..BwReport::default()
    };
    if secs > 0.0 {
        r.bw_avg = size as f64 * total as f64 / secs / 1_048_576.0;
        r.msg_rate = total as f64 / secs / 1e6;
    }
    if peak {
        if let Some((t, ops)) = super::peak::best_window(&times.posted, &times.completed) {
            let best = t as f64 / ops as f64;
            if best > 0.0 {
                r.bw_peak = size as f64 * 1e9 / best / 1_048_576.0;
            }
        }
    }
    r
}

/// `REPORT_FMT` + `REPORT_EXT` (the sum of both reports when `rem` is given).
pub fn bw_line(r: &BwReport, rem: Option<&BwReport>) -> String {
    let (mut peak, mut avg, mut rate) = (r.bw_peak, r.bw_avg, r.msg_rate);
    if let Some(o) = rem {
        peak += o.bw_peak;
        avg += o.bw_avg;
        rate += o.msg_rate;
    }
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}\n",
        r.size, r.iters, peak, avg, rate
    )
}

/// Latency statistics, in microseconds (`print_report_lat`).
#[derive(Debug, Clone, PartialEq)]
pub struct LatStats {
    /// Smallest sample.
    pub t_min: f64,
    /// perftest's "max": the largest sample after dropping the two largest.
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation (perftest truncates each deviation to an integer).
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// Latency statistics from post times (ns): samples are the gaps between consecutive
/// posts divided by `rtt_factor` (2 for ping-pong tests, 1 for READ), sorted, the two
/// largest dropped. None when there are too few samples.
pub fn lat_stats(posted: &[u64], rtt_factor: f64) -> Option<LatStats> {
    let mut delta: Vec<u64> = posted
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    delta.sort_unstable();
    let n = delta.len().checked_sub(2).filter(|&n| n >= 1)?;
    let us = |v: u64| v as f64 / 1000.0 / rtt_factor;
    let median = if (n - 1) % 2 == 1 {
        (delta.get(n / 2)? + delta.get(n / 2 - 1)?) / 2
    } else {
        *delta.get(n / 2)?
    };
    let avg = delta.iter().take(n).map(|&d| us(d)).sum::<f64>() / n as f64;
    // perftest: `int temp_var = average - x; int pow_var = pow(temp_var, 2);`
    let var_sum: f64 = delta
        .iter()
        .take(n)
        .map(|&d| {
            let t = (avg - us(d)).trunc();
            (t * t).trunc()
        })
        .sum();
    let i99 = ((n as f64) * 0.99).ceil() as usize;
    let i999 = ((n as f64) * 0.999).ceil() as usize;
    Some(LatStats {
        t_min: us(*delta.first()?),
        t_max: us(*delta.get(n)?),
        t_typical: us(median),
        t_avg: avg,
        t_stdev: (var_sum / n as f64).sqrt(),
        p99: us(*delta.get(i99.min(delta.len() - 1))?),
        p999: us(*delta.get(i999.min(delta.len() - 1))?),
    })
}

/// `REPORT_FMT_LAT` + `REPORT_EXT`.
pub fn lat_line(size: u64, iters: u64, s: &LatStats) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}\n",
        size, iters, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p999
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_lines_match_perftest_printf() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_0000_1000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 127, 0, 0, 2],
            srqn: 0,
        };
        assert_eq!(
            address_lines("local", &d, Verb::Read),
            " local address: LID 0000 QPN 0x0011 PSN 0xabcdef OUT 0x10 RKey 0x001234 VAddr 0x007f0000001000\n \
             GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:02\n"
        );
        assert!(address_lines("remote", &d, Verb::Send)
            .starts_with(" remote address: LID 0000 QPN 0x0011 PSN 0xabcdef\n GID: 00:"));
    }

    #[test]
    fn bw_arithmetic() {
        // 4 ops of 1 MiB posted at 0,1,2,3 ms; one completion at 4 ms covering all.
        let times = BwTimes {
            posted: vec![0, 1_000_000, 2_000_000, 3_000_000],
            completed: vec![(3, 4_000_000)],
        };
        let r = bw_report(1 << 20, 4, &times, true);
        assert!((r.bw_avg - 1000.0).abs() < 1e-9, "{r:?}");
        assert!((r.msg_rate - 0.001).abs() < 1e-12);
        // Best window: op 3 alone, 1 ms -> 1000 MB/s; ops 0..=3 in 4 ms -> 1000 too.
        assert!((r.bw_peak - 1000.0).abs() < 1e-9);
        assert_eq!(bw_report(8, 4, &times, false).bw_peak, 0.0);
        let line = bw_line(&r, None);
        assert_eq!(
            line,
            " 1048576    4                1000.00            1000.00\t\t   0.001000\n"
        );
    }

    #[test]
    fn lat_arithmetic() {
        // Gaps 2,4,6,...,20 µs (10 samples); ping-pong halves them: 1..10 µs.
        let posted: Vec<u64> = (0..11u64)
            .scan(0, |t, i| {
                *t += i * 2000;
                Some(*t)
            })
            .collect();
        let s = lat_stats(&posted, 2.0).unwrap();
        // After dropping the two largest: 8 samples 1..=8 (t_max is index 8: 9).
        assert_eq!((s.t_min, s.t_max, s.t_typical), (1.0, 9.0, 4.5));
        assert!((s.t_avg - 4.5).abs() < 1e-9, "{s:?}");
        assert_eq!(lat_stats(&[0, 1, 2], 1.0), None);
    }
}
