//! `ibv_uc_pingpong` on softnic: the same flags, the same exchange over TCP (so it can
//! face the C program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example uc_pingpong -- -d nic0            # server
//! cargo run --release --example uc_pingpong -- -d nic1 127.0.0.1  # client
//! ```
//!
//! Differences from the C program: the GID index defaults to 1 (the NIC's address; index 0
//! is the link-local GID, as in rxe's table), since RoCE needs a GID; `-P` gives the peer
//! NIC's UDP port when it is not 4791. UC has no acknowledgements: a message that loses a packet is dropped whole by the receiver
//! (IBTA 9.8.3), so on a lossy path the program waits for a receive that never comes,
//! exactly as the C program does.

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::pp;
use verbs_api::*;

#[derive(Parser, Debug)]
#[command(about = "UC ping-pong over softnic (ibv_uc_pingpong's flags and output)")]
struct Args {
    #[command(flatten)]
    common: pp::CommonArgs,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
}

fn run(args: Args) -> std::result::Result<(), String> {
    let c = &args.common;
    c.check()?;
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    let mut b = pp::Base::open(c, args.size as usize, c.rx_depth + 1)?;
    let inline = b.inline(args.size);
    let mut qp = b.create_qp(QpType::Uc, c.rx_depth, if inline { args.size } else { 0 })?;
    let mut ex = pp::Plain {
        mr: &b.mr,
        size: args.size,
        inline,
        send_offset: 0,
        recv_len: args.size,
        dest: None,
    };
    let routs = pp::Exchange::post_recv(&mut ex, &mut qp, c.rx_depth);
    if routs < c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let my = pp::endpoint(qp.qp_num(), c.gid(&b.ctx)?, 0);
    pp::print_dest("local address: ", &my, ",");
    pp::exchange(c, &my, &mut qp, |qp, rem| {
        pp::connect(c, qp, rem, mtu, my.psn)
    })?;
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
