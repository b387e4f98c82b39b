//! Values that a remote peer or another client must not be able to guess: L_Keys,
//! R_Keys and QPNs.
//!
//! An R_Key is the only thing that stands between a remote peer and a registered region
//! (IBTA 10.6.3.2 leaves the key format to the channel adapter), and a QPN plus a PSN is
//! what an off-path host must guess to inject into a connection. ReDMArk (USENIX
//! Security 2021) showed RNICs whose keys and QPNs follow a pattern — consecutive
//! outputs of one generator, or +1 — so that a client that sees its own keys predicts
//! everyone else's. So every such value here is drawn afresh from the operating
//! system's cryptographically secure generator; nothing about a value says anything
//! about the next one.
//!
//! Source: the `getrandom` crate, i.e. `getrandom(2)` on Linux and `getentropy` on
//! macOS. Chosen over calling `libc::getrandom` ourselves because it is portable, needs
//! no `unsafe` here, handles EINTR and old kernels, and is maintained by the Rust
//! Random project (rand depends on it). A syscall per draw (~0.3 µs) is nothing on the
//! control path, which is the only place keys and QPNs are made.
//!
//! The seeded [`SplitMix64`](super::rng::SplitMix64) stays for fault injection only,
//! where reproducibility is the point and secrecy is not.

/// The OS generator failed (never seen on Linux after boot; reported, never papered
/// over with a predictable fallback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoEntropy(pub String);

impl std::fmt::Display for NoEntropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the OS random generator failed: {}", self.0)
    }
}

impl std::error::Error for NoEntropy {}

/// 32 fresh random bits from the OS CSPRNG.
pub fn u32() -> Result<u32, NoEntropy> {
    getrandom::u32().map_err(|e| NoEntropy(e.to_string()))
}

/// Most draws [`draw_where`] makes before it gives up. With a 24-bit space (QPNs) and
/// fewer than 2^20 live values, 64 draws all landing on taken values has probability
/// below 2^-256: giving up means the space is genuinely full.
pub const MAX_DRAWS: usize = 64;

/// Why [`draw_where`] found no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrawError {
    /// The OS generator failed.
    NoEntropy(NoEntropy),
    /// [`MAX_DRAWS`] draws were all refused by the caller (the space is full).
    Exhausted,
}

impl std::fmt::Display for DrawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DrawError::NoEntropy(e) => e.fmt(f),
            DrawError::Exhausted => {
                write!(f, "no free value found in {MAX_DRAWS} random draws")
            }
        }
    }
}

/// A random value `mask & r` for which `ok` holds (free, not reserved), in at most
/// [`MAX_DRAWS`] draws. Rejection sampling keeps the result uniform over the values
/// `ok` accepts.
pub fn draw_where(mask: u32, mut ok: impl FnMut(u32) -> bool) -> Result<u32, DrawError> {
    for _ in 0..MAX_DRAWS {
        let v = u32().map_err(DrawError::NoEntropy)? & mask;
        if ok(v) {
            return Ok(v);
        }
    }
    Err(DrawError::Exhausted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_respect_mask_and_predicate() {
        for _ in 0..1000 {
            let v = draw_where(0xFF_FFFF, |v| v >= 2).unwrap();
            assert!((2..=0xFF_FFFF).contains(&v));
        }
        assert_eq!(draw_where(u32::MAX, |_| false), Err(DrawError::Exhausted));
    }

    #[test]
    fn values_are_not_a_sequence() {
        // 4096 draws of 32 bits. A random source puts +1 between two neighbours with
        // probability 4095 * 2^-32 < 10^-6, and repeats a step between neighbours (of
        // 4095 steps) only a handful of times at worst; a counter or any fixed-step
        // generator fails both at once.
        let v: Vec<u32> = (0..4096).map(|_| u32().unwrap()).collect();
        let plus_one = v
            .windows(2)
            .filter(|w| w[1] == w[0].wrapping_add(1))
            .count();
        assert_eq!(plus_one, 0);
        let steps: std::collections::HashSet<u32> =
            v.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(
            steps.len() > 4000,
            "steps between draws repeat: {}",
            steps.len()
        );
    }
}
