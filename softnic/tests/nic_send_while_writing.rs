//! A client rewriting its memory region while the NIC sends from it: every packet still
//! leaves with an ICRC that matches its bytes.
//!
//! The sending NIC gathers each payload out of the client's MR with a fused copy + CRC
//! (`MrTable::copy_out` → `softnic_crc::copy_update_raw`: each source byte is read once,
//! and the CRC is that of the copy) and fills the ICRC by combining that payload CRC
//! with the headers' (`PreparedIcrc::compute_with_payload`, `IdSolver::fill_run`). The
//! bytes that land are some mix of old and new — undefined by verbs (the application
//! gets its buffer back only with the WR's completion), not checked here — but the
//! packet must stay self-consistent: a NIC that hashed one read of the MR and sent
//! another would put a bad ICRC on the wire, the receiver would drop the packet
//! (`rx_drop_bad_icrc`), and the sender would retransmit.
//!
//! Honest scope: this cannot fail with today's fused gather, which reads each source
//! byte once and hashes the byte it copied. It guards the property against a change
//! that would read the source twice (e.g. a CRC pass over the MR and a separate copy,
//! or a zero-copy "send from the MR" path): with `copy_out` made, by hand, to copy and
//! then hash a second read of the region, both tests failed (8,166 bad-ICRC drops at
//! MTU 1024). That `rx_drop_bad_icrc` counts packets with a bad ICRC is shown by
//! `nic_fault.rs` (`--corrupt`: `rc_survives_loss_reordering_duplication_and_corruption`
//! and `loss_and_corruption_keep_gso_runs_and_exactly_once` assert it is > 0).

mod nic_support;

use nic_support::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use verbs_api::{Mtu, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode};

/// Bytes per RDMA WRITE: 16 packets at MTU 4096, one GSO run.
const LEN: usize = 65536;
/// Source offsets rotate over 0 … SKEW - 1, so payloads start off word alignment too.
const SKEW: usize = 9;
/// WRITEs posted in all (128 MiB).
const WRITES: u64 = 2000;
/// Send queue depth: WRITEs kept in flight.
const DEPTH: u32 = 128;

/// Rewrites every 8-byte word of the first `len` bytes of `mr` with a running pattern,
/// pass after pass, until `stop` (or a bound of passes); returns the passes made.
/// Atomic (relaxed) stores: the region is shared with the NIC process and with this
/// process's reads of `mr`, so plain `&mut` writes would not be allowed meanwhile.
fn scribble(mr: &verbs_api::MemoryRegion, len: usize, stop: &AtomicBool) -> u64 {
    let words: Vec<_> = (0..len / 8)
        .map(|w| mr.atomic_u64(w * 8).expect("word"))
        .collect();
    let mut v = 0u64;
    let mut passes = 0;
    while !stop.load(Ordering::Relaxed) && passes < 10_000_000 {
        for w in &words {
            w.store(v, Ordering::Relaxed);
            v = v.wrapping_add(0x9E37_79B9_7F4A_7C15);
        }
        passes += 1;
    }
    passes
}

/// GSO runs of 16 packets at MTU 4096 (the ICRCs filled by `IdSolver::fill_run`).
#[test]
fn gso_writes_sent_while_the_client_rewrites_the_source_pass_the_receivers_icrc() {
    let (a, b) = NicProc::pair("sendwhilewriting");
    writes_while_rewriting(&a, &b, Mtu::Mtu4096, 4096);
}

/// One packet per send at MTU 1024 (each ICRC from `compute_with_payload`), so
/// payloads start at other offsets of the region than with GSO.
#[test]
fn single_packet_writes_sent_while_the_client_rewrites_the_source_pass_the_icrc() {
    let start = |side| {
        let args = ["--no-gso", "--no-gro"];
        NicProc::start(&format!("sendwhilewriting1k-{side}"), "127.0.0.1", 0, &args)
    };
    writes_while_rewriting(&start("a"), &start("b"), Mtu::Mtu1024, 1024);
}

/// [`WRITES`] WRITEs of [`LEN`] bytes from NIC `a` to NIC `b` at path MTU `mtu`
/// (`mtu_bytes`), [`DEPTH`] in flight, while another thread rewrites the source region;
/// checks each completes with success and every packet passed `b`'s ICRC check.
fn writes_while_rewriting(a: &NicProc, b: &NicProc, mtu: Mtu, mtu_bytes: usize) {
    let (mut x, y) = rc_pair(a, b, mtu, LEN + SKEW, DEPTH);
    let (remote_addr, rkey) = (y.mr.addr(), y.mr.rkey());
    let Side { qp, cq, mr, .. } = &mut x;
    let mr = &*mr;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let passes = std::thread::scope(|s| {
        let writer = s.spawn(|| scribble(mr, LEN + SKEW - SKEW % 8, &stop));
        let (mut posted, mut completed) = (0u64, 0u64);
        let mut wc = [WorkCompletion::default(); 32];
        let deadline = Instant::now() + WAIT;
        while completed < WRITES {
            while posted < WRITES && posted - completed < u64::from(DEPTH) {
                let sge = [mr.sge(posted as usize % SKEW, LEN as u32)];
                let op = WrOpcode::RdmaWrite { remote_addr, rkey };
                qp.post_send(&[SendWr::new(posted, op, &sge).signaled()])
                    .expect("post write");
                posted += 1;
            }
            let n = cq.poll(&mut wc).expect("poll");
            for w in &wc[..n] {
                assert_eq!(
                    (w.wr_id, w.status, w.opcode),
                    (completed, WcStatus::Success, WcOpcode::RdmaWrite),
                    "{w:?}"
                );
                completed += 1;
            }
            if n == 0 {
                assert!(Instant::now() < deadline, "{completed} of {WRITES} done");
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer")
    });
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{WRITES} WRITEs of {LEN} B in {secs:.2} s while the source was rewritten {passes} times"
    );
    print_traffic_stats("sender", a);
    print_traffic_stats("receiver", b);
    assert!(passes > 0, "the client rewrote its region during the sends");
    // Every packet of every WRITE passed the receiver's full ICRC check.
    assert_eq!(b.stat("rx_drop_bad_icrc"), 0, "packets with a bad ICRC");
    assert_eq!(a.stat("rx_drop_bad_icrc"), 0, "ACKs with a bad ICRC");
    // Loopback senders use IPv4 ID 0 or segment k's ID k, both checked on all 32 bits:
    // none matched only under the 16-bit check of a solved ID.
    assert_eq!(
        b.stat("rx_icrc_solved"),
        0,
        "packets that needed the ID solver"
    );
    let checked = b.stat("rx_icrc_id0") + b.stat("rx_icrc_segment_id");
    let packets = WRITES * (LEN / mtu_bytes) as u64;
    assert!(
        checked >= packets,
        "{checked} packets passed the full check, of {packets} sent"
    );
    // No retransmission is asserted: the kernel may drop a datagram on a loaded
    // machine, and that retransmission is right. None comes from a bad ICRC: there
    // was no such drop.
}
