//! [`PollSet`]: a reusable `ppoll(2)` wait on several descriptors, to the microsecond.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// Descriptors to wait on for input, kept between waits so that a loop that sleeps
/// often allocates nothing (the NIC's data plane rebuilds it before each sleep).
///
/// The wait is `ppoll(2)`, whose timeout is a `timespec`: `poll(2)` rounds a timeout up
/// to whole milliseconds, and the NIC's retransmission timers are ~100 µs (issue 12).
/// After [`wait`](PollSet::wait), [`readable`](PollSet::readable) says which
/// descriptors woke it, so the caller drains only those (one `read(2)` each).
///
/// The set keeps raw descriptor numbers, not borrows: fill it right before each wait
/// (its lifetime-checked [`push`](PollSet::push) takes a `BorrowedFd`). A descriptor
/// closed in between is no memory hazard: `ppoll` reports it `POLLNVAL`, or waits on
/// whatever reused the number.
#[derive(Debug, Default)]
pub struct PollSet {
    fds: Vec<libc::pollfd>,
}

impl PollSet {
    /// An empty set.
    pub fn new() -> PollSet {
        PollSet::default()
    }

    /// Forgets every descriptor (keeps the allocation).
    pub fn clear(&mut self) {
        self.fds.clear();
    }

    /// Adds `fd`, to wait for it to be readable; returns its index for
    /// [`readable`](PollSet::readable).
    pub fn push(&mut self, fd: BorrowedFd<'_>) -> usize {
        self.fds.push(libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.fds.len() - 1
    }

    /// Blocks until a descriptor is readable (or its peer end is closed, or it is
    /// invalid: anything that makes a read return at once) or `timeout` passes.
    /// Returns how many descriptors are ready; 0 on timeout or when a signal
    /// interrupted the wait (EINTR: the caller's loop looks at its stop flag).
    pub fn wait(&mut self, timeout: Duration) -> io::Result<usize> {
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        for p in &mut self.fds {
            p.revents = 0;
        }
        // SAFETY: `fds` is a live array of pollfd of the given length, `ts` a live
        // timespec; a null signal mask leaves the thread's mask as it is.
        let r = unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize)
    }

    /// Whether the `i`-th descriptor pushed was ready when the last
    /// [`wait`](PollSet::wait) returned (false for an index never pushed).
    pub fn readable(&self, i: usize) -> bool {
        self.fds.get(i).is_some_and(|p| p.revents != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{pipe, pipe_signal};
    use std::os::fd::AsFd;

    #[test]
    fn reports_only_the_descriptors_that_are_readable() {
        let (r0, _w0) = pipe().unwrap();
        let (r1, w1) = pipe().unwrap();
        let mut set = PollSet::new();
        let a = set.push(r0.as_fd());
        let b = set.push(r1.as_fd());
        pipe_signal(w1.as_fd()).unwrap();
        assert_eq!(set.wait(Duration::from_secs(5)).unwrap(), 1);
        assert!(!set.readable(a));
        assert!(set.readable(b));
        assert!(!set.readable(7));
        // Refilled after clear: the old readiness is gone with the old entries.
        set.clear();
        let a = set.push(r0.as_fd());
        assert_eq!(set.wait(Duration::ZERO).unwrap(), 0);
        assert!(!set.readable(a));
    }
}
