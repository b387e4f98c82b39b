//! The receiver's single pass: a packet's payload copied into its destination memory
//! while it is hashed, and its ICRC then checked with that hash combined in — one read
//! of the payload where a check followed by a copy makes two (issue 12; the send side
//! has made one pass since session 9). The in-process floor saves ≈ 30 ns per 4 KiB
//! packet; on a NIC the saving depends on how cheaply the destination's lines are
//! written (docs/perf.md, "The receiver's single pass").
//!
//! Only where the transport says the destination is fixed by state it already
//! validated, never by fields of the unverified packet (`softnic_transport::qp::
//! placement`: WRITE Middle and Last and SEND Middle at the expected PSN, READ
//! responses at the requester; no RETH, no AtomicETH, no UD, no duplicate, no SEND
//! Last). A packet that then fails its
//! ICRC is dropped as any other (`rx_drop_bad_icrc`, no ACK or NAK, no state change;
//! `tests/nic_rx_place_hostile.rs`): the bytes it wrote lie where the message in
//! progress writes them (a WRITE's RETH range or a READ response's own bytes, which
//! the retransmission overwrites, else the message never completes; a SEND Middle's
//! window of the receive buffer, inside the message — the placement module's docs).
//! Every other packet takes the usual order: ICRC, then the transport.
//!
//! Used by the runtime's `rx_one` and by the `dataplane` bench, so the bench measures
//! this code.

use std::net::SocketAddr;

use softnic_transport::memory::Memory;
use softnic_transport::qp::{PayloadDigest, Placed, Placement, Qp};
use softnic_transport::sgl::DIGEST_MIN_PAYLOAD;
use wire::ParsedPacket;

use super::counters::NicCounters;
use super::source;
use super::state::Nic;

/// A payload already written where its QP would write it: where, and its CRC for the
/// ICRC check ([`super::rx_icrc::IdSolver::verify_with`]).
#[derive(Debug, Clone, Copy)]
pub struct Speculation {
    /// Where the payload was written.
    pub at: Placement,
    /// The payload's position in the packet and its CRC.
    pub digest: PayloadDigest,
}

/// Writes `pkt`'s payload where `qp` would write it if it handled the packet now,
/// hashing it as it copies, when the transport allows that before the ICRC check
/// (`Qp::placement`); `None` (and nothing written) otherwise, or when the memory
/// refuses the write (handling then meets the same refusal, after the check).
pub fn place(qp: &Qp, pkt: &ParsedPacket<'_>, mem: &mut dyn Memory) -> Option<Speculation> {
    let at = qp.placement(pkt)?;
    let crc = at.write(mem, pkt.payload).ok()?;
    let digest = PayloadDigest::at(pkt.header_len, pkt.payload.len(), crc)?;
    Some(Speculation { at, digest })
}

/// [`place`] for a packet the NIC received from `peer`: only for a QP of this NIC
/// whose source check passes (the checks `rx_one` makes before handling), and only
/// for payloads long enough to gain ([`DIGEST_MIN_PAYLOAD`]; the one comparison a
/// short packet pays).
pub fn place_received(
    nic: &mut Nic,
    pkt: &ParsedPacket<'_>,
    peer: SocketAddr,
) -> Option<Speculation> {
    if pkt.payload.len() < DIGEST_MIN_PAYLOAD {
        return None;
    }
    let e = nic.qps.get(&pkt.repr.bth.dest_qpn.value())?;
    source::check(e.qp.qp_type(), e.qp.attrs().remote, peer).ok()?;
    place(&e.qp, pkt, &mut nic.mrs)
}

/// Runs `handle` with `mem` — for a packet placed by [`place`] (whose ICRC has since
/// matched), through [`Placed`], which skips exactly the write already made and passes
/// every other access through, so the transport's handling stays the one authority on
/// where verified bytes go (where the unverified write went is the query's answer).
/// Counts `rx_placed_fused`, and `rx_placed_mismatch` when handling did
/// not make the placed write (a bug in the query: debug builds stop there).
pub fn handle<R>(
    placed: Option<&Speculation>,
    mem: &mut dyn Memory,
    payload: &[u8],
    c: &mut NicCounters,
    handle: impl FnOnce(&mut dyn Memory) -> R,
) -> R {
    let Some(s) = placed else {
        return handle(mem);
    };
    c.rx_placed_fused += 1;
    let mut w = Placed::new(mem, s.at, payload);
    let r = handle(&mut w);
    if !w.skipped() {
        c.rx_placed_mismatch += 1;
        debug_assert!(false, "handling did not make the placed write {:?}", s.at);
    }
    r
}
