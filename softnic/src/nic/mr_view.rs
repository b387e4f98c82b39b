//! The NIC's mapping of one memory region, possibly assembled from pieces.
//!
//! A region registered with `RegMr` is one memfd, mapped here once. A region
//! registered with `RegMrWindow` (softnic's libibverbs, for buffers that are not
//! page-aligned or that share pages with another live MR) is a run of pieces, each a
//! page range of the request's memfd or of a live region's mapping. A memfd can be
//! mapped writable only once (`verbs_api::os::map_peer_shm` seals it with
//! `F_SEAL_FUTURE_WRITE`), so pages already mapped are *duplicated* from the existing
//! mapping with `mremap(old, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED, dst)`, which
//! creates a second mapping of the same shared pages (mremap(2): "if old_size is zero
//! and old_address refers to a shareable mapping"). Each piece is duplicated within one
//! source piece (split at the source's piece boundaries): a duplicate longer than its
//! source mapping would extend into other file pages. The result is one contiguous
//! range, so the per-packet path stays a single bounds check and pointer add.

use std::os::fd::BorrowedFd;

use memmap2::MmapRaw;
use verbs_api::abi::control::{Handle, MrSegment, MAX_MR_SEGMENTS};

use super::memory::{RegError, MAX_MR_SIZE};

const PAGE: u64 = 4096;

/// A mapping the NIC owns: `len` bytes at `ptr`, unmapped on drop (detached, for a
/// SysV segment); `pieces` are the `(offset, len)` runs that each come from one
/// mapping of one file.
pub struct View {
    ptr: *mut u8,
    len: usize,
    pieces: Vec<(usize, usize)>,
    sysv: bool,
}

// SAFETY: a plain shared-memory mapping; every access goes through raw pointers with
// the rules of the memory module (no references to the bytes are ever formed).
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({} bytes, {} pieces)", self.len, self.pieces.len())
    }
}

fn bad(m: impl Into<String>) -> RegError {
    RegError::BadRange(m.into())
}

impl View {
    /// Takes over a mapping made by `map_peer_shm` (one piece).
    pub fn from_mmap(m: MmapRaw) -> View {
        let v = View {
            ptr: m.as_mut_ptr(),
            len: m.len(),
            pieces: vec![(0, m.len())],
            sysv: false,
        };
        std::mem::forget(m); // the View unmaps it
        v
    }

    /// Takes over a SysV segment attached at `ptr` (`shmat`), `len` bytes (one piece:
    /// its pages can be shared with windows like a memfd's).
    ///
    /// # Safety
    /// `ptr` is a segment this process attached, at least `len` bytes long, attached
    /// nowhere else in the NIC's bookkeeping (the View detaches it on drop).
    pub unsafe fn from_sysv(ptr: *mut u8, len: usize) -> View {
        View {
            ptr,
            len,
            pieces: vec![(0, len)],
            sysv: true,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never: regions map at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Assembles `segments` (checked: page-aligned, non-empty, inside their source)
    /// from the request's memfd `fd` and the mappings `shared` finds by handle.
    pub fn assemble<'a>(
        fd: Option<BorrowedFd<'_>>,
        segments: &[MrSegment],
        shared: impl Fn(Handle) -> Option<&'a View>,
    ) -> Result<View, RegError> {
        if segments.is_empty() || segments.len() > MAX_MR_SEGMENTS {
            return Err(bad(format!(
                "{} segments: 1 to {MAX_MR_SEGMENTS} are accepted",
                segments.len()
            )));
        }
        let mut total = 0u64;
        let mut fd_need = 0u64;
        for s in segments {
            let end = s.offset.checked_add(s.len);
            if s.len == 0 || s.len % PAGE != 0 || s.offset % PAGE != 0 || end.is_none() {
                return Err(bad(format!("segment {s:?} is not whole pages")));
            }
            total = total.saturating_add(s.len);
            if s.share.is_none() {
                fd_need = fd_need.max(end.unwrap_or(u64::MAX));
            }
        }
        if total > MAX_MR_SIZE {
            return Err(bad(format!("{total} bytes exceed the largest region")));
        }
        let fd_view = match (fd, fd_need) {
            (_, 0) => None,
            (Some(fd), n) => {
                let n = usize::try_from(n).map_err(|_| bad("segment too large"))?;
                Some(View::from_mmap(
                    verbs_api::os::map_peer_shm(fd, n)
                        .map_err(|e| bad(format!("cannot map the region's memfd: {e}")))?,
                ))
            }
            (None, _) => return Err(bad("a segment names the memfd, but none was sent")),
        };
        let total = total as usize;
        // SAFETY: a fresh inaccessible reservation; the pieces replace it below.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(bad("cannot reserve the region's address range"));
        }
        let mut view = View {
            ptr: reserve as *mut u8,
            len: total,
            pieces: Vec::new(),
            sysv: false,
        };
        let mut pos = 0usize;
        for s in segments {
            let src = match s.share {
                None => fd_view.as_ref(),
                Some(h) => shared(h),
            }
            .ok_or_else(|| bad(format!("segment {s:?}: no such memory region")))?;
            // Both fit in usize: total (their sum) did.
            let (off, len) = (s.offset as usize, s.len as usize);
            if off.checked_add(len).is_none_or(|e| e > src.len) {
                return Err(bad(format!("segment {s:?} lies outside its source")));
            }
            for &(p_off, p_len) in &src.pieces {
                let (a, b) = (off.max(p_off), (off + len).min(p_off + p_len));
                if a >= b {
                    continue;
                }
                let dst = pos + (a - off);
                // SAFETY: [a, b) lies inside one shared mapping piece of `src`, and
                // [dst, dst + b - a) inside our reservation; MREMAP_FIXED replaces
                // exactly that part of it with a second mapping of the same pages.
                let r = unsafe {
                    libc::mremap(
                        src.ptr.add(a) as *mut libc::c_void,
                        0,
                        b - a,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                        view.ptr.add(dst) as *mut libc::c_void,
                    )
                };
                if r == libc::MAP_FAILED {
                    return Err(bad(format!(
                        "cannot map segment {s:?}: {}",
                        std::io::Error::last_os_error()
                    )));
                }
                view.pieces.push((dst, b - a));
            }
            pos += len;
        }
        Ok(view)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if self.sysv {
            // SAFETY: the View owns this attachment (from_sysv).
            unsafe { libc::shmdt(self.ptr as *const libc::c_void) };
        } else {
            // SAFETY: the View owns exactly this range (from_mmap or assemble).
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}
