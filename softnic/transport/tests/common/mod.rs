//! Shared helpers for the transport tests: regions, work requests, completions.
#![allow(dead_code)]

use softnic_transport::memory::Access;
use softnic_transport::testing::{Node, Pair, PairConfig};
use softnic_transport::time::Duration;
use softnic_transport::wr::{Completion, RecvWr, SendOp, SendWr, Sge, UdDest, WcStatus, MAX_SGE};

/// A registered buffer.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub key: u32,
    pub addr: u64,
    pub len: usize,
}

impl Buf {
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr + off as u64,
            length: len as u32,
            lkey: self.key,
        }
    }
    pub fn at(&self, off: usize) -> u64 {
        self.addr + off as u64
    }
}

pub fn region(node: &mut Node, addr: u64, len: usize, access: Access) -> Buf {
    let key = node.mem.register(1, addr, len, access);
    Buf { key, addr, len }
}

/// Deterministic, position- and seed-dependent bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn fill(node: &mut Node, b: &Buf, off: usize, data: &[u8]) {
    node.mem.bytes_mut(b.key)[off..off + data.len()].copy_from_slice(data);
}

pub fn read(node: &Node, b: &Buf, off: usize, len: usize) -> Vec<u8> {
    node.mem.bytes(b.key)[off..off + len].to_vec()
}

pub fn wr(wr_id: u64, op: SendOp, sges: &[Sge]) -> SendWr {
    let mut s = [Sge::default(); MAX_SGE];
    s[..sges.len()].copy_from_slice(sges);
    SendWr {
        wr_id,
        op,
        sges: s,
        num_sge: sges.len(),
        inline: None,
        remote_addr: 0,
        rkey: 0,
        signaled: true,
        solicited: false,
        ud: None,
        xrc_srqn: 0,
    }
}

pub fn rdma(wr_id: u64, op: SendOp, sges: &[Sge], remote: &Buf, off: usize) -> SendWr {
    let mut w = wr(wr_id, op, sges);
    w.remote_addr = remote.at(off);
    w.rkey = remote.key;
    w
}

pub fn ud(mut w: SendWr, qpn: u32, qkey: u32, addr: std::net::SocketAddr) -> SendWr {
    w.ud = Some(UdDest {
        qpn,
        qkey,
        addr,
        traffic_class: 0,
    });
    w
}

pub fn recv(wr_id: u64, sges: &[Sge]) -> RecvWr {
    let mut s = [Sge::default(); MAX_SGE];
    s[..sges.len()].copy_from_slice(sges);
    RecvWr {
        wr_id,
        sges: s,
        num_sge: sges.len(),
    }
}

pub fn drain(node: &mut Node) -> Vec<Completion> {
    std::iter::from_fn(|| node.qp.poll_completion()).collect()
}

/// Each completion's work request id and status, in order.
pub fn ids(cs: &[Completion]) -> Vec<(u64, WcStatus)> {
    cs.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// A connected pair with a 2 MiB + 64 KiB data region on each side, all access.
pub fn pair(cfg: PairConfig, seed: u64) -> (Pair, Buf, Buf) {
    let mut p = Pair::connect(cfg, seed);
    let len = (2 << 20) + (64 << 10);
    let a = region(&mut p.a, 0x1000_0000, len, Access::ALL);
    let b = region(&mut p.b, 0x7f00_0000_0000, len, Access::ALL);
    (p, a, b)
}

/// A pair whose requester has RTT samples (eight answered WRITEs, a round trip of
/// 2 µs), so its timer is the adaptive one.
pub fn sampled_pair(cfg: PairConfig) -> (Pair, Buf, Buf) {
    let (mut p, a, b) = pair(cfg, 16);
    for id in 0..8 {
        p.a.qp
            .post_send(rdma(id, SendOp::Write, &[a.sge(0, 10)], &b, 0))
            .unwrap();
        p.drive(1_000_000);
    }
    assert_eq!(drain(&mut p.a).len(), 8);
    (p, a, b)
}

/// Posts one WRITE of `len` bytes of `pattern(seed)` from the start of A's `a` to the
/// start of B's `b` and drives the pair (at most `steps`); checks that it completes
/// alone and successfully and that B holds the data. Returns the virtual time it took,
/// for the tests whose point is how a loss or a late answer is recovered from.
pub fn write_once(p: &mut Pair, a: &Buf, b: &Buf, len: usize, seed: u64, steps: u64) -> Duration {
    let data = pattern(seed, len);
    fill(&mut p.a, a, 0, &data);
    let t0 = p.now;
    p.a.qp
        .post_send(rdma(9, SendOp::Write, &[a.sge(0, len)], b, 0))
        .unwrap();
    p.drive(steps);
    let done = drain(&mut p.a);
    assert_eq!(ids(&done), [(9, WcStatus::Success)]);
    assert!(read(&p.b, b, 0, len) == data, "B's data differs");
    p.now.saturating_duration_since(t0)
}

pub fn rc(mtu: u32) -> PairConfig {
    PairConfig {
        mtu,
        ..PairConfig::default()
    }
}

pub const MIB: usize = 1 << 20;

/// Sizes every operation is tested at for a given MTU.
pub fn sizes(mtu: u32) -> [usize; 6] {
    let m = mtu as usize;
    [0, 1, m - 1, m, m + 1, MIB]
}
