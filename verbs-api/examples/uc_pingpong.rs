//! `ibv_uc_pingpong` on softnic: the same flags, the same exchange over TCP (so it can
//! face the C program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example uc_pingpong -- -d nic0 -g 0            # server
//! cargo run --release --example uc_pingpong -- -d nic1 -g 0 127.0.0.1  # client
//! ```
//!
//! Differences from the C program: the GID index defaults to 0 (softnic has one GID and
//! RoCE needs it); `-P` gives the peer NIC's UDP port when it is not 4791. UC has no
//! acknowledgements: a message that loses a packet is dropped whole by the receiver
//! (IBTA 9.8.3), so on a lossy path the program waits for a receive that never comes,
//! exactly as the C program does.

mod common;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use common::pp::{self, RECV_WRID, SEND_WRID};
use verbs_api::oob;
use verbs_api::*;

#[derive(Parser, Debug)]
#[command(about = "UC ping-pong over softnic (ibv_uc_pingpong's flags and output)")]
struct Args {
    /// listen on/connect to port <port>
    #[arg(short = 'p', long = "port", default_value_t = oob::DEFAULT_PORT)]
    port: u16,
    /// use device <dev> (default first device found)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// use port <port> of the device (softnic has port 1)
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// service level value (accepted, unused)
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// local port gid index
    #[arg(short = 'g', long = "gid-idx", default_value_t = 1)]
    gid_idx: u32,
    /// UDP port of the peer's NIC (softnic extension; default 4791)
    #[arg(short = 'P', long = "remote-udp-port", default_value_t = 0)]
    remote_udp_port: u16,
    /// server to connect to (none: be the server)
    host: Option<String>,
}

fn post_recv(qp: &mut QueuePair, mr: &MemoryRegion, size: u32, n: u32) -> u32 {
    let sge = [mr.sge(0, size)];
    (0..n)
        .take_while(|_| qp.post_recv(&[RecvWr::new(RECV_WRID, &sge)]).is_ok())
        .count() as u32
}

fn post_send(qp: &mut QueuePair, mr: &MemoryRegion, size: u32, inline: bool) -> Result<()> {
    let sge = [mr.sge(0, size)];
    let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, &sge).signaled();
    if inline {
        wr = wr.inline();
    }
    qp.post_send(&[wr])
}

fn run(args: Args) -> std::result::Result<(), String> {
    if args.ib_port != 1 {
        return Err(format!("softnic has port 1 only (got -i {})", args.ib_port));
    }
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    if args.rx_depth == 0 || args.iters == 0 {
        return Err("rx-depth and iters must be at least 1".into());
    }
    let ctx = pp::open(args.ib_dev.as_deref())?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mut mr = pd
        .alloc_mr(args.size.max(1) as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    mr.fill(0, mr.len(), 0x7b);
    let mut cq = ctx
        .create_cq(args.rx_depth + 1)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let inline = args.size > 0 && args.size <= ctx.attributes().max_inline;
    let mut qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: args.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: if inline { args.size } else { 0 },
            },
            sq_sig_all: false,
        })
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    qp.to_init(AccessFlags::NONE)
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    let mut routs = post_recv(&mut qp, &mr, args.size, args.rx_depth);
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let gid = ctx
        .query_gid(args.gid_idx)
        .map_err(|e| format!("can't read sgid of index {}: {e}", args.gid_idx))?;
    let my = QpEndpoint {
        lid: 0,
        qpn: qp.qp_num(),
        psn: pp::random_psn(0),
        gid,
        udp_port: 0,
    };
    pp::print_dest("local address: ", &my, ",");
    let connect = |qp: &mut QueuePair, rem: &QpEndpoint| -> std::result::Result<(), String> {
        let rem = QpEndpoint {
            udp_port: args.remote_udp_port,
            ..*rem
        };
        qp.to_rtr(&rem, mtu)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.to_rts(my.psn)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    };
    let rem = match &args.host {
        Some(host) => {
            let (mut s, rem) = oob::client_connect(host, args.port, &my)
                .map_err(|e| format!("Couldn't connect to {host}:{}: {e}", args.port))?;
            oob::write_done(&mut s).map_err(|e| e.to_string())?;
            rem
        }
        None => oob::server_accept(args.port, &my, |rem| connect(&mut qp, rem))
            .map_err(|e| e.to_string())?,
    };
    pp::print_dest("remote address:", &rem, ",");
    if args.host.is_some() {
        connect(&mut qp, &rem)?;
    }
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    if args.host.is_some() {
        post_send(&mut qp, &mr, args.size, inline)
            .map_err(|e| format!("Couldn't post send: {e}"))?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let ne = pp::poll(&mut cq, &mut wc, args.events)?;
        for w in &wc[..ne] {
            pp::check(w)?;
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(&mut qp, &mr, args.size, args.rx_depth - routs);
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
                post_send(&mut qp, &mr, args.size, inline)
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    pp::report(args.size, args.iters, start.elapsed());
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
