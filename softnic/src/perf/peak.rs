//! perftest's "BW peak", found without its quadratic search.
//!
//! `print_report_bw` (perftest_parameters.c) reports as peak the best time per
//! operation over every window that starts at a post and ends at a later completion:
//! the minimum over posts `i` and completions of an operation `j ≥ i` of
//! `(t_completed[j] − t_posted[i]) / (j − i + 1)`. perftest tries every pair, and so did
//! this tool. With `-q 1000` and the default 5,000 iterations per QP (perftest's
//! cut-off for the peak, 20,000 iterations, counts per QP) that is 5 M posts times
//! 50,000 completions: `softnic perf write_bw -q 1000` sat in its report for many
//! minutes after a 2-second run.
//!
//! The same minimum in O((posts + completions) · log posts): take post `i` as the point
//! `(i − 1, t_posted[i])` and a completion of operation `j` as `(j, t_completed)`. The
//! time per operation of a window is then the slope between its two points, and a
//! completion lies to the right of every post it may pair with. The smallest slope from
//! points to the left of `C` is that of the line through `C` which touches their upper
//! convex hull from above (every point lies on or below it), so only the hull's
//! vertices matter. Posts arrive in order of `x`, so the hull is a monotone stack
//! (Andrew's chain), and along a convex chain the slope to an outside point falls and
//! then rises, so each completion finds its vertex by binary search. All comparisons are
//! exact (integer cross products), so the result is the very pair value the full search
//! finds; `tests` checks that against the full search.

/// The best window: `(nanoseconds, operations)`, the smallest `time / operations` over
/// every post `i` and completion `(j, t)` with `j ≥ i` (a time below its post counts as 0,
/// as the full search's saturating subtraction does). `posted`: post times in post
/// order; `completed`: (index of the last operation covered, time), `j` increasing.
/// `None` when no completion has a post at or before it.
pub fn best_window(posted: &[u64], completed: &[(usize, u64)]) -> Option<(u64, u64)> {
    // Hull vertices, as post indices, in increasing `x`.
    let mut hull: Vec<usize> = Vec::new();
    let point = |i: usize| (i as i128 - 1, i128::from(posted[i]));
    let mut next = 0usize;
    let mut best: Option<(u64, u64)> = None;
    for &(j, tc) in completed {
        while next < posted.len() && next <= j {
            let p = point(next);
            while let [.., a, b] = hull[..] {
                // Drop `b` unless it lies strictly above the segment from `a` to `p`.
                if cross(point(a), point(b), p) >= 0 {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(next);
            next += 1;
        }
        if hull.is_empty() {
            continue;
        }
        let c = (j as i128, i128::from(tc));
        // First vertex whose successor is no flatter towards `c`.
        let (mut lo, mut hi) = (0usize, hull.len() - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if flatter_or_equal(point(hull[mid + 1]), point(hull[mid]), c) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let i = hull[lo];
        let w = (tc.saturating_sub(posted[i]), (j - i + 1) as u64);
        if best
            .is_none_or(|b| u128::from(w.0) * u128::from(b.1) < u128::from(b.0) * u128::from(w.1))
        {
            best = Some(w);
        }
    }
    best
}

/// `(a − o) × (b − o)`: positive when `o → a → b` turns counter-clockwise.
fn cross(o: (i128, i128), a: (i128, i128), b: (i128, i128)) -> i128 {
    (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0)
}

/// Whether the slope from `a` to `c` is at most the slope from `b` to `c` (both `a` and
/// `b` to the left of `c`).
fn flatter_or_equal(a: (i128, i128), b: (i128, i128), c: (i128, i128)) -> bool {
    (c.1 - a.1) * (c.0 - b.0) <= (c.1 - b.1) * (c.0 - a.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full search, as perftest does it (and this tool did, in f64).
    fn brute(posted: &[u64], completed: &[(usize, u64)]) -> Option<f64> {
        let mut best = f64::INFINITY;
        for (i, &tp) in posted.iter().enumerate() {
            for &(j, tc) in completed.iter().filter(|&&(j, _)| j >= i) {
                best = best.min(tc.saturating_sub(tp) as f64 / (j - i + 1) as f64);
            }
        }
        best.is_finite().then_some(best)
    }

    fn fast(posted: &[u64], completed: &[(usize, u64)]) -> Option<f64> {
        best_window(posted, completed).map(|(t, n)| t as f64 / n as f64)
    }

    /// A run: `ops` posts with non-decreasing times from the gaps, and completions at
    /// the indices where `signal` says so, each at least its operation's post time
    /// plus a latency (as a real run's are).
    fn run(gaps: &[u64], signal: &[bool], lat: &[u64]) -> (Vec<u64>, Vec<(usize, u64)>) {
        let posted: Vec<u64> = gaps
            .iter()
            .scan(0u64, |t, g| {
                *t += g;
                Some(*t)
            })
            .collect();
        let mut completed = Vec::new();
        let mut last = 0u64;
        for (j, &tp) in posted.iter().enumerate() {
            if signal[j % signal.len()] || j + 1 == posted.len() {
                last = last.max(tp + lat[j % lat.len()]);
                completed.push((j, last));
            }
        }
        (posted, completed)
    }

    #[test]
    fn one_window_of_perftest_arithmetic() {
        // 4 ops posted at 0, 1, 2, 3 ms, one completion at 4 ms covering all: the best
        // windows (op 3 alone, all four) take 1 ms per op.
        let posted = [0, 1_000_000, 2_000_000, 3_000_000];
        assert_eq!(
            best_window(&posted, &[(3, 4_000_000)]),
            Some((1_000_000, 1))
        );
        assert_eq!(best_window(&posted, &[]), None);
        assert_eq!(best_window(&[], &[(0, 5)]), None);
    }

    #[test]
    fn a_burst_beats_the_long_run() {
        // Slow posts, then eight quick ones completed together: the best window is the
        // burst's, not the whole run's and not a single operation's.
        let posted = [0, 100, 200, 300, 301, 302, 303, 304, 305, 306, 307];
        let completed = [(3, 400), (10, 320)];
        assert_eq!(fast(&posted, &completed), brute(&posted, &completed));
        assert_eq!(best_window(&posted, &completed), Some((320 - 300, 8)));
    }

    #[test]
    fn times_below_their_post_count_as_zero() {
        assert_eq!(best_window(&[10, 20], &[(1, 15)]), Some((0, 1)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// The hull search finds exactly the full search's figure: small times so that
        /// ties and collinear points are frequent.
        #[test]
        fn matches_the_full_search(
            gaps in proptest::collection::vec(0u64..6, 1..60),
            signal in proptest::collection::vec(proptest::bool::ANY, 1..8),
            lat in proptest::collection::vec(0u64..40, 1..8),
        ) {
            let (posted, completed) = run(&gaps, &signal, &lat);
            proptest::prop_assert_eq!(fast(&posted, &completed), brute(&posted, &completed));
        }

        /// Arbitrary (even disordered) times: still the full search's figure.
        #[test]
        fn matches_the_full_search_on_any_times(
            posted in proptest::collection::vec(0u64..1_000, 1..40),
            comps in proptest::collection::vec((0usize..3, 0u64..1_000), 0..20),
        ) {
            // Operation indices strictly increasing, in steps of 1 to 3.
            let mut j = 0usize;
            let completed: Vec<(usize, u64)> = comps
                .iter()
                .map(|&(step, t)| {
                    j += step + 1;
                    (j - 1, t)
                })
                .collect();
            proptest::prop_assert_eq!(fast(&posted, &completed), brute(&posted, &completed));
        }
    }
}
