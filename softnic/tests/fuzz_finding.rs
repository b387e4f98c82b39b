//! `softnic fuzz` finds, minimises and replays a planted bug: an in-process fake RC peer
//! (the pingpong exchange on TCP, ACKs on UDP, ICRCs checked) that hangs — answers
//! nothing on this connection or the next — once it has seen an RDMA WRITE FIRST and
//! then a SEND LAST with immediate on one connection. The fuzzer must find it, the
//! liveness probe must report it, delta debugging must cut the batch down to exactly
//! those two packets, and `softnic fuzz replay` must reproduce it on a fresh connection
//! (and not reproduce it on the same peer without the bug).

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use softnic::fuzz::finding::Replay;
use softnic::fuzz::{Config, ConnectSpec, Exchange, Fuzzer};
use softnic::nic::rx_icrc::{self, IdSolver};
use verbs_api::oob;
use verbs_api::{Gid, QpEndpoint};
use wire::aeth::AethRepr;
use wire::{BthRepr, Msn, NakCode, Opcode, PacketRepr, Psn, Qpn, Syndrome};

const WRITE_FIRST: u8 = 0x06;
const SEND_LAST_IMM: u8 = 0x03;

/// Loopback addresses private to this test process (other tests bind 4791 elsewhere).
fn addr(host: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(127, 66, (pid % 250) as u8 + 1, host)
}

#[derive(Default)]
struct PeerState {
    /// Connections accepted so far; the current one is `conn`.
    conn: u32,
    qpn: u32,
    /// The fuzzer's QPN (what our ACKs are addressed to).
    their_qpn: u32,
    epsn: u32,
    seen_write_first: bool,
    /// Silent on every connection up to and including this one (0: alive).
    dead_through: u32,
    /// How many times the planted bug fired.
    fired: u32,
}

/// The fake peer.
struct FakePeer {
    tcp_port: u16,
    state: Arc<Mutex<PeerState>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FakePeer {
    fn start(ip: Ipv4Addr, planted: bool) -> FakePeer {
        let listener = TcpListener::bind((ip, 0)).expect("bind tcp");
        listener.set_nonblocking(true).unwrap();
        let tcp_port = listener.local_addr().unwrap().port();
        let udp = UdpSocket::bind((ip, 4791)).expect("bind udp 4791");
        udp.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let state = Arc::new(Mutex::new(PeerState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let tcp = std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let Ok(rem) = oob::read_dest(&mut s) else {
                    continue;
                };
                let me = {
                    let mut g = st.lock().unwrap();
                    g.conn += 1;
                    g.qpn = 0x100 + g.conn;
                    g.epsn = rem.psn;
                    g.their_qpn = rem.qpn;
                    g.seen_write_first = false;
                    QpEndpoint {
                        lid: 0,
                        qpn: g.qpn,
                        psn: 0x1234,
                        gid: Gid::from_ip(IpAddr::V4(ip)),
                        udp_port: 0,
                    }
                };
                let _ = oob::write_dest(&mut s, &me);
                let _ = oob::read_done(&mut s);
                // Hold the connection until the fuzzer closes it.
                let mut b = [0u8; 16];
                while !matches!(s.read(&mut b), Ok(0) | Err(_)) {}
            }
        });
        let (st, sp) = (state.clone(), stop.clone());
        let local = SocketAddr::new(IpAddr::V4(ip), 4791);
        let udp_thread = std::thread::spawn(move || {
            let mut solver = IdSolver::new();
            let mut buf = vec![0u8; 9000];
            while !sp.load(Ordering::Relaxed) {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                let pkt = &buf[..n];
                if rx_icrc::verify(&mut solver, local, from, pkt).is_none() {
                    continue;
                }
                let Ok(p) = PacketRepr::parse(pkt) else {
                    continue;
                };
                let mut g = st.lock().unwrap();
                if g.dead_through >= g.conn || p.repr.bth.dest_qpn.value() != g.qpn {
                    continue;
                }
                let op = p.repr.bth.opcode.0;
                if planted && op == SEND_LAST_IMM && g.seen_write_first {
                    g.dead_through = g.conn + 1;
                    g.fired += 1;
                    continue;
                }
                if op == WRITE_FIRST {
                    g.seen_write_first = true;
                }
                let psn = p.repr.bth.psn.value();
                let d = psn.wrapping_sub(g.epsn) & 0xFF_FFFF;
                let reply = if d == 0 {
                    g.epsn = (g.epsn + 1) & 0xFF_FFFF;
                    p.repr
                        .bth
                        .ack_req
                        .then_some((psn, Syndrome::Ack { credits: 31 }))
                } else if d >= 0x80_0000 {
                    Some((
                        (g.epsn + 0xFF_FFFF) & 0xFF_FFFF,
                        Syndrome::Ack { credits: 31 },
                    ))
                } else {
                    Some((g.epsn, Syndrome::Nak(NakCode::PsnSequenceError)))
                };
                if let Some((psn, syn)) = reply {
                    let mut r = PacketRepr::new(BthRepr::new(
                        Opcode::RC_ACKNOWLEDGE,
                        Qpn::new(g.their_qpn),
                        Psn::new(psn),
                    ));
                    r.aeth = Some(AethRepr {
                        syndrome: syn,
                        msn: Msn::new(0),
                    });
                    let mut out = vec![0u8; r.total_len().unwrap()];
                    r.emit(&mut out, &[]).unwrap();
                    rx_icrc::params(from, local, 0)
                        .unwrap()
                        .fill(&mut out)
                        .unwrap();
                    let _ = udp.send_to(&out, from);
                }
            }
        });
        FakePeer {
            tcp_port,
            state,
            stop,
            threads: vec![tcp, udp_thread],
        }
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn config(peer_ip: Ipv4Addr, tcp_port: u16, local: Ipv4Addr, out: &Path) -> Config {
    Config {
        spec: ConnectSpec {
            target: format!("{peer_ip}:{tcp_port}"),
            exchange: Exchange::Pingpong,
            local: IpAddr::V4(local),
            udp_port: 4791,
            our_qpn: 0x4242,
            timeout: Duration::from_secs(10),
            mtu: 1024,
        },
        bind: SocketAddr::new(IpAddr::V4(local), 4791),
        seed: 3,
        packets: 20_000,
        duration: Duration::from_secs(120),
        rate: 50_000.0,
        batch: 300,
        mtu: 1024,
        answer_wait: Duration::from_millis(5),
        probe: softnic::fuzz::Probe::Auto,
        probe_timeout: Duration::from_millis(600),
        out_dir: out.to_path_buf(),
        minimize: true,
        max_trials: 300,
    }
}

fn replay_cli(file: &Path, target: &str, local: Ipv4Addr) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .args(["fuzz", "replay"])
        .arg(file)
        .args(["--target", target, "--local", &local.to_string()])
        .args(["--probe-timeout-ms", "600", "--connect-timeout-ms", "10000"])
        .output()
        .expect("run softnic fuzz replay");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn planted_hang_is_found_minimised_to_two_packets_and_replayed() {
    let dir = std::env::temp_dir().join(format!("softnic-fuzz-finding-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (peer_ip, local) = (addr(2), addr(3));
    let peer = FakePeer::start(peer_ip, true);

    let mut log = Vec::new();
    let report = Fuzzer::new(config(peer_ip, peer.tcp_port, local, &dir))
        .expect("bind the fuzzer")
        .run(&mut log)
        .expect("run");
    let log = String::from_utf8_lossy(&log).into_owned();
    assert!(peer.state.lock().unwrap().fired >= 2, "{log}");
    assert_eq!(
        report.findings.len(),
        2,
        "the finding and its minimised form: {log}"
    );
    assert_eq!(report.minimized_len, Some(2), "{log}");

    // The minimised sequence is exactly the two packets that matter, in order.
    let min = Replay::load(&dir.join("finding-1-min.json")).expect("minimised replay file");
    let ops: Vec<u8> = min.packets.iter().map(|p| p.opcode().0).collect();
    assert_eq!(ops, vec![WRITE_FIRST, SEND_LAST_IMM], "{log}");
    let full = Replay::load(&dir.join("finding-1.json")).expect("replay file");
    assert!(full.packets.len() > 2);
    assert!(full.why.contains("liveness probe"), "{}", full.why);

    // Its pcap holds the two packets with good ICRCs (softnic decode checks each).
    let dec = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("decode")
        .arg(dir.join("finding-1-min.pcap"))
        .output()
        .expect("softnic decode");
    let text = String::from_utf8_lossy(&dec.stdout);
    assert!(dec.status.success(), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains("ICRC ok")).count(),
        2,
        "{text}"
    );

    // Replayed on a fresh connection: reproduced (exit 2) ...
    let target = format!("{peer_ip}:{}", peer.tcp_port);
    let fired = peer.state.lock().unwrap().fired;
    let (code, text) = replay_cli(&dir.join("finding-1-min.json"), &target, local);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("REPRODUCED"), "{text}");
    assert_eq!(peer.state.lock().unwrap().fired, fired + 1);
    drop(peer);

    // ... and not against the same peer without the bug (exit 0).
    let healthy = FakePeer::start(peer_ip, false);
    let target = format!("{peer_ip}:{}", healthy.tcp_port);
    let (code, text) = replay_cli(&dir.join("finding-1-min.json"), &target, local);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("not reproduced"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
