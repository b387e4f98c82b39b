//! The victim's registered memory: every region lives in one backing buffer between
//! canary bytes, and every access the transport is granted is logged with the QP (and,
//! during `handle_packet`, the request PSN and the XRC SRQ the packet was handed with)
//! that made it, and the protection domain it was made under.
//!
//! The checks mirror the NIC's `MrTable` (`softnic/src/nic/memory.rs`): L_Keys and
//! R_Keys are separate name spaces, the key must belong to the accessing QP's protection
//! domain, `[va, va + len)` must lie inside the region with overflow-checked
//! arithmetic, the region must grant the access, and atomics need an 8-byte-aligned
//! target. The oracles in `victim.rs` then judge the *transport*: whether what it did
//! with the accesses it was granted stays inside what the peer's packets and the
//! victim's own work requests asked for.

use std::cell::RefCell;

use softnic_transport::memory::{Access, Accessor, AtomicOp, MemError, Memory};

/// Canary bytes before, between and after the regions.
pub const CANARY_LEN: usize = 64;

/// The byte a canary at backing offset `i` holds.
pub fn canary_byte(i: usize) -> u8 {
    0xA5 ^ (i as u8).wrapping_mul(29)
}

/// The initial contents of byte `k` of region `r` (distinct per region, so a READ that
/// returns the wrong region's bytes is visible in the output).
fn fill_byte(r: usize, k: usize) -> u8 {
    (r as u8).wrapping_mul(53) ^ (k as u8).wrapping_mul(7) ^ 0x3C
}

/// One registered region, as the victim's client registered it.
#[derive(Debug, Clone, Copy)]
pub struct MrSpec {
    /// For messages.
    pub name: &'static str,
    /// Protection domain.
    pub pd: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// Address of byte 0 as the peer names it.
    pub iova: u64,
    /// Length in bytes.
    pub len: usize,
    /// Access rights.
    pub access: Access,
}

const ALL: Access = Access::ALL;
const LW: Access = Access::LOCAL_WRITE;

/// The regions every run starts with. Lengths are odd or small on purpose, addresses
/// sit at both ends of the 64-bit space, one region is empty and one belongs to another
/// protection domain (no QP or XRC SRQ of the victim's XRC domain is in PD 2, so it must
/// never change). The last two belong to the PDs of two XRC SRQs (PD 3, PD 4), the only
/// memory a request naming one of those may reach; "xrc3" sits at the address of "rw"
/// (PD 1), so a request handled under the wrong PD is told apart by its key alone.
pub const MRS: [MrSpec; 12] = [
    mr(
        "rw",
        1,
        0x1D2E_3F40,
        0x9A8B_7C6D,
        0x7F00_0000_0000,
        4096,
        ALL,
    ),
    mr(
        "ro",
        1,
        0x0BAD_F00D,
        0x5EED_1234,
        u64::MAX - 1000,
        1000,
        Access::REMOTE_READ,
    ),
    mr(
        "wo",
        1,
        0x0000_0042,
        0x0000_0043,
        0,
        300,
        LW.union(Access::REMOTE_WRITE),
    ),
    mr(
        "atomic",
        1,
        0x7777_0001,
        0x7777_0002,
        0x1000_0008,
        64,
        LW.union(Access::REMOTE_ATOMIC),
    ),
    mr(
        "none",
        1,
        0x4E4F_4E45,
        0x1357_9BDF,
        0x2000,
        256,
        Access::NONE,
    ),
    mr("recv", 1, 0x5245_4356, 0x2468_ACE0, 0x3000_0000, 8192, LW),
    mr("sink", 1, 0x5349_4E4B, 0x0F0F_0F0F, 0x4000_0000, 4096, LW),
    mr(
        "otherpd",
        2,
        0x0DD0_0DD0,
        0xC0DE_C0DE,
        0x7F00_0000_1000,
        512,
        ALL,
    ),
    mr("empty", 1, 0xE0E0_E0E0, 0xE1E1_E1E1, 0x5000, 0, ALL),
    mr("odd", 1, 0x0DDB_A115, 0x0DDB_A11F, 0x6000_0003, 1023, ALL),
    mr(
        "xrc3",
        3,
        0x3333_0001,
        0x3333_0002,
        0x7F00_0000_0000,
        4096,
        ALL,
    ),
    mr("xrc4", 4, 0x4444_0001, 0x4444_0002, 0x8000_0005, 3075, ALL),
];

/// The regions the RC, UC and UD QPs' crafted packets name: the table as it was before
/// the XRC SRQs' regions were added, so that the committed seeds keep their meaning
/// (the peer draws a region index modulo this count).
pub const MRS_BASE: usize = 10;

const fn mr(
    name: &'static str,
    pd: u32,
    lkey: u32,
    rkey: u32,
    iova: u64,
    len: usize,
    access: Access,
) -> MrSpec {
    MrSpec {
        name,
        pd,
        lkey,
        rkey,
        iova,
        len,
        access,
    }
}

/// Index of a region in [`MRS`] by name (for the harness's own choices).
pub fn mr_index(name: &str) -> usize {
    MRS.iter().position(|m| m.name == name).unwrap_or(0)
}

/// What kind of access the transport made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Gather of a send WQE (`read_local`).
    ReadLocal,
    /// Scatter into a receive WQE or a READ/atomic sink (`write_local`).
    WriteLocal,
    /// READ response payload (`read_remote`).
    ReadRemote,
    /// RDMA WRITE placement (`write_remote`).
    WriteRemote,
    /// Atomic execution (`atomic`).
    Atomic,
}

/// How the packet being handled was handed to its QP (the NIC's `deliver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Via {
    /// `Qp::handle_packet` (a QP with its own receive queue), or no packet at all
    /// (`poll_transmit`, a timer).
    #[default]
    Qp,
    /// `Qp::handle_packet_xrc` with the XRC SRQ of this index in the victim's table
    /// (the SRQ of the QP's domain that the XRCETH names).
    Srq(usize),
    /// `Qp::handle_packet_xrc_no_srq`: no XRC SRQ of the QP's domain by that number.
    NoSrq,
}

/// Who is calling into the transport while an access happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Actor {
    /// Index of the victim QP.
    pub qp: usize,
    /// PSN of the request packet being handled (`None` outside `handle_packet`, or for
    /// a response packet).
    pub request_psn: Option<u32>,
    /// How that packet was handed in.
    pub via: Via,
}

/// One granted access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    /// Who.
    pub actor: Actor,
    /// How.
    pub kind: Kind,
    /// The key used.
    pub key: u32,
    /// The protection domain it was made under (the region's: the table grants an
    /// access only in the region's own PD).
    pub pd: u32,
    /// Start address.
    pub va: u64,
    /// Bytes.
    pub len: u64,
    /// The bytes written (`write_local`, `write_remote`; empty for other kinds).
    pub data: Vec<u8>,
}

/// Registered memory over one canaried buffer.
#[derive(Debug)]
pub struct CanaryMem {
    buf: Vec<u8>,
    /// Offset of each region of [`MRS`] in `buf`.
    offsets: Vec<usize>,
    /// Who calls into the transport now.
    pub actor: Actor,
    /// Every granted access since the last [`CanaryMem::take_log`].
    log: RefCell<Vec<Touch>>,
}

impl Default for CanaryMem {
    fn default() -> Self {
        CanaryMem::new()
    }
}

impl CanaryMem {
    /// Lays out [`MRS`] with canaries around each region and fills the regions.
    pub fn new() -> Self {
        let mut offsets = Vec::with_capacity(MRS.len());
        let mut at = CANARY_LEN;
        for m in &MRS {
            offsets.push(at);
            at += m.len + CANARY_LEN;
        }
        let mut buf: Vec<u8> = (0..at).map(canary_byte).collect();
        for (r, m) in MRS.iter().enumerate() {
            for k in 0..m.len {
                buf[offsets[r] + k] = fill_byte(r, k);
            }
        }
        CanaryMem {
            buf,
            offsets,
            actor: Actor::default(),
            log: RefCell::new(Vec::new()),
        }
    }

    /// The current bytes of region `r`.
    pub fn region(&self, r: usize) -> &[u8] {
        &self.buf[self.offsets[r]..self.offsets[r] + MRS[r].len]
    }

    /// The first canary byte that changed, as (backing offset, found byte).
    pub fn damaged_canary(&self) -> Option<(usize, u8)> {
        let mut start = 0;
        for (r, m) in MRS.iter().enumerate() {
            let end = self.offsets[r];
            if let Some(i) = (start..end).find(|&i| self.buf[i] != canary_byte(i)) {
                return Some((i, self.buf[i]));
            }
            start = end + m.len;
        }
        (start..self.buf.len())
            .find(|&i| self.buf[i] != canary_byte(i))
            .map(|i| (i, self.buf[i]))
    }

    /// The bytes at `[va, va + len)` of the region with R_Key `rkey`, without checks of
    /// rights and without logging (for the oracles).
    pub fn peek_remote(&self, rkey: u32, va: u64, len: usize) -> Option<&[u8]> {
        let r = MRS.iter().position(|m| m.rkey == rkey)?;
        let o = self.offset(r, va, len as u64).ok()?;
        Some(&self.buf[o..o + len])
    }

    /// True when region `r` still holds its initial bytes.
    pub fn pristine(&self, r: usize) -> bool {
        self.region(r)
            .iter()
            .enumerate()
            .all(|(k, &b)| b == fill_byte(r, k))
    }

    /// The accesses logged since the last call.
    pub fn take_log(&mut self) -> Vec<Touch> {
        std::mem::take(self.log.get_mut())
    }

    /// Gives every access logged since the last [`CanaryMem::take_log`] to `actor`.
    pub fn relabel(&mut self, actor: Actor) {
        for t in self.log.get_mut() {
            t.actor = actor;
        }
    }

    fn record(&self, kind: Kind, (pd, key): (u32, u32), va: u64, len: u64, data: &[u8]) {
        self.log.borrow_mut().push(Touch {
            actor: self.actor,
            kind,
            key,
            pd,
            va,
            len,
            data: data.to_vec(),
        });
    }

    /// The region named by `key` in the L_Key (`remote == false`) or R_Key space, in
    /// protection domain `pd`.
    fn by_key(&self, pd: u32, key: u32, remote: bool) -> Result<usize, MemError> {
        MRS.iter()
            .position(|m| (if remote { m.rkey } else { m.lkey }) == key && m.pd == pd)
            .ok_or(MemError::InvalidKey)
    }

    /// Backing offset of `[va, va + len)` of region `r`, if it lies inside.
    fn offset(&self, r: usize, va: u64, len: u64) -> Result<usize, MemError> {
        let m = &MRS[r];
        let off = va.checked_sub(m.iova).ok_or(MemError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfRange)?;
        if end > m.len as u64 {
            return Err(MemError::OutOfRange);
        }
        Ok(self.offsets[r] + off as usize)
    }

    fn remote(&self, pd: u32, rkey: u32, access: Access) -> Result<usize, MemError> {
        let r = self.by_key(pd, rkey, true)?;
        if !MRS[r].access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        Ok(r)
    }
}

impl Memory for CanaryMem {
    fn read_local(&self, pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let r = self.by_key(pd, lkey, false)?;
        let o = self.offset(r, va, dst.len() as u64)?;
        dst.copy_from_slice(&self.buf[o..o + dst.len()]);
        self.record(Kind::ReadLocal, (pd, lkey), va, dst.len() as u64, &[]);
        Ok(())
    }

    fn write_local(&mut self, pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        let r = self.by_key(pd, lkey, false)?;
        if !MRS[r].access.contains(Access::LOCAL_WRITE) {
            return Err(MemError::AccessDenied);
        }
        let o = self.offset(r, va, src.len() as u64)?;
        self.buf[o..o + src.len()].copy_from_slice(src);
        self.record(Kind::WriteLocal, (pd, lkey), va, src.len() as u64, src);
        Ok(())
    }

    fn check_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        let r = self.remote(by.pd, rkey, access)?;
        self.offset(r, va, len).map(|_| ())
    }

    fn read_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        let r = self.remote(by.pd, rkey, Access::REMOTE_READ)?;
        let o = self.offset(r, va, dst.len() as u64)?;
        dst.copy_from_slice(&self.buf[o..o + dst.len()]);
        self.record(Kind::ReadRemote, (by.pd, rkey), va, dst.len() as u64, &[]);
        Ok(())
    }

    fn write_remote(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        let r = self.remote(by.pd, rkey, Access::REMOTE_WRITE)?;
        let o = self.offset(r, va, src.len() as u64)?;
        self.buf[o..o + src.len()].copy_from_slice(src);
        self.record(Kind::WriteRemote, (by.pd, rkey), va, src.len() as u64, src);
        Ok(())
    }

    fn atomic(&mut self, by: Accessor, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        let r = self.remote(by.pd, rkey, Access::REMOTE_ATOMIC)?;
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let o = self.offset(r, va, 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[o..o + 8]);
        let orig = u64::from_ne_bytes(b);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
            AtomicOp::CompareSwap { .. } => orig,
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        };
        self.buf[o..o + 8].copy_from_slice(&new.to_ne_bytes());
        self.record(Kind::Atomic, (by.pd, rkey), va, 8, &[]);
        Ok(orig)
    }
}
