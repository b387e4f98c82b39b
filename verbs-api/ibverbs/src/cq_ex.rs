//! `ibv_create_cq_ex` and the iterator-style poll API of `struct ibv_cq_ex`
//! (`ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`).
//!
//! A CQ made here is an ordinary softnic CQ ([`crate::objects`]) whose `ibv_cq_ex`
//! function pointers are set: `start_poll`/`next_poll` take one completion from the
//! shared ring (no syscall) and keep it as the current one, which the `read_*`
//! functions return fields of. Offered: the standard fields (`IBV_WC_STANDARD_FLAGS`:
//! byte_len, imm, qp_num, src_qp, slid, sl, dlid_path_bits) and completion timestamps
//! (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: the NIC's `CLOCK_MONOTONIC` nanoseconds when it
//! wrote the completion, so `hca_core_clock` is 1 GHz; `…_WALLCLOCK`: the same instant in
//! `CLOCK_REALTIME` nanoseconds); CVLAN, flow tag and tag matching are EOPNOTSUPP at
//! creation. A parent domain (`IBV_CQ_INIT_ATTR_MASK_PD`) is accepted, as mlx5 takes
//! one for its allocators; softnic's CQ ring is memory the NIC maps, so the allocators
//! are not called (`crate::parent_domain`).

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::errno;
use crate::objects::{create_cq, to_ibv_wc, SoftnicCq};

/// `IBV_WC_STANDARD_FLAGS`, `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` and
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
const OFFERED_WC_FLAGS: u64 = 0x7f | (1 << 7) | (1 << 11);
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
const MASK_FLAGS: u32 = 1 << 0;
/// `IBV_CQ_INIT_ATTR_MASK_PD`.
const MASK_PD: u32 = 1 << 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (a hint; the CQ is thread-safe anyway).
const SINGLE_THREADED: u32 = 1 << 0;

/// The `create_cq_ex` op behind the inline `ibv_create_cq_ex`.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is a valid `ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn create_cq_ex_op(
    context: *mut ibv_context,
    attr: *mut c_void,
) -> *mut c_void {
    if attr.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let a = unsafe { &*(attr as *const ibv_cq_init_attr_ex) };
    if a.wc_flags & !OFFERED_WC_FLAGS != 0
        || a.comp_mask & !(MASK_FLAGS | MASK_PD) != 0
        || (a.comp_mask & MASK_FLAGS != 0 && a.flags & !SINGLE_THREADED != 0)
    {
        return errno::null(libc::EOPNOTSUPP);
    }
    // A parent domain of this context (mlx5: EINVAL for a NULL one or a plain PD).
    if a.comp_mask & MASK_PD != 0 {
        let pd = a.parent_domain;
        // SAFETY: NULL or the program's live PD or parent domain (caller contract).
        let ok = !pd.is_null()
            && unsafe { (*pd).context == context && crate::parent_domain::is_parent_domain(pd) };
        if !ok {
            return errno::null(libc::EINVAL);
        }
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else {
        return errno::null(libc::EINVAL);
    };
    let Ok(vector) = c_int::try_from(a.comp_vector) else {
        return errno::null(libc::EINVAL);
    };
    // SAFETY: forwarded caller contract.
    unsafe { create_cq(context, cqe, a.cq_context, a.channel, vector, true) as *mut c_void }
}

/// Fills the poll API of a CQ made by [`create_cq_ex_op`].
pub(crate) fn install(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_u8_zero);
    c.read_dlid_path_bits = Some(read_u8_zero);
    c.read_completion_ts = Some(read_completion_ts);
    c.read_cvlan = Some(read_cvlan);
    c.read_flow_tag = Some(read_slid);
    c.read_tm_info = Some(read_tm_info);
    c.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
}

/// Takes the next completion into `current`; 0, ENOENT when the CQ is empty, or EIO.
///
/// # Safety
/// `cq` is the `ibv_cq_ex` of a live [`SoftnicCq`].
unsafe fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: `cq` is the first field of a boxed SoftnicCq (caller contract).
    let c = unsafe { &*(cq as *const SoftnicCq) };
    let mut one = [verbs_api::WorkCompletion::default()];
    let n = match c
        .api
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .poll(&mut one)
    {
        Ok(n) => n,
        Err(_) => return libc::EIO,
    };
    if n == 0 {
        return libc::ENOENT;
    }
    *c.current.lock().unwrap_or_else(|e| e.into_inner()) = one[0];
    // SAFETY: the public fields of the caller's CQ.
    unsafe {
        (*cq).wr_id = one[0].wr_id;
        (*cq).status = one[0].status.raw() as c_int;
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut c_void) -> c_int {
    // `struct ibv_poll_cq_attr { uint32_t comp_mask; }`: no extension is known.
    // SAFETY: a non-NULL attr points at that struct (caller contract).
    if !attr.is_null() && unsafe { *(attr as *const u32) } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: a CQ from create_cq_ex_op (the inline wrapper passes it through).
    let rc = unsafe { advance(cq) };
    // SAFETY: as above.
    unsafe { &*(cq as *const SoftnicCq) }.note_poll(rc != libc::ENOENT);
    rc
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: as start_poll.
    unsafe { advance(cq) }
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The current completion.
///
/// # Safety
/// As [`advance`].
unsafe fn current_wc(cq: *mut ibv_cq_ex) -> verbs_api::WorkCompletion {
    // SAFETY: caller contract.
    let c = unsafe { &*(cq as *const SoftnicCq) };
    *c.current.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current completion as `ibv_wc`.
///
/// # Safety
/// As [`advance`].
unsafe fn current(cq: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: caller contract.
    to_ibv_wc(&unsafe { current_wc(cq) })
}

/// `read_completion_ts`: `CLOCK_MONOTONIC` nanoseconds when the NIC wrote the
/// completion (`hca_core_clock` 1,000,000 kHz: one tick per nanosecond).
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: as start_poll.
    unsafe { current_wc(cq) }.timestamp
}

/// `read_completion_wallclock_ns`: the same instant in `CLOCK_REALTIME` nanoseconds,
/// through the two clocks' offset read now (a clock step between the completion and
/// this read moves it by as much).
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: as start_poll.
    let ts = unsafe { current_wc(cq) }.timestamp;
    let (real, mono) = (verbs_api::os::realtime_ns(), verbs_api::os::monotonic_ns());
    real.saturating_sub(mono.saturating_sub(ts))
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.byte_len
}

unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.imm_data
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.src_qp
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: as start_poll.
    unsafe { current(cq) }.wc_flags
}

/// `read_slid` and `read_flow_tag`: 0 (RoCE has no LIDs; no flow tags).
unsafe extern "C" fn read_slid(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// `read_sl`, `read_dlid_path_bits`: 0.
unsafe extern "C" fn read_u8_zero(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

unsafe extern "C" fn read_cvlan(_cq: *mut ibv_cq_ex) -> u16 {
    0
}

/// `read_tm_info`: zeroes `struct ibv_wc_tm_info` (u64 tag, u32 priv; 16 bytes).
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut c_void) {
    if !info.is_null() {
        // SAFETY: the caller's ibv_wc_tm_info.
        unsafe { std::ptr::write_bytes(info as *mut u8, 0, 16) };
    }
}
