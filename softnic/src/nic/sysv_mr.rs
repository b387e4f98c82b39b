//! SysV shared memory as a memory region (`Request::RegMrSysv`): the NIC attaches the
//! client's segment by its id, so both address the same pages — zero-copy, as for a
//! memfd. perftest `--use_hugepages` and other `shmget` users register such memory;
//! the client finds the id as the inode of the `/SYSV<key>` line of its maps.
//!
//! A hostile client may name any segment id, so before attaching the NIC checks,
//! with `IPC_STAT`, that the client's uid owns the segment and may read and write it
//! (or is root): attaching it then gives the client nothing it could not attach
//! itself. (Whether this very client has it attached is not checked: that would add
//! nothing, since any process of that uid may attach the segment at will.)
//!
//! Hugetlb segments (`SHM_HUGETLB`) are refused: their pages can be punched out
//! (`MADV_REMOVE`) and a refault in the NIC's mapping with the hugepage pool empty is
//! SIGBUS, which would kill the NIC. The client registers those through the copy path
//! ([`super::copy_mr`]). Plain segments are tmpfs pages that cannot shrink: a page
//! punched out is refilled with zeroes on the next access.

use super::memory::RegError;
use super::mr_view::View;

const PAGE: u64 = 4096;

fn bad(m: impl Into<String>) -> RegError {
    RegError::BadRange(m.into())
}

/// Attaches segment `shmid` for client `uid`, which must cover `need` bytes; the
/// mapping (detached on drop).
pub fn attach(shmid: i32, uid: u32, need: u64) -> Result<View, RegError> {
    // SAFETY: an all-zero shmid_ds is a valid value for IPC_STAT to overwrite.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes one shmid_ds into `ds`.
    if unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) } != 0 {
        return Err(bad(format!(
            "SysV segment {shmid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let owner_rw = ds.shm_perm.mode as u32 & 0o600 == 0o600;
    if uid != 0 && !(ds.shm_perm.uid == uid && owner_rw) {
        return Err(bad(format!(
            "SysV segment {shmid} is not owned read-write by uid {uid}"
        )));
    }
    let size = ds.shm_segsz as u64;
    if need > size {
        return Err(bad(format!(
            "SysV segment {shmid} has {size} bytes, the region needs {need}"
        )));
    }
    // SAFETY: attaches the segment at an address the kernel chooses.
    let p = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
    if p as isize == -1 {
        return Err(bad(format!(
            "cannot attach SysV segment {shmid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let len = size.div_ceil(PAGE) * PAGE;
    // SAFETY: `p` is the segment just attached, `len` bytes; the View detaches it.
    let view = unsafe { View::from_sysv(p.cast(), len as usize) };
    match kernel_page_size(p as usize) {
        Some(4096) => Ok(view),
        Some(k) => Err(bad(format!(
            "SysV segment {shmid} is hugetlb ({k}-byte pages): register it through the \
             copy path (RegMrCopy)"
        ))),
        None => Err(bad(format!(
            "SysV segment {shmid}: cannot read its page size"
        ))),
    }
}

/// The kernel page size of this process's mapping that starts at `addr`, from
/// `/proc/self/smaps` ("KernelPageSize: N kB").
fn kernel_page_size(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    for l in lines {
        if let Some(v) = l.strip_prefix("KernelPageSize:") {
            let kb: u64 = v.trim().strip_suffix("kB")?.trim().parse().ok()?;
            return Some(kb * 1024);
        }
        if l.split_whitespace()
            .next()
            .is_some_and(|t| !t.ends_with(':'))
        {
            break; // the next mapping's header ("start-end perms ...")
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(flags: i32, mode: i32) -> i32 {
        // SAFETY: creates a private segment; the caller removes it.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 3 * 4096, flags | mode) };
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        id
    }

    fn remove(id: i32) {
        // SAFETY: marks the test's own segment for removal.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }

    #[test]
    fn attaches_an_owned_segment_and_shares_its_bytes() {
        let id = segment(libc::IPC_CREAT, 0o600);
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        let v = attach(id, me, 3 * 4096).unwrap();
        assert_eq!(v.len(), 3 * 4096);
        // SAFETY: the client side: attach the same segment and write through it.
        let client = unsafe { libc::shmat(id, std::ptr::null(), 0) } as *mut u8;
        assert_ne!(client as isize, -1);
        // SAFETY: both mappings are 3 pages of the same live segment.
        unsafe {
            client.add(5000).write_volatile(0xAB);
            assert_eq!(v.as_mut_ptr().add(5000).read_volatile(), 0xAB);
            libc::shmdt(client.cast());
        }
        assert!(
            attach(id, me, 3 * 4096 + 1).is_err(),
            "longer than the segment"
        );
        if me != 0 {
            assert!(attach(id, me + 1, 4096).is_err(), "another uid");
        }
        drop(v);
        remove(id);
        assert!(attach(id, me, 4096).is_err(), "removed");
        assert!(attach(-1, me, 4096).is_err());
    }

    #[test]
    fn a_read_only_segment_is_refused_for_a_non_root_client() {
        let id = segment(libc::IPC_CREAT, 0o400);
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        let r = attach(id, me.max(1), 4096);
        remove(id);
        assert!(r.is_err());
    }

    #[test]
    fn page_size_of_an_ordinary_mapping() {
        let v = vec![0u8; 1 << 20];
        // The heap mapping does not start at v, but the first smaps line of this
        // process (the executable) does start where it says.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let start = usize::from_str_radix(maps.split('-').next().unwrap(), 16).unwrap();
        assert_eq!(kernel_page_size(start), Some(4096));
        assert_eq!(kernel_page_size(1), None);
        drop(v);
    }
}
