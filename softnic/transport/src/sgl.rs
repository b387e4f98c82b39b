//! Scatter/gather lists: walking a WQE's SGEs at a byte offset.
//!
//! A message is the concatenation of its SGEs (IBTA 10.7.2.1: "the data is gathered
//! from the buffers in the order the segments appear"). Packets cut the message at
//! multiples of the path MTU, so each packet reads or writes one window
//! `[offset, offset + len)` of that concatenation, which may span several SGEs. These
//! helpers do that walk without allocating, and every byte goes through
//! [`Memory`] so the key, range and access checks apply.

use core::ops::Range;

use crate::memory::{MemError, Memory};
use crate::wr::{SendWr, Sge, MAX_SGE};

/// Calls `f(sge, offset_in_sge, range_in_window)` for every piece of the window
/// `[offset, offset + len)` of the SGE list. Fails with `OutOfRange` when the list is
/// shorter than the window.
fn walk(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let avail = usize::try_from(sl - offset).unwrap_or(usize::MAX);
        let take = avail.min(len - done);
        f(s, offset, done..done + take)?;
        done += take;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::OutOfRange)
    }
}

/// Total bytes of an SGE list.
pub fn total_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// The used SGEs of a list (`num_sge` clamped to [`MAX_SGE`]).
pub fn used(sges: &[Sge; MAX_SGE], num_sge: usize) -> &[Sge] {
    &sges[..num_sge.min(MAX_SGE)]
}

fn addr_at(s: &Sge, off: u64) -> Result<u64, MemError> {
    s.addr.checked_add(off).ok_or(MemError::OutOfRange)
}

/// Copies the message window `[offset, offset + dst.len())` of a send WQE (its inline
/// data, or its gather list read under `lkey`s) into `dst`.
pub fn gather(
    pd: u32,
    wr: &SendWr,
    offset: u64,
    dst: &mut [u8],
    mem: &dyn Memory,
) -> Result<(), MemError> {
    if let Some(data) = &wr.inline {
        let start = usize::try_from(offset).map_err(|_| MemError::OutOfRange)?;
        let src = data
            .as_bytes()
            .get(start..start.checked_add(dst.len()).ok_or(MemError::OutOfRange)?)
            .ok_or(MemError::OutOfRange)?;
        dst.copy_from_slice(src);
        return Ok(());
    }
    let len = dst.len();
    walk(used(&wr.sges, wr.num_sge), offset, len, |s, off, r| {
        let d = dst.get_mut(r).ok_or(MemError::OutOfRange)?;
        mem.read_local(pd, s.lkey, addr_at(s, off)?, d)
    })
}

/// Writes `src` at message offset `offset` of a scatter list (a receive WQE or the
/// local buffer of a READ), under the SGEs' `lkey`s (LOCAL_WRITE required).
pub fn scatter(
    pd: u32,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
    mem: &mut dyn Memory,
) -> Result<(), MemError> {
    walk(sges, offset, src.len(), |s, off, r| {
        let d = src.get(r).ok_or(MemError::OutOfRange)?;
        mem.write_local(pd, s.lkey, addr_at(s, off)?, d)
    })
}
