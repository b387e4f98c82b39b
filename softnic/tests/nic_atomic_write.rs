//! RDMA ATOMIC WRITE between two NICs through verbs-api (`WrOpcode::AtomicWrite`, IBTA
//! Annex A19): each completes as IBV_WC_ATOMIC_WRITE and its 8 bytes land at the
//! peer; while the peer's own thread reads the target word, it never sees a mix of two
//! writes (the NIC stores the 8 bytes in one store); a region without REMOTE_WRITE
//! refuses one (remote access error), and the API refuses what IBTA A19 does not
//! define (an unaligned target, a local buffer, a UC QP).

mod nic_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use nic_support::*;
use verbs_api::{AccessFlags, Mtu, PostError, QpType, SendWr, WcOpcode, WcStatus, WrOpcode};

/// ATOMIC WRITEs posted, one at a time (the QPs allow one READ/atomic outstanding:
/// `to_rts`).
const WRITES: u64 = 2000;

fn atomic_write(remote_addr: u64, rkey: u32, value: [u8; 8]) -> WrOpcode {
    WrOpcode::AtomicWrite {
        remote_addr,
        rkey,
        value,
    }
}

#[test]
fn atomic_writes_land_whole_while_the_peer_reads() {
    let (a, b) = NicProc::pair("atomic-write");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 16);
    let target = y.mr.addr() + 64;
    let stop = Arc::new(AtomicBool::new(false));
    let seen_torn = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, torn) = (stop.clone(), seen_torn.clone());
        let addr = target as usize;
        std::thread::spawn(move || {
            let (ones, twos) = (u64::from_ne_bytes([0x11; 8]), u64::from_ne_bytes([0x22; 8]));
            // SAFETY: `addr` is an 8-byte-aligned word inside the live region `y.mr`,
            // which outlives this thread (joined below); the NIC writes it only
            // through atomic stores, and this thread only loads it atomically.
            let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
            while !stop.load(Ordering::Relaxed) {
                let v = word.load(Ordering::Acquire);
                if v != 0 && v != ones && v != twos {
                    torn.store(v, Ordering::Relaxed);
                }
                std::hint::spin_loop();
            }
        })
    };
    for i in 0..WRITES {
        let value = if i % 2 == 0 { [0x11; 8] } else { [0x22; 8] };
        let wr = SendWr::new(i, atomic_write(target, y.mr.rkey(), value), &[]).signaled();
        x.qp.post_send(&[wr]).expect("post ATOMIC_WRITE");
        let c = poll_one(&mut x.cq);
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len),
            (i, WcStatus::Success, WcOpcode::AtomicWrite, 8),
            "{c:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    assert_eq!(seen_torn.load(Ordering::Relaxed), 0, "a torn 8-byte value");
    assert_eq!(y.mr.read_array::<8>(64), [0x22; 8]);
}

#[test]
fn refusals() {
    let (a, b) = NicProc::pair("atomic-write-no");
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, 4096, 16);
    // A region open to atomics but not to remote writes.
    let access = AccessFlags(AccessFlags::LOCAL_WRITE.bits() | AccessFlags::REMOTE_ATOMIC.bits());
    let no_write = y.pd.alloc_mr(4096, access).expect("mr");
    // The API: unaligned, with a local buffer.
    let bad = SendWr::new(
        1,
        atomic_write(no_write.addr() + 4, no_write.rkey(), [1; 8]),
        &[],
    );
    assert!(matches!(
        x.qp.post_send(&[bad]),
        Err(verbs_api::Error::Post {
            reason: PostError::BadAtomic(_),
            ..
        })
    ));
    let sge = [x.mr.sge(0, 8)];
    let bad = SendWr::new(
        2,
        atomic_write(no_write.addr(), no_write.rkey(), [1; 8]),
        &sge,
    );
    assert!(x.qp.post_send(&[bad]).is_err());
    // The responder: a remote access error, and B's bytes untouched.
    let wr = SendWr::new(
        3,
        atomic_write(no_write.addr(), no_write.rkey(), [9; 8]),
        &[],
    );
    x.qp.post_send(&[wr.signaled()]).expect("post");
    let c = poll_one(&mut x.cq);
    assert_eq!((c.wr_id, c.status), (3, WcStatus::RemAccessErr), "{c:?}");
    assert_eq!(no_write.read_array::<8>(0), [0; 8]);
    // UC has no ATOMIC WRITE.
    let mut uc = side_of(x.ctx.clone(), QpType::Uc, 64, 4);
    let w = SendWr::new(4, atomic_write(y.mr.addr(), y.mr.rkey(), [1; 8]), &[]);
    assert!(uc.qp.post_send(&[w]).is_err());
}
