//! QP states and the legal transitions between them, declared as data.
//!
//! IBTA 10.3.1 ("Queue Pair and EE Context States") defines the states and which
//! `Modify QP` transitions are legal; the attributes each transition requires or
//! accepts are the table of the `ibv_modify_qp(3)` man page (the same table the Linux
//! kernel keeps as `qp_state_table` in `drivers/infiniband/core/verbs.c`). Here that
//! table is [`TRANSITIONS`]: one row per legal transition, with the required and the
//! optional attribute masks per transport service. [`check_transition`] is the only
//! code that reads it.
//!
//! ```text
//!            +-------+  any state --> Reset, any state --> Err
//!            | Reset |
//!            +-------+
//!                | (pkey, port, access | qkey)
//!            +-------+
//!            | Init  |<-+ Init->Init
//!            +-------+--+
//!                | RC: av, path_mtu, dest_qpn, rq_psn, max_dest_rd_atomic, min_rnr_timer
//!            +-------+
//!            |  Rtr  |
//!            +-------+
//!                | RC: sq_psn, timeout, retry_cnt, rnr_retry, max_rd_atomic
//!            +-------+   Rts->Sqd   +-----+
//!            |  Rts  |------------->| Sqd |
//!            +-------+<-------------+-----+
//!              ^   Sqe->Rts (UC/UD)
//! ```

use core::fmt;

/// QP state (IBTA 10.3.1; `enum ibv_qp_state` order and values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// IBV_QPS_RESET: freshly created; no packets accepted, no work processed.
    Reset = 0,
    /// IBV_QPS_INIT: receives may be posted; nothing is sent or accepted.
    Init = 1,
    /// IBV_QPS_RTR: ready to receive; the responder runs.
    Rtr = 2,
    /// IBV_QPS_RTS: ready to send; requester and responder run.
    Rts = 3,
    /// IBV_QPS_SQD: send queue drained; no new send WQE is started.
    Sqd = 4,
    /// IBV_QPS_SQE: send queue error (UC/UD only).
    Sqe = 5,
    /// IBV_QPS_ERR: every WQE is flushed; nothing is sent but error NAKs.
    Err = 6,
}

impl QpState {
    /// All states, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The `ibv_qp_state` value.
    pub const fn to_ibv(self) -> u8 {
        self as u8
    }

    /// From an `ibv_qp_state` value.
    pub const fn from_ibv(v: u8) -> Option<QpState> {
        match v {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// True when the responder accepts request packets (IBTA 10.3.1: RTR and later,
    /// except Err).
    pub const fn can_receive(self) -> bool {
        matches!(
            self,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// True when the requester may start new send WQEs.
    pub const fn can_send(self) -> bool {
        matches!(self, QpState::Rts)
    }

    /// True when the completer handles responses for WQEs already sent (RTS, and SQD
    /// while draining: IBTA 10.3.1.2).
    pub const fn can_complete(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd)
    }
}

/// Transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`; IBTA 1.2.1 "eXtended Reliable
    /// Connected"): an RC requester without a receive queue whose every request names,
    /// in its XRCETH, the XRC SRQ at the target that receives it.
    XrcSend,
    /// XRC target (`IBV_QPT_XRC_RECV`): an RC responder without a send queue or a
    /// receive queue of its own; each request takes its receive WQE from the XRC SRQ
    /// its XRCETH names (one of the QP's XRC domain), and its memory accesses are made
    /// under that SRQ's protection domain.
    XrcRecv,
}

impl QpType {
    /// Index into per-type columns of [`TRANSITIONS`].
    const fn col(self) -> usize {
        match self {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
            QpType::XrcSend => 3,
            QpType::XrcRecv => 4,
        }
    }

    /// The `wire` transport service of this QP type.
    pub const fn transport(self) -> wire::Transport {
        match self {
            QpType::Rc => wire::Transport::Rc,
            QpType::Uc => wire::Transport::Uc,
            QpType::Ud => wire::Transport::Ud,
            QpType::XrcSend | QpType::XrcRecv => wire::Transport::Xrc,
        }
    }

    /// True for the reliable services (RC and both XRC halves): acknowledged PSNs,
    /// retransmission, NAKs, READ and atomics (IBTA 9.7).
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }
}

/// A set of `ibv_qp_attr_mask` bits, with the libibverbs values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

impl AttrMask {
    /// IBV_QP_STATE.
    pub const STATE: AttrMask = AttrMask(1 << 0);
    /// IBV_QP_CUR_STATE.
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    /// IBV_QP_PORT.
    pub const PORT: AttrMask = AttrMask(1 << 5);
    /// IBV_QP_QKEY.
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    /// IBV_QP_AV (here: the peer's UDP endpoint).
    pub const AV: AttrMask = AttrMask(1 << 7);
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    /// IBV_QP_ALT_PATH.
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    /// IBV_QP_PATH_MIG_STATE.
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    /// IBV_QP_CAP.
    pub const CAP: AttrMask = AttrMask(1 << 19);
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);
    /// The empty set.
    pub const NONE: AttrMask = AttrMask(0);

    /// Union.
    #[must_use]
    pub const fn or(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 | o.0)
    }
    /// Bits of `self` not in `o`.
    #[must_use]
    pub const fn minus(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 & !o.0)
    }
    /// True when no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// True when every bit of `o` is in `self`.
    pub const fn contains(self, o: AttrMask) -> bool {
        self.0 & o.0 == o.0
    }

    const NAMES: [(AttrMask, &'static str); 21] = [
        (AttrMask::STATE, "STATE"),
        (AttrMask::CUR_STATE, "CUR_STATE"),
        (AttrMask::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (AttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (AttrMask::PKEY_INDEX, "PKEY_INDEX"),
        (AttrMask::PORT, "PORT"),
        (AttrMask::QKEY, "QKEY"),
        (AttrMask::AV, "AV"),
        (AttrMask::PATH_MTU, "PATH_MTU"),
        (AttrMask::TIMEOUT, "TIMEOUT"),
        (AttrMask::RETRY_CNT, "RETRY_CNT"),
        (AttrMask::RNR_RETRY, "RNR_RETRY"),
        (AttrMask::RQ_PSN, "RQ_PSN"),
        (AttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (AttrMask::ALT_PATH, "ALT_PATH"),
        (AttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (AttrMask::SQ_PSN, "SQ_PSN"),
        (AttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (AttrMask::PATH_MIG_STATE, "PATH_MIG_STATE"),
        (AttrMask::CAP, "CAP"),
        (AttrMask::DEST_QPN, "DEST_QPN"),
    ];
}

impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for AttrMask {
    /// `PATH_MTU|DEST_QPN` style, as the verbs constants are spelled without `IBV_QP_`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (m, n) in AttrMask::NAMES {
            if self.contains(m) {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{n}")?;
                first = false;
            }
        }
        if first {
            write!(f, "(none)")?;
        }
        Ok(())
    }
}

/// One legal transition: the attributes it requires and those it accepts, per
/// transport service (columns RC, UC, UD, XRC send, XRC receive; the kernel's
/// `qp_state_table` columns IB_QPT_RC, _UC, _UD, _XRC_INI, _XRC_TGT).
#[derive(Debug, Clone, Copy)]
pub struct Transition {
    /// From.
    pub from: QpState,
    /// To.
    pub to: QpState,
    /// Attributes that must be in the mask, [RC, UC, UD, XRC send, XRC receive]
    /// (STATE is always implied).
    pub required: [AttrMask; 5],
    /// Attributes that may be in the mask, [RC, UC, UD, XRC send, XRC receive].
    pub optional: [AttrMask; 5],
}

const fn m(bits: &[AttrMask]) -> AttrMask {
    let mut v = 0;
    let mut i = 0;
    while i < bits.len() {
        v |= bits[i].0;
        i += 1;
    }
    AttrMask(v)
}

use AttrMask as A;
use QpState::*;

const N: AttrMask = AttrMask::NONE;
const NONE5: [AttrMask; 5] = [N, N, N, N, N];

/// What RC accepts at RTR→RTS and RTS→RTS: a responder's attributes too.
const RC_RTS_OPT: AttrMask = m(&[
    A::CUR_STATE,
    A::ACCESS_FLAGS,
    A::ALT_PATH,
    A::PATH_MIG_STATE,
    A::MIN_RNR_TIMER,
]);

/// The same without the responder's RNR timer (UC; the XRC initiator, which has no
/// responder).
const UC_RTS_OPT: AttrMask = m(&[
    A::CUR_STATE,
    A::ACCESS_FLAGS,
    A::ALT_PATH,
    A::PATH_MIG_STATE,
]);

const RC_RTR_REQ: AttrMask = m(&[
    A::AV,
    A::PATH_MTU,
    A::DEST_QPN,
    A::RQ_PSN,
    A::MAX_DEST_RD_ATOMIC,
    A::MIN_RNR_TIMER,
]);

const RC_RTS_REQ: AttrMask = m(&[
    A::TIMEOUT,
    A::RETRY_CNT,
    A::RNR_RETRY,
    A::SQ_PSN,
    A::MAX_QP_RD_ATOMIC,
]);

const RC_SQD_OPT: AttrMask = m(&[
    A::PORT,
    A::AV,
    A::TIMEOUT,
    A::RETRY_CNT,
    A::RNR_RETRY,
    A::MAX_QP_RD_ATOMIC,
    A::MAX_DEST_RD_ATOMIC,
    A::ALT_PATH,
    A::ACCESS_FLAGS,
    A::PKEY_INDEX,
    A::MIN_RNR_TIMER,
    A::PATH_MIG_STATE,
]);

const RTS_OPT: [AttrMask; 5] = [
    RC_RTS_OPT,
    UC_RTS_OPT,
    m(&[A::CUR_STATE, A::QKEY]),
    UC_RTS_OPT,
    RC_RTS_OPT,
];

/// The transition table (IBTA 10.3.1, figure 124 "QP/EE State Diagram", and the
/// attribute table of `ibv_modify_qp(3)`). Transitions to Reset and to Err from any
/// state are legal with no attributes and are not listed row by row.
pub const TRANSITIONS: &[Transition] = &[
    Transition {
        from: Reset,
        to: Reset,
        required: NONE5,
        optional: NONE5,
    },
    Transition {
        from: Reset,
        to: Init,
        required: [
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
        ],
        optional: NONE5,
    },
    Transition {
        from: Init,
        to: Init,
        required: NONE5,
        optional: [
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
        ],
    },
    Transition {
        from: Init,
        to: Rtr,
        required: [
            RC_RTR_REQ,
            m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
            N,
            // The XRC initiator has no responder: no responder attributes.
            m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
            RC_RTR_REQ,
        ],
        optional: [
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            m(&[A::PKEY_INDEX, A::QKEY]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
        ],
    },
    Transition {
        from: Rtr,
        to: Rts,
        required: [
            RC_RTS_REQ,
            A::SQ_PSN,
            A::SQ_PSN,
            RC_RTS_REQ,
            // The XRC target sends only responses: no retries, no READs of its own
            // (the kernel's table asks for the timeout and SQ PSN all the same).
            m(&[A::TIMEOUT, A::SQ_PSN]),
        ],
        optional: RTS_OPT,
    },
    Transition {
        from: Rts,
        to: Rts,
        required: NONE5,
        optional: RTS_OPT,
    },
    Transition {
        from: Rts,
        to: Sqd,
        required: NONE5,
        optional: [A::EN_SQD_ASYNC_NOTIFY; 5],
    },
    Transition {
        from: Sqd,
        to: Rts,
        required: NONE5,
        optional: RTS_OPT,
    },
    Transition {
        from: Sqd,
        to: Sqd,
        required: NONE5,
        optional: [
            RC_SQD_OPT,
            m(&[
                A::AV,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ]),
            m(&[A::PKEY_INDEX, A::QKEY]),
            RC_SQD_OPT,
            RC_SQD_OPT,
        ],
    },
    Transition {
        from: Sqe,
        to: Rts,
        required: NONE5,
        optional: [
            N,
            m(&[A::CUR_STATE, A::ACCESS_FLAGS]),
            m(&[A::CUR_STATE, A::QKEY]),
            N,
            N,
        ],
    },
];

/// Why a transition was refused (the checks of `ib_modify_qp_is_ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// No such transition (for this QP type).
    Illegal {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Required attributes are missing from the mask.
    Missing {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// What is missing.
        missing: AttrMask,
    },
    /// Attributes in the mask that this transition does not accept.
    NotAllowed {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// What is not allowed.
        invalid: AttrMask,
    },
}

/// Checks `mask` (without STATE) for the transition `from → to` of a `qp_type` QP.
pub fn check_transition(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    mask: AttrMask,
) -> Result<(), TransitionError> {
    let mask = mask.minus(AttrMask::STATE);
    // IBTA 10.3.1: Reset and Err are reachable from every state with no attributes.
    if to == Reset || to == Err {
        return if mask.is_empty() {
            Ok(())
        } else {
            Result::Err(TransitionError::NotAllowed {
                from,
                to,
                invalid: mask,
            })
        };
    }
    let row = TRANSITIONS
        .iter()
        .find(|t| t.from == from && t.to == to)
        .ok_or(TransitionError::Illegal { from, to })?;
    let c = qp_type.col();
    // Sqe exists only for UC and UD (IBTA 10.3.1.5: RC send errors go to Err).
    if from == Sqe && qp_type.is_reliable() {
        return Result::Err(TransitionError::Illegal { from, to });
    }
    let missing = row.required[c].minus(mask);
    if !missing.is_empty() {
        return Result::Err(TransitionError::Missing { from, to, missing });
    }
    let invalid = mask.minus(row.required[c].or(row.optional[c]));
    if !invalid.is_empty() {
        return Result::Err(TransitionError::NotAllowed { from, to, invalid });
    }
    Ok(())
}

/// The state diagram in Graphviz `dot`, generated from [`TRANSITIONS`] (for the docs).
pub fn dot() -> impl fmt::Display {
    struct Dot;
    impl fmt::Display for Dot {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            writeln!(f, "digraph qp_state {{")?;
            for t in TRANSITIONS {
                writeln!(
                    f,
                    "  {:?} -> {:?} [label=\"RC: {}\"];",
                    t.from, t.to, t.required[0]
                )?;
            }
            writeln!(f, "  \"*\" -> Reset;\n  \"*\" -> Err;\n}}")
        }
    }
    Dot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_walk_reset_to_rts() {
        let init = m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]);
        check_transition(QpType::Rc, Reset, Init, init).unwrap();
        let rtr = m(&[
            A::AV,
            A::PATH_MTU,
            A::DEST_QPN,
            A::RQ_PSN,
            A::MAX_DEST_RD_ATOMIC,
            A::MIN_RNR_TIMER,
        ]);
        check_transition(QpType::Rc, Init, Rtr, rtr).unwrap();
        assert_eq!(
            check_transition(QpType::Rc, Init, Rtr, rtr.minus(A::RQ_PSN)),
            Result::Err(TransitionError::Missing {
                from: Init,
                to: Rtr,
                missing: A::RQ_PSN
            })
        );
        // UC does not take responder resources.
        assert!(matches!(
            check_transition(QpType::Uc, Init, Rtr, rtr),
            Result::Err(TransitionError::NotAllowed { .. })
        ));
        assert!(matches!(
            check_transition(QpType::Rc, Reset, Rts, N),
            Result::Err(TransitionError::Illegal { .. })
        ));
        check_transition(QpType::Rc, Rts, Err, N).unwrap();
        check_transition(QpType::Ud, Rtr, Reset, N).unwrap();
        assert!(check_transition(QpType::Rc, Sqe, Rts, N).is_err());
        check_transition(QpType::Ud, Sqe, Rts, A::QKEY).unwrap();
    }

    #[test]
    fn mask_display() {
        assert_eq!(
            format!("{}", A::PATH_MTU.or(A::DEST_QPN)),
            "PATH_MTU|DEST_QPN"
        );
        assert!(format!("{}", dot()).contains("Init -> Rtr"));
    }
}
