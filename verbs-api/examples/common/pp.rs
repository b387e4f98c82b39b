//! What the UC, UD and SRQ ping-pong examples share with rdma-core's `*_pingpong`
//! programs: the flags, the device and its first objects, the address lines they print,
//! the completion loop's polling, and the closing throughput lines.

use std::time::Duration;

use verbs_api::oob;
use verbs_api::*;

/// The flags every `ibv_*_pingpong` has, with rdma-core's letters and defaults. Each
/// example flattens this into its own `Args` beside the flags that differ (`-s`'s
/// default, `-m`, `-q`, `-c`, ...).
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// listen on/connect to port <port>
    #[arg(short = 'p', long = "port", default_value_t = oob::DEFAULT_PORT)]
    pub port: u16,
    /// use device <dev> (default first device found)
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// use port <port> of the device (softnic has port 1)
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u32,
    /// service level value (accepted, unused)
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// local port gid index (1: the NIC's address; 0 is the link-local GID, as in rxe)
    #[arg(short = 'g', long = "gid-idx", default_value_t = 1)]
    pub gid_idx: u32,
    /// UDP port of the peer's NIC (softnic extension; default 4791)
    #[arg(short = 'P', long = "remote-udp-port", default_value_t = 0)]
    pub remote_udp_port: u16,
    /// server to connect to (none: be the server)
    pub host: Option<String>,
}

impl CommonArgs {
    /// The checks the C programs make before touching the device.
    pub fn check(&self) -> Result<(), String> {
        if self.ib_port != 1 {
            return Err(format!("softnic has port 1 only (got -i {})", self.ib_port));
        }
        if self.rx_depth == 0 || self.iters == 0 {
            return Err("rx-depth and iters must be at least 1".into());
        }
        Ok(())
    }

    /// Our GID at `-g`, as the address lines print it.
    pub fn gid(&self, ctx: &Context) -> Result<Gid, String> {
        ctx.query_gid(self.gid_idx)
            .map_err(|e| format!("can't read sgid of index {}: {e}", self.gid_idx))
    }
}

/// What every ping-pong opens first, with the C programs' error messages: the device,
/// a PD, one region of `mr_len` bytes (filled with `0x7b`, as they `memset` it) and a CQ
/// of `cqe` entries.
pub struct Base {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
}

impl Base {
    pub fn open(args: &CommonArgs, mr_len: usize, cqe: u32) -> Result<Base, String> {
        let ctx = open(args.ib_dev.as_deref())?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
        let mut mr = pd
            .alloc_mr(mr_len.max(1), AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("Couldn't register MR: {e}"))?;
        mr.fill(0, mr.len(), 0x7b);
        let cq = ctx
            .create_cq(cqe)
            .map_err(|e| format!("Couldn't create CQ: {e}"))?;
        Ok(Base { ctx, pd, mr, cq })
    }

    /// Whether `size`-byte sends go inline (the C programs' `size <= max_inline_data`).
    pub fn inline(&self, size: u32) -> bool {
        size > 0 && size <= self.ctx.attributes().max_inline
    }

    /// A QP of `qp_type` on [`Base::cq`] with the C programs' capabilities (one send,
    /// `rx_depth` receives, one SGE each), brought to INIT.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        rx_depth: u32,
        inline: u32,
    ) -> Result<QueuePair, String> {
        let mut qp = self
            .pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &self.cq,
                recv_cq: &self.cq,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: inline,
                },
                sq_sig_all: false,
            })
            .map_err(|e| format!("Couldn't create QP: {e}"))?;
        qp.to_init(AccessFlags::NONE)
            .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
        Ok(qp)
    }
}

/// Our endpoint as the address line and the exchange carry it (LID 0 on RoCE, a random
/// 24-bit PSN).
pub fn endpoint(qpn: u32, gid: Gid, salt: u32) -> QpEndpoint {
    QpEndpoint {
        lid: 0,
        qpn,
        psn: random_psn(salt),
        gid,
        udp_port: 0,
    }
}

/// wr_id of every receive (`PINGPONG_RECV_WRID`).
pub const RECV_WRID: u64 = 1;
/// wr_id of every send (`PINGPONG_SEND_WRID`).
pub const SEND_WRID: u64 = 2;

/// Opens `-d <dev>`, or the first device found.
pub fn open(ib_dev: Option<&str>) -> Result<Context, String> {
    let name = match ib_dev {
        Some(d) => d.to_string(),
        None => Device::list()
            .map_err(|e| e.to_string())?
            .first()
            .map(|d| d.name().to_string())
            .ok_or("No IB devices found")?,
    };
    Device::open(&name).map_err(|e| format!("Couldn't get context for {name}: {e}"))
}

/// A random 24-bit PSN (`lrand48() & 0xffffff` in the C programs).
pub fn random_psn(salt: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u32(salt);
    (h.finish() & 0xff_ffff) as u32
}

/// `"  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::ffff:127.0.0.1"`
/// (`sep` is `","`, or `":"` where `ibv_ud_pingpong` prints a colon).
pub fn print_dest(which: &str, e: &QpEndpoint, sep: &str) {
    println!(
        "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        e.lid, e.qpn, e.psn, e.gid
    );
}

/// Polls `cq` until at least one completion (or, with `events`, waits for one CQ
/// event first). Spins as the C programs do, yielding now and then: two ping-pongs and
/// two NICs on a 2-core host otherwise wait a scheduler slice per message.
pub fn poll(
    cq: &mut CompletionQueue,
    wc: &mut [WorkCompletion],
    events: bool,
) -> Result<usize, String> {
    if events {
        cq.wait(Some(Duration::from_secs(10)))
            .map_err(|e| format!("Failed to get cq_event: {e}"))?;
    }
    let mut spins = 0u32;
    // Bounded by the NIC: a dead peer surfaces as error completions (RC) or, for
    // UC/UD, the caller's overall deadline.
    loop {
        let ne = cq.poll(wc).map_err(|e| format!("poll CQ failed: {e}"))?;
        if ne > 0 || events {
            return Ok(ne);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Fails on an error completion, as the C programs print it.
pub fn check(w: &WorkCompletion) -> Result<(), String> {
    if w.status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "Failed status {} ({}) for wr_id {}",
            w.status,
            w.status.raw(),
            w.wr_id
        ))
    }
}

/// The two closing lines.
pub fn report(size: u32, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = u64::from(size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / f64::from(iters)
    );
}

/// The TCP exchange of the C programs: the client sends its endpoint and reads the
/// server's; the server reads the client's, `connect`s its QP to it, then answers (so
/// its QP is ready before the client's first send). Prints the remote address line and
/// returns the peer's endpoint with the QP connected on both sides.
pub fn exchange(
    args: &CommonArgs,
    my: &QpEndpoint,
    qp: &mut QueuePair,
    connect: impl Fn(&mut QueuePair, &QpEndpoint) -> Result<(), String>,
) -> Result<QpEndpoint, String> {
    let rem = match &args.host {
        Some(host) => {
            let (mut s, rem) = oob::client_connect(host, args.port, my)
                .map_err(|e| format!("Couldn't connect to {host}:{}: {e}", args.port))?;
            oob::write_done(&mut s).map_err(|e| e.to_string())?;
            rem
        }
        None => {
            oob::server_accept(args.port, my, |rem| connect(qp, rem)).map_err(|e| e.to_string())?
        }
    };
    print_dest("remote address:", &rem, ",");
    if args.host.is_some() {
        connect(qp, &rem)?;
    }
    Ok(rem)
}

/// Brings a connected (RC or UC) QP to RTR facing `rem` (at `-P`'s UDP port) and on
/// to RTS with our `psn`.
pub fn connect(
    args: &CommonArgs,
    qp: &mut QueuePair,
    rem: &QpEndpoint,
    mtu: Mtu,
    psn: u32,
) -> Result<(), String> {
    let rem = QpEndpoint {
        udp_port: args.remote_udp_port,
        ..*rem
    };
    qp.to_rtr(&rem, mtu)
        .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
    qp.to_rts(psn)
        .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
}

/// What differs between the single-QP ping-pongs: how a message is sent and receives
/// are posted, and what is checked when one arrives.
pub trait Exchange {
    /// Posts message `k` (0, 1, ...).
    fn post_send(&mut self, qp: &mut QueuePair, k: u32) -> verbs_api::Result<()>;
    /// Posts up to `n` receives; returns how many were posted.
    fn post_recv(&mut self, qp: &mut QueuePair, n: u32) -> u32;
    /// Message `k` was received (its receive completed).
    fn received(&mut self, _k: u32) -> Result<(), String> {
        Ok(())
    }
}

/// The UC and UD exchange: message `k` is `size` bytes from `send_offset` of one region
/// (to `dest` on UD), and every receive takes `recv_len` bytes at its start (on UD the
/// 40-byte GRH, then the payload).
pub struct Plain<'a> {
    pub mr: &'a MemoryRegion,
    pub size: u32,
    pub inline: bool,
    pub send_offset: usize,
    pub recv_len: u32,
    pub dest: Option<UdAddress>,
}

impl Exchange for Plain<'_> {
    fn post_send(&mut self, qp: &mut QueuePair, _k: u32) -> verbs_api::Result<()> {
        let sge = [self.mr.sge(self.send_offset, self.size)];
        let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, &sge).signaled();
        if let Some(dest) = self.dest {
            wr = wr.to(dest);
        }
        if self.inline {
            wr = wr.inline();
        }
        qp.post_send(&[wr])
    }

    fn post_recv(&mut self, qp: &mut QueuePair, n: u32) -> u32 {
        let sge = [self.mr.sge(0, self.recv_len)];
        (0..n)
            .take_while(|_| qp.post_recv(&[RecvWr::new(RECV_WRID, &sge)]).is_ok())
            .count() as u32
    }
}

/// The ping-pong of `ibv_{rc,uc,ud}_pingpong` on one QP: the client sends first; each
/// side sends its next message once its last send and a receive completed; receives are
/// refilled when one is left. `routs` receives are posted on entry. Prints the closing
/// lines.
pub fn ping_pong(
    args: &CommonArgs,
    size: u32,
    qp: &mut QueuePair,
    cq: &mut CompletionQueue,
    mut routs: u32,
    ex: &mut impl Exchange,
) -> Result<(), String> {
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    if args.host.is_some() {
        ex.post_send(qp, 0)
            .map_err(|e| format!("Couldn't post send: {e}"))?;
        pending |= SEND_WRID;
    }
    let start = std::time::Instant::now();
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let ne = poll(cq, &mut wc, args.events)?;
        for w in &wc[..ne] {
            check(w)?;
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    ex.received(rcnt)?;
                    routs -= 1;
                    if routs <= 1 {
                        routs += ex.post_recv(qp, args.rx_depth - routs);
                        if routs < args.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !w.wr_id;
            if scnt < args.iters && pending == 0 {
                ex.post_send(qp, scnt)
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    report(size, args.iters, start.elapsed());
    Ok(())
}
