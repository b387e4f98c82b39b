//! A process's *life sign*: a shared page whose first word says, with no system call
//! to read it, whether the process that made it still runs — the NIC's answer to "is my
//! NIC alive?" for a client that only polls its CQs.
//!
//! How: the word is a *robust futex* held by a thread of the NIC that does nothing else
//! (it holds the word as its TID and sleeps for good). When a thread exits, for any
//! reason — a clean exit, a panic that ends the process, SIGKILL — the kernel walks its
//! robust list and, for each word that still holds the thread's TID, replaces the TID
//! with `FUTEX_OWNER_DIED` (Linux `kernel/futex/core.c`, `handle_futex_death`; the
//! mechanism behind `PTHREAD_MUTEX_ROBUST`). A client maps the page read-only and reads
//! the word: a load, as cheap as the doorbell page's, so an empty poll can look every
//! time and the data path stays syscall-free. A dead NIC cannot announce its death;
//! the kernel does it for the NIC.
//!
//! The page is a memfd sealed with `F_SEAL_FUTURE_WRITE` and `F_SEAL_SEAL` after the NIC
//! mapped it writable: a client can map it only read-only, so no client can mark the
//! NIC dead for the others or keep the kernel from marking it. The robust list head is
//! the holder thread's own (`set_robust_list` is per thread), so glibc's list for the
//! program's other threads is untouched.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use memmap2::{Mmap, MmapOptions, MmapRaw};

/// Bytes of the life-sign file: one page.
pub const LIFE_SIGN_LEN: usize = 4096;

/// `FUTEX_OWNER_DIED` (`linux/futex.h`): what the kernel leaves in the word when the
/// thread that held it exits.
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

/// `struct robust_list` and `struct robust_list_head` (`linux/futex.h`).
#[repr(C)]
struct RobustList {
    next: *const RobustList,
}

#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *const RobustList,
}

/// The NIC's side: the page, mapped writable, and the descriptor clients get.
pub struct LifeSign {
    fd: OwnedFd,
    _map: MmapRaw,
}

impl std::fmt::Debug for LifeSign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifeSign").finish_non_exhaustive()
    }
}

impl LifeSign {
    /// The descriptor to hand a client (it can map it read-only only).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// This process's life sign, made on first use: the page and the thread that holds its
/// word. One per process (it says whether the process runs, not any one object).
pub fn life_sign() -> io::Result<&'static LifeSign> {
    static SIGN: OnceLock<Result<LifeSign, String>> = OnceLock::new();
    SIGN.get_or_init(|| make().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| io::Error::other(e.clone()))
}

fn make() -> io::Result<LifeSign> {
    let fd = super::memfd("softnic-life-sign", LIFE_SIGN_LEN)?;
    let map = MmapOptions::new()
        .len(LIFE_SIGN_LEN)
        .map_raw(fd.as_raw_fd())?;
    let word_addr = map.as_mut_ptr() as usize;
    // SAFETY: fd is a valid memfd made with MFD_ALLOW_SEALING; F_ADD_SEALS takes seal bits.
    super::linux::cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    super::spawn_without_signals("softnic-life", move || hold(word_addr, &tx))?;
    rx.recv()
        .map_err(|_| io::Error::other("the life-sign thread ended before it held the word"))??;
    Ok(LifeSign { fd, _map: map })
}

/// The holder thread: holds the word ([`hold_word`]), reports, and sleeps for the rest
/// of the process's life.
fn hold(word_addr: usize, ready: &std::sync::mpsc::Sender<io::Result<()>>) {
    let _ = ready.send(hold_word(word_addr));
    loop {
        std::thread::park();
    }
}

/// Stores the calling thread's TID in the word at `word_addr` and makes the word the one
/// entry of the thread's robust list, so that the kernel marks it when the thread exits.
fn hold_word(word_addr: usize) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    // SAFETY: word_addr is the start of a page-aligned, writable shared mapping that
    // outlives the calling thread (the caller's contract; the NIC's LifeSign is
    // 'static); AtomicU32 may alias memory another process reads.
    let word = unsafe { &*(word_addr as *const AtomicU32) };
    word.store(tid, Ordering::Release);
    // The list must stay at a fixed address for as long as the thread lives: leaked
    // boxes (two small allocations per thread that holds a word: one per process). The
    // kernel reads the word at `entry + futex_offset`.
    let entry: &'static mut RobustList = Box::leak(Box::new(RobustList {
        next: core::ptr::null(),
    }));
    let head: &'static mut RobustListHead = Box::leak(Box::new(RobustListHead {
        list: RobustList {
            next: core::ptr::null(),
        },
        futex_offset: (word_addr as libc::c_long).wrapping_sub(entry as *const _ as libc::c_long),
        list_op_pending: core::ptr::null(),
    }));
    entry.next = &head.list;
    head.list.next = entry;
    // SAFETY: `head` is a valid robust_list_head that is never freed, its one entry
    // points back to it (the kernel's end-of-list test) and locates the word.
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            head as *const RobustListHead,
            core::mem::size_of::<RobustListHead>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A client's view of a NIC's life sign: the page mapped read-only.
#[derive(Debug)]
pub struct LifeSignView {
    map: Mmap,
}

impl LifeSignView {
    /// Maps the life-sign descriptor a NIC sent.
    pub fn map(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        // SAFETY: a read-only shared mapping of a sealed memfd that cannot shrink
        // (F_SEAL_SHRINK, `memfd`); its contents change only as one aligned word.
        let map = unsafe { MmapOptions::new().len(LIFE_SIGN_LEN).map(&file)? };
        Ok(LifeSignView { map })
    }

    /// Whether the process that made the page has exited: one load.
    pub fn owner_died(&self) -> bool {
        // SAFETY: the mapping is page-aligned and at least 4 bytes long, and lives as
        // long as `self`; an atomic load does not write the read-only page.
        let word = unsafe { &*(self.map.as_ptr() as *const AtomicU32) };
        word.load(Ordering::Acquire) & FUTEX_OWNER_DIED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel marks a held word when its thread exits (the same happens to every
    /// thread of a process that is killed: `nic_gone.c` in softnic's `ibverbs_stock`
    /// checks it against a real NIC killed with SIGKILL).
    #[test]
    fn the_kernel_marks_the_word_when_its_holder_exits() {
        let fd = super::super::memfd("life-sign-test", LIFE_SIGN_LEN).unwrap();
        let map = MmapOptions::new()
            .len(LIFE_SIGN_LEN)
            .map_raw(fd.as_raw_fd())
            .unwrap();
        let addr = map.as_mut_ptr() as usize;
        let view = LifeSignView::map(fd.as_fd()).unwrap();
        std::thread::spawn(move || hold_word(addr).unwrap())
            .join()
            .unwrap();
        assert!(
            view.owner_died(),
            "the kernel marked the word at the holder's exit"
        );
        drop(map);
    }

    /// This process's own sign reads "alive", and a client cannot map it writable.
    #[test]
    fn a_live_sign_reads_alive_and_maps_read_only() {
        let sign = life_sign().unwrap();
        let view = LifeSignView::map(sign.fd()).unwrap();
        assert!(!view.owner_died());
        let writable = MmapOptions::new()
            .len(LIFE_SIGN_LEN)
            .map_raw(sign.fd().as_raw_fd());
        assert!(writable.is_err(), "a client mapped the life sign writable");
        // Reopened for writing through /proc: the seals are the file's, not the fd's.
        let path = format!("/proc/self/fd/{}", sign.fd().as_raw_fd());
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&path) {
            use std::io::Write;
            assert!(f.write_all(&[0xFF; 4]).is_err(), "wrote the life sign");
            let map = MmapOptions::new().len(LIFE_SIGN_LEN).map_raw(f.as_raw_fd());
            assert!(map.is_err(), "mapped the reopened life sign writable");
        }
        assert!(!view.owner_died());
    }
}
