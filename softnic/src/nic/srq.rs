//! Shared receive queues as the NIC holds them: the transport's [`Srq`], the consumer
//! side of the client's SRQ ring, and the control requests that create, modify, query
//! and destroy them and hand out their asynchronous events.
//!
//! The SRQ segment is one receive ring ([`SrqLayout`]) in a client-created memfd, like
//! a QP's RQ: `ibv_post_srq_recv` writes a slot and publishes, with no syscall unless
//! the NIC has set NEED_WAKEUP. Each runtime iteration [`SrqEntry::drain_ring`] copies
//! entries into the pool while it has room (back-pressure: a full pool leaves entries
//! in the ring). A malformed entry (too many SGEs) cannot be completed in error — a
//! pooled WQE belongs to no QP and so to no CQ — so it puts the SRQ in error
//! (IBV_EVENT_SRQ_ERR): its pool is discarded, counted in `wqe_invalid`, and QPs on it
//! find no WQEs from then on. A corrupt ring does the same.
//!
//! Asynchronous events (limit reached, SRQ error) wait in the transport's `Srq` (at
//! most `MAX_EVENTS`) until the client asks with `GetAsyncEvents`.
//!
//! Quotas: an SRQ counts as a queue pair against its user's QP quota, and its ring
//! segment against the user's mapped bytes (`quota.rs`); it holds a use of its PD, and
//! cannot be destroyed while a QP receives from it.

use std::os::fd::OwnedFd;

use softnic_transport::qp::QpCaps;
use softnic_transport::srq::{Srq, SrqAttr as TSrqAttr, SrqCaps, SrqEvent};
use verbs_api::abi::control::{AsyncEvent, ErrorCode, Handle, Reply, SrqAttr};
use verbs_api::abi::ring::Consumer;
use verbs_api::abi::{RecvWqe, Ring, SrqLayout, MAX_SGE, NEED_WAKEUP};

use super::counters::NicCounters;
use super::rings::DRAIN_BUDGET;
use super::state::{err, map_checked, ok, Answer, Nic};
use super::wqe;

/// One SRQ and its ring.
#[derive(Debug)]
pub struct SrqEntry {
    /// The transport's pool.
    pub srq: Srq,
    /// Owning client.
    pub client: u32,
    /// Its user, and the segment bytes counted against that user's quota.
    uid: u32,
    bytes: u64,
    ring: Consumer<RecvWqe>,
    /// `max_sge` as the WQE checks want it.
    caps: QpCaps,
    ring_broken: bool,
}

impl SrqEntry {
    /// Copies entries from the ring into the pool while it has room. Returns how many.
    pub fn drain_ring(&mut self, n: &mut NicCounters) -> usize {
        let mut taken = 0;
        while taken < DRAIN_BUDGET && !self.ring_broken && !self.srq.in_error() {
            if self.srq.len() >= self.srq.query().max_wr as usize {
                break;
            }
            let w = match self.ring.pop() {
                Ok(Some(w)) => w,
                Ok(None) => break,
                Err(_) => {
                    n.ring_corrupt += 1;
                    self.ring_broken = true;
                    self.fail(n);
                    break;
                }
            };
            taken += 1;
            let posted = wqe::recv_wr(&w, &self.caps)
                .ok()
                .map(|wr| self.srq.post_recv(wr).is_ok());
            if posted != Some(true) {
                n.wqe_invalid += 1;
                self.fail(n);
                break;
            }
        }
        if taken > 0 {
            self.ring.release();
        }
        taken
    }

    fn fail(&mut self, n: &mut NicCounters) {
        let lost = self.srq.enter_error();
        n.wqe_invalid += lost.len() as u64;
        tracing::warn!(
            srqn = self.srq.srqn(),
            discarded = lost.len(),
            "bad SRQ ring entry; SRQ in error"
        );
    }

    /// Sets NEED_WAKEUP before the NIC sleeps; true when the ring has entries the pool
    /// could take now (do not sleep).
    pub fn arm_wakeup(&mut self) -> bool {
        if self.ring_broken || self.srq.in_error() {
            return false;
        }
        self.ring.ring().set_flags(NEED_WAKEUP);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let waiting = self.ring.available().map(|k| k > 0).unwrap_or(true);
        waiting && self.srq.len() < self.srq.query().max_wr as usize
    }

    /// Clears NEED_WAKEUP (the NIC is polling again).
    pub fn disarm_wakeup(&mut self) {
        self.ring.ring().clear_flags(NEED_WAKEUP);
    }
}

fn attr_of(s: &Srq) -> SrqAttr {
    let q = s.query();
    SrqAttr {
        max_wr: q.max_wr,
        max_sge: q.max_sge,
        srq_limit: q.srq_limit,
    }
}

impl Nic {
    /// CreateSrq: attaches the ring in `fds[0]`.
    pub(super) fn create_srq(
        &mut self,
        client: u32,
        pd: Handle,
        attr: SrqAttr,
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        if attr.max_sge as usize > MAX_SGE {
            return err(
                ErrorCode::InvalidArgument,
                format!("max_sge {} exceeds {MAX_SGE}", attr.max_sge),
            );
        }
        let Some(fd) = fds.first() else {
            return err(ErrorCode::Protocol, "CreateSrq needs the SRQ segment memfd");
        };
        let l = match SrqLayout::new(attr.max_wr) {
            Ok(l) => l,
            Err(e) => {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("SRQ max_wr {}: {e}", attr.max_wr),
                )
            }
        };
        if attr.srq_limit > l.capacity {
            return err(
                ErrorCode::InvalidArgument,
                format!("srq_limit {} exceeds max_wr {}", attr.srq_limit, l.capacity),
            );
        }
        let Some(h) = self.handle() else {
            return err(ErrorCode::NoResources, "every PD/CQ/SRQ handle is in use");
        };
        let uid = self.uid_of(client);
        let bytes = l.len as u64;
        if let Err(a) = self.take_srq_quota(uid, bytes, counters) {
            return *a;
        }
        let ring = map_checked(fd, l.len).and_then(|map| {
            Ring::<RecvWqe>::new(map, l.offset, l.capacity)
                .and_then(|r| r.check_header().map(|()| r))
                .map_err(|e| Box::new(err(ErrorCode::InvalidArgument, format!("SRQ segment: {e}"))))
        });
        let ring = match ring {
            Ok(r) => r,
            Err(a) => {
                self.give_srq_quota(uid, bytes);
                return *a;
            }
        };
        let caps = SrqCaps {
            max_wr: l.capacity,
            max_sge: attr.max_sge,
        };
        let mut srq = Srq::new(h, pd, caps);
        if attr.srq_limit > 0 {
            let arm = TSrqAttr {
                srq_limit: Some(attr.srq_limit),
                ..TSrqAttr::default()
            };
            // Checked above: the limit is within max_wr and the SRQ is new.
            let _ = srq.modify(&arm);
        }
        let granted = attr_of(&srq);
        self.srqs.insert(
            h,
            SrqEntry {
                srq,
                client,
                uid,
                bytes,
                ring: ring.into_consumer(),
                caps: QpCaps {
                    max_send_wr: 0,
                    max_recv_wr: l.capacity,
                    max_sge: attr.max_sge,
                    max_inline: 0,
                },
                ring_broken: false,
            },
        );
        self.pd_use(pd, true);
        tracing::debug!(client, srq = h, "SRQ created");
        (
            verbs_api::abi::control::Response::Ok(Reply::Srq {
                srq: h,
                attr: granted,
            }),
            Vec::new(),
        )
    }

    fn srq_of(&mut self, client: u32, srq: Handle) -> Option<&mut SrqEntry> {
        self.srqs.get_mut(&srq).filter(|s| s.client == client)
    }

    /// ModifySrq: arms the limit. Resizing is refused: the ring is fixed at creation.
    pub(super) fn modify_srq(
        &mut self,
        client: u32,
        srq: Handle,
        max_wr: Option<u32>,
        srq_limit: Option<u32>,
    ) -> Answer {
        let Some(e) = self.srq_of(client, srq) else {
            return err(ErrorCode::NotFound, format!("no SRQ {srq}"));
        };
        if max_wr.is_some_and(|m| m != e.srq.query().max_wr) {
            return err(
                ErrorCode::InvalidArgument,
                "resizing an SRQ (IBV_SRQ_MAX_WR) is not supported",
            );
        }
        let a = TSrqAttr {
            max_wr: None,
            srq_limit,
        };
        match e.srq.modify(&a) {
            Ok(()) => ok(Reply::Done),
            Err(me) => err(ErrorCode::InvalidArgument, format!("SRQ {srq}: {me}")),
        }
    }

    /// QuerySrq.
    pub(super) fn query_srq(&mut self, client: u32, srq: Handle) -> Answer {
        match self.srq_of(client, srq) {
            Some(e) => ok(Reply::SrqInfo(attr_of(&e.srq))),
            None => err(ErrorCode::NotFound, format!("no SRQ {srq}")),
        }
    }

    /// DestroySrq: refused while a QP uses it.
    pub(super) fn destroy_srq(&mut self, client: u32, srq: Handle) -> Answer {
        if self.srq_of(client, srq).is_none() {
            return err(ErrorCode::NotFound, format!("no SRQ {srq}"));
        }
        let users = self
            .qps
            .values()
            .filter(|e| e.qp.srq() == Some(srq))
            .count();
        if users > 0 {
            return err(ErrorCode::Busy, format!("SRQ {srq} is used by {users} QPs"));
        }
        self.remove_srq(srq);
        ok(Reply::Done)
    }

    /// Removes SRQ `h` and gives back its PD use and quota (its QPs are gone).
    pub(super) fn remove_srq(&mut self, h: Handle) {
        if let Some(e) = self.srqs.remove(&h) {
            self.pd_use(e.srq.pd(), false);
            self.give_srq_quota(e.uid, e.bytes);
        }
    }

    /// GetAsyncEvents: the client's pending events, SRQ by SRQ.
    pub(super) fn async_events(&mut self, client: u32) -> Answer {
        let mut out = Vec::new();
        for (h, e) in self.srqs.iter_mut().filter(|(_, e)| e.client == client) {
            while let Some(ev) = e.srq.poll_event() {
                out.push(match ev {
                    SrqEvent::LimitReached => AsyncEvent::SrqLimitReached { srq: *h },
                    SrqEvent::Error => AsyncEvent::SrqErr { srq: *h },
                });
            }
        }
        ok(Reply::AsyncEvents(out))
    }

    /// The SRQ a new QP of `client` in `pd` may use, or the refusal.
    pub(super) fn srq_for_qp(
        &self,
        client: u32,
        pd: Handle,
        srq: Handle,
    ) -> Result<(), Box<Answer>> {
        match self.srqs.get(&srq).filter(|s| s.client == client) {
            Some(s) if s.srq.pd() == pd => Ok(()),
            Some(_) => Err(Box::new(err(
                ErrorCode::InvalidArgument,
                format!("SRQ {srq} is in another protection domain"),
            ))),
            None => Err(Box::new(err(ErrorCode::NotFound, format!("no SRQ {srq}")))),
        }
    }
}
