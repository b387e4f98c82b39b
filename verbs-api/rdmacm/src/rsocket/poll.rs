//! `rpoll` and `rselect` over any mix of rsockets and ordinary descriptors.
//!
//! Each pass first asks every rsocket for its readiness (processing its completions
//! or CM events without waiting) and polls the ordinary descriptors without waiting;
//! when nothing is ready it sleeps in one `poll(2)` on the ordinary descriptors and,
//! for each rsocket, the descriptor its next event arrives on — the armed CQ's event
//! pipe of a connected stream, the CM channel of a listener or of a pending connect —
//! then looks again. As rdma-core's `rpoll`, a socket that is only created (neither
//! listening nor connecting) is never ready.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use libc::{nfds_t, pollfd};

use super::lock;
use super::socket::{self, SocketRef};

/// What one entry is.
enum Entry {
    /// An ordinary descriptor (or a negative one, which `poll(2)` ignores).
    Plain,
    /// An rsocket.
    Socket(SocketRef),
}

/// `rpoll`.
///
/// # Safety
/// As `poll(2)`: `fds` holds `nfds` entries.
#[export_name = "softnic_rpoll"]
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() && nfds > 0 {
        errno_set(libc::EFAULT);
        return -1;
    }
    let fds: &mut [pollfd] = if nfds == 0 {
        &mut []
    } else {
        // SAFETY: caller contract.
        unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
    };
    let entries: Vec<Entry> = fds
        .iter()
        .map(|p| match socket::lookup(p.fd) {
            Some(s) => Entry::Socket(s),
            None => Entry::Plain,
        })
        .collect();
    if entries.iter().all(|e| matches!(e, Entry::Plain)) {
        // SAFETY: caller contract.
        return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    }
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let mut sleep: Vec<pollfd> = fds.to_vec();
    let mut waits: Vec<std::os::fd::RawFd> = vec![-1; fds.len()];
    // Bounded by the deadline (none: until something is ready, as poll(2)); each
    // pass sleeps until a descriptor it watches is readable.
    loop {
        let mut ready = 0;
        let mut again = false;
        for (i, e) in entries.iter().enumerate() {
            match e {
                Entry::Plain => {
                    sleep[i] = fds[i];
                    sleep[i].revents = 0;
                }
                Entry::Socket(s) => {
                    let (revents, wait) = lock(s).poll_state(fds[i].events);
                    fds[i].revents = revents;
                    if revents != 0 {
                        ready += 1;
                    }
                    again |= revents == 0 && wait.is_none();
                    waits[i] = wait.unwrap_or(-1);
                    // Not in the check below: readiness of an rsocket is its state's.
                    sleep[i] = pollfd {
                        fd: -1,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                }
            }
        }
        // The ordinary descriptors, without waiting (the rsockets' entries are -1).
        // SAFETY: `sleep` is our own array of `nfds` entries.
        let n = unsafe { libc::poll(sleep.as_mut_ptr(), nfds, 0) };
        if n < 0 {
            return -1;
        }
        for (i, e) in entries.iter().enumerate() {
            if matches!(e, Entry::Plain) {
                fds[i].revents = sleep[i].revents;
                if sleep[i].revents != 0 {
                    ready += 1;
                }
            }
        }
        if ready > 0 {
            return ready;
        }
        let left = match deadline {
            None => -1,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return 0;
                }
                (d - now).as_millis().max(1).min(c_int::MAX as u128) as c_int
            }
        };
        if again {
            continue;
        }
        for (i, p) in sleep.iter_mut().enumerate() {
            if matches!(entries[i], Entry::Socket(_)) {
                p.fd = waits[i];
            }
            p.revents = 0;
        }
        // SAFETY: as above.
        let n = unsafe { libc::poll(sleep.as_mut_ptr(), nfds, left) };
        if n < 0 {
            return -1;
        }
        for (i, e) in entries.iter().enumerate() {
            if let Entry::Socket(s) = e {
                if sleep[i].revents != 0 {
                    lock(s).woke();
                }
            }
        }
    }
}

fn errno_set(e: c_int) {
    softnic_ibverbs::errno::set(e);
}

/// `rselect`: the sets as `rpoll` entries (read: POLLIN, write: POLLOUT, except:
/// POLLPRI), and back (read when POLLIN or POLLHUP, write when POLLOUT, except when
/// POLLERR), counting each bit set, as rdma-core's `rselect`.
///
/// # Safety
/// As `select(2)`.
#[export_name = "softnic_rselect"]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        errno_set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract: each non-null set is a valid fd_set.
    let isset =
        |set: *mut libc::fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut polls = Vec::new();
    for fd in 0..nfds {
        let mut events = 0;
        if isset(readfds, fd) {
            events |= libc::POLLIN;
        }
        if isset(writefds, fd) {
            events |= libc::POLLOUT;
        }
        if isset(exceptfds, fd) {
            events |= libc::POLLPRI;
        }
        if events != 0 {
            polls.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: caller contract.
        let t = unsafe { *timeout };
        let ms = t.tv_sec.saturating_mul(1000) + (t.tv_usec + 999) / 1000;
        ms.clamp(0, c_int::MAX as libc::time_t) as c_int
    };
    // SAFETY: our own array.
    let n = unsafe { rpoll(polls.as_mut_ptr(), polls.len() as nfds_t, ms) };
    if n < 0 {
        return n;
    }
    for set in [readfds, writefds, exceptfds] {
        if !set.is_null() {
            // SAFETY: caller contract.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &polls {
        let mut mark = |set: *mut libc::fd_set, on: bool| {
            if on && !set.is_null() {
                // SAFETY: caller contract; fd < nfds ≤ FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        };
        mark(
            readfds,
            p.revents & (libc::POLLIN | libc::POLLHUP) != 0 && p.events & libc::POLLIN != 0,
        );
        mark(writefds, p.revents & libc::POLLOUT != 0);
        mark(
            exceptfds,
            p.revents & libc::POLLERR != 0 && p.events & libc::POLLPRI != 0,
        );
    }
    count
}
