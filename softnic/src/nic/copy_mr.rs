//! Copy-backed memory regions: the NIC reaches the client's bytes through the client's
//! `/proc/<pid>/mem`, sent over the control socket (`Request::RegMrCopy`).
//!
//! This is the fallback for memory that has no shareable backing the NIC could map
//! safely: the stack, `MAP_HUGETLB` memory and hugetlb SysV segments (their pages can
//! be punched out and a refault in the NIC's mapping would be SIGBUS), `/dev/shm` and
//! other shared files (the NIC cannot seal a file it did not create, so a client that
//! truncates it would make the NIC's mapping fault). A `pread`/`pwrite` on the mem file
//! never faults in the NIC: an address the client has unmapped is an error return
//! (abi-facts §4 (e)). Access is checked when the *client* opens the file (a
//! self-access), so this works under Yama ptrace scope 1 and 2 and across pid
//! namespaces; the NIC gains nothing the client could not do itself.
//!
//! Cost: one system call per access (per packet's payload on the data path); the
//! kernel copies through a bounce page (docs/ibverbs.md has the measured GB/s).
//! Atomics are refused: a read-modify-write through the file is not atomic against
//! the client's own CPU accesses, which IBTA 9.4.5 and the `Memory` trait require.
//!
//! Known limit: an access blocks the NIC thread for as long as the kernel takes to
//! fault the client's page in — unbounded if the client backs the range with
//! userfaultfd or a mapping of a FUSE file it serves itself.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use softnic_transport::memory::MemError;

use super::memory::RegError;

/// `PROC_SUPER_MAGIC` (linux/magic.h).
const PROC_SUPER_MAGIC: u64 = 0x9fa0;

/// A client's memory, reached through its `/proc/<pid>/mem`.
#[derive(Debug)]
pub struct ProcMem {
    fd: OwnedFd,
}

/// True when `link` (a `/proc/self/fd/N` target) names a process's whole-memory file.
fn is_mem_path(link: &str) -> bool {
    link.strip_prefix("/proc/")
        .and_then(|r| r.strip_suffix("/mem"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

impl ProcMem {
    /// Takes `fd` if it is a `/proc/<pid>/mem` opened read-write: anything else (a
    /// pipe, a FUSE file, another proc file that may block) is refused, so no copy
    /// can stall on a file the client serves. Keeps a duplicate of `fd`.
    pub fn new(fd: BorrowedFd<'_>) -> Result<ProcMem, RegError> {
        let bad = |m: &str| RegError::BadRange(format!("RegMrCopy descriptor: {m}"));
        // SAFETY: an all-zero `statfs` is a valid value to be overwritten by fstatfs.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a valid descriptor we own; sfs is a valid out-pointer.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
            return Err(bad("fstatfs failed"));
        }
        // f_type's integer type differs between targets; compare as u64.
        #[allow(clippy::unnecessary_cast)]
        let magic = sfs.f_type as u64 & 0xffff_ffff;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|_| bad("cannot read its name"))?;
        if magic != PROC_SUPER_MAGIC || !is_mem_path(&link.to_string_lossy()) {
            return Err(bad("not a /proc/<pid>/mem file"));
        }
        // SAFETY: F_GETFL takes no argument.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR {
            return Err(bad("not opened read-write"));
        }
        let fd = fd
            .try_clone_to_owned()
            .map_err(|_| bad("cannot duplicate it"))?;
        Ok(ProcMem { fd })
    }

    /// Copies `dst.len()` bytes at client address `addr` into `dst`.
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let p = dst.as_mut_ptr();
        // SAFETY: `p + done .. p + len` is the rest of the NIC's own buffer `dst`.
        self.transfer(addr, dst.len(), |done, off| unsafe {
            libc::pread(
                self.fd.as_raw_fd(),
                p.add(done).cast(),
                dst.len() - done,
                off,
            )
        })
    }

    /// Copies `src` to client address `addr`.
    pub fn write(&self, addr: u64, src: &[u8]) -> Result<(), MemError> {
        // SAFETY: reads the rest of the NIC's own buffer `src`.
        self.transfer(addr, src.len(), |done, off| unsafe {
            libc::pwrite(
                self.fd.as_raw_fd(),
                src[done..].as_ptr().cast(),
                src.len() - done,
                off,
            )
        })
    }

    /// Runs `io(done, file offset)` (a `pread` or `pwrite` of the rest) until `len`
    /// bytes at client address `addr` have moved.
    fn transfer(
        &self,
        addr: u64,
        len: usize,
        mut io: impl FnMut(usize, libc::off_t) -> isize,
    ) -> Result<(), MemError> {
        let mut done = 0usize;
        while done < len {
            let off = file_offset(addr, done)?;
            done += progress(io(done, off))?;
        }
        Ok(())
    }
}

/// The mem file's offset of client address `addr + done`.
fn file_offset(addr: u64, done: usize) -> Result<libc::off_t, MemError> {
    addr.checked_add(done as u64)
        .and_then(|a| libc::off_t::try_from(a).ok())
        .ok_or(MemError::OutOfRange)
}

/// Bytes a `pread`/`pwrite` moved, or why the access fails: the client unmapped the
/// range, or exited (its memory is gone: reads return 0).
fn progress(n: isize) -> Result<usize, MemError> {
    match n {
        n if n > 0 => Ok(n as usize),
        0 => Err(MemError::OutOfRange),
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => Ok(0),
        _ => Err(MemError::OutOfRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn self_mem() -> OwnedFd {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap()
            .into()
    }

    #[test]
    fn copies_through_the_mem_file_and_fails_cleanly_on_unmapped_memory() {
        let m = ProcMem::new(self_mem().as_fd()).unwrap();
        let mut stack = [0u8; 32];
        let addr = stack.as_mut_ptr() as u64;
        m.write(addr + 4, b"through /proc").unwrap();
        // SAFETY: the write above went through the kernel; re-read the bytes volatilely
        // so the compiler does not assume `stack` unchanged.
        let seen: Vec<u8> = (0..13)
            .map(|i| unsafe { std::ptr::read_volatile(stack.as_ptr().add(4 + i)) })
            .collect();
        assert_eq!(&seen, b"through /proc");
        let mut back = [0u8; 13];
        m.read(addr + 4, &mut back).unwrap();
        assert_eq!(&back, b"through /proc");
        // Address 0 (never mapped) and a kernel address: errors, not faults.
        assert_eq!(m.read(0, &mut back), Err(MemError::OutOfRange));
        assert_eq!(m.write(u64::MAX - 4, b"x"), Err(MemError::OutOfRange));
    }

    #[test]
    fn only_a_read_write_proc_mem_file_is_taken() {
        let ro: OwnedFd = std::fs::File::open("/proc/self/mem").unwrap().into();
        assert!(ProcMem::new(ro.as_fd()).is_err(), "read-only");
        let other: OwnedFd = std::fs::File::open("/proc/self/maps").unwrap().into();
        assert!(ProcMem::new(other.as_fd()).is_err(), "another proc file");
        let memfd = verbs_api::os::memfd("x", 4096).unwrap();
        assert!(ProcMem::new(memfd.as_fd()).is_err());
        assert!(is_mem_path("/proc/123/mem"));
        for p in [
            "/proc/self/mem",
            "/proc//mem",
            "/proc/1/maps",
            "/tmp/proc/1/mem",
        ] {
            assert!(!is_mem_path(p), "{p}");
        }
    }
}
