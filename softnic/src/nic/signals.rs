//! SIGINT/SIGTERM: stop the NIC cleanly (remove the control socket, flush the capture).
//!
//! The handler does only async-signal-safe things: it sets a flag and writes the data
//! plane's wake eventfd (`write(2)` is async-signal-safe), so a NIC sleeping in
//! `poll(2)` wakes up and sees the flag.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) of 8 bytes from a live local to an eventfd; async-signal-safe.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// Installs the handlers; `wake` is written when a signal arrives (it must stay open
/// for the life of the process).
pub fn install(wake: RawFd) -> io::Result<()> {
    WAKE_FD.store(wake, Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; we set the handler and an empty mask.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: sa_mask is a valid sigset_t inside `sa`.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: valid signal number and sigaction; the old action is not needed.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
