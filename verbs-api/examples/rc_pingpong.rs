//! `ibv_rc_pingpong` on softnic: the same flags, the same exchange over TCP (so it can
//! face the C program), the same output.
//!
//! ```text
//! softnic run --name nic0 --addr 127.0.0.2 &   softnic run --name nic1 --addr 127.0.0.3 &
//! cargo run --release --example rc_pingpong -- -d nic0 -g 1            # server
//! cargo run --release --example rc_pingpong -- -d nic1 -g 1 127.0.0.1  # client
//! ```
//!
//! Differences from the C program: the GID index defaults to 1 (the NIC's address; index 0
//! is the link-local GID, as in rxe's table), since RoCE needs a GID; `-o`/`-t` are refused; `-P` gives the peer NIC's UDP port when it is
//! not 4791; `--linger-ms` keeps the QP after the last completion (so a lost final ACK
//! can be answered again). `-c` is rdma-core's check, so it pairs with a stock `ibv_rc_pingpong -c`:
//! the sender sets the first byte of every 4 KiB page to `page % sizeof(char)` (that is,
//! 0) in a buffer otherwise filled with 0x7b, and the receiver checks those bytes.
//! `--chk-all` (a softnic extension, for two softnic peers) checks every byte against a
//! per-message pattern instead.

mod common;

use std::process::ExitCode;

use clap::Parser;
use common::pp::{self, RECV_WRID, SEND_WRID};
use verbs_api::*;

#[derive(Parser, Debug)]
#[command(about = "RC ping-pong over softnic (ibv_rc_pingpong's flags and output)")]
struct Args {
    #[command(flatten)]
    common: pp::CommonArgs,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// validate received buffers (rdma-core's check: first byte of each page)
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// validate every byte against a per-message pattern (softnic extension; both
    /// peers must use it)
    #[arg(long = "chk-all")]
    chk_all: bool,
    /// use on demand paging (not supported)
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    /// get CQE with timestamp (not supported)
    #[arg(short = 't', long = "ts")]
    ts: bool,
    /// keep the QP this many milliseconds after the last completion before tearing it
    /// down (softnic extension; default 0, as the C program). The ACK of the peer's last
    /// message can be lost; a QP that still exists answers the peer's resend with a new
    /// ACK, where a destroyed one leaves the peer retrying (rxe: forever at retry_cnt 7)
    #[arg(long = "linger-ms", default_value_t = 0)]
    linger_ms: u64,
}

/// The byte at offset `j` of message `k` with `--chk-all`.
fn pattern(k: u32, j: usize) -> u8 {
    (j as u32).wrapping_mul(31).wrapping_add(k) as u8
}

/// rdma-core's validation page size (`sysconf(_SC_PAGESIZE)` on x86-64).
const CHECK_PAGE: usize = 4096;

/// What `-c` / `--chk-all` validate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// No validation.
    Off,
    /// rdma-core's `-c`: byte 0 of each page is `page % sizeof(char)`, i.e. 0.
    Pages,
    /// Every byte follows `pattern`.
    Full,
}
/// One region: sends from its start, receives land at its start.
struct Pingpong<'a> {
    mr: &'a mut MemoryRegion,
    size: u32,
    inline: bool,
    chk: Check,
}

impl pp::Exchange for Pingpong<'_> {
    fn post_recv(&mut self, qp: &mut QueuePair, n: u32) -> u32 {
        let sge = [self.mr.sge(0, self.size)];
        (0..n)
            .take_while(|_| qp.post_recv(&[RecvWr::new(RECV_WRID, &sge)]).is_ok())
            .count() as u32
    }

    fn post_send(&mut self, qp: &mut QueuePair, k: u32) -> Result<()> {
        let n = self.size as usize;
        match self.chk {
            Check::Off => {}
            Check::Pages => {
                for j in (0..n).step_by(CHECK_PAGE) {
                    self.mr.write(j, &[0]);
                }
            }
            Check::Full => {
                let bytes: Vec<u8> = (0..n).map(|j| pattern(k, j)).collect();
                self.mr.write(0, &bytes);
            }
        }
        let sge = [self.mr.sge(0, self.size)];
        let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, &sge).signaled();
        if self.inline {
            wr = wr.inline();
        }
        qp.post_send(&[wr])
    }

    fn received(&mut self, k: u32) -> std::result::Result<(), String> {
        if self.chk == Check::Off {
            return Ok(());
        }
        let expect = |j: usize| match self.chk {
            Check::Full => Some(pattern(k, j)),
            Check::Pages if j.is_multiple_of(CHECK_PAGE) => Some(0),
            _ => None,
        };
        let got = self.mr.read_vec(0, self.size as usize);
        match got
            .iter()
            .enumerate()
            .find(|(j, b)| expect(*j).is_some_and(|e| **b != e))
        {
            None => Ok(()),
            Some((j, b)) => Err(format!(
                "invalid data in page {} (byte {j}: {b:#04x}, expected {:#04x}) of message {k}",
                j / CHECK_PAGE,
                expect(j).unwrap_or_default()
            )),
        }
    }
}

fn run(args: Args) -> std::result::Result<(), String> {
    let c = &args.common;
    if args.odp || args.ts {
        return Err(
            "-o (on-demand paging) and -t (timestamps) are not supported by softnic".into(),
        );
    }
    c.check()?;
    let mtu = Mtu::from_bytes(args.mtu).ok_or_else(|| format!("invalid MTU {}", args.mtu))?;
    let mut b = pp::Base::open(c, args.size as usize, c.rx_depth + 1)?;
    let inline = b.inline(args.size);
    let mut qp = b.create_qp(QpType::Rc, c.rx_depth, if inline { args.size } else { 0 })?;
    let gid = c.gid(&b.ctx)?;
    let mut ex = Pingpong {
        mr: &mut b.mr,
        size: args.size,
        inline,
        chk: if args.chk_all {
            Check::Full
        } else if args.chk {
            Check::Pages
        } else {
            Check::Off
        },
    };
    let routs = pp::Exchange::post_recv(&mut ex, &mut qp, c.rx_depth);
    if routs < c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let my = pp::endpoint(qp.qp_num(), gid, 0);
    pp::print_dest("local address: ", &my, ",");
    pp::exchange(c, &my, &mut qp, |qp, rem| {
        pp::connect(c, qp, rem, mtu, my.psn)
    })?;
    pp::ping_pong(c, args.size, &mut qp, &mut b.cq, routs, &mut ex)?;
    // The QP (still in scope) keeps answering duplicates while this sleeps.
    std::thread::sleep(std::time::Duration::from_millis(args.linger_ms));
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
