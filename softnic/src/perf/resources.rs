//! The verbs objects of a run, laid out as perftest lays them out so that a stock peer
//! targets addresses inside our region (`perftest_resources.c`: `create_mr`,
//! `set_up_connection`, `ctx_modify_qp_to_{init,rtr,rts}`).
//!
//! One region of `2 × qps × BUFF` bytes, `BUFF = max(size, cycle buffer)`: QP `i` sends
//! from (and READs/atomics land in) slot `i`, and offers slot `qps + i` to the peer
//! (its `vaddr`). Messages smaller than half the cycle buffer walk through it in steps
//! of `INC(size)` (perftest's `increase_loc_addr` / `increase_rem_addr`).

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, MemoryRegion, Mtu, ProtectionDomain,
    QpAttr, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr, Sge, SharedReceiveQueue,
    SrqInitAttr, WcStatus, WorkCompletion,
};

use super::args::{Params, Verb};
use super::exchange::Dest;

/// perftest's `MIN_RNR_TIMER` (IBTA table 45: 12 = 0.64 ms).
const MIN_RNR_TIMER: u8 = 12;
/// perftest's `DEF_QP_TIME` (4.096 µs × 2^14 ≈ 67 ms).
const QP_TIMEOUT: u8 = 14;
/// perftest's GRH hop limit.
const HOP_LIMIT: u8 = 0xff;

/// Buffer geometry, shared by both sides after the system-data exchange.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Number of QPs.
    pub qps: usize,
    /// `BUFF_SIZE(max size, cycle buffer)`: one slot.
    pub buff: usize,
    /// Cycle buffer (the larger page size of the two sides).
    pub cycle: u64,
    /// Cache line size (the larger of the two sides).
    pub cache_line: u64,
}

impl Geometry {
    /// perftest's `INC(size, cache_line_size)`.
    pub fn inc(&self, size: u64) -> u64 {
        let cl = self.cache_line.max(1);
        if size > cl {
            size.div_ceil(cl) * cl
        } else {
            cl
        }
    }

    /// Offset inside a slot of the `n`-th operation of a QP: the walk through the cycle
    /// buffer for messages up to half of it, else always 0. Atomics always walk.
    pub fn offset(&self, size: u64, n: u64, walk: bool) -> u64 {
        if walk || size <= self.cycle / 2 {
            let inc = self.inc(size);
            let steps = (self.cycle / inc).max(1);
            (n % steps) * inc
        } else {
            0
        }
    }

    /// Number of distinct offsets of [`Self::offset`].
    pub fn slots(&self, size: u64, walk: bool) -> u64 {
        if walk || size <= self.cycle / 2 {
            (self.cycle / self.inc(size)).max(1)
        } else {
            1
        }
    }

    /// Start of QP `q`'s local slot, relative to the region.
    pub fn local(&self, q: usize) -> usize {
        q * self.buff
    }

    /// Start of QP `q`'s slot offered to the peer, relative to the region.
    pub fn remote(&self, q: usize) -> usize {
        (self.qps + q) * self.buff
    }

    /// Region length.
    pub fn region_len(&self) -> usize {
        2 * self.qps * self.buff
    }
}

/// Everything a run uses. Fields drop in order: QPs before their CQs and region.
pub struct Resources {
    /// One QP per `-q`.
    pub qps: Vec<QueuePair>,
    /// With `--use-srq`, the SRQ every QP receives from (its receives go here).
    pub srq: Option<SharedReceiveQueue>,
    /// Send completions.
    pub send_cq: CompletionQueue,
    /// Receive completions.
    pub recv_cq: CompletionQueue,
    /// The region.
    pub mr: MemoryRegion,
    /// Its protection domain.
    pub pd: ProtectionDomain,
    /// The device.
    pub ctx: Context,
    /// Layout.
    pub geo: Geometry,
    /// Outstanding READ/atomics we accept and announce.
    pub out_reads: u32,
    /// Send queue depth as created.
    pub sq_depth: u32,
}

/// Opens the `-d` device, or the first one found.
pub fn open_device(p: &Params) -> Result<Context, String> {
    let name = match &p.device {
        Some(d) => d.clone(),
        None => Device::list()
            .map_err(|e| e.to_string())?
            .first()
            .map(|d| d.name().to_string())
            .ok_or("No softnic devices found (is `softnic run` running? see $SOFTNIC_DIR)")?,
    };
    Device::open(&name).map_err(|e| format!("Couldn't open device {name}: {e}"))
}

/// Our MTU as perftest's `set_mtu` chooses it: `-m` if not above the port's, else the
/// port's active MTU.
pub fn local_mtu(ctx: &Context, p: &Params) -> u32 {
    let port = ctx.attributes().mtu;
    match p.mtu {
        Some(m) if m <= port => m,
        Some(m) => {
            println!("Requested mtu is higher than active mtu \nChanging to active mtu - {port}");
            let _ = m;
            port
        }
        None => port,
    }
}

/// The QP access flags perftest grants per verb (`ctx_modify_qp_to_init`).
fn qp_access(verb: Verb) -> AccessFlags {
    match verb {
        Verb::Atomic => AccessFlags::REMOTE_ATOMIC,
        Verb::Read => AccessFlags::REMOTE_READ,
        Verb::Write => AccessFlags::REMOTE_WRITE,
        Verb::Send => AccessFlags(AccessFlags::REMOTE_WRITE.0 | AccessFlags::LOCAL_WRITE.0),
    }
}

/// A 24-bit PSN that differs between runs (perftest: `lrand48() & 0xffffff`).
fn random_psn(salt: u64) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u32(std::process::id());
    (h.finish() & 0xff_ffff) as u32
}

impl Resources {
    /// Creates PD, region, CQs and QPs (in INIT), laid out by `geo`.
    pub fn create(ctx: Context, p: &Params, geo: Geometry) -> Result<Resources, String> {
        let err = |what: &'static str| move |e: verbs_api::Error| format!("{what}: {e}");
        let dev = ctx.attributes().clone();
        if geo.qps > dev.max_qp as usize {
            return Err(format!(
                "-q {} is above the device's max_qp, {} (softnic run --max-qps-per-user)",
                geo.qps, dev.max_qp
            ));
        }
        let pd = ctx.alloc_pd().map_err(err("Couldn't allocate PD"))?;
        let mr = pd
            .alloc_mr(geo.region_len(), AccessFlags::ALL)
            .map_err(err("Couldn't allocate MR"))?;
        let sq_depth = p.tx_depth.max(16).min(dev.max_qp_wr);
        let rq_depth = p.rx_depth.max(1).min(dev.max_qp_wr);
        let q = geo.qps as u32;
        let send_cq = ctx
            .create_cq((sq_depth * q).clamp(16, dev.max_cqe))
            .map_err(err("Couldn't create send CQ"))?;
        let recv_cq = ctx
            .create_cq((rq_depth * q).clamp(16, dev.max_cqe))
            .map_err(err("Couldn't create receive CQ"))?;
        let max_rd = dev.max_qp_rd_atom.max(1);
        let out_reads = if matches!(p.verb, Verb::Read | Verb::Atomic) {
            match p.outs {
                Some(o) if o > max_rd => {
                    eprintln!(" Number of outstanding reads is above max = {max_rd}");
                    eprintln!(" Changing to that max value");
                    max_rd
                }
                Some(0) | None => max_rd,
                Some(o) => o,
            }
        } else {
            1
        };
        let cap = QpCap {
            max_send_wr: sq_depth,
            max_recv_wr: rq_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: p.inline_size,
        };
        let srq = if p.use_srq {
            let max_wr = (rq_depth * q).min(dev.max_qp_wr);
            let init = SrqInitAttr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            };
            Some(pd.create_srq(&init).map_err(err("Couldn't create SRQ"))?)
        } else {
            None
        };
        let mut qps = Vec::with_capacity(geo.qps);
        for _ in 0..geo.qps {
            let attr = QpInitAttr {
                qp_type: p.connection,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                cap,
                sq_sig_all: false,
            };
            let mut qp = match &srq {
                Some(s) => pd.create_qp_with_srq(&attr, s),
                None => pd.create_qp(&attr),
            }
            .map_err(err("Couldn't create QP"))?;
            qp.to_init(qp_access(p.verb))
                .map_err(err("Failed to modify QP to INIT"))?;
            qps.push(qp);
        }
        Ok(Resources {
            qps,
            srq,
            send_cq,
            recv_cq,
            mr,
            pd,
            ctx,
            geo,
            out_reads,
            sq_depth,
        })
    }

    /// Our side of the address exchange for QP `q` (`set_up_connection`).
    pub fn my_dest(&self, q: usize) -> Result<Dest, String> {
        let gid = self
            .ctx
            .query_gid(verbs_api::gid::ADDRESS_GID_INDEX)
            .map_err(|e| e.to_string())?;
        let qp = self.qps.get(q).ok_or("no such QP")?;
        Ok(Dest {
            lid: 0,
            out_reads: self.out_reads,
            qpn: qp.qp_num(),
            psn: random_psn(q as u64),
            rkey: self.mr.rkey(),
            vaddr: self.mr.addr() + self.geo.remote(q) as u64,
            gid: gid.0,
            srqn: 0,
        })
    }

    /// `ctx_connect` for QP `q`: RTR towards `rem` (its NIC at UDP port
    /// `peer_udp_port`, the packets of traffic class `tclass`), then RTS if `to_rts`
    /// (perftest leaves a BW server's QPs in RTR: they only respond).
    pub fn connect(
        &mut self,
        q: usize,
        my: &Dest,
        rem: &Dest,
        mtu_bytes: u32,
        to_rts: bool,
        (peer_udp_port, tclass): (u16, u8),
    ) -> Result<(), String> {
        let max_rd = self.ctx.attributes().max_qp_rd_atom.clamp(1, 255);
        let mtu = Mtu::from_bytes(mtu_bytes).ok_or_else(|| format!("invalid MTU {mtu_bytes}"))?;
        let qp = self.qps.get_mut(q).ok_or("no such QP")?;
        let rc = qp.qp_type() == QpType::Rc;
        let clamp = |v: u32| v.clamp(1, max_rd) as u8;
        // UC has no responder resources, RNR timer or retries (ibv_modify_qp(3)).
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(mtu),
            dest_qp_num: Some(rem.qpn),
            rq_psn: Some(rem.psn),
            ah_attr: Some(AhAttr {
                dgid: verbs_api::Gid(rem.gid),
                sgid_index: verbs_api::gid::ADDRESS_GID_INDEX as u8,
                hop_limit: HOP_LIMIT,
                traffic_class: tclass,
                udp_port: peer_udp_port,
            }),
            max_dest_rd_atomic: rc.then(|| clamp(my.out_reads)),
            min_rnr_timer: rc.then_some(MIN_RNR_TIMER),
            ..QpAttr::default()
        };
        qp.modify(&rtr)
            .map_err(|e| format!("Failed to modify QP {:#x} to RTR: {e}", my.qpn))?;
        if to_rts {
            let rts = QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(my.psn),
                timeout: rc.then_some(QP_TIMEOUT),
                retry_cnt: rc.then_some(7),
                rnr_retry: rc.then_some(7),
                max_rd_atomic: rc.then(|| clamp(rem.out_reads)),
                ..QpAttr::default()
            };
            qp.modify(&rts)
                .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
        }
        Ok(())
    }

    /// Posts one receive for QP `q`: to the SRQ with `--use-srq` (any QP may take it),
    /// else to QP `q` itself.
    pub fn post_recv(&mut self, q: usize, wr: &RecvWr<'_>) -> verbs_api::Result<()> {
        match self.srq.as_mut() {
            Some(s) => s.post_recv(std::slice::from_ref(wr)),
            None => match self.qps.get_mut(q) {
                Some(qp) => qp.post_recv(std::slice::from_ref(wr)),
                None => Err(verbs_api::Error::InvalidArgument(format!("no QP {q}"))),
            },
        }
    }

    /// An SGE of `len` bytes at region offset `off` (the caller keeps it inside).
    pub fn sge(&self, off: usize, len: u64) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Fills `len` bytes at region offset `off` with `f(index within the slot)`
    /// (nothing when the range is outside the region).
    pub fn fill(&mut self, off: usize, len: usize, f: impl Fn(usize) -> u8) {
        if off.checked_add(len).is_some_and(|e| e <= self.mr.len()) {
            let bytes: Vec<u8> = (0..len).map(f).collect();
            self.mr.write(off, &bytes);
        }
    }

    /// Reads the byte at region offset `off` as the NIC last wrote it (a volatile copy,
    /// see `MemoryRegion::read`). Panics outside the region.
    pub fn read_byte(&self, off: usize) -> u8 {
        self.mr.read_array::<1>(off)[0]
    }

    /// Writes the byte at region offset `off`. Panics outside the region.
    pub fn write_byte(&mut self, off: usize, v: u8) {
        self.mr.write(off, &[v]);
    }
}

/// Empty polls (or spins) in a row after which the loops yield the core once
/// ([`verbs_api::cq::POLL_YIELD_EVERY`]: the NIC shares the cores); the CQ loops also
/// check their timeout this often.
pub const YIELD_EVERY: u64 = verbs_api::cq::POLL_YIELD_EVERY as u64;

/// Busy-polls `cq` for up to `out.len()` completions; fails after `timeout` without
/// any. Between empty polls, [`CompletionQueue::idle`]: yields every [`YIELD_EVERY`],
/// and sleeps until the NIC signals a completion once none came for the spin window
/// (hybrid polling, the code the C library's `ibv_poll_cq` runs too).
pub fn poll_some(
    cq: &mut CompletionQueue,
    out: &mut [WorkCompletion],
    timeout: Duration,
    what: &str,
) -> Result<usize, String> {
    let mut start: Option<Instant> = None;
    // Bounded by `timeout` (checked every YIELD_EVERY empty polls).
    for spin in 1u64.. {
        let n = cq.poll(out).map_err(|e| format!("poll CQ: {e}"))?;
        if n > 0 {
            return Ok(n);
        }
        if spin.is_multiple_of(YIELD_EVERY) {
            let t0 = *start.get_or_insert_with(Instant::now);
            if t0.elapsed() > timeout {
                return Err(format!("no completion within {timeout:?} while {what}"));
            }
        }
        cq.idle();
    }
    unreachable!("the loop returns")
}

/// Fails on an error completion, naming the operation like perftest's
/// `NOTIFY_COMP_ERROR_SEND`.
pub fn check_wc(wc: &WorkCompletion, what: &str) -> Result<(), String> {
    if wc.status.is_success() {
        Ok(())
    } else {
        Err(format!(
            " Completion with error at {what}:\n Failed status {}: wr_id {:#x} syndrom 0x{:x}",
            wc.status.raw(),
            wc.wr_id,
            wc.vendor_err
        ))
    }
}

/// As [`check_wc`] for a receive completion; when it is a flush, the message also names
/// what moved the QP to ERR if its send queue knows. A receive queue is flushed whatever
/// the cause (IBTA 10.3.1.7), so a side waiting for its peer's SEND reports
/// IBV_WC_WR_FLUSH_ERR for a retry counter used up, a NAK or a local error alike; the
/// cause is the first send completion that is neither a success nor a flush. The NIC
/// writes it with the flush, but may publish the send CQ a moment after the receive
/// CQ, so the send CQ is read for up to [`CAUSE_WAIT`].
pub fn check_recv_wc(
    wc: &WorkCompletion,
    what: &str,
    send_cq: &mut CompletionQueue,
) -> Result<(), String> {
    let Err(mut msg) = check_wc(wc, what) else {
        return Ok(());
    };
    if wc.status != WcStatus::WrFlushErr {
        return Err(msg);
    }
    let mut sends = [WorkCompletion::default(); 16];
    let t0 = Instant::now();
    // Bounded by CAUSE_WAIT.
    while t0.elapsed() < CAUSE_WAIT {
        let n = send_cq.poll(&mut sends).unwrap_or(0);
        let cause = sends[..n]
            .iter()
            .find(|c| !c.status.is_success() && c.status != WcStatus::WrFlushErr);
        if let Some(c) = cause {
            msg += &format!(
                "\n Cause on the send queue: status {}: wr_id {:#x} syndrom 0x{:x}",
                c.status.raw(),
                c.wr_id,
                c.vendor_err
            );
            return Err(msg);
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    msg += "\n No error on the send queue (the NIC moved the QP to ERR: see softnic stats)";
    Err(msg)
}

/// How long [`check_recv_wc`] looks for the cause of a flush on the send queue.
const CAUSE_WAIT: Duration = Duration::from_millis(200);
