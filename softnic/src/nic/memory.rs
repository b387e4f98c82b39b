//! The memory-region table: the NIC's "DMA".
//!
//! A client registers a region by sending the memfd that backs it (see
//! `verbs_api::abi::control::Request::RegMr`); the NIC maps the same file, so the bytes
//! the client sees at `iova + k` are the bytes the NIC sees at `mapping + k`. A window
//! (`RegMrWindow`: an unaligned buffer, or pages another live region maps) is the same
//! with a mapping assembled from pieces ([`super::mr_view`]) and `base` + k. Every
//! access the transport makes goes through [`Memory`] with a key, and is checked here
//! on every use, as IBTA 10.6 asks of L_Key and R_Key checks:
//! the key exists and belongs to the accessing QP's protection domain, the whole range
//! `[va, va + len)` lies inside the region (overflow-safe arithmetic), the region grants
//! the access, and atomics target an 8-byte-aligned address (IBTA 9.4.5).
//!
//! # Keys
//! L_Keys and R_Keys are separate 32-bit values, each drawn afresh from the OS's
//! cryptographic generator ([`super::secret`]), unique among live keys and never 0. So
//! no key says anything about another — not the L_Key about the R_Key of the same
//! region, nor one client's keys about another's (IBTA 10.6.3.2 leaves the key format
//! to the CA; unpredictable R_Keys are what keeps a remote peer from reaching memory it
//! was never given a key for). A blind guess still succeeds with probability 2^-32 per
//! try, and a region is reachable only through a connected QP of its PD.
//!
//! # Shared memory and soundness
//! The client may read and write its region while the NIC does, exactly as a CPU may
//! touch a buffer a real NIC is DMA-ing. So this module never forms a `&[u8]` or
//! `&mut [u8]` to a mapping — a reference would promise Rust that nobody else writes the
//! bytes. Bulk copies are `ptr::copy_nonoverlapping` between the raw mapping pointer and
//! the NIC's own buffer: a concurrent client write can only make the copied bytes a mix
//! of old and new values (what a DMA engine gives too), never undefined behaviour in the
//! NIC's own memory. The gather's digest (`read_local_crc`, `read_remote_crc`: the
//! payload's CRC for the ICRC) copies through softnic-crc's `copy_update_raw`, which
//! also takes the raw pointer, reads each byte once and hashes what it read, so the CRC
//! is that of the bytes sent even while the client writes. The receiver's single pass
//! (`write_remote_crc`, `write_local_crc`: a payload placed before its ICRC is
//! checked, `softnic_transport::qp::placement`) writes through `copy_update_to_raw`,
//! the same with the raw pointer as the destination, hashing the NIC's own buffer. After
//! such a bulk copy, `fetch_ahead` asks the CPU for the region's next lines (prefetch
//! hints, which access nothing). Atomics use
//! `AtomicU64::from_ptr` on the 8-byte target, which on x86-64 and aarch64 compiles to
//! the same locked instructions the client's CPU atomics use, so a FETCH_ADD from the
//! network and a `fetch_add` by the client serialize; an ATOMIC WRITE is one release
//! store through the same `AtomicU64`.
//! Files are checked, mapped and sealed by `verbs_api::os::map_peer_shm` (plain tmpfs
//! memfds only, every page allocated, no shrinking, no hole punching), so no access can
//! fault with SIGBUS. SysV segments are attached only when they are plain tmpfs pages
//! ([`super::sysv_mr`]).
//!
//! # Copy-backed regions
//! Memory with no backing the NIC can map safely (the stack, hugetlb, shared files) is
//! a [`Backing::Copy`] region: the same checks, then `pread`/`pwrite` on the client's
//! `/proc/<pid>/mem` ([`super::copy_mr`]); atomics and ATOMIC WRITEs on it are
//! [`MemError::AccessDenied`] (a copy cannot be atomic against the client's CPU, nor
//! one 8-byte store).

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use softnic_transport::crc::{copy_update_raw, copy_update_to_raw};
use softnic_transport::memory::{Access, Accessor, AtomicOp, MemError, Memory};
use verbs_api::abi::control::{Handle, MrSegment, Request};

/// How many bytes past a gather's copy [`fetch_ahead`] asks for (measured against 512,
/// 2048 and none: docs/perf.md, session 13).
const AHEAD_READ: usize = 1024;
/// The same past a placement's copy (against 1024, 4096 and none).
const AHEAD_WRITE: usize = 2048;
/// The least copy [`fetch_ahead`] looks ahead of (a bulk packet's payload, as
/// `softnic_crc::WIDE_MIN_LEN`; small messages are not streams).
const AHEAD_MIN_LEN: usize = 256;

/// How many bytes after a copy of `len` bytes at `off` of a region of `region_len`
/// bytes [`fetch_ahead`] asks for: up to `cap`, never past the region, none after a
/// copy shorter than [`AHEAD_MIN_LEN`].
fn ahead_len(region_len: u64, off: usize, len: usize, cap: usize) -> usize {
    if len < AHEAD_MIN_LEN {
        return 0;
    }
    let end = off as u64 + len as u64;
    usize::try_from(region_len.saturating_sub(end)).map_or(cap, |left| left.min(cap))
}

/// Asks the CPU to start fetching the bytes of `r` that follow a copy of `len` bytes at
/// `off` (`p` is the mapping at `off`): [`ahead_len`] of them, for writing with `WRITE`
/// (PREFETCHW: the placement stores to them next), else for reading.
///
/// Why: the packets of one message gather from, or are placed into, one contiguous
/// range of the region — at a 4 KiB MTU a page per packet — and the hardware's stream
/// prefetchers stop at a page's end, so each packet's copy began with a run of misses
/// to L3 or memory. Asking for the next page's first lines at the end of each copy gave
/// the `dataplane` bench ≈ +11 % on an Intel Xeon whose L2 does not hold the bench's two
/// 1 MiB regions, and nothing either way once they fit (docs/perf.md, session 13).
/// Hints only: nothing is read or written, no address faults, and the lines lie in the
/// region anyway.
#[inline]
fn fetch_ahead<const WRITE: bool>(r: &Region, off: usize, len: usize, p: *const u8) {
    let ahead = ahead_len(
        r.len,
        off,
        len,
        if WRITE { AHEAD_WRITE } else { AHEAD_READ },
    );
    verbs_api::hint::prefetch_range(p.wrapping_add(len), ahead, WRITE);
}

use super::copy_mr::ProcMem;
use super::handles::HandleAlloc;
use super::mr_view::View;
use super::secret::{self, DrawError};

/// Largest region, bytes (a sanity bound on what one client can make the NIC map).
pub const MAX_MR_SIZE: u64 = 1 << 40;

/// Fibonacci hashing of a u32 key (keys are random already; this only spreads them
/// over the table's control bytes). Cheaper than SipHash on the per-packet path.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A `HashMap` keyed by small integers with [`KeyHasher`].
pub type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// One registered region.
pub struct Region {
    /// Owning client.
    pub client: u32,
    /// Protection domain.
    pub pd: u32,
    /// How the NIC reaches the bytes.
    backing: Backing,
    /// Client virtual address of byte 0.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access rights.
    pub access: Access,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("client", &self.client)
            .field("pd", &self.pd)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

/// How the NIC reaches a region's bytes.
enum Backing {
    /// Mapped: the NIC's mapping of the client's memfd or SysV segment (at least
    /// `base + len` bytes), shared by every region registered as a window onto it, and
    /// the offset of byte 0 of the region in it.
    Map { map: Arc<View>, base: usize },
    /// Copied through the client's `/proc/<pid>/mem` at the client's addresses.
    Copy(ProcMem),
}

impl Region {
    /// The mapping, for a mapped region.
    fn view(&self) -> Option<&View> {
        match &self.backing {
            Backing::Map { map, .. } => Some(map),
            Backing::Copy(_) => None,
        }
    }

    /// Bytes the NIC holds mapped for the region (its length, for a copied one).
    fn map_len(&self) -> u64 {
        self.view().map_or(self.len, |v| v.len() as u64)
    }

    /// The offset of `[va, va + len)` in the region, if it lies inside.
    fn offset(&self, va: u64, len: u64) -> Result<usize, MemError> {
        let off = va.checked_sub(self.iova).ok_or(MemError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfRange)?;
        if end > self.len {
            return Err(MemError::OutOfRange);
        }
        usize::try_from(off).map_err(|_| MemError::OutOfRange)
    }

    /// Pointer to byte `off` of a mapped region (`None`: copied). `off + n <= len` must
    /// hold for any `n` bytes accessed through it (callers got `off` from
    /// [`Region::offset`]).
    fn ptr(&self, off: usize) -> Option<*mut u8> {
        match &self.backing {
            // SAFETY: `off <= self.len` and `base + len <= map.len()`
            // (register_window() checks it), so the result is inside or one past the
            // mapping.
            Backing::Map { map, base } => Some(unsafe { map.as_mut_ptr().add(base + off) }),
            Backing::Copy(_) => None,
        }
    }
}

/// Why registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegError {
    /// Unknown access bits, or remote write/atomic without local write.
    BadAccess(u32),
    /// Length zero-mapping or above [`MAX_MR_SIZE`], or `iova + len` overflows.
    BadRange(String),
    /// Every handle number is taken by a live region.
    NoHandle,
    /// No key could be drawn (the OS generator failed).
    NoKey(DrawError),
}

impl std::fmt::Display for RegError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegError::BadAccess(a) => write!(
                f,
                "access flags {a:#x}: only LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC (0xf) are supported, and REMOTE_WRITE or REMOTE_ATOMIC require LOCAL_WRITE"
            ),
            RegError::BadRange(m) => f.write_str(m),
            RegError::NoHandle => f.write_str("every memory-region handle is in use"),
            RegError::NoKey(e) => write!(f, "cannot draw a key: {e}"),
        }
    }
}

/// Checks access flags as `ibv_reg_mr` does: known bits only, and remote write or
/// remote atomic only together with local write (IBTA 10.6.3.1: a region that a remote
/// peer may write must be writable locally).
pub fn check_access(bits: u32) -> Result<Access, RegError> {
    let a = Access(bits);
    if bits & !(Access::ALL.0 | super::mw::ACCESS_MW_BIND) != 0 {
        return Err(RegError::BadAccess(bits));
    }
    let needs_local = a.contains(Access::REMOTE_WRITE) || a.contains(Access::REMOTE_ATOMIC);
    if needs_local && !a.contains(Access::LOCAL_WRITE) {
        return Err(RegError::BadAccess(bits));
    }
    Ok(a)
}

/// Where a new region's bytes live.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A client memfd, mapped here for `map_len` bytes from its offset 0 (the caller
    /// checked the file is at least that long).
    Memfd(BorrowedFd<'a>, usize),
    /// Pieces of the request's memfd (if sent) and of the client's live regions'
    /// mappings ([`View::assemble`]): MRs on the same pages share them.
    Pieces(Option<BorrowedFd<'a>>, &'a [MrSegment]),
    /// A SysV segment of the client's uid, attached here ([`super::sysv_mr`]); the
    /// window's `offset + len` must lie in it.
    Sysv {
        /// Segment id.
        shmid: i32,
        /// The client's uid (the owner the segment must have).
        uid: u32,
    },
    /// The client's `/proc/<pid>/mem` ([`super::copy_mr`]); the region is addressed
    /// by client address (`offset` must be 0).
    Copy(BorrowedFd<'a>),
}

/// What a registration request names (the control request's kind, with what is not
/// a descriptor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegKind {
    /// `RegMr`: the frame's memfd from offset 0.
    Memfd,
    /// `RegMrWindow`: these pieces.
    Window(Vec<MrSegment>),
    /// `RegMrSysv`: this segment id.
    Sysv(i32),
    /// `RegMrCopy`: the frame's `/proc/<pid>/mem`.
    Copy,
}

impl RegKind {
    /// A registration request as `(pd, len, access, (iova, offset, kind))`; `None` for
    /// any other request.
    #[allow(clippy::type_complexity)]
    pub fn split(req: Request) -> Option<(Handle, u64, u32, (u64, u64, RegKind))> {
        Some(match req {
            Request::RegMr {
                pd,
                len,
                access,
                iova,
            } => (pd, len, access, (iova, 0, RegKind::Memfd)),
            Request::RegMrWindow {
                pd,
                len,
                access,
                iova,
                offset,
                segments,
            } => (pd, len, access, (iova, offset, RegKind::Window(segments))),
            Request::RegMrSysv {
                pd,
                len,
                access,
                iova,
                shmid,
                offset,
            } => (pd, len, access, (iova, offset, RegKind::Sysv(shmid))),
            Request::RegMrCopy {
                pd,
                len,
                access,
                iova,
            } => (pd, len, access, (iova, 0, RegKind::Copy)),
            _ => return None,
        })
    }
}

/// The memory-region table.
pub struct MrTable {
    regions: KeyMap<Region>,
    /// rkey → handle.
    by_rkey: KeyMap<u32>,
    /// lkey → handle.
    by_lkey: KeyMap<u32>,
    handles: HandleAlloc,
    /// The last L_Key [`MrTable::local`] found and its handle: a send's gather looks its
    /// L_Key up once per packet, so the same key comes again and again (issue 12: the
    /// two map look-ups took 1–1.5 % of a 64 KiB sender's samples). It needs no
    /// invalidation: a hit is taken only when the region under the handle still has
    /// that L_Key, and live L_Keys are unique, so it is the region `by_lkey` names.
    last_local: Cell<(u32, u32)>,
    /// The same for the last region R_Key [`MrTable::remote`] found (a WRITE's or
    /// READ's every packet; three map look-ups without it, 1.7 % of a 64 KiB receiver's
    /// samples). A window's R_Key is never a live region's, so a hit is a region's own.
    last_remote: Cell<(u32, u32)>,
    /// Memory windows onto these regions ([`super::mw`]).
    pub windows: super::mw::MwTable,
}

/// What [`MrTable::deregister`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Its protection domain.
    pub pd: u32,
    /// Bytes the NIC had mapped for it.
    pub map_len: u64,
}

impl std::fmt::Debug for MrTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrTable")
            .field("regions", &self.regions.len())
            .finish()
    }
}

impl Default for MrTable {
    fn default() -> Self {
        MrTable::new()
    }
}

impl MrTable {
    /// An empty table.
    pub fn new() -> Self {
        MrTable {
            regions: KeyMap::default(),
            by_rkey: KeyMap::default(),
            by_lkey: KeyMap::default(),
            handles: HandleAlloc::new(),
            last_local: Cell::new((0, 0)),
            last_remote: Cell::new((0, 0)),
            windows: super::mw::MwTable::default(),
        }
    }

    /// A key that no live region uses as L_Key or R_Key and that is not `taken`, fresh
    /// from the OS generator; 0 is avoided so an all-zero WQE never names a region.
    /// Bounded: the tables hold far fewer than 2^32 keys, so a free one comes in a draw
    /// or two.
    fn fresh_key(&self, taken: u32) -> Result<u32, RegError> {
        secret::draw_where(u32::MAX, |k| {
            k != 0
                && k != taken
                && !self.by_rkey.contains_key(&k)
                && !self.by_lkey.contains_key(&k)
                && !self.windows.uses_index_of(k)
        })
        .map_err(RegError::NoKey)
    }

    /// Registers `len` bytes of the file `fd` (already checked to be at least
    /// `map_len >= len` bytes and sealed) as addressed from `iova`. Returns
    /// `(handle, lkey, rkey)`.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &mut self,
        client: u32,
        pd: u32,
        fd: BorrowedFd<'_>,
        map_len: usize,
        len: u64,
        access: u32,
        iova: u64,
    ) -> Result<(u32, u32, u32), RegError> {
        self.register_window(client, pd, Source::Memfd(fd, map_len), 0, len, access, iova)
    }

    /// Registers bytes `[offset, offset + len)` of `source`'s mapping as addressed from
    /// `iova`. The region's bounds are exactly these bytes: the rest of the mapping
    /// (neighbours on the same pages) is outside every access check.
    #[allow(clippy::too_many_arguments)]
    pub fn register_window(
        &mut self,
        client: u32,
        pd: u32,
        source: Source<'_>,
        offset: u64,
        len: u64,
        access: u32,
        iova: u64,
    ) -> Result<(u32, u32, u32), RegError> {
        let access = check_access(access)?;
        // A copied region maps nothing, so its length bounds nothing but its keys'
        // reach (an implicit on-demand region spans the whole address space).
        if len > MAX_MR_SIZE && !matches!(source, Source::Copy(_)) {
            return Err(RegError::BadRange(format!(
                "region length {len} exceeds the largest region ({MAX_MR_SIZE} bytes)"
            )));
        }
        if iova.checked_add(len).is_none() {
            return Err(RegError::BadRange(format!(
                "iova {iova:#x} + length {len} overflows 64 bits"
            )));
        }
        let lkey = self.fresh_key(0)?;
        let rkey = self.fresh_key(lkey)?;
        let map = match source {
            Source::Memfd(fd, m) => verbs_api::os::map_peer_shm(fd, m)
                .map(View::from_mmap)
                .map_err(|e| RegError::BadRange(format!("cannot map the region's memfd: {e}")))?,
            Source::Pieces(fd, segments) => {
                View::assemble(fd, segments, |h| self.get(client, h).and_then(Region::view))?
            }
            Source::Sysv { shmid, uid } => {
                let need = offset.checked_add(len).ok_or_else(|| {
                    RegError::BadRange(format!("offset {offset} + length {len} overflows"))
                })?;
                super::sysv_mr::attach(shmid, uid, need)?
            }
            Source::Copy(fd) => {
                if offset != 0 {
                    return Err(RegError::BadRange(
                        "a copied region is addressed from its iova (offset 0)".into(),
                    ));
                }
                let mem = ProcMem::new(fd)?;
                return self.insert(
                    client,
                    pd,
                    Backing::Copy(mem),
                    (iova, len, access, lkey, rkey),
                );
            }
        };
        let base = usize::try_from(offset).ok();
        match (base, offset.checked_add(len)) {
            (Some(_), Some(end)) if end <= map.len() as u64 => {}
            _ => {
                return Err(RegError::BadRange(format!(
                    "mapping of {} bytes is shorter than the region ({len} bytes at \
                     offset {offset})",
                    map.len()
                )))
            }
        }
        let base = base.unwrap_or(0);
        let backing = Backing::Map {
            map: Arc::new(map),
            base,
        };
        self.insert(client, pd, backing, (iova, len, access, lkey, rkey))
    }

    /// Enters a region whose bytes `backing` reaches: `(iova, len, access, lkey,
    /// rkey)`, checked by the caller.
    fn insert(
        &mut self,
        client: u32,
        pd: u32,
        backing: Backing,
        (iova, len, access, lkey, rkey): (u64, u64, Access, u32, u32),
    ) -> Result<(u32, u32, u32), RegError> {
        let regions = &self.regions;
        let handle = self
            .handles
            .alloc(|h| regions.contains_key(&h))
            .ok_or(RegError::NoHandle)?;
        self.by_lkey.insert(lkey, handle);
        self.by_rkey.insert(rkey, handle);
        self.regions.insert(
            handle,
            Region {
                client,
                pd,
                backing,
                iova,
                len,
                access,
                lkey,
                rkey,
            },
        );
        Ok((handle, lkey, rkey))
    }

    /// The region `handle` if `client` owns it.
    pub fn get(&self, client: u32, handle: u32) -> Option<&Region> {
        self.regions.get(&handle).filter(|r| r.client == client)
    }

    /// `ibv_rereg_mr` of `handle`, if `client` owns it: a new PD and/or new access
    /// rights over the same mapping under the same keys. Re-registration is a
    /// deregistration and a registration (`ibv_rereg_mr(3)`), so the windows bound to
    /// the region are unbound. Returns the region's PD before.
    pub fn rereg(
        &mut self,
        client: u32,
        handle: u32,
        pd: Option<u32>,
        access: Option<Access>,
    ) -> Option<u32> {
        let r = self
            .regions
            .get_mut(&handle)
            .filter(|r| r.client == client)?;
        let old = r.pd;
        r.pd = pd.unwrap_or(old);
        if let Some(a) = access {
            r.access = a;
        }
        self.windows.unbind_region(handle);
        Some(old)
    }

    /// Deregisters (and unmaps) `handle` if `client` owns it.
    pub fn deregister(&mut self, client: u32, handle: u32) -> Option<Removed> {
        self.get(client, handle)?;
        let r = self.regions.remove(&handle)?;
        self.windows.unbind_region(handle);
        self.by_lkey.remove(&r.lkey);
        self.by_rkey.remove(&r.rkey);
        Some(Removed {
            pd: r.pd,
            map_len: r.map_len(),
        })
    }

    /// Every live L_Key and R_Key of a region.
    pub fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_rkey.keys().chain(self.by_lkey.keys()).copied()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The region whose key (`key_of`: its L_Key or R_Key) is `key`: through `memo`
    /// when it names that region (see `last_local`), else through `map`, remembered.
    fn find(
        &self,
        map: &KeyMap<u32>,
        memo: &Cell<(u32, u32)>,
        key: u32,
        key_of: fn(&Region) -> u32,
    ) -> Option<&Region> {
        let (k, h) = memo.get();
        if k == key {
            if let Some(r) = self.regions.get(&h).filter(|r| key_of(r) == key) {
                return Some(r);
            }
        }
        let h = *map.get(&key)?;
        memo.set((key, h));
        self.regions.get(&h)
    }

    /// `r`, if it exists and belongs to `pd` (a key of another PD is no key).
    fn of_pd(r: Option<&Region>, pd: u32) -> Result<&Region, MemError> {
        r.filter(|r| r.pd == pd).ok_or(MemError::InvalidKey)
    }

    fn local(&self, pd: u32, lkey: u32) -> Result<&Region, MemError> {
        Self::of_pd(
            self.find(&self.by_lkey, &self.last_local, lkey, |r| r.lkey),
            pd,
        )
    }

    /// The region an R_Key reaches for `access` to `[va, va + len)`: a region's own
    /// R_Key, or a memory window's ([`super::mw::MwTable::check`] checks the window's
    /// range and rights; the window's bind checked the region's).
    fn remote(
        &self,
        by: Accessor,
        rkey: u32,
        (va, len): (u64, u64),
        access: Access,
    ) -> Result<&Region, MemError> {
        let Some(r) = self.find(&self.by_rkey, &self.last_remote, rkey, |r| r.rkey) else {
            let h = self.windows.check(by, rkey, va, len, access)?;
            return self.regions.get(&h).ok_or(MemError::InvalidKey);
        };
        let r = Self::of_pd(Some(r), by.pd)?;
        if !r.access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        Ok(r)
    }

    /// Copies `[va, va + dst.len())` of `r` into `dst`; with `crc`, continues that CRC
    /// over the bytes copied and returns it (else returns 0).
    fn copy_out(r: &Region, va: u64, dst: &mut [u8], crc: Option<u32>) -> Result<u32, MemError> {
        let off = r.offset(va, dst.len() as u64)?;
        if dst.is_empty() {
            return Ok(crc.unwrap_or(0));
        }
        if let Backing::Copy(m) = &r.backing {
            m.read(va, dst)?;
            return Ok(crc.map_or(0, |c| softnic_transport::crc::update(c, dst)));
        }
        let p = r.ptr(off).ok_or(MemError::AccessDenied)?;
        let Some(crc) = crc else {
            // SAFETY: [off, off + dst.len()) lies inside the mapping (Region::offset),
            // and `dst` is the NIC's own buffer, which cannot overlap a shared mapping.
            // No reference to the shared bytes is formed (see the module docs).
            unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
            return Ok(0);
        };
        // SAFETY: as above, and `copy_update_raw` takes the source as a raw pointer,
        // reads each byte once and hashes what it read (no `&[u8]` over the mapping):
        // the CRC is that of the bytes written to `dst`, which are the bytes sent, even
        // if the client writes the region meanwhile (a mix of old and new, as a DMA).
        let crc = unsafe { copy_update_raw(crc, p, dst) };
        fetch_ahead::<false>(r, off, dst.len(), p);
        Ok(crc)
    }

    /// Copies `src` to `[va, va + src.len())` of `r`; with `crc`, continues that CRC
    /// over `src` in the same pass and returns it (else returns 0).
    fn copy_in(r: &Region, va: u64, src: &[u8], crc: Option<u32>) -> Result<u32, MemError> {
        let off = r.offset(va, src.len() as u64)?;
        if src.is_empty() {
            return Ok(crc.unwrap_or(0));
        }
        if let Backing::Copy(m) = &r.backing {
            m.write(va, src)?;
            return Ok(crc.map_or(0, |c| softnic_transport::crc::update(c, src)));
        }
        let p = r.ptr(off).ok_or(MemError::AccessDenied)?;
        let Some(crc) = crc else {
            // SAFETY: as in copy_out, with the direction reversed.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
            return Ok(0);
        };
        // SAFETY: as in copy_out, with the direction reversed: `copy_update_to_raw`
        // writes the mapping through the raw pointer only and hashes `src`, the NIC's
        // own buffer (the receiver's single pass, `qp::placement`).
        let crc = unsafe { copy_update_to_raw(crc, src, p) };
        fetch_ahead::<true>(r, off, src.len(), p);
        Ok(crc)
    }

    fn write_local_with(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        src: &[u8],
        crc: Option<u32>,
    ) -> Result<u32, MemError> {
        let r = self.local(pd, lkey)?;
        if !r.access.contains(Access::LOCAL_WRITE) {
            return Err(MemError::AccessDenied);
        }
        Self::copy_in(r, va, src, crc)
    }

    fn write_remote_with(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
        crc: Option<u32>,
    ) -> Result<u32, MemError> {
        let r = self.remote(by, rkey, (va, src.len() as u64), Access::REMOTE_WRITE)?;
        Self::copy_in(r, va, src, crc)
    }
}

impl Memory for MrTable {
    fn read_local(&self, pd: u32, lkey: u32, va: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let r = self.local(pd, lkey)?;
        Self::copy_out(r, va, dst, None).map(drop)
    }

    fn read_local_crc(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let r = self.local(pd, lkey)?;
        Self::copy_out(r, va, dst, Some(crc))
    }

    fn write_local(&mut self, pd: u32, lkey: u32, va: u64, src: &[u8]) -> Result<(), MemError> {
        self.write_local_with(pd, lkey, va, src, None).map(drop)
    }

    fn write_local_crc(
        &mut self,
        pd: u32,
        lkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.write_local_with(pd, lkey, va, src, Some(crc))
    }

    fn check_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        let r = self.remote(by, rkey, (va, len), access)?;
        r.offset(va, len).map(|_| ())
    }

    fn read_remote(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        let r = self.remote(by, rkey, (va, dst.len() as u64), Access::REMOTE_READ)?;
        Self::copy_out(r, va, dst, None).map(drop)
    }

    fn read_remote_crc(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        let r = self.remote(by, rkey, (va, dst.len() as u64), Access::REMOTE_READ)?;
        Self::copy_out(r, va, dst, Some(crc))
    }

    fn write_remote(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        self.write_remote_with(by, rkey, va, src, None).map(drop)
    }

    fn write_remote_crc(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        src: &[u8],
        crc: u32,
    ) -> Result<u32, MemError> {
        self.write_remote_with(by, rkey, va, src, Some(crc))
    }

    fn invalidate(&mut self, by: Accessor, rkey: u32) -> Result<(), MemError> {
        self.windows
            .invalidate(None, by, rkey)
            .map_err(|_| MemError::InvalidKey)
    }

    fn atomic(&mut self, by: Accessor, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        let a = self.atomic_word(by, rkey, va, Access::REMOTE_ATOMIC)?;
        Ok(match op {
            AtomicOp::FetchAdd { add } => a.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => {
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }

    fn atomic_write(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), MemError> {
        // A release store: the bytes become visible whole, after every earlier write
        // this NIC made (IBTA A19: an ATOMIC WRITE is placed after prior requests).
        let a = self.atomic_word(by, rkey, va, Access::REMOTE_WRITE)?;
        a.store(u64::from_ne_bytes(value), Ordering::Release);
        Ok(())
    }
}

impl MrTable {
    /// The 8-byte word at `va` of region `rkey`, checked for `access` by `by`, in the
    /// mapping shared with the client: the target of an atomic (REMOTE_ATOMIC) or of
    /// an ATOMIC WRITE (REMOTE_WRITE). `Misaligned` unless 8-byte aligned both as an
    /// iova and in the mapping (an iova that is not page-aligned can disagree: the
    /// CPU's atomic would not be atomic); `AccessDenied` for a copy-backed region,
    /// where a copy through the mem file is neither atomic against the client's CPU
    /// nor one store.
    fn atomic_word(
        &mut self,
        by: Accessor,
        rkey: u32,
        va: u64,
        access: Access,
    ) -> Result<&AtomicU64, MemError> {
        let r = self.remote(by, rkey, (va, 8), access)?;
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let off = r.offset(va, 8)?;
        let p = r.ptr(off).ok_or(MemError::AccessDenied)?;
        if !(p as usize).is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        // SAFETY: `p` is 8-byte aligned and the 8 bytes lie inside the region's live
        // mapping, which stays mapped while `self` is borrowed (regions are unmapped
        // only through `&mut self`). The memory is shared with the client process,
        // which may access it with its own atomics; every access this process makes to
        // these bytes goes through this AtomicU64, and no non-atomic Rust reference to
        // them exists in this process.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QP of PD 10, through which the remote accesses below are made.
    const QP10: Accessor = Accessor { pd: 10, qpn: 0x51 };
    use memmap2::MmapRaw;
    use std::os::fd::AsFd;

    fn table_with(access: u32, len: u64) -> (MrTable, u32, u32, u32, MmapRaw) {
        let fd = verbs_api::os::memfd("mr", 8192).unwrap();
        let client_view = verbs_api::os::map_shared(fd.as_fd(), 8192).unwrap();
        let mut t = MrTable::new();
        let iova = 0x7000_0000_0000;
        let (h, lkey, rkey) = t
            .register(1, 10, fd.as_fd(), 8192, len, access, iova)
            .unwrap();
        (t, h, lkey, rkey, client_view)
    }

    const IOVA: u64 = 0x7000_0000_0000;

    #[test]
    fn local_and_remote_accesses_reach_the_clients_bytes() {
        let (mut t, _, lkey, rkey, view) = table_with(0xF, 4096);
        t.write_remote(QP10, rkey, IOVA + 100, b"hello").unwrap();
        // The client's own mapping sees the write.
        let mut got = [0u8; 5];
        // SAFETY: test reads 5 bytes inside its own 8192-byte mapping.
        unsafe { std::ptr::copy_nonoverlapping(view.as_ptr().add(100), got.as_mut_ptr(), 5) };
        assert_eq!(&got, b"hello");
        let mut back = [0u8; 5];
        t.read_local(10, lkey, IOVA + 100, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        t.read_remote(QP10, rkey, IOVA + 100, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        // The gather's digest: the same copy, and the CRC chained over it.
        let c = softnic_transport::crc::update(0, b"he");
        assert_eq!(
            t.read_local_crc(10, lkey, IOVA + 102, &mut back[..3], c),
            Ok(softnic_transport::crc::update(0, b"hello"))
        );
        assert_eq!(&back[..3], b"llo");
        back.fill(0);
        let want = softnic_transport::crc::update(0, b"hello");
        assert_eq!(
            t.read_remote_crc(QP10, rkey, IOVA + 100, &mut back, 0),
            Ok(want)
        );
        assert_eq!(&back, b"hello");
        assert_eq!(
            t.read_local_crc(11, lkey, IOVA, &mut back, 0),
            Err(MemError::InvalidKey)
        );
    }

    /// The sending NIC's fused gather (`read_local_crc` / `read_remote_crc`, i.e.
    /// `softnic_crc::copy_update_raw` on a mapped region) at lengths that reach the
    /// SIMD kernel (≥ 256 bytes) and its tails, at odd offsets: the copy is the
    /// client's bytes, and the CRC is crc32fast's over exactly those bytes, chained
    /// across two calls (local then remote, and the other way round), as a payload
    /// gathered from two SGEs or two packets is.
    /// The look-ahead after a copy stays inside the region and skips small copies.
    #[test]
    fn fetch_ahead_never_asks_past_the_region() {
        // A 4 KiB packet in the middle of a 1 MiB region: the whole cap.
        assert_eq!(ahead_len(1 << 20, 8192, 4096, AHEAD_WRITE), AHEAD_WRITE);
        assert_eq!(ahead_len(1 << 20, 8192, 4096, AHEAD_READ), AHEAD_READ);
        // Near the end: only what is left; at the end: nothing.
        assert_eq!(ahead_len(65_536, 65_536 - 4096 - 100, 4096, 2048), 100);
        assert_eq!(ahead_len(65_536, 65_536 - 4096, 4096, 2048), 0);
        // Small copies (8 B messages, headers) ask for nothing.
        assert_eq!(ahead_len(1 << 20, 0, AHEAD_MIN_LEN - 1, 2048), 0);
        assert_eq!(ahead_len(1 << 20, 0, AHEAD_MIN_LEN, 2048), 2048);
    }

    #[test]
    fn fused_gather_hashes_exactly_the_bytes_it_copied_at_kernel_lengths() {
        const MAP: usize = 3 * 65536;
        let fd = verbs_api::os::memfd("mr", MAP).unwrap();
        let view = verbs_api::os::map_shared(fd.as_fd(), MAP).unwrap();
        let bytes: Vec<u8> = (0..MAP as u32)
            .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[2])
            .collect();
        // SAFETY: the test fills its own MAP-byte mapping; nothing else maps the memfd.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), view.as_mut_ptr(), MAP) };
        let mut t = MrTable::new();
        let (_, lkey, rkey) = t
            .register(1, 10, fd.as_fd(), MAP, MAP as u64, 0xF, IOVA)
            .unwrap();
        for len in [256, 257, 300, 4096, 4112, 4099, 65536] {
            for off in [0, 1, 7, 64, 4093] {
                let want = &bytes[off..off + 2 * len];
                let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                let va = IOVA + off as u64;
                let c = t.read_local_crc(10, lkey, va, &mut a, 0).unwrap();
                assert_eq!(c, crc32fast::hash(&want[..len]), "local {len} at +{off}");
                let c = t.read_remote_crc(QP10, rkey, va + len as u64, &mut b, c);
                assert_eq!(c, Ok(crc32fast::hash(want)), "chained {len} at +{off}");
                assert!(a == want[..len] && b == want[len..], "copy {len} at +{off}");
                let c = t.read_remote_crc(QP10, rkey, va, &mut a, 0).unwrap();
                let c = t.read_local_crc(10, lkey, va + len as u64, &mut b, c);
                assert_eq!(c, Ok(crc32fast::hash(want)), "remote first {len} +{off}");
                assert!(a == want[..len] && b == want[len..], "copy {len} at +{off}");
            }
        }
    }

    /// The receiver's single pass (`write_local_crc`, `write_remote_crc`: a payload
    /// written into a mapped region as it is hashed) at kernel lengths and odd offsets:
    /// the client sees exactly the payload, the CRC is crc32fast's over it, chained
    /// across two calls; and the access rules are those of the plain writes.
    #[test]
    fn fused_writes_place_and_hash_exactly_the_payload() {
        const MAP: usize = 3 * 65536;
        let fd = verbs_api::os::memfd("mr", MAP).unwrap();
        let view = verbs_api::os::map_shared(fd.as_fd(), MAP).unwrap();
        let mut t = MrTable::new();
        let (_, lkey, rkey) = t
            .register(1, 10, fd.as_fd(), MAP, MAP as u64, 0xF, IOVA)
            .unwrap();
        let payload: Vec<u8> = (0..2 * 65536u32).map(|i| (i * 13 + 5) as u8).collect();
        for len in [256, 257, 300, 4096, 4112, 4099, 65536] {
            for off in [0, 1, 7, 64, 4093] {
                let want = &payload[..2 * len];
                let va = IOVA + off as u64;
                let c = t.write_local_crc(10, lkey, va, &want[..len], 0).unwrap();
                assert_eq!(c, crc32fast::hash(&want[..len]), "local {len} at +{off}");
                let c = t.write_remote_crc(QP10, rkey, va + len as u64, &want[len..], c);
                assert_eq!(c, Ok(crc32fast::hash(want)), "chained {len} at +{off}");
                let mut got = vec![0u8; 2 * len];
                // SAFETY: reads the test's own mapping, inside its MAP bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(view.as_ptr().add(off), got.as_mut_ptr(), 2 * len)
                };
                assert!(got == want, "placed {len} at +{off}");
            }
        }
        let (mut t, _, lkey, rkey, _view) = table_with(0, 4096);
        let p = [1u8; 300];
        assert_eq!(
            t.write_local_crc(10, lkey, IOVA, &p, 0),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.write_remote_crc(QP10, rkey, IOVA, &p, 0),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.write_remote_crc(Accessor { pd: 11, ..QP10 }, rkey, IOVA, &p, 0),
            Err(MemError::InvalidKey)
        );
    }

    /// The single pass through a memory window (a WRITE whose RETH named a type 2
    /// window's R_Key): the fused write reaches only the window's range, and once the
    /// window is invalidated between two packets (a SEND with Invalidate on another
    /// QP), or its region deregistered, it is refused and writes nothing — the same
    /// checks as `write_remote`, on every packet.
    #[test]
    fn fused_writes_through_a_window_stop_at_its_range_and_its_invalidation() {
        let fd = verbs_api::os::memfd("mr", 8192).unwrap();
        let view = verbs_api::os::map_shared(fd.as_fd(), 8192).unwrap();
        let mut t = MrTable::new();
        let access = 0xF | super::super::mw::ACCESS_MW_BIND;
        let (h, _, rkey) = t
            .register(1, 10, fd.as_fd(), 8192, 4096, access, IOVA)
            .unwrap();
        let r = t.get(1, h).unwrap();
        let under = super::super::mw::Under {
            handle: h,
            pd: r.pd,
            iova: r.iova,
            len: r.len,
            access: r.access,
        };
        let (mw, wkey) = t.windows.alloc(1, 10, 2, |i| i != rkey >> 8).unwrap();
        let bind = super::super::mw::Bind {
            mw,
            rkey: wkey,
            addr: IOVA + 1024,
            len: 1024,
            access: Access::REMOTE_WRITE.0,
        };
        t.windows.bind(1, QP10, &bind, Some(under)).unwrap();
        let p = [7u8; 300];
        let at = IOVA + 1024 + 700;
        assert_eq!(
            t.write_remote_crc(QP10, wkey, at, &p, 0),
            Ok(crc32fast::hash(&p))
        );
        // Past the window's end (inside the region): refused.
        assert!(t.write_remote_crc(QP10, wkey, at + 100, &p, 0).is_err());
        t.invalidate(QP10, wkey).unwrap();
        assert!(t.write_remote_crc(QP10, wkey, at, &[9u8; 300], 0).is_err());
        let mut got = vec![0u8; 4096];
        // SAFETY: reads the test's own mapping, inside its 8192 bytes.
        unsafe { std::ptr::copy_nonoverlapping(view.as_ptr(), got.as_mut_ptr(), 4096) };
        let mut want = vec![0u8; 4096];
        want[1724..2024].fill(7);
        assert!(got == want, "only the write inside the live window landed");
        // The region itself deregistered: its own R_Key reaches nothing either.
        t.deregister(1, h).unwrap();
        assert!(t.write_remote_crc(QP10, rkey, IOVA, &p, 0).is_err());
    }

    #[test]
    fn keys_pd_range_and_access_are_checked() {
        let (mut t, _, lkey, rkey, _v) = table_with(1 | 4, 4096);
        let mut b = [0u8; 8];
        assert_eq!(
            t.read_local(10, rkey ^ lkey ^ 1, IOVA, &mut b),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            t.read_local(11, lkey, IOVA, &mut b),
            Err(MemError::InvalidKey),
            "other PD"
        );
        assert_eq!(
            t.read_remote(QP10, lkey, IOVA, &mut b),
            Err(MemError::InvalidKey),
            "lkey is not an rkey"
        );
        assert_eq!(
            t.read_local(10, lkey, IOVA - 1, &mut b),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.read_local(10, lkey, IOVA + 4089, &mut b),
            Err(MemError::OutOfRange)
        );
        assert!(t.read_local(10, lkey, IOVA + 4088, &mut b).is_ok());
        assert_eq!(
            t.read_local(10, lkey, u64::MAX - 2, &mut b),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.write_remote(QP10, rkey, IOVA, &b),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.atomic(QP10, rkey, IOVA, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.check_remote(QP10, rkey, IOVA, 4096, Access::REMOTE_READ),
            Ok(())
        );
        assert_eq!(
            t.check_remote(QP10, rkey, IOVA, 4097, Access::REMOTE_READ),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(QP10, rkey, IOVA + 1, u64::MAX, Access::REMOTE_READ),
            Err(MemError::OutOfRange)
        );
    }

    /// Windows (`ibv_reg_mr` of unaligned buffers sharing pages): each is bounded to
    /// exactly its bytes at its offset in its assembled mapping, shares pages with
    /// the regions it names, and outlives them.
    #[test]
    fn windows_share_pages_with_exact_bounds() {
        let seg = |share, offset, len| MrSegment { share, offset, len };
        let fd = verbs_api::os::memfd("mr", 8192).unwrap();
        let view = verbs_api::os::map_shared(fd.as_fd(), 8192).unwrap();
        let mut t = MrTable::new();
        let s1 = [seg(None, 0, 8192)];
        let (h1, _, r1) = t
            .register_window(
                1,
                10,
                Source::Pieces(Some(fd.as_fd()), &s1),
                100,
                64,
                0xF,
                IOVA + 100,
            )
            .unwrap();
        // The same memfd cannot be mapped again (sealed); a window shares the pages.
        assert!(t
            .register_window(
                1,
                10,
                Source::Pieces(Some(fd.as_fd()), &s1),
                0,
                64,
                0xF,
                IOVA
            )
            .is_err());
        // Pages 1 of the first region, then a new memfd's page: one contiguous region.
        let fd2 = verbs_api::os::memfd("mr2", 4096).unwrap();
        let view2 = verbs_api::os::map_shared(fd2.as_fd(), 4096).unwrap();
        let s2 = [seg(Some(h1), 4096, 4096), seg(None, 0, 4096)];
        let (_, _, r2) = t
            .register_window(
                1,
                10,
                Source::Pieces(Some(fd2.as_fd()), &s2),
                4,
                4096,
                0xF,
                IOVA + 4100,
            )
            .unwrap();
        for bad in [
            [seg(Some(h1), 0, 12288)],
            [seg(Some(h1), 100, 4096)],
            [seg(Some(99), 0, 4096)],
        ] {
            assert!(t
                .register_window(1, 10, Source::Pieces(None, &bad), 0, 8, 0xF, IOVA)
                .is_err());
        }
        assert!(
            t.register_window(
                2,
                10,
                Source::Pieces(None, &[seg(Some(h1), 0, 4096)]),
                0,
                8,
                0xF,
                IOVA
            )
            .is_err(),
            "another client's region"
        );
        assert_eq!(
            t.write_remote(QP10, r1, IOVA + 99, b"x"),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.write_remote(QP10, r1, IOVA + 101, &[0u8; 64]),
            Err(MemError::OutOfRange)
        );
        t.write_remote(QP10, r1, IOVA + 100, b"first").unwrap();
        t.deregister(1, h1).unwrap();
        assert_eq!(
            t.write_remote(QP10, r2, IOVA + 4100, &[0u8; 4097]),
            Err(MemError::OutOfRange)
        );
        // Across the boundary of the two memfds: 4092 bytes into the first's page 1,
        // 4 into the second memfd.
        t.write_remote(QP10, r2, IOVA + 8188, b"12345678").unwrap();
        let read = |v: &MmapRaw, at: usize, n: usize| {
            let mut got = vec![0u8; n];
            // SAFETY: reads inside the test's own mappings.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().add(at), got.as_mut_ptr(), n) };
            got
        };
        assert_eq!(read(&view, 8188, 4), b"1234");
        assert_eq!(read(&view2, 0, 4), b"5678");
        assert_eq!(read(&view, 100, 5), b"first");
    }

    /// A copy-backed region (the client's `/proc/self/mem`; here the test's own):
    /// the same key, bounds and access checks, bytes copied at the client's
    /// addresses, atomics and ATOMIC WRITEs refused.
    #[test]
    fn copied_regions_reach_unmapped_kinds_of_memory_with_the_same_checks() {
        let mem: std::os::fd::OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap()
            .into();
        let buf = vec![0u8; 256];
        let iova = buf.as_ptr() as u64 + 64;
        let mut t = MrTable::new();
        let (h, lkey, rkey) = t
            .register_window(1, 10, Source::Copy(mem.as_fd()), 0, 128, 0xF, iova)
            .unwrap();
        t.write_remote(QP10, rkey, iova + 120, b"8 bytes!").unwrap();
        assert_eq!(
            t.write_remote(QP10, rkey, iova + 121, b"8 bytes!"),
            Err(MemError::OutOfRange)
        );
        // SAFETY: the kernel wrote these bytes of the test's own buffer; read them
        // volatilely.
        let seen: Vec<u8> = (0..8)
            .map(|i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(184 + i)) })
            .collect();
        assert_eq!(&seen, b"8 bytes!");
        let mut back = [0u8; 8];
        t.read_local(10, lkey, iova + 120, &mut back).unwrap();
        assert_eq!(&back, b"8 bytes!");
        back.fill(0);
        let crc = t.read_remote_crc(QP10, rkey, iova + 120, &mut back, 0);
        assert_eq!(crc, Ok(softnic_transport::crc::update(0, b"8 bytes!")));
        assert_eq!(&back, b"8 bytes!");
        assert_eq!(
            t.read_local(11, lkey, iova, &mut back),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            t.atomic(QP10, rkey, iova + 8, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.atomic_write(QP10, rkey, iova + 8, [7; 8]),
            Err(MemError::AccessDenied)
        );
        assert!(
            t.register_window(1, 10, Source::Copy(mem.as_fd()), 8, 8, 0xF, iova)
                .is_err(),
            "a copied region has no offset"
        );
        let fd = verbs_api::os::memfd("not-proc", 4096).unwrap();
        assert!(t
            .register_window(1, 10, Source::Copy(fd.as_fd()), 0, 8, 0xF, iova)
            .is_err());
        assert_eq!(
            t.deregister(1, h),
            Some(Removed {
                pd: 10,
                map_len: 128
            })
        );
        drop(buf);
    }

    #[test]
    fn atomics_are_aligned_and_return_the_original_value() {
        let (mut t, _, _, rkey, _v) = table_with(0xF, 4096);
        assert_eq!(
            t.atomic(QP10, rkey, IOVA + 8, AtomicOp::FetchAdd { add: 5 }),
            Ok(0)
        );
        assert_eq!(
            t.atomic(QP10, rkey, IOVA + 8, AtomicOp::FetchAdd { add: 5 }),
            Ok(5)
        );
        assert_eq!(
            t.atomic(
                QP10,
                rkey,
                IOVA + 8,
                AtomicOp::CompareSwap {
                    compare: 10,
                    swap: 99
                }
            ),
            Ok(10)
        );
        assert_eq!(
            t.atomic(
                QP10,
                rkey,
                IOVA + 8,
                AtomicOp::CompareSwap {
                    compare: 10,
                    swap: 1
                }
            ),
            Ok(99),
            "failed compare leaves the value"
        );
        assert_eq!(
            t.atomic(QP10, rkey, IOVA + 4, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            t.atomic(QP10, rkey, IOVA + 4096, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::OutOfRange)
        );
    }

    /// An ATOMIC WRITE stores 8 aligned bytes the client's mapping sees whole, under
    /// REMOTE_WRITE: a region open to atomics only refuses it.
    #[test]
    fn atomic_writes_are_aligned_stores_under_remote_write() {
        let (mut t, _, _, rkey, view) = table_with(0xF, 4096);
        t.atomic_write(QP10, rkey, IOVA + 16, *b"ATOMICWR").unwrap();
        let mut got = [0u8; 8];
        // SAFETY: test reads 8 bytes inside its own 8192-byte mapping.
        unsafe { std::ptr::copy_nonoverlapping(view.as_ptr().add(16), got.as_mut_ptr(), 8) };
        assert_eq!(&got, b"ATOMICWR");
        assert_eq!(
            t.atomic_write(QP10, rkey, IOVA + 12, [0; 8]),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            t.atomic_write(QP10, rkey, IOVA + 4096, [0; 8]),
            Err(MemError::OutOfRange)
        );
        // LOCAL_WRITE | REMOTE_ATOMIC, no REMOTE_WRITE.
        let (mut t, _, _, rkey, _v) = table_with(0x1 | 0x8, 4096);
        assert_eq!(
            t.atomic_write(QP10, rkey, IOVA + 16, [1; 8]),
            Err(MemError::AccessDenied)
        );
    }

    /// The key memos (`last_local`, `last_remote`) answer only for a live region with
    /// that key, in the accessing PD, with the rights asked: after a hit, another PD
    /// (and, for the R_Key, a right the region lacks) is refused; after deregistration
    /// (and a new region on the freed handle) the old keys are no keys.
    #[test]
    fn the_remembered_keys_are_checked_like_any_other() {
        // Local read and remote read only (no remote write).
        let (mut t, h, lkey, rkey, _v) = table_with(1 | 4, 4096);
        // One handle only: the next region takes the freed one.
        t.handles = HandleAlloc::with_max(1);
        let mut b = [0u8; 8];
        for _ in 0..2 {
            assert!(t.read_local(10, lkey, IOVA, &mut b).is_ok());
            assert!(t.read_remote(QP10, rkey, IOVA, &mut b).is_ok());
            assert_eq!(
                t.read_local(11, lkey, IOVA, &mut b),
                Err(MemError::InvalidKey)
            );
            assert_eq!(
                t.read_remote(Accessor { pd: 11, ..QP10 }, rkey, IOVA, &mut b),
                Err(MemError::InvalidKey)
            );
            assert_eq!(
                t.write_remote(QP10, rkey, IOVA, &b),
                Err(MemError::AccessDenied)
            );
        }
        assert!(t.deregister(1, h).is_some());
        assert_eq!(
            t.read_local(10, lkey, IOVA, &mut b),
            Err(MemError::InvalidKey)
        );
        let fd = verbs_api::os::memfd("mr", 8192).unwrap();
        let (h2, lkey2, rkey2) = t
            .register(1, 10, fd.as_fd(), 8192, 4096, 0xF, IOVA)
            .unwrap();
        assert_eq!(h2, h, "the freed handle is reused");
        assert_eq!(
            t.read_local(10, lkey, IOVA, &mut b),
            Err(MemError::InvalidKey),
            "the old L_Key on the reused handle"
        );
        assert_eq!(
            t.write_remote(QP10, rkey, IOVA, &b),
            Err(MemError::InvalidKey),
            "the old R_Key on the reused handle"
        );
        assert!(t.read_local(10, lkey2, IOVA, &mut b).is_ok());
        assert!(t.read_local(10, lkey2, IOVA + 4089, &mut b).is_err());
        assert!(t.write_remote(QP10, rkey2, IOVA, &b).is_ok());
    }

    #[test]
    fn registration_rules_and_deregistration() {
        assert!(check_access(2).is_err(), "remote write without local write");
        assert!(
            check_access(8).is_err(),
            "remote atomic without local write"
        );
        assert!(check_access(0x20).is_err(), "unknown bit");
        assert!(check_access(0x11).is_ok(), "MW_BIND");
        assert!(check_access(4).is_ok());
        let (mut t, h, lkey, rkey, _v) = table_with(0xF, 4096);
        assert_ne!(lkey, rkey);
        assert!(t.deregister(2, h).is_none(), "another client's region");
        assert_eq!(
            t.deregister(1, h),
            Some(Removed {
                pd: 10,
                map_len: 8192
            })
        );
        let mut b = [0u8; 1];
        assert_eq!(
            t.read_local(10, lkey, IOVA, &mut b),
            Err(MemError::InvalidKey)
        );
        assert!(t.is_empty());
        let fd = verbs_api::os::memfd("mr", 4096).unwrap();
        assert!(t.register(1, 10, fd.as_fd(), 4096, 4097, 0, 0).is_err());
        assert!(t
            .register(1, 10, fd.as_fd(), 4096, 16, 0, u64::MAX - 8)
            .is_err());
    }
}
