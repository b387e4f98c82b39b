//! UDP GSO (on by default) on a real link: the NIC computes segment k's ICRC with IPv4
//! ID k, assuming the kernel numbers the segments of one GSO send 0, 1, 2, … On loopback
//! nobody can check that (a GRO receiver gets the super-packet whole and never sees an
//! IPv4 header). Here NIC A sends over a veth whose UDP segmentation offload is off, so
//! the kernel segments in software before the packets reach the device, where tcpdump
//! captures them with their real IPv4 headers; `softnic decode` then checks every
//! captured packet's ICRC under the ID the kernel gave it. NIC B sits in a network
//! namespace this test creates (and removes).
//!
//! Needs root, `ip`, `ethtool` and `tcpdump`: CI (root, SOFTNIC_CI=1) fails without
//! them; elsewhere the test says it did not run (see `prereq`).

mod nic_support;
mod prereq;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nic_support::*;
use verbs_api::{Mtu, SendWr, WcStatus, WrOpcode};

/// The link and the capture on it; the capture stops first.
struct Lab {
    veth: veth::VethLab,
    tcpdump: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut t) = self.tcpdump.take() {
            // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
            unsafe { libc::kill(t.id() as libc::pid_t, libc::SIGTERM) };
            let _ = t.wait();
        }
    }
}

/// (frames, frames with a non-zero IPv4 ID, frames with DF) of an Ethernet pcap.
fn ipv4_ids(pcap: &[u8]) -> (usize, usize, usize) {
    let (mut n, mut nonzero, mut df) = (0, 0, 0);
    let mut off = 24;
    while let Some(h) = pcap.get(off..off + 16) {
        let incl = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let Some(frame) = pcap.get(off + 16..off + 16 + incl) else {
            break;
        };
        // Ethernet (14) then IPv4: ID at bytes 4-5, flags at byte 6.
        if frame.len() >= 14 + 20 && frame[12..14] == [0x08, 0x00] {
            n += 1;
            nonzero += usize::from(frame[18..20] != [0, 0]);
            df += usize::from(frame[20] & 0x40 != 0);
        }
        off += 16 + incl;
    }
    (n, nonzero, df)
}

#[test]
fn gso_segments_on_a_link_carry_the_ids_their_icrcs_were_computed_with() {
    if !prereq::network_lab(&["ip", "ethtool", "tcpdump"]) {
        return;
    }
    let pid = std::process::id();
    let net = format!("10.78.{}", pid % 250);
    let (ia, ib) = (format!("{net}.1"), format!("{net}.2"));
    let mut lab = Lab {
        veth: veth::VethLab::new("sng"),
        tcpdump: None,
    };
    lab.veth.add_addr(false, &format!("{ia}/24"), &[]);
    lab.veth.add_addr(true, &format!("{ib}/24"), &[]);
    // Software segmentation before the device (and the capture point).
    veth::run(&[
        "ethtool",
        "-K",
        &lab.veth.veth,
        "tx-udp-segmentation",
        "off",
    ]);

    let pcap = softnic_dir().join("gso-wire.pcap");
    lab.tcpdump = Some(
        Command::new("tcpdump")
            // -Z root: tcpdump would otherwise drop to its own user, who may not write
            // in the test directory; -B: a larger buffer loses less of the burst.
            .args(["-Z", "root", "-B", "8192", "-i", &lab.veth.veth, "-U", "-w"])
            .arg(&pcap)
            .args(["udp", "port", "4791"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pcap.exists() {
        assert!(Instant::now() < deadline, "tcpdump did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300)); // tcpdump attaches after creating the file

    let a = NicProc::start("gsow-a", &ia, 4791, &[]);
    let b = NicProc::start_in(Some(&lab.veth.ns), "gsow-b", &ib, 4791, &[]);
    const MSG: usize = 64 << 10;
    const N: usize = 8;
    let (mut x, y) = rc_pair(&a, &b, Mtu::Mtu1024, MSG * N, 16);
    for i in 0..N {
        let data = pattern(MSG, i as u8);
        x.mr.write(i * MSG, &data);
    }
    let sges: Vec<_> = (0..N).map(|i| [x.mr.sge(i * MSG, MSG as u32)]).collect();
    let wrs: Vec<_> = (0..N)
        .map(|i| {
            let op = WrOpcode::RdmaWrite {
                remote_addr: y.mr.addr() + (i * MSG) as u64,
                rkey: y.mr.rkey(),
            };
            SendWr::new(i as u64, op, &sges[i]).signaled()
        })
        .collect();
    x.qp.post_send(&wrs).expect("post");
    for c in poll_n(&mut x.cq, N) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    for i in 0..N {
        assert!(
            y.mr.read_vec(i * MSG, MSG) == pattern(MSG, i as u8),
            "WRITE {i} landed"
        );
    }
    assert!(a.stat("tx_gso_sends") > 0, "A used GSO");
    assert_eq!(b.stat("rx_drop_bad_icrc"), 0);
    std::thread::sleep(Duration::from_millis(200)); // let tcpdump write the last frames
    drop(lab.tcpdump.take().map(|mut t| {
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(t.id() as libc::pid_t, libc::SIGTERM) };
        t.wait()
    }));

    let out = Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("decode")
        .arg(&pcap)
        .output()
        .expect("softnic decode");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "softnic decode failed:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    // 8 × 64 KiB at MTU 1024 is 512 request packets from A, plus B's ACKs; tcpdump
    // may miss part of the burst (it did miss 64 here), which does not matter.
    assert!(
        lines.len() >= N * MSG / 1024 / 2,
        "{} packets captured",
        lines.len()
    );
    assert!(
        lines.iter().all(|l| l.ends_with("ICRC ok")),
        "a captured packet's ICRC does not verify under its real IPv4 ID:\n{text}"
    );
    let (frames, nonzero, df) = ipv4_ids(&std::fs::read(Path::new(&pcap)).expect("pcap"));
    assert_eq!(frames, lines.len());
    assert_eq!(df, frames, "DF on every packet");
    assert!(
        nonzero * 2 >= frames,
        "segments after the first carry IDs 1, 2, …: {nonzero} of {frames} non-zero"
    );
}
