//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`, `ibv_query_srq(3)`).
//!
//! An [`Srq`] is a pool of receive WQEs that any number of QPs created with it draw
//! from, in posting order, at the moment a request needs one (a SEND's first packet,
//! a WRITE with immediate). A WQE in the pool belongs to no QP: it is owned here, and
//! only here. Once a QP takes it, the WQE is that QP's until it completes —
//! successfully, in error, or flushed when that QP enters Err.
//!
//! * **Posting**: [`Srq::post_recv`] checks `max_sge` and `max_wr` like a QP's receive
//!   queue does.
//! * **Empty pool**: the QP behaves as with an empty receive queue — an RC responder
//!   sends an RNR NAK (IBTA 9.7.5.2.8), UC drops the message, UD drops the datagram
//!   silently (IBTA 9.8.2; counted as `drop_no_recv_wqe`).
//! * **Limit** (the "low watermark"): [`Srq::modify`] with `srq_limit` > 0 arms it.
//!   When a QP takes a WQE and fewer than `srq_limit` remain, one
//!   [`SrqEvent::LimitReached`] is queued (IBV_EVENT_SRQ_LIMIT_REACHED, an affiliated
//!   asynchronous event) and the SRQ disarms itself (`srq_limit` reads 0 again,
//!   `ibv_query_srq(3)`), so the event is one-shot until re-armed.
//! * **Error**: [`Srq::enter_error`] takes every pooled WQE out so the caller can
//!   flush it; an SRQ in error accepts no posts and gives no WQEs
//!   (IBV_EVENT_SRQ_ERR).
//!
//! How a QP uses it: the caller passes the SRQ to [`crate::qp::Qp::handle_packet_srq`]
//! with each packet. The QP borrows at most one WQE for the packet and gives it back,
//! at the front and in order, if the packet did not consume it (a duplicate, a WRITE
//! without immediate, a refused request), so an SRQ WQE is never lost nor reordered by
//! a QP that fails.

use std::collections::VecDeque;

use crate::qp::PostError;
use crate::wr::{RecvWr, MAX_SGE};

/// Events an SRQ keeps until the caller polls them; later ones are dropped and
/// counted (each kind is one-shot until re-armed, so only a caller that re-arms
/// without ever polling reaches this).
pub const MAX_EVENTS: usize = 16;

/// Capacities given at creation (`struct ibv_srq_attr` without the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqCaps {
    /// Most WQEs the pool holds.
    pub max_wr: u32,
    /// Most scatter/gather entries per WQE (at most [`MAX_SGE`]).
    pub max_sge: u32,
}

/// `ibv_modify_srq` attributes; `None` = not in the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// IBV_SRQ_MAX_WR: resize the pool (never below the WQEs it holds now).
    pub max_wr: Option<u32>,
    /// IBV_SRQ_LIMIT: arm the limit event at this level (0 disarms).
    pub srq_limit: Option<u32>,
}

/// What `ibv_query_srq` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqQuery {
    /// Pool capacity.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Armed limit, 0 when not armed.
    pub srq_limit: u32,
}

/// Affiliated asynchronous events of an SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrqEvent {
    /// IBV_EVENT_SRQ_LIMIT_REACHED: fewer WQEs than the armed limit remain.
    LimitReached,
    /// IBV_EVENT_SRQ_ERR: the SRQ entered the error state.
    Error,
}

/// Why [`Srq::modify`] refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrqModifyError {
    /// `max_wr` of 0, or smaller than the WQEs the pool holds now.
    MaxWr(u32),
    /// `srq_limit` larger than `max_wr`.
    Limit(u32),
    /// The SRQ is in error.
    InError,
}

impl core::fmt::Display for SrqModifyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SrqModifyError::MaxWr(v) => write!(f, "invalid SRQ max_wr {v}"),
            SrqModifyError::Limit(v) => write!(f, "SRQ limit {v} larger than max_wr"),
            SrqModifyError::InError => write!(f, "SRQ in error"),
        }
    }
}

impl std::error::Error for SrqModifyError {}

/// Counters of one SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqCounters {
    /// WQEs accepted by `post_recv`.
    pub posted: u64,
    /// WQEs taken by a QP for a message.
    pub consumed: u64,
    /// Times a QP wanted a WQE and the pool was empty.
    pub empty: u64,
    /// Limit events raised.
    pub limit_events: u64,
    /// Events dropped because [`MAX_EVENTS`] were waiting.
    pub events_dropped: u64,
}

impl SrqCounters {
    /// Adds every counter of `other` (totals over many SRQs).
    pub fn add(&mut self, other: &SrqCounters) {
        self.posted = self.posted.wrapping_add(other.posted);
        self.consumed = self.consumed.wrapping_add(other.consumed);
        self.empty = self.empty.wrapping_add(other.empty);
        self.limit_events = self.limit_events.wrapping_add(other.limit_events);
        self.events_dropped = self.events_dropped.wrapping_add(other.events_dropped);
    }

    /// `(name, value)` of every counter, as `softnic stats` prints them (`srq_` prefix).
    pub fn list(&self) -> [(&'static str, u64); 5] {
        [
            ("srq_posted", self.posted),
            ("srq_consumed", self.consumed),
            ("srq_empty", self.empty),
            ("srq_limit_events", self.limit_events),
            ("srq_events_dropped", self.events_dropped),
        ]
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    srqn: u32,
    pd: u32,
    caps: SrqCaps,
    limit: u32,
    error: bool,
    pool: VecDeque<RecvWr>,
    events: VecDeque<SrqEvent>,
    counters: SrqCounters,
}

impl Srq {
    /// A new, empty, unarmed SRQ. `max_sge` is capped at [`MAX_SGE`].
    pub fn new(srqn: u32, pd: u32, caps: SrqCaps) -> Srq {
        let caps = SrqCaps {
            max_sge: caps.max_sge.min(MAX_SGE as u32),
            ..caps
        };
        Srq {
            srqn,
            pd,
            caps,
            limit: 0,
            error: false,
            pool: VecDeque::with_capacity(caps.max_wr.min(1 << 16) as usize),
            events: VecDeque::new(),
            counters: SrqCounters::default(),
        }
    }

    /// Its number.
    pub fn srqn(&self) -> u32 {
        self.srqn
    }

    /// Its protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// WQEs in the pool (posted, taken by no QP yet).
    pub fn len(&self) -> usize {
        self.pool.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.pool.is_empty()
    }

    /// Whether the SRQ is in error.
    pub fn in_error(&self) -> bool {
        self.error
    }

    /// Counters.
    pub fn counters(&self) -> &SrqCounters {
        &self.counters
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqQuery {
        SrqQuery {
            max_wr: self.caps.max_wr,
            max_sge: self.caps.max_sge,
            srq_limit: self.limit,
        }
    }

    /// `ibv_post_srq_recv`: adds a WQE at the back of the pool.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.error {
            return Err(PostError::SrqInError);
        }
        if wr.num_sge > self.caps.max_sge as usize {
            return Err(PostError::TooManySge);
        }
        if self.pool.len() >= self.caps.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        self.pool.push_back(wr);
        self.counters.posted += 1;
        Ok(())
    }

    /// `ibv_modify_srq`: checks every value, then applies them all (or nothing).
    /// Arming with a limit the pool is already below raises no event until a QP takes
    /// a WQE, as the event is defined on consumption ("drops below").
    pub fn modify(&mut self, attr: &SrqAttr) -> Result<(), SrqModifyError> {
        if self.error {
            return Err(SrqModifyError::InError);
        }
        let max_wr = attr.max_wr.unwrap_or(self.caps.max_wr);
        if attr.max_wr.is_some() && (max_wr == 0 || (max_wr as usize) < self.pool.len()) {
            return Err(SrqModifyError::MaxWr(max_wr));
        }
        if let Some(l) = attr.srq_limit {
            if l > max_wr {
                return Err(SrqModifyError::Limit(l));
            }
        }
        self.caps.max_wr = max_wr;
        if let Some(l) = attr.srq_limit {
            self.limit = l;
        }
        Ok(())
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<SrqEvent> {
        self.events.pop_front()
    }

    /// Whether [`Srq::poll_event`] has an event to give (nothing is taken).
    pub fn has_event(&self) -> bool {
        !self.events.is_empty()
    }

    /// Moves the SRQ to error and hands back every pooled WQE, in posting order, for
    /// the caller to complete as flushed (they belong to no QP, so no QP flushes them).
    pub fn enter_error(&mut self) -> Vec<RecvWr> {
        if !self.error {
            self.error = true;
            self.limit = 0;
            self.push_event(SrqEvent::Error);
        }
        self.pool.drain(..).collect()
    }

    /// A QP borrows the front WQE for one packet (no event yet: the packet may not
    /// consume it).
    pub(crate) fn lend(&mut self) -> Option<RecvWr> {
        if self.error {
            return None;
        }
        self.pool.pop_front()
    }

    /// A QP returns WQEs it borrowed and did not consume; `wqes` in their original
    /// order.
    pub(crate) fn give_back(&mut self, wqes: impl DoubleEndedIterator<Item = RecvWr>) {
        for w in wqes.rev() {
            self.pool.push_front(w);
        }
    }

    /// A QP consumed a borrowed WQE: counts it and fires the limit event if the pool
    /// is now below the armed limit.
    pub(crate) fn consumed(&mut self) {
        self.counters.consumed += 1;
        if self.limit > 0 && (self.pool.len() as u64) < u64::from(self.limit) {
            self.limit = 0;
            self.counters.limit_events += 1;
            self.push_event(SrqEvent::LimitReached);
        }
    }

    fn push_event(&mut self, e: SrqEvent) {
        if self.events.len() < MAX_EVENTS {
            self.events.push_back(e);
        } else {
            self.counters.events_dropped += 1;
        }
    }

    /// A QP needed a WQE and found none.
    pub(crate) fn found_empty(&mut self) {
        self.counters.empty += 1;
    }
}
