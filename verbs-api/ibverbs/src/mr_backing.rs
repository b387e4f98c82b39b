//! What backs a range of this process's memory, per `/proc/self/maps`, and the
//! registrations for memory that [`crate::mr`] must not remap onto a memfd.
//!
//! * **SysV shared memory** (`shmget` + `shmat`; perftest `--use_hugepages`): its
//!   maps line is `/SYSV<key>` with the segment id as inode. The NIC attaches the same
//!   segment (`RegMrSysv`, zero-copy) after checking that this process's uid owns it
//!   read-write. The NIC refuses hugetlb segments (a punched-out hugepage refaulting
//!   in its mapping would be SIGBUS); those take the copy path.
//! * **Everything else mapped that is not private** — the stack, `MAP_HUGETLB`,
//!   `/dev/shm` and other shared file mappings, and any range the remap path cannot
//!   take: the NIC copies through this process's `/proc/self/mem` (`RegMrCopy`; abi-facts
//!   §4 (e)). Nothing is remapped, so other users of shared memory keep sharing it and
//!   `fork()` children keep their copy-on-write pages. Each access costs the NIC a
//!   system call; atomics on such an MR are refused by the NIC.
//!
//! A range with a hole (unmapped bytes) is EFAULT, and a range the MR may write
//! (`IBV_ACCESS_LOCAL_WRITE`) that is not all writable is EFAULT too, as the kernel's
//! `ib_umem_get` answers: writes through `/proc/self/mem` would otherwise force their
//! way into read-only pages.

use std::ffi::c_int;
use std::os::fd::AsFd;

use verbs_api::{AccessFlags, FdMemoryRegion, ProtectionDomain};

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    /// Offset in the file (for SysV memory: in the segment).
    pub offset: u64,
    pub inode: u64,
    /// First word of the path ("" for anonymous memory).
    pub path: String,
}

impl Mapping {
    fn parse(line: &str) -> Option<Mapping> {
        let mut f = line.split_whitespace();
        let (range, perms, offset, _dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        Some(Mapping {
            start: usize::from_str_radix(a, 16).ok()?,
            end: usize::from_str_radix(b, 16).ok()?,
            perms: perms.to_string(),
            offset: u64::from_str_radix(offset, 16).ok()?,
            inode: inode.parse().ok()?,
            path: f.next().unwrap_or("").to_string(),
        })
    }

    /// True for a SysV shared-memory attachment.
    pub fn is_sysv(&self) -> bool {
        self.path.starts_with("/SYSV")
    }
}

/// The mappings that together cover `[start, end)` without a hole, in order; `None`
/// if some byte is unmapped (or the maps cannot be read).
pub(crate) fn covering(start: usize, end: usize) -> Option<Vec<Mapping>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut out = Vec::new();
    let mut covered = start;
    for m in maps.lines().filter_map(Mapping::parse) {
        if m.end <= covered || m.start >= end {
            continue;
        }
        if m.start > covered {
            return None; // a hole
        }
        covered = m.end;
        out.push(m);
        if covered >= end {
            return Some(out);
        }
    }
    None
}

/// Registers `[addr, addr + len)` without remapping it: the SysV segment it lies in
/// (zero-copy), else through `/proc/self/mem` (see the module doc). Err: the errno.
pub(crate) fn register(
    pd: &ProtectionDomain,
    addr: usize,
    len: usize,
    access: AccessFlags,
) -> Result<FdMemoryRegion, c_int> {
    let end = addr.checked_add(len).ok_or(libc::EINVAL)?;
    let maps = covering(addr, end).ok_or(libc::EFAULT)?;
    let need = if access.contains(AccessFlags::LOCAL_WRITE) {
        "rw"
    } else {
        "r"
    };
    if !maps.iter().all(|m| m.perms.starts_with(need)) {
        return Err(libc::EFAULT);
    }
    if let [m] = &maps[..] {
        if m.is_sysv() && m.perms.starts_with("rw") {
            let offset = m.offset + (addr - m.start) as u64;
            if let Ok(shmid) = i32::try_from(m.inode) {
                // A refusal (hugetlb, another owner) falls back to copying.
                if let Ok(r) = pd.reg_sysv(shmid, offset, addr as u64, len, access) {
                    return Ok(r);
                }
            }
        }
    }
    register_copy(pd, addr as u64, len, access)
}

/// Registers `[iova, iova + len)` of this process's memory through `/proc/self/mem`
/// (`RegMrCopy`: the NIC reads and writes there at each access), checking nothing of
/// what is mapped: the last step of [`register`] (after its checks), and all of an
/// on-demand registration (`crate::odp`).
pub(crate) fn register_copy(
    pd: &ProtectionDomain,
    iova: u64,
    len: usize,
    access: AccessFlags,
) -> Result<FdMemoryRegion, c_int> {
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EACCES))?;
    pd.reg_copy(mem.as_fd(), iova, len, access)
        .map_err(|e| crate::errno::of(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_with_and_without_a_path() {
        let m = Mapping::parse(
            "7f1c2a000000-7f1c2a004000 rw-s 00001000 00:01 32789   /SYSV00000000 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.inode),
            (0x7f1c_2a00_0000, 0x7f1c_2a00_4000, 0x1000, 32789)
        );
        assert!(m.is_sysv() && m.perms == "rw-s");
        let a = Mapping::parse("55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0").unwrap();
        assert_eq!(a.path, "");
        assert!(Mapping::parse("garbage").is_none());
    }

    #[test]
    fn covering_finds_a_stack_buffer_and_refuses_a_hole() {
        let on_stack = [0u8; 64];
        let a = on_stack.as_ptr() as usize;
        let maps = covering(a, a + 64).unwrap();
        assert!(maps.iter().all(|m| m.perms.starts_with("rw")), "{maps:?}");
        assert!(covering(0, 4096).is_none(), "page 0 is never mapped");
    }
}
