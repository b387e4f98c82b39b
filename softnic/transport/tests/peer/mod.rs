//! A hostile peer's tools for the transport tests: hand-built packets handed straight
//! to a QP (as the NIC would after its ICRC and source checks), everything the QP
//! answers, counters by name, and a sparse memory for messages of gigabytes.
#![allow(dead_code)]

use core::net::SocketAddr;

use softnic_transport::memory::{Access, Accessor, AtomicOp, MemError, Memory};
use softnic_transport::qp::Qp;
use softnic_transport::testing::Node;
use softnic_transport::time::Instant;
use wire::{AethRepr, BthRepr, Msn, Opcode, PacketRepr, Psn, Qpn, RethRepr, Syndrome};

/// Hands `repr` (+ `payload`) to `qp` as if it came from `from`.
pub fn inject_into(
    qp: &mut Qp,
    mem: &mut dyn Memory,
    now: Instant,
    from: SocketAddr,
    repr: PacketRepr,
    payload: &[u8],
) {
    let mut r = repr;
    r.payload_len = payload.len();
    let mut buf = vec![0u8; 8192];
    let n = r.emit(&mut buf, payload).expect("emit");
    let parsed = PacketRepr::parse(&buf[..n]).expect("parse");
    qp.handle_packet(now, from, &parsed, mem);
}

/// [`inject_into`] a test node.
pub fn inject(node: &mut Node, now: Instant, from: SocketAddr, repr: PacketRepr, payload: &[u8]) {
    inject_into(&mut node.qp, &mut node.mem, now, from, repr, payload);
}

/// Everything `qp` sends now (at most `max` packets): headers and payload.
pub fn collect_from(
    qp: &mut Qp,
    mem: &dyn Memory,
    now: Instant,
    max: usize,
) -> Vec<(PacketRepr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096 + 128];
    for _ in 0..max {
        let Some(t) = qp.poll_transmit(now, &mut buf, mem) else {
            break;
        };
        let p = PacketRepr::parse(&buf[..t.len]).expect("own packet parses");
        out.push((p.repr, p.payload.to_vec()));
    }
    out
}

/// Everything a test node's QP sends now.
pub fn collect(node: &mut Node, now: Instant) -> Vec<(PacketRepr, Vec<u8>)> {
    collect_from(&mut node.qp, &node.mem, now, 10_000)
}

/// A counter by the name `softnic stats` prints (0 when the QP has no such counter).
pub fn counter(qp: &Qp, name: &str) -> u64 {
    let mut v = None;
    qp.counters().for_each(|n, x| {
        if n == name {
            v = Some(x);
        }
    });
    v.unwrap_or(0)
}

/// A packet with only a BTH.
pub fn packet(opcode: Opcode, dest_qpn: u32, psn: u32) -> PacketRepr {
    PacketRepr::new(BthRepr {
        mig_req: true,
        ..BthRepr::new(opcode, Qpn::new(dest_qpn), Psn::new(psn))
    })
}

/// An RDMA READ request.
pub fn read_request(dest_qpn: u32, psn: u32, va: u64, rkey: u32, dma_len: u32) -> PacketRepr {
    let mut r = packet(Opcode::RC_RDMA_READ_REQUEST, dest_qpn, psn);
    r.reth = Some(RethRepr { va, rkey, dma_len });
    r
}

/// An ACK/NAK with any syndrome and MSN.
pub fn ack(dest_qpn: u32, psn: u32, syndrome: Syndrome, msn: u32) -> PacketRepr {
    let mut r = packet(Opcode::RC_ACKNOWLEDGE, dest_qpn, psn);
    r.aeth = Some(AethRepr {
        syndrome,
        msn: Msn::new(msn),
    });
    r
}

/// Memory with one huge region (`key`, at `base`, `len` bytes, every right) that
/// stores nothing: reads return the low byte of each address, writes are counted and
/// dropped. Lets a test post or answer a 2 GiB message without 2 GiB of RAM.
#[derive(Debug, Clone)]
pub struct SparseMem {
    pub key: u32,
    pub base: u64,
    pub len: u64,
    pub written: u64,
}

impl SparseMem {
    pub fn new(key: u32, base: u64, len: u64) -> SparseMem {
        SparseMem {
            key,
            base,
            len,
            written: 0,
        }
    }

    fn check(&self, key: u32, va: u64, len: u64) -> Result<(), MemError> {
        if key != self.key {
            return Err(MemError::InvalidKey);
        }
        let off = va.checked_sub(self.base).ok_or(MemError::OutOfRange)?;
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfRange),
        }
    }

    fn fill(va: u64, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            *b = va.wrapping_add(i as u64) as u8;
        }
    }
}

impl Memory for SparseMem {
    fn read_local(&self, _pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(lkey, va, dst.len() as u64)?;
        SparseMem::fill(va, dst);
        Ok(())
    }

    fn write_local(&mut self, _pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        self.check(lkey, va, src.len() as u64)?;
        self.written += src.len() as u64;
        Ok(())
    }

    fn check_remote(
        &self,
        _by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        _access: Access,
    ) -> Result<(), MemError> {
        self.check(rkey, va, len)
    }

    fn read_remote(
        &self,
        _by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        self.check(rkey, va, dst.len() as u64)?;
        SparseMem::fill(va, dst);
        Ok(())
    }

    fn write_remote(
        &mut self,
        _by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        self.check(rkey, va, src.len() as u64)?;
        self.written += src.len() as u64;
        Ok(())
    }

    fn atomic(
        &mut self,
        _by: Accessor,
        _rkey: u32,
        _va: u64,
        _op: AtomicOp,
    ) -> Result<u64, MemError> {
        Err(MemError::AccessDenied)
    }
}
