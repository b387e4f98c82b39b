//! `ibv_srq_pingpong` on softnic: `-q` RC QPs whose receives all come from one shared
//! receive queue; the same flags, the same exchange over TCP (so it can face the C
//! program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example srq_pingpong -- -d nic0 -q 4            # server
//! cargo run --release --example srq_pingpong -- -d nic1 -q 4 127.0.0.1  # client
//! ```
//!
//! As in the C program, each side sends 256 address messages (its `-q` QPs, then
//! all-zero entries up to 256), the server answers with its own 256 after connecting
//! its QPs, and the client closes with `"done"`; the receive completions are matched
//! to their QP by `qp_num`, and `-n` counts exchanges over all QPs together.
//!
//! Differences from the C program: the GID index defaults to 1 (the NIC's address; index 0
//! is the link-local GID, as in rxe's table), since RoCE needs a GID; `-q` above 256 is refused (the C program would overflow its table);
//! `-P` gives the peer NIC's UDP port when it is not 4791.

mod common;

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use common::pp::{self, RECV_WRID, SEND_WRID};
use verbs_api::oob;
use verbs_api::*;

/// Address messages each side sends (`MAX_QP`).
const MAX_QP: usize = 256;

#[derive(Parser, Debug)]
#[command(about = "SRQ ping-pong over softnic (ibv_srq_pingpong's flags and output)")]
struct Args {
    #[command(flatten)]
    common: pp::CommonArgs,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// number of QPs to use
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
}

fn post_recv(srq: &mut SharedReceiveQueue, mr: &MemoryRegion, size: u32, n: u32) -> u32 {
    let sge = [mr.sge(0, size)];
    (0..n)
        .take_while(|_| srq.post_recv(&[RecvWr::new(RECV_WRID, &sge)]).is_ok())
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

/// Sends our 256 messages (the QPs, then zero entries).
fn write_dests(s: &mut std::net::TcpStream, my: &[QpEndpoint]) -> std::result::Result<(), String> {
    for i in 0..MAX_QP {
        let d = my.get(i).copied().unwrap_or_default();
        oob::write_dest(s, &d).map_err(|e| format!("Couldn't send local address: {e}"))?;
    }
    Ok(())
}

/// Reads the peer's 256 messages.
fn read_dests(s: &mut std::net::TcpStream) -> std::result::Result<Vec<QpEndpoint>, String> {
    (0..MAX_QP)
        .map(|i| oob::read_dest(s).map_err(|e| format!("Couldn't read remote address [{i}]: {e}")))
        .collect()
}

fn run(args: Args) -> std::result::Result<(), String> {
    let c = &args.common;
    c.check()?;
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    let num_qp = args.num_qp as usize;
    if num_qp == 0 || num_qp > MAX_QP {
        return Err(format!("-q {} is outside 1..={MAX_QP}", args.num_qp));
    }
    if args.num_qp > c.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            c.rx_depth, args.num_qp
        ));
    }
    let base = pp::Base::open(c, args.size as usize, c.rx_depth + args.num_qp)?;
    let inline = base.inline(args.size);
    let pp::Base {
        ctx,
        pd,
        mr,
        mut cq,
    } = base;
    let mut srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: c.rx_depth,
            max_sge: 1,
            srq_limit: 0,
        })
        .map_err(|e| format!("Couldn't create SRQ: {e}"))?;
    let mut qps = Vec::with_capacity(num_qp);
    for i in 0..num_qp {
        let attr = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: if inline { args.size } else { 0 },
            },
            sq_sig_all: false,
        };
        let mut qp = pd
            .create_qp_with_srq(&attr, &srq)
            .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))?;
        qp.to_init(AccessFlags::NONE)
            .map_err(|e| format!("Failed to modify QP[{i}] to INIT: {e}"))?;
        qps.push(qp);
    }
    let mut routs = post_recv(&mut srq, &mr, args.size, c.rx_depth);
    if routs < c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let gid = ctx
        .query_gid(c.gid_idx)
        .map_err(|e| format!("Could not get local gid for gid index {}: {e}", c.gid_idx))?;
    let my: Vec<QpEndpoint> = qps
        .iter()
        .enumerate()
        .map(|(i, q)| pp::endpoint(q.qp_num(), gid, i as u32))
        .collect();
    for d in &my {
        pp::print_dest("local address: ", d, ",");
    }
    let connect = |qps: &mut [QueuePair], rem: &[QpEndpoint]| -> std::result::Result<(), String> {
        for (i, q) in qps.iter_mut().enumerate() {
            let r = QpEndpoint {
                udp_port: c.remote_udp_port,
                ..rem[i]
            };
            q.to_rtr(&r, mtu)
                .map_err(|e| format!("Failed to modify QP[{i}] to RTR: {e}"))?;
            q.to_rts(my[i].psn)
                .map_err(|e| format!("Failed to modify QP[{i}] to RTS: {e}"))?;
        }
        Ok(())
    };
    let rem = match &c.host {
        Some(host) => {
            let mut s = oob::connect(host, c.port)
                .map_err(|e| format!("Couldn't connect to {host}:{}: {e}", c.port))?;
            write_dests(&mut s, &my)?;
            let rem = read_dests(&mut s)?;
            oob::write_done(&mut s).map_err(|e| e.to_string())?;
            rem
        }
        None => {
            let listener = TcpListener::bind(("0.0.0.0", c.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", c.port))?;
            let (mut s, _) = listener
                .accept()
                .map_err(|e| format!("accept() failed: {e}"))?;
            let rem = read_dests(&mut s)?;
            connect(&mut qps, &rem).map_err(|e| format!("{e}\nCouldn't connect to remote QP"))?;
            write_dests(&mut s, &my)?;
            oob::read_done(&mut s).map_err(|e| e.to_string())?;
            rem
        }
    };
    for r in &rem[..num_qp] {
        pp::print_dest("remote address:", r, ",");
    }
    let mut pending = vec![RECV_WRID; num_qp];
    if c.host.is_some() {
        connect(&mut qps, &rem)?;
        for (i, q) in qps.iter_mut().enumerate() {
            post_send(q, &mr, args.size, inline).map_err(|e| format!("Couldn't post send: {e}"))?;
            pending[i] = SEND_WRID | RECV_WRID;
        }
    }
    let start = Instant::now();
    let mut wc = vec![WorkCompletion::default(); num_qp + c.rx_depth as usize];
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    while rcnt < c.iters || scnt < c.iters {
        let ne = pp::poll(&mut cq, &mut wc, c.events)?;
        for w in &wc[..ne] {
            pp::check(w)?;
            let Some(i) = qps.iter().position(|q| q.qp_num() == w.qp_num) else {
                return Err(format!("Couldn't find QPN {:06x}", w.qp_num));
            };
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= args.num_qp {
                        routs += post_recv(&mut srq, &mr, args.size, c.rx_depth - routs);
                        if routs < c.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[i] &= !w.wr_id;
            if scnt < c.iters && pending[i] == 0 {
                post_send(&mut qps[i], &mr, args.size, inline)
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    pp::report(args.size, c.iters, start.elapsed());
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
