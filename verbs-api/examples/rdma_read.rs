//! RDMA READ between two softnic QPs.
//!
//! The server fills a region with a known pattern and grants REMOTE_READ. The client
//! READs `-s` bytes of it `-n` times into its own region, checks the bytes, then SENDs a
//! final message.
//!
//! ```text
//! cargo run --example rdma_read -- -d nic0                 # server
//! cargo run --example rdma_read -- -d nic1 127.0.0.1       # client
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use verbs_api::*;

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn run(args: common::Args) -> Result<(), String> {
    let mut c = common::connect(&args, AccessFlags::REMOTE_READ, |mr, is_server| {
        if is_server {
            let bytes: Vec<u8> = (0..mr.len()).map(pattern).collect();
            mr.write(0, &bytes);
        }
    })?;
    if c.is_server {
        println!("region filled with i % 251; waiting for the client");
        let wc = c.expect_ok()?;
        println!("client is done ({:?})", wc.opcode);
        return Ok(());
    }
    let len = args.size.min(c.mr.len() as u32);
    for i in 0..args.iters {
        c.mr.fill(0, c.mr.len(), 0);
        let sge = [c.mr.sge(0, len)];
        let op = WrOpcode::RdmaRead {
            remote_addr: c.remote_mr.addr,
            rkey: c.remote_mr.rkey,
        };
        let t = std::time::Instant::now();
        c.qp.post_send(&[SendWr::new(u64::from(i), op, &sge).signaled()])
            .map_err(|e| e.to_string())?;
        let wc = c.expect_ok()?;
        let got = c.mr.read_vec(0, len as usize);
        let bad = got.iter().enumerate().find(|(j, b)| **b != pattern(*j));
        println!(
            "RDMA_READ #{i}: {len} bytes from {:#x} (rkey {:#x}) -> {:?} {}, byte_len {}, in {:?}: {}",
            c.remote_mr.addr,
            c.remote_mr.rkey,
            wc.opcode,
            wc.status,
            wc.byte_len,
            t.elapsed(),
            match bad {
                None => "data OK".to_string(),
                Some((j, b)) => format!("MISMATCH at byte {j}: {b:#04x} != {:#04x}", pattern(j)),
            }
        );
        if bad.is_some() {
            return Err("data mismatch".into());
        }
    }
    c.send_final()
}

fn main() -> ExitCode {
    match run(common::Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
