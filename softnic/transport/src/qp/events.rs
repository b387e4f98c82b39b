//! A QP's affiliated asynchronous events (IBTA 11.6.3) until the NIC takes them: the
//! one owner of which events were raised and which are still waiting.
//!
//! Each kind is raised at most once between the QP's creation (or Reset, which makes it
//! anew) and the next: COMM_EST on the first request an RC/UC QP receives in RTR
//! (11.6.3.1); one error event — REQ_ERR, ACCESS_ERR or FATAL, the reason the QP entered
//! Err (11.6.3.2), later errors of a QP in Err add nothing; and LAST_WQE_REACHED when a
//! QP on an SRQ enters Err (`ibv_get_async_event(3)`). They are taken in that order,
//! which is the order they happen in: COMM_EST only in RTR, so before any error; the
//! error and LAST_WQE_REACHED with the move to Err, which only Reset leaves. A slot per
//! kind rather than a FIFO keeps that order whichever side of the move the error is
//! raised on: the responder raises its error before it moves the QP to Err, the NIC its
//! FATAL after.

use super::{Qp, QpEvent};

/// The slots, in the order events are taken.
const COMM_EST: usize = 0;
const ERROR: usize = 1;
const LAST_WQE: usize = 2;

/// Raised and waiting events of one QP.
#[derive(Debug, Default, Clone)]
pub(super) struct QpEvents {
    /// Waiting, by slot.
    waiting: [Option<QpEvent>; 3],
    /// Raised since the QP was made, by slot (taken or not).
    raised: [bool; 3],
}

fn slot(ev: QpEvent) -> usize {
    match ev {
        QpEvent::CommEst => COMM_EST,
        QpEvent::ReqErr | QpEvent::AccessErr | QpEvent::Fatal => ERROR,
        QpEvent::LastWqeReached => LAST_WQE,
    }
}

impl QpEvents {
    /// Raises `ev` unless an event of its kind was raised already.
    pub(super) fn raise(&mut self, ev: QpEvent) {
        let i = slot(ev);
        if !self.raised[i] {
            self.raised[i] = true;
            self.waiting[i] = Some(ev);
        }
    }

    /// The next waiting event (taken).
    pub(super) fn poll(&mut self) -> Option<QpEvent> {
        self.waiting.iter_mut().find_map(Option::take)
    }

    /// Whether an event is waiting.
    pub(super) fn any(&self) -> bool {
        self.waiting.iter().any(Option::is_some)
    }
}

impl Qp {
    /// Raises the error event that tells why the QP entered Err (IBTA 11.6.3.2), once
    /// per QP: later errors of a QP already in Err add nothing.
    pub(super) fn raise_error_event(&mut self, ev: QpEvent) {
        debug_assert_eq!(slot(ev), ERROR, "{ev:?} is not an error event");
        self.events.raise(ev);
    }

    /// IBV_EVENT_QP_FATAL: the NIC moved this QP to Err for a local catastrophic
    /// reason the transport cannot see (its client's ring is corrupt, its CQ overran).
    /// Call after moving it to Err; raised once, and not after another error event.
    pub fn raise_fatal(&mut self) {
        self.raise_error_event(QpEvent::Fatal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(e: &mut QpEvents) -> Vec<QpEvent> {
        std::iter::from_fn(|| e.poll()).collect()
    }

    #[test]
    fn taken_in_kind_order_whatever_the_order_raised() {
        let mut e = QpEvents::default();
        e.raise(QpEvent::CommEst);
        e.raise(QpEvent::LastWqeReached);
        e.raise(QpEvent::Fatal);
        assert!(e.any());
        assert_eq!(
            drain(&mut e),
            [QpEvent::CommEst, QpEvent::Fatal, QpEvent::LastWqeReached]
        );
        assert!(!e.any());
    }

    #[test]
    fn each_kind_once_taken_or_not_and_none_lost() {
        let mut e = QpEvents::default();
        e.raise(QpEvent::AccessErr);
        e.raise(QpEvent::ReqErr);
        e.raise(QpEvent::Fatal);
        assert_eq!(e.poll(), Some(QpEvent::AccessErr), "the first error");
        e.raise(QpEvent::Fatal);
        e.raise(QpEvent::CommEst);
        assert_eq!(e.poll(), Some(QpEvent::CommEst), "a new kind is not lost");
        e.raise(QpEvent::CommEst);
        e.raise(QpEvent::LastWqeReached);
        e.raise(QpEvent::LastWqeReached);
        assert_eq!(drain(&mut e), [QpEvent::LastWqeReached]);
        e.raise(QpEvent::LastWqeReached);
        assert_eq!(e.poll(), None, "taken events are not raised again");
    }
}
