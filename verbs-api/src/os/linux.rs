//! Linux implementation of the [`crate::os`] seam.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
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
/// sealed against shrinking: the peer maps it, and a file that shrank under a mapping
/// would make the peer's accesses fault with SIGBUS.
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
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
    // SAFETY: fd is a valid memfd created with MFD_ALLOW_SEALING.
    cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    })?;
    Ok(fd)
}

/// Checks a shared-memory fd received from a peer before mapping it: it must be at
/// least `min_len` bytes and sealed against shrinking (see [`memfd`]).
pub fn check_shm(fd: BorrowedFd<'_>, min_len: usize) -> io::Result<()> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fd is a valid descriptor (BorrowedFd), st is a valid out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "shared-memory fd is not a regular file (memfd)",
        ));
    }
    let size = usize::try_from(st.st_size).unwrap_or(0);
    if size < min_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shared-memory fd is {size} bytes, expected at least {min_len}"),
        ));
    }
    // SAFETY: fd is valid; F_GET_SEALS takes no argument.
    let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "shared-memory fd is not sealed against shrinking (F_SEAL_SHRINK)",
        ));
    }
    Ok(())
}

/// Maps `len` bytes of `fd` shared, read-write.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<MmapRaw> {
    MmapOptions::new().len(len).map_raw(fd.as_raw_fd())
}

/// Creates a non-blocking, close-on-exec eventfd with counter 0.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with valid flags.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: fresh descriptor from the kernel, owned by us only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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

/// Reads and resets an eventfd's counter; 0 when it was already 0 (EAGAIN).
pub fn eventfd_drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64 from a valid fd.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    match cvt_size(r) {
        Ok(_) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// Blocks until `fd` is readable or `timeout` passes (`None` = forever). Returns
/// whether it became readable. EINTR is retried with the remaining time.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
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
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r > 0 {
            return Ok(true);
        }
        if ms >= 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
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
    fn unsealed_file_is_refused() {
        let f = tempfile_in_tmp();
        f.set_len(4096).unwrap();
        let err = check_shm(f.as_fd(), 4096).unwrap_err();
        assert!(err.to_string().contains("F_SEAL_SHRINK"), "{err}");
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
}
