//! The IBTA communication manager (Vol 1 ch. 12), sans-IO: one [`Cm`] per NIC, fed the
//! CM MADs that arrive on QP1, the consumer's calls (listen, connect, accept, reject,
//! disconnect) and the current time; it gives back MADs to send ([`Cm::poll_transmit`]),
//! consumer events ([`Cm::poll_event`]) and QP transitions to apply
//! ([`Cm::poll_qp_action`]), and the next instant it wants [`Cm::handle_timeout`].
//!
//! * [`id`] — one connection's state (IBTA 12.9 state diagram, RC only);
//! * [`active`] — REQ out, REP/REJ/MRA in, RTU out;
//! * [`passive`] — REQ in (listeners, duplicate REQs, REJ "invalid service ID"), REP
//!   out, RTU in;
//! * [`close`] — DREQ/DREP and TimeWait;
//! * [`sidr`] — SIDR REQ/REP, service ID resolution for UD (`RDMA_PS_UDP`);
//! * [`timer`] — response timeouts and bounded retries (IBTA 12.4, 12.6.5 "Max CM
//!   Retries").
//!
//! Trust: every MAD is untrusted. A message is applied only to the connection whose
//! *local* communication ID it names, only in a state where that message is expected,
//! only from the peer IP address the connection was made with, and (after the REP)
//! only if it also names the peer's communication ID. Anything else is dropped and
//! counted in [`CmCounters`], so a forged REP/RTU/DREQ for another connection cannot
//! move a QP. (Like every IB CM, this cannot stop a forger on the peer's own address
//! who guesses a 32-bit random communication ID.)

pub mod active;
pub mod close;
pub mod id;
pub mod passive;
mod qp_attr;
pub mod sidr;
pub mod timer;

#[cfg(any(test, feature = "testing"))]
pub mod fuzzing;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use wire::cm::{CmMadRepr, CmMessage};

use crate::time::Instant;
pub use active::Route;
pub use id::{CmState, CmTransport, ConnParams, PeerParams};

/// A connection identifier's handle, chosen by the NIC (unique per [`Cm`]).
pub type IdHandle = u32;

/// Most MADs waiting to be sent; more are dropped (and counted): the peer retries.
pub const MAX_QUEUED: usize = 1024;

/// What the consumer learns (`rdma_cm_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ reached a listener; `id` is the new connection (state ReqRcvd).
    ConnectRequest {
        /// The listening id.
        listener: IdHandle,
        /// The new connection's id.
        id: IdHandle,
        /// What the peer asked for (private data after the IP CM header).
        peer: PeerParams,
    },
    /// The connection is established (RTU sent or received).
    Established {
        /// The id.
        id: IdHandle,
        /// The peer's parameters from the REP on the active side; on the passive side
        /// none (all zero, no private data), as Linux's CM reports an RTU.
        peer: PeerParams,
    },
    /// The peer answered with a REJ.
    Rejected {
        /// The id.
        id: IdHandle,
        /// The REJ's reason.
        reason: u16,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// The REQ (active) or REP (passive) was retried until Max CM Retries ran out.
    Unreachable {
        /// The id.
        id: IdHandle,
    },
    /// The connection is closed (DREQ received, or our DREQ answered or timed out).
    Disconnected {
        /// The id.
        id: IdHandle,
    },
    /// A SIDR REP answered our SIDR REQ with a UD QP (`ESTABLISHED` with
    /// `param.ud` in librdmacm).
    UdResolved {
        /// The id.
        id: IdHandle,
        /// The service's UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// Its NIC.
        dest: SocketAddr,
        /// The SIDR REP's private data (136 bytes).
        private_data: Vec<u8>,
    },
    /// The QP could not be moved to RTR/RTS; the connection was refused.
    ConnectError {
        /// The id.
        id: IdHandle,
    },
    /// The connection left TimeWait.
    TimewaitExit {
        /// The id.
        id: IdHandle,
    },
}

/// A QP transition the NIC must apply for a connection (IBTA 12.9.6: the CM moves the
/// QP to RTR when it accepts or sees the REP, to RTS before sending the REP or RTU, and
/// to ERR on a disconnect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAction {
    /// The connection.
    pub id: IdHandle,
    /// The QP.
    pub qpn: u32,
    /// The transition.
    pub step: QpStep,
}

/// One transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpStep {
    /// INIT → RTR towards the peer.
    Rtr {
        /// The peer's QPN.
        dest_qpn: u32,
        /// The first PSN expected from the peer.
        rq_psn: u32,
        /// Path MTU (IBTA encoding, 1 = 256 … 5 = 4096).
        path_mtu: u8,
        /// The peer's address (its NIC's IP; port = the peer's RoCE UDP port).
        dest: SocketAddr,
        /// The path's traffic class: the IP TOS of the QP's packets.
        traffic_class: u8,
        /// READ/atomics this QP serves at once.
        max_dest_rd_atomic: u8,
        /// RNR NAK timer this QP advertises (IBTA table 45 encoding).
        min_rnr_timer: u8,
    },
    /// RTR → RTS.
    Rts {
        /// The first PSN this QP sends.
        sq_psn: u32,
        /// Local ACK timeout (4.096 µs × 2^n).
        timeout: u8,
        /// Transport retry count.
        retry_cnt: u8,
        /// RNR retry count.
        rnr_retry: u8,
        /// READ/atomics this QP issues at once.
        max_rd_atomic: u8,
    },
    /// → ERR (outstanding work requests flush).
    Err,
}

/// A MAD to send to QP1 of `dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The peer NIC (IP address and RoCE UDP port).
    pub dest: SocketAddr,
    /// The MAD.
    pub mad: CmMadRepr,
}

/// Why MADs were dropped, and what the CM did. Every drop has its own counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs received (parsed as CM messages).
    pub rx_mads: u64,
    /// MADs sent (including retries).
    pub tx_mads: u64,
    /// MADs resent after a timeout.
    pub tx_retries: u64,
    /// MADs not sent because the send queue was full.
    pub tx_drop_queue_full: u64,
    /// Drop: names no connection of ours (unknown local communication ID).
    pub rx_drop_unknown_comm_id: u64,
    /// Drop: from another IP address than the connection's peer.
    pub rx_drop_wrong_peer: u64,
    /// Drop: names our connection but not the peer's communication ID.
    pub rx_drop_wrong_remote_comm_id: u64,
    /// Drop: a message the connection's state does not expect (IBTA 12.9: ignored).
    pub rx_drop_unexpected: u64,
    /// Drop: a REQ for a transport other than RC and XRC, or with a field out of range.
    pub rx_drop_bad_req: u64,
    /// REQs answered with REJ "consumer reject" because the listener takes another
    /// transport (an XRC REQ to an RC listener, or the reverse), as Linux's CM refuses
    /// them before its consumer sees them.
    pub rej_wrong_transport: u64,
    /// Drop: a REQ while the listener's backlog was full (no answer: the peer retries).
    pub rx_drop_backlog: u64,
    /// REQs answered with REJ "invalid service ID" (nobody listens).
    pub rej_no_listener: u64,
    /// Duplicate REQs/REPs/DREQs answered again.
    pub rx_duplicates: u64,
    /// Connections given up after Max CM Retries.
    pub timeouts: u64,
}

/// The sizes of a [`Cm`]'s tables ([`Cm::occupancy`]; test support).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    /// Ids (of every state, listeners and closed ones included).
    pub ids: usize,
    /// Service IDs listened on.
    pub listeners: usize,
    /// Local communication IDs indexed.
    pub comm_ids: usize,
    /// QPNs bound.
    pub qpns: usize,
    /// MADs, events and QP actions queued and not yet polled.
    pub queued: usize,
}

/// How the CM identifies itself and paces retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This NIC's address (IP and RoCE UDP port).
    pub local: SocketAddr,
    /// This NIC's CA GUID (REQ/REP "local CA GUID").
    pub ca_guid: u64,
    /// The CM response timeout we advertise and wait for, 4.096 µs × 2^n (Linux: 20,
    /// about 4.3 s).
    pub cm_response_timeout: u8,
    /// How many times a REQ, REP or DREQ is resent before giving up (Linux: 15).
    pub max_cm_retries: u8,
    /// Path MTU we offer (IBTA encoding).
    pub path_mtu: u8,
    /// How long a closed connection stays in TimeWait.
    pub timewait: core::time::Duration,
}

/// The communication manager of one NIC.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    ids: BTreeMap<IdHandle, id::CmId>,
    /// Service ID → listening id.
    listeners: BTreeMap<u64, IdHandle>,
    /// Our local communication ID → id.
    by_comm_id: BTreeMap<u32, IdHandle>,
    /// QPN → the id it is bound to.
    by_qpn: BTreeMap<u32, IdHandle>,
    tx: VecDeque<Transmit>,
    events: VecDeque<Event>,
    qp_actions: VecDeque<QpAction>,
    rng: u64,
    next_handle: IdHandle,
    counters: CmCounters,
}

/// Why a consumer call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No such id.
    NoSuchId,
    /// The id is not in a state that allows the call.
    InvalidState(CmState),
    /// Another id already listens on the service ID.
    AddressInUse,
    /// The QP is bound to another connection.
    QpInUse,
    /// Private data longer than the message carries.
    PrivateDataTooLong,
    /// An accept whose QP runs another transport than the REQ asked for.
    WrongTransport,
}

impl Cm {
    /// A CM with no ids. `seed` seeds communication IDs and transaction IDs (pass
    /// randomness: a guessable ID lets an on-path forger name our connections).
    pub fn new(cfg: CmConfig, seed: u64) -> Cm {
        Cm {
            cfg,
            ids: BTreeMap::new(),
            listeners: BTreeMap::new(),
            by_comm_id: BTreeMap::new(),
            by_qpn: BTreeMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            qp_actions: VecDeque::new(),
            rng: seed | 1,
            next_handle: 1,
            counters: CmCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// How many entries each of the CM's tables holds (test support: the hostile-input
    /// driver in [`fuzzing`] bounds them).
    #[cfg(any(test, feature = "testing"))]
    pub fn occupancy(&self) -> Occupancy {
        Occupancy {
            ids: self.ids.len(),
            listeners: self.listeners.len(),
            comm_ids: self.by_comm_id.len(),
            qpns: self.by_qpn.len(),
            queued: self.tx.len() + self.events.len() + self.qp_actions.len(),
        }
    }

    /// An id's state.
    pub fn state(&self, id: IdHandle) -> Option<CmState> {
        self.ids.get(&id).map(|c| c.state)
    }

    /// The transport a connection request asked for (a passive id's REQ), once known.
    pub fn requested_transport(&self, id: IdHandle) -> Option<CmTransport> {
        let c = self.ids.get(&id)?;
        c.listener.is_some().then_some(c.theirs.transport)
    }

    /// Where an id's peer NIC receives RoCE packets, once known.
    pub fn peer(&self, id: IdHandle) -> Option<SocketAddr> {
        self.ids.get(&id).and_then(|c| c.peer)
    }

    /// A new id, not listening or connected (`rdma_create_id`).
    pub fn create_id(&mut self) -> IdHandle {
        let h = self.alloc_handle();
        self.ids.insert(h, id::CmId::new(h));
        h
    }

    /// Forgets an id at once (`rdma_destroy_id`): a connected id sends a DREQ first
    /// (without waiting for the DREP), a connection request not yet answered is
    /// rejected (consumer reject; a SIDR request, SIDR REP "reject", as Linux's
    /// `cm_destroy_id` does) — which also frees its listener's backlog slot —, a
    /// listener stops listening.
    pub fn destroy_id(&mut self, now: Instant, h: IdHandle) {
        match self.ids.get(&h).map(|c| c.state) {
            Some(CmState::Established) => {
                let _ = self.disconnect(now, h, &[]);
            }
            Some(CmState::ReqRcvd) => {
                let _ = self.reject(h, &[]);
            }
            Some(CmState::SidrReqRcvd) => {
                let _ = self.sidr_reply(h, None, &[]);
            }
            _ => {}
        }
        self.forget(h);
    }

    /// Drops an id and every index entry pointing at it.
    fn forget(&mut self, h: IdHandle) {
        if let Some(c) = self.ids.remove(&h) {
            // Only if still its own: a closed id's comm ID leaves the index at the end
            // of TimeWait and may then be drawn again for a new connection.
            if self.by_comm_id.get(&c.local_comm_id) == Some(&h) {
                self.by_comm_id.remove(&c.local_comm_id);
            }
            if let Some(q) = c.qpn {
                if self.by_qpn.get(&q) == Some(&h) {
                    self.by_qpn.remove(&q);
                }
            }
            if let Some(sid) = c.listen_service_id {
                if self.listeners.get(&sid) == Some(&h) {
                    self.listeners.remove(&sid);
                }
            }
        }
    }

    fn alloc_handle(&mut self) -> IdHandle {
        loop {
            let h = self.next_handle;
            self.next_handle = self.next_handle.wrapping_add(1).max(1);
            if !self.ids.contains_key(&h) {
                return h;
            }
        }
    }

    /// A random 32-bit value (xorshift64*; seeded by the NIC's CSPRNG).
    fn random(&mut self) -> u32 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }

    /// A fresh, non-zero local communication ID not in use.
    fn new_comm_id(&mut self) -> u32 {
        loop {
            let c = self.random();
            if c != 0 && !self.by_comm_id.contains_key(&c) {
                return c;
            }
        }
    }

    /// Listens on `service_id` for REQs of `transport` (`None`: any) with at most
    /// `backlog` connections waiting for accept/reject (`rdma_listen`).
    pub fn listen(
        &mut self,
        h: IdHandle,
        service_id: u64,
        transport: Option<CmTransport>,
        backlog: u32,
    ) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AddressInUse);
        }
        let c = self.ids.get_mut(&h).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::Idle {
            return Err(CmError::InvalidState(c.state));
        }
        c.state = CmState::Listen;
        c.listen_service_id = Some(service_id);
        c.listen_transport = transport;
        c.backlog = backlog.max(1);
        self.listeners.insert(service_id, h);
        Ok(())
    }

    /// Queues a MAD (drops and counts it when the queue is full: the peer retries).
    fn send(&mut self, dest: SocketAddr, mad: CmMadRepr) {
        if self.tx.len() >= MAX_QUEUED {
            self.counters.tx_drop_queue_full += 1;
            return;
        }
        self.counters.tx_mads += 1;
        self.tx.push_back(Transmit { dest, mad });
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next consumer event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next QP transition to apply. If applying it fails, call
    /// [`Cm::qp_failed`].
    pub fn poll_qp_action(&mut self) -> Option<QpAction> {
        self.qp_actions.pop_front()
    }

    /// Handles a CM MAD received from `peer` (the source IP and UDP port of the packet
    /// to QP1).
    pub fn handle_mad(&mut self, now: Instant, peer: SocketAddr, mad: &CmMadRepr) {
        self.counters.rx_mads += 1;
        let tid = mad.header.transaction_id;
        match &mad.msg {
            CmMessage::Req(m) => self.on_req(now, peer, tid, m),
            CmMessage::Rep(m) => self.on_rep(now, peer, m),
            CmMessage::Rtu(m) => self.on_rtu(peer, m),
            CmMessage::Rej(m) => self.on_rej(peer, m),
            CmMessage::Mra(m) => self.on_mra(now, peer, m),
            CmMessage::Dreq(m) => self.on_dreq(now, peer, tid, m),
            CmMessage::Drep(m) => self.on_drep(now, peer, m),
            CmMessage::SidrReq(m) => self.on_sidr_req(peer, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(peer, m),
        }
    }

    /// The connection a reply names by our local communication ID, if it comes from
    /// its peer's address and (once we know it) names the peer's communication ID.
    /// Counts the drop otherwise.
    fn lookup(&mut self, peer: SocketAddr, ours: u32, theirs: Option<u32>) -> Option<IdHandle> {
        let Some(&h) = self.by_comm_id.get(&ours) else {
            self.counters.rx_drop_unknown_comm_id += 1;
            return None;
        };
        let c = self.ids.get(&h)?;
        if c.peer.map(|p| p.ip()) != Some(peer.ip()) {
            self.counters.rx_drop_wrong_peer += 1;
            return None;
        }
        if let (Some(t), Some(known)) = (theirs, c.remote_comm_id) {
            if t != known {
                self.counters.rx_drop_wrong_remote_comm_id += 1;
                return None;
            }
        }
        Some(h)
    }

    /// Applying a QP transition failed (the consumer destroyed or moved the QP):
    /// the connection is given up — a REJ to the peer if it is not established yet, a
    /// DREQ if it is — and the consumer sees `Disconnected` or `Unreachable`.
    pub fn qp_failed(&mut self, now: Instant, h: IdHandle) {
        self.fail_connection(now, h);
    }
}

/// Where the peer of a REQ receives RoCE packets (its MADs and its QP's). rxe and
/// hardware send QP1 MADs from an ephemeral UDP source port but receive on 4791, so a
/// NIC on the standard port answers to the peer's IP at 4791. A NIC on another port
/// can only be talking to softnic NICs (which send from their RoCE port), so it answers
/// to the source port.
pub fn roce_dest(src: SocketAddr, local: SocketAddr) -> SocketAddr {
    if local.port() == wire::ROCEV2_UDP_PORT {
        SocketAddr::new(src.ip(), wire::ROCEV2_UDP_PORT)
    } else {
        src
    }
}
