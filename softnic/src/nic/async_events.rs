//! Affiliated asynchronous events on their way to the client (IBTA 11.6.3): which of a
//! client's objects have events waiting, and the pipe that tells the client so.
//!
//! The transport queues each object's events in the object (`Qp::poll_event`, at most
//! one of each kind; `Srq::poll_event`, at most `MAX_EVENTS`). The NIC *notices* them
//! where it visits the object anyway and lists the object on its client's
//! [`EventList`]:
//! * the runtime's completion pass over the active QPs ([`note_qp`], after the QP's
//!   completions were delivered, since a CQ overrun or a corrupt CQ raises QP_FATAL
//!   there). Everything else that can raise a QP event makes the QP active: a received
//!   packet (COMM_EST, the responder errors), a timer, a ring drain that finds a bad
//!   entry or a corrupt ring (QP_FATAL), a move to ERR (LAST_WQE_REACHED);
//! * the drain of a rung SRQ ring ([`note_srq`]: a bad entry puts the SRQ in error);
//! * a received packet for a QP on an SRQ ([`note_srq`] in the runtime's `rx_one`,
//!   which has the SRQ in hand): the WQE the packet took may have crossed the SRQ's
//!   limit, and the refill before it may have found a bad entry. The SRQ is then
//!   listed before its QP's events of the same packet (COMM_EST), which the completion
//!   pass notices; each object's own events keep their order.
//! * ModifyQp itself, so an event it raises (LAST_WQE_REACHED) is in the answer to the
//!   client's next request, as it was when GetAsyncEvents looked at every QP.
//!
//! GetAsyncEvents ([`Nic::async_events`]) then visits the listed objects only: its cost
//! is the objects with events, not the objects the client owns (it used to visit every
//! QP and SRQ of the client, and the C library asks every time its watcher wakes). The
//! answer is object by object, in the order each object was listed, and each object's
//! events oldest first (the order `Qp::poll_event` gives: COMM_EST, the error, then
//! LAST_WQE_REACHED).
//!
//! Readiness ([`Nic::async_event_channel`]): a client may ask for a pipe; the NIC
//! writes one byte to it each time the client's list goes from empty to not empty, so a
//! watcher blocks in `poll(2)` and asks only when there is something to take, and an
//! idle client costs the NIC nothing. A client that never reads the pipe costs at most
//! one write per event (none while its list stays non-empty); a full pipe is skipped,
//! never waited on: the write end is the NIC's own non-blocking open file, which the
//! client cannot reach (an eventfd passed over `SCM_RIGHTS` would be one open file, and
//! its receiver could clear `O_NONBLOCK` under the NIC's writes).

use std::os::fd::OwnedFd;

use softnic_transport::qp::QpEvent;
use softnic_transport::srq::SrqEvent;
use verbs_api::abi::control::{AsyncEvent, ErrorCode, Handle, Reply, Response};
use verbs_api::os::SignalPipe;

use super::counters::NicCounters;
use super::memory::KeyMap;
use super::rings::QpEntry;
use super::srq::SrqEntry;
use super::state::{err, ok, Answer, Client, Nic};

/// An object that can raise asynchronous events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSource {
    /// A QP, by number.
    Qp(u32),
    /// An SRQ, by handle.
    Srq(Handle),
}

/// One client's objects with events waiting, and its readiness pipe.
#[derive(Debug, Default)]
pub struct EventList {
    /// Listed QPs and SRQs → the order they were listed in. A map per kind, so that
    /// listing, the check for "already listed" and forgetting a destroyed object are
    /// O(1); the order is restored when the list is taken.
    qps: KeyMap<u64>,
    srqs: KeyMap<u64>,
    next: u64,
    /// The readiness pipe, made on first use. The NIC keeps the read end too, to hand
    /// out again, and so that a client closing its copy never turns a write into EPIPE.
    pipe: Option<SignalPipe>,
}

impl EventList {
    /// Objects listed.
    pub fn len(&self) -> usize {
        self.qps.len() + self.srqs.len()
    }

    /// Nothing listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lists `s` (once: an object already listed keeps its place); the first object
    /// listed on an empty list writes the pipe.
    pub fn list(&mut self, s: EventSource) {
        let was_empty = self.is_empty();
        let (map, key) = match s {
            EventSource::Qp(q) => (&mut self.qps, q),
            EventSource::Srq(h) => (&mut self.srqs, h),
        };
        if map.contains_key(&key) {
            return;
        }
        map.insert(key, self.next);
        self.next += 1;
        if was_empty {
            self.signal();
        }
    }

    /// Forgets a destroyed object.
    pub fn forget(&mut self, s: EventSource) {
        match s {
            EventSource::Qp(q) => self.qps.remove(&q),
            EventSource::Srq(h) => self.srqs.remove(&h),
        };
    }

    /// Empties the list; returns it in the order the objects were listed.
    pub fn take(&mut self) -> Vec<EventSource> {
        let qps = self.qps.drain().map(|(q, at)| (at, EventSource::Qp(q)));
        let srqs = self.srqs.drain().map(|(h, at)| (at, EventSource::Srq(h)));
        let mut all: Vec<(u64, EventSource)> = qps.chain(srqs).collect();
        all.sort_unstable_by_key(|&(at, _)| at);
        all.into_iter().map(|(_, s)| s).collect()
    }

    /// The read end of the readiness pipe (made on first use; readable at once if
    /// something is listed already).
    pub fn channel(&mut self) -> std::io::Result<OwnedFd> {
        let pipe = match self.pipe.take() {
            Some(p) => p,
            None => {
                let p = SignalPipe::new()?;
                if !self.is_empty() {
                    p.notify();
                }
                p
            }
        };
        self.pipe.insert(pipe).reader()
    }

    fn signal(&self) {
        if let Some(p) = &self.pipe {
            p.notify();
        }
    }
}

/// Lists QP `e` on its client's [`EventList`] if it has events waiting. O(1) and no
/// lookup unless it has: called for every active QP on each completion pass.
pub fn note_qp(e: &QpEntry, clients: &mut KeyMap<Client>) {
    if e.qp.has_event() {
        if let Some(c) = clients.get_mut(&e.client) {
            c.events.list(EventSource::Qp(e.qp.qpn()));
        }
    }
}

/// Lists SRQ `s` (handle `h`) on its client's [`EventList`] if it has events waiting.
pub fn note_srq(h: Handle, s: &SrqEntry, clients: &mut KeyMap<Client>) {
    if s.srq.has_event() {
        if let Some(c) = clients.get_mut(&s.client) {
            c.events.list(EventSource::Srq(h));
        }
    }
}

fn qp_event(qpn: u32, ev: QpEvent) -> AsyncEvent {
    match ev {
        QpEvent::LastWqeReached => AsyncEvent::QpLastWqeReached { qpn },
        QpEvent::CommEst => AsyncEvent::CommEst { qpn },
        QpEvent::ReqErr => AsyncEvent::QpReqErr { qpn },
        QpEvent::AccessErr => AsyncEvent::QpAccessErr { qpn },
        QpEvent::Fatal => AsyncEvent::QpFatal { qpn },
    }
}

fn srq_event(srq: Handle, ev: SrqEvent) -> AsyncEvent {
    match ev {
        SrqEvent::LimitReached => AsyncEvent::SrqLimitReached { srq },
        SrqEvent::Error => AsyncEvent::SrqErr { srq },
    }
}

impl Nic {
    /// GetAsyncEvents: the events of the objects on the client's list, which it
    /// empties. Costs the listed objects (counted in `async_event_visits`).
    pub(super) fn async_events(&mut self, client: u32, n: &mut NicCounters) -> Answer {
        n.async_event_requests += 1;
        let listed = match self.clients.get_mut(&client) {
            Some(c) => c.events.take(),
            None => Vec::new(),
        };
        let mut out = Vec::new();
        for s in listed {
            n.async_event_visits += 1;
            match s {
                EventSource::Qp(qpn) => {
                    if let Some(e) = self.qps.get_mut(&qpn).filter(|e| e.client == client) {
                        out.extend(
                            std::iter::from_fn(|| e.qp.poll_event()).map(|ev| qp_event(qpn, ev)),
                        );
                    }
                }
                EventSource::Srq(h) => {
                    if let Some(e) = self.srqs.get_mut(&h).filter(|e| e.client == client) {
                        out.extend(
                            std::iter::from_fn(|| e.srq.poll_event()).map(|ev| srq_event(h, ev)),
                        );
                    }
                }
            }
        }
        ok(Reply::AsyncEvents(out))
    }

    /// AsyncEventChannel: the read end of the client's readiness pipe.
    pub(super) fn async_event_channel(&mut self, client: u32) -> Answer {
        let Some(c) = self.clients.get_mut(&client) else {
            return err(ErrorCode::InvalidState, "no such client");
        };
        match c.events.channel() {
            Ok(fd) => (Response::Ok(Reply::Done), vec![fd]),
            Err(e) => err(ErrorCode::NoResources, format!("async event pipe: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::time::Duration;

    use softnic_transport::time::Instant;
    use verbs_api::abi::control::{QpAttr, QpState, Request};

    use super::super::quota::Limits;
    use super::super::srq::tests::{attr, call, create_qp, create_srq, nic, open};
    use super::*;

    /// Opens `client` with an SRQ and `n` RC QPs on it; returns their QPNs.
    fn client_with_qps(nic: &mut Nic, c: &mut NicCounters, client: u32, n: usize) -> Vec<u32> {
        let (pd, cq) = open(nic, c, client);
        let Ok(Reply::Srq { srq, .. }) = create_srq(nic, c, client, pd, attr(8, 0)) else {
            panic!("srq")
        };
        (0..n)
            .map(|_| match create_qp(nic, c, client, (pd, cq), Some(srq)) {
                Ok(Reply::Qp { qpn, .. }) => qpn,
                other => panic!("qp: {other:?}"),
            })
            .collect()
    }

    /// ModifyQp to ERR: a QP on an SRQ raises LAST_WQE_REACHED.
    fn to_err(nic: &mut Nic, c: &mut NicCounters, client: u32, qpn: u32) {
        let attr = QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        };
        let req = Request::ModifyQp { qpn, attr };
        assert_eq!(call(nic, c, client, req, vec![]), Ok(Reply::Done));
    }

    fn get(nic: &mut Nic, c: &mut NicCounters, client: u32) -> Vec<AsyncEvent> {
        match call(nic, c, client, Request::GetAsyncEvents, vec![]) {
            Ok(Reply::AsyncEvents(v)) => v,
            other => panic!("{other:?}"),
        }
    }

    /// AsyncEventChannel: the pipe's read end.
    fn channel(nic: &mut Nic, c: &mut NicCounters, client: u32) -> OwnedFd {
        let req = Request::AsyncEventChannel;
        match nic.request(Instant::ZERO, client, 1000, req, vec![], c) {
            (Response::Ok(Reply::Done), fds) if fds.len() == 1 => fds.into_iter().next().unwrap(),
            (other, _) => panic!("{other:?}"),
        }
    }

    fn readable(fd: &OwnedFd) -> bool {
        verbs_api::os::wait_readable(fd.as_fd(), Some(Duration::ZERO)).unwrap()
    }

    /// Bytes waiting in the pipe, taken (the NIC's write end is open).
    fn take(fd: &OwnedFd) -> usize {
        verbs_api::os::pipe_take(fd.as_fd())
            .unwrap()
            .expect("write end open")
    }

    #[test]
    fn get_async_events_visits_the_objects_with_events_not_every_qp() {
        const MANY: usize = 10_000;
        let (mut nic, mut c) = nic(Limits {
            qps: 2 * MANY as u32,
            ..Limits::default()
        });
        let one = client_with_qps(&mut nic, &mut c, 1, 1);
        let many = client_with_qps(&mut nic, &mut c, 2, MANY);
        for (client, qps) in [(1, &one), (2, &many)] {
            let qpn = qps[qps.len() / 2];
            to_err(&mut nic, &mut c, client, qpn);
            let before = c.async_event_visits;
            assert_eq!(
                get(&mut nic, &mut c, client),
                vec![AsyncEvent::QpLastWqeReached { qpn }]
            );
            assert_eq!(
                c.async_event_visits - before,
                1,
                "client {client} owns {} QPs and one SRQ, one has an event",
                qps.len()
            );
            assert_eq!(get(&mut nic, &mut c, client), vec![]);
        }
        assert_eq!(c.async_event_requests, 4);
    }

    #[test]
    fn the_pipe_is_written_when_the_list_stops_being_empty_and_the_order_is_kept() {
        let (mut nic, mut c) = nic(Limits::default());
        let qps = client_with_qps(&mut nic, &mut c, 1, 3);
        let pipe = channel(&mut nic, &mut c, 1);
        assert!(!readable(&pipe), "nothing pending");
        to_err(&mut nic, &mut c, 1, qps[2]);
        assert_eq!(take(&pipe), 1);
        to_err(&mut nic, &mut c, 1, qps[0]);
        assert_eq!(take(&pipe), 0, "the list was not empty: no second write");
        assert_eq!(
            get(&mut nic, &mut c, 1),
            vec![
                AsyncEvent::QpLastWqeReached { qpn: qps[2] },
                AsyncEvent::QpLastWqeReached { qpn: qps[0] },
            ],
            "in the order the QPs raised them"
        );
        assert!(!readable(&pipe));
        to_err(&mut nic, &mut c, 1, qps[1]);
        assert!(readable(&pipe), "empty again, so the next event writes");
        // Asking again gives the same pipe.
        let again = channel(&mut nic, &mut c, 1);
        assert_eq!(take(&again), 1);
        assert!(!readable(&pipe));
    }

    #[test]
    fn a_destroyed_qp_leaves_the_list() {
        let (mut nic, mut c) = nic(Limits::default());
        let qps = client_with_qps(&mut nic, &mut c, 1, 2);
        to_err(&mut nic, &mut c, 1, qps[0]);
        assert_eq!(nic.clients[&1].events.len(), 1);
        let req = Request::DestroyQp { qpn: qps[0] };
        assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
        assert!(nic.clients[&1].events.is_empty());
        let before = c.async_event_visits;
        assert_eq!(get(&mut nic, &mut c, 1), vec![]);
        assert_eq!(c.async_event_visits, before);
    }

    #[test]
    fn a_client_that_never_reads_the_pipe_cannot_block_the_nic() {
        let mut list = EventList::default();
        let client = list.channel().unwrap();
        // The client makes its end blocking and never reads; the NIC keeps listing.
        verbs_api::os::set_nonblocking(client.as_fd(), false).unwrap();
        for i in 0..200_000 {
            list.list(EventSource::Qp(i));
            assert_eq!(list.take(), vec![EventSource::Qp(i)]);
        }
        verbs_api::os::set_nonblocking(client.as_fd(), true).unwrap();
        assert!(take(&client) > 0);
    }
}
