//! `softnic perf` against scripted perftest peers: each test replays, step by step, what
//! a stock perftest 4.5 program does on its TCP socket (the order of `main` in
//! `write_bw.c` / `read_lat.c` and the byte formats of `perftest_communication.c`),
//! parsing softnic's messages the way the C code does (fixed-width fields at fixed
//! offsets) and doing the peer's RDMA part with a verbs-api QP. A missing, extra or
//! misformatted exchange blocks or fails the script.

mod nic_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nic_support::{poll_one, side, softnic_dir, NicProc, Side};
use verbs_api::{AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpState, SendWr, WrOpcode};

/// What the scripted peer learned from one 108-byte message.
#[derive(Debug, Clone, Copy)]
struct Msg {
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
}

/// Parses `KEY_PRINT_FMT_GID` by position, as its fixed widths put the fields:
/// `llll:oooo:qqqqqq:pppppp:rrrrrrrr:vvvvvvvvvvvvvvvv:` + 16 × `gg:` + `ssssssss:` + NUL.
fn parse_key(m: &[u8; 108]) -> Msg {
    let s = std::str::from_utf8(&m[..107]).expect("ASCII");
    assert_eq!(m[107], 0, "NUL terminator");
    for &i in &[4usize, 9, 16, 23, 32, 49, 106] {
        assert_eq!(&s[i..i + 1], ":", "separator at {i} in {s:?}");
    }
    let hex = |a: usize, b: usize| u64::from_str_radix(&s[a..b], 16).expect("hex field");
    let mut gid = [0u8; 16];
    for (k, g) in gid.iter_mut().enumerate() {
        let at = 50 + 3 * k;
        assert_eq!(&s[at + 2..at + 3], ":", "GID separator in {s:?}");
        *g = hex(at, at + 2) as u8;
    }
    assert_eq!(hex(0, 4), 0, "LID");
    Msg {
        out_reads: hex(5, 9) as u32,
        qpn: hex(10, 16) as u32,
        psn: hex(17, 23) as u32,
        rkey: hex(24, 32) as u32,
        vaddr: hex(33, 49),
        gid,
    }
}

/// `sprintf(KEY_PRINT_FMT_GID, …)` of the scripted peer.
fn key(out_reads: u32, qpn: u32, psn: u32, rkey: u32, vaddr: u64, gid: [u8; 16]) -> [u8; 108] {
    let mut s = format!(
        "{:04x}:{out_reads:04x}:{qpn:06x}:{psn:06x}:{rkey:08x}:{vaddr:016x}:",
        0
    );
    for g in gid {
        s += &format!("{g:02x}:");
    }
    s += &format!("{:08x}:", 0);
    let mut m = [0u8; 108];
    m[..107].copy_from_slice(s.as_bytes());
    m
}

/// The scripted peer's socket: perftest's `ctx_xchg_data` on one side.
struct Peer {
    s: TcpStream,
    server: bool,
}

impl Peer {
    fn xchg<const N: usize>(&mut self, mine: &[u8; N]) -> [u8; N] {
        let mut theirs = [0u8; N];
        if self.server {
            self.s.read_exact(&mut theirs).expect("read");
            self.s.write_all(mine).expect("write");
        } else {
            self.s.write_all(mine).expect("write");
            self.s.read_exact(&mut theirs).expect("read");
        }
        theirs
    }

    /// versions, `check_sys_data`, `check_mtu` (we offer IBV_MTU_1024).
    fn preamble(&mut self) {
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        let theirs = self.xchg(&v);
        let text: String = theirs
            .iter()
            .take_while(|&&b| b != 0)
            .map(|&b| b as char)
            .collect();
        assert!(
            text.parse::<f64>().expect("version number") >= 5.70,
            "{text:?}"
        );
        assert_eq!(
            self.xchg(&4096i32.to_be_bytes()),
            4096i32.to_be_bytes(),
            "cycle buffer"
        );
        assert_eq!(
            self.xchg(&64i32.to_be_bytes()),
            64i32.to_be_bytes(),
            "cache line"
        );
        let mtu = self.xchg(b"3\0");
        assert_eq!(
            mtu, *b"5\0",
            "softnic's port MTU is 4096 (IBV_MTU_4096 = 5)"
        );
    }

    fn hand_shake(&mut self, mine: &[u8; 108]) -> Msg {
        parse_key(&self.xchg(mine))
    }

    /// `ctx_close_connection`: hand shake, then "done" (the peer's is never read by C).
    fn close(mut self, mine: &[u8; 108]) {
        self.hand_shake(mine);
        self.s.write_all(b"done\0").expect("done");
        let mut d = [0u8; 5];
        self.s.read_exact(&mut d).expect("softnic's done");
        assert_eq!(&d, b"done\0");
        assert_eq!(self.s.read(&mut d).expect("EOF"), 0, "nothing after done");
    }
}

/// Brings the scripted peer's QP to RTR (and RTS) towards softnic's QP.
fn connect(s: &mut Side, rem: &Msg, rem_port: u16, my_psn: u32, my_out_reads: u32, rts: bool) {
    s.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(rem.qpn),
        rq_psn: Some(rem.psn),
        ah_attr: Some(AhAttr {
            dgid: Gid(rem.gid),
            sgid_index: verbs_api::gid::ADDRESS_GID_INDEX as u8,
            hop_limit: 0xff,
            traffic_class: 0,
            udp_port: rem_port,
        }),
        max_dest_rd_atomic: Some(my_out_reads as u8),
        min_rnr_timer: Some(12),
        ..QpAttr::default()
    })
    .expect("RTR");
    if rts {
        s.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(my_psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(rem.out_reads.min(16) as u8),
            ..QpAttr::default()
        })
        .expect("RTS");
    }
}

fn spawn_perf(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("perf")
        .args(args)
        .env("SOFTNIC_DIR", softnic_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softnic perf")
}

/// Starts a `softnic perf` server (`args` from [`server_args`]: `-p 0`, a free port)
/// and reads the port it took from the line it prints before it waits. Choosing a port
/// here (a listener bound and dropped) left a window in which another test could be
/// handed the same port before the server bound it.
fn spawn_perf_server(args: &[String]) -> (Child, u16) {
    let mut child = spawn_perf(args);
    let mut out = child.stdout.take().expect("piped");
    let mut head = Vec::new();
    // Byte by byte up to the port's line, so nothing after it is read here (finish
    // reads the rest); bounded by the child: end of file if it dies.
    let port = loop {
        let mut b = [0u8];
        if out.read(&mut b).expect("read softnic perf") == 0 {
            let (_, rest) = finish(child);
            panic!(
                "softnic perf never listened:\n{}{rest}",
                String::from_utf8_lossy(&head)
            );
        }
        head.push(b[0]);
        if b[0] == b'\n' {
            let text = String::from_utf8_lossy(&head);
            let last = text.lines().last().unwrap_or_default();
            if let Some(p) = last.strip_prefix(" TCP port of the exchange: ") {
                break p.trim().parse().expect("a port number");
            }
        }
    };
    child.stdout = Some(out);
    (child, port)
}

/// Waits (bounded) for `child`; returns (success, stdout + stderr).
fn finish(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let ok = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (ok, out)
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let p = l.local_addr().expect("addr").port();
    (l, p)
}

/// softnic perf write_bw client ↔ scripted `ib_write_bw` server.
#[test]
fn write_bw_client_against_a_scripted_ib_write_bw_server() {
    let a = NicProc::start("tr-wbw-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-wbw-b", "127.0.0.3", 0, &[]);
    let (l, port) = listener();
    l.set_nonblocking(false).expect("blocking");
    let n = 300u64;
    let size = 4096u64;
    let child = spawn_perf(&[
        "write_bw".into(),
        "-d".into(),
        b.name.clone(),
        "-p".into(),
        port.to_string(),
        "-s".into(),
        size.to_string(),
        "-n".into(),
        n.to_string(),
        "--peer-udp-port".into(),
        a.port.to_string(),
        "--timeout".into(),
        "30".into(),
        "127.0.0.1".into(),
    ]);
    let (s, _) = l.accept().expect("accept");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut peer = Peer { s, server: true };
    peer.preamble();
    // ctx_init: one region of 2 × BUFF_SIZE; our slot 1 is what softnic writes.
    let mut srv = side(&a, 2 * 4096, 16);
    srv.qp.to_init(AccessFlags::REMOTE_WRITE).expect("INIT");
    let vaddr = srv.mr.addr() + 4096;
    let gid = Gid::from_ip(a.addr).0;
    let my_psn = 0x00ab_cdef;
    let mine = key(1, srv.qp.qp_num(), my_psn, srv.mr.rkey(), vaddr, gid);
    // write_bw.c: hand shake per QP, ctx_connect (a BW server stays in RTR), hand
    // shake per QP again (printing), one more after RTR.
    let rem = peer.hand_shake(&mine);
    assert_eq!((rem.out_reads, rem.gid), (1, Gid::from_ip(b.addr).0));
    connect(&mut srv, &rem, b.port, my_psn, 1, false);
    let again = peer.hand_shake(&mine);
    assert_eq!(
        (again.qpn, again.psn, again.rkey, again.vaddr),
        (rem.qpn, rem.psn, rem.rkey, rem.vaddr)
    );
    peer.hand_shake(&mine);
    // The client runs, then shakes hands and sends its report.
    peer.hand_shake(&mine);
    let mut report = Vec::new();
    for _ in 0..5 {
        report.push(u64::from_be_bytes(peer.xchg(&[0u8; 8])));
    }
    assert_eq!(
        (report[0], report[1]),
        (size, n),
        "size and iterations, big-endian"
    );
    let avg = f64::from_bits(report[3]);
    assert!(
        avg > 0.0 && avg < 1e6,
        "BW average {avg} MB/s as a big-endian double"
    );
    peer.close(&mine);
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(
        out.contains(" Mtu             : 1024[B]"),
        "the smaller MTU wins:\n{out}"
    );
    // softnic's pattern landed in our slot.
    let data = &srv.mr.read_vec(4096, 4096);
    assert!(
        data.iter().filter(|&&x| x != 0).count() > 3000,
        "the WRITEs landed"
    );
}

/// Scripted `ib_read_lat` client ↔ softnic perf read_lat server.
#[test]
fn read_lat_server_against_a_scripted_ib_read_lat_client() {
    let a = NicProc::start("tr-rl-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-rl-b", "127.0.0.3", 0, &[]);
    let (child, port) = spawn_perf_server(&server_args("read_lat", &a, &b, &["-o", "4"]));
    let mut peer = connect_to(port);
    peer.preamble();
    let mut cli = side(&b, 2 * 4096, 16);
    cli.qp.to_init(AccessFlags::REMOTE_READ).expect("INIT");
    let gid = Gid::from_ip(b.addr).0;
    let my_psn = 0x0012_3456;
    let mine = key(
        8,
        cli.qp.qp_num(),
        my_psn,
        cli.mr.rkey(),
        cli.mr.addr() + 4096,
        gid,
    );
    // read_lat.c: an extra hand shake, one per QP, connect (RTS), one per QP, one more.
    peer.hand_shake(&mine);
    let rem = peer.hand_shake(&mine);
    assert_eq!(rem.out_reads, 4, "-o 4 announced as OUT");
    connect(&mut cli, &rem, a.port, my_psn, 8, true);
    peer.hand_shake(&mine);
    peer.hand_shake(&mine);
    // The client READs softnic's slot (its --verify source pattern) a few times.
    for i in 0..10u64 {
        let sge = [cli.mr.sge(0, 64)];
        let op = WrOpcode::RdmaRead {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        };
        cli.qp
            .post_send(&[SendWr::new(i, op, &sge).signaled()])
            .expect("post READ");
        let wc = poll_one(&mut cli.cq);
        assert!(wc.status.is_success(), "{wc:?}");
    }
    assert!(
        cli.mr.read_vec(0, 64).iter().any(|&x| x != 0),
        "READ returned data"
    );
    peer.close(&mine);
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(
        out.contains(" local address: LID 0000 QPN 0x") && out.contains(" OUT 0x04"),
        "{out}"
    );
}

/// Connects to the `softnic perf` server [`spawn_perf_server`] started on `port`.
fn connect_to(port: u16) -> Peer {
    // It printed the port after it listened: no retry needed.
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to softnic perf");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    Peer { s, server: false }
}

fn server_args(test: &str, nic: &NicProc, peer: &NicProc, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [test, "-d", &nic.name, "-p", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(["--peer-udp-port".to_string(), peer.port.to_string()]);
    v.extend(["--timeout".to_string(), "30".to_string()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Scripted `ib_send_bw` client ↔ softnic perf send_bw server (which posts its
/// receives before the pre-run hand shake and prints its own report).
#[test]
fn send_bw_server_against_a_scripted_ib_send_bw_client() {
    let a = NicProc::start("tr-sbw-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-sbw-b", "127.0.0.3", 0, &[]);
    let (n, size) = (50u64, 512u32);
    let (child, port) = spawn_perf_server(&server_args(
        "send_bw",
        &a,
        &b,
        &["-n", "50", "-s", "512", "--verify"],
    ));
    let mut peer = connect_to(port);
    peer.preamble();
    let mut cli = side(&b, 2 * 4096, 64);
    cli.qp
        .to_init(AccessFlags(
            AccessFlags::REMOTE_WRITE.0 | AccessFlags::LOCAL_WRITE.0,
        ))
        .expect("INIT");
    let my_psn = 0x42;
    let mine = key(
        1,
        cli.qp.qp_num(),
        my_psn,
        cli.mr.rkey(),
        cli.mr.addr() + 4096,
        Gid::from_ip(b.addr).0,
    );
    // send_bw.c: hand shake per QP, connect, one hand shake, per QP again (printing).
    let rem = peer.hand_shake(&mine);
    connect(&mut cli, &rem, a.port, my_psn, 1, true);
    peer.hand_shake(&mine);
    peer.hand_shake(&mine);
    // Per size: the server has posted its receives when this hand shake returns.
    peer.hand_shake(&mine);
    // Random-looking bytes, as perftest's rand() buffer: softnic must say "Landed".
    let noise: Vec<u8> = (0..4096u32)
        .map(|j| j.wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect();
    cli.mr.write(0, &noise);
    for i in 0..n {
        // perftest walks its source by INC(512) = 512 through the 4096-byte cycle.
        let sge = [cli.mr.sge(((i % 8) * 512) as usize, size)];
        cli.qp
            .post_send(&[SendWr::new(i, WrOpcode::Send, &sge).signaled()])
            .expect("post SEND");
        let wc = poll_one(&mut cli.cq);
        assert!(wc.status.is_success(), "{wc:?}");
    }
    // Without -a (RUN_REGULAR) send_bw.c goes straight to ctx_close_connection: no
    // hand shake after the run (rxe's ib_send_bw sends "done" next).
    peer.close(&mine);
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(
        out.contains(" 512        50 "),
        "the server's own report line:\n{out}"
    );
    assert!(
        out.contains("Landed"),
        "foreign data detected as landed:\n{out}"
    );
}

/// Scripted `ib_atomic_bw` client ↔ softnic perf atomic_bw server with --verify: the
/// FETCH_AND_ADD counters must come out as perftest's walk makes them.
#[test]
fn atomic_bw_server_against_a_scripted_ib_atomic_bw_client() {
    let a = NicProc::start("tr-abw-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-abw-b", "127.0.0.3", 0, &[]);
    let n = 100u64;
    let (child, port) = spawn_perf_server(&server_args(
        "atomic_bw",
        &a,
        &b,
        &["-n", "100", "--verify"],
    ));
    let mut peer = connect_to(port);
    peer.preamble();
    let mut cli = side(&b, 2 * 4096, 64);
    cli.qp.to_init(AccessFlags::REMOTE_ATOMIC).expect("INIT");
    let my_psn = 0x77;
    let mine = key(
        16,
        cli.qp.qp_num(),
        my_psn,
        cli.mr.rkey(),
        cli.mr.addr() + 4096,
        Gid::from_ip(b.addr).0,
    );
    // atomic_bw.c: as write_bw.c.
    let rem = peer.hand_shake(&mine);
    assert_eq!(rem.out_reads, 16, "the device's maximum by default");
    connect(&mut cli, &rem, a.port, my_psn, 16, true);
    peer.hand_shake(&mine);
    peer.hand_shake(&mine);
    for i in 0..n {
        let sge = [cli.mr.sge(0, 8)];
        let op = WrOpcode::AtomicFetchAndAdd {
            remote_addr: rem.vaddr + (i % 64) * 64,
            rkey: rem.rkey,
            add: 1,
        };
        cli.qp
            .post_send(&[SendWr::new(i, op, &sge).signaled()])
            .expect("post atomic");
        let wc = poll_one(&mut cli.cq);
        assert!(wc.status.is_success(), "{wc:?}");
        let orig = u64::from_ne_bytes(cli.mr.read_array(0));
        assert_eq!(orig, i / 64, "original value of word {}", i % 64);
    }
    peer.hand_shake(&mine);
    for v in [8u64, n, 0, 1f64.to_bits(), 0] {
        peer.xchg(&v.to_be_bytes());
    }
    peer.close(&mine);
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(
        out.contains("target words consistent with 100 operations"),
        "{out}"
    );
    assert!(
        out.contains(" 8          100 "),
        "the client's report, printed by the server:\n{out}"
    );
}

/// softnic perf write_lat client ↔ scripted `ib_write_lat` server (ping-pong on the
/// last byte; `write_lat.c` has no closing exchange).
#[test]
fn write_lat_client_against_a_scripted_ib_write_lat_server() {
    let a = NicProc::start("tr-wl-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-wl-b", "127.0.0.3", 0, &[]);
    let (l, port) = listener();
    let (n, size) = (100u64, 8usize);
    let child = spawn_perf(&[
        "write_lat".into(),
        "-d".into(),
        b.name.clone(),
        "-p".into(),
        port.to_string(),
        "-s".into(),
        size.to_string(),
        "-n".into(),
        n.to_string(),
        "--peer-udp-port".into(),
        a.port.to_string(),
        "--timeout".into(),
        "30".into(),
        "127.0.0.1".into(),
    ]);
    let (s, _) = l.accept().expect("accept");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut peer = Peer { s, server: true };
    peer.preamble();
    let mut srv = side(&a, 2 * 4096, 16);
    srv.qp.to_init(AccessFlags::REMOTE_WRITE).expect("INIT");
    let my_psn = 0x1;
    let mine = key(
        1,
        srv.qp.qp_num(),
        my_psn,
        srv.mr.rkey(),
        srv.mr.addr() + 4096,
        Gid::from_ip(a.addr).0,
    );
    // write_lat.c: an extra hand shake, one per QP, connect (RTS), one per QP, one more.
    peer.hand_shake(&mine);
    let rem = peer.hand_shake(&mine);
    connect(&mut srv, &rem, b.port, my_psn, 1, true);
    peer.hand_shake(&mine);
    peer.hand_shake(&mine);
    // run_iter_lat_write as the server runs it: it skips its first wait, so it writes
    // first; then each side waits for the other's counter in the last byte.
    let poll_at = srv.mr.addr() as usize + 4096 + size - 1;
    let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
    while scnt < n || ccnt < n || rcnt < n {
        if rcnt < n && scnt >= 1 {
            rcnt += 1;
            let deadline = Instant::now() + Duration::from_secs(20);
            // SAFETY: `poll_at` is inside the live region; the NIC writes it concurrently.
            while unsafe { std::ptr::read_volatile(poll_at as *const u8) } != rcnt as u8 {
                if Instant::now() > deadline {
                    let (_, out) = finish(child);
                    panic!("softnic's WRITE #{rcnt} never arrived; softnic perf said:\n{out}");
                }
                std::thread::yield_now();
            }
        }
        if scnt < n {
            scnt += 1;
            srv.mr.write(size - 1, &[scnt as u8]);
            let sge = [srv.mr.sge(0, size as u32)];
            let op = WrOpcode::RdmaWrite {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            };
            srv.qp
                .post_send(&[SendWr::new(scnt, op, &sge).signaled()])
                .expect("post WRITE");
        }
        if ccnt < n {
            let wc = poll_one(&mut srv.cq);
            assert!(wc.status.is_success(), "{wc:?}");
            ccnt += 1;
        }
    }
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(out.contains(" 8       100 "), "the latency line:\n{out}");
}

/// Scripted `ib_send_lat` client ↔ softnic perf send_lat server.
#[test]
fn send_lat_server_against_a_scripted_ib_send_lat_client() {
    let a = NicProc::start("tr-sl-a", "127.0.0.2", 0, &[]);
    let b = NicProc::start("tr-sl-b", "127.0.0.3", 0, &[]);
    let (n, size) = (40u64, 16u32);
    let (child, port) =
        spawn_perf_server(&server_args("send_lat", &a, &b, &["-n", "40", "-s", "16"]));
    let mut peer = connect_to(port);
    peer.preamble();
    let mut cli = side(&b, 2 * 4096, 64);
    cli.qp
        .to_init(AccessFlags(
            AccessFlags::REMOTE_WRITE.0 | AccessFlags::LOCAL_WRITE.0,
        ))
        .expect("INIT");
    let my_psn = 0x99;
    let mine = key(
        1,
        cli.qp.qp_num(),
        my_psn,
        cli.mr.rkey(),
        cli.mr.addr() + 4096,
        Gid::from_ip(b.addr).0,
    );
    // send_lat.c: one per QP, connect (RTS), one hand shake, one per QP (printing).
    let rem = peer.hand_shake(&mine);
    connect(&mut cli, &rem, a.port, my_psn, 1, true);
    peer.hand_shake(&mine);
    peer.hand_shake(&mine);
    // Receives first, then the hand shake that tells the peer they are posted.
    for i in 0..n {
        let sge = [cli.mr.sge(4096, size)];
        cli.qp
            .post_recv(&[verbs_api::RecvWr::new(1000 + i, &sge)])
            .expect("post recv");
    }
    peer.hand_shake(&mine);
    // The client sends first, then waits for the answer.
    for i in 0..n {
        let sge = [cli.mr.sge(0, size)];
        cli.qp
            .post_send(&[SendWr::new(i, WrOpcode::Send, &sge).signaled()])
            .expect("post SEND");
        let mut got_recv = false;
        let mut got_send = false;
        while !(got_recv && got_send) {
            let wc = poll_one(&mut cli.cq);
            assert!(wc.status.is_success(), "{wc:?}");
            if wc.wr_id >= 1000 {
                assert_eq!(wc.byte_len, size);
                got_recv = true;
            } else {
                got_send = true;
            }
        }
    }
    peer.close(&mine);
    let (ok, out) = finish(child);
    assert!(ok, "{out}");
    assert!(out.contains(" 16      40 "), "the latency line:\n{out}");
}
