//! Where rings sit in a shared segment, and how large segments are.
//!
//! Both sides compute the layout from the numbers in the control message (the QP's
//! capabilities, the CQ's depth) with these functions, so the NIC never takes an offset
//! or a size from client memory. Like io_uring's `sq_off`/`cq_off`, but computed rather
//! than exchanged.

use std::fmt;

use super::ring::RING_HEADER_SIZE;
use super::slots::{Cqe, RecvWqe, SendWqe, Slot};
use super::MAX_RING_ENTRIES;

/// Alignment of every ring inside a segment (a cache line).
pub const RING_ALIGN: usize = 64;

/// Segment sizes are rounded up to this (the page size on every platform softnic runs on).
pub const SEGMENT_ALIGN: usize = 4096;

/// Why a layout is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutError {
    /// Zero entries, or more than the ring kind allows ([`MAX_RING_ENTRIES`] for work
    /// queues, [`MAX_CQ_ENTRIES`](super::MAX_CQ_ENTRIES) for CQs).
    BadCapacity {
        /// Entries requested.
        requested: u32,
        /// The ring kind's largest capacity.
        max: u32,
    },
    /// Capacity is not a power of two (ring constructors take exact capacities; use
    /// [`ring_capacity`] to round a user's depth).
    NotPowerOfTwo {
        /// Capacity given.
        capacity: u32,
    },
    /// The size does not fit in `usize`.
    TooLarge {
        /// Bytes wanted.
        bytes: usize,
    },
    /// A ring offset (or the mapping) is not 64-byte aligned.
    Misaligned {
        /// The offending offset or address.
        offset: usize,
    },
    /// The ring would extend past the end of the mapping.
    OutsideMapping {
        /// End offset of the ring.
        end: usize,
        /// Mapping length.
        mapping_len: usize,
    },
    /// A slot stride that is not a multiple of 8 between `Slot::HEAD` and the slot's
    /// size ([`super::Ring::with_stride`]).
    BadStride {
        /// The stride given.
        stride: usize,
    },
    /// The ring header written by the peer does not describe the expected ring.
    HeaderMismatch {
        /// Capacity in the header.
        capacity: u32,
        /// Entry size in the header.
        entry_size: u32,
        /// Capacity expected.
        expected_capacity: u32,
        /// Entry size expected.
        expected_entry_size: u32,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayoutError::BadCapacity { requested, max } => {
                write!(f, "ring depth {requested} is outside 1..={max}")
            }
            LayoutError::NotPowerOfTwo { capacity } => {
                write!(f, "ring capacity {capacity} is not a power of two")
            }
            LayoutError::TooLarge { bytes } => write!(f, "segment of {bytes} bytes is too large"),
            LayoutError::Misaligned { offset } => {
                write!(f, "ring offset {offset:#x} is not {RING_ALIGN}-byte aligned")
            }
            LayoutError::OutsideMapping { end, mapping_len } => write!(
                f,
                "ring ends at byte {end} but the mapping is only {mapping_len} bytes"
            ),
            LayoutError::BadStride { stride } => {
                write!(f, "ring slot stride {stride} is not a valid size for its slots")
            }
            LayoutError::HeaderMismatch {
                capacity,
                entry_size,
                expected_capacity,
                expected_entry_size,
            } => write!(
                f,
                "ring header says {capacity} entries of {entry_size} bytes, expected {expected_capacity} of {expected_entry_size}"
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

/// The ring capacity for a requested depth: the next power of two. A depth of 0 is
/// refused: a CQ or an SRQ of 0 entries is invalid (as rxe refuses them).
pub fn ring_capacity(depth: u32) -> Result<u32, LayoutError> {
    ring_capacity_up_to(depth, MAX_RING_ENTRIES)
}

/// [`ring_capacity`] for a ring kind whose largest capacity is `max` (a power of two).
fn ring_capacity_up_to(depth: u32, max: u32) -> Result<u32, LayoutError> {
    if depth == 0 || depth > max {
        return Err(LayoutError::BadCapacity {
            requested: depth,
            max,
        });
    }
    Ok(depth.next_power_of_two())
}

/// The ring capacity of a QP's work queue for `max_wr`: as [`ring_capacity`], except
/// that 0 is allowed and gets one slot. A QP may have an empty send or receive queue
/// (a QP that only receives or only sends: qperf's bandwidth tests ask for
/// `max_recv_wr` 0 on the sender and `max_send_wr` 0 on the receiver, and rxe and
/// hardware accept that); the verbs let a device grant more than was asked, and a ring
/// needs at least one slot, so such a queue is granted, and reported as, one entry.
pub fn wq_capacity(max_wr: u32) -> Result<u32, LayoutError> {
    ring_capacity(max_wr.max(1)).map_err(|_| LayoutError::BadCapacity {
        requested: max_wr,
        max: MAX_RING_ENTRIES,
    })
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

/// Bytes of a ring of `capacity` slots of `T` (header + slots, rounded to
/// [`RING_ALIGN`]). `capacity` must be an exact power of two.
pub fn ring_bytes<T: Slot>(capacity: u32) -> Result<usize, LayoutError> {
    ring_bytes_within(capacity, core::mem::size_of::<T>(), T::MAX_ENTRIES)
}

/// [`ring_bytes`] for slots `stride` bytes apart ([`super::Ring::with_stride`]) of a
/// work queue ring (at most [`MAX_RING_ENTRIES`]).
pub fn ring_bytes_strided(capacity: u32, stride: usize) -> Result<usize, LayoutError> {
    ring_bytes_within(capacity, stride, MAX_RING_ENTRIES)
}

/// Bytes of a ring of `capacity` slots `stride` bytes apart, `capacity` at most `max`.
pub(crate) fn ring_bytes_within(
    capacity: u32,
    stride: usize,
    max: u32,
) -> Result<usize, LayoutError> {
    if capacity == 0 || capacity > max {
        return Err(LayoutError::BadCapacity {
            requested: capacity,
            max,
        });
    }
    if !capacity.is_power_of_two() {
        return Err(LayoutError::NotPowerOfTwo { capacity });
    }
    let slots = (capacity as usize)
        .checked_mul(stride)
        .ok_or(LayoutError::TooLarge { bytes: usize::MAX })?;
    let total = slots
        .checked_add(RING_HEADER_SIZE)
        .and_then(|n| round_up(n, RING_ALIGN))
        .ok_or(LayoutError::TooLarge { bytes: usize::MAX })?;
    Ok(total)
}

/// What a QP's send WQEs can carry (from CreateQp's capabilities and QP type), which
/// decides its send ring's stride ([`send_wqe_stride`]) and the inline room it grants
/// ([`SqShape::inline_capacity`]). Client and NIC each build it from the same
/// CreateQp request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqShape {
    /// Scatter/gather entries per WQE (CreateQp's `max_sge`, capped at
    /// [`super::MAX_SGE`]).
    pub max_sge: u32,
    /// Inline bytes per send WQE asked for (capped at [`super::MAX_INLINE`]).
    pub max_inline: u32,
    /// A UD QP: every WQE carries a destination.
    pub ud: bool,
}

impl SqShape {
    /// Where this QP's inline payloads start in a WQE ([`SendWqe::inline_offset`]).
    fn inline_offset(&self) -> usize {
        if self.ud {
            SendWqe::INLINE_AT
        } else {
            SendWqe::HEAD
        }
    }

    /// Bytes of a WQE after [`Self::inline_offset`] that the QP needs: its gather
    /// entries (at least one: an atomic's) or its inline room, whichever is larger.
    fn payload_room(&self) -> usize {
        let sges = (self.max_sge as usize).clamp(1, super::MAX_SGE);
        let gather = core::mem::size_of::<super::Sge>() * sges;
        gather.max((self.max_inline as usize).min(super::MAX_INLINE))
    }

    /// The inline bytes the QP is granted, what `ibv_create_qp` reports as
    /// `max_inline_data`: all of the stride after the inline offset (at most
    /// [`super::MAX_INLINE`]). At least what was asked for, and at least the room of
    /// the gather list (16 bytes per entry), as rxe grants (`rxe_qp_init_req`: inline
    /// data and gather list share its WQE's room, so it reports the larger of
    /// `max_send_sge` × 16 and `max_inline_data`).
    pub fn inline_capacity(&self) -> u32 {
        let room = send_wqe_stride(*self) - self.inline_offset();
        room.min(super::MAX_INLINE) as u32
    }
}

/// The slot stride of a QP's send ring: the most a WQE of that QP can use
/// ([`SendWqe`]'s `used_len`), rounded up to a word. That is the fixed fields (and,
/// on a UD QP, its destination) and then the larger of `max_sge` gather entries (at
/// least one: an atomic's) and `max_inline` bytes, which share that room
/// ([`SendWqe::inline_offset`]): 64 bytes for one entry and no more than 16 bytes
/// inline, up to 112 for four; 144 + 16 for a one-entry UD QP.
///
/// Why not always the whole 400-byte slot: a send ring is written by the client and
/// read by the NIC on every post, and with thousands of QPs their rings are cold when
/// their turn comes. A QP with one gather entry has one cache line per WQE (16 WQEs in
/// 16 lines, against 48 at 400 bytes and 36 at session 16's 144) and 16 send slots in
/// a quarter of a page: fewer misses and TLB misses per post on both sides (issue 12,
/// "Many QPs"; docs/perf.md).
pub fn send_wqe_stride(shape: SqShape) -> usize {
    (shape.inline_offset() + shape.payload_room()).div_ceil(8) * 8
}

/// The layout of a QP segment: the SQ ring at offset 0, then the RQ ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpLayout {
    /// SQ capacity (power of two).
    pub sq_capacity: u32,
    /// Bytes from one SQ slot to the next ([`send_wqe_stride`]).
    pub sq_stride: usize,
    /// RQ capacity (power of two).
    pub rq_capacity: u32,
    /// Offset of the SQ ring (always 0).
    pub sq_offset: usize,
    /// Offset of the RQ ring.
    pub rq_offset: usize,
    /// Segment length (page-rounded): the memfd size.
    pub len: usize,
}

impl QpLayout {
    /// The layout for a QP with room for `max_send_wr` and `max_recv_wr` outstanding
    /// work requests (each rounded up to a power of two, 0 to one: [`wq_capacity`]) and
    /// send WQEs of `shape`.
    pub fn new(max_send_wr: u32, max_recv_wr: u32, shape: SqShape) -> Result<Self, LayoutError> {
        let sq_capacity = wq_capacity(max_send_wr)?;
        let rq_capacity = wq_capacity(max_recv_wr)?;
        let sq_stride = send_wqe_stride(shape);
        let sq_bytes = ring_bytes_strided(sq_capacity, sq_stride)?;
        let rq_bytes = ring_bytes::<RecvWqe>(rq_capacity)?;
        let end = sq_bytes
            .checked_add(rq_bytes)
            .ok_or(LayoutError::TooLarge { bytes: usize::MAX })?;
        let len = round_up(end, SEGMENT_ALIGN).ok_or(LayoutError::TooLarge { bytes: end })?;
        Ok(QpLayout {
            sq_capacity,
            sq_stride,
            rq_capacity,
            sq_offset: 0,
            rq_offset: sq_bytes,
            len,
        })
    }
}

impl QpLayout {
    /// The segment's two rings over `map` (the QP memfd's mapping), the send ring at
    /// its stride: the one place that turns a QP layout into rings, so that no side
    /// builds the send ring at another stride than the peer's.
    pub fn rings(
        &self,
        map: std::sync::Arc<memmap2::MmapRaw>,
    ) -> Result<(super::Ring<SendWqe>, super::Ring<RecvWqe>), LayoutError> {
        let sq = super::Ring::with_stride(
            map.clone(),
            self.sq_offset,
            self.sq_capacity,
            self.sq_stride,
        )?;
        let rq = super::Ring::new(map, self.rq_offset, self.rq_capacity)?;
        Ok((sq, rq))
    }
}

/// The layout of an SRQ segment: one receive ring at offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqLayout {
    /// Ring capacity (power of two).
    pub capacity: u32,
    /// Offset of the ring (always 0).
    pub offset: usize,
    /// Segment length (page-rounded).
    pub len: usize,
}

impl SrqLayout {
    /// The layout for an SRQ of at least `max_wr` WQEs.
    pub fn new(max_wr: u32) -> Result<Self, LayoutError> {
        let capacity = ring_capacity(max_wr)?;
        let bytes = ring_bytes::<RecvWqe>(capacity)?;
        let len = round_up(bytes, SEGMENT_ALIGN).ok_or(LayoutError::TooLarge { bytes })?;
        Ok(SrqLayout {
            capacity,
            offset: 0,
            len,
        })
    }
}

/// The layout of a CQ segment: one CQ ring at offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqLayout {
    /// CQ capacity (power of two).
    pub capacity: u32,
    /// Offset of the ring (always 0).
    pub offset: usize,
    /// Segment length (page-rounded).
    pub len: usize,
}

impl CqLayout {
    /// The layout for a CQ of at least `depth` entries (at most
    /// [`MAX_CQ_ENTRIES`](super::MAX_CQ_ENTRIES), the CQE slot's [`Slot::MAX_ENTRIES`]).
    pub fn new(depth: u32) -> Result<Self, LayoutError> {
        let capacity = ring_capacity_up_to(depth, Cqe::MAX_ENTRIES)?;
        let bytes = ring_bytes::<Cqe>(capacity)?;
        let len = round_up(bytes, SEGMENT_ALIGN).ok_or(LayoutError::TooLarge { bytes })?;
        Ok(CqLayout {
            capacity,
            offset: 0,
            len,
        })
    }
}

/// The memfd length for a memory region of `len` bytes (page-rounded, at least a page so
/// that zero-length regions still have a mapping).
pub fn mr_segment_len(len: usize) -> Result<usize, LayoutError> {
    round_up(len.max(1), SEGMENT_ALIGN).ok_or(LayoutError::TooLarge { bytes: len })
}

#[cfg(test)]
mod tests {
    use super::super::slots::SEND_WQE_SIZE;
    use super::super::MAX_CQ_ENTRIES;
    use super::*;

    #[test]
    fn capacities_round_to_powers_of_two() {
        assert_eq!(ring_capacity(1), Ok(1));
        assert_eq!(ring_capacity(500), Ok(512));
        assert_eq!(ring_capacity(512), Ok(512));
        assert_eq!(
            ring_capacity(0),
            Err(LayoutError::BadCapacity {
                requested: 0,
                max: MAX_RING_ENTRIES
            })
        );
        assert!(ring_capacity(MAX_RING_ENTRIES + 1).is_err());
    }

    #[test]
    fn a_cq_may_be_larger_than_a_work_queue() {
        let l = CqLayout::new(128_000).unwrap();
        assert_eq!(l.capacity, 1 << 17);
        assert!(l.len >= ring_bytes::<Cqe>(1 << 17).unwrap());
        assert_eq!(
            CqLayout::new(MAX_CQ_ENTRIES).unwrap().capacity,
            MAX_CQ_ENTRIES
        );
        assert_eq!(
            CqLayout::new(MAX_CQ_ENTRIES + 1),
            Err(LayoutError::BadCapacity {
                requested: MAX_CQ_ENTRIES + 1,
                max: MAX_CQ_ENTRIES
            })
        );
        // Work queue rings keep their own, smaller limit.
        const { assert!(MAX_RING_ENTRIES < MAX_CQ_ENTRIES) };
        assert!(ring_bytes::<Cqe>(MAX_RING_ENTRIES * 2).is_ok());
        assert!(ring_bytes::<RecvWqe>(MAX_RING_ENTRIES * 2).is_err());
        assert!(ring_bytes_strided(MAX_RING_ENTRIES * 2, SEND_WQE_SIZE).is_err());
        assert!(SrqLayout::new(MAX_RING_ENTRIES + 1).is_err());
    }

    #[test]
    fn an_empty_work_queue_gets_one_slot() {
        assert_eq!(wq_capacity(0), Ok(1));
        assert_eq!(wq_capacity(1), Ok(1));
        assert_eq!(wq_capacity(500), Ok(512));
        assert_eq!(
            wq_capacity(MAX_RING_ENTRIES + 1),
            Err(LayoutError::BadCapacity {
                requested: MAX_RING_ENTRIES + 1,
                max: MAX_RING_ENTRIES
            })
        );
        let l = QpLayout::new(0, 0, shape(1, 0, false)).unwrap();
        assert_eq!((l.sq_capacity, l.rq_capacity), (1, 1));
    }

    #[test]
    fn ring_bytes_is_header_plus_slots_rounded() {
        assert_eq!(ring_bytes::<Cqe>(1), Ok(192 + 64)); // 48 rounded to 64
        assert_eq!(ring_bytes::<Cqe>(8), Ok(192 + 384));
        assert_eq!(ring_bytes::<SendWqe>(4), Ok(192 + 1600));
        assert_eq!(
            ring_bytes::<Cqe>(3),
            Err(LayoutError::NotPowerOfTwo { capacity: 3 })
        );
    }

    /// A shape: `max_sge` entries, `max_inline` bytes, UD or not.
    fn shape(max_sge: u32, max_inline: u32, ud: bool) -> SqShape {
        SqShape {
            max_sge,
            max_inline,
            ud,
        }
    }

    #[test]
    fn send_stride_is_the_most_a_wqe_of_the_qp_uses() {
        // The fixed fields and max_sge entries (at least one), or the inline room if
        // larger: the two share the bytes after the fixed fields.
        assert_eq!(send_wqe_stride(shape(0, 0, false)), 64);
        assert_eq!(send_wqe_stride(shape(1, 0, false)), 64);
        assert_eq!(send_wqe_stride(shape(1, 16, false)), 64);
        assert_eq!(send_wqe_stride(shape(2, 0, false)), 80);
        assert_eq!(send_wqe_stride(shape(4, 0, false)), 112);
        assert_eq!(send_wqe_stride(shape(u32::MAX, 0, false)), 112);
        assert_eq!(send_wqe_stride(shape(1, 17, false)), 72);
        assert_eq!(send_wqe_stride(shape(4, 64, false)), 112);
        assert_eq!(send_wqe_stride(shape(1, 256, false)), 48 + 256);
        assert_eq!(send_wqe_stride(shape(1, u32::MAX, false)), 48 + 256);
        // A UD QP: the same after its destination.
        assert_eq!(send_wqe_stride(shape(1, 0, true)), 160);
        assert_eq!(send_wqe_stride(shape(4, 64, true)), 208);
        assert_eq!(send_wqe_stride(shape(1, 256, true)), SEND_WQE_SIZE);
        // 16 one-entry send slots and one receive slot fit a page, a quarter of it theirs.
        let l = QpLayout::new(16, 1, shape(1, 0, false)).unwrap();
        assert_eq!((l.len, l.rq_offset), (4096, 192 + 16 * 64));
        assert_eq!(
            QpLayout::new(16, 1, shape(1, 256, false)).unwrap().len,
            8192
        );
    }

    /// The inline room granted is at least what was asked for and at least the gather
    /// list's (rxe's least grant), and never more than the stride holds.
    #[test]
    fn inline_capacity_is_the_stride_after_the_inline_offset() {
        assert_eq!(shape(1, 0, false).inline_capacity(), 16);
        assert_eq!(shape(0, 0, false).inline_capacity(), 16);
        assert_eq!(shape(2, 0, false).inline_capacity(), 32);
        assert_eq!(shape(4, 0, false).inline_capacity(), 64);
        assert_eq!(shape(1, 17, false).inline_capacity(), 24);
        assert_eq!(shape(1, 256, false).inline_capacity(), 256);
        assert_eq!(shape(1, 0, true).inline_capacity(), 16);
        assert_eq!(shape(4, 100, true).inline_capacity(), 104);
        for ud in [false, true] {
            for max_sge in 0..=4u32 {
                for max_inline in 0..=256u32 {
                    let s = shape(max_sge, max_inline, ud);
                    let cap = s.inline_capacity();
                    assert!(cap >= max_inline && cap >= 16 * max_sge, "{s:?}");
                    assert!(cap as usize <= super::super::MAX_INLINE, "{s:?}");
                    // A WQE that uses all of it fits the stride.
                    let w = SendWqe {
                        flags: super::super::slots::send_flags::INLINE
                            | if ud {
                                super::super::slots::send_flags::UD_DEST
                            } else {
                                0
                            },
                        inline_len: cap,
                        ..SendWqe::default()
                    };
                    assert_eq!(w.used_len(), w.inline_offset() + cap as usize);
                    assert!(w.used_len() <= send_wqe_stride(s), "{s:?}");
                }
            }
        }
    }

    /// Whatever a WQE of a QP carries, within the QP's shape, fits the stride: the
    /// writer never needs to clamp a WQE it checked against the QP's capabilities.
    #[test]
    fn every_wqe_a_shape_allows_fits_its_stride() {
        use super::super::slots::send_flags::{INLINE, UD_DEST};
        for ud in [false, true] {
            for max_sge in 0..=4u32 {
                for max_inline in [0u32, 1, 8, 100, 256] {
                    let stride = send_wqe_stride(shape(max_sge, max_inline, ud));
                    let ud_flag = if ud { UD_DEST } else { 0 };
                    for num_sge in 0..=max_sge.max(1) {
                        let w = SendWqe {
                            flags: ud_flag,
                            num_sge: num_sge as u8,
                            ..SendWqe::default()
                        };
                        assert!(
                            w.used_len() <= stride,
                            "{max_sge} {max_inline} {ud} {num_sge}"
                        );
                    }
                    for len in [0, max_inline / 2, max_inline] {
                        let w = SendWqe {
                            flags: ud_flag | INLINE,
                            inline_len: len,
                            ..SendWqe::default()
                        };
                        assert!(w.used_len() <= stride, "{max_inline} {ud} {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn qp_layout_places_rq_after_sq_and_page_rounds() {
        let l = QpLayout::new(1, 500, shape(4, 256, true)).unwrap();
        assert_eq!(l.sq_capacity, 1);
        assert_eq!(l.sq_stride, 400);
        assert_eq!(l.rq_capacity, 512);
        assert_eq!(l.rq_offset, 192 + 448); // 400 rounded up to 64 with the header
        assert_eq!(l.rq_offset % RING_ALIGN, 0);
        let end = l.rq_offset + 192 + 512 * 80;
        assert!(l.len >= end && l.len - end < SEGMENT_ALIGN);
        assert_eq!(l.len % SEGMENT_ALIGN, 0);
    }

    #[test]
    fn cq_and_mr_lengths() {
        let c = CqLayout::new(100).unwrap();
        assert_eq!(c.capacity, 128);
        assert_eq!(c.len, 8192); // 192 + 128*40 = 5312 -> 8192
        assert_eq!(mr_segment_len(0), Ok(4096));
        assert_eq!(mr_segment_len(4096), Ok(4096));
        assert_eq!(mr_segment_len(4097), Ok(8192));
        assert!(mr_segment_len(usize::MAX).is_err());
    }
}
