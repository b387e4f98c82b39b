//! `ibv_ud_pingpong` on softnic: the same flags, the same exchange over TCP (so it can
//! face the C program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example ud_pingpong -- -d nic0            # server
//! cargo run --release --example ud_pingpong -- -d nic1 127.0.0.1  # client
//! ```
//!
//! Differences from the C program: the GID index defaults to 1 (the NIC's address; index 0
//! is the link-local GID, as in rxe's table), since RoCE needs a GID; `-P` gives the peer
//! NIC's UDP port when it is not 4791.
//!
//! As in the C program, every receive buffer is `size + 40` bytes: the NIC writes the
//! 40-byte GRH first (for RoCEv2, bytes 20..40 hold the IPv4 header, or all 40 the IPv6
//! header, as Linux rxe writes them) and the payload after it; sends go out from offset
//! 40 of the same buffer, to the peer's QPN with Q_Key 0x11111111 and the address built
//! from the GID it sent over TCP. `-s` may not exceed the port MTU. UD is unreliable: a
//! lost datagram leaves both sides waiting, as with the C program.

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::pp;
use verbs_api::*;

#[derive(Parser, Debug)]
#[command(about = "UD ping-pong over softnic (ibv_ud_pingpong's flags and output)")]
struct Args {
    #[command(flatten)]
    common: pp::CommonArgs,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 2048)]
    size: u32,
}

/// Bytes before the payload in every receive buffer.
const GRH: u32 = 40;

fn run(args: Args) -> std::result::Result<(), String> {
    let c = &args.common;
    c.check()?;
    let mut b = pp::Base::open(c, (args.size + GRH) as usize, c.rx_depth + 1)?;
    let port_mtu = b.ctx.attributes().mtu;
    if args.size > port_mtu {
        return Err(format!("Requested size larger than port MTU ({port_mtu})"));
    }
    let inline = b.inline(args.size);
    let mut qp = b.create_qp(QpType::Ud, c.rx_depth, if inline { args.size } else { 0 })?;
    let mut ex = pp::Plain {
        mr: &b.mr,
        size: args.size,
        inline,
        send_offset: GRH as usize,
        recv_len: args.size + GRH,
        dest: None,
    };
    let routs = pp::Exchange::post_recv(&mut ex, &mut qp, c.rx_depth);
    if routs < c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let my = pp::endpoint(qp.qp_num(), c.gid(&b.ctx)?, 0);
    pp::print_dest("local address: ", &my, ":");
    // RTR and RTS take no peer on UD; the peer is named in every send (the AH).
    let rem = pp::exchange(c, &my, &mut qp, |qp, _rem| {
        qp.to_rtr(&my, Mtu::Mtu1024)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.to_rts(my.psn)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    })?;
    ex.dest = Some(UdAddress {
        gid: rem.gid,
        udp_port: c.remote_udp_port,
        qpn: rem.qpn,
        qkey: DEFAULT_QKEY,
        traffic_class: 0,
    });
    pp::ping_pong(c, args.size, &mut qp, &mut b.cq, routs, &mut ex)
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
