//! XRC (eXtended Reliable Connected, IBTA 9.2 and 11.4.1.2 with the XRC annex):
//! domains, the numbers of XRC SRQs, and which XRC SRQ a request may use.
//!
//! XRC splits an RC connection in two: an XRC send QP (`IBV_QPT_XRC_SEND`) sends
//! requests, each naming in its XRCETH the XRC SRQ it is for; an XRC receive QP
//! (`IBV_QPT_XRC_RECV`) at the target takes them, and each request is received
//! through the SRQ it names — provided that SRQ is of the receive QP's *XRC domain*.
//! One connection thus serves every receive queue of the domain, which may belong to
//! several processes.
//!
//! * **Domains** (`ibv_open_xrcd(3)`). Each OpenXrcd gives the client a new handle (an
//!   *open*, from the one handle space of PDs, CQs and SRQs) that refers to a domain.
//!   Opens that name the same file (its `(st_dev, st_ino)`) from clients of the same
//!   user share one domain, as processes that open the same file share one through
//!   the kernel's `xrcd` table; opening a file that has no domain yet needs O_CREAT
//!   (`NotFound` without it, ENOENT). An open without a file makes a domain nobody
//!   else can open. An open counts as a protection domain against its user's PD quota
//!   (`quota.rs`): it is a domain the NIC holds for the user. CloseXrcd is `Busy`
//!   while an XRC SRQ or XRC receive QP made through that open exists (the kernel's
//!   per-open use count, `ib_uverbs_dealloc_xrcd`); a domain goes with its last
//!   open. A client that goes away loses its opens after its QPs and SRQs.
//! * **SRQ numbers** (`ibv_get_srq_num(3)`). An XRC SRQ gets a random 24-bit number,
//!   never 0, from the OS generator ([`super::secret`]), unique among the NIC's live
//!   XRC SRQs: it travels in every XRC request (XRCETH), so a peer that learns one
//!   must not be able to guess another (as with QPNs, ReDMArk). [`XrcTable::srq_of`]
//!   maps a number back to the SRQ's handle.
//! * **Receive** (`runtime.rs` `deliver`): a request for an XRC receive QP is handled
//!   with the SRQ its XRCETH names only if that SRQ is an XRC SRQ of the QP's domain;
//!   otherwise the QP refuses it with NAK Remote Access Error and goes to Err
//!   (counted in `rx_xrc_srq_refused`). The request's memory accesses are
//!   made under the SRQ's PD and its completion goes to the SRQ's CQ
//!   ([`xrc_srq_cq`]), not to a CQ of the QP, which has none.

use std::collections::HashMap;

use verbs_api::abi::control::{ErrorCode, Handle, Reply, XrcSrqInit};

use super::counters::NicCounters;
use super::handles::HandleAlloc;
use super::memory::KeyMap;
use super::quota::Kind;
use super::secret;
use super::srq::SrqEntry;
use super::state::{err, ok, refuse, Answer, Nic, QpSpec};

/// One OpenXrcd of a client.
#[derive(Debug, Clone, Copy)]
struct Open {
    client: u32,
    domain: u32,
    /// XRC SRQs and XRC receive QPs made through this open (it cannot be closed
    /// while any exists).
    users: u32,
}

/// One XRC domain.
#[derive(Debug, Clone, Copy)]
struct Domain {
    /// The user and file it is shared under, if it was opened with a file.
    key: Option<InodeKey>,
    /// Opens referring to it; it goes with the last.
    opens: u32,
}

/// A domain opened with a file: its user and the file's `(st_dev, st_ino)`.
type InodeKey = (u32, u64, u64);

/// What an XRC SRQ holds beyond a basic SRQ ([`SrqEntry::xrc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrq {
    /// Its number (`ibv_get_srq_num`), the one XRCETHs name.
    pub srq_num: u32,
    /// Its domain.
    pub domain: u32,
    /// The open it was made through (holds a use of it).
    pub open: Handle,
    /// The CQ every completion of its WQEs goes to (holds a use of it).
    pub cq: Handle,
}

/// What an XRC receive QP holds ([`super::rings::QpEntry::xrc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcTarget {
    /// The open it was made through (holds a use of it).
    pub open: Handle,
    /// Its domain: the XRC SRQs its requests may name.
    pub domain: u32,
}

/// The NIC's XRC domains, the clients' opens of them, and the XRC SRQ numbers.
#[derive(Debug, Default)]
pub struct XrcTable {
    opens: KeyMap<Open>,
    domains: KeyMap<Domain>,
    by_inode: HashMap<InodeKey, u32>,
    domain_ids: HandleAlloc,
    /// Live XRC SRQs: number → handle.
    srq_nums: KeyMap<Handle>,
}

impl XrcTable {
    /// Whether `h` is a live open (for the NIC's one handle space).
    pub fn is_open(&self, h: Handle) -> bool {
        self.opens.contains_key(&h)
    }

    /// Live domains.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// The handle of the live XRC SRQ numbered `srq_num`.
    pub fn srq_of(&self, srq_num: u32) -> Option<Handle> {
        self.srq_nums.get(&srq_num).copied()
    }

    /// The domain of `client`'s open `h`.
    fn domain_of(&self, client: u32, h: Handle) -> Option<u32> {
        self.opens
            .get(&h)
            .filter(|o| o.client == client)
            .map(|o| o.domain)
    }

    /// The domain an open of `key` refers to: the live one of that file and user, else
    /// a new one if `create` (`None`: a private domain, always new).
    fn domain_for(
        &mut self,
        key: Option<InodeKey>,
        (create, exclusive): (bool, bool),
    ) -> Result<u32, ErrorCode> {
        if let Some(d) = key.and_then(|k| self.by_inode.get(&k)) {
            // O_CREAT|O_EXCL on a file that has a domain: EINVAL, as the kernel.
            if create && exclusive {
                return Err(ErrorCode::InvalidArgument);
            }
            return Ok(*d);
        }
        if key.is_some() && !create {
            return Err(ErrorCode::NotFound);
        }
        let domains = &self.domains;
        let id = self
            .domain_ids
            .alloc(|d| domains.contains_key(&d))
            .ok_or(ErrorCode::NoResources)?;
        self.domains.insert(id, Domain { key, opens: 0 });
        if let Some(k) = key {
            self.by_inode.insert(k, id);
        }
        Ok(id)
    }

    /// Records `client`'s open `h` of the domain of `key` ([`XrcTable::domain_for`]);
    /// returns the domain.
    fn open(
        &mut self,
        h: Handle,
        client: u32,
        key: Option<InodeKey>,
        how: (bool, bool),
    ) -> Result<u32, ErrorCode> {
        let domain = self.domain_for(key, how)?;
        if let Some(d) = self.domains.get_mut(&domain) {
            d.opens += 1;
        }
        let users = 0;
        self.opens.insert(
            h,
            Open {
                client,
                domain,
                users,
            },
        );
        Ok(domain)
    }

    /// Drops open `h`, and its domain if that was the domain's last open.
    fn close(&mut self, h: Handle) {
        let Some(o) = self.opens.remove(&h) else {
            return;
        };
        let Some(d) = self.domains.get_mut(&o.domain) else {
            return;
        };
        d.opens = d.opens.saturating_sub(1);
        if d.opens == 0 {
            if let Some(k) = d.key {
                self.by_inode.remove(&k);
            }
            self.domains.remove(&o.domain);
        }
    }

    /// One more or one fewer XRC SRQ or XRC receive QP made through open `h`.
    pub fn open_use(&mut self, h: Handle, more: bool) {
        if let Some(o) = self.opens.get_mut(&h) {
            o.users = if more {
                o.users.saturating_add(1)
            } else {
                o.users.saturating_sub(1)
            };
        }
    }

    /// A fresh XRC SRQ number: 24 random bits from the OS generator, not 0, not live.
    fn draw_srq_num(&self) -> Result<u32, secret::DrawError> {
        secret::draw_where(wire::types::MASK_24, |n| {
            n != 0 && !self.srq_nums.contains_key(&n)
        })
    }

    /// Forgets the number of an XRC SRQ that is going.
    pub fn forget_srq(&mut self, x: &XrcSrq) {
        self.srq_nums.remove(&x.srq_num);
    }
}

/// The CQ of the XRC SRQ `h` of `domain` (in `srqs`), where a receive completion of an
/// XRC receive QP of that domain goes: `Completion::srqn` names the SRQ its WQE came
/// from by the number the transport knows the SRQ by, which is its handle here
/// (`srq.rs` makes every transport `Srq` under its handle; the XRC SRQ number is for
/// the wire only). `None` when no such SRQ lives any more: it was destroyed while the
/// QP held one of its WQEs, and the completion has nowhere to go.
pub fn xrc_srq_cq(srqs: &KeyMap<SrqEntry>, domain: u32, h: Handle) -> Option<Handle> {
    srqs.get(&h)
        .and_then(|s| s.xrc)
        .filter(|x| x.domain == domain)
        .map(|x| x.cq)
}

/// The XRC SRQ of `domain` that a request naming `srq_num` in its XRCETH is for, or
/// `None` (no such number, or an SRQ of another domain: the request is dropped).
pub fn srq_for_request(
    xrc: &XrcTable,
    srqs: &KeyMap<SrqEntry>,
    domain: u32,
    srq_num: u32,
) -> Option<Handle> {
    let h = xrc.srq_of(srq_num)?;
    let x = srqs.get(&h)?.xrc?;
    (x.domain == domain && x.srq_num == srq_num).then_some(h)
}

impl Nic {
    /// OpenXrcd (`ibv_open_xrcd(3)`): a new open of the domain of `inode` for this
    /// client's user (made if `create`), or of a new private domain.
    pub(super) fn open_xrcd(
        &mut self,
        client: u32,
        inode: Option<(u64, u64)>,
        how: (bool, bool),
        counters: &mut NicCounters,
    ) -> Answer {
        let uid = self.uid_of(client);
        let key = inode.map(|(dev, ino)| (uid, dev, ino));
        let Some(h) = self.handle() else {
            return err(ErrorCode::NoResources, "every PD/CQ/SRQ handle is in use");
        };
        if let Err(e) = self.quotas.take(uid, Kind::Pd, 0) {
            return refuse(e, counters);
        }
        let domain = match self.xrc.open(h, client, key, how) {
            Ok(d) => d,
            Err(code) => {
                self.quotas.give_back(uid, Kind::Pd, 0);
                let why = match code {
                    ErrorCode::NotFound => "no XRC domain of this file yet (open it with O_CREAT)",
                    ErrorCode::InvalidArgument => "O_CREAT|O_EXCL: this file has an XRC domain",
                    _ => "every XRC domain number is in use",
                };
                return err(code, why);
            }
        };
        if let Some(o) = self.owned(client) {
            o.xrcds.insert(h, ());
        }
        tracing::debug!(client, xrcd = h, domain, "XRC domain opened");
        ok(Reply::Xrcd { xrcd: h })
    }

    /// CloseXrcd (`ibv_close_xrcd(3)`): `Busy` while an XRC SRQ or XRC receive QP made
    /// through this open exists.
    pub(super) fn close_xrcd(&mut self, client: u32, h: Handle) -> Answer {
        let Some(o) = self.xrc.opens.get(&h).filter(|o| o.client == client) else {
            return err(ErrorCode::NotFound, format!("no XRC domain {h}"));
        };
        if o.users > 0 {
            return err(
                ErrorCode::Busy,
                format!("XRC domain {h} still has {} XRC SRQs and QPs", o.users),
            );
        }
        self.drop_xrcd(client, h);
        ok(Reply::Done)
    }

    /// Drops `client`'s open `h` (its SRQs and QPs are gone) and gives back its quota.
    pub(super) fn drop_xrcd(&mut self, client: u32, h: Handle) {
        if self.xrc.domain_of(client, h).is_none() {
            return;
        }
        self.xrc.close(h);
        if let Some(o) = self.owned(client) {
            o.xrcds.remove(&h);
        }
        let uid = self.uid_of(client);
        self.quotas.give_back(uid, Kind::Pd, 0);
    }

    /// The domain of `client`'s open `h`, or the refusal.
    pub(super) fn xrcd_of(&self, client: u32, h: Handle) -> Result<u32, Box<Answer>> {
        self.xrc
            .domain_of(client, h)
            .ok_or_else(|| Box::new(err(ErrorCode::NotFound, format!("no XRC domain {h}"))))
    }

    /// The checks of a CreateQp for an XRC receive QP (`ibv_create_qp_ex(3)`,
    /// IBV_QPT_XRC_RECV): the client's domain, and nothing an XRC receive QP does not
    /// have — no PD, no CQs, no SRQ — nor rings bigger than the one-slot ones the
    /// protocol has the client send (they are never read).
    pub(super) fn check_xrc_recv_qp(&self, spec: &QpSpec) -> Result<XrcTarget, Box<Answer>> {
        let refuse = |m: &str| Box::new(err(ErrorCode::InvalidArgument, m));
        let Some(open) = spec.xrcd else {
            return Err(refuse("an XRC receive QP needs its XRC domain"));
        };
        let domain = self.xrcd_of(spec.client, open)?;
        if spec.pd != 0 || spec.send_cq != 0 || spec.recv_cq != 0 || spec.srq.is_some() {
            return Err(refuse(
                "an XRC receive QP has no PD, CQs or SRQ of its own (send 0)",
            ));
        }
        let c = spec.caps;
        if c.max_send_wr > 1 || c.max_recv_wr > 1 || c.max_sge > 1 || c.max_inline > 0 {
            return Err(refuse(
                "an XRC receive QP has no queues: caps 1 send WR, 1 receive WR, 1 SGE, 0 inline",
            ));
        }
        Ok(XrcTarget { open, domain })
    }

    /// The checks of a CreateSrq for an XRC SRQ (`ibv_create_srq_ex(3)`, IBV_SRQT_XRC):
    /// the domain and the CQ are the client's. Returns what the SRQ will hold, with a
    /// fresh number.
    pub(super) fn check_xrc_srq(&self, client: u32, x: XrcSrqInit) -> Result<XrcSrq, Box<Answer>> {
        let domain = self.xrcd_of(client, x.xrcd)?;
        if self.cqs.get(&x.cq).is_none_or(|c| c.client != client) {
            return Err(Box::new(err(
                ErrorCode::NotFound,
                format!("no CQ {}", x.cq),
            )));
        }
        let srq_num = self.xrc.draw_srq_num().map_err(|e| {
            let code = match e {
                secret::DrawError::Exhausted => ErrorCode::NoResources,
                secret::DrawError::NoEntropy(_) => ErrorCode::Internal,
            };
            Box::new(err(code, format!("no XRC SRQ number: {e}")))
        })?;
        Ok(XrcSrq {
            srq_num,
            domain,
            open: x.xrcd,
            cq: x.cq,
        })
    }

    /// An XRC SRQ `h` was made: its number names it, it holds its open and its CQ.
    pub(super) fn xrc_srq_made(&mut self, h: Handle, x: &XrcSrq) {
        self.xrc.srq_nums.insert(x.srq_num, h);
        self.xrc.open_use(x.open, true);
        self.cq_use(x.cq, true);
    }

    /// XRC SRQ `x` is going: its number and uses go.
    pub(super) fn xrc_srq_gone(&mut self, x: &XrcSrq) {
        self.xrc.forget_srq(x);
        self.xrc.open_use(x.open, false);
        self.cq_use(x.cq, false);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::Arc;

    use softnic_transport::qp::ReceivedIp;
    use softnic_transport::time::Instant;
    use verbs_api::abi::control::{QpAttr, QpCaps, QpState, QpType, Request, Response, XrcSrqInit};
    use verbs_api::abi::ring::{Consumer, Producer};
    use verbs_api::abi::slots::{wc_opcode, wc_status};
    use verbs_api::abi::{
        CqLayout, Cqe, QpLayout, RecvWqe, Ring, SendWqe, Sge, SqShape, SrqLayout,
    };
    use wire::xrceth::XrcEthRepr;
    use wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn};

    use super::super::quota::{Limits, Usage};
    use super::super::srq::tests::{attr, call, create_qp, create_srq, nic, open};
    use super::*;

    const PEER: &str = "127.0.0.9:4791";

    fn open_xrcd(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        inode: Option<(u64, u64)>,
        create: bool,
    ) -> Result<Handle, ErrorCode> {
        match call(
            nic,
            c,
            client,
            Request::OpenXrcd {
                inode,
                create,
                exclusive: false,
            },
            vec![],
        )? {
            Reply::Xrcd { xrcd } => Ok(xrcd),
            other => panic!("{other:?}"),
        }
    }

    fn close_xrcd(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        xrcd: Handle,
    ) -> Result<(), ErrorCode> {
        call(nic, c, client, Request::CloseXrcd { xrcd }, vec![]).map(|_| ())
    }

    /// The domain an open refers to (for the checks on sharing).
    fn domain(nic: &Nic, client: u32, xrcd: Handle) -> u32 {
        nic.xrc.domain_of(client, xrcd).expect("a live open")
    }

    /// A CQ of `client` and the test's consumer of its ring.
    fn cq(nic: &mut Nic, c: &mut NicCounters, client: u32) -> (Handle, Consumer<Cqe>) {
        let l = CqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("cq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let ring = Ring::<Cqe>::new(map, l.offset, l.capacity).unwrap();
        ring.init();
        let req = Request::CreateCq { depth: 8 };
        let Ok(Reply::Cq { cq, .. }) = call(nic, c, client, req, vec![fd]) else {
            panic!()
        };
        (cq, ring.into_consumer())
    }

    /// CreateSrq of an XRC SRQ; returns (handle, number) and the test's producer of its
    /// ring.
    fn xrc_srq(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        pd: Handle,
        (xrcd, cq): (Handle, Handle),
    ) -> Result<(Handle, u32, Producer<RecvWqe>), ErrorCode> {
        let l = SrqLayout::new(8).unwrap();
        let fd = verbs_api::os::memfd("srq", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let ring = Ring::<RecvWqe>::new(map, l.offset, l.capacity).unwrap();
        ring.init();
        let req = Request::CreateSrq {
            pd,
            attr: attr(8, 0),
            xrc: Some(XrcSrqInit { xrcd, cq }),
        };
        match call(nic, c, client, req, vec![fd])? {
            Reply::Srq { srq, srq_num, .. } => Ok((srq, srq_num, ring.into_producer())),
            other => panic!("{other:?}"),
        }
    }

    /// A QP segment of the layout `caps` and `qp_type` make; the test's SQ and RQ rings.
    fn qp_fd(caps: QpCaps, qp_type: QpType) -> (OwnedFd, Producer<SendWqe>, Producer<RecvWqe>) {
        let shape: SqShape = caps.sq_shape(qp_type);
        let l = QpLayout::new(caps.max_send_wr, caps.max_recv_wr, shape).unwrap();
        let fd = verbs_api::os::memfd("qp", l.len).unwrap();
        let map = Arc::new(verbs_api::os::map_shared(fd.as_fd(), l.len).unwrap());
        let (sq, rq) = l.rings(map).unwrap();
        sq.init();
        rq.init();
        (fd, sq.into_producer(), rq.into_producer())
    }

    /// The caps the protocol has a client send for an XRC receive QP.
    const RECV_CAPS: QpCaps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_sge: 1,
        max_inline: 0,
    };

    const SEND_CAPS: QpCaps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 1,
        max_sge: 1,
        max_inline: 0,
    };

    struct QpReq {
        qp_type: QpType,
        pd: Handle,
        send_cq: Handle,
        recv_cq: Handle,
        caps: QpCaps,
        srq: Option<Handle>,
        xrcd: Option<Handle>,
    }

    /// CreateQp; returns the QPN and the test's rings.
    fn qp(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        q: QpReq,
    ) -> Result<(u32, Producer<SendWqe>, Producer<RecvWqe>), ErrorCode> {
        let (fd, sq, rq) = qp_fd(q.caps, q.qp_type);
        let req = Request::CreateQp {
            pd: q.pd,
            qp_type: q.qp_type,
            send_cq: q.send_cq,
            recv_cq: q.recv_cq,
            caps: q.caps,
            srq: q.srq,
            xrcd: q.xrcd,
        };
        match call(nic, c, client, req, vec![fd])? {
            Reply::Qp { qpn, .. } => Ok((qpn, sq, rq)),
            other => panic!("{other:?}"),
        }
    }

    fn recv_qp(xrcd: Handle) -> QpReq {
        QpReq {
            qp_type: QpType::XrcRecv,
            pd: 0,
            send_cq: 0,
            recv_cq: 0,
            caps: RECV_CAPS,
            srq: None,
            xrcd: Some(xrcd),
        }
    }

    fn send_qp(pd: Handle, cq: Handle) -> QpReq {
        QpReq {
            qp_type: QpType::XrcSend,
            pd,
            send_cq: cq,
            recv_cq: 0,
            caps: SEND_CAPS,
            srq: None,
            xrcd: None,
        }
    }

    fn modify(
        nic: &mut Nic,
        c: &mut NicCounters,
        qpn: u32,
        attr: QpAttr,
    ) -> Result<Reply, ErrorCode> {
        call(nic, c, 1, Request::ModifyQp { qpn, attr }, vec![])
    }

    /// Moves client 1's QP `qpn` to RTR, its peer at [`PEER`], expecting PSN 0, with
    /// the attributes of its type (an XRC send QP has no responder's).
    fn to_rtr(nic: &mut Nic, c: &mut NicCounters, qpn: u32) {
        let responder = nic.qps[&qpn].qp.qp_type() != softnic_transport::qp::QpType::XrcSend;
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access: Some(0xF),
            ..QpAttr::default()
        };
        assert_eq!(modify(nic, c, qpn, init), Ok(Reply::Done));
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(1024),
            dest_qpn: Some(0x42),
            rq_psn: Some(0),
            remote: Some(PEER.parse().unwrap()),
            max_dest_rd_atomic: responder.then_some(1),
            min_rnr_timer: responder.then_some(12),
            ..QpAttr::default()
        };
        assert_eq!(modify(nic, c, qpn, rtr), Ok(Reply::Done));
    }

    /// Moves client 1's XRC receive QP `qpn` from RTR to RTS.
    fn recv_to_rts(nic: &mut Nic, c: &mut NicCounters, qpn: u32) {
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            ..QpAttr::default()
        };
        assert_eq!(modify(nic, c, qpn, rts), Ok(Reply::Done));
    }

    #[test]
    fn opens_of_one_file_and_user_share_a_domain_and_close_when_unused() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq) = open(&mut nic, &mut c, 1);
        open(&mut nic, &mut c, 2);
        let file = Some((7, 99));
        // No domain of the file yet, and no O_CREAT.
        assert_eq!(
            open_xrcd(&mut nic, &mut c, 1, file, false),
            Err(ErrorCode::NotFound)
        );
        assert_eq!(nic.xrc.domains(), 0);
        let a = open_xrcd(&mut nic, &mut c, 1, file, true).unwrap();
        // The same file from another client of the same user: the same domain.
        let b = open_xrcd(&mut nic, &mut c, 2, file, false).unwrap();
        assert_ne!(a, b, "each open is a handle of its own");
        assert_eq!(domain(&nic, 1, a), domain(&nic, 2, b));
        // O_CREAT|O_EXCL on a file with a domain: EINVAL, checked with the open.
        let exclusive = Request::OpenXrcd {
            inode: file,
            create: true,
            exclusive: true,
        };
        assert_eq!(
            call(&mut nic, &mut c, 1, exclusive.clone(), vec![]).err(),
            Some(ErrorCode::InvalidArgument)
        );
        let fresh = Request::OpenXrcd {
            inode: Some((7, 101)),
            create: true,
            exclusive: true,
        };
        let excl = match call(&mut nic, &mut c, 1, fresh, vec![]) {
            Ok(Reply::Xrcd { xrcd }) => xrcd,
            other => panic!("{other:?}"),
        };
        close_xrcd(&mut nic, &mut c, 1, excl).unwrap();
        // Another file, and no file at all: new domains.
        let other = open_xrcd(&mut nic, &mut c, 1, Some((7, 100)), true).unwrap();
        let private = open_xrcd(&mut nic, &mut c, 1, None, false).unwrap();
        assert_eq!(nic.xrc.domains(), 3);
        assert_ne!(domain(&nic, 1, other), domain(&nic, 1, a));
        // Handles come from the one space of PDs, CQs and SRQs.
        for h in [a, b, other, private] {
            assert!(![pd, cq].contains(&h));
        }
        // Another user does not see this user's domain of the file.
        let as_user = |nic: &mut Nic, c: &mut NicCounters, req| {
            nic.request(Instant::ZERO, 3, 2000, req, vec![], c).0
        };
        let hello = Request::OpenDevice {
            abi_version: verbs_api::abi::ABI_VERSION,
            pid: 3,
            program: "other user".into(),
        };
        let db = super::super::state::tests::doorbell_fd();
        let opened = nic
            .request(Instant::ZERO, 3, 2000, hello, vec![db], &mut c)
            .0;
        assert!(matches!(opened, Response::Ok(_)), "{opened:?}");
        let req = Request::OpenXrcd {
            inode: file,
            create: false,
            exclusive: false,
        };
        let theirs = as_user(&mut nic, &mut c, req);
        assert!(
            matches!(
                theirs,
                Response::Err {
                    code: ErrorCode::NotFound,
                    ..
                }
            ),
            "{theirs:?}"
        );
        let req = Request::OpenXrcd {
            inode: file,
            create: true,
            exclusive: false,
        };
        let Response::Ok(Reply::Xrcd { xrcd: t }) = as_user(&mut nic, &mut c, req) else {
            panic!()
        };
        assert_ne!(
            domain(&nic, 3, t),
            domain(&nic, 1, a),
            "a domain of its own"
        );
        nic.remove_client(3);
        // Only the owner closes an open; an unknown handle is NotFound.
        assert_eq!(close_xrcd(&mut nic, &mut c, 2, a), Err(ErrorCode::NotFound));
        assert_eq!(
            close_xrcd(&mut nic, &mut c, 1, 0xdead),
            Err(ErrorCode::NotFound)
        );
        // Busy while an XRC SRQ made through the open exists; the domain outlives the
        // other client's open.
        let (srq, ..) = xrc_srq(&mut nic, &mut c, 1, pd, (a, cq)).unwrap();
        assert_eq!(close_xrcd(&mut nic, &mut c, 1, a), Err(ErrorCode::Busy));
        assert_eq!(close_xrcd(&mut nic, &mut c, 2, b), Ok(()));
        assert_eq!(nic.xrc.domains(), 3);
        assert_eq!(
            close_xrcd(&mut nic, &mut c, 2, b),
            Err(ErrorCode::NotFound),
            "closed"
        );
        let req = Request::DestroySrq { srq };
        assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
        assert_eq!(close_xrcd(&mut nic, &mut c, 1, a), Ok(()));
        assert_eq!(
            nic.xrc.domains(),
            2,
            "the file's domain went with its last open"
        );
        // The file has no domain any more.
        assert_eq!(
            open_xrcd(&mut nic, &mut c, 2, file, false),
            Err(ErrorCode::NotFound)
        );
    }

    #[test]
    fn opens_count_as_pds_and_a_disconnect_drops_them_after_their_objects() {
        let (mut nic, mut c) = nic(Limits {
            pds: 3,
            ..Limits::default()
        });
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let x = open_xrcd(&mut nic, &mut c, 1, Some((1, 1)), true).unwrap();
        open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        assert_eq!(
            open_xrcd(&mut nic, &mut c, 1, None, true),
            Err(ErrorCode::NoResources)
        );
        xrc_srq(&mut nic, &mut c, 1, pd, (x, cq)).unwrap();
        qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        nic.remove_client(1);
        assert_eq!(nic.xrc.domains(), 0);
        assert!(nic.xrc.srq_nums.is_empty() && nic.xrc.opens.is_empty());
        assert!(nic.srqs.is_empty() && nic.qps.is_empty() && nic.cqs.is_empty());
        assert_eq!(nic.quotas.usage(1000), Usage::default());
    }

    #[test]
    fn xrc_srqs_get_distinct_random_numbers_and_hold_their_cq() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let (pd2, cq2) = open(&mut nic, &mut c, 2);
        let x = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let x2 = open_xrcd(&mut nic, &mut c, 2, None, true).unwrap();
        let mut nums = Vec::new();
        let mut srqs = Vec::new();
        for _ in 0..16 {
            let (srq, num, _) = xrc_srq(&mut nic, &mut c, 1, pd, (x, cq)).unwrap();
            assert!(num != 0 && num <= wire::types::MASK_24, "{num:#x}");
            assert_eq!(nic.xrc.srq_of(num), Some(srq));
            assert!(!nums.contains(&num), "{num:#x} twice");
            nums.push(num);
            srqs.push(srq);
        }
        // Random, not sequential: 16 consecutive numbers would be a pattern.
        assert!(nums.windows(2).any(|w| w[1] != w[0].wrapping_add(1)));
        // A basic SRQ has no number.
        let Ok(Reply::Srq { srq_num: 0, .. }) = create_srq(&mut nic, &mut c, 1, pd, attr(8, 0))
        else {
            panic!("a basic SRQ numbered")
        };
        // The domain, the CQ and the PD must be the client's.
        for (p, d, q) in [(pd, x2, cq), (pd, x, cq2), (pd2, x, cq), (pd, pd, cq)] {
            assert_eq!(
                xrc_srq(&mut nic, &mut c, 1, p, (d, q)).err(),
                Some(ErrorCode::NotFound),
                "pd {p} xrcd {d} cq {q}"
            );
        }
        // Its CQ cannot go while it lives; destroyed, its number is forgotten.
        let destroy_cq =
            |nic: &mut Nic, c: &mut NicCounters| call(nic, c, 1, Request::DestroyCq { cq }, vec![]);
        assert_eq!(destroy_cq(&mut nic, &mut c), Err(ErrorCode::Busy));
        for (&srq, &num) in srqs.iter().zip(&nums) {
            let req = Request::DestroySrq { srq };
            assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
            assert_eq!(nic.xrc.srq_of(num), None);
        }
        assert_eq!(destroy_cq(&mut nic, &mut c), Ok(Reply::Done));
    }

    #[test]
    fn xrc_qps_are_made_with_what_their_type_has_and_nothing_else() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let (_, cq2) = open(&mut nic, &mut c, 2);
        let x = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let x2 = open_xrcd(&mut nic, &mut c, 2, None, true).unwrap();
        let (srq, ..) = xrc_srq(&mut nic, &mut c, 1, pd, (x, cq)).unwrap();
        let bad_recv = [
            (
                QpReq {
                    xrcd: None,
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
            (recv_qp(x2), ErrorCode::NotFound),
            (QpReq { pd, ..recv_qp(x) }, ErrorCode::InvalidArgument),
            (
                QpReq {
                    send_cq: cq,
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    recv_cq: cq,
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    srq: Some(srq),
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    caps: QpCaps {
                        max_send_wr: 64,
                        ..RECV_CAPS
                    },
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    caps: QpCaps {
                        max_inline: 16,
                        ..RECV_CAPS
                    },
                    ..recv_qp(x)
                },
                ErrorCode::InvalidArgument,
            ),
        ];
        for (q, code) in bad_recv {
            assert_eq!(qp(&mut nic, &mut c, 1, q).err(), Some(code));
        }
        let bad_send = [
            (
                QpReq {
                    xrcd: Some(x),
                    ..send_qp(pd, cq)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    srq: Some(srq),
                    ..send_qp(pd, cq)
                },
                ErrorCode::InvalidArgument,
            ),
            (send_qp(pd, cq2), ErrorCode::NotFound),
            (send_qp(0, cq), ErrorCode::NotFound),
            (
                QpReq {
                    qp_type: QpType::Rc,
                    recv_cq: cq,
                    xrcd: Some(x),
                    ..send_qp(pd, cq)
                },
                ErrorCode::InvalidArgument,
            ),
            (
                QpReq {
                    qp_type: QpType::Rc,
                    recv_cq: cq,
                    caps: QpCaps {
                        max_send_wr: 4,
                        ..RECV_CAPS
                    },
                    srq: Some(srq),
                    ..send_qp(pd, cq)
                },
                ErrorCode::InvalidArgument,
            ),
        ];
        for (q, code) in bad_send {
            assert_eq!(qp(&mut nic, &mut c, 1, q).err(), Some(code));
        }
        assert_eq!(
            create_qp(&mut nic, &mut c, 1, (pd, cq), Some(srq)),
            Err(ErrorCode::InvalidArgument),
            "an RC QP on an XRC SRQ"
        );
        let (recv, ..) = qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        let (send, ..) = qp(&mut nic, &mut c, 1, send_qp(pd, cq)).unwrap();
        assert_eq!(
            nic.qps[&recv].qp.qp_type(),
            softnic_transport::qp::QpType::XrcRecv
        );
        assert_eq!(
            nic.qps[&send].qp.qp_type(),
            softnic_transport::qp::QpType::XrcSend
        );
        // QueryQp and ModifyQp work on both.
        to_rtr(&mut nic, &mut c, recv);
        to_rtr(&mut nic, &mut c, send);
        for q in [recv, send] {
            let info = call(&mut nic, &mut c, 1, Request::QueryQp { qpn: q }, vec![]);
            assert!(
                matches!(
                    info,
                    Ok(Reply::QpInfo {
                        state: QpState::Rtr,
                        ..
                    })
                ),
                "{info:?}"
            );
        }
        // The receive QP holds its open; the send QP its PD and CQ, once.
        assert_eq!(close_xrcd(&mut nic, &mut c, 1, x), Err(ErrorCode::Busy));
        let req = Request::DestroySrq { srq };
        assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
        assert_eq!(close_xrcd(&mut nic, &mut c, 1, x), Err(ErrorCode::Busy));
        assert_eq!(nic.cqs[&cq].qp_users, 1);
        for qpn in [recv, send] {
            let req = Request::DestroyQp { qpn };
            assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
        }
        assert_eq!(close_xrcd(&mut nic, &mut c, 1, x), Ok(()));
        assert_eq!(nic.cqs[&cq].qp_users, 0);
        assert_eq!(
            call(&mut nic, &mut c, 1, Request::DeallocPd { pd }, vec![]),
            Ok(Reply::Done)
        );
    }

    #[test]
    fn the_rings_an_xrc_qp_does_not_have_are_never_read() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, cq) = open(&mut nic, &mut c, 1);
        let x = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let (recv, mut rsq, mut rrq) = qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        let (send, _, mut srq) = qp(&mut nic, &mut c, 1, send_qp(pd, cq)).unwrap();
        to_rtr(&mut nic, &mut c, recv);
        to_rtr(&mut nic, &mut c, send);
        recv_to_rts(&mut nic, &mut c, recv);
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        };
        assert_eq!(modify(&mut nic, &mut c, send, rts), Ok(Reply::Done));
        // Garbage in every ring the QPs do not have, published.
        rsq.push(&SendWqe {
            opcode: 200,
            ..SendWqe::default()
        })
        .unwrap();
        rsq.publish();
        for p in [&mut rrq, &mut srq] {
            p.push(&RecvWqe {
                num_sge: 99,
                ..RecvWqe::default()
            })
            .unwrap();
            p.publish();
        }
        let local = nic.info.local;
        for qpn in [recv, send] {
            let e = nic.qps.get_mut(&qpn).unwrap();
            assert_eq!(e.drain_rings(Instant::ZERO, local, &mut c), 0);
            assert!(!e.needs_drain());
            assert_eq!(e.take_completions(), 0);
            assert_ne!(e.qp.state(), softnic_transport::qp::QpState::Err);
        }
        assert_eq!((c.wqe_invalid, c.ring_corrupt), (0, 0));
    }

    /// An XRC request packet (or, without `srqn`, an RC SEND) to `qpn`.
    fn packet(op: Opcode, qpn: u32, psn: u32, srqn: Option<u32>, payload: &[u8]) -> Vec<u8> {
        let mut repr = PacketRepr::new(BthRepr {
            ack_req: true,
            ..BthRepr::new(op, Qpn::new(qpn), Psn::new(psn))
        });
        repr.xrceth = srqn.map(|srqn| XrcEthRepr { srqn });
        repr.payload_len = payload.len();
        let mut buf = vec![0u8; 128 + payload.len()];
        let n = repr.emit(&mut buf, payload).expect("emit");
        buf.truncate(n);
        buf
    }

    /// What the runtime does with a packet that passed its ICRC check.
    fn receive(nic: &mut Nic, c: &mut NicCounters, bytes: &[u8]) {
        let pkt = PacketRepr::parse(bytes).expect("parse");
        let qpn = pkt.repr.bth.dest_qpn.value();
        let peer = PEER.parse().unwrap();
        let ip = ReceivedIp::default();
        super::super::runtime::deliver(nic, c, Instant::ZERO, peer, &ip, &pkt, None, qpn);
    }

    /// What the runtime's completion pass does for QP `qpn`: its completions into their
    /// CQs, which are then published.
    fn complete(nic: &mut Nic, c: &mut NicCounters, qpn: u32) -> usize {
        let Nic { qps, cqs, srqs, .. } = nic;
        let e = qps.get_mut(&qpn).unwrap();
        e.take_completions();
        let mut dirty = Vec::new();
        let k = e.deliver((Instant::ZERO, 0), c, cqs, srqs, &mut dirty);
        for h in dirty {
            cqs.get_mut(&h).unwrap().flush();
        }
        k
    }

    /// A memory region of `client` in `pd` at iova 0: its lkey, and the test's view.
    fn region(
        nic: &mut Nic,
        c: &mut NicCounters,
        client: u32,
        pd: Handle,
    ) -> (u32, memmap2::MmapRaw) {
        let fd = verbs_api::os::memfd("mr", 4096).unwrap();
        // The test's mapping, made before registering seals the memfd.
        let view = verbs_api::os::map_shared(fd.as_fd(), 4096).unwrap();
        let req = Request::RegMr {
            pd,
            len: 4096,
            access: 0xF,
            iova: 0,
        };
        let Ok(Reply::Mr { lkey, .. }) = call(nic, c, client, req, vec![fd]) else {
            panic!()
        };
        (lkey, view)
    }

    fn post(p: &mut Producer<RecvWqe>, wr_id: u64, lkey: u32, len: u32) {
        let mut w = RecvWqe {
            wr_id,
            num_sge: 1,
            ..RecvWqe::default()
        };
        w.sges[0] = Sge {
            addr: 0,
            length: len,
            lkey,
        };
        p.push(&w).unwrap();
        p.publish();
    }

    #[test]
    fn a_request_is_received_through_the_srq_it_names_if_that_is_of_the_qps_domain() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, _) = open(&mut nic, &mut c, 1);
        let (lkey, view) = region(&mut nic, &mut c, 1, pd);
        let x = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let elsewhere = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let (cq_a, mut cqe_a) = cq(&mut nic, &mut c, 1);
        let (cq_b, mut cqe_b) = cq(&mut nic, &mut c, 1);
        let (h_a, num_a, mut ring_a) = xrc_srq(&mut nic, &mut c, 1, pd, (x, cq_a)).unwrap();
        let (_, num_b, mut ring_b) = xrc_srq(&mut nic, &mut c, 1, pd, (x, cq_b)).unwrap();
        let (h_other, num_other, mut ring_other) =
            xrc_srq(&mut nic, &mut c, 1, pd, (elsewhere, cq_a)).unwrap();
        for r in [&mut ring_a, &mut ring_b, &mut ring_other] {
            post(r, 7, lkey, 4096);
        }
        let (qpn, ..) = qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        to_rtr(&mut nic, &mut c, qpn);
        let unused = (1..)
            .find(|n| ![num_a, num_b, num_other].contains(n))
            .unwrap();
        // Not an XRC request (no XRCETH): the QP drops it as another service's.
        let send = Opcode::XRC_SEND_ONLY;
        receive(
            &mut nic,
            &mut c,
            &packet(Opcode::RC_SEND_ONLY, qpn, 0, None, b"x"),
        );
        assert_eq!(c.rx_xrc_srq_refused, 0);
        assert_eq!(nic.qps[&qpn].qp.counters().drop_bad_opcode, 1);
        assert_eq!(
            nic.srqs.values().map(|s| s.srq.len()).sum::<usize>(),
            0,
            "nothing taken yet"
        );
        // SRQ B of the QP's domain: its WQE, its PD's memory, its CQ.
        receive(
            &mut nic,
            &mut c,
            &packet(send, qpn, 0, Some(num_b), b"hello xrc"),
        );
        assert_eq!(complete(&mut nic, &mut c, qpn), 1);
        assert_eq!(cqe_a.pop().unwrap(), None, "SRQ A's CQ");
        let got = cqe_b.pop().unwrap().expect("a completion on SRQ B's CQ");
        assert_eq!(
            (got.wr_id, got.status, got.opcode, got.byte_len, got.qp_num),
            (7, wc_status::SUCCESS, wc_opcode::RECV, 9, qpn)
        );
        // An unknown number, then (on a second QP) an SRQ of another domain: each QP
        // refuses the request (NAK Remote Access Error, Err) and takes no WQE.
        receive(&mut nic, &mut c, &packet(send, qpn, 1, Some(unused), b"x"));
        assert_eq!(c.rx_xrc_srq_refused, 1);
        let q = &nic.qps[&qpn].qp;
        assert_eq!(q.state(), softnic_transport::qp::QpState::Err);
        assert_eq!(q.counters().nak_remote_access_sent, 1);
        let (qpn2, ..) = qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        to_rtr(&mut nic, &mut c, qpn2);
        receive(
            &mut nic,
            &mut c,
            &packet(send, qpn2, 0, Some(num_other), b"x"),
        );
        assert_eq!(c.rx_xrc_srq_refused, 2);
        assert_eq!(
            nic.qps[&qpn2].qp.state(),
            softnic_transport::qp::QpState::Err
        );
        let taken: Vec<u64> = [h_a, h_other]
            .iter()
            .map(|h| nic.srqs[h].srq.counters().consumed)
            .collect();
        assert_eq!(
            taken,
            [0, 0],
            "SRQ A and the other domain's SRQ lent nothing"
        );
        // SAFETY: the test's own live mapping of the 4096-byte region.
        let bytes = unsafe { std::slice::from_raw_parts(view.as_ptr(), 9) };
        assert_eq!(bytes, b"hello xrc");
        assert_eq!(c.cqe_drop_no_cq, 0);
    }

    #[test]
    fn a_completion_whose_xrc_srq_is_gone_is_dropped_and_counted() {
        let (mut nic, mut c) = nic(Limits::default());
        let (pd, _) = open(&mut nic, &mut c, 1);
        let (lkey, _view) = region(&mut nic, &mut c, 1, pd);
        let x = open_xrcd(&mut nic, &mut c, 1, None, true).unwrap();
        let (cq_a, mut cqe_a) = cq(&mut nic, &mut c, 1);
        let (srq, num, mut ring) = xrc_srq(&mut nic, &mut c, 1, pd, (x, cq_a)).unwrap();
        post(&mut ring, 1, lkey, 4096);
        let (qpn, ..) = qp(&mut nic, &mut c, 1, recv_qp(x)).unwrap();
        to_rtr(&mut nic, &mut c, qpn);
        // A message's first packet: the QP holds the SRQ's WQE until its last.
        let first = Opcode(0xA0); // XRC SEND First
        receive(
            &mut nic,
            &mut c,
            &packet(first, qpn, 0, Some(num), &[1; 1024]),
        );
        assert_eq!(nic.srqs[&srq].srq.len(), 0, "the WQE is the QP's now");
        let req = Request::DestroySrq { srq };
        assert_eq!(call(&mut nic, &mut c, 1, req, vec![]), Ok(Reply::Done));
        // The QP's error flushes the WQE it held: its CQ is no longer known.
        let err = QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        };
        assert_eq!(modify(&mut nic, &mut c, qpn, err), Ok(Reply::Done));
        assert_eq!(complete(&mut nic, &mut c, qpn), 0);
        assert_eq!(c.cqe_drop_no_cq, 1);
        assert_eq!(cqe_a.pop().unwrap(), None);
    }
}
