//! Single-producer single-consumer rings in shared memory (io_uring SQ/CQ, AF_XDP).
//!
//! A ring is a [`RingHeader`] followed by `capacity` (a power of two) slots of one
//! [`Slot`] type. Indices are free-running `u32`s, masked on access, so `producer −
//! consumer` (wrapping) is the number of filled slots and is never more than `capacity`.
//!
//! * The producer writes slots, then `producer.store(tail, Release)` ([`Producer::publish`]).
//! * The consumer `producer.load(Acquire)`, copies slots out, then
//!   `consumer.store(head, Release)` ([`Consumer::release`]) so the producer may reuse them.
//!
//! Each side keeps its own index privately and only ever *writes* it to shared memory;
//! the other side's index is cached (`cached_*`) and reloaded only when the cache says
//! the ring is full (producer) or empty (consumer), as AF_XDP's `xsk_ring_prod__reserve`
//! and io_uring's SQ do. Every loaded index is validated: a difference larger than
//! `capacity` means the peer corrupted the header, and the ring reports
//! [`RingError::Corrupt`] forever after (the NIC then moves the QP to ERR).
//!
//! Memory safety does not depend on the peer: a [`Ring`] checks once, at construction,
//! that header and slots lie inside the mapping, and afterwards every slot access is
//! `index & mask` with the mask it computed itself; the header's `capacity` and
//! `entry_size` words are only *compared* with the expected values.

use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{fence, AtomicU32, Ordering};
use std::fmt;
use std::sync::Arc;

use memmap2::MmapRaw;

use super::layout::{ring_bytes_within, LayoutError, RING_ALIGN};
use super::slots::Slot;
use crate::hint;

/// Aligns (and pads) a value to a 64-byte cache line so that the producer's and the
/// consumer's index never share a line (false sharing costs a cache miss per post).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CachePadded<T>(pub T);

/// The header at the start of every ring.
///
/// `capacity` and `entry_size` are atomics only so that reading them while a hostile
/// peer writes them is defined behaviour; they are written once by the creator.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// Free-running producer index (written by the producer only).
    pub producer: CachePadded<AtomicU32>,
    /// Free-running consumer index (written by the consumer only).
    pub consumer: CachePadded<AtomicU32>,
    /// [`super::CQ_ARMED`] on CQ rings; unused (0) on SQ/RQ/SRQ rings, whose wake-up
    /// flag is per client on the doorbell page since ABI 2 ([`super::doorbell`]).
    pub flags: AtomicU32,
    /// Number of slots (a power of two).
    pub capacity: AtomicU32,
    /// Size of one slot in bytes.
    pub entry_size: AtomicU32,
    /// Zero.
    pub _reserved: AtomicU32,
}

/// Size of [`RingHeader`]; slots start at this offset from the header.
pub const RING_HEADER_SIZE: usize = 192;
const _: () = assert!(core::mem::size_of::<RingHeader>() == RING_HEADER_SIZE);
const _: () = assert!(core::mem::align_of::<RingHeader>() == 64);
const _: () = assert!(core::mem::offset_of!(RingHeader, consumer) == 64);
const _: () = assert!(core::mem::offset_of!(RingHeader, flags) == 128);
const _: () = assert!(core::mem::offset_of!(RingHeader, capacity) == 132);
const _: () = assert!(core::mem::offset_of!(RingHeader, entry_size) == 136);
const _: () = assert!(RING_HEADER_SIZE.is_multiple_of(RING_ALIGN));

/// Why a ring operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// No free slot (producer).
    Full,
    /// The peer's index is impossible (`producer − consumer > capacity`); the ring is
    /// unusable from now on.
    Corrupt {
        /// Producer index seen.
        producer: u32,
        /// Consumer index seen.
        consumer: u32,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Full => write!(f, "ring full"),
            RingError::Corrupt { producer, consumer } => write!(
                f,
                "ring header corrupt: producer {producer} consumer {consumer} differ by more than the capacity"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// A typed view of one ring inside a shared mapping. Holds the mapping alive.
pub struct Ring<T: Slot> {
    /// Keeps the mapping alive for as long as the raw pointers below are used.
    _map: Arc<MmapRaw>,
    header: NonNull<RingHeader>,
    slots: NonNull<T>,
    capacity: u32,
    /// Bytes from one slot to the next: `size_of::<T>()`, or less for a ring whose
    /// values never use their tail (a send ring of a QP with little or no inline data,
    /// [`super::layout::send_wqe_stride`]). Only the first `stride` bytes of a slot
    /// are ever read or written.
    stride: usize,
    _slots: PhantomData<T>,
}

// SAFETY: the ring only touches shared memory through atomics (header) and volatile
// copies of plain-data slots (`Slot`); the mapping is owned through an `Arc`. Moving a
// `Ring` to another thread is therefore fine; `Producer`/`Consumer` enforce one user per
// side by taking `&mut self`.
unsafe impl<T: Slot> Send for Ring<T> {}

impl<T: Slot> fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity)
            .field("entry_size", &core::mem::size_of::<T>())
            .field(
                "producer",
                &self.header().producer.0.load(Ordering::Relaxed),
            )
            .field(
                "consumer",
                &self.header().consumer.0.load(Ordering::Relaxed),
            )
            .field("flags", &self.flags())
            .finish()
    }
}

impl<T: Slot> Ring<T> {
    /// A view of the ring at `offset` in `map` with `capacity` slots of `T`.
    ///
    /// Checks that `capacity` is a power of two no larger than [`Slot::MAX_ENTRIES`],
    /// that `offset` is 64-byte aligned, and that the whole ring lies inside the
    /// mapping. Does not read or write the header.
    pub fn new(map: Arc<MmapRaw>, offset: usize, capacity: u32) -> Result<Self, LayoutError> {
        Self::with_stride(map, offset, capacity, core::mem::size_of::<T>())
    }

    /// [`Ring::new`] with slots `stride` bytes apart: at least `Slot::HEAD`, at most
    /// `size_of::<T>()`, a multiple of 8 (the ring copies words). A value's bytes past
    /// the stride are never stored; the producer must only push values whose
    /// `Slot::used_len` fits (a send ring: what the QP's `max_sge`, `max_inline` and type
    /// allow, `layout::SqShape`).
    pub fn with_stride(
        map: Arc<MmapRaw>,
        offset: usize,
        capacity: u32,
        stride: usize,
    ) -> Result<Self, LayoutError> {
        let size = core::mem::size_of::<T>();
        let words_only = by_words::<T>() && stride.is_multiple_of(8);
        if stride > size || stride < T::HEAD.min(size) || (stride < size && !words_only) {
            return Err(LayoutError::BadStride { stride });
        }
        let bytes = ring_bytes_within(capacity, stride, T::MAX_ENTRIES)?;
        if !offset.is_multiple_of(RING_ALIGN) {
            return Err(LayoutError::Misaligned { offset });
        }
        let end = offset
            .checked_add(bytes)
            .ok_or(LayoutError::TooLarge { bytes: usize::MAX })?;
        if end > map.len() {
            return Err(LayoutError::OutsideMapping {
                end,
                mapping_len: map.len(),
            });
        }
        let base = map.as_mut_ptr();
        if !(base as usize).is_multiple_of(RING_ALIGN) {
            return Err(LayoutError::Misaligned {
                offset: base as usize,
            });
        }
        // SAFETY: offset + bytes <= map.len() (checked above), so both pointers are
        // inside the mapping, and base is non-null (a mapping).
        let header = unsafe { base.add(offset) }.cast::<RingHeader>();
        // SAFETY: as above; RING_HEADER_SIZE < bytes.
        let slots = unsafe { base.add(offset + RING_HEADER_SIZE) }.cast::<T>();
        Ok(Ring {
            _map: map,
            header: NonNull::new(header).ok_or(LayoutError::Misaligned { offset })?,
            slots: NonNull::new(slots).ok_or(LayoutError::Misaligned { offset })?,
            capacity,
            stride,
            _slots: PhantomData,
        })
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: `header` points inside the live mapping (checked in `new`, kept alive
        // by `_map`), is 64-byte aligned, and RingHeader consists of atomics only, which
        // may be shared with another process writing them concurrently.
        unsafe { self.header.as_ref() }
    }

    /// Writes a fresh header (indices 0, flags 0, capacity, entry size). Only the
    /// segment's creator calls this, before passing the segment to the peer.
    pub fn init(&self) {
        let h = self.header();
        h.producer.0.store(0, Ordering::Relaxed);
        h.consumer.0.store(0, Ordering::Relaxed);
        h.flags.store(0, Ordering::Relaxed);
        h.capacity.store(self.capacity, Ordering::Relaxed);
        h.entry_size.store(self.stride as u32, Ordering::Relaxed);
        h._reserved.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Checks that the header written by the peer describes this ring (the attacher
    /// calls this once). The ring never uses the header's values for addressing anyway.
    pub fn check_header(&self) -> Result<(), LayoutError> {
        let h = self.header();
        let capacity = h.capacity.load(Ordering::Acquire);
        let entry_size = h.entry_size.load(Ordering::Acquire);
        if capacity != self.capacity || entry_size as usize != self.stride {
            return Err(LayoutError::HeaderMismatch {
                capacity,
                entry_size,
                expected_capacity: self.capacity,
                expected_entry_size: self.stride as u32,
            });
        }
        Ok(())
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Current flag bits.
    pub fn flags(&self) -> u32 {
        self.header().flags.load(Ordering::Acquire)
    }

    /// Sets flag bits (`fetch_or`, SeqCst); returns the previous bits.
    pub fn set_flags(&self, bits: u32) -> u32 {
        self.header().flags.fetch_or(bits, Ordering::SeqCst)
    }

    /// Clears flag bits (`fetch_and`, SeqCst); returns the previous bits.
    pub fn clear_flags(&self, bits: u32) -> u32 {
        self.header().flags.fetch_and(!bits, Ordering::SeqCst)
    }

    /// Number of filled slots as seen now (Acquire loads of both indices); an error
    /// when the indices are inconsistent. For the NIC's pre-sleep re-check and for stats.
    pub fn len(&self) -> Result<u32, RingError> {
        let h = self.header();
        let consumer = h.consumer.0.load(Ordering::Acquire);
        let producer = h.producer.0.load(Ordering::Acquire);
        let n = producer.wrapping_sub(consumer);
        if n > self.capacity {
            return Err(RingError::Corrupt { producer, consumer });
        }
        Ok(n)
    }

    /// True when [`Ring::len`] is 0.
    pub fn is_empty(&self) -> Result<bool, RingError> {
        self.len().map(|n| n == 0)
    }

    /// Becomes the producer side. The starting index is read from the header once.
    pub fn into_producer(self) -> Producer<T> {
        let h = self.header();
        let tail = h.producer.0.load(Ordering::Acquire);
        let cached_consumer = h.consumer.0.load(Ordering::Acquire);
        Producer {
            ring: self,
            tail,
            cached_consumer,
            corrupt: None,
        }
    }

    /// Becomes the consumer side. The starting index is read from the header once.
    pub fn into_consumer(self) -> Consumer<T> {
        let h = self.header();
        let head = h.consumer.0.load(Ordering::Acquire);
        Consumer {
            ring: self,
            head,
            released: head,
            cached_producer: head,
            corrupt: None,
        }
    }

    /// Hints (`crate::hint`) for writing: the producer index's line and the used head
    /// (`Slot::HEAD`) of the `count` slots from `index`, capped at the capacity; and the
    /// consumer index's line for reading.
    fn prefetch_for_producer(&self, index: u32, count: u32) {
        let h = self.header();
        let producer: *const CachePadded<AtomicU32> = &h.producer;
        hint::prefetch_range(producer.cast(), 4, true);
        // Read when the cached consumer index shows too little room, as it does for a
        // batch as large as the ring's free part was at the last look.
        let consumer: *const CachePadded<AtomicU32> = &h.consumer;
        hint::prefetch_range(consumer.cast(), 4, false);
        self.prefetch_slots(index, count, T::HEAD.min(self.stride), true);
    }

    /// Hints the first `len` bytes of each of the `count` slots from `index` (capped at
    /// the capacity), for writing when `write`. Through [`Ring::slot_ptr`], so a run
    /// that wraps past the last slot continues at the first.
    fn prefetch_slots(&self, index: u32, count: u32, len: usize, write: bool) {
        for k in 0..count.min(self.capacity) {
            hint::prefetch_range(self.slot_ptr(index.wrapping_add(k)).cast(), len, write);
        }
    }

    /// The slot for `index`: valid for [`Ring::stride`] bytes (a whole `T` only when
    /// the stride is its size), aligned for `T`.
    fn slot_ptr(&self, index: u32) -> *mut T {
        let i = (index & (self.capacity - 1)) as usize;
        // SAFETY: i < capacity and the `capacity` slots of `stride` bytes after the
        // header lie inside the mapping (checked in `with_stride`), so the start of slot
        // i is in bounds; it is 8-aligned (the slots start 64-aligned and the stride is
        // a multiple of 8, or the size of `T`), which is `T`'s alignment or more.
        unsafe { self.slots.as_ptr().cast::<u8>().add(i * self.stride) }.cast::<T>()
    }

    /// Bytes from one slot to the next (see [`Ring::with_stride`]).
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Words of a slot the ring may copy (its stride in 8-byte words).
    fn slot_words(&self) -> usize {
        self.stride / 8
    }
}

/// Whether slots of `T` are copied a machine word at a time: true for every slot type
/// of the ABI (they hold `u64`s, so their size and alignment are multiples of 8).
const fn by_words<T>() -> bool {
    core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>().is_multiple_of(8)
}

/// Volatile copy of one slot out of shared memory. A volatile read of the whole struct
/// would be exact too, but compiles to one load per byte of its byte arrays (a
/// `SendWqe`'s 256 inline bytes): copying 8-byte words costs ~8x less (docs/perf.md,
/// "Per-message cost").
///
/// # Safety
/// `p` must be aligned and valid for reads of `max_words` words, which must be a whole
/// `T` (`size_of::<T>()` bytes) unless `by_words::<T>()` and `max_words * 8 >=
/// T::HEAD`.
unsafe fn read_slot<T: Slot>(p: *const T, max_words: usize) -> T {
    // Zeroed: the bytes past the value's `used_len` are not copied, and zero is a
    // valid `T` (`T: Slot` accepts every bit pattern).
    let mut out = core::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: `p` by the caller's contract; `out` is a local, aligned, apart from `p`,
    // and holds a valid `T` (all zeros, see above).
    unsafe { read_slot_into(p, out.as_mut_ptr(), max_words) };
    // SAFETY: every byte was zeroed or copied, and `T: Slot` accepts every bit pattern.
    unsafe { out.assume_init() }
}

/// Words of `v` a ring copies: its `used_len`, clamped to `[T::HEAD, size]`, rounded up,
/// and at most `max_words` (the ring's stride).
fn used_words<T: Slot>(v: &T, max_words: usize) -> usize {
    let size = core::mem::size_of::<T>();
    v.used_len()
        .clamp(T::HEAD.min(size), size)
        .div_ceil(8)
        .min(max_words)
}

/// [`read_slot`] into a place the caller owns, so that a large slot (a 400-byte
/// `SendWqe`) is copied once, not once more on its way out of a return value. Copies
/// the value's head first, then as much more as that copy's `used_len` asks for (so a
/// producer changing the slot meanwhile changes nothing but which bytes are copied);
/// the rest of `out` keeps what it held.
///
/// # Safety
/// `p` as for [`read_slot`]; `out` valid for reads and writes of a `T`, aligned,
/// holding a valid `T`, and not overlapping `p`.
unsafe fn read_slot_into<T: Slot>(p: *const T, out: *mut T, max_words: usize) {
    if !by_words::<T>() {
        // SAFETY: the caller's contract.
        return unsafe { out.write(core::ptr::read_volatile(p)) };
    }
    let (src, dst) = (p.cast::<u64>(), out.cast::<u64>());
    let head = T::HEAD.min(core::mem::size_of::<T>()).div_ceil(8);
    for i in 0..head {
        // SAFETY: i * 8 < size_of::<T>() (head ≤ size / 8, as the size is a multiple of
        // 8) and head ≤ max_words (the caller's contract), so both words are inside
        // their `T` and the slot, and they are 8-byte aligned (by_words).
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
    // SAFETY: `out` holds a valid `T` (the caller's contract, and a word of a `Slot`
    // copied over another keeps it valid); nothing else refers to it meanwhile.
    let words = used_words(unsafe { &*out }, max_words);
    for i in head..words {
        // SAFETY: as above: words ≤ size / 8 and ≤ max_words.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
}

/// Volatile copy of one slot into shared memory, a word at a time (see [`read_slot`]),
/// only the value's used words (`Slot::used_len`): the rest of the slot keeps what an
/// earlier value left there, which no consumer reads as part of this one.
///
/// # Safety
/// `p` must be aligned and valid for writes of `max_words` words, as for [`read_slot`].
unsafe fn write_slot<T: Slot>(p: *mut T, value: &T, max_words: usize) {
    if !by_words::<T>() {
        // SAFETY: the caller's contract.
        return unsafe { core::ptr::write_volatile(p, *value) };
    }
    let (src, dst) = ((value as *const T).cast::<u64>(), p.cast::<u64>());
    for i in 0..used_words(value, max_words) {
        // SAFETY: both words lie inside their `T` and the slot (used_words ≤ size / 8
        // and ≤ max_words) and are 8-byte
        // aligned (by_words); `T: Slot` has no padding, so every word of `value` is
        // initialised.
        unsafe { dst.add(i).write_volatile(src.add(i).read()) };
    }
}

/// The producer side of a ring: writes slots and publishes them.
#[derive(Debug)]
pub struct Producer<T: Slot> {
    ring: Ring<T>,
    /// Our index: slots `[published.., tail)` are written but maybe not yet published.
    tail: u32,
    cached_consumer: u32,
    corrupt: Option<RingError>,
}

impl<T: Slot> Producer<T> {
    /// The ring (flags, capacity).
    pub fn ring(&self) -> &Ring<T> {
        &self.ring
    }

    /// Free slots, reloading the consumer index only when the cached value shows fewer
    /// than `want` free. Errors when the consumer index is impossible.
    pub fn free(&mut self, want: u32) -> Result<u32, RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        let cap = self.ring.capacity;
        let used = self.tail.wrapping_sub(self.cached_consumer);
        let free = cap.wrapping_sub(used);
        if used <= cap && free >= want {
            return Ok(free);
        }
        let consumer = self.ring.header().consumer.0.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(consumer);
        if used > cap {
            let e = RingError::Corrupt {
                producer: self.tail,
                consumer,
            };
            self.corrupt = Some(e);
            return Err(e);
        }
        self.cached_consumer = consumer;
        Ok(cap - used)
    }

    /// Hints that the next `count` slots and the producer index will be written (and the
    /// consumer index read): call before pushing a batch into a ring that may be cold,
    /// so that the lines are fetched together rather than one miss after another.
    pub fn prefetch(&self, count: u32) {
        self.ring.prefetch_for_producer(self.tail, count);
    }

    /// Writes `value` into the next slot (not yet visible to the consumer: call
    /// [`Producer::publish`] after a batch).
    pub fn push(&mut self, value: &T) -> Result<(), RingError> {
        if self.free(1)? == 0 {
            return Err(RingError::Full);
        }
        // The caller's promise (`with_stride`): a value that does not fit would lose its
        // tail.
        debug_assert!(
            value.used_len() <= self.ring.stride,
            "value longer than the stride"
        );
        let p = self.ring.slot_ptr(self.tail);
        // SAFETY: `p` is an in-bounds, aligned slot of `slot_words` words (slot_ptr; a
        // whole `T` unless `with_stride` allowed less); the consumer does not read it until
        // we publish (it is past the published producer index). A hostile consumer reading
        // it early only races on plain data, hence the volatile write.
        unsafe { write_slot(p, value, self.ring.slot_words()) };
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Slots pushed and not yet released by the consumer (published or not), read
    /// from the consumer's index. Errors when that index is impossible.
    pub fn unconsumed(&self) -> Result<u32, RingError> {
        let consumer = self.ring.header().consumer.0.load(Ordering::Acquire);
        let n = self.tail.wrapping_sub(consumer);
        if n > self.ring.capacity {
            return Err(RingError::Corrupt {
                producer: self.tail,
                consumer,
            });
        }
        Ok(n)
    }

    /// Moves the [`Producer::unconsumed`] slots, in order, to `to` (the ring replacing
    /// this one, e.g. a resized CQ) and publishes them there. `Full` when they do not
    /// fit. The consumer must not be reading this ring meanwhile (a resize holds its
    /// poll lock).
    pub fn move_unconsumed(&mut self, to: &mut Producer<T>) -> Result<u32, RingError> {
        let n = self.unconsumed()?;
        if to.free(n)? < n {
            return Err(RingError::Full);
        }
        let from = self.tail.wrapping_sub(n);
        for i in 0..n {
            let p = self.ring.slot_ptr(from.wrapping_add(i));
            // SAFETY: `p` is an in-bounds, aligned slot of `slot_words` words (slot_ptr; a
            // whole `T` unless `with_stride` allowed less); `T: Slot` makes any bit pattern
            // valid, so whatever the consumer left there is copied out once.
            let v = unsafe { read_slot(p, self.ring.slot_words()) };
            to.push(&v)?;
        }
        to.publish();
        Ok(n)
    }

    /// Makes every pushed slot visible to the consumer (`producer.store(Release)`).
    pub fn publish(&mut self) {
        self.ring
            .header()
            .producer
            .0
            .store(self.tail, Ordering::Release);
    }

    /// Publishes, then `fence(SeqCst)`, then returns whether any of `bits` is set in
    /// `flags` (the producer half of a flag handshake; the client's post path uses the
    /// doorbell page's flag instead, [`super::doorbell::Doorbell::ring`]).
    pub fn publish_and_check(&mut self, bits: u32) -> bool {
        self.publish();
        fence(Ordering::SeqCst);
        self.ring.header().flags.load(Ordering::Relaxed) & bits != 0
    }

    /// Publishes, then `fence(SeqCst)`, then clears `bits` if set and returns whether
    /// this call cleared any. The NIC's CQ path: `publish_and_take(CQ_ARMED)` says
    /// whether to write the CQ's event pipe (one wake-up per arm).
    pub fn publish_and_take(&mut self, bits: u32) -> bool {
        self.publish();
        fence(Ordering::SeqCst);
        self.take_flags(bits)
    }

    /// Clears `bits` in `flags` if set; returns whether this call cleared any. The
    /// second half of [`Self::publish_and_take`], for a producer that stores more
    /// between its publish and the `fence(SeqCst)` (the NIC's CQ flush also bumps the
    /// client's completion sequence, [`super::doorbell::Doorbell::note_completions`]).
    pub fn take_flags(&self, bits: u32) -> bool {
        let h = self.ring.header();
        if h.flags.load(Ordering::Relaxed) & bits == 0 {
            return false;
        }
        h.flags.fetch_and(!bits, Ordering::SeqCst) & bits != 0
    }
}

/// The consumer side of a ring: copies slots out and releases them.
#[derive(Debug)]
pub struct Consumer<T: Slot> {
    ring: Ring<T>,
    /// Our index: next slot to read.
    head: u32,
    /// The consumer index we last published (never read back from shared memory,
    /// which the producer could overwrite).
    released: u32,
    cached_producer: u32,
    corrupt: Option<RingError>,
}

/// Most bytes of new slots a [`Consumer`] hints at once when it finds them (16 lines:
/// 16 one-line WQEs, a burst; more would queue behind the CPU's fill buffers), and at
/// least one slot.
const PREFETCH_BYTES: usize = 1024;

impl<T: Slot> Consumer<T> {
    /// The ring (flags, capacity).
    pub fn ring(&self) -> &Ring<T> {
        &self.ring
    }

    /// Filled slots, reloading the producer index (Acquire) only when the cached value
    /// says the ring is empty; a reload that finds new slots hints their lines
    /// (`prefetch_new`). Errors when the producer index is impossible.
    pub fn available(&mut self) -> Result<u32, RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        let n = self.cached_producer.wrapping_sub(self.head);
        if n != 0 && n <= self.ring.capacity {
            return Ok(n);
        }
        let producer = self.ring.header().producer.0.load(Ordering::Acquire);
        let n = producer.wrapping_sub(self.head);
        if n > self.ring.capacity {
            let e = RingError::Corrupt {
                producer,
                consumer: self.head,
            };
            self.corrupt = Some(e);
            return Err(e);
        }
        self.cached_producer = producer;
        self.prefetch_new(n);
        Ok(n)
    }

    /// Hints (`crate::hint`) the lines of the `n` new slots from the head, when there
    /// are two or more (one alone is read next anyway: nothing to overlap with), at
    /// most [`PREFETCH_BYTES`] of them: the producer has just written them, usually on
    /// another core, so each is a cross-core miss. Read one after another, each miss
    /// waits for the one before; hinted together, they overlap. In the 8-QP pattern of
    /// `nic_bench` (bursts of 16 WQEs per doorbell) the NIC's ring drain went from
    /// 16–25 to 6.5–9.4 ns a message, most of it having been the first load of each
    /// slot (docs/perf.md, "Many QPs", session 21; the message rate there did not
    /// move).
    fn prefetch_new(&self, n: u32) {
        if n < 2 {
            return;
        }
        let stride = self.ring.stride;
        let most = (PREFETCH_BYTES / stride).max(1) as u32;
        self.ring
            .prefetch_slots(self.head, n.min(most), stride, false);
    }

    /// Puts back the slot the last [`Consumer::pop`] returned, so that the next pop
    /// returns it again (the consumer found it cannot take it yet). Does nothing if
    /// that slot was released meanwhile.
    pub fn unpop(&mut self) {
        if self.head != self.released {
            self.head = self.head.wrapping_sub(1);
        }
    }

    /// Copies the next slot out, or `None` when the ring is empty. The slot is not
    /// returned to the producer until [`Consumer::release`].
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        if self.available()? == 0 {
            return Ok(None);
        }
        let p = self.ring.slot_ptr(self.head);
        // SAFETY: `p` is an in-bounds, aligned slot of `slot_words` words (slot_ptr; a
        // whole `T` unless `with_stride` allowed less). `T: Slot` makes every bit pattern
        // valid, so a peer's garbage (even a concurrent write by a misbehaving producer)
        // yields some valid `T`; the volatile read copies it out exactly once.
        let v = unsafe { read_slot(p, self.ring.slot_words()) };
        self.head = self.head.wrapping_add(1);
        Ok(Some(v))
    }

    /// [`Consumer::pop`] into `out`: true when a slot was copied there, false (and
    /// `out` untouched) when the ring is empty. Copies the slot's used part
    /// (`Slot::used_len`) exactly once; the rest of `out` keeps what it held.
    pub fn pop_into(&mut self, out: &mut T) -> Result<bool, RingError> {
        if self.available()? == 0 {
            return Ok(false);
        }
        let p = self.ring.slot_ptr(self.head);
        // SAFETY: `p` is an in-bounds, aligned slot of `slot_words` words (slot_ptr; a
        // whole `T` unless `with_stride` allowed less) in the shared mapping, `out` an
        // exclusive reference to a valid `T` in this process, so they do not overlap. `T:
        // Slot` makes every bit pattern valid (see `pop`).
        unsafe { read_slot_into(p, out, self.ring.slot_words()) };
        self.head = self.head.wrapping_add(1);
        Ok(true)
    }

    /// Drops the filled slots for which `keep` is false, the others staying in order
    /// (a CQ's completions of a QP moved to RESET, as mlx5's provider removes them in
    /// `mlx5_cq_clean`): only slots the producer has published, `[head, producer)`,
    /// which are the consumer's until it releases them, so a producer writing on
    /// meanwhile writes past them. The kept slots are moved towards the newest, the
    /// head past the dropped ones; [`Consumer::release`] then returns them. Returns how
    /// many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Result<u32, RingError> {
        let n = self.available()?;
        let end = self.head.wrapping_add(n);
        let (mut read, mut write) = (end, end);
        while read != self.head {
            read = read.wrapping_sub(1);
            // SAFETY: slot `read` is in bounds and aligned (slot_ptr), filled and not
            // released (head ≤ read < producer); every bit pattern is a valid `T`.
            let v = unsafe { read_slot(self.ring.slot_ptr(read), self.ring.slot_words()) };
            if keep(&v) {
                write = write.wrapping_sub(1);
                if write != read {
                    // SAFETY: slot `write` is in bounds and aligned, and read < write <
                    // producer: a slot this consumer holds, already read.
                    unsafe { write_slot(self.ring.slot_ptr(write), &v, self.ring.slot_words()) };
                }
            }
        }
        let dropped = write.wrapping_sub(self.head);
        self.head = write;
        Ok(dropped)
    }

    /// Returns consumed slots to the producer (`consumer.store(Release)`).
    pub fn release(&mut self) {
        self.release_except(0);
    }

    /// Returns consumed slots to the producer except the last `held` popped, which
    /// still count against the ring's capacity. A work queue uses this so that a slot
    /// frees only when its work request has completed, as in rxe's queues: the
    /// producer then never has more outstanding than the capacity it was granted
    /// (the post after that is ENOMEM). The published index only moves forward: a
    /// `held` larger than what is unreleased publishes nothing. Returns how many slots
    /// it released.
    pub fn release_except(&mut self, held: u32) -> u32 {
        let to = self.head.wrapping_sub(held);
        let unreleased = self.head.wrapping_sub(self.released);
        if held > unreleased || to == self.released {
            return 0;
        }
        let n = to.wrapping_sub(self.released);
        self.released = to;
        self.ring.header().consumer.0.store(to, Ordering::Release);
        n
    }

    /// Sets `bits` (e.g. [`super::CQ_ARMED`]), `fence(SeqCst)`, then re-checks the
    /// ring: returns `Ok(true)` when it is still empty, so the caller may sleep.
    pub fn arm(&mut self, bits: u32) -> Result<bool, RingError> {
        self.ring.set_flags(bits);
        fence(Ordering::SeqCst);
        Ok(self.available()? == 0)
    }
}

#[cfg(test)]
mod tests;
