//! The `responder` fuzz target: a live victim NIC (RC, UC and UD QPs and an XRC receive
//! QP in RTS, connected to a fixed peer, registered memory between canaries, posted
//! receives, XRC SRQs in three protection domains) driven by a hostile peer's
//! structured, ICRC-correct packets, with oracles after every step.
//!
//! * [`memory`] — the canaried regions and the log of every access the transport makes.
//! * [`peer`] — fuzz bytes → datagrams, biased toward PSN, length and address edges.
//! * [`victim`] — the QPs, the NIC's receive path, the drains and the oracles.
//!
//! An input is read with [`arbitrary::Unstructured`]: first the victim's settings (path
//! MTU, initial PSNs, READ/atomic depth, access flags, timers, Q_Key, a few posted
//! receives), then up to [`MAX_STEPS`] steps, each a crafted packet, a well-formed
//! multi-packet message, a response aimed at the victim's own requests or the full
//! correct answer to one, a posted receive or send, a state change by the user (Err,
//! SQD, back to RTS, Reset and reconnect), or a jump in virtual time; or (a step byte
//! of 0xF0 or more) an XRC step: a crafted XRC request or message naming an XRC SRQ,
//! another service's request to the XRC QP or an XRC request to the others, a receive
//! posted on an XRC SRQ, or a state change of the XRC QP. When the input ends the peer
//! falls silent and the victim's timers must run down.

pub mod memory;
pub mod peer;
pub mod victim;

use arbitrary::Unstructured;

/// Most steps one input drives.
pub const MAX_STEPS: usize = 48;

/// Runs one input; panics on any oracle violation.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut v) = victim::Victim::new(&mut u) else {
        return;
    };
    for _ in 0..MAX_STEPS {
        if u.is_empty() || v.step(&mut u).is_err() {
            break;
        }
    }
    v.finish();
    if std::env::var_os("RESPONDER_STATS").is_some() {
        eprintln!("{:?}", v.stats);
        for c in v.qp_counters() {
            eprintln!("{c:?}");
        }
        for c in v.srq_counters() {
            eprintln!("{c:?}");
        }
    }
}
