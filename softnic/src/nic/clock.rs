//! The NIC's clock: monotonic time as the transport's [`Instant`], nanoseconds since the
//! NIC started. The transport never reads a clock itself (sans-IO); the runtime samples
//! this once per loop iteration and passes it in.

use softnic_transport::time::Instant;

/// Monotonic clock with the NIC's start as epoch.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base: std::time::Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Clock {
            base: std::time::Instant::now(),
        }
    }

    /// Now.
    pub fn now(&self) -> Instant {
        let ns = self.base.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
