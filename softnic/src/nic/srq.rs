//! Shared receive queues as the NIC holds them: the transport's [`Srq`], the consumer
//! side of the client's SRQ ring, and the control requests that create, modify, query
//! and destroy them.
//!
//! The SRQ segment is one receive ring ([`SrqLayout`]) in a client-created memfd, like
//! a QP's RQ: `ibv_post_srq_recv` writes a slot, publishes and rings the SRQ's
//! doorbell, with no syscall unless the NIC has set NEED_WAKEUP. When the doorbell was
//! rung [`SrqEntry::drain_ring`] copies entries into the pool while it has room
//! (back-pressure: a full pool leaves entries in the ring, taken after a packet uses a
//! WQE, [`SrqEntry::backlog`]); a slot returns to the client when a QP takes its WQE
//! from the pool. A malformed entry (too many SGEs) cannot be completed in error — a
//! pooled WQE belongs to no QP and so to no CQ — so it puts the SRQ in error
//! (IBV_EVENT_SRQ_ERR): its pool is discarded, counted in `wqe_invalid`, and QPs on it
//! find no WQEs from then on. A corrupt ring does the same.
//!
//! Asynchronous events (limit reached, SRQ error) wait in the transport's `Srq` (at
//! most `MAX_EVENTS`) until the client asks with `GetAsyncEvents`; `async_events.rs`
//! lists the SRQ for its client when one is raised.
//!
//! Quotas: an SRQ counts as a queue pair against its user's QP quota, and its ring
//! segment against the user's mapped bytes (`quota.rs`); it holds a use of its PD, and
//! cannot be destroyed while a QP receives from it.

use std::os::fd::OwnedFd;

use softnic_transport::qp::QpCaps;
use softnic_transport::srq::{Srq, SrqAttr as TSrqAttr, SrqCaps};
use verbs_api::abi::control::{ErrorCode, Handle, Reply, SrqAttr, XrcSrqInit};
use verbs_api::abi::ring::Consumer;
use verbs_api::abi::{RecvWqe, Ring, SrqLayout, DOORBELL_SLOTS, MAX_SGE};

use super::async_events::EventSource;
use super::counters::NicCounters;
use super::doorbells::Target;
use super::rings::DRAIN_BUDGET;
use super::state::{err, map_checked, ok, Answer, Nic};
use super::wqe;
use super::xrc::XrcSrq;

/// One SRQ and its ring.
#[derive(Debug)]
pub struct SrqEntry {
    /// The transport's pool.
    pub srq: Srq,
    /// Owning client.
    pub client: u32,
    /// QPs receiving from it (it cannot be destroyed while any is).
    users: u32,
    /// Its user, and the segment bytes counted against that user's quota.
    uid: u32,
    bytes: u64,
    ring: Consumer<RecvWqe>,
    /// `max_sge` as the WQE checks want it.
    caps: QpCaps,
    ring_broken: bool,
    /// Its slot on the client's doorbell page.
    doorbell: u32,
    /// The last drain left entries in the ring (pool full or budget spent).
    backlog: bool,
    /// An XRC SRQ's number, domain and CQ (`xrc.rs`); `None` for a basic SRQ.
    pub xrc: Option<XrcSrq>,
}

impl SrqEntry {
    /// Copies entries from the ring into the pool while it has room. Returns how many.
    /// [`SrqEntry::backlog`] says whether entries were left behind.
    pub fn drain_ring(&mut self, n: &mut NicCounters) -> usize {
        let mut taken = 0;
        self.backlog = true;
        while taken < DRAIN_BUDGET && !self.ring_broken && !self.srq.in_error() {
            if self.srq.len() >= self.srq.query().max_wr as usize {
                break;
            }
            let w = match self.ring.pop() {
                Ok(Some(w)) => w,
                Ok(None) => {
                    self.backlog = false;
                    break;
                }
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
        self.release_slots();
        taken
    }

    /// Returns to the client the ring slots of WQEs no longer in the pool (taken by a
    /// QP, or failed), so the client never has more than the ring's capacity posted and
    /// not yet taken (see `QpEntry::release_slots`). Also called after each packet for
    /// one of its QPs (`runtime::rx_one`), so before that iteration's completions are
    /// written.
    pub fn release_slots(&mut self) {
        self.ring.release_except(self.srq.len() as u32);
    }

    /// Before a packet for one of its QPs is handled: if the pool is empty, takes what
    /// the client has posted since the last drain (see `QpEntry::refill_recv`).
    pub fn refill(&mut self, n: &mut NicCounters) {
        if self.srq.is_empty() {
            self.drain_ring(n);
        }
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

    /// Whether the last drain left entries in a ring that can still be read: the
    /// runtime drains again after a packet took a WQE from the pool (the pool-full
    /// case) or next iteration (the budget case); a doorbell is not rung twice.
    pub fn backlog(&self) -> bool {
        self.backlog && !self.ring_broken && !self.srq.in_error()
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
    /// CreateSrq: attaches the ring in `fds[0]`; with `xrc`, an XRC SRQ of that domain
    /// completing into that CQ (`xrc.rs`), whose number the reply carries.
    pub(super) fn create_srq(
        &mut self,
        client: u32,
        pd: Handle,
        (attr, xrc): (SrqAttr, Option<XrcSrqInit>),
        fds: Vec<OwnedFd>,
        counters: &mut NicCounters,
    ) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let xrc = match xrc.map(|x| self.check_xrc_srq(client, x)).transpose() {
            Ok(x) => x,
            Err(a) => return *a,
        };
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
        let Some(doorbell) = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.doorbells.assign(Target::Srq(h)))
        else {
            self.give_srq_quota(uid, bytes);
            return err(
                ErrorCode::NoResources,
                format!(
                    "every one of the {DOORBELL_SLOTS} doorbell slots of this connection is in use"
                ),
            );
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
                users: 0,
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
                doorbell,
                backlog: false,
                xrc,
            },
        );
        self.pd_use(pd, true);
        if let Some(x) = &xrc {
            self.xrc_srq_made(h, x);
        }
        if let Some(o) = self.owned(client) {
            o.srqs.insert(h, ());
        }
        let srq_num = xrc.map_or(0, |x| x.srq_num);
        tracing::debug!(client, srq = h, srq_num, "SRQ created");
        (
            verbs_api::abi::control::Response::Ok(Reply::Srq {
                srq: h,
                srq_num,
                attr: granted,
                doorbell,
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
        let Some(users) = self.srq_of(client, srq).map(|e| e.users) else {
            return err(ErrorCode::NotFound, format!("no SRQ {srq}"));
        };
        if users > 0 {
            return err(ErrorCode::Busy, format!("SRQ {srq} is used by {users} QPs"));
        }
        self.remove_srq(srq);
        ok(Reply::Done)
    }

    /// Removes SRQ `h` and gives back its PD use and quota (its QPs are gone), and an
    /// XRC SRQ's number, domain and CQ uses. An XRC receive QP holds no use of an XRC
    /// SRQ (any request may name any SRQ of the domain), so one may go while a QP
    /// holds one of its WQEs: that WQE's completion is then dropped and counted
    /// (`cqe_drop_no_cq`), as the kernel leaves it to the program not to do this.
    pub(super) fn remove_srq(&mut self, h: Handle) {
        if let Some(e) = self.srqs.remove(&h) {
            if let Some(x) = &e.xrc {
                self.xrc_srq_gone(x);
            }
            self.retired_srqs.add(e.srq.counters());
            self.pd_use(e.srq.pd(), false);
            self.give_srq_quota(e.uid, e.bytes);
            if let Some(c) = self.clients.get_mut(&e.client) {
                c.doorbells.release(e.doorbell);
                c.events.forget(EventSource::Srq(h));
            }
            if let Some(o) = self.owned(e.client) {
                o.srqs.remove(&h);
            }
        }
    }

    /// Totals of every SRQ's counters, live and destroyed.
    pub fn srq_totals(&self) -> softnic_transport::srq::SrqCounters {
        let mut t = self.retired_srqs;
        for e in self.srqs.values() {
            t.add(e.srq.counters());
        }
        t
    }

    /// One more or one fewer QP receiving from SRQ `h`.
    pub(super) fn srq_use(&mut self, h: Handle, more: bool) {
        if let Some(e) = self.srqs.get_mut(&h) {
            e.users = if more {
                e.users.saturating_add(1)
            } else {
                e.users.saturating_sub(1)
            };
        }
    }

    /// The SRQ a new QP of `client` in `pd` may use, or the refusal.
    pub(super) fn srq_for_qp(
        &self,
        client: u32,
        pd: Handle,
        srq: Handle,
    ) -> Result<(), Box<Answer>> {
        match self.srqs.get(&srq).filter(|s| s.client == client) {
            Some(s) if s.xrc.is_some() => Err(Box::new(err(
                ErrorCode::InvalidArgument,
                format!("SRQ {srq} is an XRC SRQ: only XRC receive QPs receive from it"),
            ))),
            Some(s) if s.srq.pd() == pd => Ok(()),
            Some(_) => Err(Box::new(err(
                ErrorCode::InvalidArgument,
                format!("SRQ {srq} is in another protection domain"),
            ))),
            None => Err(Box::new(err(ErrorCode::NotFound, format!("no SRQ {srq}")))),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::fd::AsFd;
    use std::sync::Arc;

    use softnic_transport::time::Instant;
    use verbs_api::abi::control::{AsyncEvent, QpCaps as CQpCaps, QpType, Request, Response};
    use verbs_api::abi::{CqLayout, Cqe, ABI_VERSION};

    use super::super::quota::Limits;
    use super::super::state::NicInfo;
    use super::*;

    const UID: u32 = 1000;

    pub(crate) fn nic(limits: Limits) -> (Nic, NicCounters) {
        let info = NicInfo {
            name: "t".into(),
            local: "127.0.0.1:4791".parse().unwrap(),
            mtu: 4096,
            compat: Default::default(),
            ack_timer: Default::default(),
        };
        (Nic::new(info, limits), NicCounters::default())
    }

    pub(crate) fn call(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<Reply, ErrorCode> {
        match nic.request(Instant::ZERO, client, UID, req, fds, c).0 {
            Response::Ok(r) => Ok(r),
            Response::Err { code, .. } => Err(code),
        }
    }

    fn srq_fd(max_wr: u32) -> OwnedFd {
        let l = SrqLayout::new(max_wr).unwrap();
        let fd = verbs_api::os::memfd("srq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        Ring::<RecvWqe>::new(map, l.offset, l.capacity)
            .unwrap()
            .init();
        fd
    }

    fn cq_fd() -> OwnedFd {
        let l = CqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("cq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        Ring::<Cqe>::new(map, l.offset, l.capacity).unwrap().init();
        fd
    }

    /// Opens `client`; returns (pd, cq).
    pub(crate) fn open(nic: &mut Nic, c: &mut NicCounters, client: u32) -> (u32, u32) {
        let req = Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: 1,
            program: "t".into(),
        };
        let db = super::super::state::tests::doorbell_fd();
        call(nic, c, client, req, vec![db]).unwrap();
        let Ok(Reply::Pd { pd }) = call(nic, c, client, Request::AllocPd, vec![]) else {
            panic!()
        };
        let req = Request::CreateCq { depth: 8 };
        let Ok(Reply::Cq { cq, .. }) = call(nic, c, client, req, vec![cq_fd()]) else {
            panic!()
        };
        (pd, cq)
    }

    pub(crate) fn create_srq(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        pd: u32,
        attr: SrqAttr,
    ) -> Result<Reply, ErrorCode> {
        let req = Request::CreateSrq {
            pd,
            attr,
            xrc: None,
        };
        call(nic, c, client, req, vec![srq_fd(attr.max_wr.max(1))])
    }

    pub(crate) fn create_qp(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        (pd, cq): (u32, u32),
        srq: Option<u32>,
    ) -> Result<Reply, ErrorCode> {
        let req = Request::CreateQp {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            caps: CQpCaps {
                max_send_wr: 4,
                max_recv_wr: 1,
                max_sge: 1,
                max_inline: 0,
            },
            srq,
            xrcd: None,
        };
        call(
            nic,
            c,
            client,
            req,
            vec![super::super::state::tests::test_qp_fd(4, 1)],
        )
    }

    /// What the runtime does for a rung SRQ doorbell: drain, then list its events.
    fn drain_rung(nic: &mut Nic, c: &mut NicCounters, srq: u32) -> usize {
        let e = nic.srqs.get_mut(&srq).unwrap();
        let taken = e.drain_ring(c);
        super::super::async_events::note_srq(srq, e, &mut nic.clients);
        taken
    }

    pub(crate) fn attr(max_wr: u32, srq_limit: u32) -> SrqAttr {
        SrqAttr {
            max_wr,
            max_sge: 1,
            srq_limit,
        }
    }

    #[test]
    fn create_query_modify_and_the_checks() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, _) = open(&mut nic, &mut c, 1);
        let Ok(Reply::Srq { srq, attr: got, .. }) =
            create_srq(&mut nic, &mut c, 1, pd, attr(100, 7))
        else {
            panic!()
        };
        assert_eq!(got, attr(128, 7), "max_wr is the ring capacity");
        let q =
            |nic: &mut Nic, c: &mut NicCounters| call(nic, c, 1, Request::QuerySrq { srq }, vec![]);
        assert_eq!(q(&mut nic, &mut c), Ok(Reply::SrqInfo(attr(128, 7))));
        let modify = |nic: &mut Nic, c: &mut NicCounters, max_wr, srq_limit| {
            let req = Request::ModifySrq {
                srq,
                max_wr,
                srq_limit,
            };
            call(nic, c, 1, req, vec![])
        };
        assert_eq!(modify(&mut nic, &mut c, None, Some(2)), Ok(Reply::Done));
        assert_eq!(
            modify(&mut nic, &mut c, None, Some(129)),
            Err(ErrorCode::InvalidArgument)
        );
        assert_eq!(
            modify(&mut nic, &mut c, Some(256), None),
            Err(ErrorCode::InvalidArgument),
            "no resize"
        );
        assert_eq!(q(&mut nic, &mut c), Ok(Reply::SrqInfo(attr(128, 2))));
        // Bad creations: limit above max_wr, too many SGEs, a PD that is not ours,
        // no memfd.
        let bad = [
            (pd, attr(8, 9)),
            (
                pd,
                SrqAttr {
                    max_sge: 5,
                    ..attr(8, 0)
                },
            ),
            (pd + 1000, attr(8, 0)),
        ];
        for (p, a) in bad {
            assert!(create_srq(&mut nic, &mut c, 1, p, a).is_err(), "{a:?}");
        }
        let req = Request::CreateSrq {
            pd,
            attr: attr(8, 0),
            xrc: None,
        };
        assert_eq!(
            call(&mut nic, &mut c, 1, req, vec![]),
            Err(ErrorCode::Protocol)
        );
    }

    #[test]
    fn qps_need_an_srq_of_their_own_client_and_pd_which_then_stays_busy() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let (pd2, cq2) = open(&mut nic, &mut c, 2);
        let Ok(Reply::Srq { srq, .. }) = create_srq(&mut nic, &mut c, 1, pd, attr(8, 0)) else {
            panic!()
        };
        // Client 2 cannot name client 1's SRQ, nor can another PD of client 1.
        assert_eq!(
            create_qp(&mut nic, &mut c, 2, (pd2, cq2), Some(srq)),
            Err(ErrorCode::NotFound)
        );
        let Ok(Reply::Pd { pd: other }) = call(&mut nic, &mut c, 1, Request::AllocPd, vec![])
        else {
            panic!()
        };
        assert_eq!(
            create_qp(&mut nic, &mut c, 1, (other, cq), Some(srq)),
            Err(ErrorCode::InvalidArgument)
        );
        let Ok(Reply::Qp { qpn, .. }) = create_qp(&mut nic, &mut c, 1, (pd, cq), Some(srq)) else {
            panic!()
        };
        assert_eq!(nic.qps[&qpn].qp.srq(), Some(srq));
        let destroy = |nic: &mut Nic, c: &mut NicCounters, client| {
            call(nic, c, client, Request::DestroySrq { srq }, vec![])
        };
        assert_eq!(destroy(&mut nic, &mut c, 2), Err(ErrorCode::NotFound));
        assert_eq!(destroy(&mut nic, &mut c, 1), Err(ErrorCode::Busy));
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::DestroyQp { qpn }, vec![]),
            Ok(Reply::Done)
        );
        // The PD is in use while the SRQ lives.
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]),
            Err(ErrorCode::Busy)
        );
        assert_eq!(destroy(&mut nic, &mut c, 1), Ok(Reply::Done));
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]),
            Ok(Reply::Done)
        );
    }

    #[test]
    fn an_srq_counts_against_the_qp_quota_and_a_disconnect_gives_it_back() {
        let (mut nic, mut c) = nic(Limits {
            qps: 1,
            ..Limits::default()
        });
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let Ok(Reply::Srq { .. }) = create_srq(&mut nic, &mut c, 1, pd, attr(8, 0)) else {
            panic!()
        };
        assert_eq!(
            create_qp(&mut nic, &mut c, 1, (pd, cq), None),
            Err(ErrorCode::NoResources)
        );
        nic.remove_client(1);
        assert!(nic.srqs.is_empty());
        let (pd, cq) = open(&mut nic, &mut c, 3);
        assert!(matches!(
            create_qp(&mut nic, &mut c, 3, (pd, cq), None),
            Ok(Reply::Qp { .. })
        ));
    }

    #[test]
    fn a_corrupt_ring_index_puts_the_srq_in_error() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, _) = open(&mut nic, &mut c, 1);
        let fd = srq_fd(8);
        // The client's own mapping, made before registering: once the NIC has mapped the
        // memfd it is sealed against new writable mappings and write(2).
        let l = SrqLayout::new(8).unwrap();
        let client = verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap();
        let req = Request::CreateSrq {
            pd,
            attr: attr(8, 0),
            xrc: None,
        };
        let Ok(Reply::Srq { srq, .. }) = call(&mut nic, &mut c, 1, req, vec![fd]) else {
            panic!()
        };
        // The client claims 1000 entries in a ring of 8: the producer index (offset 0 of
        // the ring header) is impossible.
        // SAFETY: offset 0 of the live client mapping, 4-byte aligned (page-aligned map).
        unsafe {
            client
                .as_mut_ptr()
                .cast::<u32>()
                .write_volatile(1000u32.to_le())
        };
        assert_eq!(drain_rung(&mut nic, &mut c, srq), 0);
        let e = &nic.srqs[&srq];
        assert!(e.srq.in_error());
        assert_eq!(c.ring_corrupt, 1);
        assert!(!e.backlog(), "a broken ring is never drained again");
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::GetAsyncEvents, vec![]),
            Ok(Reply::AsyncEvents(vec![AsyncEvent::SrqErr { srq }]))
        );
    }

    #[test]
    fn a_bad_ring_entry_puts_the_srq_in_error_and_raises_the_event() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, _) = open(&mut nic, &mut c, 1);
        let l = SrqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("srq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let ring = Ring::<RecvWqe>::new(map, l.offset, l.capacity).unwrap();
        ring.init();
        let req = Request::CreateSrq {
            pd,
            attr: attr(8, 0),
            xrc: None,
        };
        let Ok(Reply::Srq { srq, .. }) = call(&mut nic, &mut c, 1, req, vec![fd]) else {
            panic!()
        };
        let mut p = ring.into_producer();
        p.push(&RecvWqe {
            wr_id: 1,
            num_sge: 1,
            ..RecvWqe::default()
        })
        .unwrap();
        p.push(&RecvWqe {
            wr_id: 2,
            num_sge: 3, // more than the SRQ's max_sge of 1
            ..RecvWqe::default()
        })
        .unwrap();
        p.publish();
        assert_eq!(drain_rung(&mut nic, &mut c, srq), 2);
        let e = &nic.srqs[&srq];
        assert!(e.srq.in_error() && e.srq.is_empty());
        assert_eq!(
            c.wqe_invalid, 2,
            "the bad entry and the pooled one it discarded"
        );
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::GetAsyncEvents, vec![]),
            Ok(Reply::AsyncEvents(vec![AsyncEvent::SrqErr { srq }]))
        );
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::GetAsyncEvents, vec![]),
            Ok(Reply::AsyncEvents(vec![]))
        );
    }
}
