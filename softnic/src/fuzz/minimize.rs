//! Delta debugging (Zeller and Hildebrandt, "Simplifying and Isolating
//! Failure-Inducing Input", 2002): the shortest packet sequence that still makes the
//! peer fail, found by trying chunks of the sequence and their complements. Every
//! trial against a live peer is a fresh connection, a send and a liveness probe, so the
//! number of trials is bounded.

/// What one trial found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The failure reproduced.
    Fails,
    /// The peer survived.
    Passes,
    /// The trial could not run (the peer did not come back); minimisation stops.
    Unresolved,
}

/// Reduces `input` to a 1-minimal subsequence on which `test` fails (removing any one
/// chunk at the final granularity makes it pass), running at most `max_trials` tests.
/// `test(input)` is assumed to fail; the result is `input` itself if nothing smaller does.
pub fn ddmin<T: Clone>(
    input: &[T],
    max_trials: usize,
    mut test: impl FnMut(&[T]) -> Outcome,
) -> (Vec<T>, usize) {
    let mut cur = input.to_vec();
    let mut n = 2usize;
    let mut trials = 0usize;
    'outer: while cur.len() >= 2 {
        let len = cur.len();
        let chunk = len.div_ceil(n);
        let bounds: Vec<(usize, usize)> = (0..len)
            .step_by(chunk)
            .map(|s| (s, (s + chunk).min(len)))
            .collect();
        // Try each chunk alone, then each complement.
        for complement in [false, true] {
            for &(s, e) in &bounds {
                if trials >= max_trials {
                    break 'outer;
                }
                let cand: Vec<T> = if complement {
                    cur[..s].iter().chain(&cur[e..]).cloned().collect()
                } else {
                    cur[s..e].to_vec()
                };
                if cand.is_empty() || cand.len() == len {
                    continue;
                }
                trials += 1;
                match test(&cand) {
                    Outcome::Fails => {
                        cur = cand;
                        n = if complement { (n - 1).max(2) } else { 2 };
                        continue 'outer;
                    }
                    Outcome::Passes => {}
                    Outcome::Unresolved => break 'outer,
                }
            }
        }
        if n >= len {
            break;
        }
        n = (2 * n).min(len);
    }
    (cur, trials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_two_packets_that_matter() {
        let input: Vec<u32> = (0..100).collect();
        // Fails when 17 comes before 63 (an ordered pair, like a FIRST then a bad LAST).
        let (min, trials) = ddmin(&input, 500, |s| {
            let a = s.iter().position(|&x| x == 17);
            let b = s.iter().position(|&x| x == 63);
            match (a, b) {
                (Some(a), Some(b)) if a < b => Outcome::Fails,
                _ => Outcome::Passes,
            }
        });
        assert_eq!(min, vec![17, 63]);
        assert!(trials < 100, "{trials} trials");
    }

    #[test]
    fn stops_at_the_trial_budget_and_when_unresolved() {
        let input: Vec<u32> = (0..64).collect();
        let (min, trials) = ddmin(&input, 3, |_| Outcome::Passes);
        assert_eq!((min.len(), trials), (64, 3));
        let (min, trials) = ddmin(&input, 100, |_| Outcome::Unresolved);
        assert_eq!((min.len(), trials), (64, 1));
    }
}
