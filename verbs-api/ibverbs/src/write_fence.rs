//! Keeps other threads' writes while `ibv_reg_mr` converts pages to a memfd (and
//! while `ibv_dereg_mr` makes them private again).
//!
//! Converting a range ([`crate::mr`]) copies its pages into a memfd and maps the memfd
//! over them; making it private again copies them into a private mapping that `mremap`
//! moves over them. Linux has no atomic "make this private range shared": a write by another
//! thread between the copy and the remap would land in the old page and be dropped
//! with it. Heap neighbours share a buffer's first and last page, so a program whose
//! other threads only touch their own objects could lose data.
//!
//! The fence closes that window. Before the copy the range is made read-only; a thread
//! that writes it meanwhile faults, and this module's SIGSEGV handler makes it wait
//! until the range is writable again (after the remap), then returns, so the write is
//! retried — into the shared page. Reads are never blocked. Faults anywhere else (or of
//! another kind) go to the handler that was installed before ours, or to the default
//! action (the process dies by SIGSEGV as it would have without us).
//!
//! Limits: a system call from another thread that writes into the range during the
//! window (e.g. `read(2)` into a neighbour) fails with EFAULT instead of waiting; a
//! program that replaces the SIGSEGV handler after its first registration loses the
//! fence (its handler sees the fault). The handler is installed at the first
//! registration, not at load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// The range being converted, `[START, END)`; both 0 when none.
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Odd while a conversion runs; bumped at its start and end.
static SEQ: AtomicUsize = AtomicUsize::new(0);
/// The last range converted, for a fault taken during the window whose handler runs
/// only after it closed.
static LAST_START: AtomicUsize = AtomicUsize::new(0);
static LAST_END: AtomicUsize = AtomicUsize::new(0);
/// One conversion at a time (registration is the slow path).
static CONVERTING: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();
/// `si_code` of a fault on a mapped page without the needed permission (asm-generic
/// `siginfo.h`; not in the `libc` crate).
const SEGV_ACCERR: libc::c_int = 2;
/// The SIGSEGV action before ours (written once, before our handler can run).
static mut PREVIOUS: Option<libc::sigaction> = None;

/// Runs `convert` with `[start, start + len)` read-only and writers waiting, then
/// makes the range read-write again (the remap in `convert` already did, if it
/// succeeded). Returns `convert`'s result, or the errno of `mprotect`.
pub(crate) fn fenced<T>(
    start: usize,
    len: usize,
    convert: impl FnOnce() -> Result<T, libc::c_int>,
) -> Result<T, libc::c_int> {
    INSTALL.call_once(install);
    let _one = CONVERTING.lock().unwrap_or_else(|e| e.into_inner());
    START.store(start, Ordering::SeqCst);
    END.store(start + len, Ordering::SeqCst);
    SEQ.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the caller's own mapped range; only the protection changes.
    let r = if unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) } != 0 {
        Err(crate::objects::last_errno())
    } else {
        let r = convert();
        // SAFETY: as above. After a successful remap this is a no-op; after a failed
        // one it restores the program's write access to its (unchanged) pages.
        unsafe {
            libc::mprotect(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        r
    };
    LAST_START.store(start, Ordering::SeqCst);
    LAST_END.store(start + len, Ordering::SeqCst);
    SEQ.fetch_add(1, Ordering::SeqCst);
    START.store(0, Ordering::SeqCst);
    END.store(0, Ordering::SeqCst);
    r
}

fn install() {
    // SAFETY: plain sigaction calls with valid structs; PREVIOUS is written here, once,
    // before the handler is installed (so before it can read it).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_segv as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) != 0 {
            return;
        }
        PREVIOUS = Some(old);
        libc::sigaction(libc::SIGSEGV, &new, std::ptr::null_mut());
    }
}

std::thread_local! {
    /// The (address, SEQ) of this thread's last retry after a closed window, so a
    /// fault that persists there is not retried forever.
    static RETRIED: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    if code == SEGV_ACCERR {
        let seq = SEQ.load(Ordering::SeqCst);
        let inside = |s: &AtomicUsize, e: &AtomicUsize| {
            let (s, e) = (s.load(Ordering::SeqCst), e.load(Ordering::SeqCst));
            s <= addr && addr < e
        };
        if seq % 2 == 1 && inside(&START, &END) {
            while SEQ.load(Ordering::SeqCst) == seq {
                // SAFETY: sched_yield is async-signal-safe.
                unsafe { libc::sched_yield() };
            }
            return; // retry the write
        }
        if inside(&LAST_START, &LAST_END) && RETRIED.with(|r| r.get()) != (addr, seq) {
            RETRIED.with(|r| r.set((addr, seq)));
            return; // the window closed before this handler ran: retry once
        }
    }
    // Not ours: the previous action.
    // SAFETY: PREVIOUS was written before this handler was installed.
    let prev = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program's own three-argument handler.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program's own one-argument handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Default action: restore it and return; the faulting access repeats and
            // the process dies by SIGSEGV, as without this handler.
            // SAFETY: plain sigaction with a zeroed (SIG_DFL) action.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGSEGV, &dfl, std::ptr::null_mut());
            }
        }
    }
}
