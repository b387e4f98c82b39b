//! The NIC's only loop (the data-plane thread).
//!
//! ```text
//!  loop:
//!    control requests (channel) ─► object tables            (state.rs)
//!    doorbells (one page per client) ─► rung SQ/RQ/SRQ rings ─► copy, check
//!        ─► Qp::post_send/post_recv                        (doorbells.rs, rings.rs, wqe.rs)
//!    (rings gave work, socket empty at the last look: active QPs transmit, as below, first)
//!    UDP batch ─► ICRC ─► parse ─► demux by QPN ─► source check ─► Qp::handle_packet
//!    due timers (deadline heap, ready.rs) ─► Qp::handle_timeout
//!    active QPs: Qp::poll_completion ─► CQ rings (publish each written CQ once; wake armed CQs)
//!        (a receive completion after an idle iteration: yield the core once, drain the rings again)
//!    active QPs: Qp::poll_transmit ─► ICRC (DF; ID 0, or k in a GSO run) ─► fault ─► pcap ─► UDP
//!    active QPs: completions transmit made ─► CQ rings; timers re-armed; active set kept
//!    idle ≥ SPIN (or idle at all while starved of the core): NEED_WAKEUP on every
//!        client's doorbell page, re-check, ppoll(2)
//! ```
//!
//! Readiness decides what is visited; an idle QP costs nothing per iteration (issue 12).
//! * Rings are read only when rung: each client sets a bit for a QP or SRQ on its
//!   doorbell page after posting (`verbs_api::abi::doorbell`), and the loop takes the
//!   rung bits (a bounded number per client per iteration) and drains those rings. A
//!   QP that could not take all its entries (queue full, completions waiting) is drained
//!   again once it can, while it is active; an SRQ whose pool was full, after a packet
//!   took a WQE from it.
//! * Transmit and completion visit only the *active set* (`ready.rs`): QPs that took
//!   work from their rings, received a packet, had a timer fire or were modified, and
//!   QPs that kept work from the last iteration (a full transmit budget, completions
//!   waiting for CQ room, ring entries they can take now).
//! * Timers live in a deadline heap re-armed from `Qp::poll_timeout` after each visit,
//!   so due timers and the next wake-up cost O(due), not O(QPs).
//!
//! What is still per object per iteration: one read of each client's doorbell summary
//! (8 words), and the Stats request, which sums every QP's counters (once per
//! iteration at most). Asynchronous events are noticed on the completion pass over the
//! active QPs and listed per client (`async_events.rs`), so GetAsyncEvents visits only
//! objects with events, and an idle C context sends none (its watcher waits on a pipe).
//!
//! Everything runs on this one thread: the transport, the memory-region table and the
//! rings are never shared, so there are no locks. Time is sampled once per iteration
//! (vDSO `clock_gettime`, ~20 ns) and passed to the sans-IO transport.
//!
//! Sleeping follows io_uring's SQPOLL: after [`SPIN`] without work the runtime sets
//! NEED_WAKEUP on every client's doorbell page, fences, re-checks the doorbells (a post
//! that raced with the flag is seen here), and only then blocks in `ppoll(2)` on the UDP
//! socket, the control wake eventfd and every client's wake pipe (`os::WakePipe`: the
//! client holds only a write end, so it cannot make the NIC's drain block), with the
//! earliest QP timer (or held fault-injection packet) as timeout, to the microsecond
//! (`os::PollSet`, kept from sleep to sleep). Of those descriptors only the ones that
//! woke it are drained, one `read(2)` each, and only after the next pass's transmit,
//! so the packet of the post that woke the NIC leaves first.
//! A client post that sees NEED_WAKEUP writes its wake pipe; one that does not see it
//! needs no syscall because the NIC is polling. With `--busy-poll` the loop never sleeps (it yields the
//! core when idle), so NEED_WAKEUP is never set and no client post ever makes a syscall.
//! While spinning, the loop yields after every idle iteration, or after every
//! [`CO_PINNED_IDLE_SPINS`]th while the NIC and all its clients are pinned to one CPU.
//! When yields keep losing the core for milliseconds (a thread there never yields, such
//! as a program polling its memory), it sleeps as soon as it is idle for a while
//! instead (`starved.rs`): a wake-up preempts such a thread, a yield waits for a tick.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{unbounded, Receiver};
use softnic_transport::qp::{PayloadDigest, ReceivedIp};
use softnic_transport::time::Instant;
use verbs_api::abi::control::{ErrorCode, Reply, Request, Response};
use verbs_api::os::PollSet;
use wire::icrc::{IcrcParams, IpParams};
use wire::PacketRepr;

use super::async_events;
use super::clock::Clock;
use super::config::Config;
use super::control::{ConnCounters, ControlMsg, ControlServer};
use super::counters::{self, NicCounters};
use super::doorbells::Target;
use super::fault::FaultInjector;
use super::mcast::{self, GroupSockets};
use super::memory::KeyMap;
use super::pcap::PcapWriter;
use super::ready::ActiveSet;
use super::rings::DRAIN_BUDGET;
use super::rx_icrc::{self, IcrcPath};
use super::rx_place;
use super::signals;
use super::source;
use super::srq::SrqEntry;
use super::starved::StarvedSpin;
use super::state::{Nic, NicInfo};
use super::trace::Trace;
use super::udp::{Offloads, PacketIo, PhasedBuf, RecvBatch, SendOutcome, UdpIo};
use super::xrc::{self, XrcTable};

/// How long the loop spins without work before it sleeps.
pub const SPIN: Duration = Duration::from_micros(100);

/// Idle iterations between two yields while this NIC and every one of its clients are
/// pinned to the same single CPU (`co_pinned_now`); otherwise the loop yields after each
/// idle iteration.
///
/// Why: pinned so (`taskset -c N` on the NIC and on its program, the setup docs/perf.md
/// recommends for a laptop), the only thread a yield can hand the core to is
/// the NIC's own client, and while the NIC is idle that client is waiting for it: each
/// such hand-off costs two switches (≈ 1.3 µs on the 2-vCPU guest) and delays the
/// NIC's next look at its socket. Spinning four iterations between yields cut the 8 B
/// round trip pinned so by ≈ 11 % (docs/perf.md, "Session 13"). Not otherwise: with the
/// peer NIC on the same core the same spin cost 17–27 %, and the NIC cannot see where
/// a peer runs (both NICs and both programs pinned to one CPU still pay that 17 %).
pub const CO_PINNED_IDLE_SPINS: u32 = 4;

/// How often the loop re-reads its own and its clients' CPU affinity while it spins
/// (never while it sleeps): one `sched_getaffinity` of its own, and one per client when
/// the NIC itself is pinned to one CPU.
const AFFINITY_CHECK: Duration = Duration::from_millis(100);

/// A NIC with more clients than this is not the one-program setup the co-pinned spin is
/// for ([`CO_PINNED_IDLE_SPINS`]), and is never treated as co-pinned: its affinity check
/// stays a handful of system calls every [`AFFINITY_CHECK`].
const CO_PINNED_MAX_CLIENTS: usize = 16;

/// Longest sleep (so a pcap is flushed and a lost wake-up costs at most this).
pub const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Longest sleep while completions wait for room in a full CQ.
pub const CQ_FULL_RECHECK: Duration = Duration::from_millis(1);

/// Receive batches per iteration (then the loop transmits, so ACKs keep flowing).
const RX_BATCHES: usize = 4;

/// Bytes reserved per packet in the transmit buffer (path MTU + headers, with room).
const TX_SLOT: usize = 4096 + 512;

/// Room a run started inside the transmit buffer needs behind its start: the longest
/// run and the slot of the packet that ends it.
const RUN_ROOM: usize = super::udp::GSO_MAX_BYTES + TX_SLOT;

/// Packets one QP may send per iteration (fairness between QPs).
const TX_BUDGET: usize = 64;

/// Packets a transmit pass sends between two looks at the socket. A pass visits every
/// active QP (up to [`TX_BUDGET`] packets each): over 10,000 busy QPs that was up to
/// 640,000 packets, ≈ 150 ms in which nothing read the socket, so the peer's ACKs
/// overflowed its receive buffer (`RcvbufErrors`), each lost or late ACK timed out and
/// resent a window that had arrived, and `softnic perf write_bw -q 10000` fell to
/// 2.5–3.8 Mpps with up to a third of its packets resent (docs/perf.md, session 23).
/// Cutting the pass short instead costs a visit of every active QP per cut (completions,
/// timers): cut every 1,024 packets, `-q 10000` made 1 Mpps. 1,024 packets are ≈ 0.2 ms
/// of 8 B WRITEs.
const RX_EVERY: usize = 1024;

/// Control messages handled per iteration (and at most one Stats, which costs a pass
/// over every QP): a burst of requests from many connections waits for the next
/// iteration rather than holding packets back.
const CONTROL_BUDGET: usize = 32;

/// The ICRC parameters of a packet this NIC sends to `dest` (IPv4 ID 0 with DF: see
/// `udp.rs`), or `None` when `dest` is of the other IP family.
pub fn tx_params(local: SocketAddr, dest: SocketAddr, id: u16) -> Option<IcrcParams> {
    let ip = match (local.ip(), dest.ip()) {
        (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) => IpParams::V4 {
            src,
            dst,
            id,
            dont_fragment: true,
        },
        (std::net::IpAddr::V6(src), std::net::IpAddr::V6(dst)) => IpParams::V6 { src, dst },
        _ => return None,
    };
    Some(IcrcParams {
        ip,
        src_port: local.port(),
        dst_port: dest.port(),
    })
}

/// The packet path: socket, fault injector, capture and their counters.
struct PacketPath {
    io: UdpIo,
    local: SocketAddr,
    fault: FaultInjector,
    pcap: Option<PcapWriter>,
    counters: NicCounters,
    solver: rx_icrc::IdSolver,
    trace: Trace,
}

impl PacketPath {
    /// Sends one packet (ICRC already filled) with IP TOS `tos`, recording it in the
    /// capture.
    fn send_now(
        io: &mut UdpIo,
        pcap: &mut Option<PcapWriter>,
        counters: &mut NicCounters,
        local: SocketAddr,
        pkt: &[u8],
        (dest, tos): (SocketAddr, u8),
    ) {
        if let Some(p) = pcap.as_mut() {
            if let Some(params) = tx_params(local, dest, io.ipv4_id(0)) {
                if let Err(e) = p.record(&params, tos, pkt) {
                    tracing::warn!(error = %e, "pcap write failed; capture stopped");
                    *pcap = None;
                }
            }
        }
        match io.send(pkt, dest, tos) {
            SendOutcome::Sent => {
                counters.tx_datagrams += 1;
                counters.tx_bytes += pkt.len() as u64;
            }
            SendOutcome::DroppedFull => counters.tx_drop_socket_full += 1,
            SendOutcome::Failed => counters.tx_drop_send_error += 1,
        }
    }

    /// Fills the ICRC of `pkt` for `dest` (from its payload digest, if it has one) and
    /// hands it to the fault injector, to leave with IP TOS `tos`.
    fn transmit(
        &mut self,
        now: Instant,
        pkt: &mut [u8],
        (dest, tos): (SocketAddr, u8),
        digest: Option<PayloadDigest>,
    ) {
        let Some(params) = tx_params(self.local, dest, self.io.ipv4_id(0)) else {
            self.counters.tx_drop_bad_dest += 1;
            return;
        };
        if self.solver.fill(&params, pkt, digest).is_err() {
            self.counters.tx_drop_send_error += 1;
            return;
        }
        let call = self.trace.stamp();
        let (io, pcap, counters, local) =
            (&mut self.io, &mut self.pcap, &mut self.counters, self.local);
        self.fault.submit(now, pkt, (dest, tos), &mut |b, d, t| {
            Self::send_now(io, pcap, counters, local, b, (d, t))
        });
        self.trace.tx(now, call, pkt, pkt.len());
    }

    /// Fills the ICRC of each `seg`-byte segment of `run` (segment k with IPv4 ID k,
    /// from its payload digest `digests[k]` if it has one), lets the fault injector
    /// corrupt it (its losses were decided as the run was built), records them, and
    /// sends them with one GSO call, all with IP TOS `tos`.
    fn transmit_run(
        &mut self,
        now: Instant,
        (run, seg): (&mut [u8], usize),
        digests: &[Option<PayloadDigest>],
        (dest, tos): (SocketAddr, u8),
    ) {
        let Some(params) = tx_params(self.local, dest, 0) else {
            self.counters.tx_drop_bad_dest += 1;
            return;
        };
        // The peer's prepared ICRC state is looked up once for the whole run.
        let io = &self.io;
        if self
            .solver
            .fill_run(&params, run, seg, |k| io.ipv4_id(k), digests)
            .is_err()
        {
            self.counters.tx_drop_send_error += 1;
            return;
        }
        for (k, pkt) in run.chunks_mut(seg.max(1)).enumerate() {
            self.fault.corrupt(pkt);
            if let Some(p) = self.pcap.as_mut() {
                let params = tx_params(self.local, dest, self.io.ipv4_id(k));
                if params.is_none_or(|params| p.record(&params, tos, pkt).is_err()) {
                    self.pcap = None;
                }
            }
        }
        let n = run.len().div_ceil(seg.max(1)) as u64;
        let call = self.trace.stamp();
        match self.io.send_segments(run, seg, dest, tos) {
            SendOutcome::Sent => {
                self.counters.tx_datagrams += n;
                self.counters.tx_bytes += run.len() as u64;
                if n > 1 {
                    self.counters.tx_gso_sends += 1;
                }
            }
            SendOutcome::DroppedFull => self.counters.tx_drop_socket_full += n,
            SendOutcome::Failed => self.counters.tx_drop_send_error += n,
        }
        self.trace.tx(now, call, run, seg);
    }

    /// Sends held packets that are due.
    fn release(&mut self, now: Instant) {
        let (io, pcap, counters, local) =
            (&mut self.io, &mut self.pcap, &mut self.counters, self.local);
        self.fault.release(now, &mut |b, d, t| {
            Self::send_now(io, pcap, counters, local, b, (d, t))
        });
    }
}

/// The data-plane state.
pub struct Runtime {
    nic: Nic,
    path: PacketPath,
    clock: Clock,
    ctl_rx: Receiver<ControlMsg>,
    ctl_wake: Arc<OwnedFd>,
    conn_counters: Arc<ConnCounters>,
    batch: RecvBatch,
    /// The packets of the GSO run being built ([`super::udp::BUF_PHASE`]).
    tx_buf: PhasedBuf,
    /// The payload digest of each packet of the GSO run in `tx_buf`, by position.
    tx_digests: [Option<PayloadDigest>; super::udp::GSO_MAX_SEGMENTS],
    /// CQs written this iteration (to publish once each).
    dirty_cqs: Vec<u32>,
    /// Rings whose doorbell was rung (reused buffer).
    rung: Vec<Target>,
    /// SRQs whose last drain stopped on its budget with room in the pool.
    srq_carry: Vec<u32>,
    /// `--busy-poll`: never sleep.
    busy_poll: bool,
    /// The last iteration found no work: traffic, if any, is one message at a time.
    was_idle: bool,
    /// The last receive found the socket empty.
    rx_empty: bool,
    /// What `sleep` waits on (kept: a sleep allocates nothing).
    polls: PollSet,
    /// The control eventfd was readable when the last sleep ended: drain it.
    wake_ctl: bool,
    /// Clients whose wake pipe was readable when the last sleep ended: drain those.
    wake_clients: Vec<u32>,
    /// The sockets of the multicast groups QPs are attached to (`mcast.rs`).
    groups: GroupSockets,
    _server: ControlServer,
}

impl Runtime {
    /// Binds the socket, opens the capture, starts the control server.
    pub fn start(cfg: &Config) -> io::Result<Self> {
        let io = UdpIo::bind_with(cfg.bind, cfg.offloads)?;
        log_offloads(cfg, io.offloads());
        log_recv_buffer(io.recv_buffer());
        let recv_slot = io.recv_slot();
        let local = io.local_addr();
        let pcap =
            match &cfg.pcap {
                Some(p) => Some(PcapWriter::create(p).map_err(|e| {
                    io::Error::new(e.kind(), format!("--pcap {}: {e}", p.display()))
                })?),
                None => None,
            };
        let ctl_wake = Arc::new(verbs_api::os::eventfd()?);
        signals::install(ctl_wake.as_raw_fd())?;
        let (tx, ctl_rx) = unbounded();
        let conn_counters = Arc::new(ConnCounters::default());
        let server = ControlServer::start(
            &cfg.socket_path(),
            cfg.connections,
            conn_counters.clone(),
            tx,
            ctl_wake.clone(),
        )?;
        tracing::info!(
            name = %cfg.name,
            addr = %local,
            mtu = cfg.mtu,
            socket = %server.path().display(),
            gid = %std::net::Ipv6Addr::from(super::gid::gid_of(local.ip())),
            "softnic running"
        );
        if !cfg.fault.is_none() {
            tracing::info!(fault = ?cfg.fault, "fault injection on every sent packet");
        }
        let clock = Clock::new();
        Ok(Runtime {
            nic: Nic::new(
                NicInfo {
                    name: cfg.name.clone(),
                    local,
                    mtu: cfg.mtu,
                    compat: softnic_transport::qp::RxeCompat {
                        retry_cnt_7_is_infinite: cfg.retry_cnt_7_infinite,
                    },
                    ack_timer: if cfg.strict_ack_timeout {
                        softnic_transport::qp::AckTimer::Strict
                    } else {
                        softnic_transport::qp::AckTimer::Adaptive
                    },
                },
                cfg.quotas,
            ),
            path: PacketPath {
                io,
                local,
                fault: FaultInjector::new(cfg.fault),
                pcap,
                counters: NicCounters::default(),
                solver: rx_icrc::IdSolver::new(),
                trace: Trace::new(cfg.trace_lat.clone(), &clock),
            },
            clock,
            ctl_rx,
            ctl_wake,
            conn_counters,
            batch: RecvBatch::with_slot(recv_slot),
            tx_buf: PhasedBuf::new(
                TX_SLOT * super::udp::GSO_MAX_SEGMENTS,
                super::udp::BUF_PHASE,
            ),
            tx_digests: [None; super::udp::GSO_MAX_SEGMENTS],
            dirty_cqs: Vec::new(),
            rung: Vec::new(),
            srq_carry: Vec::new(),
            busy_poll: cfg.busy_poll,
            was_idle: true,
            rx_empty: true,
            polls: PollSet::new(),
            wake_ctl: false,
            wake_clients: Vec::new(),
            groups: GroupSockets::default(),
            _server: server,
        })
    }

    /// Runs until SIGINT/SIGTERM.
    pub fn run(mut self) -> io::Result<()> {
        // Sleeps end when asked, not up to 50 µs later (the default timer slack of a
        // normal thread, prctl(2)): the retransmission timers are ~100–250 µs.
        if let Err(e) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000)) {
            tracing::debug!(error = %e, "timer slack not set");
        }
        let mut last_work = self.clock.now();
        // Idle iterations per yield (`CO_PINNED_IDLE_SPINS` or 1), and when the
        // affinities it depends on were last read.
        let (mut spins_per_yield, mut idle_spins) = (1, 0);
        let mut checked: Option<Instant> = None;
        let mut starved = StarvedSpin::new();
        while !signals::stop_requested() {
            let now = self.clock.now();
            if starved.pass_start(now) {
                self.path.counters.spin_starved += 1;
            }
            let work = self.iterate(now)?;
            starved.pass_end(self.clock.now());
            self.path.counters.loop_passes += 1;
            if work > 0 {
                last_work = now;
                idle_spins = 0;
                continue;
            }
            self.path.counters.loop_idle_passes += 1;
            // With --busy-poll the NIC never sleeps, so NEED_WAKEUP is never set.
            // Spin while work is recent, unless a recent yield found the core held by
            // a thread that does not yield (`starved.rs`): then a wake-up is faster.
            let spin = now.saturating_duration_since(last_work) < SPIN && starved.may_spin(now);
            if self.busy_poll || spin {
                if checked.is_none_or(|t| now.saturating_duration_since(t) >= AFFINITY_CHECK) {
                    checked = Some(now);
                    let pids = self.nic.clients.values().map(|c| c.pid);
                    let few = self.nic.clients.len() <= CO_PINNED_MAX_CLIENTS;
                    spins_per_yield = if few && co_pinned_now(pids) {
                        CO_PINNED_IDLE_SPINS
                    } else {
                        1
                    };
                }
                // Yield rather than spin in place: on a host with fewer cores than busy
                // threads (two NICs and their clients on two cores), a pure spin holds a
                // core the client or the peer NIC needs; sched_yield costs ~0.2 µs and
                // returns at once when nothing else wants the core.
                idle_spins += 1;
                if idle_spins >= spins_per_yield {
                    idle_spins = 0;
                    std::thread::yield_now();
                }
                continue;
            }
            self.sleep(now)?;
            last_work = self.clock.now();
            starved.slept(last_work);
        }
        tracing::info!("stopping");
        self.path.trace.finish();
        if let Some(p) = self.path.pcap.as_mut() {
            p.flush()?;
        }
        Ok(())
    }

    /// One pass: control, rings, packets, due timers, then the active QPs. Returns a
    /// measure of the work done (0 = idle).
    ///
    /// The order serves latency (issue 12, docs/perf.md "Latency") and keeps every
    /// pass bounded, so none starves another:
    /// * when the rings gave work and the last receive found the socket empty, the
    ///   active QPs transmit once before the receive: a freshly posted request leaves
    ///   without waiting for a (then usually empty) `recvmmsg` first. Not while packets
    ///   keep arriving, when the socket may hold an ACK or NAK that changes what should
    ///   be sent (with 5 % loss, sending first in every iteration cost goodput);
    ///   receive runs in every iteration either way.
    /// * completions are written and published before the main transmit. When a
    ///   receive completion was among them and the previous iteration had found
    ///   nothing to do (one message at a time, as in a ping-pong), the loop yields the
    ///   core once and drains the rings again: the client polling it may share this
    ///   core (four threads on two cores in a ping-pong), and then it polls and posts
    ///   its answer before this pass's ACK is sent, and the answer leaves in the same
    ///   pass (and the same GSO send) instead of an iteration and a yield later. Not
    ///   for send completions alone (a sender whose window an ACK just opened must
    ///   transmit at once: with 5 % loss, yielding there cost ≈ 20 % of the goodput)
    ///   nor under sustained load: on a loaded host a yield can lose the core to
    ///   another program for a whole time slice.
    fn iterate(&mut self, now: Instant) -> io::Result<usize> {
        let mut work = self.control(now);
        let drained = self.drain(now);
        work += drained;
        if drained > 0 && self.rx_empty {
            work += self.transmit(now)?;
        }
        work += self.receive(now)?;
        let path = &mut self.path;
        work += self.nic.cm_poll(now, &mut |pkt, dest| {
            path.transmit(now, pkt, (dest, 0), None)
        });
        work += self.timeouts(now);
        let mut now = now;
        let (published, received) = self.publish(now);
        work += published;
        if received && self.was_idle {
            // With nobody else runnable on this core the yield returns at once (~0.2 µs).
            std::thread::yield_now();
            now = self.clock.now();
            work += self.drain(now);
        }
        work += self.transmit(now)?;
        self.drain_wakes();
        self.path.release(now);
        work += self.complete(now);
        self.was_idle = work == 0;
        Ok(work)
    }

    /// Takes work requests from the rings that were rung (each client's doorbell
    /// page, `doorbells.rs`), from SRQs whose last drain ran out of budget, and from
    /// active QPs that left entries behind and can take them now. A QP that took
    /// something joins the active set. Idle rings are never read.
    fn drain(&mut self, now: Instant) -> usize {
        let local = self.path.local;
        let c = &mut self.path.counters;
        let mut work = 0;
        let mut rung = std::mem::take(&mut self.rung);
        for cl in self.nic.clients.values_mut() {
            c.doorbell_unknown_slot += cl.doorbells.poll(&mut rung);
        }
        rung.extend(self.srq_carry.drain(..).map(Target::Srq));
        // Fetch the rung QPs' entries together (QpEntry::prefetch) before draining any.
        for t in &rung {
            if let Target::Qp(qpn) = t {
                if let Some(e) = self.nic.qps.get(qpn) {
                    e.prefetch();
                }
            }
        }
        for t in rung.drain(..) {
            match t {
                Target::Qp(qpn) => {
                    let Some(e) = self.nic.qps.get_mut(&qpn) else {
                        continue;
                    };
                    let taken = e.drain_rings(now, local, c);
                    if taken > 0 {
                        self.nic.active.mark(qpn, &mut e.ticket);
                        work += taken;
                    }
                }
                Target::Srq(h) => {
                    let Some(s) = self.nic.srqs.get_mut(&h) else {
                        continue;
                    };
                    let taken = s.drain_ring(c);
                    async_events::note_srq(h, s, &mut self.nic.clients);
                    work += taken;
                    if taken == DRAIN_BUDGET && s.backlog() && !self.srq_carry.contains(&h) {
                        self.srq_carry.push(h);
                    }
                }
            }
        }
        self.rung = rung;
        for &it in self.nic.active.items() {
            if let Some(e) = self.nic.qps.get_mut(&it.qpn) {
                if e.ticket.owns(it) && e.needs_drain() {
                    work += e.drain_rings(now, local, c);
                }
            }
        }
        work
    }

    /// Runs the QP timers that are due (O(due), `ready::Deadlines`); a QP whose timer
    /// ran joins the active set. An entry that fired early (its QP re-armed later, or
    /// stopped the timer) is re-armed from the QP's real deadline.
    fn timeouts(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(qpn) = self.nic.deadlines.pop_due(now) {
            let Some(e) = self.nic.qps.get_mut(&qpn) else {
                continue;
            };
            match e.qp.poll_timeout() {
                Some(t) if t <= now => {
                    e.qp.handle_timeout(now);
                    self.nic.active.mark(qpn, &mut e.ticket);
                    n += 1;
                }
                later => self.nic.deadlines.arm(qpn, later),
            }
        }
        n
    }

    fn control(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while n < CONTROL_BUDGET {
            let Ok(msg) = self.ctl_rx.try_recv() else {
                break;
            };
            n += 1;
            match msg {
                ControlMsg::Request {
                    req: Request::Stats,
                    reply,
                    ..
                } => {
                    self.path.counters.control_requests += 1;
                    let list = self.stats();
                    let _ = reply.send((Response::Ok(Reply::Stats { counters: list }), Vec::new()));
                    // Stats sums every QP's counters: one per iteration, so a client
                    // asking in a loop cannot make control work crowd out packets.
                    break;
                }
                ControlMsg::Request {
                    client,
                    uid,
                    req,
                    fds,
                    reply,
                } => {
                    // A group's socket is opened before its first QP attaches, so that
                    // a group the kernel will not join is refused, not silent.
                    if let Err(message) = self.open_group_of(&req) {
                        let code = ErrorCode::NoResources;
                        let _ = reply.send((Response::Err { code, message }, Vec::new()));
                        continue;
                    }
                    let answer =
                        self.nic
                            .request(now, client, uid, req, fds, &mut self.path.counters);
                    let _ = reply.send(answer);
                }
                ControlMsg::Disconnect { client } => {
                    let opened = self.nic.clients.contains_key(&client);
                    let (q, c, m, p) = self.nic.remove_client(client);
                    if opened {
                        self.path.counters.clients_closed += 1;
                        tracing::info!(
                            client,
                            qps = q,
                            cqs = c,
                            mrs = m,
                            pds = p,
                            "client gone; its objects were destroyed"
                        );
                    }
                }
            }
        }
        // Groups whose last QP left (detached, destroyed, or its client gone), or whose
        // attach was refused after the socket opened, close their socket.
        if n > 0 && !self.groups.is_empty() {
            self.groups.sync(&self.nic.mcast);
        }
        // Only a UD receive needs each datagram's TOS and TTL (its GRH): without a UD QP
        // the kernel is not asked for them.
        if n > 0 {
            self.path.io.report_ip_fields(self.nic.ud_qps > 0);
        }
        n
    }

    /// For an AttachMcast request: opens the socket of its group (`mcast.rs`), unless
    /// open. Why the kernel refused, if it did.
    fn open_group_of(&mut self, req: &Request) -> Result<(), String> {
        let Request::AttachMcast { gid, .. } = req else {
            return Ok(());
        };
        let Some(g) = mcast::group_of(*gid, self.path.local) else {
            return Ok(());
        };
        let gro = self.path.io.gro();
        self.groups
            .open(g, self.path.local, gro, &self.nic.mcast)
            .map_err(|e| format!("cannot join {g}: {e}"))
    }

    /// The counter list of `softnic stats`.
    fn stats(&self) -> Vec<(String, u64)> {
        let gauges = [
            ("clients", self.nic.clients.len() as u64),
            ("qps", self.nic.qps.len() as u64),
            ("srqs", self.nic.srqs.len() as u64),
            ("xrc_domains", self.nic.xrc.domains() as u64),
            ("cqs", self.nic.cqs.len() as u64),
            ("mrs", self.nic.mrs.len() as u64),
            ("fault_held", self.path.fault.held() as u64),
        ];
        let mut nic = self.path.counters;
        let cc = &self.conn_counters;
        nic.control_refused_connections_total = cc.refused_total.load(Ordering::Relaxed);
        nic.control_refused_connections_user = cc.refused_user.load(Ordering::Relaxed);
        nic.control_refused_no_credentials = cc.refused_no_cred.load(Ordering::Relaxed);
        let mut list = counters::report(
            &nic,
            &self.nic.qp_totals(),
            &self.path.fault.counters(),
            &gauges,
        );
        for (n, v) in self.nic.srq_totals().list() {
            list.push((n.to_string(), v));
        }
        for (n, v) in self.nic.cm.stats() {
            list.push((n.to_string(), v));
        }
        list
    }

    /// Up to [`RX_BATCHES`] batches; notes whether the socket was found empty.
    fn receive(&mut self, now: Instant) -> io::Result<usize> {
        let mut total = 0;
        for _ in 0..RX_BATCHES {
            let n = self.path.io.recv_batch(&mut self.batch)?;
            // Fetch the addressed QPs' entries together (QpEntry::prefetch) before
            // handling any datagram. A GRO entry holds one peer NIC's datagrams (one
            // socket each side: one UDP flow), for any of its QPs in any order: each
            // datagram's QP is fetched, once per run of datagrams for the same QP.
            // Nothing is checked here (rx_one checks everything).
            let mut last = None;
            for i in 0..n {
                let Some((bytes, _, _, seg)) = self.batch.get(i) else {
                    continue;
                };
                for d in bytes.chunks(seg.max(1)) {
                    let Ok(bth) = wire::bth::Bth::new_checked(d) else {
                        continue;
                    };
                    let qpn = bth.dest_qpn().value();
                    if last != Some(qpn) {
                        last = Some(qpn);
                        if let Some(e) = self.nic.qps.get(&qpn) {
                            e.prefetch();
                        }
                    }
                }
            }
            let local = self.path.local;
            rx_batch(
                &mut self.nic,
                &mut self.path,
                now,
                &self.batch,
                n,
                local,
                None,
            );
            total += n;
            if n < super::udp::RECV_BATCH {
                break;
            }
        }
        // One batch per group socket per iteration (none without attached QPs).
        for (group, io) in self.groups.iter_mut() {
            let n = match io.recv_batch(&mut self.batch) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(%group, error = %e, "multicast receive failed");
                    continue;
                }
            };
            let local = io.local_addr();
            rx_batch(
                &mut self.nic,
                &mut self.path,
                now,
                &self.batch,
                n,
                local,
                Some(group),
            );
            total += n;
        }
        self.rx_empty = total == 0;
        Ok(total)
    }

    /// Sends what the active QPs have, up to [`TX_BUDGET`] packets each; a QP that
    /// used its whole budget is marked `tx_more` and stays active. Every [`RX_EVERY`]
    /// packets it receives what has arrived (the QPs listed while it ran wait for the
    /// next pass).
    fn transmit(&mut self, now: Instant) -> io::Result<usize> {
        if self.path.io.max_segments() > 1 && self.path.fault.fits_runs() {
            return self.transmit_segments(now);
        }
        let mut sent = 0;
        let mut since_rx = 0;
        for k in 0..self.nic.active.len() {
            if since_rx >= RX_EVERY {
                since_rx = 0;
                self.receive(now)?;
            }
            let Some(&it) = self.nic.active.items().get(k) else {
                break;
            };
            let mrs = &self.nic.mrs;
            let Some(e) = self.nic.qps.get_mut(&it.qpn).filter(|e| e.ticket.owns(it)) else {
                continue;
            };
            e.tx_more = true;
            for _ in 0..TX_BUDGET {
                let Some(t) = e.qp.poll_transmit(now, &mut self.tx_buf[..TX_SLOT], mrs) else {
                    e.tx_more = false;
                    break;
                };
                let Some(pkt) = self.tx_buf.get_mut(..t.len) else {
                    break;
                };
                self.path.transmit(now, pkt, (t.dest, t.tclass), t.digest);
                sent += 1;
                since_rx += 1;
            }
        }
        Ok(sent)
    }

    /// The GSO send path: consecutive packets to one destination — from one QP or from
    /// several active QPs, since each datagram is independent on the wire — all of the
    /// first packet's length except possibly a shorter last one, are laid out at a
    /// stride of that length and sent with one `sendmsg`; segment k's ICRC is computed
    /// with IPv4 ID k. A packet that does not fit the run (another destination, or
    /// longer) ends it: the run is sent and the packet starts the next one. A packet the
    /// fault injector drops never joins (`fault.rs`: loss keeps the runs). A QP's own
    /// packets keep their order (runs are sent in the order they were built). So many
    /// QPs with one small message each (ACKs too) cost a few `sendmsg`s, not one each.
    fn transmit_segments(&mut self, now: Instant) -> io::Result<usize> {
        let mut sent = 0;
        let max = self.path.io.max_segments();
        let mut run = Run::default();
        let mut since_rx = 0;
        // QPs the receives below list are behind these: they wait for the next pass.
        for k in 0..self.nic.active.len() {
            if since_rx >= RX_EVERY {
                // What was built goes out first: an ACK received now answers only
                // packets on the wire.
                sent += run.send(&mut self.path, now, &mut self.tx_buf, &self.tx_digests);
                since_rx = 0;
                self.receive(now)?;
            }
            let Some(&it) = self.nic.active.items().get(k) else {
                break;
            };
            let mrs = &self.nic.mrs;
            let Some(e) = self.nic.qps.get_mut(&it.qpn).filter(|e| e.ticket.owns(it)) else {
                continue;
            };
            let mut budget = TX_BUDGET;
            while budget > 0 {
                let off = run.end();
                if run.k > 0
                    && (run.closed
                        || run.k >= max
                        || off + TX_SLOT > self.tx_buf.len()
                        || off - run.base + run.seg > super::udp::GSO_MAX_BYTES)
                {
                    sent += run.send(&mut self.path, now, &mut self.tx_buf, &self.tx_digests);
                    continue;
                }
                // Read in place, field by field: copied out of the `Option`, its
                // `SocketAddr` was loaded in pieces straddling the callee's stores, a
                // store-forwarding stall per packet (docs/perf.md, session 10).
                let polled =
                    e.qp.poll_transmit(now, &mut self.tx_buf[off..off + TX_SLOT], mrs);
                let Some(t) = polled.as_ref() else {
                    break;
                };
                budget -= 1;
                since_rx += 1;
                if self.path.fault.drops(&self.tx_buf[off..off + t.len]) {
                    continue; // lost on purpose: not kept, the next packet reuses its slot
                }
                if run.k == 0 {
                    run = Run::start(off, t.len, t.dest, t.tclass);
                    self.tx_digests[0] = t.digest;
                } else if run.dest.as_ref() != Some(&t.dest)
                    || t.len > run.seg
                    || t.tclass != run.tos
                {
                    // Does not fit (another destination or traffic class — one TOS per
                    // `sendmsg` — or longer): send the run, then this packet starts the next one
                    // where it lies (a 64 KiB WRITE's First packet, after the previous
                    // message's Middles: no 4 KiB copy per message), or at the start
                    // of the buffer when a whole run would not fit behind it.
                    sent += run.send(&mut self.path, now, &mut self.tx_buf, &self.tx_digests);
                    let base = if off + RUN_ROOM <= self.tx_buf.len() {
                        off
                    } else {
                        self.tx_buf.copy_within(off..off + t.len, 0);
                        0
                    };
                    run = Run::start(base, t.len, t.dest, t.tclass);
                    self.tx_digests[0] = t.digest;
                } else {
                    if let Some(d) = self.tx_digests.get_mut(run.k) {
                        *d = t.digest;
                    }
                    run.k += 1;
                    run.last_len = t.len;
                    // A shorter segment must be the last.
                    run.closed = t.len < run.seg;
                }
            }
            e.tx_more = budget == 0;
        }
        Ok(sent + run.send(&mut self.path, now, &mut self.tx_buf, &self.tx_digests))
    }

    /// Writes the completions the active QPs have now and publishes them, before the
    /// loop transmits: a received SEND's receive completion reaches its client while
    /// the NIC is still to send the ACK (the ACK's `sendmsg`, with its loopback delivery,
    /// took ≈ 3 µs that the client would otherwise wait: issue 12, docs/perf.md
    /// "Latency"). Every active QP stays active for the transmit pass.
    /// Returns how many were written, and whether a receive completion was among them.
    fn publish(&mut self, now: Instant) -> (usize, bool) {
        self.write_completions(now, false)
    }

    /// After transmit: writes the completions transmit made (UD and UC sends complete
    /// when sent, a send that failed its local checks at once), re-arms the active
    /// QPs' timers, and keeps in the active set only those with more to send, ring
    /// entries they can take now, or completions waiting for CQ room.
    fn complete(&mut self, now: Instant) -> usize {
        self.write_completions(now, true).0
    }

    /// Moves the active QPs' completions into their CQs and publishes each CQ written
    /// once. `settle`: re-arm timers and drop finished QPs from the active set (after
    /// transmit); otherwise every QP stays, in its order. Returns how many were written
    /// and whether a receive completion was among them.
    fn write_completions(&mut self, now: Instant, settle: bool) -> (usize, bool) {
        let (mut n, mut received) = (0, false);
        let items = self.nic.active.take();
        let stamp = self.clock.monotonic_ns(now);
        for &it in &items {
            let Some(e) = self.nic.qps.get_mut(&it.qpn) else {
                continue;
            };
            if !ActiveSet::claim(it, &mut e.ticket) {
                continue;
            }
            e.take_completions();
            if e.pending() > 0 {
                let recv = e.pending_recv();
                let k = e.deliver(
                    (now, stamp),
                    &mut self.path.counters,
                    &mut self.nic.cqs,
                    &self.nic.srqs,
                    &mut self.dirty_cqs,
                );
                if k > 0 {
                    n += k;
                    received |= recv;
                    // Send CQ first: its event then reaches a shared completion channel
                    // before the receive CQ's. perftest's latency loops with `-e` take
                    // one event after a signaled send and poll the send CQ once; when
                    // the answer and the ACK land in one pass, the receive CQ's event
                    // first left the send completion unpolled until the send CQ
                    // overran (ibverbs_stock `stock_perftest_latency_with_completion_events`).
                    self.dirty_cqs.push(e.send_cq);
                    self.dirty_cqs.push(e.recv_cq);
                }
            }
            // After delivery (a CQ overrun raises QP_FATAL), before the CQs are published.
            async_events::note_qp(e, &mut self.nic.clients);
            let keep = if settle {
                self.nic.deadlines.arm(it.qpn, e.qp.poll_timeout());
                e.pending() > 0 || e.tx_more || e.needs_drain()
            } else {
                true
            };
            if keep {
                self.nic.active.mark(it.qpn, &mut e.ticket);
            }
        }
        self.nic.active.recycle(items);
        self.flush_cqs(n);
        (n, received)
    }

    /// Publishes (and wakes, when armed) each CQ written since the last call, once.
    fn flush_cqs(&mut self, written: usize) {
        self.path.trace.cqe(written);
        for h in self.dirty_cqs.drain(..) {
            if let Some(cq) = self.nic.cqs.get_mut(&h) {
                cq.flush();
                self.path.counters.poller_wakes += cq.take_poller_wakes();
            }
        }
    }

    /// Earliest instant something is due without external input.
    /// (The QP part may be early: see `ready::Deadlines`; waking early costs one
    /// iteration that re-arms.)
    fn next_deadline(&mut self) -> Option<Instant> {
        let qp = self
            .nic
            .deadlines
            .earliest()
            .into_iter()
            .chain(self.nic.cm.cm.poll_timeout())
            .min();
        match (qp, self.path.fault.next_release()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Empties the wake-up descriptors the last sleep found readable, and only those
    /// (one `read(2)` each): called after the first pass's transmit, so the packet of
    /// the post that woke the NIC leaves before this bookkeeping. Nothing is lost by
    /// waiting: a wake-up only ends a sleep, and before the next one `sleep` re-checks
    /// the control channel and every doorbell page. A descriptor not drained (it
    /// became readable after the wait) ends the next sleep at once, which drains it.
    fn drain_wakes(&mut self) {
        if std::mem::take(&mut self.wake_ctl) {
            let _ = verbs_api::os::eventfd_drain(self.ctl_wake.as_fd());
        }
        for id in self.wake_clients.drain(..) {
            if let Some(c) = self.nic.clients.get(&id) {
                let _ = c.wake.drain();
            }
        }
    }

    fn sleep(&mut self, now: Instant) -> io::Result<()> {
        let mut busy = !self.ctl_rx.is_empty() || !self.srq_carry.is_empty();
        // NEED_WAKEUP on each client's doorbell page, fence, re-check its doorbells.
        for c in self.nic.clients.values() {
            busy |= c.doorbells.arm();
        }
        if !busy {
            // Completions waiting for CQ room: the client frees room by polling, which
            // makes no syscall, so check back soon rather than at the next timer.
            // Such QPs stay in the active set, so this looks at the active QPs only.
            let (qps, active) = (&self.nic.qps, &self.nic.active);
            let cq_wait = active.items().iter().any(|&it| {
                qps.get(&it.qpn)
                    .is_some_and(|e| e.ticket.owns(it) && e.pending() > 0)
            });
            let cap = if cq_wait { CQ_FULL_RECHECK } else { MAX_SLEEP };
            let timeout = self
                .next_deadline()
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(MAX_SLEEP)
                .min(cap);
            // Rebuilt in place: the set keeps its allocation from sleep to sleep.
            let polls = &mut self.polls;
            polls.clear();
            polls.push(self.path.io.poll_fd());
            let ctl = polls.push(self.ctl_wake.as_fd());
            for c in self.nic.clients.values() {
                polls.push(c.wake.read_end());
            }
            for io in self.groups.iter() {
                polls.push(io.poll_fd());
            }
            // To the microsecond (ppoll), not poll(2)'s whole milliseconds: a
            // retransmission timer 100 µs away must not wait 1 ms (issue 12: at 5 %
            // loss the timer-repaired losses waited ≈ 1.2 ms, a fifth of the run).
            // A signal ends the wait early; the loop then sees the stop flag.
            polls.wait(timeout)?;
            self.path.counters.sleeps += 1;
            // Note what woke it; `drain_wakes` empties those, after the next transmit.
            // (The client map is unchanged since the pushes: the same order.)
            self.wake_ctl = polls.readable(ctl);
            for (i, (&id, _)) in self.nic.clients.iter().enumerate() {
                if polls.readable(ctl + 1 + i) {
                    self.wake_clients.push(id);
                }
            }
            if let Some(p) = self.path.pcap.as_mut() {
                let _ = p.flush();
            }
        }
        for c in self.nic.clients.values() {
            c.doorbells.disarm();
        }
        Ok(())
    }
}

/// A GSO run being built in the transmit buffer: `k` packets from `base` at a stride of
/// `seg` bytes (the last `last_len`), all to `dest` with IP TOS `tos`.
#[derive(Debug, Default)]
struct Run {
    /// Where the run's first packet starts in the buffer.
    base: usize,
    k: usize,
    seg: usize,
    last_len: usize,
    dest: Option<SocketAddr>,
    tos: u8,
    /// Ended by a shorter packet: nothing more may join.
    closed: bool,
}

impl Run {
    fn start(base: usize, len: usize, dest: SocketAddr, tos: u8) -> Run {
        Run {
            base,
            k: 1,
            seg: len,
            last_len: len,
            dest: Some(dest),
            tos,
            closed: false,
        }
    }

    /// Where the next packet goes: after the run's `k` packets (the buffer's start once
    /// the run was sent).
    fn end(&self) -> usize {
        self.base + self.k * self.seg
    }

    /// Sends the run (one `sendmsg`) and empties it; returns its packet count.
    fn send(
        &mut self,
        path: &mut PacketPath,
        now: Instant,
        buf: &mut [u8],
        digests: &[Option<PayloadDigest>],
    ) -> usize {
        let k = std::mem::take(&mut self.k);
        let base = std::mem::take(&mut self.base);
        let Some(d) = self.dest.take().filter(|_| k > 0) else {
            return 0;
        };
        let total = (k - 1) * self.seg + self.last_len;
        if let Some(run) = buf.get_mut(base..base + total) {
            let digests = digests.get(..k).unwrap_or_default();
            path.transmit_run(now, (run, self.seg), digests, (d, self.tos));
        }
        k
    }
}

/// Whether this thread and the main thread of each client in `pids` may run on one
/// CPU only, the same one, with at least one client ([`CO_PINNED_IDLE_SPINS`]). A
/// client whose affinity cannot be read (gone, or another user's) counts as not pinned.
fn co_pinned_now(pids: impl Iterator<Item = u32>) -> bool {
    // An unpinned NIC (the default) reads no client's affinity.
    let Ok(own) = rustix::thread::sched_getaffinity(None) else {
        return false;
    };
    if own.count() != 1 {
        return false;
    }
    let clients = pids.map(|pid| {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::thread::Pid::from_raw);
        pid.ok_or(rustix::io::Errno::SRCH)
            .and_then(|p| rustix::thread::sched_getaffinity(Some(p)))
    });
    co_pinned(&own, clients)
}

/// [`co_pinned_now`] on affinities already read: `own` allows exactly one CPU and
/// every client's set is that same set (at least one client).
fn co_pinned<E>(
    own: &rustix::thread::CpuSet,
    clients: impl Iterator<Item = Result<rustix::thread::CpuSet, E>>,
) -> bool {
    let mut any = false;
    for c in clients {
        match c {
            Ok(set) if own.count() == 1 && set == *own => any = true,
            _ => return false,
        }
    }
    any
}

/// Says which UDP offloads are in use, and why one asked for is not.
fn log_offloads(cfg: &Config, got: Offloads) {
    tracing::info!(gso = got.gso, gro = got.gro, "UDP offloads");
    if cfg.offloads.gso && !got.gso {
        tracing::warn!("the kernel refused UDP_SEGMENT: one send per packet");
    }
    if cfg.offloads.gro && !got.gro {
        tracing::warn!("the kernel refused UDP_GRO: one datagram per receive slot");
    }
    if got.gso && !cfg.fault.fits_runs() {
        tracing::info!("fault injection: packets are sent one by one, GSO unused");
    }
}

/// Says how much of a burst the socket holds, and warns when `net.core.rmem_max` cut
/// the NIC's request: what overflows it is dropped by the kernel before the NIC sees
/// it (RC resends it; UC and UD lose it), and Linux's default cap is 208 KiB.
fn log_recv_buffer(granted: usize) {
    let asked = super::udp::SOCKET_BUFFER;
    tracing::info!(kib = granted / 1024, "UDP receive buffer");
    if granted < asked {
        tracing::warn!(
            granted_kib = granted / 1024,
            asked_kib = asked / 1024,
            "net.core.rmem_max caps the receive buffer: bursts beyond it are dropped (RC \
             resends them, UC and UD lose them); `sysctl -w net.core.rmem_max={asked}` \
             lifts the cap"
        );
    }
}

/// Where the datagrams of one GRO buffer came from.
struct Origin {
    /// The sender, if of this NIC's address family.
    peer: Option<SocketAddr>,
    /// The kernel truncated the buffer.
    truncated: bool,
    /// The sender's ICRC look-ups (`None` for another address family).
    icrc: Option<rx_icrc::Sender>,
    /// The address the datagrams were sent to: the NIC's own, or a group's.
    local: SocketAddr,
    /// The multicast group they were sent to (`mcast.rs`), `None` for the NIC's own
    /// address.
    group: Option<std::net::IpAddr>,
    /// Their IP TOS / traffic class and TTL / hop limit, as the socket reported them
    /// (one pair per GRO buffer: GRO merges only datagrams that agree on both).
    tos: u8,
    ttl: u8,
}

/// Hands the first `n` entries of `batch`, received on the socket bound to `local`
/// (the NIC's own, or the multicast `group`'s), to [`rx_one`] datagram by datagram.
/// With GRO one entry holds several datagrams of `seg` bytes, all from one sender: its
/// ICRC look-ups are made once (`rx_icrc::Sender`).
#[inline]
fn rx_batch(
    nic: &mut Nic,
    path: &mut PacketPath,
    now: Instant,
    batch: &RecvBatch,
    n: usize,
    local: SocketAddr,
    group: Option<std::net::IpAddr>,
) {
    for i in 0..n {
        let Some((bytes, peer, truncated, seg)) = batch.get(i) else {
            continue;
        };
        let (tos, ttl) = batch.ip_fields(i);
        let from = Origin {
            peer: peer.filter(|p| p.is_ipv4() == local.is_ipv4()),
            truncated,
            icrc: peer.and_then(|p| path.solver.sender(local, p)),
            local,
            group,
            tos,
            ttl,
        };
        for (k, d) in bytes.chunks(seg.max(1)).enumerate() {
            path.trace.rx(d);
            rx_one(nic, path, now, d, &from, k);
        }
    }
}

/// Handles one received datagram (the `position`-th of its GRO buffer): parse, ICRC,
/// demultiplex, transport — the payload of a packet the transport may place before its
/// check written and hashed in one pass first (`rx_place.rs`).
fn rx_one(
    nic: &mut Nic,
    path: &mut PacketPath,
    now: Instant,
    bytes: &[u8],
    from: &Origin,
    position: usize,
) {
    let c = &mut path.counters;
    c.rx_datagrams += 1;
    c.rx_bytes += bytes.len() as u64;
    if from.truncated {
        c.rx_drop_truncated += 1;
        return;
    }
    let (Some(peer), Some(icrc)) = (from.peer, from.icrc.as_ref()) else {
        c.rx_drop_bad_source += 1;
        return;
    };
    // Parsed once, for the placement and for handling. Borrowed from the `Result`, not
    // moved out of it: moving the ~200-byte parsed packet cost a `memcpy` call per
    // packet (2 % of the dataplane bench at 64 KiB).
    let parsed = PacketRepr::parse(bytes);
    let placed = match &parsed {
        Ok(pkt) if from.group.is_none() => rx_place::place_received(nic, pkt, peer),
        _ => None,
    };
    // Two calls, not one with an `Option`: `verify_from` is the check with no digest
    // folded in at compile time, and the generic one cost an 8 B packet ≈ 15 ns more
    // (`dataplane -- small`).
    let verified = match &placed {
        None => path.solver.verify_from(icrc, bytes, position),
        Some(s) => path
            .solver
            .verify_with(icrc, bytes, position, Some(s.digest)),
    };
    if let Some(p) = path.pcap.as_mut() {
        let params = match &verified {
            Some((params, _)) => Some(*params),
            None => rx_icrc::params(from.local, peer, 0),
        };
        if let Some(params) = params {
            if p.record(&params, from.tos, bytes).is_err() {
                path.pcap = None;
            }
        }
    }
    let ipv4_id = match &verified {
        Some((
            IcrcParams {
                ip: IpParams::V4 { id, .. },
                ..
            },
            _,
        )) => *id,
        _ => 0,
    };
    match verified {
        Some((_, IcrcPath::Ipv4Id0)) => c.rx_icrc_id0 += 1,
        Some((_, IcrcPath::Ipv4Segment)) => c.rx_icrc_segment_id += 1,
        Some((_, IcrcPath::Ipv4Solved)) => c.rx_icrc_solved += 1,
        Some((_, IcrcPath::Ipv6)) => c.rx_icrc_ipv6 += 1,
        None => {
            if bytes.len() < wire::bth::HEADER_LEN + wire::ICRC_LEN {
                c.rx_drop_parse_truncated += 1;
            } else {
                c.rx_drop_bad_icrc += 1;
                c.rx_placed_bad_icrc += u64::from(placed.is_some());
            }
            return;
        }
    }
    let pkt = match &parsed {
        Ok(p) => p,
        Err(e) => {
            counters::count_parse_error(c, e);
            return;
        }
    };
    let qpn = pkt.repr.bth.dest_qpn.value();
    let ip = ReceivedIp {
        group: from.group,
        tos: from.tos,
        ttl: from.ttl,
        ipv4_id,
    };
    if let Some(group) = from.group {
        // A group's datagram goes to the multicast QPN, and from there to every QP
        // attached to the group (each checks its Q_Key); nothing else is accepted on a
        // group's socket.
        if qpn != mcast::MULTICAST_QPN {
            c.rx_drop_mcast_qpn += 1;
            return;
        }
        c.rx_mcast_datagrams += 1;
        for i in 0..nic.mcast.members(group).len() {
            let q = nic.mcast.members(group)[i];
            deliver(nic, c, now, peer, &ip, pkt, None, q);
        }
        return;
    }
    if pkt.repr.bth.dest_qpn == wire::Qpn::GSI {
        nic.cm.handle_packet(now, peer, pkt);
        return;
    }
    deliver(nic, c, now, peer, &ip, pkt, placed.as_ref(), qpn);
}

/// Hands a checked packet to QP `qpn` (with the IP header fields it came with, among
/// them the multicast group it was sent to, if any), through its SRQ if it has one (an
/// XRC receive QP: the XRC SRQ the packet names, [`xrc_srq_of`]), and lists the QP for
/// a visit.
#[allow(clippy::too_many_arguments)]
pub(super) fn deliver(
    nic: &mut Nic,
    c: &mut NicCounters,
    now: Instant,
    peer: SocketAddr,
    ip: &ReceivedIp,
    pkt: &wire::ParsedPacket<'_>,
    placed: Option<&rx_place::Speculation>,
    qpn: u32,
) {
    let Some(e) = nic.qps.get_mut(&qpn) else {
        c.rx_drop_unknown_qpn += 1;
        return;
    };
    let mrs = &mut nic.mrs;
    let payload = pkt.payload;
    match source::check(e.qp.qp_type(), e.qp.attrs().remote, peer) {
        Ok(()) => {
            let srq = match e.xrc {
                Some(x) => xrc_srq_of(&nic.xrc, &nic.srqs, x.domain, pkt),
                None => e.qp.srq(),
            };
            match srq.and_then(|h| Some((h, nic.srqs.get_mut(&h)?))) {
                Some((h, s)) => {
                    s.refill(c);
                    let xrc = e.xrc.is_some();
                    rx_place::handle(placed, mrs, payload, c, |m| {
                        if xrc {
                            e.qp.handle_packet_xrc(now, peer, ip, pkt, m, &mut s.srq)
                        } else {
                            e.qp.handle_packet_srq_to(now, peer, ip, pkt, m, &mut s.srq)
                        }
                    });
                    // A WQE the packet took frees its ring slot (before this
                    // iteration's completions are written: no walk over every SRQ).
                    if s.backlog() {
                        // The pool was full with entries left in the ring; this packet
                        // may have taken a WQE: top it up (the doorbell is spent). The
                        // drain releases the slots as it ends.
                        s.drain_ring(c);
                    } else {
                        s.release_slots();
                    }
                    // The WQE taken may have crossed the limit, the refill or top-up
                    // may have found a bad entry: list the SRQ while it is in hand.
                    async_events::note_srq(h, s, &mut nic.clients);
                }
                None if e.xrc.is_some() => {
                    // No XRC SRQ of the QP's domain by that number: the QP refuses the
                    // request (NAK Remote Access Error, Err) once it has passed the
                    // state and PSN checks; a packet without an XRCETH (another
                    // service's, or a response) is dropped there as such.
                    c.rx_xrc_srq_refused += u64::from(pkt.repr.xrceth.is_some());
                    rx_place::handle(placed, mrs, payload, c, |m| {
                        e.qp.handle_packet_xrc_no_srq(now, peer, ip, pkt, m)
                    });
                }
                None => {
                    // Only a packet that needs a receive WQE reads the RQ ring: with
                    // thousands of QPs taking WRITEs, reading each one's cold ring
                    // header was a cache miss per message burst for nothing.
                    if pkt.repr.info().is_ok_and(|i| i.consumes_recv_wqe()) {
                        e.refill_recv(now, c);
                    }
                    rx_place::handle(placed, mrs, payload, c, |m| {
                        e.qp.handle_packet_to(now, peer, ip, pkt, m)
                    })
                }
            }
            // It may have a response, an ACK or a completion now: visit it. And keep it
            // listed until a transmit visit has asked what it has to send: a packet
            // received in the middle of a transmit pass (`RX_EVERY`) may reach a QP that
            // pass has visited already, or lists one behind its end.
            nic.active.mark(qpn, &mut e.ticket);
            e.tx_more = true;
        }
        Err(source::Mismatch::Address) => c.rx_drop_source_address += 1,
        Err(source::Mismatch::Port) => c.rx_drop_source_port += 1,
    }
}

/// The XRC SRQ that `pkt`, a packet for an XRC receive QP of `domain`, is for: the one
/// its XRCETH names (IBTA 9.3 XRCETH), if that is an XRC SRQ of the domain. `None`:
/// no XRCETH (the parser gives every XRC request opcode one, so this is another
/// service's packet or a response, which an XRC receive QP takes neither of), no such
/// SRQ, or an SRQ of another domain, which this QP must not reach (the XRC target
/// uses only the XRC SRQs of its own domain).
fn xrc_srq_of(
    xrc: &XrcTable,
    srqs: &KeyMap<SrqEntry>,
    domain: u32,
    pkt: &wire::ParsedPacket<'_>,
) -> Option<u32> {
    let eth = pkt.repr.xrceth?;
    xrc::srq_for_request(xrc, srqs, domain, eth.srqn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet path on a GSO socket bound to 127.0.0.1, without faults or capture.
    fn loopback_path() -> PacketPath {
        let want = Offloads {
            gso: true,
            gro: false,
        };
        let io = UdpIo::bind_with("127.0.0.1:0".parse().expect("addr"), want).expect("bind");
        PacketPath {
            local: io.local_addr(),
            io,
            fault: FaultInjector::new(Default::default()),
            pcap: None,
            counters: NicCounters::default(),
            solver: rx_icrc::IdSolver::new(),
            trace: Trace::new(None, &Clock::new()),
        }
    }

    fn cpus(list: &[usize]) -> rustix::thread::CpuSet {
        let mut s = rustix::thread::CpuSet::new();
        for &i in list {
            s.set(i);
        }
        s
    }

    /// The idle spin between yields is for a NIC pinned to one CPU with all of its
    /// clients, and only then.
    #[test]
    fn co_pinned_needs_one_cpu_shared_by_the_nic_and_every_client() {
        let ok = |l: &[usize]| Ok::<_, ()>(cpus(l));
        let one = cpus(&[1]);
        assert!(co_pinned(&one, [ok(&[1])].into_iter()));
        assert!(co_pinned(&one, [ok(&[1]), ok(&[1])].into_iter()));
        assert!(
            !co_pinned(&one, std::iter::empty::<Result<_, ()>>()),
            "no client"
        );
        assert!(!co_pinned(&one, [ok(&[0])].into_iter()), "client elsewhere");
        assert!(
            !co_pinned(&one, [ok(&[1]), ok(&[0, 1])].into_iter()),
            "one unpinned"
        );
        assert!(
            !co_pinned(&one, [ok(&[1]), Err(())].into_iter()),
            "one unreadable"
        );
        assert!(
            !co_pinned(&cpus(&[0, 1]), [ok(&[0, 1])].into_iter()),
            "NIC unpinned"
        );
    }

    /// This test process (its main thread) as the client of a NIC thread pinned to
    /// the CPU it runs on: co-pinned only once the client is pinned there too.
    #[test]
    fn co_pinned_now_reads_the_threads_affinities() {
        let pid = std::process::id();
        let cpu = rustix::thread::sched_getcpu();
        let nic = std::thread::spawn(move || {
            let all = rustix::thread::sched_getaffinity(None).expect("own affinity");
            rustix::thread::sched_setaffinity(None, &cpus(&[cpu])).expect("pin");
            let own_pid = rustix::thread::Pid::from_raw(i32::try_from(pid).unwrap());
            let main = rustix::thread::sched_getaffinity(own_pid).expect("main's affinity");
            let got = co_pinned_now([pid].into_iter());
            let gone = co_pinned_now([u32::MAX].into_iter());
            rustix::thread::sched_setaffinity(None, &all).expect("unpin");
            (main == cpus(&[cpu]), got, gone)
        });
        let (main_pinned, got, gone) = nic.join().expect("thread");
        assert_eq!(
            got, main_pinned,
            "co-pinned exactly when the client is pinned there"
        );
        assert!(!gone, "a client whose affinity cannot be read");
    }

    /// A run that starts inside the transmit buffer (where a packet that did not fit the
    /// run before it was written) is sent from there, not from the buffer's start, and
    /// the run after it starts at the buffer's start again.
    #[test]
    fn a_run_started_inside_the_buffer_is_sent_from_its_base() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind receiver");
        rx.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let dest = rx.local_addr().expect("addr");
        let mut path = loopback_path();
        let (base, seg) = (300, 64);
        // What lies before `base` (an earlier run's packets) must not be sent.
        let mut buf = vec![0xAA; 1024];
        for (i, b) in buf[base..base + 2 * seg].iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut run = Run::start(base, seg, dest, 0);
        run.k = 2;
        assert_eq!(run.end(), base + 2 * seg);
        let sent = run.send(&mut path, Clock::new().now(), &mut buf, &[None, None]);
        assert_eq!(sent, 2);
        assert_eq!(run.end(), 0, "the next run starts at the buffer's start");
        for k in 0..2 {
            let mut d = [0u8; 256];
            let n = rx.recv(&mut d).expect("a segment of the run");
            assert_eq!(n, seg);
            // The ICRC (the last four bytes) was filled in; the rest is the packet.
            let want: Vec<u8> = (k * seg..(k + 1) * seg - 4).map(|i| i as u8).collect();
            assert_eq!(d[..seg - 4], want[..], "segment {k}");
        }
    }
}
