//! Shared setup of the WRITE / READ / atomics examples: open a device, register one
//! region, create an RC QP, exchange addresses over TCP (the `ibv_rc_pingpong` message,
//! then the region's address and rkey), and bring the QP to RTS.
//!
//! The server (no host argument) exposes its region; the client operates on it and
//! finally SENDs one message so the server knows it may print and exit.

#![allow(dead_code)] // each example uses part of this

pub mod pp;

use std::net::TcpStream;

use clap::Parser;
use verbs_api::oob::{self, RemoteMr};
use verbs_api::*;

/// Receives kept posted.
pub const RECV_DEPTH: u32 = 16;

/// wr_id of those receives.
pub const RECV_WRID: u64 = 0xF1;

/// Command line shared by the examples.
#[derive(Parser, Debug)]
pub struct Args {
    /// softnic device (default: first found)
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// TCP port of the exchange
    #[arg(short = 'p', long = "port", default_value_t = oob::DEFAULT_PORT)]
    pub port: u16,
    /// GID index
    #[arg(short = 'g', long = "gid-idx", default_value_t = 1)]
    pub gid_idx: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// bytes per operation / region size
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: u32,
    /// iterations
    #[arg(short = 'n', long = "iters", default_value_t = 1)]
    pub iters: u32,
    /// UDP port of the peer's NIC (default 4791)
    #[arg(short = 'P', long = "remote-udp-port", default_value_t = 0)]
    pub remote_udp_port: u16,
    /// server to connect to (none: be the server)
    pub host: Option<String>,
}

/// A connected RC QP with its resources.
pub struct Conn {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub remote_mr: RemoteMr,
    pub is_server: bool,
}

fn err(what: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Sets everything up; `access` is what the local region grants the peer. `prepare`
/// fills the local region (argument: is this the server?) before the peer learns its
/// address, so the peer can never see it half-initialised.
pub fn connect(
    args: &Args,
    access: AccessFlags,
    prepare: impl FnOnce(&mut MemoryRegion, bool),
) -> Result<Conn, String> {
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    if args.iters == 0 || args.iters > 1000 {
        return Err(format!("iters {} is outside 1..=1000", args.iters));
    }
    let name = match &args.ib_dev {
        Some(d) => d.clone(),
        None => Device::list()
            .map_err(|e| e.to_string())?
            .first()
            .map(|d| d.name().to_string())
            .ok_or("No softnic devices found (is `softnic run` running?)")?,
    };
    let ctx = Device::open(&name).map_err(err("open device"))?;
    let pd = ctx.alloc_pd().map_err(err("alloc PD"))?;
    let mut mr = pd
        .alloc_mr(args.size.max(8) as usize, AccessFlags::LOCAL_WRITE | access)
        .map_err(err("register MR"))?;
    let cq = ctx.create_cq(64).map_err(err("create CQ"))?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: RECV_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
        })
        .map_err(err("create QP"))?;
    qp.to_init(access).map_err(err("modify QP to INIT"))?;
    // Zero-length receives, posted before the peer can send (for its WRITE_WITH_IMMs
    // and its final SEND; the server re-posts one per completion).
    for _ in 0..RECV_DEPTH {
        qp.post_recv(&[RecvWr::new(RECV_WRID, &[])])
            .map_err(err("post recv"))?;
    }
    let gid = ctx.query_gid(args.gid_idx).map_err(err("query GID"))?;
    let my = QpEndpoint {
        lid: 0,
        qpn: qp.qp_num(),
        psn: std::process::id() & 0xff_ffff,
        gid,
        udp_port: 0,
    };
    let is_server = args.host.is_none();
    prepare(&mut mr, is_server);
    let my_mr = RemoteMr {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    };
    println!(
        "local:  QPN {:#08x} PSN {:#08x} GID {}  region {:#x} rkey {:#010x} ({} bytes)",
        my.qpn,
        my.psn,
        my.gid,
        my_mr.addr,
        my_mr.rkey,
        mr.len()
    );
    let oob_err = |e: oob::OobError| e.to_string();
    let (rem, remote_mr) = match &args.host {
        Some(host) => {
            // Both our messages first, then the server's (which answers after both).
            let mut s = oob::connect(host, args.port).map_err(oob_err)?;
            oob::write_dest(&mut s, &my).map_err(oob_err)?;
            oob::write_mr(&mut s, &my_mr).map_err(oob_err)?;
            let rem = oob::read_dest(&mut s).map_err(oob_err)?;
            let rmr = oob::read_mr(&mut s).map_err(oob_err)?;
            bring_up(&mut qp, &rem, mtu, my.psn, args.remote_udp_port)?;
            oob::write_done(&mut s).map_err(oob_err)?;
            (rem, rmr)
        }
        None => {
            let listener = std::net::TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("listen on {}: {e}", args.port))?;
            let (mut s, _): (TcpStream, _) = listener.accept().map_err(|e| e.to_string())?;
            let rem = oob::read_dest(&mut s).map_err(oob_err)?;
            let rmr = oob::read_mr(&mut s).map_err(oob_err)?;
            bring_up(&mut qp, &rem, mtu, my.psn, args.remote_udp_port)?;
            oob::write_dest(&mut s, &my).map_err(oob_err)?;
            oob::write_mr(&mut s, &my_mr).map_err(oob_err)?;
            oob::read_done(&mut s).map_err(oob_err)?;
            (rem, rmr)
        }
    };
    println!(
        "remote: QPN {:#08x} PSN {:#08x} GID {}  region {:#x} rkey {:#010x}",
        rem.qpn, rem.psn, rem.gid, remote_mr.addr, remote_mr.rkey
    );
    Ok(Conn {
        ctx,
        pd,
        mr,
        cq,
        qp,
        remote_mr,
        is_server,
    })
}

fn bring_up(
    qp: &mut QueuePair,
    rem: &QpEndpoint,
    mtu: Mtu,
    psn: u32,
    udp_port: u16,
) -> Result<(), String> {
    let rem = QpEndpoint { udp_port, ..*rem };
    qp.to_rtr(&rem, mtu).map_err(err("modify QP to RTR"))?;
    qp.to_rts(psn).map_err(err("modify QP to RTS"))
}

impl Conn {
    /// Waits for one completion (bounded: a million 10-second waits at most).
    pub fn wait_one(&mut self) -> Result<WorkCompletion, String> {
        let mut wc = [WorkCompletion::default(); 1];
        // Block in the CQ wait rather than spin: these examples are not about latency.
        for _ in 0..1_000_000 {
            if self.cq.poll(&mut wc).map_err(err("poll CQ"))? == 1 {
                return Ok(wc[0]);
            }
            self.cq
                .wait(Some(std::time::Duration::from_secs(10)))
                .map_err(err("wait CQ"))?;
        }
        Err("no completion".into())
    }

    /// Like [`Self::wait_one`], and fails on an error status.
    pub fn expect_ok(&mut self) -> Result<WorkCompletion, String> {
        let wc = self.wait_one()?;
        if !wc.status.is_success() {
            return Err(format!(
                "wr_id {} completed with {} ({}), vendor_err {:#x}",
                wc.wr_id,
                wc.status,
                wc.status.raw(),
                wc.vendor_err
            ));
        }
        Ok(wc)
    }

    /// Server: replace a consumed receive.
    pub fn repost_recv(&mut self) -> Result<(), String> {
        self.qp
            .post_recv(&[RecvWr::new(RECV_WRID, &[])])
            .map_err(err("post recv"))
    }

    /// Client: tell the server we are done (a zero-length SEND).
    pub fn send_final(&mut self) -> Result<(), String> {
        println!("sending the final message");
        self.qp
            .post_send(&[SendWr::new(0xF2, WrOpcode::Send, &[]).signaled()])
            .map_err(err("post send"))?;
        self.expect_ok().map(|_| ())
    }
}
