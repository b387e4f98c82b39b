//! A hostile-input driver for the communication manager: any byte string is read as a
//! sequence of operations on one [`Cm`] (the *victim*), with oracles checked after
//! every one. The same driver runs under proptest in `cargo test` (random inputs, a few
//! hundred cases) and under libFuzzer (`fuzz/fuzz_targets/cm.rs`, coverage-guided).
//!
//! Why: the CM takes MADs from anyone on the network, and its example tests
//! (`cm/tests.rs`) only walk the ladders someone thought of. Here the victim faces
//!
//! * hostile peers on two addresses of their own, on the honest peer's IP (spoofed,
//!   from its port and another) and on the victim's own address, sending structured
//!   MADs with fields drawn from the input — communication IDs, QPNs and transaction IDs
//!   taken from what the victim and the honest peer really sent, service IDs the victim
//!   listens on, PSNs, private data lengths —, raw MADs (parsed by `wire`, skipped when
//!   they do not parse), replays of any MAD seen on the wire with one byte changed, and
//!   the *right* answer to a MAD the victim sent them (REP/REJ/MRA to its REQ,
//!   RTU/MRA/DREQ/REJ to its REP, DREP to its DREQ, DREQ after its RTU, SIDR REP);
//! * an honest second [`Cm`] it really connects with (which listens, accepts, answers
//!   SIDR, connects to the victim and disconnects), over a link that loses MADs when the
//!   input says so;
//! * a consumer calling every entry point on ids picked from the ones it created or was
//!   told of (create, destroy, listen with small backlogs, connect, SIDR request, accept,
//!   reject, SIDR reply, disconnect, `qp_failed`, `qp_steps`, `handle_timeout` before
//!   anything is due), with bogus handles and over-long private data now and then;
//! * time jumping by a drawn amount (nanoseconds, a response timeout, to the next
//!   deadline, or past every retry); due timers are handled at once.
//!
//! The oracles (a violation panics):
//!
//! * no panic anywhere in the CM;
//! * **round trip** — every MAD either CM sends emits and re-parses to the same repr
//!   (what it queued is what goes on the wire), and the victim only sends to addresses
//!   it connected to or heard from;
//! * **events and QP actions** — they name ids that exist (a QP action may name an id
//!   the same call destroyed), in the state the event implies (`ConnectRequest`: a new
//!   request under a listening id; `Established`; `Disconnected`: TimeWait;
//!   `Rejected`, `Unreachable`, `ConnectError`, `UdResolved`, `TimewaitExit`: Closed),
//!   RTR/RTS only for a connection in RepSent or Established; and what a MAD causes
//!   concerns only connections whose peer is the MAD's source IP (the trust rule of
//!   [`crate::cm`]);
//! * **bounded state** — the victim holds exactly the ids the consumer created or was
//!   told of and has not destroyed (no hidden ids, however many MADs arrive); requests
//!   waiting for the consumer never exceed the backlogs given to `listen`; a REQ or SIDR
//!   REQ is dropped for a full backlog only when the listener really has that many
//!   requests waiting (no leaked backlog slot); its indexes never outgrow its ids;
//! * **time** — after `handle_timeout(now)` the next deadline is not in the past;
//!   `handle_timeout` before anything is due does nothing; at one instant the timers
//!   settle;
//! * **termination** — the victim and the honest CM stop talking within 256 rounds,
//!   and when the input ends and the hostile peers fall silent, every timer of both
//!   runs out within a bound set by Max CM Retries: then every id of the victim is idle,
//!   listening, established, closed, or waiting for its consumer (no retry loop).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use wire::cm::{
    CmMadRepr, CmMessage, DrepRepr, DreqRepr, MessageKind, MraRepr, PathRepr, RejReason, RejRepr,
    RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, MAD_LEN,
};

use super::timer::timeout;
use super::{
    Cm, CmConfig, CmState, CmTransport, ConnParams, Event, IdHandle, QpStep, Route, Transmit,
};
use crate::time::{Duration, Instant};

/// Most operations one input drives.
pub const MAX_OPS: usize = 64;

/// The victim's IP.
pub const VICTIM_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The honest peer's IP (hostile peers spoof it too).
pub const HONEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The hostile peers' own IPs.
pub const HOSTILE_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 0, 0, 3), Ipv4Addr::new(10, 0, 0, 4)];
/// Service IDs the driver listens on and connects to: an RDMA_PS_TCP one, an
/// RDMA_PS_UDP one (the honest peer listens on both), one nobody else knows, and the
/// all-ones one.
pub const SERVICE_IDS: [u64; 4] = [0x0106_1c06, 0x0111_1c06, 0x0106_0001, u64::MAX];

/// Operation codes: the first byte of each operation, modulo [`OPS`].
pub mod op {
    /// `create_id`.
    pub const CREATE: u8 = 0;
    /// `destroy_id` (id).
    pub const DESTROY: u8 = 1;
    /// `listen` (id, service index, backlog).
    pub const LISTEN: u8 = 2;
    /// `connect` (id, destination index, service index, params).
    pub const CONNECT: u8 = 3;
    /// `sidr_request` (id, destination index, service index, private data).
    pub const SIDR_REQUEST: u8 = 4;
    /// `accept` (a requested id, params).
    pub const ACCEPT: u8 = 5;
    /// `reject` (a requested id, private data length).
    pub const REJECT: u8 = 6;
    /// `sidr_reply` (a requested id, answer, private data).
    pub const SIDR_REPLY: u8 = 7;
    /// `disconnect` (id, private data length).
    pub const DISCONNECT: u8 = 8;
    /// `qp_failed` (id).
    pub const QP_FAILED: u8 = 9;
    /// `qp_steps` (id, PSN).
    pub const QP_STEPS: u8 = 10;
    /// Time jumps (kind, amount); due timers are handled.
    pub const ADVANCE: u8 = 11;
    /// `handle_timeout` when nothing is due.
    pub const EARLY_TIMEOUT: u8 = 12;
    /// A structured MAD from a chosen source (source, kind, fields).
    pub const MAD: u8 = 13;
    /// A raw MAD from a chosen source (source, header, body).
    pub const RAW: u8 = 14;
    /// A MAD seen on the wire, one byte changed, from a chosen source.
    pub const REPLAY: u8 = 15;
    /// The right answer to a MAD the victim sent, from where it went (pick, kind).
    pub const ANSWER: u8 = 16;
    /// The honest peer connects (or sends a SIDR REQ) to the victim (service, kind).
    pub const HONEST_CONNECT: u8 = 17;
    /// The honest peer disconnects or destroys one of its ids (pick, kind).
    pub const HONEST_CLOSE: u8 = 18;
    /// The link between the victim and the honest peer loses the next 0-3 MADs.
    pub const LOSE: u8 = 19;
}

/// Number of operation codes.
pub const OPS: u8 = 20;

/// What one input reached (for seeds, statistics and the tests' coverage checks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Operations run.
    pub ops: u64,
    /// MADs handed to the victim.
    pub mads_in: u64,
    /// MADs the victim sent.
    pub mads_out: u64,
    /// Victim events, by kind.
    pub connect_requests: u64,
    /// `Established` events.
    pub established: u64,
    /// `Rejected` events.
    pub rejected: u64,
    /// `Unreachable` events.
    pub unreachable: u64,
    /// `Disconnected` events.
    pub disconnected: u64,
    /// `TimewaitExit` events.
    pub timewait_exits: u64,
    /// `UdResolved` events.
    pub ud_resolved: u64,
    /// `ConnectError` events.
    pub connect_errors: u64,
    /// REQs/SIDR REQs dropped for a full backlog.
    pub backlog_drops: u64,
    /// MADs the victim resent after a timeout.
    pub retries: u64,
    /// Most ids the victim held at once.
    pub max_ids: usize,
}

/// Runs one input; panics on any oracle violation.
pub fn run(data: &[u8]) -> Stats {
    let mut inp = Input { data };
    let mut d = Driver::new(&mut inp);
    while !inp.is_empty() && d.stats.ops < MAX_OPS as u64 {
        d.step(&mut inp);
    }
    d.finish();
    d.stats
}

/// The input, read front to back; zeros once it runs out.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        match n {
            0 => 0,
            1..=256 => usize::from(self.u8()) % n,
            _ => usize::from(self.u16()) % n,
        }
    }
    /// One of `pool` (most of the time, when it has any), a small value, or anything.
    fn pick_u32(&mut self, pool: &[u32]) -> u32 {
        let c = self.u8();
        match c % 4 {
            0 | 1 if !pool.is_empty() => pool[usize::from(c >> 2) % pool.len()],
            2 => u32::from(c >> 2) % 3,
            _ => self.u32(),
        }
    }
    /// Private data: `len` copies of one drawn byte.
    fn private_data(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        vec![self.u8(); len]
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let len = self.below(N + 1);
        let mut a = [0u8; N];
        a[..len].fill(self.u8());
        a
    }
}

fn push_capped<T: PartialEq>(v: &mut Vec<T>, x: T, cap: usize) {
    if v.contains(&x) {
        return;
    }
    if v.len() >= cap {
        v.remove(0);
    }
    v.push(x);
}

/// A MAD's (sender's communication ID, receiver's communication ID, a QPN it names).
fn comm_ids(m: &CmMessage) -> (u32, u32, Option<u32>) {
    match m {
        CmMessage::Req(r) => (r.local_comm_id, 0, Some(r.local_qpn)),
        CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id, Some(r.local_qpn)),
        CmMessage::Rtu(r) => (r.local_comm_id, r.remote_comm_id, None),
        CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id, None),
        CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id, None),
        CmMessage::Mra(r) => (r.local_comm_id, r.remote_comm_id, None),
        CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id, Some(r.remote_qpn)),
        CmMessage::SidrReq(r) => (r.request_id, 0, None),
        CmMessage::SidrRep(r) => (0, r.request_id, Some(r.qpn)),
    }
}

/// What the network delivers: `mad` emitted and parsed again (a repr with a field too
/// wide for the wire would not arrive as built). `None` if it does not parse.
fn through_wire(mad: &CmMadRepr) -> Option<CmMadRepr> {
    let mut buf = [0u8; MAD_LEN];
    mad.emit(&mut buf).ok()?;
    CmMadRepr::parse(&buf).ok()
}

/// The round-trip oracle.
fn check_round_trip(who: &str, t: &Transmit) {
    let mut buf = [0u8; MAD_LEN];
    assert_eq!(
        t.mad.emit(&mut buf),
        Ok(MAD_LEN),
        "{who}: {t:?} does not emit"
    );
    let back = CmMadRepr::parse(&buf);
    assert_eq!(
        back,
        Ok(t.mad),
        "{who}: a sent MAD does not re-parse to itself"
    );
}

fn is_waiting(s: Option<CmState>) -> bool {
    matches!(s, Some(CmState::ReqRcvd | CmState::SidrReqRcvd))
}

struct Driver {
    now: Instant,
    /// The victim.
    v: Cm,
    /// The honest peer.
    h: Cm,
    cfg: CmConfig,
    /// The victim's ids as its consumer knows them (created or announced, not destroyed).
    known: BTreeSet<IdHandle>,
    /// Announced requests → their listener.
    announced: BTreeMap<IdHandle, IdHandle>,
    /// The victim's listeners → the backlog `listen` was given (as the CM counts it).
    backlogs: BTreeMap<IdHandle, u32>,
    /// Service ID → the victim's listener on it.
    listening: BTreeMap<u64, IdHandle>,
    /// Sum of every backlog ever given.
    backlog_ever: u64,
    /// The id the current operation destroyed (QP actions may still name it).
    destroyed_now: Option<IdHandle>,
    /// Addresses the victim connected to or heard from.
    contacted: BTreeSet<IpAddr>,
    /// The honest peer's ids.
    h_ids: Vec<IdHandle>,
    h_next_qpn: u32,
    /// Recent MADs the victim sent, with their destinations.
    victim_sent: Vec<(SocketAddr, CmMadRepr)>,
    /// Recent MADs seen on the wire (either CM's, and the hostile ones delivered).
    wire: Vec<CmMadRepr>,
    /// The victim's communication IDs seen on the wire.
    ours: Vec<u32>,
    /// Peers' communication IDs seen on the wire.
    theirs: Vec<u32>,
    /// QPNs seen on the wire.
    qpns: Vec<u32>,
    /// Transaction IDs seen on the wire.
    tids: Vec<u64>,
    /// The victim's communication ID → its QPN (from its REQs and REPs).
    comm_qpn: BTreeMap<u32, u32>,
    /// MADs between the victim and the honest peer still to lose.
    lose: u8,
    /// `CM_FUZZ_TRACE` is set: print each operation and event.
    trace: bool,
    stats: Stats,
}

const POOL: usize = 16;

impl Driver {
    fn new(inp: &mut Input<'_>) -> Driver {
        let b = inp.u8();
        let port = if b & 1 == 0 {
            wire::ROCEV2_UDP_PORT
        } else {
            5000
        };
        let cfg = CmConfig {
            local: SocketAddr::new(VICTIM_IP.into(), port),
            ca_guid: 0x0200_0000_0000_0001,
            cm_response_timeout: (b >> 1) % 32,
            max_cm_retries: inp.u8() % 16,
            path_mtu: 1 + b % 5,
            timewait: [
                Duration::ZERO,
                Duration::from_micros(1),
                Duration::from_millis(50),
                Duration::from_secs(5),
            ][inp.below(4)],
        };
        let seed = u64::from(inp.u8()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let hcfg = CmConfig {
            local: SocketAddr::new(HONEST_IP.into(), wire::ROCEV2_UDP_PORT),
            ca_guid: 0x0200_0000_0000_0002,
            ..cfg
        };
        let mut h = Cm::new(hcfg, !seed);
        for sid in &SERVICE_IDS[..2] {
            let l = h.create_id();
            h.listen(l, *sid, None, 4).expect("the honest peer listens");
        }
        Driver {
            now: Instant::from_nanos(1_000_000),
            v: Cm::new(cfg, seed),
            h,
            cfg,
            known: BTreeSet::new(),
            announced: BTreeMap::new(),
            backlogs: BTreeMap::new(),
            listening: BTreeMap::new(),
            backlog_ever: 0,
            destroyed_now: None,
            contacted: BTreeSet::new(),
            h_ids: Vec::new(),
            h_next_qpn: 0x200,
            victim_sent: Vec::new(),
            wire: Vec::new(),
            ours: Vec::new(),
            theirs: Vec::new(),
            qpns: Vec::new(),
            tids: Vec::new(),
            comm_qpn: BTreeMap::new(),
            lose: 0,
            trace: std::env::var_os("CM_FUZZ_TRACE").is_some(),
            stats: Stats::default(),
        }
    }

    fn honest(&self) -> SocketAddr {
        self.h.config().local
    }

    /// Where a hostile MAD may claim to come from.
    fn source(&self, inp: &mut Input<'_>) -> SocketAddr {
        let port = wire::ROCEV2_UDP_PORT;
        match inp.below(6) {
            0 => self.honest(),
            1 => SocketAddr::new(HONEST_IP.into(), 33333),
            2 => SocketAddr::new(HOSTILE_IPS[0].into(), port),
            3 => SocketAddr::new(HOSTILE_IPS[1].into(), 49152),
            4 => SocketAddr::new(HOSTILE_IPS[1].into(), port),
            _ => self.cfg.local,
        }
    }

    /// Where the victim may connect.
    fn destination(&self, inp: &mut Input<'_>) -> SocketAddr {
        match inp.below(3) {
            0 => self.honest(),
            i => SocketAddr::new(HOSTILE_IPS[i - 1].into(), wire::ROCEV2_UDP_PORT),
        }
    }

    /// One of the victim's ids the consumer knows, or now and then one it does not.
    fn pick(&self, inp: &mut Input<'_>) -> IdHandle {
        let i = inp.below(self.known.len() + 1);
        self.known.iter().nth(i).copied().unwrap_or(0xDEAD)
    }

    /// A request the victim announced, if any is left.
    fn pick_request(&self, inp: &mut Input<'_>) -> IdHandle {
        if self.announced.is_empty() {
            return self.pick(inp);
        }
        let i = inp.below(self.announced.len());
        self.announced.keys().nth(i).copied().unwrap_or(0xDEAD)
    }

    fn params(&self, inp: &mut Input<'_>, max_private: usize) -> ConnParams {
        let qpn = 0x100 + inp.below(4) as u32;
        let psn = inp.u32();
        let responder = inp.u8();
        ConnParams {
            // The responder-resources byte's top values ask for XRC.
            transport: if responder >= 0xF0 {
                CmTransport::Xrc
            } else {
                CmTransport::Rc
            },
            qpn,
            psn,
            responder_resources: responder % 17,
            initiator_depth: inp.u8() % 17,
            retry_count: inp.u8(),
            rnr_retry_count: inp.u8(),
            flow_control: inp.bool(),
            srq: inp.bool(),
            // One byte over the limit now and then: refused.
            private_data: inp.private_data(max_private + 1),
        }
    }

    fn route(&self, dest: SocketAddr) -> Route {
        Route {
            dest,
            local_gid: [1; 16],
            remote_gid: [2; 16],
            traffic_class: 0,
        }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        self.stats.ops += 1;
        self.destroyed_now = None;
        let now = self.now;
        let code = inp.u8() % OPS;
        if self.trace {
            eprintln!("op {code} at {now:?}, known {:?}", self.known);
        }
        match code {
            op::CREATE => {
                let h = self.v.create_id();
                assert!(self.known.insert(h), "create_id handed out a live handle");
            }
            op::DESTROY => {
                let h = self.pick(inp);
                self.v.destroy_id(now, h);
                assert_eq!(self.v.state(h), None, "a destroyed id is gone");
                self.known.remove(&h);
                self.announced.remove(&h);
                self.backlogs.remove(&h);
                self.listening.retain(|_, l| *l != h);
                self.destroyed_now = Some(h);
            }
            op::LISTEN => {
                let h = self.pick(inp);
                let sid = SERVICE_IDS[inp.below(SERVICE_IDS.len())];
                let b = inp.u8();
                let backlog = u32::from(b % 4);
                // The byte's upper bits pick the transport the listener takes.
                let transport = match (b >> 2) % 3 {
                    0 => None,
                    1 => Some(CmTransport::Rc),
                    _ => Some(CmTransport::Xrc),
                };
                if self.v.listen(h, sid, transport, backlog).is_ok() {
                    self.backlogs.insert(h, backlog.max(1));
                    self.listening.insert(sid, h);
                    self.backlog_ever += u64::from(backlog.max(1));
                }
            }
            op::CONNECT => {
                let h = self.pick(inp);
                let dest = self.destination(inp);
                let sid = SERVICE_IDS[inp.below(SERVICE_IDS.len())];
                let p = self.params(inp, wire::cm::REQ_PRIVATE_DATA_LEN);
                self.contacted.insert(dest.ip());
                let _ = self.v.connect(now, h, self.route(dest), sid, p);
            }
            op::SIDR_REQUEST => {
                let h = self.pick(inp);
                let dest = self.destination(inp);
                let sid = SERVICE_IDS[inp.below(SERVICE_IDS.len())];
                let pd = inp.private_data(wire::cm::SIDR_REQ_PRIVATE_DATA_LEN + 1);
                self.contacted.insert(dest.ip());
                let _ = self.v.sidr_request(now, h, self.route(dest), sid, &pd);
            }
            op::ACCEPT => {
                let h = self.pick_request(inp);
                let p = self.params(inp, wire::cm::REP_PRIVATE_DATA_LEN);
                let _ = self.v.accept(now, h, p);
            }
            op::REJECT => {
                let h = self.pick_request(inp);
                let pd = inp.private_data(wire::cm::REJ_PRIVATE_DATA_LEN + 1);
                let _ = self.v.reject(h, &pd);
            }
            op::SIDR_REPLY => {
                let h = self.pick_request(inp);
                let answer = inp.bool().then(|| (inp.u32(), inp.u32()));
                let pd = inp.private_data(wire::cm::SIDR_REP_PRIVATE_DATA_LEN + 1);
                let _ = self.v.sidr_reply(h, answer, &pd);
            }
            op::DISCONNECT => {
                let h = self.pick(inp);
                let pd = inp.private_data(wire::cm::DREQ_PRIVATE_DATA_LEN + 1);
                let _ = self.v.disconnect(now, h, &pd);
            }
            op::QP_FAILED => {
                let h = self.pick(inp);
                self.v.qp_failed(now, h);
            }
            op::QP_STEPS => {
                let h = self.pick(inp);
                let _ = self.v.qp_steps(h, inp.u32());
            }
            op::ADVANCE => self.advance(inp),
            op::EARLY_TIMEOUT => self.early_timeout(),
            op::MAD => {
                let src = self.source(inp);
                let mad = self.structured(inp);
                if let Some(m) = through_wire(&mad) {
                    self.victim_rx(src, &m);
                }
            }
            op::RAW => {
                let src = self.source(inp);
                let mut buf = [0u8; MAD_LEN];
                if inp.bool() {
                    // A valid CM header, so that the body is what gets tested.
                    buf[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                    buf[8..16].copy_from_slice(&inp.u64().to_be_bytes());
                    buf[16..18].copy_from_slice(&(0x10 + inp.below(11) as u16).to_be_bytes());
                } else {
                    for b in &mut buf[..24] {
                        *b = inp.u8();
                    }
                }
                let n = inp.below(MAD_LEN - 24 + 1);
                for b in &mut buf[24..24 + n] {
                    *b = inp.u8();
                }
                if let Ok(m) = CmMadRepr::parse(&buf) {
                    self.victim_rx(src, &m);
                }
            }
            op::REPLAY => {
                let src = self.source(inp);
                let i = inp.below(self.wire.len());
                let (at, x) = (inp.below(MAD_LEN), inp.u8());
                if let Some(m) = self.wire.get(i).copied() {
                    let mut buf = [0u8; MAD_LEN];
                    if m.emit(&mut buf).is_ok() {
                        buf[at] ^= x;
                        if let Ok(m) = CmMadRepr::parse(&buf) {
                            self.victim_rx(src, &m);
                        }
                    }
                }
            }
            op::ANSWER => self.answer(inp),
            op::HONEST_CONNECT => {
                let sid = SERVICE_IDS[inp.below(SERVICE_IDS.len())];
                let id = self.h.create_id();
                self.h_ids.push(id);
                let route = Route {
                    dest: self.cfg.local,
                    local_gid: [2; 16],
                    remote_gid: [1; 16],
                    // Constant: drawing it from the input would move what every
                    // seed's later bytes mean (`seeds_reach_what_they_are_named_for`).
                    traffic_class: 0x48,
                };
                if inp.bool() {
                    let _ = self.h.sidr_request(now, id, route, sid, b"sidr");
                } else {
                    let p = ConnParams {
                        qpn: self.next_honest_qpn(),
                        psn: inp.u32() & 0xFF_FFFF,
                        responder_resources: 1,
                        initiator_depth: 1,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        private_data: b"honest".to_vec(),
                        ..ConnParams::default()
                    };
                    let _ = self.h.connect(now, id, route, sid, p);
                }
            }
            op::HONEST_CLOSE => {
                let i = inp.below(self.h_ids.len());
                let destroy = inp.bool();
                if let Some(&id) = self.h_ids.get(i) {
                    if destroy {
                        self.h.destroy_id(now, id);
                        self.h_ids.remove(i);
                    } else {
                        let _ = self.h.disconnect(now, id, &[]);
                    }
                }
                self.drain_honest();
            }
            _ => self.lose = inp.u8() % 4,
        }
        self.drain_victim(None);
        self.pump();
        self.check_state();
    }

    fn next_honest_qpn(&mut self) -> u32 {
        self.h_next_qpn += 1;
        self.h_next_qpn
    }

    /// A MAD of any kind with fields drawn from the input and the pools.
    fn structured(&self, inp: &mut Input<'_>) -> CmMadRepr {
        let kind = inp.below(9);
        let tid = match inp.below(3) {
            0 if !self.tids.is_empty() => self.tids[inp.below(self.tids.len())],
            _ => inp.u64(),
        };
        let theirs = inp.pick_u32(&self.theirs);
        let ours = inp.pick_u32(&self.ours);
        let qpn = inp.pick_u32(&self.qpns) & 0xFF_FFFF;
        let sid = match inp.below(5) {
            4 => inp.u64(),
            i => SERVICE_IDS[i],
        };
        let msg = match kind {
            0 => CmMessage::Req(xrc_when_extended(ReqRepr {
                local_comm_id: theirs,
                vendor_id: 0,
                service_id: sid,
                local_ca_guid: inp.u64(),
                local_qkey: 0,
                local_qpn: qpn,
                responder_resources: inp.u8(),
                local_eecn: 0,
                initiator_depth: inp.u8(),
                remote_eecn: 0,
                remote_cm_response_timeout: inp.u8(),
                // Mostly RC; now and then UC/RD/XRC.
                transport_type: inp.u8().saturating_sub(0xFC),
                end_to_end_flow_control: inp.bool(),
                starting_psn: inp.u32(),
                local_cm_response_timeout: inp.u8(),
                retry_count: inp.u8(),
                pkey: 0xFFFF,
                path_mtu: inp.u8(),
                rdc_exists: false,
                rnr_retry_count: inp.u8(),
                max_cm_retries: inp.u8(),
                srq: inp.bool(),
                extended_transport_type: 0,
                primary: PathRepr {
                    local_ack_timeout: inp.u8(),
                    ..PathRepr::default()
                },
                alternate: PathRepr::default(),
                sap_supported: false,
                private_data: inp.array(),
            })),
            1 => CmMessage::Rep(RepRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                local_qkey: 0,
                local_qpn: qpn,
                local_eecn: 0,
                starting_psn: inp.u32(),
                vendor_id: 0,
                responder_resources: inp.u8(),
                initiator_depth: inp.u8(),
                target_ack_delay: inp.u8(),
                failover_accepted: inp.u8(),
                end_to_end_flow_control: inp.bool(),
                rnr_retry_count: inp.u8(),
                srq: inp.bool(),
                local_ca_guid: inp.u64(),
                private_data: inp.array(),
            }),
            2 => CmMessage::Rtu(RtuRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                private_data: inp.array(),
            }),
            3 => CmMessage::Rej(RejRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                message_rejected: kind2(inp.u8()),
                reject_info_length: inp.u8(),
                reason: RejReason(inp.u16()),
                ari: inp.array(),
                private_data: inp.array(),
            }),
            4 => CmMessage::Mra(MraRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                message_mraed: kind2(inp.u8()),
                service_timeout: inp.u8(),
                private_data: inp.array(),
            }),
            5 => CmMessage::Dreq(DreqRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                remote_qpn: qpn,
                private_data: inp.array(),
            }),
            6 => CmMessage::Drep(DrepRepr {
                local_comm_id: theirs,
                remote_comm_id: ours,
                private_data: inp.array(),
            }),
            7 => CmMessage::SidrReq(SidrReqRepr {
                request_id: theirs,
                pkey: 0xFFFF,
                service_id: sid,
                private_data: inp.array(),
            }),
            _ => CmMessage::SidrRep(sidr_rep(ours, SidrStatus(inp.u8() % 5), qpn, sid)),
        };
        CmMadRepr::new(tid, msg)
    }

    /// The right answer to a MAD the victim sent, from where it went.
    fn answer(&mut self, inp: &mut Input<'_>) {
        let i = inp.below(self.victim_sent.len());
        let (choice, fresh, psn) = (inp.u8() % 4, inp.u32() | 1, inp.u32() & 0xFF_FFFF);
        let Some(&(to, sent)) = self.victim_sent.get(i) else {
            return;
        };
        let tid = sent.header.transaction_id;
        let msg = match sent.msg {
            CmMessage::Req(r) => match choice {
                0 | 1 => CmMessage::Rep(RepRepr {
                    local_comm_id: fresh,
                    remote_comm_id: r.local_comm_id,
                    local_qkey: 0,
                    local_qpn: 0x400 + (fresh & 0xF),
                    local_eecn: 0,
                    starting_psn: psn,
                    vendor_id: 0,
                    responder_resources: 1,
                    initiator_depth: 1,
                    target_ack_delay: 0,
                    failover_accepted: 0,
                    end_to_end_flow_control: false,
                    rnr_retry_count: 7,
                    srq: false,
                    local_ca_guid: 3,
                    private_data: [0; wire::cm::REP_PRIVATE_DATA_LEN],
                }),
                2 => CmMessage::Rej(rej(fresh, r.local_comm_id, MessageKind::Req)),
                _ => CmMessage::Mra(mra(fresh, r.local_comm_id, MessageKind::Req, psn)),
            },
            CmMessage::Rep(r) => match choice {
                0 => CmMessage::Rtu(RtuRepr {
                    local_comm_id: r.remote_comm_id,
                    remote_comm_id: r.local_comm_id,
                    private_data: [0; wire::cm::RTU_PRIVATE_DATA_LEN],
                }),
                1 => CmMessage::Mra(mra(
                    r.remote_comm_id,
                    r.local_comm_id,
                    MessageKind::Rep,
                    psn,
                )),
                2 => CmMessage::Dreq(dreq(r.remote_comm_id, r.local_comm_id, r.local_qpn)),
                _ => CmMessage::Rej(rej(r.remote_comm_id, r.local_comm_id, MessageKind::Rep)),
            },
            CmMessage::Rtu(r) => {
                let qpn = self.comm_qpn.get(&r.local_comm_id).copied().unwrap_or(0);
                CmMessage::Dreq(dreq(r.remote_comm_id, r.local_comm_id, qpn))
            }
            CmMessage::Dreq(r) => CmMessage::Drep(DrepRepr {
                local_comm_id: r.remote_comm_id,
                remote_comm_id: r.local_comm_id,
                private_data: [0; wire::cm::RTU_PRIVATE_DATA_LEN],
            }),
            CmMessage::SidrReq(r) => CmMessage::SidrRep(sidr_rep(
                r.request_id,
                SidrStatus(choice % 3),
                0x500,
                r.service_id,
            )),
            _ => return,
        };
        if let Some(m) = through_wire(&CmMadRepr::new(tid, msg)) {
            self.victim_rx(to, &m);
        }
    }

    fn advance(&mut self, inp: &mut Input<'_>) {
        let resp = timeout(self.cfg.cm_response_timeout);
        let every_retry =
            (timeout(31) + resp) * (u32::from(self.cfg.max_cm_retries) + 2) + self.cfg.timewait;
        let next = [self.v.poll_timeout(), self.h.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let d = match inp.below(6) {
            0 => Duration::from_nanos(u64::from(inp.u8())),
            1 => next.map_or(Duration::ZERO, |t| t - self.now),
            2 => resp,
            3 => every_retry,
            4 => Duration::from_nanos(u64::from(inp.u32())),
            _ => Duration::from_millis(u64::from(inp.u16())),
        };
        self.now = self.now + d;
        self.service();
    }

    /// Handles every due timer of both CMs at `now`, until none is due.
    fn service(&mut self) {
        for _ in 0..1000 {
            let due = |t: Option<Instant>, now| t.is_some_and(|t| t <= now);
            let (v_due, h_due) = (
                due(self.v.poll_timeout(), self.now),
                due(self.h.poll_timeout(), self.now),
            );
            if !v_due && !h_due {
                return;
            }
            if v_due {
                let before = self.v.counters().tx_retries;
                self.v.handle_timeout(self.now);
                self.stats.retries += self.v.counters().tx_retries - before;
                if let Some(t) = self.v.poll_timeout() {
                    assert!(
                        t >= self.now,
                        "victim: a deadline in the past after handle_timeout"
                    );
                }
                self.drain_victim(None);
            }
            if h_due {
                self.h.handle_timeout(self.now);
                if let Some(t) = self.h.poll_timeout() {
                    assert!(
                        t >= self.now,
                        "honest: a deadline in the past after handle_timeout"
                    );
                }
                self.drain_honest();
            }
            self.pump();
        }
        panic!("timers keep firing at one instant");
    }

    /// `handle_timeout` before anything is due must change nothing.
    fn early_timeout(&mut self) {
        if self.v.poll_timeout().is_some_and(|t| t <= self.now) {
            return;
        }
        let (c, o) = (*self.v.counters(), self.v.occupancy());
        let states: Vec<_> = self.known.iter().map(|&h| self.v.state(h)).collect();
        self.v.handle_timeout(self.now);
        assert_eq!(
            *self.v.counters(),
            c,
            "handle_timeout with nothing due did something"
        );
        assert_eq!(
            self.v.occupancy(),
            o,
            "handle_timeout with nothing due did something"
        );
        let after: Vec<_> = self.known.iter().map(|&h| self.v.state(h)).collect();
        assert_eq!(states, after, "handle_timeout with nothing due moved an id");
    }

    /// Hands a MAD from `src` to the victim and checks what it caused.
    fn victim_rx(&mut self, src: SocketAddr, mad: &CmMadRepr) {
        if self.trace {
            let (l, r, q) = comm_ids(&mad.msg);
            eprintln!(
                "  rx {} from {src} ({l:#x} -> {r:#x}, qpn {q:?})",
                mad.msg.name()
            );
        }
        self.stats.mads_in += 1;
        self.contacted.insert(src.ip());
        self.note_wire(mad);
        let drops = self.v.counters().rx_drop_backlog;
        self.v.handle_mad(self.now, src, mad);
        if self.v.counters().rx_drop_backlog > drops {
            self.stats.backlog_drops += 1;
            let sid = match &mad.msg {
                CmMessage::Req(r) => r.service_id,
                CmMessage::SidrReq(r) => r.service_id,
                m => panic!("a {} counted as a backlog drop", m.name()),
            };
            let l = *self
                .listening
                .get(&sid)
                .expect("a backlog drop without a listener");
            let waiting = self
                .announced
                .iter()
                .filter(|&(&id, &lis)| lis == l && is_waiting(self.v.state(id)))
                .count();
            let backlog = self.backlogs.get(&l).copied().unwrap_or(0);
            assert!(
                waiting >= backlog as usize,
                "listener {l} dropped a request for a full backlog ({backlog}) with only \
                 {waiting} requests waiting: a leaked backlog slot"
            );
        }
        self.drain_victim(Some(src.ip()));
    }

    fn note_wire(&mut self, mad: &CmMadRepr) {
        push_capped(&mut self.wire, *mad, 32);
        push_capped(&mut self.tids, mad.header.transaction_id, POOL);
    }

    /// Polls the victim's events and QP actions and checks them; `src` is the IP of the
    /// MAD that caused them, if one did.
    fn drain_victim(&mut self, src: Option<IpAddr>) {
        let attributed = |v: &Cm, id: IdHandle| {
            if let Some(ip) = src {
                let peer = v.peer(id).map(|p| p.ip());
                assert_eq!(
                    peer,
                    Some(ip),
                    "a MAD from {ip} moved id {id} of peer {peer:?}"
                );
            }
        };
        while let Some(ev) = self.v.poll_event() {
            let id = match &ev {
                Event::ConnectRequest { id, .. }
                | Event::Established { id, .. }
                | Event::Rejected { id, .. }
                | Event::Unreachable { id }
                | Event::Disconnected { id }
                | Event::UdResolved { id, .. }
                | Event::ConnectError { id }
                | Event::TimewaitExit { id } => *id,
            };
            let state = self.v.state(id);
            if self.trace {
                eprintln!("  event {ev:?} (from {src:?}; id now {state:?})");
            }
            assert!(state.is_some(), "{ev:?} names no id");
            attributed(&self.v, id);
            let want: &[CmState] = match &ev {
                Event::ConnectRequest { listener, .. } => {
                    assert_eq!(self.v.state(*listener), Some(CmState::Listen), "{ev:?}");
                    assert!(self.known.insert(id), "{ev:?}: a handle already in use");
                    self.announced.insert(id, *listener);
                    self.stats.connect_requests += 1;
                    &[CmState::ReqRcvd, CmState::SidrReqRcvd]
                }
                Event::Established { .. } => {
                    self.stats.established += 1;
                    &[CmState::Established]
                }
                Event::Disconnected { .. } => {
                    self.stats.disconnected += 1;
                    &[CmState::TimeWait]
                }
                e => {
                    match e {
                        Event::Rejected { .. } => self.stats.rejected += 1,
                        Event::Unreachable { .. } => self.stats.unreachable += 1,
                        Event::UdResolved { .. } => self.stats.ud_resolved += 1,
                        Event::ConnectError { .. } => self.stats.connect_errors += 1,
                        _ => self.stats.timewait_exits += 1,
                    }
                    &[CmState::Closed]
                }
            };
            assert!(
                self.known.contains(&id),
                "{ev:?}: an id the consumer does not know"
            );
            assert!(
                state.is_some_and(|s| want.contains(&s)),
                "{ev:?} with the id in {state:?}"
            );
        }
        while let Some(a) = self.v.poll_qp_action() {
            if self.trace {
                eprintln!("  qp action {a:?}");
            }
            if self.destroyed_now == Some(a.id) {
                continue;
            }
            let state = self.v.state(a.id);
            assert!(state.is_some(), "{a:?} names no id");
            attributed(&self.v, a.id);
            if matches!(a.step, QpStep::Rtr { .. } | QpStep::Rts { .. }) {
                assert!(
                    matches!(state, Some(CmState::RepSent | CmState::Established)),
                    "{a:?} with the id in {state:?}"
                );
            }
        }
    }

    /// The honest peer answers what it is asked: it accepts connection requests and
    /// serves SIDR requests.
    fn drain_honest(&mut self) {
        while let Some(ev) = self.h.poll_event() {
            if let Event::ConnectRequest { id, .. } = ev {
                push_capped(&mut self.h_ids, id, 64);
                if self.h.state(id) == Some(CmState::SidrReqRcvd) {
                    let _ = self.h.sidr_reply(id, Some((0x300, 0x1111_1111)), b"ud");
                } else {
                    let p = ConnParams {
                        qpn: self.next_honest_qpn(),
                        psn: 0x77,
                        responder_resources: 2,
                        initiator_depth: 2,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        ..ConnParams::default()
                    };
                    let _ = self.h.accept(self.now, id, p);
                }
            }
        }
        while self.h.poll_qp_action().is_some() {}
    }

    /// Delivers MADs between the victim and the honest peer until both are quiet (the
    /// hostile peers only listen); MADs to anyone else are kept for the hostile peers.
    fn pump(&mut self) {
        for _ in 0..256 {
            let mut moved = false;
            while let Some(t) = self.v.poll_transmit() {
                moved = true;
                self.stats.mads_out += 1;
                check_round_trip("victim", &t);
                assert!(
                    self.contacted.contains(&t.dest.ip()),
                    "the victim sent to {} it never talked to",
                    t.dest
                );
                self.note_wire(&t.mad);
                let (local, remote, qpn) = comm_ids(&t.mad.msg);
                push_capped(&mut self.ours, local, POOL);
                push_capped(&mut self.theirs, remote, POOL);
                if let Some(q) = qpn {
                    push_capped(&mut self.qpns, q, POOL);
                    if matches!(t.mad.msg, CmMessage::Req(_) | CmMessage::Rep(_))
                        && self.comm_qpn.len() < 64
                    {
                        self.comm_qpn.insert(local, q);
                    }
                }
                push_capped(&mut self.victim_sent, (t.dest, t.mad), 32);
                if self.trace {
                    eprintln!(
                        "  tx {} to {} ({local:#x} -> {remote:#x})",
                        t.mad.msg.name(),
                        t.dest
                    );
                }
                if t.dest.ip() == IpAddr::from(HONEST_IP) {
                    if self.lose > 0 {
                        self.lose -= 1;
                        continue;
                    }
                    self.h.handle_mad(self.now, self.cfg.local, &t.mad);
                    self.drain_honest();
                }
            }
            while let Some(t) = self.h.poll_transmit() {
                moved = true;
                check_round_trip("honest", &t);
                assert_eq!(t.dest.ip(), IpAddr::from(VICTIM_IP), "{t:?}");
                let (local, _, qpn) = comm_ids(&t.mad.msg);
                push_capped(&mut self.theirs, local, POOL);
                if let Some(q) = qpn {
                    push_capped(&mut self.qpns, q, POOL);
                }
                if self.lose > 0 {
                    self.lose -= 1;
                    continue;
                }
                let src = self.honest();
                self.victim_rx(src, &t.mad);
            }
            if !moved {
                return;
            }
        }
        panic!("the victim and the honest CM keep talking");
    }

    /// The bounded-state oracles, after every operation.
    fn check_state(&mut self) {
        let o = self.v.occupancy();
        self.stats.max_ids = self.stats.max_ids.max(o.ids);
        assert_eq!(
            o.ids,
            self.known.len(),
            "the victim holds ids its consumer neither created nor was told of"
        );
        for &h in &self.known {
            assert!(
                self.v.state(h).is_some(),
                "id {h} vanished under its consumer"
            );
        }
        let waiting = self
            .known
            .iter()
            .filter(|&&h| is_waiting(self.v.state(h)))
            .count();
        assert!(
            waiting as u64 <= self.backlog_ever,
            "{waiting} requests wait for the consumer; backlogs total {}",
            self.backlog_ever
        );
        assert!(
            o.listeners <= o.ids && o.comm_ids <= o.ids && o.qpns <= o.ids,
            "{o:?}"
        );
        assert_eq!(o.queued, 0, "output left after draining: {o:?}");
        for t in [self.v.poll_timeout(), self.h.poll_timeout()]
            .into_iter()
            .flatten()
        {
            assert!(t >= self.now, "a deadline in the past");
        }
    }

    /// The hostile peers fall silent: every timer must run out within what Max CM
    /// Retries allows, and then no id of the victim may be waiting on one.
    fn finish(&mut self) {
        self.destroyed_now = None;
        let ids = self.v.occupancy().ids + self.h.occupancy().ids;
        // Per id: a REQ/REP/SIDR REQ sent 1 + retries times, a DREQ likewise, TimeWait.
        let per_id = 2 * (usize::from(self.cfg.max_cm_retries) + 1) + 2;
        let cap = 16 + 2 * per_id * ids;
        for _ in 0..cap {
            let next = [self.v.poll_timeout(), self.h.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = next else {
                break;
            };
            self.now = self.now.max(t);
            self.service();
            self.check_state();
        }
        assert_eq!(
            self.v.poll_timeout(),
            None,
            "victim: a retry loop ({cap} rounds)"
        );
        assert_eq!(
            self.h.poll_timeout(),
            None,
            "honest: a retry loop ({cap} rounds)"
        );
        for &h in &self.known {
            let s = self.v.state(h);
            assert!(
                matches!(
                    s,
                    Some(
                        CmState::Idle
                            | CmState::Listen
                            | CmState::Established
                            | CmState::Closed
                            | CmState::ReqRcvd
                            | CmState::SidrReqRcvd
                    )
                ),
                "id {h} did not settle: {s:?}"
            );
        }
        self.stats.retries = self.v.counters().tx_retries;
    }
}

/// A 2-bit message kind.
fn kind2(b: u8) -> MessageKind {
    [
        MessageKind::Req,
        MessageKind::Rep,
        MessageKind::Other,
        MessageKind::Reserved,
    ][usize::from(b & 3)]
}

fn rej(local: u32, remote: u32, kind: MessageKind) -> RejRepr {
    RejRepr {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: kind,
        reject_info_length: 0,
        reason: RejReason::CONSUMER_DEFINED,
        ari: [0; 72],
        private_data: [0; wire::cm::REJ_PRIVATE_DATA_LEN],
    }
}

fn mra(local: u32, remote: u32, kind: MessageKind, t: u32) -> MraRepr {
    MraRepr {
        local_comm_id: local,
        remote_comm_id: remote,
        message_mraed: kind,
        service_timeout: (t % 32) as u8,
        private_data: [0; wire::cm::MRA_PRIVATE_DATA_LEN],
    }
}

fn dreq(local: u32, remote: u32, remote_qpn: u32) -> DreqRepr {
    DreqRepr {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn,
        private_data: [0; wire::cm::DREQ_PRIVATE_DATA_LEN],
    }
}

fn sidr_rep(request_id: u32, status: SidrStatus, qpn: u32, service_id: u64) -> SidrRepRepr {
    SidrRepRepr {
        request_id,
        status,
        additional_info_length: 0,
        vendor_id: 0,
        qpn,
        service_id,
        qkey: 0x1234,
        additional_info: [0; 72],
        private_data: [0; wire::cm::SIDR_REP_PRIVATE_DATA_LEN],
    }
}

/// `r` with the Extended Transport Type of XRC when its Transport Service Type is the
/// extended one (3), so that hostile REQs name XRC, not only unknown types.
fn xrc_when_extended(mut r: ReqRepr) -> ReqRepr {
    r.extended_transport_type = u8::from(r.transport_type == 3);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    #[ignore = "debugging aid: CM_FUZZ_INPUT=1,2,3 CM_FUZZ_TRACE=1"]
    fn replay_env_input() {
        let s = std::env::var("CM_FUZZ_INPUT").unwrap_or_default();
        let data: Vec<u8> = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        eprintln!("{:?}", run(&data));
    }

    /// Builds inputs by hand, byte for byte as [`Input`] reads them.
    #[derive(Default)]
    struct Seed(Vec<u8>);

    impl Seed {
        /// Port 4791, response timeout 2^3 × 4.096 µs, path MTU 2, 2 retries, 50 ms
        /// TimeWait, CM seed 7.
        fn new() -> Seed {
            Seed(vec![0x06, 2, 2, 7])
        }
        fn b(mut self, bytes: &[u8]) -> Seed {
            self.0.extend_from_slice(bytes);
            self
        }
        fn u32(self, v: u32) -> Seed {
            self.b(&v.to_le_bytes())
        }
        fn u64(self, v: u64) -> Seed {
            self.b(&v.to_le_bytes())
        }
        /// `ConnParams` drawn by `Driver::params`: QPN index, PSN, resources, retry
        /// counts, no flags, 8 bytes of private data.
        fn params(self, qpn: u8, psn: u32) -> Seed {
            self.b(&[qpn]).u32(psn).b(&[4, 4, 7, 7, 0, 0, 8, b'p'])
        }
        /// `create_id` and (as the only id so far, or the `pick`th) connect to `dest`
        /// (0 honest, 1-2 hostile) on service index `sid`.
        fn connect(self, pick: u8, dest: u8, sid: u8) -> Seed {
            self.b(&[op::CREATE, op::CONNECT, pick, dest, sid])
                .params(0, 0x1000)
        }
        fn listen(self, pick: u8, sid: u8, backlog: u8) -> Seed {
            self.b(&[op::CREATE, op::LISTEN, pick, sid, backlog])
        }
        /// Time jumps past every retry and TimeWait.
        fn past_everything(self) -> Seed {
            self.b(&[op::ADVANCE, 3])
        }
        /// A REQ from hostile peer 1 for service index `sid` with communication ID
        /// `comm` and QPN 0x123.
        fn hostile_req(self, comm: u32, sid: u8) -> Seed {
            self.b(&[op::MAD, 2, 0, 2])
                .u64(0xAB)
                .b(&[3])
                .u32(comm)
                .b(&[2, 3])
                .u32(0x123)
                .b(&[sid])
                .u64(0x77)
                .b(&[1, 1, 20, 0, 0])
                .u32(0x555)
                .b(&[20, 7, 3, 7, 15, 0, 14, 0, 0])
        }
    }

    /// A seed: its file name, its bytes, and what it must reach.
    type Named = (&'static str, Vec<u8>, fn(&Stats) -> bool);

    /// The seed corpus of `fuzz/corpus/cm/`: named inputs and what each must reach.
    fn seeds() -> Vec<Named> {
        vec![
            (
                "active-honest-established-disconnect-timewait",
                Seed::new()
                    .connect(0, 0, 0)
                    .b(&[op::DISCONNECT, 0, 0])
                    .past_everything()
                    .0,
                |s| s.established == 1 && s.disconnected == 1 && s.timewait_exits == 1,
            ),
            (
                "passive-honest-accept-then-peer-disconnects",
                Seed::new()
                    .listen(0, 0, 2)
                    .b(&[op::HONEST_CONNECT, 0, 0])
                    .u32(0x2000)
                    .b(&[op::ACCEPT, 0])
                    .params(1, 0x3000)
                    .b(&[op::HONEST_CLOSE, 0, 0])
                    .past_everything()
                    .0,
                |s| s.connect_requests == 1 && s.established == 1 && s.disconnected == 1,
            ),
            (
                "sidr-both-ways",
                Seed::new()
                    .listen(0, 1, 1)
                    .b(&[op::HONEST_CONNECT, 1, 1])
                    .b(&[op::SIDR_REPLY, 0, 1])
                    .u32(0x33)
                    .u32(0x4444)
                    .b(&[4, b'u'])
                    .b(&[op::CREATE, op::SIDR_REQUEST, 2, 0, 1, 4, b's'])
                    .0,
                |s| s.connect_requests == 1 && s.ud_resolved == 1,
            ),
            (
                "active-hostile-rep-then-dreq",
                Seed::new()
                    .connect(0, 1, 0)
                    .b(&[op::ANSWER, 0, 0])
                    .u32(0x0bad_c0de)
                    .u32(0x42)
                    .b(&[op::ANSWER, 1, 0])
                    .u32(0)
                    .u32(0)
                    .past_everything()
                    .0,
                |s| s.established == 1 && s.disconnected == 1 && s.timewait_exits == 1,
            ),
            (
                "passive-hostile-req-accept-rtu",
                Seed::new()
                    .listen(0, 0, 1)
                    .hostile_req(0x1111, 0)
                    .b(&[op::ACCEPT, 0])
                    .params(2, 0x4000)
                    .b(&[op::ANSWER, 0, 0])
                    .u32(0)
                    .u32(0)
                    .0,
                |s| s.connect_requests == 1 && s.established == 1,
            ),
            (
                "hostile-backlog-full-then-reject",
                Seed::new()
                    .listen(0, 0, 1)
                    .hostile_req(0x1111, 0)
                    .hostile_req(0x2222, 0)
                    .b(&[op::REJECT, 0, 3, b'n'])
                    .hostile_req(0x2222, 0)
                    .0,
                |s| s.connect_requests == 2 && s.backlog_drops == 1,
            ),
            (
                "unreachable-hostile-after-retries",
                Seed::new().connect(0, 2, 0).past_everything().0,
                |s| s.unreachable == 1 && s.retries == 2,
            ),
            (
                "rejected-by-honest-no-listener",
                Seed::new().connect(0, 0, 2).0,
                |s| s.rejected == 1,
            ),
        ]
    }

    #[test]
    fn seeds_reach_what_they_are_named_for() {
        for (name, data, ok) in seeds() {
            let s = run(&data);
            assert!(ok(&s), "{name}: {s:?}");
        }
    }

    /// Writes the seeds to `fuzz/corpus/cm/`.
    #[test]
    #[ignore = "writes fuzz/corpus/cm/: cargo test -p softnic-transport --lib write_cm_seed_corpus -- --ignored"]
    fn write_cm_seed_corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/cm");
        std::fs::create_dir_all(dir).unwrap();
        for (name, data, _) in seeds() {
            std::fs::write(format!("{dir}/{name}"), data).unwrap();
        }
    }

    /// Random inputs (a fixed xorshift stream, as the proptest's are random) reach the
    /// deep states, not only parse errors and refused calls: otherwise the oracles
    /// above would hold vacuously.
    #[test]
    fn random_inputs_reach_every_kind_of_outcome() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut total = Stats::default();
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let data: Vec<u8> = (0..x % 600)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let s = run(&data);
            total.ops += s.ops;
            total.mads_in += s.mads_in;
            total.mads_out += s.mads_out;
            total.connect_requests += s.connect_requests;
            total.established += s.established;
            total.rejected += s.rejected;
            total.unreachable += s.unreachable;
            total.disconnected += s.disconnected;
            total.timewait_exits += s.timewait_exits;
            total.ud_resolved += s.ud_resolved;
            total.connect_errors += s.connect_errors;
            total.backlog_drops += s.backlog_drops;
            total.retries += s.retries;
            total.max_ids = total.max_ids.max(s.max_ids);
        }
        eprintln!("{total:?}");
        let t = total;
        for (what, n) in [
            ("connect requests", t.connect_requests),
            ("established", t.established),
            ("rejected", t.rejected),
            ("unreachable", t.unreachable),
            ("disconnected", t.disconnected),
            ("TimeWait exits", t.timewait_exits),
            ("UD resolved", t.ud_resolved),
            ("connect errors", t.connect_errors),
            ("backlog drops", t.backlog_drops),
            ("retries", t.retries),
        ] {
            assert!(n > 0, "no {what} in 400 random inputs: {t:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            // About 0.1 s at opt-level 1; PROPTEST_CASES overrides.
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(4000),
            rng_seed: proptest::test_runner::RngSeed::Fixed(0xC0FF_EE11),
            failure_persistence: None,
            .. ProptestConfig::default()
        })]

        /// Random byte strings as operation sequences: the oracles hold.
        #[test]
        fn cm_survives_hostile_inputs(data in prop::collection::vec(any::<u8>(), 0..1000)) {
            run(&data);
        }
    }
}
