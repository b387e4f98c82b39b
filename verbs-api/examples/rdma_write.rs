//! RDMA WRITE between two softnic QPs.
//!
//! The server exposes a region with REMOTE_WRITE. The client writes `-s` bytes into it
//! `-n` times with RDMA_WRITE_WITH_IMM (the immediate is the iteration number, so the
//! server gets a receive completion for each), then SENDs a final message.
//!
//! ```text
//! cargo run --example rdma_write -- -d nic0                 # server
//! cargo run --example rdma_write -- -d nic1 -n 3 127.0.0.1  # client
//! ```

mod common;

use std::process::ExitCode;

use clap::Parser;
use verbs_api::*;

fn fill(buf: &mut [u8], iter: u32) {
    let text = format!("softnic RDMA WRITE #{iter} ");
    for (i, b) in buf.iter_mut().enumerate() {
        *b = text.as_bytes()[i % text.len()];
    }
}

fn run(args: common::Args) -> Result<(), String> {
    let mut c = common::connect(&args, AccessFlags::REMOTE_WRITE, |_, _| {})?;
    if c.is_server {
        // Each WRITE_WITH_IMM consumes one receive (re-posted); the final SEND ends.
        // Bounded by the client's iteration limit (common::connect allows 1000).
        for _ in 0..=1000 {
            let wc = c.expect_ok()?;
            match wc.opcode {
                WcOpcode::RecvRdmaWithImm => {
                    c.repost_recv()?;
                    let head = c.mr.read_vec(0, c.mr.len().min(40));
                    println!(
                        "RECV_RDMA_WITH_IMM: imm {:#x}, region now starts with {:?}",
                        wc.imm_data.unwrap_or(0),
                        String::from_utf8_lossy(&head)
                    );
                }
                WcOpcode::Recv => {
                    println!("client is done");
                    return Ok(());
                }
                other => return Err(format!("unexpected completion {other:?}")),
            }
        }
        return Err("the client sent more than 1000 messages".into());
    }
    let len = args.size.min(c.mr.len() as u32);
    for i in 0..args.iters {
        let mut bytes = vec![0u8; len as usize];
        fill(&mut bytes, i);
        c.mr.write(0, &bytes);
        let sge = [c.mr.sge(0, len)];
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: c.remote_mr.addr,
            rkey: c.remote_mr.rkey,
            imm: i,
        };
        let t = std::time::Instant::now();
        c.qp.post_send(&[SendWr::new(u64::from(i), op, &sge).signaled()])
            .map_err(|e| e.to_string())?;
        let wc = c.expect_ok()?;
        println!(
            "RDMA_WRITE_WITH_IMM #{i}: {len} bytes to {:#x} (rkey {:#x}) -> {:?} {} in {:?}",
            c.remote_mr.addr,
            c.remote_mr.rkey,
            wc.opcode,
            wc.status,
            t.elapsed()
        );
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
