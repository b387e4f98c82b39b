//! RDMA atomics between two softnic QPs.
//!
//! The server's region holds a 64-bit counter at offset 0, initially 100, with
//! REMOTE_ATOMIC. The client does `-n` FETCH_AND_ADD(+1), printing each original value,
//! then a CMP_AND_SWP that succeeds (compare = the current value) and one that fails,
//! then SENDs a final message; the server prints the counter.
//!
//! ```text
//! cargo run --example atomics -- -d nic0                  # server
//! cargo run --example atomics -- -d nic1 -n 5 127.0.0.1   # client
//! ```

mod common;

use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use verbs_api::*;

const START: u64 = 100;

fn run(args: common::Args) -> Result<(), String> {
    let mut c = common::connect(&args, AccessFlags::REMOTE_ATOMIC, |mr, is_server| {
        if is_server {
            mr.write(0, &START.to_ne_bytes());
        }
    })?;
    if c.is_server {
        println!(
            "counter at {:#x} = {START}; waiting for the client",
            c.mr.addr()
        );
        c.expect_ok()?;
        let v =
            c.mr.atomic_u64(0)
                .map_err(|e| e.to_string())?
                .load(Ordering::SeqCst);
        println!("client is done; counter = {v}");
        return Ok(());
    }
    let remote_addr = c.remote_mr.addr;
    let rkey = c.remote_mr.rkey;
    let mut last = 0u64;
    for i in 0..args.iters {
        let sge = [c.mr.sge(0, 8)];
        let op = WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add: 1,
        };
        c.qp.post_send(&[SendWr::new(u64::from(i), op, &sge).signaled()])
            .map_err(|e| e.to_string())?;
        let wc = c.expect_ok()?;
        last =
            c.mr.atomic_u64(0)
                .map_err(|e| e.to_string())?
                .load(Ordering::SeqCst);
        println!(
            "FETCH_AND_ADD(+1) #{i} -> {:?} {}: original value {last}",
            wc.opcode, wc.status
        );
    }
    let current = last + 1;
    for (compare, swap) in [(current, 7u64), (current, 9u64)] {
        let sge = [c.mr.sge(0, 8)];
        let op = WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        };
        c.qp.post_send(&[SendWr::new(0xC5, op, &sge).signaled()])
            .map_err(|e| e.to_string())?;
        let wc = c.expect_ok()?;
        let orig =
            c.mr.atomic_u64(0)
                .map_err(|e| e.to_string())?
                .load(Ordering::SeqCst);
        println!(
            "CMP_AND_SWP(compare {compare}, swap {swap}) -> {:?} {}: original value {orig} ({})",
            wc.opcode,
            wc.status,
            if orig == compare {
                "swapped"
            } else {
                "not swapped"
            }
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
