//! Linux implementation of the [`crate::os`] seam.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

pub(super) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Creates an anonymous shared-memory file of `len` bytes (`memfd_create`, close-on-exec),
/// with every page allocated and sealed against shrinking.
///
/// The peer (the NIC) maps it, and a mapping whose page is missing can fault with SIGBUS
/// in the peer: after a shrink (hence `F_SEAL_SHRINK`), or on the first touch of a page
/// the kernel cannot allocate (strict overcommit, `vm.overcommit_memory=2`: memfds are
/// accounted page by page as they are allocated). So the pages are allocated here with
/// `fallocate`, by the client, which pays for its own memory and gets a clean error
/// (ENOSPC) when there is none — as `ibv_reg_mr` pins every page of a region up front.
/// A length beyond the machine's RAM + swap is refused before allocating anything.
/// `F_SEAL_SEAL` is left off on purpose: the NIC adds `F_SEAL_FUTURE_WRITE` after
/// mapping the file, so that no hole can be punched later ([`map_peer_shm`]).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    memfd_inner(name, len, true)
}

/// [`memfd`] without the `fallocate`: for a caller that writes every page itself before
/// the NIC maps the file (softnic-ibverbs fills its memfd with `pwrite`, which allocates
/// each page as it copies; allocating them first only adds work, 20–60 % of a
/// registration's time in an A/B run). The NIC refuses the file while any page is
/// missing ([`map_peer_shm`]), so writing fewer than all pages fails cleanly.
pub fn memfd_unallocated(name: &str, len: usize) -> io::Result<OwnedFd> {
    memfd_inner(name, len, false)
}

fn memfd_inner(name: &str, len: usize, allocate: bool) -> io::Result<OwnedFd> {
    let cname = CString::new(name.replace('\0', "_")).map_err(io::Error::other)?;
    // SAFETY: cname is a valid NUL-terminated string; flags are valid memfd flags.
    let fd = cvt(unsafe {
        libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: the kernel just returned this descriptor to us; we are its only owner.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd length too large"))?;
    // SAFETY: fd is a valid open memfd.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len_off) })?;
    if allocate && len_off > 0 {
        // Allocating more than the machine has (RAM + swap) can never succeed, and on a
        // memfd, which has no size limit, it would run the machine into the OOM killer
        // before failing: refuse it up front, as RLIMIT_MEMLOCK bounds ibv_reg_mr.
        // SAFETY: an all-zero sysinfo is valid to be overwritten; the pointer is valid.
        let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sysinfo(&mut si) } == 0 {
            let unit = u64::from(si.mem_unit.max(1));
            #[allow(clippy::unnecessary_cast)]
            let total = (si.totalram as u64).saturating_add(si.totalswap as u64) * unit;
            if len as u64 > total {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "{len} bytes exceed this machine's memory ({total} bytes of RAM + swap)"
                    ),
                ));
            }
        }
        // SAFETY: fd is a valid memfd; mode 0 allocates [0, len) without changing the size.
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len_off) })?;
    }
    // SAFETY: fd is a valid memfd created with MFD_ALLOW_SEALING.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) })?;
    Ok(fd)
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

/// Checks a shared-memory fd received from a peer before mapping it: a plain shmem
/// memfd (tmpfs, not hugetlbfs or anything else), at least `min_len` bytes, sealed
/// against shrinking, and not yet write-sealed or seal-sealed, so that
/// [`map_peer_shm`] can map it writable and then seal it against hole punching.
///
/// hugetlbfs is refused because its pages come from a fixed pool: a hole punched in a
/// hugetlbfs memfd also drops the mapping's reservation, and refaulting it when the pool
/// is empty is SIGBUS in whoever touches it. Only `TMPFS_MAGIC` (what `memfd_create`
/// without `MFD_HUGETLB` gives) passes.
pub fn check_shm(fd: BorrowedFd<'_>, min_len: usize) -> io::Result<()> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fd is a valid descriptor (BorrowedFd), st is a valid out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(invalid("shared-memory fd is not a regular file (memfd)"));
    }
    // SAFETY: an all-zero `statfs` is a valid value to be overwritten by fstatfs.
    let mut sfs: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: fd is valid, sfs is a valid out-pointer.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) })?;
    // f_type's integer type differs between targets; compare as u64.
    #[allow(clippy::unnecessary_cast)]
    let magic = sfs.f_type as u64 & 0xffff_ffff;
    if magic != libc::TMPFS_MAGIC as u64 {
        let what = if magic == libc::HUGETLBFS_MAGIC as u64 {
            "a hugetlbfs file (MFD_HUGETLB)"
        } else {
            "not on tmpfs"
        };
        return Err(invalid(format!(
            "shared-memory fd is {what}: only plain memfds (tmpfs) are accepted, whose \
             pages cannot vanish under the NIC's mapping"
        )));
    }
    let size = usize::try_from(st.st_size).unwrap_or(0);
    if size < min_len {
        return Err(invalid(format!(
            "shared-memory fd is {size} bytes, expected at least {min_len}"
        )));
    }
    // SAFETY: fd is valid; F_GET_SEALS takes no argument.
    let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(invalid(
            "shared-memory fd is not sealed against shrinking (F_SEAL_SHRINK)",
        ));
    }
    if seals & (libc::F_SEAL_SEAL | libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
        return Err(invalid(
            "shared-memory fd already has F_SEAL_SEAL or a write seal: the NIC must map it \
             writable and then add F_SEAL_FUTURE_WRITE itself",
        ));
    }
    Ok(())
}

/// Maps a peer's shared-memory fd (the NIC's side) so that no access through the
/// mapping can fault with SIGBUS, whatever the peer does to the file afterwards:
///
/// 1. [`check_shm`]: a plain tmpfs memfd of at least `len` bytes, sealed against
///    shrinking (a truncated file is SIGBUS beyond the new end).
/// 2. Map it shared, read-write.
/// 3. Add `F_SEAL_FUTURE_WRITE`: from now on nobody can punch a hole in the file
///    (`fallocate(PUNCH_HOLE)` and `madvise(MADV_REMOVE)` fail with EPERM), while the
///    mappings that exist — the client's and ours — stay writable. `F_SEAL_WRITE` would
///    be stronger but cannot be added while a writable shared mapping exists, and both
///    sides need one. The seal also refuses every later writable mapping of the file, so
///    one fd can back only one NIC object.
/// 4. Require the peer to have allocated every page (`st_blocks` covers the file's size:
///    [`memfd`] does this with `fallocate`), then `fallocate` `[0, len)` ourselves. The
///    first check keeps the NIC from paying for a sparse file's memory; the second makes
///    it certain, without trusting a block count (shmem huge pages may count blocks past
///    the end of the file), that every page in `[0, len)` exists.
///    Since no page can now be removed, the NIC never allocates on a fault, so strict
///    overcommit (`vm.overcommit_memory=2`, where a failed shmem allocation on first
///    touch is SIGBUS) cannot reach it. Swapped-out pages come back from swap, which can
///    fail only as an OOM, not as SIGBUS from anything the client controls.
///
/// Why not catch SIGBUS instead: a handler would have to turn a fault in the middle of
/// a `copy_nonoverlapping` into an error, which needs `sigsetjmp`/`siglongjmp` across
/// Rust frames (undefined behaviour) or a hand-written copy routine with a fixup table.
/// Making the fault impossible is smaller and auditable.
pub fn map_peer_shm(fd: BorrowedFd<'_>, len: usize) -> io::Result<MmapRaw> {
    check_shm(fd, len)?;
    let map = map_shared(fd, len)?;
    // SAFETY: fd is valid; F_ADD_SEALS takes an int of seal bits.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) })?;
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fd is valid, st is a valid out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    // Every page of the whole file, not only of [0, len): otherwise allocated pages past
    // `len` could stand in for holes inside it, and the NIC's fallocate would pay for them.
    let size = u64::try_from(st.st_size).unwrap_or(0).max(len as u64);
    let needed = size.div_ceil(4096) * 4096;
    if allocated < needed {
        return Err(invalid(format!(
            "shared-memory fd has {allocated} of {needed} bytes allocated: its pages must \
             all exist (fallocate) before the NIC maps it"
        )));
    }
    if len > 0 {
        let len_off = libc::off_t::try_from(len).map_err(|_| invalid("length too large"))?;
        // SAFETY: fd is valid; mode 0 allocates [0, len) inside the (sealed) size.
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len_off) })?;
    }
    Ok(map)
}

/// Maps `len` bytes of `fd` shared, read-write, and `MADV_DONTFORK`: a child after
/// `fork()` has no mapping there (touching it is SIGSEGV), so it cannot write into the
/// parent's rings or memory regions — the NIC would act on what it wrote. This is what
/// rdma-core's `ibv_fork_init` does for registered memory.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<MmapRaw> {
    let map = MmapOptions::new().len(len).map_raw(fd.as_raw_fd())?;
    if len > 0 {
        map.advise(memmap2::Advice::DontFork)?;
    }
    Ok(map)
}

/// Creates a non-blocking, close-on-exec eventfd with counter 0.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with valid flags.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: fresh descriptor from the kernel, owned by us only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` has `O_NONBLOCK`.
pub fn is_nonblocking(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: F_GETFL on a valid fd reads its flags; no memory is passed.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid fd with integer flags; no memory is passed.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

/// Adds 1 to an eventfd's counter (one write(2)). A full counter (EAGAIN) already
/// means "wake up", so it is not an error.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to a valid fd.
    let r = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    match cvt_size(r) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes one count from a semaphore eventfd (`EFD_SEMAPHORE`) without ever blocking,
/// whatever its `O_NONBLOCK`: true if one was taken, false if the counter was 0 or the
/// kernel refuses `RWF_NOWAIT` on eventfds (then nothing is read, unlike
/// [`eventfd_drain`], so a caller holding a lock another waker needs cannot block).
pub fn eventfd_take_nowait(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut v: u64 = 0;
    match cvt_size(read_u64_nowait(fd, &mut v)) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads and resets an eventfd's counter; 0 when it was already 0 (EAGAIN).
///
/// The read is a `preadv2` with `RWF_NOWAIT`, which eventfd honours on current
/// kernels whatever the fd's `O_NONBLOCK` says; one that refuses the flag
/// (EOPNOTSUPP) gets a plain `read`, which blocks on an empty counter if `O_NONBLOCK`
/// is clear. That flag belongs to the open file, which anyone given the fd over
/// `SCM_RIGHTS` shares and can clear: drain only eventfds no one else holds (a
/// client's wake-up descriptor is a [`WakePipe`] for that reason).
pub fn eventfd_drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: u64 = 0;
    let mut r = read_u64_nowait(fd, &mut v);
    if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
        // SAFETY: reads 8 bytes into a valid u64 from a valid fd.
        r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
    match cvt_size(r) {
        Ok(_) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// One 8-byte `preadv2` with `RWF_NOWAIT` into `v` at the current position: the raw
/// result (−1 with `errno` set on failure). eventfd answers it without blocking on
/// current kernels whatever the fd's `O_NONBLOCK`; an older one refuses the flag
/// (EOPNOTSUPP).
fn read_u64_nowait(fd: BorrowedFd<'_>, v: &mut u64) -> isize {
    let iov = libc::iovec {
        iov_base: (v as *mut u64).cast(),
        iov_len: 8,
    };
    // SAFETY: one iovec of 8 bytes over a valid u64; offset -1 = the current position.
    unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) }
}

/// Blocks until `fd` is readable or `timeout` passes (`None` = forever). Returns
/// whether it became readable. EINTR is retried with the remaining time.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let [ready] = wait_any_readable([fd], timeout)?;
    Ok(ready)
}

/// Blocks until one of `fds` is readable (or its peer end is closed, which also makes
/// a read return at once) or `timeout` passes (`None` = forever). Returns, per fd,
/// whether it is; all false on timeout. EINTR is retried with the remaining time.
/// Arrays in and out, so that a wait allocates nothing (a client's watcher waits in a
/// loop).
pub fn wait_any_readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    poll_readable(fds, timeout, || true)
}

/// The `poll(2)` loop of [`wait_any_readable`] and [`wait_readable_as_read`]: an EINTR
/// is retried with the remaining time while `restart()` says so, and returned otherwise.
fn poll_readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Option<Duration>,
    restart: impl Fn() -> bool,
) -> io::Result<[bool; N]> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        let ms: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so that a short timeout still sleeps.
                let ms = left.as_micros().div_ceil(1000);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
        };
        // SAFETY: `pfds` is a live array of pollfd of the given length.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted && restart() {
                continue;
            }
            return Err(e);
        }
        if r > 0 {
            return Ok(pfds.map(|p| p.revents != 0));
        }
        if ms >= 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok([false; N]);
        }
    }
}

/// Blocks until `fd` is readable, as a blocking `read(2)` of it would: a signal whose
/// handler lacks `SA_RESTART` ends the wait with EINTR, any other interruption is
/// restarted ([`interrupted_wait_restarts`]). For the C libraries' blocking calls,
/// which rdma-core implements as reads of a kernel file.
pub fn wait_readable_as_read(fd: BorrowedFd<'_>) -> io::Result<()> {
    poll_readable([fd], None, interrupted_wait_restarts).map(|_| ())
}

/// Sleeps while `*word == expected`, for at most `timeout` (`FUTEX_WAIT`, shared: the
/// word may sit in memory mapped by another process, and a waker there must reach
/// us, so not `FUTEX_PRIVATE_FLAG`). Returns when woken, when the word differs (at
/// once: the kernel compares atomically with queueing the waiter), on a signal, or
/// at the timeout; the caller re-checks what it waits for in every case.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 for the whole call; `ts` is a live timespec
    // (a relative timeout for FUTEX_WAIT); the last two arguments are unused by it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ETIMEDOUT) => Ok(()),
            _ => Err(e),
        };
    }
    Ok(())
}

/// Wakes every thread (of any process) in [`futex_wait`] on `word` (`FUTEX_WAKE`,
/// shared). Returns how many woke.
pub fn futex_wake(word: &AtomicU32) -> io::Result<u32> {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE reads no other argument.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u32)
}

/// Creates a close-on-exec pipe, both ends non-blocking: `(read end, write end)`. The
/// two ends are separate open files, so whoever is given the read end cannot change
/// the write end's flags (an eventfd shared over `SCM_RIGHTS` is one open file: its
/// receiver could clear `O_NONBLOCK` under the sender's writes).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the 2-element array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
    // SAFETY: two fresh descriptors from the kernel, owned by us only.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A readiness pipe whose write end stays with its creator (the NIC): [`Self::reader`]
/// hands out copies of the read end only, a separate open file, so nothing a holder
/// of one does to its flags can make [`Self::signal`] block. A full pipe is skipped
/// (its reader has bytes to wake it already). The read end is kept too, so a reader
/// that closes its copy never turns a write into EPIPE.
#[derive(Debug)]
pub struct SignalPipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl SignalPipe {
    /// A new, empty pipe ([`pipe`]).
    pub fn new() -> io::Result<SignalPipe> {
        let (read, write) = pipe()?;
        Ok(SignalPipe { read, write })
    }

    /// A copy of the read end, to hand out.
    pub fn reader(&self) -> io::Result<OwnedFd> {
        self.read.try_clone()
    }

    /// The read end (for the creator's own checks).
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Writes one byte; never blocks, and a full pipe is not an error.
    pub fn signal(&self) -> io::Result<()> {
        pipe_signal(self.write.as_fd())
    }

    /// [`SignalPipe::signal`] for a signaller with no one to report a failure to (the
    /// NIC): never blocks (its own non-blocking write end), a full pipe needs no byte
    /// more (its reader has bytes to wake it already), and any other error is dropped —
    /// the reader then simply is not woken.
    pub fn notify(&self) {
        let _ = self.signal();
    }
}

/// A wake-up pipe whose read end stays with its creator (the NIC), the mirror of
/// [`SignalPipe`]: [`Self::writer`] hands out copies of the write end, and the read end
/// is a separate open file, so nothing a holder does to its flags can make
/// [`Self::drain`] block, on any kernel. (An eventfd passed over `SCM_RIGHTS` is one open
/// file: its receiver can clear `O_NONBLOCK` under the reader, and only `RWF_NOWAIT`,
/// which older kernels refuse for eventfds, kept that read from blocking.) The write
/// end is kept too, so a holder that closes its copy never leaves the pipe at end of
/// file, which would make it readable for good.
///
/// Not a pipe(2) but a UNIX datagram socket pair, which serves as one here (a socket
/// per end, each with its own `O_NONBLOCK`; every datagram a wake-up) except for a
/// writer whose reader is gone: [`wake_signal`] sends with `MSG_NOSIGNAL` and gets an
/// error, where a write to a pipe raises SIGPIPE — which kills a C program (only Rust
/// programs ignore it) that posts after its NIC was killed, a death rdma-core's
/// libraries never cause. Datagram, not stream: a holder's `shutdown(2)` of a stream
/// socket would put the reader at end of file (readable for good), while a datagram
/// socket's shutdown stays its own. A holder that floods it fills its queue (the
/// kernel's `max_dgram_qlen`), then its sends fail with EAGAIN.
#[derive(Debug)]
pub struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

/// The most wake-ups (datagrams) [`WakePipe::drain`] takes at once.
const WAKE_DRAIN_MAX: usize = 64;

impl WakePipe {
    /// A new, empty pair, both ends non-blocking and close-on-exec.
    pub fn new() -> io::Result<WakePipe> {
        let mut fds = [0 as libc::c_int; 2];
        let ty = libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        // SAFETY: socketpair writes two descriptors into the 2-element array.
        cvt(unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) })?;
        // SAFETY: two fresh descriptors from the kernel, owned by us only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(WakePipe { read, write })
    }

    /// A copy of the write end, to hand out. Any write wakes the reader; 8 bytes (as
    /// [`eventfd_signal`] writes) are as good as one.
    pub fn writer(&self) -> io::Result<OwnedFd> {
        self.write.try_clone()
    }

    /// The read end, to wait on.
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Takes the wake-ups waiting, at most `WAKE_DRAIN_MAX`, 64 (one `read(2)` each);
    /// returns how many. Never blocks (the read end's `O_NONBLOCK` is its creator's
    /// alone). A writer that keeps sending gets no loop: what is left keeps the read
    /// end readable, so the next wait returns at once and the next drain takes more.
    pub fn drain(&self) -> io::Result<usize> {
        let mut buf = [0u8; 16];
        let mut taken = 0;
        while taken < WAKE_DRAIN_MAX {
            // SAFETY: reads at most buf.len() bytes into a valid buffer from a valid fd
            // (a longer datagram is cut short, which is all a wake-up needs).
            let r =
                unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            match cvt_size(r) {
                Ok(_) => taken += 1,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if taken == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(taken)
    }
}

/// Wakes whoever reads the other end of `fd`, a [`WakePipe`]'s write end (8 bytes, as
/// to an eventfd: the reader takes any bytes as one wake-up). Never blocks
/// (`MSG_DONTWAIT`, whatever the descriptor's flags), a full buffer is not an error
/// (its reader has bytes to wake it already), and a reader that is gone is an error
/// (ECONNREFUSED), never SIGPIPE (`MSG_NOSIGNAL`, and a datagram socket raises none).
/// A descriptor that is not a socket (an eventfd, as test doubles of the NIC hand out)
/// is written as by [`eventfd_signal`].
pub fn wake_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    // SAFETY: sends 8 bytes from a valid u64 on a valid fd.
    let r = unsafe { libc::send(fd.as_raw_fd(), (&one as *const u64).cast(), 8, flags) };
    match cvt_size(r) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => eventfd_signal(fd),
        Err(e) => Err(e),
    }
}

/// Writes one byte to the non-blocking write end of a pipe. A full pipe is not an
/// error: its reader has bytes to wake it already.
pub fn pipe_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = [1u8];
    // SAFETY: writes 1 byte from a valid buffer to a valid fd.
    let r = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 1) };
    match cvt_size(r) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

/// Empties the non-blocking read end of a pipe. Returns false when the pipe is at end
/// of file (every write end closed).
pub fn pipe_drain(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(pipe_take(fd)?.is_some())
}

/// Empties the non-blocking read end of a pipe and says how many bytes it held:
/// `Some(0)` when it was empty (another reader may have taken them), `None` at end of
/// file (every write end closed: for a pipe the NIC writes, the NIC is gone).
pub fn pipe_take(fd: BorrowedFd<'_>) -> io::Result<Option<usize>> {
    let mut buf = [0u8; 64];
    let mut total = 0;
    loop {
        // SAFETY: reads at most buf.len() bytes into a valid buffer from a valid fd.
        let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match cvt_size(r) {
            Ok(0) if total == 0 => return Ok(None),
            Ok(n) if n < buf.len() => return Ok(Some(total + n)),
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Some(total)),
            Err(e) => return Err(e),
        }
    }
}

/// A close-on-exec epoll instance: one descriptor that `poll(2)` reports readable
/// while any descriptor added with [`epoll_add`] is.
pub fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with a valid flag.
    let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: fresh descriptor from the kernel, owned by us only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to the epoll instance `ep`, watched for readability (level-triggered),
/// with `data` as its tag.
pub fn epoll_add(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: data,
    };
    // SAFETY: both descriptors are valid; ev is a valid epoll_event.
    cvt(unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) })?;
    Ok(())
}

/// One `sendmsg` of `bytes` with `fds` as SCM_RIGHTS (MSG_NOSIGNAL: a closed peer is an
/// EPIPE error, not a SIGPIPE). Returns the bytes sent (may be fewer than `bytes`;
/// the fds travel with the first byte).
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fd_bytes = core::mem::size_of_val(raw.as_slice());
    let fd_bytes_u32 = u32::try_from(fd_bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many fds"))?;
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes_u32) } as usize;
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points to `space` bytes, enough for one cmsghdr with
        // `fd_bytes` of data, so CMSG_FIRSTHDR is non-null and CMSG_DATA is in bounds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes_u32) as _;
            core::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
        }
    }
    loop {
        // SAFETY: msg points to a valid iovec and control buffer that outlive the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// What one [`recv_with_fds`] returned.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer (0 = end of stream).
    pub len: usize,
    /// Descriptors received (already owned: dropping them closes them).
    pub fds: Vec<OwnedFd>,
    /// The kernel dropped descriptors because more arrived than `max_fds` (MSG_CTRUNC).
    pub fds_truncated: bool,
}

/// One `recvmsg` into `buf`, accepting up to `max_fds` descriptors (close-on-exec).
/// Every descriptor the kernel installs is wrapped in an [`OwnedFd`] at once, so none
/// leaks whatever the caller does next; extra ones are closed by the kernel
/// (MSG_CTRUNC), which is reported.
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize) -> io::Result<Received> {
    let fd_bytes = u32::try_from(max_fds.max(1) * core::mem::size_of::<RawFd>())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "max_fds too large"))?;
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let len = loop {
        // SAFETY: msg points to a valid iovec over `buf` and a control buffer of `space`
        // bytes, both alive for the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    // SAFETY: after recvmsg, msg_control/msg_controllen describe the control data the
    // kernel wrote into cbuf; CMSG_FIRSTHDR/NXTHDR stay within it.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: c is a valid cmsghdr inside cbuf (from CMSG_FIRSTHDR/NXTHDR).
        let (level, ty, clen) =
            unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
        if level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS {
            // SAFETY: pure computation.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = clen.saturating_sub(header) / core::mem::size_of::<RawFd>();
            // SAFETY: c is valid; its data holds n fds within cbuf.
            let data = unsafe { libc::CMSG_DATA(c) };
            for i in 0..n {
                // SAFETY: i < n, so the read stays inside this cmsg's data; the data
                // may be unaligned, hence read_unaligned.
                let fd = unsafe { core::ptr::read_unaligned(data.cast::<RawFd>().add(i)) };
                if fd >= 0 {
                    // SAFETY: the kernel installed this descriptor for us; nobody else
                    // owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // SAFETY: msg and c are valid as above.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok(Received {
        len,
        fds,
        fds_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// Starts a library thread (`name`) that never takes the program's signals: all
/// blockable signals are blocked in it from birth. A process-directed signal (an
/// `alarm`/`setitimer` SIGALRM, a SIGINT) goes to some thread that does not block it;
/// rdma-core's libraries run no threads, so a program expects its own threads to get
/// them — qperf ends each timed test by a SIGALRM that must interrupt its wait for a
/// completion (`ibv_get_cq_event`). The mask is set in the spawning thread around
/// the spawn (a new thread inherits it) and restored at once, so no signal can reach
/// the new thread before it is blocked.
pub fn spawn_without_signals<F>(name: &str, f: F) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t is plain data; sigfillset initialises it fully.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a live sigset_t.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: both sets are live; changes only this thread's mask, restored below.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: `old` is the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// Whether a blocking wait that a signal interrupted (EINTR) should be restarted, as
/// the kernel restarts a `read(2)` (rdma-core's `ibv_get_cq_event` reads its channel
/// fd): it does unless the signal's handler was installed without `SA_RESTART`. A
/// wait built on `epoll_wait`/`poll` is never restarted by the kernel, and which
/// signal interrupted it is not known here, so this answers "restart" unless some
/// signal has a handler without `SA_RESTART` (then the program likely relies on
/// EINTR, as qperf's test timer does). A stop and continue (SIGSTOP, then SIGCONT,
/// e.g. a debugger) also interrupts `epoll_wait` without any handler: restarted, as
/// the read would be.
pub fn interrupted_wait_restarts() -> bool {
    // Faults (SIGSEGV, SIGBUS, …) are raised by the faulting thread's own instruction,
    // never during a wait; Rust's runtime and softnic's libibverbs (remapped memory)
    // install handlers for some of them.
    const SYNCHRONOUS: [libc::c_int; 6] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
    ];
    (1..=libc::SIGRTMAX()).all(|sig| {
        if SYNCHRONOUS.contains(&sig) {
            return true;
        }
        // SAFETY: sigaction is plain data; querying (no new action) writes `old` only.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into `old`.
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// `clock_gettime(id)` in nanoseconds (the vDSO answers it: no system call).
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid out-pointer; every clock the functions below name exists
    // on Linux (CLOCK_THREAD_CPUTIME_ID since 2.6.12).
    unsafe { libc::clock_gettime(id, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Now in `CLOCK_MONOTONIC` nanoseconds: the clock completion timestamps are in, the
/// same in every process on the host.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Now in `CLOCK_REALTIME` nanoseconds (since the Unix epoch).
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CPU time the calling thread has run, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, a
/// system call, unlike the two above). Up to date at each read, where
/// `/proc/thread-self/schedstat` lags a running thread by up to a scheduler tick; the
/// benches' CPU-time figures (`softnic/benches/common/cpu.rs`).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clocks are the ones named: monotonic never goes back across a sleep and
    /// advances by at least it; realtime is after 2025-01-01 and agrees with
    /// `SystemTime` (the same clock).
    #[test]
    fn clocks_read_the_clocks_they_name() {
        let a = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = monotonic_ns();
        assert!(b >= a + 2_000_000, "{a} then {b}");
        let real = realtime_ns();
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(real > 1_735_689_600_000_000_000);
        assert!(sys.abs_diff(real) < 1_000_000_000);
    }

    /// The thread's CPU clock counts running, not sleeping: 20 ms of spinning adds at
    /// least 10 ms (the spin may be preempted), a 50 ms sleep adds less than 20 ms.
    #[test]
    fn thread_cpu_time_counts_running_not_sleeping() {
        let a = thread_cpu_ns();
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let b = thread_cpu_ns();
        std::thread::sleep(Duration::from_millis(50));
        let c = thread_cpu_ns();
        assert!(b - a >= 10_000_000, "spun 20 ms, counted {} ns", b - a);
        assert!(c - b < 20_000_000, "slept 50 ms, counted {} ns", c - b);
    }
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn memfd_has_size_and_shrink_seal() {
        let fd = memfd("t", 8192).unwrap();
        check_shm(fd.as_fd(), 8192).unwrap();
        assert!(check_shm(fd.as_fd(), 8193).is_err());
        let f = std::fs::File::from(fd);
        assert!(f.set_len(4096).is_err(), "shrinking must be refused");
    }

    #[test]
    fn unallocated_memfd_is_accepted_once_every_page_is_written() {
        let fd = memfd_unallocated("copy", 12288).unwrap();
        let f = std::fs::File::from(fd.try_clone().unwrap());
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[7u8; 8192], 0).unwrap();
        let err = map_peer_shm(fd.as_fd(), 12288).unwrap_err();
        assert!(err.to_string().contains("allocated"), "{err}");
        // A refused map_peer_shm has already sealed the file: a fresh one, fully written.
        let fd = memfd_unallocated("copy", 12288).unwrap();
        let f = std::fs::File::from(fd.try_clone().unwrap());
        f.write_all_at(&[7u8; 12288], 0).unwrap();
        let m = map_peer_shm(fd.as_fd(), 12288).unwrap();
        // SAFETY: in-bounds read of a live mapping.
        assert_eq!(unsafe { m.as_ptr().add(12287).read_volatile() }, 7);
    }

    #[test]
    fn memfd_larger_than_the_machine_is_refused_before_allocating() {
        let err = memfd("huge", 1 << 50).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory, "{err}");
    }

    #[test]
    fn unsealed_file_is_refused() {
        let f = tempfile_in_tmp();
        f.set_len(4096).unwrap();
        let err = check_shm(f.as_fd(), 4096).unwrap_err();
        assert!(err.to_string().contains("F_SEAL_SHRINK"), "{err}");
    }

    /// A raw memfd as a hostile client could make it: `flags` for memfd_create, `len`
    /// bytes, `seals` added, not allocated unless `allocate`.
    fn raw_memfd(
        flags: libc::c_uint,
        len: usize,
        seals: libc::c_int,
        allocate: bool,
    ) -> io::Result<OwnedFd> {
        let name = CString::new("hostile").unwrap();
        // SAFETY: valid name and flags.
        let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_CLOEXEC) })?;
        // SAFETY: fresh descriptor, owned by us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid fd.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        if allocate {
            // SAFETY: valid fd.
            cvt(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) })?;
        }
        if seals != 0 {
            // SAFETY: valid fd.
            cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        }
        Ok(fd)
    }

    fn punch(fd: BorrowedFd<'_>, off: usize, len: usize) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: valid fd; punching a hole has no memory-safety preconditions.
        cvt(unsafe {
            libc::fallocate(fd.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t)
        })
        .map(|_| ())
    }

    fn in_ci() -> bool {
        let set =
            |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
        set("SOFTNIC_CI") || set("CI")
    }

    /// hugetlbfs memfds are refused whatever the hugepage pool holds: a hole punched in
    /// one drops its pages and reservation, and refaulting from an empty pool is SIGBUS.
    /// memfd_create(MFD_HUGETLB) needs only a kernel with hugetlbfs (no reserved pages);
    /// CI's has it, so there the test fails rather than skips when it cannot make one.
    #[test]
    fn hugetlbfs_memfd_is_refused() {
        let huge = 2 << 20;
        let fd = match raw_memfd(
            libc::MFD_HUGETLB | libc::MFD_ALLOW_SEALING,
            huge,
            libc::F_SEAL_SHRINK,
            false,
        ) {
            Ok(fd) => fd,
            Err(e) if !in_ci() => {
                eprintln!(
                    "NOTE: memfd_create(MFD_HUGETLB) failed ({e}); test did NOT run (fails in CI)"
                );
                return;
            }
            Err(e) => panic!("memfd_create(MFD_HUGETLB) failed in CI: {e}"),
        };
        let err = check_shm(fd.as_fd(), huge).unwrap_err();
        assert!(err.to_string().contains("hugetlbfs"), "{err}");
        let err = map_peer_shm(fd.as_fd(), huge).unwrap_err();
        assert!(err.to_string().contains("hugetlbfs"), "{err}");
    }

    /// A sparse memfd would make the NIC allocate on first touch, which strict
    /// overcommit turns into SIGBUS: refused until the client has allocated every page.
    #[test]
    fn sparse_memfd_is_refused() {
        let fd = raw_memfd(libc::MFD_ALLOW_SEALING, 16384, libc::F_SEAL_SHRINK, false).unwrap();
        let err = map_peer_shm(fd.as_fd(), 16384).unwrap_err();
        assert!(err.to_string().contains("allocated"), "{err}");
        // Allocating all but one page is still refused.
        let fd = raw_memfd(libc::MFD_ALLOW_SEALING, 16384, 0, true).unwrap();
        punch(fd.as_fd(), 8192, 4096).unwrap();
        // SAFETY: valid fd.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) })
            .unwrap();
        let err = map_peer_shm(fd.as_fd(), 16384).unwrap_err();
        assert!(err.to_string().contains("allocated"), "{err}");
    }

    /// A client that sealed its memfd with F_SEAL_SEAL (or a write seal) leaves the NIC
    /// no way to forbid hole punching: refused.
    #[test]
    fn seal_sealed_memfd_is_refused() {
        let fd = raw_memfd(
            libc::MFD_ALLOW_SEALING,
            8192,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
            true,
        )
        .unwrap();
        let err = map_peer_shm(fd.as_fd(), 8192).unwrap_err();
        assert!(err.to_string().contains("F_SEAL_SEAL"), "{err}");
    }

    /// Once the NIC has mapped a memfd, the client can punch no hole in it, by fallocate
    /// or by madvise(MADV_REMOVE) on its own mapping, and both mappings stay writable.
    #[test]
    fn no_hole_can_be_punched_after_the_nic_maps() {
        let fd = memfd("client", 16384).unwrap();
        let client = map_shared(fd.as_fd(), 16384).unwrap();
        let nic = map_peer_shm(fd.as_fd(), 16384).unwrap();
        let e = punch(fd.as_fd(), 4096, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        // SAFETY: the range is inside the client's live mapping; MADV_REMOVE is refused
        // (asserted), and would only zero the pages if it were not.
        let r = unsafe {
            libc::madvise(
                client.as_mut_ptr().add(4096).cast(),
                4096,
                libc::MADV_REMOVE,
            )
        };
        assert_eq!(r, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
        // SAFETY: in-bounds accesses of live mappings of the same file.
        unsafe {
            client.as_mut_ptr().add(5000).write_volatile(0x5a);
            assert_eq!(nic.as_ptr().add(5000).read_volatile(), 0x5a);
            nic.as_mut_ptr().add(9000).write_volatile(0xa5);
            assert_eq!(client.as_ptr().add(9000).read_volatile(), 0xa5);
        }
        // One fd backs one NIC object: a second writable mapping is refused.
        assert!(map_peer_shm(fd.as_fd(), 16384).is_err());
    }

    /// Why punching alone is no SIGBUS on tmpfs with the default overcommit policy: the
    /// hole reads back as zeros (a fresh page is allocated on touch). The allocation is
    /// what strict overcommit can refuse, hence the seal above.
    #[test]
    fn a_hole_in_plain_tmpfs_reads_back_zeros() {
        let fd = raw_memfd(libc::MFD_ALLOW_SEALING, 8192, libc::F_SEAL_SHRINK, true).unwrap();
        let m = map_shared(fd.as_fd(), 8192).unwrap();
        // SAFETY: in-bounds accesses of a live mapping.
        unsafe {
            m.as_mut_ptr().add(4096).write_volatile(7);
            punch(fd.as_fd(), 4096, 4096).unwrap();
            assert_eq!(m.as_ptr().add(4096).read_volatile(), 0);
        }
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let fd = {
            let name = CString::new("unsealed").unwrap();
            // SAFETY: valid name; no sealing allowed -> no seals.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: fresh fd.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        std::fs::File::from(fd)
    }

    #[test]
    fn eventfd_signal_then_drain() {
        let e = eventfd().unwrap();
        assert_eq!(eventfd_drain(e.as_fd()).unwrap(), 0);
        assert!(!wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        eventfd_signal(e.as_fd()).unwrap();
        eventfd_signal(e.as_fd()).unwrap();
        assert!(wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        assert_eq!(eventfd_drain(e.as_fd()).unwrap(), 2);
        assert_eq!(eventfd_drain(e.as_fd()).unwrap(), 0);
    }

    #[test]
    fn eventfd_take_nowait_takes_one_count_of_a_blocking_semaphore() {
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor, owned here only.
        let e = unsafe { OwnedFd::from_raw_fd(fd) };
        // Blocking (no O_NONBLOCK) and empty: answers at once.
        assert!(!eventfd_take_nowait(e.as_fd()).unwrap());
        eventfd_signal(e.as_fd()).unwrap();
        eventfd_signal(e.as_fd()).unwrap();
        assert!(eventfd_take_nowait(e.as_fd()).unwrap());
        assert!(eventfd_take_nowait(e.as_fd()).unwrap());
        assert!(!eventfd_take_nowait(e.as_fd()).unwrap());
    }

    #[test]
    fn eventfd_drain_never_blocks_even_when_a_peer_cleared_o_nonblock() {
        let e = eventfd().unwrap();
        set_nonblocking(e.as_fd(), false).unwrap();
        let peer = e.try_clone().unwrap();
        // Bounded: a drain that blocks fails the test after 5 s instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let empty = eventfd_drain(peer.as_fd()).unwrap();
            eventfd_signal(peer.as_fd()).unwrap();
            let _ = tx.send((empty, eventfd_drain(peer.as_fd()).unwrap()));
        });
        let got = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(
            got,
            Ok((0, 1)),
            "the drain of an empty blocking eventfd blocked"
        );
    }

    /// Whether SIGPIPE is pending for this thread.
    fn sigpipe_pending() -> bool {
        // SAFETY: plain data, filled by sigpending.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is live.
        assert_eq!(unsafe { libc::sigpending(&mut set) }, 0);
        // SAFETY: `set` was filled above.
        unsafe { libc::sigismember(&set, libc::SIGPIPE) == 1 }
    }

    /// A client whose NIC is gone gets an error from its wake-up, and no SIGPIPE (which
    /// kills a C program; Rust ignores it, so the test blocks it in this thread and
    /// looks whether one was raised). Likewise for a holder that shut its socket down.
    /// The control: a plain write to a pipe without a reader (the wake pipe before it
    /// was a socket pair) raises SIGPIPE, which the test sees.
    #[test]
    fn a_wake_up_to_a_nic_that_is_gone_is_an_error_not_sigpipe() {
        // SAFETY: plain data; sigemptyset/sigaddset fill it.
        let mut pipe_only: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `pipe_only` is live; changes this test thread's mask only.
        unsafe {
            libc::sigemptyset(&mut pipe_only);
            libc::sigaddset(&mut pipe_only, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &pipe_only, std::ptr::null_mut());
        }
        let wake = WakePipe::new().unwrap();
        let writer = wake.writer().unwrap();
        wake_signal(writer.as_fd()).unwrap();
        drop(wake);
        let gone = wake_signal(writer.as_fd());
        let raised_gone = sigpipe_pending();

        let wake = WakePipe::new().unwrap();
        let writer = wake.writer().unwrap();
        // SAFETY: shutdown(2) of a socket this test holds.
        let shut = unsafe { libc::shutdown(writer.as_raw_fd(), libc::SHUT_WR) };
        assert_eq!(shut, 0);
        let shut = wake_signal(writer.as_fd()).unwrap_err();
        let raised_shut = sigpipe_pending();
        let (r, w) = pipe().unwrap();
        drop(r);
        let plain = eventfd_signal(w.as_fd()).unwrap_err();
        let control = sigpipe_pending();
        // Take the pending SIGPIPE before unblocking (ignored by Rust's runtime anyway).
        let mut sig = 0;
        // SAFETY: waits for a signal of the set, which is pending.
        unsafe {
            if control {
                libc::sigwait(&pipe_only, &mut sig);
            }
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &pipe_only, std::ptr::null_mut());
        }
        assert!(gone.is_err(), "a wake-up to a NIC that is gone succeeded");
        assert!(!raised_gone && !raised_shut, "wake_signal raised SIGPIPE");
        assert_eq!(shut.raw_os_error(), Some(libc::EPIPE), "{shut}");
        assert_eq!(plain.raw_os_error(), Some(libc::EPIPE), "{plain}");
        assert!(
            control,
            "a plain write did not raise SIGPIPE: the test cannot see one"
        );
    }

    #[test]
    fn a_wake_pipe_writer_cannot_make_the_drain_block_or_stop() {
        let wake = WakePipe::new().unwrap();
        let writer = wake.writer().unwrap();
        // The holder makes its descriptor blocking: the read end keeps its own flag.
        set_nonblocking(writer.as_fd(), false).unwrap();
        assert!(is_nonblocking(wake.read_end()).unwrap());
        // Bounded: a drain that blocks fails the test after 5 s instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let empty = wake.drain().unwrap();
            eventfd_signal(writer.as_fd()).unwrap();
            let one = wake.drain().unwrap();
            let _ = tx.send((empty, one, wake, writer));
        });
        let (empty, one, wake, writer) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((empty, one), (0, 1), "one write, one wake-up");
        // A writer that floods it costs one bounded drain per wake-up; the rest keeps
        // the read end readable for the next.
        for _ in 0..100 {
            wake_signal(writer.as_fd()).unwrap();
        }
        assert_eq!(wake.drain().unwrap(), WAKE_DRAIN_MAX);
        assert!(wait_readable(wake.read_end(), Some(Duration::ZERO)).unwrap());
        assert_eq!(wake.drain().unwrap(), 100 - WAKE_DRAIN_MAX);
        // The holder shutting its socket down, or closing its copy, leaves no end of
        // file (readable for good) at the read end.
        // SAFETY: shutdown(2) of a socket this test holds.
        let shut = unsafe { libc::shutdown(writer.as_raw_fd(), libc::SHUT_RDWR) };
        assert_eq!(shut, 0);
        assert!(!wait_readable(wake.read_end(), Some(Duration::ZERO)).unwrap());
        drop(writer);
        assert!(!wait_readable(wake.read_end(), Some(Duration::ZERO)).unwrap());
        assert_eq!(wake.drain().unwrap(), 0);
    }

    #[test]
    fn a_pipe_reader_cannot_make_the_writer_block() {
        let (r, w) = pipe().unwrap();
        let none = wait_any_readable([r.as_fd(), w.as_fd()], Some(Duration::ZERO)).unwrap();
        assert_eq!(none, [false, false]);
        // The reader clears O_NONBLOCK on its end and never reads: the writer's end
        // keeps its own flag, so signalling past the pipe's capacity never blocks.
        set_nonblocking(r.as_fd(), false).unwrap();
        assert!(is_nonblocking(w.as_fd()).unwrap());
        for _ in 0..200_000 {
            pipe_signal(w.as_fd()).unwrap();
        }
        set_nonblocking(r.as_fd(), true).unwrap();
        let e = eventfd().unwrap();
        let ready = wait_any_readable([e.as_fd(), r.as_fd()], None).unwrap();
        assert_eq!(ready, [false, true]);
        assert!(pipe_drain(r.as_fd()).unwrap(), "write end open");
        assert!(!wait_readable(r.as_fd(), Some(Duration::ZERO)).unwrap());
        drop(w);
        assert!(
            wait_readable(r.as_fd(), Some(Duration::ZERO)).unwrap(),
            "EOF wakes"
        );
        assert!(!pipe_drain(r.as_fd()).unwrap(), "end of file");
    }

    #[test]
    fn fds_travel_and_refer_to_the_same_file() {
        let (a, b) = UnixStream::pair().unwrap();
        let mfd = memfd("x", 4096).unwrap();
        let n = send_with_fds(a.as_fd(), b"hello", &[mfd.as_fd()]).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let r = recv_with_fds(b.as_fd(), &mut buf, 4).unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert_eq!(r.fds.len(), 1);
        assert!(!r.fds_truncated);
        // Write through the original, read through the received one.
        let mut f1 = std::fs::File::from(mfd);
        f1.write_all(b"shared").unwrap();
        let mut f2 = std::fs::File::from(r.fds.into_iter().next().unwrap());
        f2.seek(SeekFrom::Start(0)).unwrap();
        let mut got = [0u8; 6];
        f2.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"shared");
    }

    #[test]
    fn too_many_fds_are_truncated_and_reported() {
        let (a, b) = UnixStream::pair().unwrap();
        let es: Vec<OwnedFd> = (0..6).map(|_| eventfd().unwrap()).collect();
        let borrowed: Vec<BorrowedFd<'_>> = es.iter().map(|e| e.as_fd()).collect();
        send_with_fds(a.as_fd(), b"x", &borrowed).unwrap();
        let mut buf = [0u8; 4];
        let r = recv_with_fds(b.as_fd(), &mut buf, 2).unwrap();
        assert!(r.fds_truncated);
        assert!(r.fds.len() <= 2);
    }

    /// The blocked-signal mask of the calling thread (`SigBlk` of /proc/thread-self).
    fn blocked_here() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
        u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).unwrap()
    }

    fn bit(sig: libc::c_int) -> u64 {
        1 << (sig - 1)
    }

    #[test]
    fn a_library_thread_takes_no_signal_and_the_caller_keeps_its_mask() {
        let before = blocked_here();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = spawn_without_signals("test-nosig", move || {
            let _ = tx.send(blocked_here());
        })
        .unwrap();
        let inside = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        for sig in [
            libc::SIGALRM,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGCHLD,
            libc::SIGUSR1,
        ] {
            assert_ne!(inside & bit(sig), 0, "signal {sig} not blocked: {inside:x}");
        }
        assert_eq!(blocked_here(), before, "the spawning thread's mask changed");
    }

    /// Installs `flags` for SIGUSR2 (a handler that does nothing), runs `f`, restores.
    fn with_usr2_handler<R>(flags: libc::c_int, f: impl FnOnce() -> R) -> R {
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: plain data, filled below.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        new.sa_flags = flags;
        // SAFETY: both live; SIGUSR2 is not used by the test harness.
        let set = unsafe { libc::sigaction(libc::SIGUSR2, &new, &mut old) };
        assert_eq!(set, 0);
        let r = f();
        // SAFETY: restores the saved action.
        let restored = unsafe { libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()) };
        assert_eq!(restored, 0);
        r
    }

    #[test]
    fn an_interrupted_wait_restarts_unless_a_handler_lacks_sa_restart() {
        // The test harness's own fault handlers (SIGSEGV, SIGBUS) do not count.
        assert!(interrupted_wait_restarts());
        assert!(with_usr2_handler(
            libc::SA_RESTART,
            interrupted_wait_restarts
        ));
        assert!(!with_usr2_handler(0, interrupted_wait_restarts));
        assert!(interrupted_wait_restarts());
    }
}
