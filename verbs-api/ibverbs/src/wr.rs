//! The `ibv_wr_*` post API of `struct ibv_qp_ex` (rdma-core 1.6+): `ibv_wr_start`,
//! one builder call per WR (`ibv_wr_send`, `ibv_wr_rdma_write`, …) taking `wr_id` and
//! `wr_flags` from the `ibv_qp_ex` fields, setters for the last WR (`ibv_wr_set_sge`,
//! `ibv_wr_set_ud_addr`, `ibv_wr_set_inline_data`), then `ibv_wr_complete` posts the
//! batch (or `ibv_wr_abort` drops it).
//!
//! The batch lives in the QP (its vector keeps its capacity, so a steady stream of
//! batches allocates nothing); each call takes the batch's lock briefly (uncontended:
//! no syscall). An operation softnic lacks (TSO, ATOMIC WRITE, FLUSH), or a setter
//! misuse, marks the batch failed and `ibv_wr_complete` returns the errno without
//! posting anything of it. `ibv_wr_set_xrc_srqn` names the remote XRC SRQ of the last
//! WR of an XRC initiator QP, which every WR of such a QP needs (EINVAL at
//! `ibv_wr_complete` without it). A memory-window bind or local
//! invalidation (`ibv_wr_bind_mw`, `ibv_wr_local_inv`) is posted in its place in the
//! batch, after the WRs before it ([`crate::mw`]).
//!
//! Inline data (`ibv_wr_set_inline_data`, `ibv_wr_set_inline_data_list`) is copied
//! out of the caller's memory when the setter is called — registered or not, as every
//! provider does — so the buffer may be reused as soon as the setter returns.

use std::ffi::{c_int, c_void};

use verbs_api::{SendFlags, SendWr, Sge, UdAddress, WrOpcode};

use crate::abi::*;
use crate::qp::SoftnicQp;

/// `IBV_QP_EX_WITH_*` operations implemented: RDMA_WRITE, RDMA_WRITE_WITH_IMM, SEND,
/// SEND_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, LOCAL_INV,
/// BIND_MW, SEND_WITH_INV (bits 0–9) and ATOMIC_WRITE (bit 12); not TSO (10) nor
/// FLUSH (11).
pub const SUPPORTED_SEND_OPS: u64 = 0x3ff | IBV_QP_EX_WITH_ATOMIC_WRITE;

/// `IBV_QP_EX_WITH_ATOMIC_WRITE`.
pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

const MAX_SGE: usize = verbs_api::abi::MAX_SGE;
const MAX_INLINE: usize = verbs_api::abi::MAX_INLINE;

/// One WR being built.
#[derive(Clone, Copy)]
struct Pending {
    wr_id: u64,
    flags: u32,
    opcode: WrOpcode,
    sge: [Sge; MAX_SGE],
    nsge: usize,
    ud: Option<UdAddress>,
    /// The remote XRC SRQ (`ibv_wr_set_xrc_srqn`).
    xrc_srqn: Option<u32>,
    /// Inline payload copied by the inline setters (`inline_len` bytes).
    inline: [u8; MAX_INLINE],
    inline_len: usize,
    /// A memory-window bind or invalidation instead of `opcode` ([`crate::mw`]).
    local: Option<crate::mw::LocalWr>,
}

/// The batch between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Default)]
pub struct Batch {
    wrs: Vec<Pending>,
    /// First error of this batch (0: none).
    error: c_int,
}

/// Fills the `wr_*` pointers of a QP created with send-ops flags `_ops`.
pub(crate) fn install(q: &mut ibv_qp_ex, _ops: u64) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_send_tso = Some(wr_send_tso);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_atomic_write = Some(wr_atomic_write);
    q.wr_flush = Some(wr_flush);
}

/// Runs `f` on the QP's batch.
///
/// # Safety
/// `qpx` is the `ibv_qp_ex` of a live [`SoftnicQp`].
unsafe fn with_batch<R>(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut Batch, &ibv_qp_ex) -> R) -> R {
    // SAFETY: `qpx` is the first field of a boxed SoftnicQp (caller contract).
    let q = unsafe { &*(qpx as *const SoftnicQp) };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut b, &q.qpx)
}

/// Starts a new WR with `opcode`.
///
/// # Safety
/// As [`with_batch`].
unsafe fn begin(qpx: *mut ibv_qp_ex, opcode: WrOpcode) {
    // SAFETY: forwarded.
    unsafe {
        with_batch(qpx, |b, q| {
            b.wrs.push(Pending {
                wr_id: q.wr_id,
                flags: q.wr_flags,
                opcode,
                sge: [Sge::default(); MAX_SGE],
                nsge: 0,
                ud: None,
                xrc_srqn: None,
                inline: [0; MAX_INLINE],
                inline_len: 0,
                local: None,
            })
        })
    }
}

/// Marks the batch failed with `e` (the first error wins).
///
/// # Safety
/// As [`with_batch`].
unsafe fn fail(qpx: *mut ibv_qp_ex, e: c_int) {
    // SAFETY: forwarded.
    unsafe {
        with_batch(qpx, |b, _| {
            if b.error == 0 {
                b.error = e;
            }
        })
    }
}

/// Applies `f` to the last WR, or fails the batch with EINVAL if there is none.
///
/// # Safety
/// As [`with_batch`].
unsafe fn last(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut Pending) -> Result<(), c_int>) {
    // SAFETY: forwarded.
    unsafe {
        with_batch(qpx, |b, _| {
            let r = match b.wrs.last_mut() {
                Some(w) => f(w),
                None => Err(libc::EINVAL),
            };
            if let Err(e) = r {
                if b.error == 0 {
                    b.error = e;
                }
            }
        })
    }
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: a QP from this library (rdma-core's inline wrapper passes it through).
    unsafe {
        with_batch(qpx, |b, _| {
            b.wrs.clear();
            b.error = 0;
        })
    }
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: as wr_start.
    unsafe { wr_start(qpx) }
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    // SAFETY: `qpx` is the first field of a boxed SoftnicQp.
    let q = unsafe { &*(qpx as *const SoftnicQp) };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    let result = if b.error != 0 {
        b.error
    } else {
        let mut api = q.api.lock().unwrap_or_else(|e| e.into_inner());
        let filler = SendWr::new(0, WrOpcode::Send, &[]);
        let mut rc = 0;
        // Runs of transport WRs, each ended by a bind or invalidation (or the batch's end).
        'batch: for run in b.wrs.split_inclusive(|p| p.local.is_some()) {
            let (run, local) = match run.split_last() {
                Some((l, head)) if l.local.is_some() => {
                    (head, l.local.map(|w| (l.wr_id, l.flags, w)))
                }
                _ => (run, None),
            };
            for chunk in run.chunks(crate::qp::CHUNK) {
                let mut pieces: [&[u8]; crate::qp::CHUNK] = [&[]; crate::qp::CHUNK];
                for (piece, p) in pieces.iter_mut().zip(chunk) {
                    *piece = &p.inline[..p.inline_len];
                }
                let mut wrs = [filler; crate::qp::CHUNK];
                for ((dst, p), piece) in wrs.iter_mut().zip(chunk).zip(&pieces) {
                    *dst = SendWr {
                        wr_id: p.wr_id,
                        opcode: p.opcode,
                        sg_list: &p.sge[..p.nsge],
                        send_flags: SendFlags(p.flags as u8),
                        ud: p.ud,
                        xrc_srqn: p.xrc_srqn,
                        inline_data: match p.inline_len {
                            0 => &[],
                            _ => std::slice::from_ref(piece),
                        },
                    };
                }
                if let Err(e) = api.post_send(&wrs[..chunk.len()]) {
                    rc = crate::qp::post_errno(&e);
                    break 'batch;
                }
            }
            if let Some(l) = local {
                if let Err(e) = crate::mw::post_local_wr(&mut api, l) {
                    rc = e;
                    break;
                }
            }
        }
        rc
    };
    b.wrs.clear();
    b.error = 0;
    result
}

/// The WR builders: each starts a WR with the opcode its arguments make (`wr_id` and
/// `wr_flags` come from the `ibv_qp_ex` fields).
macro_rules! builders {
    ($($name:ident($($a:ident: $t:ty),*) => $op:expr;)*) => {$(
        unsafe extern "C" fn $name(qpx: *mut ibv_qp_ex, $($a: $t),*) {
            // SAFETY: a QP from this library (rdma-core's inline wrapper passes it
            // through).
            unsafe { begin(qpx, $op) }
        }
    )*};
}

builders! {
    wr_send() => WrOpcode::Send;
    wr_send_imm(imm_be: u32) => WrOpcode::SendWithImm(u32::from_be(imm_be));
    wr_send_inv(rkey: u32) => WrOpcode::SendWithInv(rkey);
    wr_rdma_write(rkey: u32, remote_addr: u64) => WrOpcode::RdmaWrite { remote_addr, rkey };
    wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_be: u32) =>
        WrOpcode::RdmaWriteWithImm { remote_addr, rkey, imm: u32::from_be(imm_be) };
    wr_rdma_read(rkey: u32, remote_addr: u64) => WrOpcode::RdmaRead { remote_addr, rkey };
    wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64) =>
        WrOpcode::AtomicCmpAndSwp { remote_addr, rkey, compare, swap };
    wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64) =>
        WrOpcode::AtomicFetchAndAdd { remote_addr, rkey, add };
}

/// Builders and setters softnic does not support: each fails the batch with
/// EOPNOTSUPP (`ibv_wr_complete` returns it and posts nothing).
macro_rules! unsupported {
    ($($(#[$m:meta])* $name:ident($($t:ty),*);)*) => {$(
        $(#[$m])*
        unsafe extern "C" fn $name(qpx: *mut ibv_qp_ex, $(_: $t),*) {
            // SAFETY: as in `builders!`.
            unsafe { fail(qpx, libc::EOPNOTSUPP) }
        }
    )*};
}

/// Starts a WR that is a memory-window bind or invalidation.
///
/// # Safety
/// As [`with_batch`].
unsafe fn begin_local(qpx: *mut ibv_qp_ex, local: Result<crate::mw::LocalWr, c_int>) {
    match local {
        // SAFETY: forwarded.
        Ok(l) => unsafe {
            begin(qpx, WrOpcode::Send);
            last(qpx, |w| {
                w.local = Some(l);
                Ok(())
            })
        },
        // SAFETY: forwarded.
        Err(e) => unsafe { fail(qpx, e) },
    }
}

/// `ibv_wr_bind_mw`.
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut c_void,
    rkey: u32,
    info: *const c_void,
) {
    // SAFETY: a QP from this library; `mw` from ibv_alloc_mw and `info` a valid
    // `ibv_mw_bind_info` (caller contract).
    unsafe {
        begin_local(
            qpx,
            crate::mw::bind_wr(mw as *mut ibv_mw, rkey, info as *const ibv_mw_bind_info),
        )
    }
}

/// `ibv_wr_local_inv`.
unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: a QP from this library.
    unsafe { begin_local(qpx, Ok(crate::mw::LocalWr::Invalidate { rkey })) }
}

unsupported! {
    wr_send_tso(*mut c_void, u16, u16);
    wr_flush(u32, u64, usize, u8, u8);
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` (read now, as rdma-core's
/// providers copy them into the WQE at this call) are stored at `remote_addr` of the
/// peer's region `rkey`.
///
/// # Safety
/// `qpx` is a QP of this library; `atomic_wr` points at 8 readable bytes (the verbs
/// contract).
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        // SAFETY: a QP from this library.
        return unsafe { fail(qpx, libc::EINVAL) };
    }
    let mut value = [0u8; 8];
    // SAFETY: 8 readable bytes (caller contract); `value` is 8 writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(atomic_wr.cast::<u8>(), value.as_mut_ptr(), 8) };
    let op = WrOpcode::AtomicWrite {
        remote_addr,
        rkey,
        value,
    };
    // SAFETY: a QP from this library.
    unsafe { begin(qpx, op) }
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: as wr_start.
    unsafe {
        last(qpx, |w| {
            w.sge[0] = Sge { addr, length, lkey };
            w.nsge = 1;
            w.inline_len = 0;
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: as wr_start; `sg_list` holds `num_sge` entries (caller contract).
    unsafe {
        last(qpx, |w| {
            if num_sge > MAX_SGE || (num_sge > 0 && sg_list.is_null()) {
                return Err(libc::EINVAL);
            }
            for i in 0..num_sge {
                w.sge[i] = *sg_list.add(i);
            }
            w.nsge = num_sge;
            w.inline_len = 0;
            Ok(())
        })
    }
}

/// `ibv_wr_set_xrc_srqn`: the remote XRC SRQ of the last WR (an XRC initiator QP's;
/// ignored on other types, as their WRs carry no XRCETH).
unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: as wr_start.
    unsafe {
        last(qpx, |w| {
            w.xrc_srqn = Some(remote_srqn);
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: as wr_start; `ah` came from ibv_create_ah (caller contract).
    unsafe {
        last(qpx, |w| {
            if ah.is_null() {
                return Err(libc::EINVAL);
            }
            let (gid, traffic_class) = crate::ah::dest_of(ah);
            w.ud = Some(UdAddress {
                gid,
                udp_port: 0,
                qpn: remote_qpn,
                qkey: remote_qkey,
                traffic_class,
            });
            Ok(())
        })
    }
}

/// Copies the inline payload `bufs` (address, length) into the WR (see the module doc)
/// and sets IBV_SEND_INLINE. More than the slot holds fails with ENOMEM, as mlx5's
/// setter does beyond `max_inline_data`.
///
/// # Safety
/// Each `addr .. addr + length` is readable (the C program vouches for it).
unsafe fn set_inline(
    w: &mut Pending,
    bufs: impl IntoIterator<Item = (u64, usize)>,
) -> Result<(), c_int> {
    let mut at = 0usize;
    for (addr, len) in bufs {
        if len == 0 {
            continue;
        }
        if addr == 0 {
            return Err(libc::EFAULT);
        }
        let dst = w.inline.get_mut(at..at + len).ok_or(libc::ENOMEM)?;
        // SAFETY: caller contract; `dst` is `len` bytes of the WR's own buffer.
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        at += len;
    }
    w.inline_len = at;
    w.nsge = 0;
    w.flags |= crate::qp::IBV_SEND_INLINE;
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: as wr_start; `addr` holds `length` readable bytes (caller contract).
    unsafe { last(qpx, |w| set_inline(w, [(addr as u64, length)])) }
}

/// `struct ibv_data_buf { void *addr; size_t length; }`.
#[repr(C)]
struct DataBuf {
    addr: *mut c_void,
    length: usize,
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    list: *const c_void,
) {
    // SAFETY: as wr_start; `list` holds `num_buf` ibv_data_buf entries (caller contract).
    unsafe {
        last(qpx, |w| {
            if num_buf > 0 && list.is_null() {
                return Err(libc::EINVAL);
            }
            let l = list as *const DataBuf;
            set_inline(
                w,
                (0..num_buf).map(|i| {
                    let d = &*l.add(i);
                    (d.addr as u64, d.length)
                }),
            )
        })
    }
}

/// `ibv_qp_to_qp_ex`: the QP as `ibv_qp_ex` if it was created with send-ops flags,
/// else NULL (as rdma-core answers).
///
/// # Safety
/// `qp` came from `ibv_create_qp` / `ibv_create_qp_ex`.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: caller contract.
    let q = unsafe { crate::qp::softnic_qp(qp) };
    if q.extended {
        qp as *mut ibv_qp_ex
    } else {
        std::ptr::null_mut()
    }
}
