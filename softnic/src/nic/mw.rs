//! Memory windows (IBTA 10.6.7): R_Keys that give remote access to part of a region.
//!
//! A window is allocated in a protection domain unbound (`ibv_alloc_mw`), then bound to
//! `[addr, addr + len)` of a region of the same PD with some remote rights, under an
//! R_Key whose bits 8..32 are the window's index and bits 0..8 a key byte that every
//! bind changes (`ibv_inc_rkey`), so the R_Key of an earlier bind stops working.
//! Type 1 windows are bound with `ibv_bind_mw` (a length 0 unbinds them); type 2 with an
//! `IBV_WR_BIND_MW` work request, and only when free: an `IBV_WR_LOCAL_INV` or a SEND
//! with Invalidate from the peer (IBTA 9.4.1.1, 10.6.7.2.4) frees them again.
//! `ibv_dealloc_mw` revokes a window of either type.
//!
//! The memory-region table asks this table about any R_Key that is not a region's
//! ([`MwTable::check`]): the window must be bound, in the accessing QP's PD, grant the
//! right, and contain the whole range; the bytes are then the region's. A type 2
//! window is also bound to the QP that bound it (IBTA type 2B, as rxe's windows are:
//! `rxe_lookup_mw` compares `mw->qp`): only requests arriving on that QP reach it, and
//! only a SEND with Invalidate arriving on that QP invalidates it, so an R_Key handed
//! to one connection is no key on another connection of the same PD. Once that QP is
//! destroyed no QP reaches the window until it is invalidated locally and bound again
//! ([`MwTable::qp_destroyed`]; QP numbers are drawn again later). A region that is
//! deregistered unbinds its windows first. A bind needs a region registered with
//! `IBV_ACCESS_MW_BIND`.

use softnic_transport::memory::{Access, Accessor, MemError};

use super::memory::KeyMap;
use super::secret;

/// Windows one client may hold at once (`max_mw`; each is a few dozen bytes of NIC
/// memory, and the bound keeps a hostile client from growing the table without limit).
pub const MAX_WINDOWS_PER_CLIENT: usize = verbs_api::mw::MAX_MW as usize;

/// `IBV_ACCESS_MW_BIND`: a region windows may be bound to (kept in its access bits).
pub const ACCESS_MW_BIND: u32 = 0x10;

/// `IBV_ACCESS_ZERO_BASED`: addresses relative to the window's start. Not supported.
const ACCESS_ZERO_BASED: u32 = 1 << 5;

/// Why a window request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MwError {
    /// No such window (or region) of this client.
    NotFound(&'static str),
    /// A request the verbs forbid; the message says which rule.
    Invalid(&'static str),
    /// The client holds [`MAX_WINDOWS_PER_CLIENT`] windows, or no index is free.
    NoResources,
}

impl std::fmt::Display for MwError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MwError::NotFound(m) | MwError::Invalid(m) => f.write_str(m),
            MwError::NoResources => write!(
                f,
                "no memory window left (at most {MAX_WINDOWS_PER_CLIENT} per client)"
            ),
        }
    }
}

/// The region a bind names, as the memory-region table describes it.
#[derive(Debug, Clone, Copy)]
pub struct Under {
    /// Region handle.
    pub handle: u32,
    /// Its protection domain.
    pub pd: u32,
    /// Client virtual address of its first byte.
    pub iova: u64,
    /// Its length.
    pub len: u64,
    /// Its access rights.
    pub access: Access,
}

/// A bind request, once decoded.
#[derive(Debug, Clone, Copy)]
pub struct Bind {
    /// The window (its handle is its index).
    pub mw: u32,
    /// The R_Key it is to answer to.
    pub rkey: u32,
    /// First byte.
    pub addr: u64,
    /// Length (0: unbind a type 1 window).
    pub len: u64,
    /// `ibv_access_flags` bits.
    pub access: u32,
}

#[derive(Debug, Clone, Copy)]
struct Binding {
    mr: u32,
    addr: u64,
    len: u64,
    access: Access,
    qp: Holder,
}

/// Which QPs of the window's PD a bound window answers (IBTA 10.6.7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// Type 1: every QP of the PD.
    AnyQp,
    /// Type 2B: the QP it was bound on.
    Qp(u32),
    /// Type 2 whose QP was destroyed: none, until invalidated and bound again.
    Gone,
}

impl Holder {
    fn admits(self, qpn: u32) -> bool {
        match self {
            Holder::AnyQp => true,
            Holder::Qp(q) => q == qpn,
            Holder::Gone => false,
        }
    }
}

#[derive(Debug)]
struct Window {
    client: u32,
    pd: u32,
    mw_type: u8,
    rkey: u32,
    bound: Option<Binding>,
}

/// Every window of the NIC, by index (= handle = R_Key >> 8).
#[derive(Debug, Default)]
pub struct MwTable {
    windows: KeyMap<Window>,
    per_client: KeyMap<usize>,
}

impl MwTable {
    /// True when `key`'s upper 24 bits name a live window: no region key may (a region
    /// R_Key must never be taken for a window's, nor the other way round).
    pub fn uses_index_of(&self, key: u32) -> bool {
        self.windows.contains_key(&(key >> 8))
    }

    /// `ibv_alloc_mw`: a new unbound window; `index_free(i)` says that no region key
    /// has `i` as its upper 24 bits. Returns (handle, R_Key).
    pub fn alloc(
        &mut self,
        client: u32,
        pd: u32,
        mw_type: u8,
        index_free: impl Fn(u32) -> bool,
    ) -> Result<(u32, u32), MwError> {
        if mw_type != 1 && mw_type != 2 {
            return Err(MwError::Invalid("memory window type must be 1 or 2"));
        }
        let held = self.per_client.get(&client).copied().unwrap_or(0);
        if held >= MAX_WINDOWS_PER_CLIENT {
            return Err(MwError::NoResources);
        }
        let windows = &self.windows;
        let index = secret::draw_where(0xFF_FFFF, |i| {
            i != 0 && !windows.contains_key(&i) && index_free(i)
        })
        .map_err(|_| MwError::NoResources)?;
        let key = secret::draw_where(0xFF, |_| true).map_err(|_| MwError::NoResources)?;
        let rkey = index << 8 | key;
        self.windows.insert(
            index,
            Window {
                client,
                pd,
                mw_type,
                rkey,
                bound: None,
            },
        );
        self.per_client.insert(client, held + 1);
        Ok((index, rkey))
    }

    /// `ibv_dealloc_mw`: the window and its R_Key are gone at once.
    pub fn dealloc(&mut self, client: u32, handle: u32) -> Result<(), MwError> {
        self.owned(client, handle)?;
        self.windows.remove(&handle);
        if let Some(n) = self.per_client.get_mut(&client) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    /// Drops every window of `client` (it disconnected).
    pub fn remove_client(&mut self, client: u32) {
        self.windows.retain(|_, w| w.client != client);
        self.per_client.remove(&client);
    }

    /// QP `qpn` was destroyed: the type 2 windows bound on it answer no QP from now on
    /// (a QP created later may be given the same number).
    pub fn qp_destroyed(&mut self, qpn: u32) {
        for w in self.windows.values_mut() {
            if let Some(b) = w.bound.as_mut().filter(|b| b.qp == Holder::Qp(qpn)) {
                b.qp = Holder::Gone;
            }
        }
    }

    /// Unbinds every window bound to region `mr` (being deregistered).
    pub fn unbind_region(&mut self, mr: u32) {
        for w in self.windows.values_mut() {
            if w.bound.is_some_and(|b| b.mr == mr) {
                w.bound = None;
            }
        }
    }

    fn owned(&mut self, client: u32, handle: u32) -> Result<&mut Window, MwError> {
        self.windows
            .get_mut(&handle)
            .filter(|w| w.client == client)
            .ok_or(MwError::NotFound("no such memory window"))
    }

    /// A bind posted on QP `qp` (IBTA 10.6.7.2.1 and rxe's checks): the window, the QP
    /// and the region share a PD; the new R_Key keeps the window's index; a type 2
    /// window is free; the rights are remote ones, remote write and atomic only over a
    /// locally writable region; the range lies in the region. A type 2 window is then
    /// bound to `qp` too.
    pub fn bind(
        &mut self,
        client: u32,
        qp: Accessor,
        b: &Bind,
        under: Option<Under>,
    ) -> Result<(), MwError> {
        let w = self.owned(client, b.mw)?;
        if b.rkey >> 8 != b.mw {
            return Err(MwError::Invalid(
                "the new R_Key must keep the window's index (only its low byte may change)",
            ));
        }
        if w.pd != qp.pd {
            return Err(MwError::Invalid(
                "the window and the QP are in different protection domains",
            ));
        }
        if w.mw_type == 2 && w.bound.is_some() {
            return Err(MwError::Invalid(
                "a type 2 window is bound already: invalidate it first",
            ));
        }
        if b.len == 0 && w.mw_type == 1 {
            w.rkey = b.rkey;
            w.bound = None;
            return Ok(());
        }
        let remote = Access::REMOTE_READ
            .union(Access::REMOTE_WRITE)
            .union(Access::REMOTE_ATOMIC);
        if b.access & ACCESS_ZERO_BASED != 0 {
            return Err(MwError::Invalid("zero-based windows are not supported"));
        }
        // Local write means nothing for a window; rxe and pyverbs pass it along.
        if !remote.union(Access::LOCAL_WRITE).contains(Access(b.access)) {
            return Err(MwError::Invalid(
                "a window grants remote read, write and atomic rights only",
            ));
        }
        let access = Access(b.access & remote.0);
        let r = under.ok_or(MwError::NotFound("no such memory region"))?;
        if r.access.0 & ACCESS_MW_BIND == 0 {
            return Err(MwError::Invalid(
                "the region was registered without IBV_ACCESS_MW_BIND",
            ));
        }
        if r.pd != w.pd {
            return Err(MwError::Invalid(
                "the window and the region are in different protection domains",
            ));
        }
        let writes =
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if writes && !r.access.contains(Access::LOCAL_WRITE) {
            return Err(MwError::Invalid(
                "remote write or atomic through a window needs a locally writable region",
            ));
        }
        let inside = b.addr >= r.iova
            && b.addr
                .checked_add(b.len)
                .is_some_and(|end| end <= r.iova.saturating_add(r.len));
        if !inside {
            return Err(MwError::Invalid(
                "the window's range is not inside the region",
            ));
        }
        w.rkey = b.rkey;
        w.bound = Some(Binding {
            mr: r.handle,
            addr: b.addr,
            len: b.len,
            access,
            qp: if w.mw_type == 2 {
                Holder::Qp(qp.qpn)
            } else {
                Holder::AnyQp
            },
        });
        Ok(())
    }

    /// Invalidates the bound type 2 window whose R_Key is `rkey`, for QP `by`: a
    /// LOCAL_INV (`client` is the poster; any of its QPs of the window's PD, as rxe) or
    /// a SEND with Invalidate (`client` None: the window must be of the receiving QP's
    /// PD and bound on that QP, the only QP whose peer was given its R_Key).
    pub fn invalidate(
        &mut self,
        client: Option<u32>,
        by: Accessor,
        rkey: u32,
    ) -> Result<(), MwError> {
        let w = self
            .windows
            .get_mut(&(rkey >> 8))
            .filter(|w| client.is_none_or(|c| w.client == c) && w.rkey == rkey && w.pd == by.pd)
            .ok_or(MwError::NotFound(
                "no memory window of this PD has that R_Key",
            ))?;
        if w.mw_type != 2 {
            return Err(MwError::Invalid("only a type 2 window can be invalidated"));
        }
        let Some(b) = w.bound else {
            return Err(MwError::Invalid("the window is not bound"));
        };
        if client.is_none() && !b.qp.admits(by.qpn) {
            return Err(MwError::NotFound("the window is bound on another QP"));
        }
        w.bound = None;
        Ok(())
    }

    /// The region behind a remote access to `[va, va + len)` with R_Key `rkey` through
    /// QP `by`, if a bound window of its PD that answers it grants `access` over that
    /// range.
    pub fn check(
        &self,
        by: Accessor,
        rkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, MemError> {
        let w = self
            .windows
            .get(&(rkey >> 8))
            .filter(|w| w.rkey == rkey && w.pd == by.pd)
            .ok_or(MemError::InvalidKey)?;
        let b = w
            .bound
            .filter(|b| b.qp.admits(by.qpn))
            .ok_or(MemError::InvalidKey)?;
        if !b.access.contains(access) {
            return Err(MemError::AccessDenied);
        }
        let off = va.checked_sub(b.addr).ok_or(MemError::OutOfRange)?;
        if off.checked_add(len).is_none_or(|end| end > b.len) {
            return Err(MemError::OutOfRange);
        }
        Ok(b.mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u32 = 7;
    const PD: u32 = 3;
    /// The QP binds and accesses are made on.
    const Q: Accessor = Accessor { pd: PD, qpn: 0x51 };

    /// QP `Q`'s number in PD `pd`.
    fn on(pd: u32) -> Accessor {
        Accessor { pd, ..Q }
    }

    /// A region with `access` and the MW_BIND right.
    fn region(access: Access) -> Under {
        Under {
            handle: 11,
            pd: PD,
            iova: 0x1000,
            len: 0x1000,
            access: Access(access.0 | ACCESS_MW_BIND),
        }
    }

    fn bind(mw: u32, rkey: u32, addr: u64, len: u64, access: Access) -> Bind {
        Bind {
            mw,
            rkey,
            addr,
            len,
            access: access.0,
        }
    }

    #[test]
    fn type1_bind_reaches_only_the_window_then_rebind_and_unbind_revoke() {
        let mut t = MwTable::default();
        let (h, rkey) = t.alloc(C, PD, 1, |_| true).unwrap();
        assert_eq!(rkey >> 8, h);
        assert_eq!(
            t.check(Q, rkey, 0x1000, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        let r = region(Access::LOCAL_WRITE);
        let k1 = (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
        t.bind(
            C,
            Q,
            &bind(h, k1, 0x1100, 0x100, Access::REMOTE_WRITE),
            Some(r),
        )
        .unwrap();
        assert_eq!(t.check(Q, k1, 0x1100, 0x100, Access::REMOTE_WRITE), Ok(11));
        assert_eq!(
            t.check(Q, k1, 0x10ff, 1, Access::REMOTE_WRITE),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.check(Q, k1, 0x1101, 0x100, Access::REMOTE_WRITE),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.check(Q, k1, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(MemError::OutOfRange)
        );
        assert_eq!(
            t.check(Q, k1, 0x1100, 8, Access::REMOTE_READ),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.check(on(PD + 1), k1, 0x1100, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            t.check(Q, rkey, 0x1100, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        // A length-0 bind under the next key unbinds.
        let k2 = (k1 & !0xff) | (k1.wrapping_add(1) & 0xff);
        t.bind(C, Q, &bind(h, k2, 0, 0, Access::NONE), None)
            .unwrap();
        assert_eq!(
            t.check(Q, k2, 0x1100, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            t.check(Q, k1, 0x1100, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        // Only a type 2 window can be invalidated.
        assert!(t.invalidate(Some(C), Q, k2).is_err());
        t.dealloc(C, h).unwrap();
        assert!(t.dealloc(C, h).is_err());
    }

    #[test]
    fn bind_rules() {
        let mut t = MwTable::default();
        let (h, rkey) = t.alloc(C, PD, 2, |_| true).unwrap();
        let rw = Access::LOCAL_WRITE;
        let ok = bind(h, rkey, 0x1000, 0x1000, Access::REMOTE_WRITE);
        assert!(
            t.bind(C + 1, Q, &ok, Some(region(rw))).is_err(),
            "other client"
        );
        assert!(
            t.bind(C, on(PD + 1), &ok, Some(region(rw))).is_err(),
            "QP of another PD"
        );
        let other_index = bind(h, rkey ^ 0x100, 0x1000, 8, Access::REMOTE_WRITE);
        assert!(t.bind(C, Q, &other_index, Some(region(rw))).is_err());
        assert!(
            t.bind(C, Q, &ok, Some(region(Access::NONE))).is_err(),
            "write needs local write"
        );
        assert!(t.bind(C, Q, &ok, None).is_err(), "no region");
        let no_mw_bind = Under {
            access: Access::LOCAL_WRITE,
            ..region(rw)
        };
        assert!(
            t.bind(C, Q, &ok, Some(no_mw_bind)).is_err(),
            "region without MW_BIND"
        );
        let past = bind(h, rkey, 0x1000, 0x1001, Access::REMOTE_WRITE);
        assert!(t.bind(C, Q, &past, Some(region(rw))).is_err());
        let unknown = Bind {
            access: 0x100,
            ..ok
        };
        assert!(
            t.bind(C, Q, &unknown, Some(region(rw))).is_err(),
            "unknown rights"
        );
        let zero_based = Bind {
            access: ACCESS_ZERO_BASED | 2,
            ..ok
        };
        assert!(t.bind(C, Q, &zero_based, Some(region(rw))).is_err());
        t.bind(C, Q, &ok, Some(region(rw))).unwrap();
        assert!(
            t.bind(C, Q, &ok, Some(region(rw))).is_err(),
            "type 2 bound already"
        );
        // Invalidation: exact R_Key, same PD; then free for a new bind.
        assert!(t.invalidate(None, on(PD + 1), rkey).is_err());
        assert!(t.invalidate(None, Q, rkey ^ 1).is_err());
        t.invalidate(None, Q, rkey).unwrap();
        assert_eq!(
            t.check(Q, rkey, 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        assert!(t.invalidate(Some(C), Q, rkey).is_err(), "not bound");
        t.bind(C, Q, &ok, Some(region(rw))).unwrap();
        t.unbind_region(11);
        assert_eq!(
            t.check(Q, rkey, 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemError::InvalidKey)
        );
        assert!(t.alloc(C, PD, 3, |_| true).is_err(), "type 3");
    }

    /// IBTA type 2B: a type 2 window answers, and is remotely invalidated through, only
    /// the QP it was bound on; a type 1 window every QP of its PD. A destroyed QP's
    /// windows answer no QP, not even one given its number later, until invalidated
    /// locally (from any of the client's QPs of the PD) and bound again.
    #[test]
    fn a_type2_window_answers_only_the_qp_it_was_bound_on() {
        let mut t = MwTable::default();
        let rw = Access::LOCAL_WRITE;
        let other = Accessor {
            qpn: Q.qpn + 1,
            ..Q
        };
        let w = Access::REMOTE_WRITE;
        let (h1, k1) = t.alloc(C, PD, 1, |_| true).unwrap();
        t.bind(C, Q, &bind(h1, k1, 0x1000, 0x100, w), Some(region(rw)))
            .unwrap();
        assert_eq!(t.check(other, k1, 0x1000, 8, w), Ok(11), "type 1: any QP");
        let (h2, k2) = t.alloc(C, PD, 2, |_| true).unwrap();
        t.bind(C, Q, &bind(h2, k2, 0x1000, 0x100, w), Some(region(rw)))
            .unwrap();
        assert_eq!(t.check(Q, k2, 0x1000, 8, w), Ok(11));
        assert_eq!(
            t.check(other, k2, 0x1000, 8, w),
            Err(MemError::InvalidKey),
            "type 2B: its QP only"
        );
        // A SEND with Invalidate on another QP of the PD leaves it bound.
        assert!(t.invalidate(None, other, k2).is_err());
        assert_eq!(t.check(Q, k2, 0x1000, 8, w), Ok(11));
        // On its own QP it invalidates; a local invalidation may come from any QP.
        t.invalidate(None, Q, k2).unwrap();
        t.bind(C, other, &bind(h2, k2, 0x1000, 0x100, w), Some(region(rw)))
            .unwrap();
        assert_eq!(
            t.check(other, k2, 0x1000, 8, w),
            Ok(11),
            "rebound on `other`"
        );
        assert_eq!(t.check(Q, k2, 0x1000, 8, w), Err(MemError::InvalidKey));
        // Its QP destroyed: no QP, not one later given the same number.
        t.qp_destroyed(other.qpn);
        assert_eq!(t.check(other, k2, 0x1000, 8, w), Err(MemError::InvalidKey));
        assert!(t.invalidate(None, other, k2).is_err());
        assert_eq!(t.check(Q, k1, 0x1000, 8, w), Ok(11), "type 1 unaffected");
        t.invalidate(Some(C), Q, k2).unwrap();
        t.bind(C, Q, &bind(h2, k2, 0x1000, 0x100, w), Some(region(rw)))
            .unwrap();
        assert_eq!(t.check(Q, k2, 0x1000, 8, w), Ok(11));
    }

    #[test]
    fn windows_per_client_are_bounded_and_freed_with_the_client() {
        let mut t = MwTable::default();
        for _ in 0..MAX_WINDOWS_PER_CLIENT {
            t.alloc(C, PD, 1, |_| true).unwrap();
        }
        assert_eq!(t.alloc(C, PD, 1, |_| true), Err(MwError::NoResources));
        t.alloc(C + 1, PD, 1, |_| true).unwrap();
        t.remove_client(C);
        t.alloc(C, PD, 1, |_| true).unwrap();
    }
}
