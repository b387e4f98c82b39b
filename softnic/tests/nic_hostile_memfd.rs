//! A client cannot make the NIC take SIGBUS through the memory it shares (issue 9, item
//! 5). A raw client (the control protocol without verbs-api) offers the files a hostile
//! client would: a hugetlbfs memfd, a sparse memfd (its pages would be allocated on the
//! NIC's first touch, which strict overcommit turns into SIGBUS), a memfd sealed with
//! F_SEAL_SEAL (the NIC could not forbid hole punching), as a region and as a CQ ring.
//! Each is refused; a region that is accepted cannot have a hole punched in it any more;
//! and throughout, the NIC keeps running and another client's RDMA traffic is intact.
//!
//! The same for the registration kinds of memory that is not a memfd (`RegMrSysv`,
//! `RegMrCopy`; docs/ibverbs.md "Memory that is not remapped"): no descriptor, a memfd,
//! another proc file, a read-only `/proc/self/mem`, a SysV id that does not exist, a
//! segment shorter than the region, a hugetlb segment — each refused; a copied region
//! carries an RDMA WRITE into plain heap memory, and once that memory is unmapped under
//! it the next WRITE is an error completion, not a NIC crash.

mod nic_support;
mod prereq;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nic_support::*;
use verbs_api::abi::control::{call, Reply, Request, Response};
use verbs_api::abi::layout::mr_segment_len;
use verbs_api::abi::{CqLayout, ABI_VERSION};
use verbs_api::{AccessFlags, Mtu, SendWr, WcStatus, WrOpcode};

/// A memfd as a hostile client makes it: `flags` for memfd_create, `len` bytes,
/// allocated or not, then `seals`.
fn raw_memfd(
    flags: libc::c_uint,
    len: usize,
    allocate: bool,
    seals: libc::c_int,
) -> std::io::Result<OwnedFd> {
    let name = CString::new("hostile").unwrap();
    // SAFETY: valid name and flags.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: valid fd (the calls below too); results are checked.
    let mut r = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    if r == 0 && allocate {
        // SAFETY: as above.
        r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) };
    }
    if r == 0 && seals != 0 {
        // SAFETY: as above.
        r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    }
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

struct Raw {
    sock: UnixStream,
    pd: u32,
}

impl Raw {
    fn open(nic: &NicProc) -> Raw {
        let sock =
            UnixStream::connect(softnic_dir().join(format!("{}.sock", nic.name))).expect("connect");
        let open = Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: std::process::id(),
            program: "hostile-memfd".into(),
        };
        let db = verbs_api::os::memfd("doorbell", verbs_api::abi::DOORBELL_SEGMENT_LEN).unwrap();
        let opened = call(&sock, &open, &[db.as_fd()]);
        assert!(matches!(opened, Ok((Response::Ok(_), _))));
        let Ok((Response::Ok(Reply::Pd { pd }), _)) = call(&sock, &Request::AllocPd, &[]) else {
            panic!("AllocPd")
        };
        Raw { sock, pd }
    }

    /// Registers `len` bytes backed by `fd`; the NIC's answer.
    fn reg_mr(&self, fd: BorrowedFd<'_>, len: usize) -> Response {
        let req = Request::RegMr {
            pd: self.pd,
            len: len as u64,
            access: 0xF,
            iova: 0x7f00_0000_0000,
        };
        call(&self.sock, &req, &[fd]).expect("control call").0
    }

    /// `RegMrCopy` of 4096 bytes with descriptors `fds`; the NIC's answer.
    fn copy(&self, fds: &[BorrowedFd<'_>]) -> Response {
        let req = Request::RegMrCopy {
            pd: self.pd,
            len: 4096,
            access: 0xF,
            iova: 0x7f00_0000_0000,
        };
        call(&self.sock, &req, fds).expect("control call").0
    }

    /// `RegMrSysv` of `len` bytes from `offset` of segment `shmid`; the NIC's answer.
    fn sysv(&self, shmid: i32, offset: u64, len: u64) -> Response {
        let req = Request::RegMrSysv {
            pd: self.pd,
            len,
            access: 0xF,
            iova: 0x7f00_0000_0000,
            shmid,
            offset,
        };
        call(&self.sock, &req, &[]).expect("control call").0
    }
}

fn refused(r: &Response, what: &str, needle: &str) {
    match r {
        Response::Err { message, .. } => {
            assert!(message.contains(needle), "{what}: {message}")
        }
        other => panic!("{what}: accepted ({other:?})"),
    }
}

#[test]
fn memfds_that_could_fault_are_refused_and_sealed_ones_keep_their_pages() {
    let a = NicProc::start("memfd-a", "127.0.0.21", 0, &[]);
    let b = NicProc::start("memfd-b", "127.0.0.22", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 8192, 8);
    let raw = Raw::open(&a);
    let len = 1 << 21;
    let seg = mr_segment_len(len).unwrap();

    // hugetlbfs: needs only a kernel with hugetlbfs, no reserved huge pages.
    match raw_memfd(
        libc::MFD_HUGETLB | libc::MFD_ALLOW_SEALING,
        seg,
        false,
        libc::F_SEAL_SHRINK,
    ) {
        Ok(fd) => refused(&raw.reg_mr(fd.as_fd(), len), "hugetlbfs memfd", "hugetlbfs"),
        Err(e) => prereq::missing(&format!("memfd_create(MFD_HUGETLB) ({e})")),
    }
    // Sparse: the NIC would allocate on first touch.
    let sparse = raw_memfd(libc::MFD_ALLOW_SEALING, seg, false, libc::F_SEAL_SHRINK).unwrap();
    refused(
        &raw.reg_mr(sparse.as_fd(), len),
        "sparse memfd",
        "allocated",
    );
    // F_SEAL_SEAL: the NIC could not add F_SEAL_FUTURE_WRITE.
    let sealed = raw_memfd(
        libc::MFD_ALLOW_SEALING,
        seg,
        true,
        libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
    )
    .unwrap();
    refused(
        &raw.reg_mr(sealed.as_fd(), len),
        "seal-sealed memfd",
        "F_SEAL_SEAL",
    );
    // A sparse CQ ring too (rings go through the same check).
    let cl = CqLayout::new(16).unwrap();
    let ring = raw_memfd(libc::MFD_ALLOW_SEALING, cl.len, false, libc::F_SEAL_SHRINK).unwrap();
    let r = call(&raw.sock, &Request::CreateCq { depth: 16 }, &[ring.as_fd()])
        .expect("control call")
        .0;
    refused(&r, "sparse CQ memfd", "allocated");

    // A well-formed region is accepted; afterwards its owner cannot punch a hole in it.
    let good = raw_memfd(libc::MFD_ALLOW_SEALING, seg, true, libc::F_SEAL_SHRINK).unwrap();
    assert!(
        matches!(
            raw.reg_mr(good.as_fd(), len),
            Response::Ok(Reply::Mr { .. })
        ),
        "a plain, allocated, shrink-sealed memfd is accepted"
    );
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: valid fd; the call is refused (asserted).
    let r = unsafe { libc::fallocate(good.as_raw_fd(), mode, 4096, 65536) };
    assert_eq!(r, -1, "hole punched in a registered region");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );

    // The NIC is alive and another client's traffic is intact.
    let mut nic_a = a;
    assert!(nic_a.is_running(), "{}", nic_a.log_text());
    let data = pattern(4000, 9);
    x.mr.write(0, &data);
    let sge = [x.mr.sge(0, 4000)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(&[SendWr::new(1, op, &sge).signaled()])
        .expect("post");
    assert_eq!(poll_one(&mut x.cq).status, WcStatus::Success);
    assert!(y.mr.read_vec(0, 4000) == data[..]);
    drop(raw);
    assert!(nic_a.is_running(), "{}", nic_a.log_text());
    assert!(nic_a.stop().success(), "{}", nic_a.log_text());
    drop(b);
}

/// A private SysV segment of `len` bytes with `flags`, marked for removal (it lives
/// while attached); None if the machine cannot make one.
fn segment(len: usize, flags: i32) -> Option<i32> {
    // SAFETY: creates a private segment.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | flags | 0o600) };
    (id >= 0).then_some(id)
}

fn remove(id: i32) {
    // SAFETY: marks the test's own segment for removal.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
}

fn open(path: &str, write: bool) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .expect("open")
        .into()
}

#[test]
fn sysv_and_copy_registrations_refuse_what_they_must_and_never_fault_the_nic() {
    let a = NicProc::start("mrkinds-a", "127.0.0.23", 0, &[]);
    let b = NicProc::start("mrkinds-b", "127.0.0.24", 0, &[]);
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 8192, 8);
    let raw = Raw::open(&b);

    refused(
        &raw.copy(&[]),
        "RegMrCopy without a descriptor",
        "descriptors",
    );
    let memfd = verbs_api::os::memfd("not-proc-mem", 4096).unwrap();
    refused(&raw.copy(&[memfd.as_fd()]), "a memfd", "/proc/<pid>/mem");
    let maps = open("/proc/self/maps", false);
    refused(
        &raw.copy(&[maps.as_fd()]),
        "/proc/self/maps",
        "/proc/<pid>/mem",
    );
    let ro = open("/proc/self/mem", false);
    refused(
        &raw.copy(&[ro.as_fd()]),
        "a read-only mem file",
        "read-write",
    );

    refused(&raw.sysv(-1, 0, 4096), "shmid -1", "SysV segment");
    let id = segment(3 * 4096, 0).expect("shmget");
    refused(
        &raw.sysv(id, 4096, 2 * 4096 + 1),
        "a region past the segment's end",
        "bytes",
    );
    assert!(matches!(
        raw.sysv(id, 4096, 2 * 4096),
        Response::Ok(Reply::Mr { .. })
    ));
    remove(id);
    match segment(2 << 20, libc::SHM_HUGETLB) {
        Some(h) => {
            refused(&raw.sysv(h, 0, 4096), "a hugetlb segment", "hugetlb");
            remove(h);
        }
        None => prereq::missing("a SysV SHM_HUGETLB segment (vm.nr_hugepages)"),
    }

    // A copied region over plain memory of this process (an anonymous mapping, so
    // the test can unmap it under the registration).
    let len = 3 * 4096;
    // SAFETY: a fresh private anonymous mapping.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let mem = open("/proc/self/mem", true);
    let copied =
        y.pd.reg_copy(mem.as_fd(), m as u64, len, AccessFlags::ALL)
            .expect("reg_copy");
    let data = pattern(5000, 3);
    x.mr.write(0, &data);
    let write = |x: &mut Side, wr_id| {
        let sge = [x.mr.sge(0, 5000)];
        let op = WrOpcode::RdmaWrite {
            remote_addr: m as u64 + 100,
            rkey: copied.rkey(),
        };
        x.qp.post_send(&[SendWr::new(wr_id, op, &sge).signaled()])
            .expect("post");
        poll_one(&mut x.cq).status
    };
    assert_eq!(write(&mut x, 1), WcStatus::Success);
    // SAFETY: reads the test's own mapping, which the NIC wrote through the kernel.
    let landed: Vec<u8> = (0..5000)
        .map(|i| unsafe { std::ptr::read_volatile((m as *const u8).add(100 + i)) })
        .collect();
    assert!(
        landed == data,
        "the WRITE did not land in the copied region"
    );
    // SAFETY: unmaps the test's own mapping (the registration stays).
    assert_eq!(unsafe { libc::munmap(m, len) }, 0);
    let status = write(&mut x, 2);
    assert_ne!(status, WcStatus::Success, "a WRITE into unmapped memory");

    let (mut nic_a, mut nic_b) = (a, b);
    for nic in [&mut nic_a, &mut nic_b] {
        assert!(nic.is_running(), "{}", nic.log_text());
    }
    drop((copied, raw, x, y));
    for nic in [&mut nic_a, &mut nic_b] {
        assert!(nic.stop().success(), "{}", nic.log_text());
    }
}
