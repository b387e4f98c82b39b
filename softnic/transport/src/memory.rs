//! Registered memory as the transport reaches it.
//!
//! The NIC owns the memory-region table (lkey/rkey → mapping, length, access flags,
//! protection domain) and implements [`Memory`] over it; every access the transport makes
//! goes through a key and is checked there (IBTA 10.6: L_Key/R_Key checks, bounds and
//! access rights on every use). Tests implement it over `Vec<u8>`s.

use core::fmt;

/// Memory access rights, with the bit values of `enum ibv_access_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// No remote access, local read only.
    pub const NONE: Access = Access(0);
    /// IBV_ACCESS_LOCAL_WRITE: the NIC may write (receive buffers, READ responses).
    pub const LOCAL_WRITE: Access = Access(1);
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: Access = Access(4);
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every bit softnic knows.
    pub const ALL: Access = Access(0xF);

    /// True when every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let mut first = true;
        write!(f, "Access(")?;
        for (a, n) in names {
            if self.contains(a) {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{n}")?;
                first = false;
            }
        }
        write!(f, ")")
    }
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No region has this key, or it belongs to another protection domain.
    InvalidKey,
    /// `[va, va + len)` is not inside the region.
    OutOfRange,
    /// The region lacks the access right.
    AccessDenied,
    /// An atomic target not aligned to 8 bytes (IBTA 9.4.5).
    Misaligned,
}

/// An atomic operation on an 8-byte target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// If `*target == compare` then `*target = swap`.
    CompareSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// `*target += add` (wrapping).
    FetchAdd {
        /// Value to add.
        add: u64,
    },
}

/// The QP through which a peer's request reaches memory (the responder's side of an
/// RDMA WRITE, READ, atomic or SEND with Invalidate): its protection domain, which every
/// R_Key it uses must share, and its number, on which a type 2 memory window must have
/// been bound. IBTA 10.6.7.2 associates a type 2B window with one QP as well as a PD;
/// rxe's `rxe_lookup_mw` checks both, so an R_Key bound for one connection is no key on
/// another connection of the same PD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accessor {
    /// Protection domain of the QP.
    pub pd: u32,
    /// The QP's number.
    pub qpn: u32,
}

/// Access to registered memory, checked by key. A local access names the protection
/// domain of the QP making it (`pd`), a remote one the QP itself ([`Accessor`]): a key
/// from another PD is an [`MemError::InvalidKey`].
pub trait Memory {
    /// Copies `dst.len()` bytes at `va` of the region `lkey` into `dst` (gather for a
    /// send; local read needs no access flag).
    fn read_local(&self, pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError>;

    /// [`Memory::read_local`] that also continues the CRC-32 `crc` (crc32fast's; 0 to
    /// start) over the bytes copied into `dst`, and returns it: the gather's payload
    /// digest, from which the sender's ICRC is completed without hashing the payload
    /// again (`wire::icrc::PreparedIcrc::compute_with_payload`). The default copies,
    /// then hashes `dst`; the NIC's mappings do both in one pass.
    fn read_local_crc(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.read_local(pd, lkey, va, dst)?;
        Ok(crate::crc::update(crc, dst))
    }

    /// Copies `src` to `va` of the region `lkey` (scatter of a receive or a READ
    /// response); requires [`Access::LOCAL_WRITE`].
    fn write_local(&mut self, pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError>;

    /// [`Memory::write_local`] that also continues the CRC-32 `crc` over `src` and
    /// returns it: the receiver's single pass (a payload placed before its ICRC is
    /// checked, whose check then combines this CRC in instead of hashing the payload;
    /// `qp::placement`). The default writes, then hashes `src`; the NIC's mappings do
    /// both in one pass.
    fn write_local_crc(
        &mut self,
        pd: u32,
        lkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.write_local(pd, lkey, va, src)?;
        Ok(crate::crc::update(crc, src))
    }

    /// Checks that `[va, va + len)` of region `rkey` grants `access`, without touching
    /// memory (a responder validates the whole RETH range on the first packet).
    fn check_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError>;

    /// Copies from region `rkey` for an RDMA READ response; requires REMOTE_READ.
    fn read_remote(&self, by: Accessor, rkey: u32, va: u64, dst: &mut [u8])
        -> Result<(), MemError>;

    /// [`Memory::read_remote`] with the CRC of the copied bytes, as
    /// [`Memory::read_local_crc`] (a READ response's payload digest).
    fn read_remote_crc(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.read_remote(by, rkey, va, dst)?;
        Ok(crate::crc::update(crc, dst))
    }

    /// Copies into region `rkey` for an RDMA WRITE; requires REMOTE_WRITE.
    fn write_remote(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError>;

    /// [`Memory::write_remote`] with the CRC of `src`, as [`Memory::write_local_crc`]
    /// (an RDMA WRITE packet's payload placed before its ICRC is checked).
    fn write_remote_crc(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.write_remote(by, rkey, va, src)?;
        Ok(crate::crc::update(crc, src))
    }

    /// Executes an atomic on the 8-byte target at `va` and returns the original value;
    /// requires REMOTE_ATOMIC and 8-byte alignment. Must be atomic with respect to every
    /// other access to that memory, including the client's own CPU atomics.
    fn atomic(&mut self, by: Accessor, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Stores the 8 bytes `value` at `va` for an RDMA ATOMIC WRITE (IBTA Annex A19);
    /// requires REMOTE_WRITE and 8-byte alignment, and the store must be one: no
    /// access sees part of it. The default writes through [`Memory::write_remote`],
    /// one store for memory no one else touches meanwhile (the transport's tests);
    /// the NIC's mappings store through an `AtomicU64`.
    fn atomic_write(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        self.write_remote(by, rkey, va, &value)
    }

    /// Invalidates R_Key `rkey` for a SEND with Invalidate received by QP `by` (IBTA
    /// 10.6.7.2.4: a bound type 2 memory window of its PD, bound on that QP). Memory
    /// without windows has nothing to invalidate.
    fn invalidate(&mut self, by: Accessor, rkey: u32) -> Result<(), MemError> {
        let _ = (by, rkey);
        Err(MemError::InvalidKey)
    }
}
