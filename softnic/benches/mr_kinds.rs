#![allow(missing_docs)] // criterion macros generate undocumented items
//! What one packet's payload costs the NIC per registration mechanism
//! (`softnic::nic::memory::MrTable`, the transport's `Memory`): the NIC writing it into
//! a region (an RDMA WRITE or a receive: `write_remote`) and reading it out (a send's
//! gather: `read_local`), at 1 KiB and 4 KiB, for a memfd region (zero-copy: a
//! `memcpy` into the shared mapping — the reference in the same run), a SysV segment
//! the NIC attached (zero-copy too), and a copied region (`pread`/`pwrite` on
//! `/proc/self/mem`; here the bench's own, as the NIC gets the client's).
use std::os::fd::{AsFd, OwnedFd};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softnic::nic::memory::{MrTable, Source};
use softnic_transport::memory::{Accessor, Memory};

const LEN: usize = 1 << 20;
const PD: u32 = 1;

fn bench(c: &mut Criterion) {
    let mut t = MrTable::new();
    let memfd = verbs_api::os::memfd("bench", LEN).unwrap();
    let _client = verbs_api::os::map_shared(memfd.as_fd(), LEN).unwrap();
    let (_, memfd_l, memfd_r) = t
        .register(1, PD, memfd.as_fd(), LEN, LEN as u64, 0xF, 0x1000_0000)
        .unwrap();
    // SAFETY: a private segment, removed at once (it lives while attached).
    let shmid = unsafe { libc::shmget(libc::IPC_PRIVATE, LEN, libc::IPC_CREAT | 0o600) };
    assert!(shmid >= 0);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let (_, sysv_l, sysv_r) = t
        .register_window(
            1,
            PD,
            Source::Sysv { shmid, uid },
            0,
            LEN as u64,
            0xF,
            0x2000_0000,
        )
        .unwrap();
    // SAFETY: marks the bench's own segment for removal.
    unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
    let heap = vec![0u8; LEN];
    let mem: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .unwrap()
        .into();
    let copy_iova = heap.as_ptr() as u64;
    let (_, copy_l, copy_r) = t
        .register_window(
            1,
            PD,
            Source::Copy(mem.as_fd()),
            0,
            LEN as u64,
            0xF,
            copy_iova,
        )
        .unwrap();
    let kinds = [
        ("memfd", 0x1000_0000, memfd_l, memfd_r),
        ("sysv", 0x2000_0000, sysv_l, sysv_r),
        ("copy", copy_iova, copy_l, copy_r),
    ];
    let mut g = c.benchmark_group("mr_kinds");
    for size in [1024usize, 4096] {
        g.throughput(Throughput::Bytes(size as u64));
        let payload = vec![0x5Au8; size];
        let mut back = vec![0u8; size];
        for (name, iova, lkey, rkey) in kinds {
            let mut at = 0u64;
            g.bench_function(format!("{size}B_nic_writes_{name}"), |b| {
                b.iter(|| {
                    at = (at + size as u64) % LEN as u64;
                    t.write_remote(Accessor { pd: PD, qpn: 1 }, rkey, iova + at, &payload)
                        .unwrap()
                })
            });
            g.bench_function(format!("{size}B_nic_reads_{name}"), |b| {
                b.iter(|| {
                    at = (at + size as u64) % LEN as u64;
                    t.read_local(PD, lkey, iova + at, &mut back).unwrap()
                })
            });
        }
    }
    g.finish();
    drop(heap);
}

criterion_group!(benches, bench);
criterion_main!(benches);
