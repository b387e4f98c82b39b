//! The NIC's clock: monotonic time as the transport's [`Instant`], nanoseconds since the
//! NIC started. The transport never reads a clock itself (sans-IO); the runtime samples
//! this once per loop iteration and passes it in. [`Clock::monotonic_ns`] gives such an
//! instant in the host's `CLOCK_MONOTONIC`, the clock of completion timestamps.

use softnic_transport::time::Instant;

/// Monotonic clock with the NIC's start as epoch.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base: std::time::Instant,
    /// `CLOCK_MONOTONIC` nanoseconds at `base`.
    base_mono: u64,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        let base = std::time::Instant::now();
        Clock {
            base,
            base_mono: verbs_api::os::monotonic_ns(),
        }
    }

    /// Now.
    pub fn now(&self) -> Instant {
        let ns = self.base.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Instant `at` of this clock in `CLOCK_MONOTONIC` nanoseconds (the two readings
    /// at the start are nanoseconds apart).
    pub fn monotonic_ns(&self, at: Instant) -> u64 {
        self.base_mono.saturating_add(at.as_nanos())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
