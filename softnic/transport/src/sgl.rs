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
#[inline(always)]
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

/// The window `[offset, offset + len)` of a WQE's inline data.
fn inline_window(data: &[u8], offset: u64, len: usize) -> Result<&[u8], MemError> {
    let start = usize::try_from(offset).map_err(|_| MemError::OutOfRange)?;
    data.get(start..start.checked_add(len).ok_or(MemError::OutOfRange)?)
        .ok_or(MemError::OutOfRange)
}

/// Copies the message window `[offset, offset + dst.len())` of a send WQE (its inline
/// data, or its gather list read under `lkey`s) into `dst`.
#[inline(always)]
pub fn gather(
    pd: u32,
    wr: &SendWr,
    offset: u64,
    dst: &mut [u8],
    mem: &dyn Memory,
) -> Result<(), MemError> {
    if let Some(data) = &wr.inline {
        dst.copy_from_slice(inline_window(data.as_bytes(), offset, dst.len())?);
        return Ok(());
    }
    let len = dst.len();
    walk(used(&wr.sges, wr.num_sge), offset, len, |s, off, r| {
        let d = dst.get_mut(r).ok_or(MemError::OutOfRange)?;
        mem.read_local(pd, s.lkey, addr_at(s, off)?, d)
    })
}

/// Payloads at least this long are gathered with their CRC ([`gather_crc`]): combining
/// a digest into the ICRC costs a few table look-ups, and below this the hash of the
/// payload it saves is as cheap as that (and the small-message path stays as it was).
pub const DIGEST_MIN_PAYLOAD: usize = 256;

/// [`gather`] that also returns the CRC-32 of the window (crc32fast's `hash` of
/// `dst`), chained over the SGEs — or over the inline data — in message order
/// ([`Memory::read_local_crc`]).
pub fn gather_crc(
    pd: u32,
    wr: &SendWr,
    offset: u64,
    dst: &mut [u8],
    mem: &dyn Memory,
) -> Result<u32, MemError> {
    if let Some(data) = &wr.inline {
        let src = inline_window(data.as_bytes(), offset, dst.len())?;
        return Ok(crate::crc::copy_update(0, src, dst));
    }
    let len = dst.len();
    let mut crc = 0;
    walk(used(&wr.sges, wr.num_sge), offset, len, |s, off, r| {
        let d = dst.get_mut(r).ok_or(MemError::OutOfRange)?;
        crc = mem.read_local_crc(pd, s.lkey, addr_at(s, off)?, d, crc)?;
        Ok(())
    })?;
    Ok(crc)
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
