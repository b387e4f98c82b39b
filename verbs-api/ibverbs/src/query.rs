//! Attribute queries: `ibv_query_device(_ex)`, `ibv_query_port` (exported and as the
//! `query_port` op), GIDs, GID types and P_Keys.
//!
//! The device as programs see it: node type CA, transport InfiniBand, link layer
//! Ethernet (RoCE), one port, ACTIVE; vendor id 0xFFFFFF ("no IEEE OUI", rxe's choice)
//! with part id 0, so perftest (which switches on `vendor_part_id` for any vendor it
//! does not know) takes its generic path; GIDs in rxe's layout ([`verbs_api::gid`]),
//! both RoCE v2. Answers come from the attributes the NIC sent at open (no round trip).

use std::ffi::{c_int, c_uint, c_void};

use verbs_api::gid::{GID_TABLE_CAPACITY, GID_TABLE_LEN};

use crate::abi::*;
use crate::device::softnic_context;
use crate::errno;

/// `vendor_id`: 0xFFFFFF, the "no IEEE OUI" value rxe also reports.
pub const VENDOR_ID: u32 = 0x00ff_ffff;
/// `vendor_part_id`.
pub const VENDOR_PART_ID: u32 = 0;
/// The only port.
const PORT: u8 = 1;
/// The default P_Key (full member of the default partition), the only table entry.
const DEFAULT_PKEY: u16 = 0xffff;
/// Largest buffer this library zeroes for a caller-declared struct size (far above any
/// rdma-core struct; a larger size is a caller bug, not a bigger struct).
const MAX_ATTR_SIZE: usize = 4096;

/// `enum ibv_mtu` for a path MTU in bytes.
fn mtu_enum(bytes: u32) -> c_int {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// `device_cap_flags`: what softnic does of `enum ibv_device_cap_flags`, and nothing
/// it does only in part (a program tests these before it uses a feature; pyverbs skips
/// tests by them): the system image GUID it reports, the RNR NAKs it generates (IBTA
/// 9.7.5.2.8), memory windows (`ibv_alloc_mw`, IBTA 10.6.7) of type 1 and type 2B
/// (a type 2 window answers only the QP it was bound on, as rxe's, which sets the same
/// flag; `softnic/src/nic/mw.rs`), and XRC (`crate::xrc`: every NIC that accepts this
/// library's ABI version has it, so the flag needs no attribute of the NIC's). Not
/// type 2A; nor the memory management extensions (no fast registration, no zero-based
/// windows), resizing a QP's or SRQ's work queue, port events, checksum offloads, flow
/// steering.
const DEVICE_CAP_FLAGS: c_uint = IBV_DEVICE_SYS_IMAGE_GUID
    | IBV_DEVICE_RC_RNR_NAK_GEN
    | IBV_DEVICE_MEM_WINDOW
    | IBV_DEVICE_XRC
    | IBV_DEVICE_MEM_WINDOW_TYPE_2B;

/// The classic device attributes of an open context.
pub fn device_attr(ctx: &crate::device::SoftnicContext) -> ibv_device_attr {
    let a = &ctx.attr;
    let clamp = |v: u32| v.min(c_int::MAX as u32) as c_int;
    // SAFETY: plain data; all-zero is valid (unsupported features report 0).
    let mut d: ibv_device_attr = unsafe { std::mem::zeroed() };
    let fw = concat!("softnic ", env!("CARGO_PKG_VERSION"));
    for (dst, b) in d.fw_ver.iter_mut().zip(fw.as_bytes()) {
        *dst = *b as std::ffi::c_char;
    }
    d.node_guid = ctx.guid.to_be();
    d.sys_image_guid = ctx.guid.to_be();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = 0xffff_f000;
    d.vendor_id = VENDOR_ID;
    d.vendor_part_id = VENDOR_PART_ID;
    d.max_qp = clamp(a.max_qp);
    d.max_qp_wr = clamp(a.max_qp_wr);
    d.max_sge = clamp(a.max_sge);
    d.max_sge_rd = clamp(a.max_sge);
    // The NIC's per-client CQ and PD limits equal its QP limit; DeviceAttr does not
    // carry them separately.
    d.max_cq = clamp(a.max_qp);
    d.max_pd = clamp(a.max_qp);
    d.max_cqe = clamp(a.max_cqe);
    d.max_mr = clamp(a.max_mr);
    d.max_mw = clamp(verbs_api::mw::MAX_MW);
    d.max_qp_rd_atom = clamp(a.max_qp_rd_atom);
    d.max_qp_init_rd_atom = clamp(a.max_qp_rd_atom);
    d.max_res_rd_atom = clamp(a.max_qp_rd_atom.saturating_mul(a.max_qp));
    d.atomic_cap = IBV_ATOMIC_HCA;
    d.device_cap_flags = DEVICE_CAP_FLAGS;
    // SRQs count against the QP quota (`take_srq_quota`); each is a ring like a
    // receive queue's, of up to MAX_SGE scatter entries per WQE.
    d.max_srq = clamp(a.max_qp);
    d.max_srq_wr = clamp(a.max_qp_wr);
    d.max_srq_sge = clamp(verbs_api::abi::MAX_SGE as u32);
    // An address handle is this library's own small allocation (a GID), nothing in
    // the NIC: no limit but memory, reported as mlx5 does.
    d.max_ah = c_int::MAX;
    d.max_pkeys = 1;
    d.phys_port_cnt = 1;
    // UD multicast (`ibv_attach_mcast`): per NIC, each group a socket of the NIC's.
    d.max_mcast_grp = clamp(verbs_api::abi::MAX_MCAST_GRP);
    d.max_mcast_qp_attach = clamp(verbs_api::abi::MAX_MCAST_QP_ATTACH);
    d.max_total_mcast_qp_attach =
        clamp(verbs_api::abi::MAX_MCAST_GRP * verbs_api::abi::MAX_MCAST_QP_ATTACH);
    d
}

/// The attributes of port 1.
pub fn port_attr(ctx: &crate::device::SoftnicContext) -> ibv_port_attr {
    // SAFETY: plain data; all-zero is valid.
    let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = mtu_enum(ctx.attr.mtu);
    p.active_mtu = mtu_enum(ctx.attr.mtu);
    p.gid_tbl_len = GID_TABLE_CAPACITY as c_int;
    // What a connected QP carries at every path MTU (the NIC says; 2^31 - 256).
    p.max_msg_sz = ctx.attr.max_msg_sz;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 1;
    p.active_speed = 1;
    p.phys_state = 5; // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    p
}

/// Zeroes `len` bytes at `dst` (capped) and copies `src` over the start of it.
///
/// # Safety
/// `dst` is writable for `len` bytes.
unsafe fn write_sized<T>(dst: *mut c_void, len: usize, src: &T) {
    let len = len.min(MAX_ATTR_SIZE);
    let n = len.min(std::mem::size_of::<T>());
    // SAFETY: caller guarantees len writable bytes; n <= len and n <= size_of::<T>().
    unsafe {
        std::ptr::write_bytes(dst as *mut u8, 0, len);
        std::ptr::copy_nonoverlapping(src as *const T as *const u8, dst as *mut u8, n);
    }
}

/// `ibv_query_device`.
///
/// # Safety
/// `context` came from `ibv_open_device`; `attr` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    if context.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    // SAFETY: attr points at a caller-owned ibv_device_attr.
    unsafe { attr.write(device_attr(ctx)) };
    0
}

/// The `query_device_ex` op behind the inline `ibv_query_device_ex`: writes
/// `orig_attr`, `comp_mask` = 0, `phys_port_cnt_ex` = 1 and zeroes every extended
/// capability (ODP, TSO, RSS, …: not supported) up to the caller's `attr_size`.
///
/// # Safety
/// `attr` is writable for `attr_size` bytes; `input` is NULL or readable.
pub unsafe extern "C" fn query_device_ex_op(
    context: *mut ibv_context,
    input: *const c_void,
    attr: *mut c_void,
    attr_size: usize,
) -> c_int {
    if context.is_null() || attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    // `struct ibv_query_device_ex_input { uint32_t comp_mask; }`: no extension is known.
    // SAFETY: a non-NULL input points at that struct (caller contract).
    if !input.is_null() && unsafe { *(input as *const u32) } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    let orig_attr = device_attr(ctx);
    let ex = ibv_device_attr_ex {
        phys_port_cnt_ex: u32::from(orig_attr.phys_port_cnt),
        orig_attr,
        comp_mask: 0,
        odp_caps: ibv_odp_caps {
            general_caps: crate::odp::GENERAL_CAPS,
            rc_odp_caps: crate::odp::RC_CAPS,
            uc_odp_caps: crate::odp::UC_CAPS,
            ud_odp_caps: crate::odp::UD_CAPS,
        },
        completion_timestamp_mask: u64::MAX,
        hca_core_clock: 1_000_000,
        unsupported_caps: [0; 96],
        max_dm_size: crate::dm::MAX_DM_SIZE,
        pci_atomic_caps: [0; 8],
        xrc_odp_caps: crate::odp::XRC_CAPS,
    };
    // SAFETY: attr writable for attr_size bytes (caller contract).
    unsafe { write_sized(attr, attr_size, &ex) };
    0
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
const VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

/// The `query_rt_values` op behind the inline `ibv_query_rt_values_ex`: the completion
/// clock now (`CLOCK_MONOTONIC`, the clock of `ibv_wc_read_completion_ts`) as
/// `raw_clock`. EINVAL for other bits in `comp_mask`.
///
/// # Safety
/// `values` is a valid `ibv_values_ex`.
pub unsafe extern "C" fn query_rt_values_op(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    if context.is_null() || values.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let v = unsafe { &mut *values };
    if v.comp_mask & !VALUES_MASK_RAW_CLOCK != 0 {
        return libc::EINVAL;
    }
    if v.comp_mask & VALUES_MASK_RAW_CLOCK != 0 {
        let ns = verbs_api::os::monotonic_ns();
        v.raw_clock = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
    }
    0
}

/// The `query_port` op behind the inline `ibv_query_port`: writes at most
/// `port_attr_len` bytes (the caller's `sizeof(struct ibv_port_attr)`), zeroing fields
/// newer than v44's.
///
/// # Safety
/// `port_attr` is writable for `port_attr_len` bytes.
pub unsafe extern "C" fn query_port_op(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut c_void,
    port_attr_len: usize,
) -> c_int {
    if context.is_null() || port_attr.is_null() || port_num != PORT {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    // SAFETY: port_attr writable for port_attr_len bytes (caller contract).
    unsafe { write_sized(port_attr, port_attr_len, &self::port_attr(ctx)) };
    0
}

/// `ibv_query_port@IBVERBS_1.1`, called by binaries whose inline wrapper found no
/// `query_port` op (not ours) or that call the symbol directly: the buffer may be only
/// rdma-core's `struct _compat_ibv_port_attr`, so exactly
/// [`COMPAT_PORT_ATTR_SIZE`] bytes are written.
///
/// # Safety
/// `port_attr` is writable for [`COMPAT_PORT_ATTR_SIZE`] bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut c_void,
) -> c_int {
    // SAFETY: forwarded caller contract, with the compat size.
    unsafe { query_port_op(context, port_num, port_attr, COMPAT_PORT_ATTR_SIZE) }
}

/// GID-table entry `index` of port `port`, or the errno rdma-core gives: ENODATA for
/// an empty entry (below `gid_tbl_len`, past the populated ones), EINVAL beyond.
fn gid_entry(
    ctx: &crate::device::SoftnicContext,
    port: u32,
    index: u32,
) -> Result<ibv_gid_entry, c_int> {
    if port != u32::from(PORT) || index >= GID_TABLE_CAPACITY {
        return Err(libc::EINVAL);
    }
    if index >= GID_TABLE_LEN {
        return Err(libc::ENODATA);
    }
    let gid = verbs_api::device::gid_at(&ctx.attr, index).map_err(|_| libc::EINVAL)?;
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: gid.0 },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

/// `ibv_query_gid`: 0, or -1 for a bad port or index (as rdma-core). An empty entry is
/// 0 with an all-zero GID, as rdma-core's `ibv_query_gid` turns ENODATA into
/// ("preserve API behavior for empty GID").
///
/// # Safety
/// `gid` is writable for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    if context.is_null() || gid.is_null() || index < 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    match gid_entry(ctx, port_num.into(), index as u32) {
        Ok(e) => {
            // SAFETY: gid writable (caller contract).
            unsafe { gid.write(e.gid.raw) };
            0
        }
        Err(libc::ENODATA) => {
            // SAFETY: gid writable (caller contract).
            unsafe { gid.write([0; 16]) };
            0
        }
        Err(e) => {
            errno::set(e);
            -1
        }
    }
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0 or an errno value.
///
/// # Safety
/// `entry` is writable for `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut c_void,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if context.is_null()
        || entry.is_null()
        || flags != 0
        || entry_size < std::mem::size_of::<ibv_gid_entry>()
    {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    match gid_entry(ctx, port_num, gid_index) {
        Ok(e) => {
            // SAFETY: entry writable for entry_size bytes (caller contract).
            unsafe { write_sized(entry, entry_size, &e) };
            0
        }
        Err(e) => e,
    }
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`): every populated
/// GID of every port, the count, or a negative errno (EINVAL when `max_entries` is too
/// small for the populated entries, as the kernel's `rdma_query_gid_table`).
///
/// # Safety
/// `entries` is writable for `max_entries * entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut c_void,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if context.is_null()
        || flags != 0
        || entry_size < std::mem::size_of::<ibv_gid_entry>()
        || max_entries < GID_TABLE_LEN as usize
        || entries.is_null()
    {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    for i in 0..GID_TABLE_LEN {
        let e = match gid_entry(ctx, PORT.into(), i) {
            Ok(e) => e,
            Err(e) => return -(e as isize),
        };
        // SAFETY: i < max_entries slots of entry_size bytes each (checked above).
        unsafe {
            write_sized(
                (entries as *mut u8).add(i as usize * entry_size).cast(),
                entry_size,
                &e,
            )
        };
    }
    GID_TABLE_LEN as isize
}

/// `ibv_query_gid_type` (`IBVERBS_PRIVATE_34`, imported by `ibv_devinfo`): every GID
/// is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`).
///
/// # Safety
/// `gid_type` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    if context.is_null() || gid_type.is_null() {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    match gid_entry(ctx, port_num.into(), index) {
        Ok(_) => {
            // SAFETY: caller contract.
            unsafe { gid_type.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
            0
        }
        // rdma-core answers an empty entry with RoCE v1 (`IBV_GID_TYPE_SYSFS_IB_ROCE_V1`, 0).
        Err(libc::ENODATA) => {
            // SAFETY: caller contract.
            unsafe { gid_type.write(0) };
            0
        }
        Err(e) => {
            errno::set(e);
            -1
        }
    }
}

/// `ibv_query_pkey`: index 0 is the default P_Key 0xFFFF (network order); anything
/// else is -1, as rdma-core answers for a missing table entry.
///
/// # Safety
/// `pkey` is writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if context.is_null() || pkey.is_null() || port_num != PORT || index != 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract.
    unsafe { pkey.write(DEFAULT_PKEY.to_be()) };
    0
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order) in the P_Key table, or -1.
///
/// # Safety
/// `context` came from `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    if context.is_null() || port_num != PORT || u16::from_be(pkey) != DEFAULT_PKEY {
        errno::set(libc::EINVAL);
        return -1;
    }
    0
}
