//! Memory regions (`ibv_reg_mr`).
//!
//! # Why softnic allocates the memory
//! On hardware, `ibv_reg_mr` pins arbitrary user pages and the RNIC DMAs into them. The
//! softnic NIC is another *process*: it can only reach memory the client shares with it.
//! Copying through the kernel (`process_vm_writev`, a socket) would put a syscall and a
//! copy on every transfer, which defeats the purpose. So a region is a memfd that the
//! client maps and passes to the NIC, which maps it too: the NIC's writes land directly
//! in the client's pages (zero copy), and heap memory (`Vec`, `Box`) cannot be
//! registered. Allocate with [`crate::ProtectionDomain::alloc_mr`] and move bytes in and
//! out with [`MemoryRegion::write`], [`MemoryRegion::read`] and [`MemoryRegion::fill`]:
//! copies, because the NIC may write the region at any time and an ordinary `&[u8]` to
//! it would be a promise Rust cannot rely on (the zero-copy views
//! [`MemoryRegion::as_slice`] and [`MemoryRegion::as_mut_slice`] are `unsafe fn`).
//!
//! The region's address ([`MemoryRegion::addr`], its iova) is the client's mapping
//! address, as in real verbs: SGEs and remote addresses (RETH VA) are client virtual
//! addresses, and the NIC translates `offset = va − iova`.

use std::fmt;
use std::ops::BitOr;
use std::os::fd::AsFd;
use std::sync::Arc;

use memmap2::MmapRaw;

use crate::abi::control::{Handle, Reply, Request};
use crate::abi::layout::mr_segment_len;
use crate::abi::Sge;
use crate::error::{io, Error, Result};
use crate::os;
use crate::pd::{MrEntry, PdShared, ProtectionDomain};

/// Memory access rights (`enum ibv_access_flags`, same bit values).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// Local read only.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// IBV_ACCESS_LOCAL_WRITE: the NIC may write (receives, READ responses, atomics' results).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// IBV_ACCESS_REMOTE_WRITE (requires LOCAL_WRITE).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// IBV_ACCESS_REMOTE_ATOMIC (requires LOCAL_WRITE).
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(8);
    /// Every right.
    pub const ALL: AccessFlags = AccessFlags(0xF);
    /// IBV_ACCESS_MW_BIND: memory windows may be bound to the region (IBTA 10.6.7.2.1).
    pub const MW_BIND: AccessFlags = AccessFlags(0x10);

    /// True when every right in `other` is in `self`.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Checks the verbs rules: only known bits, and remote write/atomic need local write
    /// (`ibv_reg_mr(3)`: "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set,
    /// then IBV_ACCESS_LOCAL_WRITE must be set too").
    pub fn validate(self) -> Result<()> {
        let known = Self::ALL.0 | Self::MW_BIND.0;
        if self.0 & !known != 0 {
            return Err(Error::InvalidArgument(format!(
                "access flags {:#x} contain bits softnic does not know (known: {known:#x})",
                self.0,
            )));
        }
        if (self.contains(Self::REMOTE_WRITE) || self.contains(Self::REMOTE_ATOMIC))
            && !self.contains(Self::LOCAL_WRITE)
        {
            return Err(Error::InvalidArgument(format!(
                "access {self:?}: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"
            )));
        }
        Ok(())
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            write!(f, "NONE")
        } else {
            write!(f, "{}", set.join("|"))
        }
    }
}

/// A registered memory region (`struct ibv_mr`) backed by shared memory.
///
/// The NIC may write into it at any time the access flags allow (receives, READ
/// responses, remote WRITEs and atomics): read the bytes after the completion that
/// tells you they arrived (the CQ's acquire orders them). `Send + Sync`.
pub struct MemoryRegion {
    map: MmapRaw,
    len: usize,
    handle: Handle,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    pd: Arc<PdShared>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    pub(crate) fn alloc(pd: &ProtectionDomain, len: usize, access: AccessFlags) -> Result<Self> {
        access.validate()?;
        let max = pd.inner.ctx.inner.attr().max_mr_size;
        if len as u64 > max {
            return Err(Error::InvalidArgument(format!(
                "memory region of {len} bytes exceeds the device's max_mr_size {max}"
            )));
        }
        let seg_len = mr_segment_len(len)?;
        let fd = os::memfd("softnic-mr", seg_len).map_err(io("creating the region's memfd"))?;
        let map = os::map_shared(fd.as_fd(), seg_len).map_err(io("mapping the region"))?;
        let iova = map.as_ptr() as u64;
        let req = Request::RegMr {
            pd: pd.inner.handle,
            len: len as u64,
            access: access.0,
            iova,
        };
        let (reply, _) = pd.inner.ctx.inner.call("ibv_reg_mr", &req, &[fd.as_fd()])?;
        let (handle, lkey, rkey) = match reply {
            Reply::Mr { mr, lkey, rkey } => (mr, lkey, rkey),
            other => return Err(Error::Protocol(format!("RegMr answered with {other:?}"))),
        };
        pd.inner.add_mr(MrEntry {
            lkey,
            addr: iova,
            len: len as u64,
        });
        Ok(MemoryRegion {
            map,
            len,
            handle,
            lkey,
            rkey,
            access,
            pd: pd.inner.clone(),
        })
    }

    /// Address of the first byte (the region's iova; use it in SGEs and give it to the
    /// peer for RDMA WRITE/READ/atomics).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// Length in bytes (as registered; the mapping may be page-rounded beyond it).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The NIC's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// An SGE covering `len` bytes at `offset` of this region. Panics if the range is
    /// outside the region (a programming error, like slice indexing).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset
                .checked_add(len as usize)
                .is_some_and(|e| e <= self.len),
            "SGE [{offset}, +{len}) is outside the {}-byte region",
            self.len
        );
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey,
        }
    }

    /// Panics unless `[offset, offset + len)` lies inside the region; returns the pointer
    /// to its first byte.
    fn range_ptr(&self, offset: usize, len: usize, what: &str) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "{what} [{offset}, +{len}) is outside the {}-byte region",
            self.len
        );
        // SAFETY: offset <= self.len <= the mapping's length, so the result stays inside
        // (or one past the end of) the mapping.
        unsafe { self.map.as_mut_ptr().add(offset) }
    }

    /// Copies `buf.len()` bytes at `offset` out of the region into `buf`. Panics if the
    /// range is outside the region (like slice indexing).
    ///
    /// Safe at any time: the copy is made of volatile loads and never forms a reference
    /// to the shared bytes, so a NIC writing them meanwhile (a receive, a remote WRITE or
    /// atomic) can only make `buf` a mix of old and new bytes — which is why you read
    /// after the completion that tells you they arrived (the CQ's acquire orders them).
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        let src = self.range_ptr(offset, buf.len(), "read");
        // SAFETY: [src, src + buf.len()) is inside the live mapping (range_ptr); buf is
        // our own memory, disjoint from the mapping.
        unsafe { volatile_copy(buf.as_mut_ptr(), src, buf.len()) }
    }

    /// `len` bytes at `offset`, copied into a new vector (see [`MemoryRegion::read`]).
    pub fn read_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v);
        v
    }

    /// `N` bytes at `offset`, copied into an array (see [`MemoryRegion::read`]); e.g.
    /// `u64::from_ne_bytes(mr.read_array(8))`.
    pub fn read_array<const N: usize>(&self, offset: usize) -> [u8; N] {
        let mut a = [0u8; N];
        self.read(offset, &mut a);
        a
    }

    /// Copies `data` into the region at `offset`. Panics if the range is outside the
    /// region. The copy is made of volatile stores, never through a reference. Write
    /// before posting the work request that sends the bytes (posting releases them to
    /// the NIC).
    ///
    /// Takes `&mut self` so that no other thread of this process reads or writes the
    /// region meanwhile (two threads' plain stores to the same bytes would be a data
    /// race, which Rust makes undefined behaviour whatever the stores are made of).
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let dst = self.range_ptr(offset, data.len(), "write");
        // SAFETY: [dst, dst + data.len()) is inside the live mapping; data is our own
        // memory, disjoint from it.
        unsafe { volatile_copy(dst, data.as_ptr(), data.len()) }
    }

    /// Sets `len` bytes at `offset` to `byte` (volatile stores; `&mut self` as in
    /// [`MemoryRegion::write`]). Panics if the range is outside the region.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) {
        let dst = self.range_ptr(offset, len, "fill");
        let word = u64::from_ne_bytes([byte; 8]);
        let mut i = 0;
        while i < len && !(dst as usize + i).is_multiple_of(8) {
            // SAFETY: i < len: inside [dst, dst + len), which is in the mapping.
            unsafe { dst.add(i).write_volatile(byte) };
            i += 1;
        }
        while i + 8 <= len {
            // SAFETY: dst + i is 8-byte aligned (first loop) and its 8 bytes are inside
            // [dst, dst + len).
            unsafe { dst.add(i).cast::<u64>().write_volatile(word) };
            i += 8;
        }
        while i < len {
            // SAFETY: i < len, as in the first loop.
            unsafe { dst.add(i).write_volatile(byte) };
            i += 1;
        }
    }

    /// The region's bytes as an ordinary shared slice, without copying.
    ///
    /// # Safety
    /// A `&[u8]` promises Rust that nobody writes the bytes while it lives. The caller
    /// must make sure of that for the whole lifetime of the slice:
    /// * the NIC does not write them: no receive, RDMA READ or atomic posted by this
    ///   process targets the region and is still outstanding (its completion has been
    ///   polled), and no peer can WRITE or run an atomic on it (the region lacks
    ///   REMOTE_WRITE and REMOTE_ATOMIC, or the application's protocol keeps its peers
    ///   from doing so meanwhile);
    /// * this process does not write them either: no [`MemoryRegion::write`],
    ///   [`MemoryRegion::fill`] or [`MemoryRegion::atomic_u64`] store (from another
    ///   thread, or from a clone of a reference) overlaps the slice while it lives.
    ///
    /// Prefer [`MemoryRegion::read`], which is always safe. Safe code cannot call this
    /// (it once could, which made undefined behaviour reachable without `unsafe`):
    ///
    /// ```compile_fail,E0133
    /// fn peek(mr: &verbs_api::MemoryRegion) -> u8 {
    ///     mr.as_slice()[0]
    /// }
    /// ```
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `len` bytes (page-rounded) and lives as long as
        // `self`; the absence of concurrent writers is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }

    /// The region's bytes as an ordinary mutable slice, without copying.
    ///
    /// # Safety
    /// A `&mut [u8]` promises Rust that nothing else reads or writes the bytes while it
    /// lives. Besides the contract of [`MemoryRegion::as_slice`], the NIC must not *read*
    /// them either: no send, RDMA WRITE or atomic posted by this process gathers from the
    /// region and is still outstanding, and no peer can RDMA READ it meanwhile. (`&mut
    /// self` already keeps this process's other accessors away while the slice lives.)
    ///
    /// Prefer [`MemoryRegion::write`] and [`MemoryRegion::fill`], which are always safe.
    ///
    /// ```compile_fail,E0133
    /// fn poke(mr: &mut verbs_api::MemoryRegion) {
    ///     mr.as_mut_slice()[0] = 1;
    /// }
    /// ```
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes other borrows in this process,
        // and the NIC's absence is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr(), self.len) }
    }

    /// The 8-byte word at `offset` as an atomic (an atomics target): reading it with
    /// `load` sees remote FETCH_ADD/CMP_SWAP results without tearing. `offset` must be
    /// 8-byte aligned and inside the region.
    ///
    /// Sound next to the NIC: the NIC's atomics use the same locked instructions on the
    /// same word. While the reference lives, [`MemoryRegion::write`],
    /// [`MemoryRegion::fill`] and [`MemoryRegion::as_mut_slice`] cannot be called (they
    /// take `&mut self`). Read the word through the atomic, not with
    /// [`MemoryRegion::read`], when another thread of this process may be storing to it:
    /// a plain read racing with an atomic store in the same process is a data race in
    /// Rust's model (against the NIC's atomics, another process, `read` can at worst see
    /// a torn value).
    pub fn atomic_u64(&self, offset: usize) -> Result<&std::sync::atomic::AtomicU64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|e| e > self.len) {
            return Err(Error::InvalidArgument(format!(
                "atomic word at offset {offset} must be 8-byte aligned and inside the {}-byte region",
                self.len
            )));
        }
        // SAFETY: in bounds (checked), 8-byte aligned (mapping is page aligned, offset
        // multiple of 8), lives as long as `&self`; AtomicU64 tolerates concurrent
        // access by the NIC. No safe accessor forms a non-atomic reference to it.
        Ok(unsafe { &*(self.map.as_ptr().add(offset) as *const std::sync::atomic::AtomicU64) })
    }
}

/// Copies `len` bytes from `src` to `dst` with volatile accesses, 8 bytes at a time where
/// both are aligned alike. Volatile because one side is memory the NIC process may touch
/// concurrently: the compiler must neither assume the bytes stay put (no invented or
/// repeated reads) nor elide the stores. This is how shared guest memory is copied in
/// `vm-memory` too; Rust's memory model has no word for another process, and volatile is
/// the access it documents for memory that changes outside the program's knowledge.
///
/// # Safety
/// `src` is valid for `len` byte reads, `dst` for `len` byte writes, and they do not
/// overlap.
unsafe fn volatile_copy(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    if (dst as usize) % 8 == (src as usize) % 8 {
        while i < len && !(src as usize + i).is_multiple_of(8) {
            // SAFETY: i < len: inside both buffers (caller's contract).
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
            i += 1;
        }
        while i + 8 <= len {
            // SAFETY: src + i and dst + i are 8-byte aligned (the head loop aligned src,
            // and dst has the same remainder mod 8); i + 8 <= len keeps both inside.
            unsafe {
                let w = src.add(i).cast::<u64>().read_volatile();
                dst.add(i).cast::<u64>().write_volatile(w);
            }
            i += 8;
        }
    }
    while i < len {
        // SAFETY: i < len, inside both buffers (caller).
        unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        i += 1;
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.pd.remove_mr(self.lkey);
        let _ = self
            .pd
            .ctx
            .inner
            .call("ibv_dereg_mr", &Request::DeregMr { mr: self.handle }, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::volatile_copy;

    /// Every alignment and length combination copies exactly its bytes and nothing
    /// around them (the u64 middle and the byte head/tail meet correctly).
    #[test]
    fn volatile_copy_is_exact_at_every_alignment() {
        let src: Vec<u8> = (0..96u8).map(|b| b.wrapping_mul(37) ^ 0x5c).collect();
        for so in 0..9 {
            for d in 0..9 {
                for len in 0..40 {
                    let mut dst = vec![0xEEu8; 96];
                    // SAFETY: so + len <= 96 and d + len <= 96; distinct vectors.
                    unsafe { volatile_copy(dst.as_mut_ptr().add(d), src.as_ptr().add(so), len) };
                    assert_eq!(&dst[d..d + len], &src[so..so + len], "{so} {d} {len}");
                    assert!(dst[..d].iter().all(|&b| b == 0xEE));
                    assert!(dst[d + len..].iter().all(|&b| b == 0xEE));
                }
            }
        }
    }
}
