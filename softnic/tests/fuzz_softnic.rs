//! `softnic fuzz` against softnic's own NIC: a `softnic run` process on loopback, a
//! server on it that speaks the pingpong exchange with the region message (as the
//! `rdma_write`/`rdma_read`/`atomics` examples do) and serves one QP per connection
//! until the fuzzer closes it, and a CI-sized bounded run of the `softnic fuzz` CLI. The
//! run must find nothing (every liveness probe answered), reach the answer classes an
//! RC responder can give, and leave the NIC running.

mod nic_support;

use std::io::{ErrorKind, Read};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::oob::{self, RemoteMr};
use verbs_api::{
    AccessFlags, CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttr, QpCap,
    QpEndpoint, QpInitAttr, QpState, QpType, QueuePair, RecvWr, WorkCompletion,
};

/// Loopback addresses private to this test process.
fn addr(host: u8) -> String {
    format!("127.67.{}.{host}", std::process::id() % 250 + 1)
}

const DEPTH: u32 = 64;

/// The server's device objects, opened once; each connection gets a QP of its own.
struct Device {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

struct Conn<'a> {
    qp: QueuePair,
    dev: &'a mut Device,
}
const RECV_LEN: u32 = 8192;

/// Serves one connection: a fresh RC QP with every remote right on the 64 KiB region,
/// receives posted and reposted, until the fuzzer closes the TCP connection.
fn serve_one(
    nic: &NicProc,
    dev: &mut Device,
    mut s: std::net::TcpStream,
    stop: &AtomicBool,
) -> Result<(), String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let cap = QpCap {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = dev
        .pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &dev.cq,
            recv_cq: &dev.cq,
            cap,
            sq_sig_all: false,
        })
        .map_err(|e| e.to_string())?;
    let mut side = Conn { qp, dev };
    side.qp
        .to_init(AccessFlags::ALL)
        .map_err(|e| e.to_string())?;
    let sge = [side.dev.mr.sge(0, RECV_LEN)];
    for _ in 0..DEPTH {
        side.qp
            .post_recv(&[RecvWr::new(1, &sge)])
            .map_err(|e| e.to_string())?;
    }
    let rem = oob::read_dest(&mut s).map_err(|e| e.to_string())?;
    oob::read_mr(&mut s).map_err(|e| e.to_string())?;
    side.qp
        .to_rtr(
            &QpEndpoint { udp_port: 0, ..rem },
            Mtu::from_bytes(1024).unwrap(),
        )
        .map_err(|e| e.to_string())?;
    let psn = 0xFF_FFF8; // our own requests (none) would wrap
    side.qp
        .modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        })
        .map_err(|e| e.to_string())?;
    let me = QpEndpoint {
        lid: 0,
        qpn: side.qp.qp_num(),
        psn,
        gid: Gid::from_ip(nic.addr),
        udp_port: 0,
    };
    oob::write_dest(&mut s, &me).map_err(|e| e.to_string())?;
    oob::write_mr(
        &mut s,
        &RemoteMr {
            addr: side.dev.mr.addr(),
            rkey: side.dev.mr.rkey(),
            len: 0,
        },
    )
    .map_err(|e| e.to_string())?;
    oob::read_done(&mut s).map_err(|e| e.to_string())?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut wc = [WorkCompletion::default(); 16];
    let mut b = [0u8; 16];
    while !stop.load(Ordering::Relaxed) {
        let n = side.dev.cq.poll(&mut wc).map_err(|e| e.to_string())?;
        for w in &wc[..n] {
            if w.wr_id == 1 && w.status.is_success() {
                let _ = side.qp.post_recv(&[RecvWr::new(1, &sge)]);
            }
        }
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => break,
        }
    }
    Ok(())
}

#[test]
fn bounded_fuzz_run_against_a_softnic_nic_finds_nothing_and_reaches_every_rc_answer() {
    let nic = Arc::new(NicProc::start("fuzzpeer", &addr(2), 4791, &[]));
    let listener = TcpListener::bind((addr(2).as_str(), 0)).expect("bind");
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU32::new(0));
    let server = {
        let (nic, stop, served) = (nic.clone(), stop.clone(), served.clone());
        std::thread::spawn(move || {
            let ctx = verbs_api::Device::open(&nic.name).expect("open device");
            let pd = ctx.alloc_pd().expect("alloc pd");
            let mr = pd.alloc_mr(1 << 16, AccessFlags::ALL).expect("alloc mr");
            let cq = ctx.create_cq(4 * DEPTH).expect("create cq");
            let mut dev = Device {
                _ctx: ctx,
                pd,
                cq,
                mr,
            };
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        if let Err(e) = serve_one(&nic, &mut dev, s, &stop) {
                            errors.push(e);
                        }
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            errors
        })
    };

    // CI runs 20,000 packets; a longer run by hand: SOFTNIC_FUZZ_PACKETS=1000000.
    let packets: u64 = std::env::var("SOFTNIC_FUZZ_PACKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("softnic-fuzz-nic-{}", std::process::id()));
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .args([
            "fuzz",
            "--target",
            &format!("{}:{port}", addr(2)),
            "--local",
            &addr(3),
        ])
        .args(["--exchange", "pingpong-mr", "--seed", "1"])
        .args(["--packets", &packets.to_string(), "--seconds", "36000"])
        .args(["--batch", "500", "--rate", "20000", "--answer-ms", "5"])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("run softnic fuzz");
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let errors = server.join().expect("server thread");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{text}\n(wall time {elapsed:?}, {} connections served)",
        served.load(Ordering::Relaxed)
    );
    assert!(out.status.success(), "a finding or an error: {text}");
    assert!(errors.is_empty(), "server errors: {errors:?}");
    assert!(
        text.contains("to:    the QP of the server at"),
        "the banner comes first: {text}"
    );
    assert!(text.contains(&format!("{packets} fuzz packets")), "{text}");
    assert!(text.contains("findings 0"), "{text}");
    // Every answer an RC responder gives to a requester, and the inferred classes.
    for class in [
        "ACK",
        "NAK-PSN-SEQUENCE",
        "NAK-INVALID-REQUEST",
        "NAK-REMOTE-ACCESS",
        "READ-RESPONSE",
        "ATOMIC-ACK",
        "SILENCE",
        "QP-DEATH",
    ] {
        assert!(reached(&text, class), "class {class} not reached: {text}");
    }
    // The mutants reach the receiver's single pass: payloads placed before their
    // check, some of which then failed it; handling never disagreed with the query.
    let placed = (
        nic.stat("rx_placed_fused"),
        nic.stat("rx_placed_bad_icrc"),
        nic.stat("rx_placed_mismatch"),
    );
    eprintln!("rx_placed_fused, rx_placed_bad_icrc, rx_placed_mismatch: {placed:?}");
    assert!(placed.0 > 0 && placed.1 > 0 && placed.2 == 0, "{placed:?}");
    let mut nic = Arc::try_unwrap(nic)
        .ok()
        .expect("the server thread is gone");
    assert!(nic.is_running(), "the NIC died: {}", nic.log_text());
    nic.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The perftest exchange: `softnic perf write_bw` servers, restarted in a loop as a user
/// would restart `ib_write_bw`, each exiting when the fuzzer closes its connection. A
/// short run: every connection costs a server process.
#[test]
fn perftest_exchange_against_softnic_perf_write_bw_servers() {
    let nic = NicProc::start("fuzzperf", &addr(4), 4791, &[]);
    // A port the kernel says is free now. A port derived from the PID (as before) can be
    // an ephemeral port another program's connection holds; once, on a busy machine,
    // every server exited at once and the liveness probe found nobody listening (why was
    // not captured then: the last server's stderr is now printed with the result).
    let port = TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU32::new(0));
    // The last server's stderr, shown if the run fails (why servers exit at once).
    let server_err = softnic_dir().join("fuzz-perf-server.err");
    let server = {
        let (stop, served, name) = (stop.clone(), served.clone(), nic.name.clone());
        let server_err = server_err.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut child = Command::new(env!("CARGO_BIN_EXE_softnic"))
                    .args(["perf", "write_bw", "-d", &name, "-p", &port.to_string()])
                    .env("SOFTNIC_DIR", softnic_dir())
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::File::create(&server_err).expect("server stderr file"))
                    .spawn()
                    .expect("spawn softnic perf");
                loop {
                    if stop.load(Ordering::Relaxed) {
                        let _ = child.kill();
                        let _ = child.wait();
                        return;
                    }
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                served.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let dir = std::env::temp_dir().join(format!("softnic-fuzz-perf-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .args([
            "fuzz",
            "--target",
            &format!("{}:{port}", addr(4)),
            "--local",
            &addr(5),
        ])
        .args(["--exchange", "perftest", "--seed", "2", "--packets", "500"])
        .args(["--seconds", "300", "--rate", "20000", "--answer-ms", "5"])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("run softnic fuzz");
    stop.store(true, Ordering::Relaxed);
    server.join().expect("server thread");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{text}\n({} servers exited; the last one's stderr: {:?})",
        served.load(Ordering::Relaxed),
        std::fs::read_to_string(&server_err).unwrap_or_default()
    );
    assert!(out.status.success(), "a finding or an error: {text}");
    assert!(text.contains("(Perftest exchange)"), "{text}");
    assert!(text.contains("findings 0"), "{text}");
    for class in ["ACK", "QP-DEATH"] {
        assert!(reached(&text, class), "class {class} not reached: {text}");
    }
    // A served connection per batch: the servers really exited on close and came back.
    assert!(served.load(Ordering::Relaxed) >= 2, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether the coverage table in `text` shows `class` with a non-zero count.
fn reached(text: &str, class: &str) -> bool {
    text.lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(class)
            && f.next()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0)
    })
}
