//! CRC-32 (IEEE 802.3, reflected — the CRC the RoCEv2 ICRC is built on, as zlib and
//! crc32fast compute it) for softnic's data path, and a **fused copy + CRC**.
//!
//! Why a crate of its own, and not only crc32fast:
//! - **One read per byte.** The sender gathers a packet's payload from a client's
//!   memory region — memory the client may write while the NIC reads it — and needs the
//!   ICRC of exactly the bytes it copied. A copy followed by a CRC of the copy reads
//!   the copy back; [`copy_update_raw`] instead loads each 64-byte chunk (32-byte on the
//!   256-bit kernel, or 16-byte block) of the source once into a register, stores it
//!   and folds the same register, so the CRC always matches what was stored, for about
//!   the cost of the CRC alone.
//! - **A parallel end fold.** crc32fast's 512-bit kernel ends by folding its 16 lanes
//!   one after another (15 dependent multiply steps, ≈ 20 of its ≈ 76 ns per 4 KiB on
//!   session 9's Zen 4); here each lane is moved by its own distance constant at
//!   once and the products XORed (`x86.rs`). Numbers: docs/perf.md, "softnic-crc".
//!
//! Paths: on x86-64 with AVX-512F + VPCLMULQDQ (detected once at run time) inputs of
//! ≥ 256 bytes take the kernel (`x86.rs`, at 512 bits: `x86/zmm.rs`) for their whole
//! 16-byte blocks and crc32fast for the rest (< 16 bytes); with VPCLMULQDQ and AVX2 but
//! no AVX-512 (AMD Zen 3) the same kernel at 256 bits (`x86/ymm.rs`), one source
//! expanded at both widths. Shorter inputs, other x86 CPUs, aarch64 and other arches use
//! crc32fast (and, for the copies, a plain copy first, then the CRC of the copy — still
//! one read of the source). Compilers older than 1.89 build the fallback only, and
//! [`FORCE_FALLBACK_ENV`] (`SOFTNIC_CRC_FALLBACK=1`) makes a process take it on any CPU.
//!
//! # Unsafe
//! In `x86.rs`'s kernel, at both widths (SIMD loads and stores through raw pointers, and
//! calling `#[target_feature]` functions after the run-time check), in this file's
//! dispatch (the call into the kernel, the plain copy of what it leaves) and in
//! [`copy_update_raw`]'s contract. Sound because: every kernel call is preceded by its
//! width's feature check (and the intrinsics outside `unsafe` blocks are called from
//! safe `#[target_feature]` functions enabling that width's features and no more, so the
//! compiler checks each is called only where its features are enabled); every load and
//! store lies inside `[0, len)` of buffers the caller vouches for (64- or 32-byte chunks
//! below `len / 64` or `len / 32`, then 16-byte blocks below `len / 16`); the source is
//! only ever read through raw pointers, never a Rust reference, so a concurrent writer
//! in another process can change what is read but not make it undefined (the same
//! stance as `ptr::copy_nonoverlapping` in softnic's `nic/memory.rs`).
#![deny(unsafe_op_in_unsafe_fn)]

// Without the kernel only the constants' own tests use them.
#[cfg_attr(
    not(all(target_arch = "x86_64", softnic_crc_vpclmul)),
    allow(dead_code)
)]
mod consts;
#[cfg(all(target_arch = "x86_64", softnic_crc_vpclmul))]
mod x86;

/// The environment variable that, set to anything non-empty, makes the process take the
/// crc32fast fallback on every call, as on a CPU without VPCLMULQDQ (read once,
/// at the first call): to test and measure that path, the one other machines run, on a
/// machine that has the kernel.
pub const FORCE_FALLBACK_ENV: &str = "SOFTNIC_CRC_FALLBACK";

/// Below this many bytes every function here is crc32fast (after a plain copy for the
/// copying ones): a caller already holding a `crc32fast::Hasher` can keep using it for
/// shorter inputs and skip a hasher's set-up.
pub const WIDE_MIN_LEN: usize = 256;

/// CRC-32 (IEEE 802.3, reflected, as crc32fast / zlib): `update(0, d) ==
/// crc32fast::hash(d)`, `update(update(c, a), b) == update(c, a ++ b)`.
pub fn update(crc: u32, data: &[u8]) -> u32 {
    update_on(Path::auto(), crc, data)
}

/// Copies `src` into `dst` (same length, else panic) and returns `update(crc, src)`.
pub fn copy_update(crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    copy_update_on(Path::auto(), crc, src, dst)
}

/// The same from a raw source: copies `dst.len()` bytes from `src` into `dst` and
/// returns `update(crc, bytes copied)`, reading each source byte exactly once.
///
/// # Safety
/// `src` is valid for reads of `dst.len()` bytes and does not overlap `dst`. The bytes
/// may be written concurrently by another process (shared memory): the copy then holds
/// some mix of old and new bytes, and the CRC is the CRC of exactly what was copied. No
/// Rust reference to the source is formed.
pub unsafe fn copy_update_raw(crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: the caller's contract is this function's.
    unsafe { copy_update_raw_on(Path::auto(), crc, src, dst) }
}

/// The same into a raw destination: copies `src` to `dst` and returns
/// `update(crc, src)`, reading each source byte once (the receiver's single pass: a
/// packet's payload, the NIC's own buffer, written into a client's shared mapping).
///
/// # Safety
/// `dst` is valid for writes of `src.len()` bytes and does not overlap `src`. The
/// destination may be read or written concurrently by another process (shared
/// memory): the CRC is of `src`, whatever happens there. No Rust reference to the
/// destination is formed.
pub unsafe fn copy_update_to_raw(crc: u32, src: &[u8], dst: *mut u8) -> u32 {
    // SAFETY: the caller's contract is this function's.
    unsafe { copy_update_to_raw_on(Path::auto(), crc, src, dst) }
}

/// An implementation, for tests and benches to run each one this CPU can run.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// crc32fast, and a plain copy before it.
    Fallback,
    /// The 512-bit VPCLMULQDQ kernel (x86-64) for inputs of ≥ 256 bytes.
    Wide,
    /// The 256-bit VPCLMULQDQ kernel (x86-64 with AVX2 but no AVX-512, such as AMD Zen
    /// 3) for inputs of ≥ 256 bytes.
    Ymm,
}

impl Path {
    /// Every path this CPU can run.
    pub fn runnable() -> Vec<Path> {
        let mut v = vec![Path::Fallback];
        if wide_available() {
            v.push(Path::Wide);
        }
        if ymm_available() {
            v.push(Path::Ymm);
        }
        v
    }

    /// The path the public functions take: the widest kernel this CPU runs.
    pub fn auto() -> Path {
        if wide_available() {
            Path::Wide
        } else if ymm_available() {
            Path::Ymm
        } else {
            Path::Fallback
        }
    }
}

fn wide_available() -> bool {
    #[cfg(all(target_arch = "x86_64", softnic_crc_vpclmul))]
    return x86::zmm::available();
    #[allow(unreachable_code)]
    false
}

fn ymm_available() -> bool {
    #[cfg(all(target_arch = "x86_64", softnic_crc_vpclmul))]
    return x86::ymm::available();
    #[allow(unreachable_code)]
    false
}

/// crc32fast from a finished CRC (nothing to do for no bytes: the kernel's part of a
/// multiple of 16 bytes, such as 4096 or 4112, leaves none, and a hasher's set-up is
/// not free).
fn fallback(crc: u32, data: &[u8]) -> u32 {
    if data.is_empty() {
        return crc;
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// The kernel's part of a call on `path`: the CRC after the whole 16-byte blocks of
/// `len` bytes at `src` (copied to `dst` with `COPY`) and how many bytes that was, or
/// `(crc, 0)` when `path` or `len` leaves everything to crc32fast.
///
/// # Safety
/// `src` is valid for reads of `len` bytes; with `COPY`, `dst` is valid for writes of
/// `len` bytes and does not overlap `src`. (`path` must be runnable, else panic.)
unsafe fn kernel<const COPY: bool>(
    path: Path,
    crc: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> (u32, usize) {
    #[cfg(all(target_arch = "x86_64", softnic_crc_vpclmul))]
    if len >= WIDE_MIN_LEN {
        // Direct calls, one arm per kernel: each asserts its own CPU features.
        match path {
            Path::Wide => {
                assert!(
                    x86::zmm::available(),
                    "the Wide CRC kernel needs AVX-512F and VPCLMULQDQ"
                );
                // SAFETY: the CPU features are checked just above, `len >= MIN_LEN`,
                // and the buffers are as the caller guarantees.
                return unsafe { x86::zmm::chunks::<COPY>(crc, src, dst, len) };
            }
            Path::Ymm => {
                assert!(
                    x86::ymm::available(),
                    "the Ymm CRC kernel needs AVX2 and VPCLMULQDQ"
                );
                // SAFETY: as for `Wide`, with this kernel's features.
                return unsafe { x86::ymm::chunks::<COPY>(crc, src, dst, len) };
            }
            Path::Fallback => {}
        }
    }
    let _ = (path, src, dst, len);
    (crc, 0)
}

/// [`update`] on `path` (which must be [`Path::runnable`], else panic — in builds
/// without the kernels `Wide` and `Ymm` are the fallback).
#[doc(hidden)]
pub fn update_on(path: Path, crc: u32, data: &[u8]) -> u32 {
    // SAFETY: `data` is readable for its length; without COPY `dst` is never used.
    let (crc, done) =
        unsafe { kernel::<false>(path, crc, data.as_ptr(), core::ptr::null_mut(), data.len()) };
    fallback(crc, &data[done..])
}

/// [`copy_update`] on `path`.
#[doc(hidden)]
pub fn copy_update_on(path: Path, crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(
        src.len(),
        dst.len(),
        "copy_update: source and destination lengths differ"
    );
    // SAFETY: `src` is a shared slice of `dst.len()` bytes, so readable, and cannot
    // overlap the exclusive `dst`.
    unsafe { copy_update_raw_on(path, crc, src.as_ptr(), dst) }
}

/// [`copy_update_to_raw`] on `path`.
///
/// # Safety
/// As [`copy_update_to_raw`].
#[doc(hidden)]
pub unsafe fn copy_update_to_raw_on(path: Path, crc: u32, src: &[u8], dst: *mut u8) -> u32 {
    // SAFETY: `src` is readable for its length; the caller vouches for `src.len()`
    // writable destination bytes not overlapping it.
    let (crc, done) = unsafe { kernel::<true>(path, crc, src.as_ptr(), dst, src.len()) };
    let rest = &src[done..];
    // SAFETY: `dst + done .. dst + src.len()` is writable (the caller's contract) and
    // does not overlap `rest`, part of `src`. The CRC is of `src`, the bytes written.
    unsafe { core::ptr::copy_nonoverlapping(rest.as_ptr(), dst.add(done), rest.len()) };
    fallback(crc, rest)
}

/// [`copy_update_raw`] on `path`.
///
/// # Safety
/// As [`copy_update_raw`].
#[doc(hidden)]
pub unsafe fn copy_update_raw_on(path: Path, crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: the caller vouches for `dst.len()` readable source bytes not overlapping
    // `dst`, which is that many writable bytes.
    let (crc, done) = unsafe { kernel::<true>(path, crc, src, dst.as_mut_ptr(), dst.len()) };
    let rest = &mut dst[done..];
    // SAFETY: `src + done .. src + dst.len()` is readable (the caller's contract) and
    // cannot overlap `rest`, part of `dst`. Copied once; the CRC is then of our copy.
    unsafe { core::ptr::copy_nonoverlapping(src.add(done), rest.as_mut_ptr(), rest.len()) };
    fallback(crc, rest)
}
