//! Work queue entries taken from a client's rings: copied, checked, converted.
//!
//! A ring slot is client memory: anything may be in it. [`send_wr`] and [`recv_wr`]
//! turn a copied slot into the transport's [`SendWr`] / [`RecvWr`] or say exactly what
//! is wrong with it. The NIC completes a refused entry with `IBV_WC_LOC_QP_OP_ERR`
//! (IBTA 10.10.3: a malformed work request is a Local QP Operation Error) and a
//! [`WqeError::vendor_err`] code, so a client that writes garbage into its rings harms
//! only its own QP.

use std::fmt;
use std::net::SocketAddr;

use softnic_transport::qp::{QpCaps, QpType};
use softnic_transport::wr::{
    self, Inline, RecvWr, SendOp, SendWr, Sge, UdDest, MAX_INLINE, MAX_SGE,
};
use verbs_api::abi::slots::{send_flags, wr_opcode};
use verbs_api::abi::{RecvWqe, SendWqe};

use super::gid;

/// Why a ring entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeError {
    /// Not an `ibv_wr_opcode` softnic implements.
    UnknownOpcode(u8),
    /// The opcode does not exist on this QP type (e.g. RDMA READ on UC).
    OpcodeNotForQpType(u8),
    /// More scatter/gather entries than the QP's `max_sge`.
    TooManySge(u32),
    /// More inline bytes than the QP's `max_inline`.
    InlineTooLong(u32),
    /// Inline data on an operation that has no outgoing payload (READ, atomics).
    InlineNotAllowed,
    /// No UD destination on a UD QP (no `send_flags::UD_DEST`), one on a connected QP,
    /// a destination QPN above 24 bits, or a GID this NIC cannot reach.
    BadUdDest,
    /// An atomic without exactly one 8-byte SGE.
    BadAtomicSge,
    /// No XRC SRQ number on an XRC send QP (no `send_flags::XRC_SRQN`), one above 24
    /// bits, or one on a QP of another type.
    BadXrcSrqn,
}

impl WqeError {
    /// The `vendor_err` code put in the error completion (softnic-specific; 0x100 +
    /// the variant's position, so a client can tell the cases apart).
    pub fn vendor_err(self) -> u32 {
        0x100
            + match self {
                WqeError::UnknownOpcode(_) => 1,
                WqeError::OpcodeNotForQpType(_) => 2,
                WqeError::TooManySge(_) => 3,
                WqeError::InlineTooLong(_) => 4,
                WqeError::InlineNotAllowed => 5,
                WqeError::BadUdDest => 6,
                WqeError::BadAtomicSge => 7,
                WqeError::BadXrcSrqn => 8,
            }
    }
}

impl fmt::Display for WqeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WqeError::UnknownOpcode(o) => write!(f, "unknown work request opcode {o}"),
            WqeError::OpcodeNotForQpType(o) => write!(f, "opcode {o} not valid for this QP type"),
            WqeError::TooManySge(n) => write!(f, "{n} SGEs exceed the QP's max_sge"),
            WqeError::InlineTooLong(n) => write!(f, "{n} inline bytes exceed the QP's max_inline"),
            WqeError::InlineNotAllowed => write!(f, "inline data on READ or atomic"),
            WqeError::BadUdDest => {
                write!(
                    f,
                    "UD destination missing, invalid, unreachable or on a connected QP"
                )
            }
            WqeError::BadAtomicSge => write!(f, "atomic needs exactly one 8-byte SGE"),
            WqeError::BadXrcSrqn => write!(
                f,
                "XRC SRQ number missing or above 24 bits on an XRC send QP, or on another QP"
            ),
        }
    }
}

fn sges(from: &[verbs_api::abi::Sge; MAX_SGE]) -> [Sge; MAX_SGE] {
    let mut out = [Sge::default(); MAX_SGE];
    for (o, s) in out.iter_mut().zip(from) {
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    out
}

/// Converts a send WQE for a QP of `qp_type` with capabilities `caps`; `local` is this
/// NIC's endpoint (a UD destination must be of the same family).
pub fn send_wr(
    w: &SendWqe,
    qp_type: QpType,
    caps: &QpCaps,
    local: SocketAddr,
) -> Result<SendWr, WqeError> {
    let op = match w.opcode {
        wr_opcode::RDMA_WRITE => SendOp::Write,
        wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(w.imm),
        wr_opcode::SEND => SendOp::Send,
        wr_opcode::SEND_WITH_IMM => SendOp::SendWithImm(w.imm),
        wr_opcode::SEND_WITH_INV => SendOp::SendWithInv(w.imm),
        wr_opcode::RDMA_READ => SendOp::Read,
        wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            compare: w.compare_add,
            swap: w.swap,
        },
        wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd { add: w.compare_add },
        wr_opcode::ATOMIC_WRITE => SendOp::AtomicWrite {
            value: w.compare_add.to_ne_bytes(),
        },
        o => return Err(WqeError::UnknownOpcode(o)),
    };
    let atomic_write = matches!(op, SendOp::AtomicWrite { .. });
    let allowed = match qp_type {
        QpType::Rc => true,
        QpType::XrcSend => !atomic_write,
        QpType::XrcRecv => false,
        QpType::Uc => matches!(
            op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write | SendOp::WriteWithImm(_)
        ),
        QpType::Ud => matches!(op, SendOp::Send | SendOp::SendWithImm(_)),
    };
    if !allowed {
        return Err(WqeError::OpcodeNotForQpType(w.opcode));
    }
    // A destination on a connected QP: refused, not ignored. It would move an inline
    // payload past the gather list (`SendWqe::inline_offset`), beyond the QP's stride,
    // which bounds only the QP's granted `max_inline` from the right offset.
    if qp_type != QpType::Ud && w.flags & send_flags::UD_DEST != 0 {
        return Err(WqeError::BadUdDest);
    }
    let xrc_srqn = xrc_srqn(w, qp_type)?;
    let is_atomic = matches!(op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. });
    let inline = if w.flags & send_flags::INLINE != 0 {
        if is_atomic || atomic_write || op == SendOp::Read {
            return Err(WqeError::InlineNotAllowed);
        }
        let n = w.inline_len;
        if n as usize > MAX_INLINE || n > caps.max_inline {
            return Err(WqeError::InlineTooLong(n));
        }
        Some(Inline::new(w.inline_payload()).ok_or(WqeError::InlineTooLong(n))?)
    } else {
        None
    };
    let num_sge = u32::from(w.num_sge);
    if inline.is_none() && (num_sge as usize > MAX_SGE || num_sge > caps.max_sge) {
        return Err(WqeError::TooManySge(num_sge));
    }
    let num_sge = if inline.is_some() {
        0
    } else {
        num_sge as usize
    };
    if is_atomic && (num_sge != 1 || w.sges[0].length != 8) {
        return Err(WqeError::BadAtomicSge);
    }
    if atomic_write && num_sge != 0 {
        return Err(WqeError::BadAtomicSge);
    }
    let ud = if qp_type == QpType::Ud {
        // Without the flag the ring copied no destination (`SendWqe::used_len`).
        if w.flags & send_flags::UD_DEST == 0 || w.ud.qpn > wire::types::MASK_24 {
            return Err(WqeError::BadUdDest);
        }
        let addr = gid::endpoint_of(w.ud.gid, w.ud.port);
        // A multicast group of the NIC's family is a destination too (`mcast.rs`).
        if !gid::reachable(local, addr) && super::mcast::group_of(w.ud.gid, local).is_none() {
            return Err(WqeError::BadUdDest);
        }
        Some(UdDest {
            qpn: w.ud.qpn,
            qkey: w.ud.qkey,
            addr,
            traffic_class: w.ud.traffic_class,
        })
    } else {
        None
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        sges: sges(&w.sges),
        num_sge,
        inline,
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        signaled: w.flags & send_flags::SIGNALED != 0,
        solicited: w.flags & send_flags::SOLICITED != 0,
        ud,
        xrc_srqn,
    })
}

/// The remote XRC SRQ number of a WQE for a QP of `qp_type` (0 when not XRC): an XRC
/// send QP's every WQE names the SRQ it is for (`ibv_post_send(3)`:
/// `qp_type.xrc.remote_srqn`), in the destination area's `qpn` with
/// `send_flags::XRC_SRQN`; without the flag the ring copied no destination area
/// (`SendWqe::used_len`). Any other QP's WQE with the flag is refused, as a connected
/// QP's with a UD destination: it would move an inline payload past the QP's stride.
fn xrc_srqn(w: &SendWqe, qp_type: QpType) -> Result<u32, WqeError> {
    let flagged = w.flags & send_flags::XRC_SRQN != 0;
    match (qp_type, flagged) {
        (QpType::XrcSend, true) if w.ud.qpn <= wire::types::MASK_24 => Ok(w.ud.qpn),
        (QpType::XrcSend, _) | (_, true) => Err(WqeError::BadXrcSrqn),
        (_, false) => Ok(0),
    }
}

/// Converts a receive WQE.
pub fn recv_wr(w: &RecvWqe, caps: &QpCaps) -> Result<RecvWr, WqeError> {
    if w.num_sge as usize > MAX_SGE || w.num_sge > caps.max_sge {
        return Err(WqeError::TooManySge(w.num_sge));
    }
    Ok(RecvWr {
        wr_id: w.wr_id,
        sges: sges(&w.sges),
        num_sge: w.num_sge as usize,
    })
}

/// The completion opcode a send WQE would complete with (for error completions of
/// entries that never reached the transport); `None` for an unknown opcode.
pub fn wc_opcode_of(opcode: u8) -> Option<wr::WcOpcode> {
    Some(match opcode {
        wr_opcode::RDMA_WRITE | wr_opcode::RDMA_WRITE_WITH_IMM => wr::WcOpcode::RdmaWrite,
        wr_opcode::SEND | wr_opcode::SEND_WITH_IMM => wr::WcOpcode::Send,
        wr_opcode::RDMA_READ => wr::WcOpcode::RdmaRead,
        wr_opcode::ATOMIC_CMP_AND_SWP => wr::WcOpcode::CompSwap,
        wr_opcode::ATOMIC_FETCH_AND_ADD => wr::WcOpcode::FetchAdd,
        wr_opcode::ATOMIC_WRITE => wr::WcOpcode::AtomicWrite,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: QpCaps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_sge: 2,
        max_inline: 64,
    };

    fn local() -> SocketAddr {
        "127.0.0.2:4791".parse().unwrap()
    }

    fn wqe(opcode: u8) -> SendWqe {
        let mut w = SendWqe {
            wr_id: 42,
            opcode,
            flags: send_flags::SIGNALED,
            num_sge: 1,
            ..SendWqe::default()
        };
        w.sges[0] = verbs_api::abi::Sge {
            addr: 0x1000,
            length: 8,
            lkey: 7,
        };
        w
    }

    #[test]
    fn every_opcode_converts_on_rc() {
        for (op, want) in [
            (wr_opcode::RDMA_WRITE, SendOp::Write),
            (wr_opcode::RDMA_WRITE_WITH_IMM, SendOp::WriteWithImm(5)),
            (wr_opcode::SEND, SendOp::Send),
            (wr_opcode::SEND_WITH_IMM, SendOp::SendWithImm(5)),
            (wr_opcode::RDMA_READ, SendOp::Read),
            (
                wr_opcode::ATOMIC_CMP_AND_SWP,
                SendOp::CompareSwap {
                    compare: 9,
                    swap: 10,
                },
            ),
            (wr_opcode::ATOMIC_FETCH_AND_ADD, SendOp::FetchAdd { add: 9 }),
        ] {
            let mut w = wqe(op);
            w.imm = 5;
            w.compare_add = 9;
            w.swap = 10;
            let wr = send_wr(&w, QpType::Rc, &CAPS, local()).unwrap();
            assert_eq!(wr.op, want);
            assert_eq!(wr.wr_id, 42);
            assert!(wr.signaled);
            assert_eq!(wr.num_sge, 1);
            assert_eq!(wr.sges[0].lkey, 7);
        }
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        assert_eq!(
            send_wr(&wqe(200), QpType::Rc, &CAPS, local()),
            Err(WqeError::UnknownOpcode(200))
        );
        assert_eq!(
            send_wr(&wqe(wr_opcode::RDMA_READ), QpType::Uc, &CAPS, local()),
            Err(WqeError::OpcodeNotForQpType(wr_opcode::RDMA_READ))
        );
        let mut w = wqe(wr_opcode::SEND);
        w.num_sge = 3;
        assert_eq!(
            send_wr(&w, QpType::Rc, &CAPS, local()),
            Err(WqeError::TooManySge(3))
        );
        w.num_sge = 255;
        assert_eq!(
            send_wr(&w, QpType::Rc, &CAPS, local()),
            Err(WqeError::TooManySge(255))
        );
        let mut w = wqe(wr_opcode::SEND);
        w.flags |= send_flags::INLINE;
        w.inline_len = 65;
        assert_eq!(
            send_wr(&w, QpType::Rc, &CAPS, local()),
            Err(WqeError::InlineTooLong(65))
        );
        w.inline_len = u32::MAX;
        assert!(send_wr(&w, QpType::Rc, &CAPS, local()).is_err());
        w.inline_len = 64;
        w.inline_area_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let wr = send_wr(&w, QpType::Rc, &CAPS, local()).unwrap();
        let want: Vec<u8> = (0..64).collect();
        assert_eq!(
            wr.inline.as_ref().map(Inline::as_bytes),
            Some(&want[..]),
            "exactly the first inline_len bytes are kept"
        );
        // On a connected QP the payload lies over the gather list; a UD destination
        // there is refused rather than moving the payload past the QP's stride.
        assert_eq!(
            w.inline_offset(),
            <SendWqe as verbs_api::abi::slots::Slot>::HEAD
        );
        w.flags |= send_flags::UD_DEST;
        assert_eq!(
            send_wr(&w, QpType::Rc, &CAPS, local()),
            Err(WqeError::BadUdDest)
        );
        assert_eq!(wr.num_sge, 0);
        let mut w = wqe(wr_opcode::ATOMIC_FETCH_AND_ADD);
        w.sges[0].length = 4;
        assert_eq!(
            send_wr(&w, QpType::Rc, &CAPS, local()),
            Err(WqeError::BadAtomicSge)
        );
        let mut r = RecvWqe {
            num_sge: 5,
            ..RecvWqe::default()
        };
        assert_eq!(recv_wr(&r, &CAPS), Err(WqeError::TooManySge(5)));
        r.num_sge = 2;
        assert!(recv_wr(&r, &CAPS).is_ok());
    }

    #[test]
    fn ud_destination_comes_from_the_gid() {
        let mut w = wqe(wr_opcode::SEND);
        w.ud.qpn = 0x11;
        w.ud.qkey = 0x1111;
        w.ud.gid = gid::gid_of("127.0.0.3".parse().unwrap());
        // Without UD_DEST the ring copied no destination: refused, whatever is there.
        assert_eq!(
            send_wr(&w, QpType::Ud, &CAPS, local()),
            Err(WqeError::BadUdDest)
        );
        w.flags |= send_flags::UD_DEST;
        let wr = send_wr(&w, QpType::Ud, &CAPS, local()).unwrap();
        let d = wr.ud.unwrap();
        assert_eq!(d.addr, "127.0.0.3:4791".parse().unwrap());
        assert_eq!((d.qpn, d.qkey), (0x11, 0x1111));
        w.ud.gid = gid::gid_of("fd00::1".parse().unwrap());
        assert_eq!(
            send_wr(&w, QpType::Ud, &CAPS, local()),
            Err(WqeError::BadUdDest)
        );
        // A multicast group of the NIC's family is a destination; one of the other
        // family, or the unspecified address, is not.
        w.ud.gid = gid::gid_of("239.1.2.3".parse().unwrap());
        w.ud.qpn = 0xFF_FFFF;
        let d = send_wr(&w, QpType::Ud, &CAPS, local()).unwrap().ud.unwrap();
        assert_eq!(d.addr, "239.1.2.3:4791".parse().unwrap());
        for bad in ["ff0e::1", "0.0.0.0"] {
            w.ud.gid = gid::gid_of(bad.parse().unwrap());
            assert_eq!(
                send_wr(&w, QpType::Ud, &CAPS, local()),
                Err(WqeError::BadUdDest)
            );
        }
        w.ud.gid = gid::gid_of("127.0.0.3".parse().unwrap());
        w.ud.qpn = 1 << 24;
        assert_eq!(
            send_wr(&w, QpType::Ud, &CAPS, local()),
            Err(WqeError::BadUdDest)
        );
        assert_eq!(
            send_wr(&wqe(wr_opcode::RDMA_WRITE), QpType::Ud, &CAPS, local()),
            Err(WqeError::OpcodeNotForQpType(wr_opcode::RDMA_WRITE))
        );
    }

    #[test]
    fn an_xrc_send_wqe_names_its_srq_and_only_it_may() {
        let mut w = wqe(wr_opcode::SEND);
        assert_eq!(
            send_wr(&w, QpType::XrcSend, &CAPS, local()),
            Err(WqeError::BadXrcSrqn),
            "no XRC_SRQN on an XRC send QP"
        );
        w.flags |= send_flags::XRC_SRQN;
        w.ud.qpn = 0xAB_CDEF;
        let wr = send_wr(&w, QpType::XrcSend, &CAPS, local()).unwrap();
        assert_eq!((wr.xrc_srqn, wr.ud), (0xAB_CDEF, None));
        // Inline bytes follow the destination area, as on UD.
        w.flags |= send_flags::INLINE;
        w.inline_len = 3;
        w.inline_area_mut()[..3].copy_from_slice(b"xrc");
        let wr = send_wr(&w, QpType::XrcSend, &CAPS, local()).unwrap();
        assert_eq!(wr.inline.as_ref().map(|i| i.as_bytes()), Some(&b"xrc"[..]));
        w.ud.qpn = 1 << 24;
        assert_eq!(
            send_wr(&w, QpType::XrcSend, &CAPS, local()),
            Err(WqeError::BadXrcSrqn),
            "above 24 bits"
        );
        w.ud.qpn = 5;
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            assert_eq!(
                send_wr(&w, t, &CAPS, local()),
                Err(WqeError::BadXrcSrqn),
                "XRC_SRQN on {t:?}"
            );
        }
        let mut ud = wqe(wr_opcode::SEND);
        ud.flags |= send_flags::UD_DEST | send_flags::XRC_SRQN;
        assert_eq!(
            send_wr(&ud, QpType::XrcSend, &CAPS, local()),
            Err(WqeError::BadUdDest),
            "a UD destination on an XRC send QP"
        );
        assert_eq!(
            send_wr(&wqe(wr_opcode::SEND), QpType::XrcRecv, &CAPS, local()),
            Err(WqeError::OpcodeNotForQpType(wr_opcode::SEND)),
            "an XRC receive QP sends nothing"
        );
    }
}
