//! `#[repr(C)]` mirrors of the rdma-core structs this library allocates or fills, as
//! `<infiniband/verbs.h>` (rdma-core v44, Debian 12) lays them out on x86_64.
//!
//! Every field here is checked against the real header by `tests/layout.rs`, which
//! turns [`layout_table`] into `_Static_assert(offsetof(...) == ...)` lines and compiles
//! them with the system C compiler. Names are the C names, so that table reads 1:1.
//!
//! Growth rules rdma-core relies on (and this library follows):
//! * `struct verbs_context` "grows up": new ops are *prepended*, so an op's distance to
//!   the embedded `struct ibv_context` never changes. [`verbs_context`] starts with
//!   [`NEWER_OPS`] always-NULL slots, so binaries built against newer headers find NULL
//!   (rdma-core's inline wrappers then answer EOPNOTSUPP) instead of reading before our
//!   allocation; `sz` covers them.
//! * `ibv_query_port` and `ibv_query_device_ex` pass the caller's struct size; this
//!   library writes what it knows and zeroes the rest of the caller's buffer.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// An op slot this library leaves NULL (its signature does not matter, only its size).
pub type OpaqueOp = Option<unsafe extern "C" fn()>;

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub struct ibv_device {
    /// `struct _ibv_device_ops` (two obsolete pointers, must be NULL).
    pub _ops: [*mut c_void; 2],
    /// `enum ibv_node_type`.
    pub node_type: c_int,
    /// `enum ibv_transport_type`.
    pub transport_type: c_int,
    /// Device name, NUL-terminated.
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs device name (`uverbsN` on a kernel device).
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// sysfs path of the uverbs device.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// sysfs path of the IB device.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `struct ibv_context_ops` (256 bytes). Only the slots rdma-core's inline wrappers
/// call directly carry real signatures.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device` (pre-2006 binaries only).
    pub _compat_query_device: OpaqueOp,
    /// `_compat_query_port`.
    pub _compat_query_port: OpaqueOp,
    /// `_compat_alloc_pd` … `_compat_dereg_mr`.
    pub _compat_pd_mr: [OpaqueOp; 5],
    /// `alloc_mw` (inline `ibv_alloc_mw`).
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw>,
    /// `bind_mw` (inline `ibv_bind_mw`).
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    /// `dealloc_mw` (inline `ibv_dealloc_mw`).
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    /// `_compat_create_cq`.
    pub _compat_create_cq: OpaqueOp,
    /// `poll_cq` (inline `ibv_poll_cq`).
    pub poll_cq: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int>,
    /// `req_notify_cq` (inline `ibv_req_notify_cq`).
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    /// `_compat_cq_event` … `_compat_destroy_srq`.
    pub _compat_cq_srq: [OpaqueOp; 7],
    /// `post_srq_recv` (inline `ibv_post_srq_recv`).
    pub post_srq_recv:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int>,
    /// `_compat_create_qp` … `_compat_destroy_qp`.
    pub _compat_qp: [OpaqueOp; 4],
    /// `post_send` (inline `ibv_post_send`).
    pub post_send:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int>,
    /// `post_recv` (inline `ibv_post_recv`).
    pub post_recv:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int>,
    /// `_compat_create_ah` … `_compat_async_event`.
    pub _compat_tail: [OpaqueOp; 5],
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub struct ibv_context {
    /// The device this context was opened on.
    pub device: *mut ibv_device,
    /// Data-path ops called by the inline wrappers.
    pub ops: ibv_context_ops,
    /// Command fd (a kernel uverbs fd on rdma-core; here a dup of the control socket).
    pub cmd_fd: c_int,
    /// Async event fd (pollable).
    pub async_fd: c_int,
    /// Completion vectors (≥ 1; perftest checks it).
    pub num_comp_vectors: c_int,
    /// Context mutex (initialised, unused by this library).
    pub mutex: libc::pthread_mutex_t,
    /// `__VERBS_ABI_IS_EXTENDED` (`UINTPTR_MAX`): tells `verbs_get_ctx` that a
    /// `verbs_context` surrounds this struct.
    pub abi_compat: *mut c_void,
}

/// `query_port` op: `(ctx, port, attr, attr_len)`.
pub type QueryPortFn = unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void, usize) -> c_int;
/// `struct ibv_dm` (32 bytes).
#[repr(C)]
pub struct ibv_dm {
    /// The context it was allocated on.
    pub context: *mut ibv_context,
    /// `ibv_memcpy_to_dm` calls it.
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
    /// `ibv_memcpy_from_dm` calls it.
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
    /// No extension.
    pub comp_mask: u32,
    /// A number of this process's.
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr` (16 bytes).
#[repr(C)]
pub struct ibv_alloc_dm_attr {
    /// Bytes.
    pub length: usize,
    /// log2 of the alignment asked for.
    pub log_align_req: u32,
    /// No extension is known.
    pub comp_mask: u32,
}

/// `struct ibv_td_init_attr` (4 bytes).
#[repr(C)]
pub struct ibv_td_init_attr {
    /// No extension is known.
    pub comp_mask: u32,
}

/// `struct ibv_td` (8 bytes): a thread domain.
#[repr(C)]
pub struct ibv_td {
    /// Its device context.
    pub context: *mut ibv_context,
}

/// `struct ibv_parent_domain_init_attr` (48 bytes).
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    /// The protection domain (not NULL).
    pub pd: *mut ibv_pd,
    /// A thread domain, or NULL.
    pub td: *mut ibv_td,
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `…_PD_CONTEXT`.
    pub comp_mask: u32,
    /// The program's allocator for provider buffers.
    pub alloc:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void>,
    /// Its counterpart.
    pub free: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64)>,
    /// Passed to `alloc` and `free`.
    pub pd_context: *mut c_void,
}

/// `struct ibv_xrcd` (8 bytes): an XRC domain as the program sees it.
#[repr(C)]
pub struct ibv_xrcd {
    /// The context it was opened on.
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_xrcd_init_attr {
    /// `IBV_XRCD_INIT_ATTR_FD`, `IBV_XRCD_INIT_ATTR_OFLAGS` (both required).
    pub comp_mask: u32,
    /// The file naming a shared domain, or −1 for a domain of its own.
    pub fd: c_int,
    /// `O_CREAT`, `O_EXCL`.
    pub oflags: c_int,
}

/// `open_xrcd` op.
pub type OpenXrcdFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
/// `close_xrcd` op.
pub type CloseXrcdFn = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;
/// `create_srq_ex` op.
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
/// `get_srq_num` op.
pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;

/// `alloc_td` op.
pub type AllocTdFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td;
/// `dealloc_td` op.
pub type DeallocTdFn = unsafe extern "C" fn(*mut ibv_td) -> c_int;
/// `alloc_parent_domain` op.
pub type AllocParentDomainFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;

/// `alloc_dm` op.
pub type AllocDmFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
/// `free_dm` op.
pub type FreeDmFn = unsafe extern "C" fn(*mut ibv_dm) -> c_int;
/// `reg_dm_mr` op: `(pd, dm, dm_offset, length, access)`.
pub type RegDmMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, std::ffi::c_uint) -> *mut ibv_mr;

/// `struct ibv_values_ex` (24 bytes).
#[repr(C)]
pub struct ibv_values_ex {
    /// In: the values asked for (`IBV_VALUES_MASK_RAW_CLOCK`); out: those filled.
    pub comp_mask: u32,
    /// The device clock now.
    pub raw_clock: libc::timespec,
}

/// `query_rt_values` op: `(ctx, values)`.
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;

/// `advise_mr` op: `(pd, advice, flags, sg_list, num_sge)`.
pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, c_int, u32, *mut ibv_sge, u32) -> c_int;
/// `query_device_ex` op: `(ctx, input, attr, attr_size)`.
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut c_void, usize) -> c_int;

/// Always-NULL op slots in front of v44's first op, for binaries built against newer
/// headers (rdma-core HEAD prepends 6 more; 16 leaves room).
pub const NEWER_OPS: usize = 16;

/// `struct verbs_context` as v44 lays it out, preceded by [`NEWER_OPS`] NULL slots.
/// The C test checks each op's distance to `context` (not its offset from the start,
/// which differs between header versions by design).
#[repr(C)]
pub struct verbs_context {
    /// Ops of rdma-core releases newer than v44: always NULL.
    pub newer_ops: [OpaqueOp; NEWER_OPS],
    /// `query_port` (the inline `ibv_query_port` calls it with `sizeof(*attr)`).
    pub query_port: Option<QueryPortFn>,
    /// `advise_mr` (`crate::odp::advise_mr_op`).
    pub advise_mr: Option<AdviseMrFn>,
    /// `alloc_null_mr`.
    pub alloc_null_mr: OpaqueOp,
    /// `read_counters`.
    pub read_counters: OpaqueOp,
    /// `attach_counters_point_flow`.
    pub attach_counters_point_flow: OpaqueOp,
    /// `create_counters`.
    pub create_counters: OpaqueOp,
    /// `destroy_counters`.
    pub destroy_counters: OpaqueOp,
    /// `reg_dm_mr` (`crate::dm::reg_dm_mr_op`).
    pub reg_dm_mr: Option<RegDmMrFn>,
    /// `alloc_dm` (`crate::dm::alloc_dm_op`).
    pub alloc_dm: Option<AllocDmFn>,
    /// `free_dm` (`crate::dm::free_dm_op`).
    pub free_dm: Option<FreeDmFn>,
    /// `modify_flow_action_esp`.
    pub modify_flow_action_esp: OpaqueOp,
    /// `destroy_flow_action`.
    pub destroy_flow_action: OpaqueOp,
    /// `create_flow_action_esp`.
    pub create_flow_action_esp: OpaqueOp,
    /// `modify_qp_rate_limit`.
    pub modify_qp_rate_limit: OpaqueOp,
    /// `alloc_parent_domain` (`crate::parent_domain::alloc_parent_domain_op`).
    pub alloc_parent_domain: Option<AllocParentDomainFn>,
    /// `dealloc_td` (`crate::parent_domain::dealloc_td_op`).
    pub dealloc_td: Option<DeallocTdFn>,
    /// `alloc_td` (`crate::parent_domain::alloc_td_op`).
    pub alloc_td: Option<AllocTdFn>,
    /// `modify_cq`.
    pub modify_cq: OpaqueOp,
    /// `post_srq_ops`.
    pub post_srq_ops: OpaqueOp,
    /// `destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table: OpaqueOp,
    /// `create_rwq_ind_table`.
    pub create_rwq_ind_table: OpaqueOp,
    /// `destroy_wq`.
    pub destroy_wq: OpaqueOp,
    /// `modify_wq`.
    pub modify_wq: OpaqueOp,
    /// `create_wq`.
    pub create_wq: OpaqueOp,
    /// `query_rt_values` (`crate::query::query_rt_values_op`).
    pub query_rt_values: Option<QueryRtValuesFn>,
    /// `create_cq_ex` (the inline `ibv_create_cq_ex`).
    pub create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut c_void>,
    /// `priv` (rdma-core's private data; unused here).
    pub priv_: *mut c_void,
    /// `query_device_ex`.
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: OpaqueOp,
    /// `ABI_placeholder2` (rdma-core sets it equal to `ibv_destroy_flow`).
    pub abi_placeholder2: OpaqueOp,
    /// `ibv_create_flow`.
    pub ibv_create_flow: OpaqueOp,
    /// `ABI_placeholder1` (equal to `ibv_create_flow`).
    pub abi_placeholder1: OpaqueOp,
    /// `open_qp`.
    pub open_qp: OpaqueOp,
    /// `create_qp_ex` (the inline `ibv_create_qp_ex` calls it unless only
    /// `IBV_QP_INIT_ATTR_PD` is set).
    pub create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut c_void>,
    /// `get_srq_num` (`crate::xrc::get_srq_num_op`).
    pub get_srq_num: Option<GetSrqNumFn>,
    /// `create_srq_ex` (`crate::xrc::create_srq_ex_op`; the inline wrapper calls
    /// `ibv_create_srq` itself for a basic SRQ with only `PD` and `TYPE` in the mask).
    pub create_srq_ex: Option<CreateSrqExFn>,
    /// `open_xrcd` (`crate::xrc::open_xrcd_op`).
    pub open_xrcd: Option<OpenXrcdFn>,
    /// `close_xrcd` (`crate::xrc::close_xrcd_op`).
    pub close_xrcd: Option<CloseXrcdFn>,
    /// `_ABI_placeholder3`.
    pub abi_placeholder3: u64,
    /// Bytes from the first op slot to the end of `context`: `verbs_get_ctx_op`
    /// requires `sz >= sizeof(verbs_context) - offsetof(op)` of the caller's header.
    pub sz: usize,
    /// The public context; must be last.
    pub context: ibv_context,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID, network order.
    pub node_guid: u64,
    /// System image GUID, network order.
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: c_int,
    /// Most WRs per queue.
    pub max_qp_wr: c_int,
    /// `enum ibv_device_cap_flags`.
    pub device_cap_flags: c_uint,
    /// Most SGEs per WR.
    pub max_sge: c_int,
    /// Most SGEs per RDMA READ.
    pub max_sge_rd: c_int,
    /// Most CQs.
    pub max_cq: c_int,
    /// Most CQEs per CQ.
    pub max_cqe: c_int,
    /// Most MRs.
    pub max_mr: c_int,
    /// Most PDs.
    pub max_pd: c_int,
    /// Most outstanding READ/atomic per QP (as target).
    pub max_qp_rd_atom: c_int,
    /// EE equivalent (RD; 0).
    pub max_ee_rd_atom: c_int,
    /// Total READ/atomic resources.
    pub max_res_rd_atom: c_int,
    /// Most outstanding READ/atomic per QP (as initiator).
    pub max_qp_init_rd_atom: c_int,
    /// EE equivalent (0).
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: c_int,
    /// Most EE contexts (0).
    pub max_ee: c_int,
    /// Most RDDs (0).
    pub max_rdd: c_int,
    /// Most memory windows.
    pub max_mw: c_int,
    /// Raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Multicast groups.
    pub max_mcast_grp: c_int,
    /// QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Total multicast attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// Most AHs.
    pub max_ah: c_int,
    /// Most FMRs.
    pub max_fmr: c_int,
    /// Maps per FMR.
    pub max_map_per_fmr: c_int,
    /// Most SRQs.
    pub max_srq: c_int,
    /// Most WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Most SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// P_Key table length.
    pub max_pkeys: u16,
    /// Local CA ACK delay (4.096 µs × 2^n).
    pub local_ca_ack_delay: u8,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_odp_caps` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    /// `IBV_ODP_SUPPORT`, `IBV_ODP_SUPPORT_IMPLICIT`.
    pub general_caps: u64,
    /// `per_transport_caps.rc_odp_caps` (`IBV_ODP_SUPPORT_SEND` …).
    pub rc_odp_caps: u32,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc_odp_caps: u32,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud_odp_caps: u32,
}

/// `struct ibv_device_attr_ex` as v44 defines it (400 bytes): this library fills
/// `orig_attr`, `comp_mask`, `odp_caps`, the completion clock and `phys_port_cnt_ex`;
/// the capabilities after the clock (TSO, RSS, … : not supported) are zero, and
/// anything a newer caller's larger `attr_size` covers is zeroed too.
#[repr(C)]
pub struct ibv_device_attr_ex {
    /// The classic attributes.
    pub orig_attr: ibv_device_attr,
    /// Which optional fields are valid (none).
    pub comp_mask: u32,
    /// On-demand paging (`crate::odp`).
    pub odp_caps: ibv_odp_caps,
    /// The bits a completion timestamp has (all 64: `CLOCK_MONOTONIC` nanoseconds).
    pub completion_timestamp_mask: u64,
    /// The timestamp clock in kHz (1,000,000: one tick per nanosecond).
    pub hca_core_clock: u64,
    /// `device_cap_flags_ex` … `max_wq_type_rq`…`cq_mod_caps`: all zero, "not
    /// supported".
    pub unsupported_caps: [u8; 96],
    /// The largest device-memory allocation (`crate::dm`).
    pub max_dm_size: u64,
    /// `pci_atomic_caps`: zero.
    pub pci_atomic_caps: [u8; 8],
    /// XRC ODP capabilities (`crate::odp::XRC_CAPS`).
    pub xrc_odp_caps: u32,
    /// Physical ports, not capped at 255 as `orig_attr.phys_port_cnt` is.
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` as v44 defines it (52 bytes; newer headers append
/// `active_speed_ex`, which the caller's `attr_len` lets us zero).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: c_int,
    /// `enum ibv_mtu`.
    pub max_mtu: c_int,
    /// `enum ibv_mtu`.
    pub active_mtu: c_int,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// `enum ibv_port_cap_flags`.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// SM LID (0 on RoCE).
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// Virtual lanes (encoded).
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Link width (encoded).
    pub active_width: u8,
    /// Link speed (encoded).
    pub active_speed: u8,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u8,
    /// `enum ibv_port_attr_flags`.
    pub flags: u8,
    /// `enum ibv_port_cap_flags2`.
    pub port_cap_flags2: u16,
}

/// Bytes the exported `ibv_query_port@IBVERBS_1.1` writes: rdma-core's
/// `struct _compat_ibv_port_attr`, i.e. `ibv_port_attr` up to and including `flags`.
/// Binaries that call the exported symbol (instead of the inline wrapper's
/// `query_port` op) may have a buffer of only this size.
pub const COMPAT_PORT_ATTR_SIZE: usize = 48;

/// `union ibv_gid` (16 bytes, wire order). The C union has a member of two `__be64`,
/// so it is 8-byte aligned, and so is every struct that embeds it (which makes
/// `ibv_qp_attr` 144 bytes, not 140).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct ibv_gid {
    /// The bytes.
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index.
    pub gid_index: u32,
    /// Its port.
    pub port_num: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    /// Netdev ifindex (0: no netdev).
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Handle.
    pub handle: u32,
}

/// `struct ibv_mw` (32 bytes).
#[repr(C)]
pub struct ibv_mw {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Current R_Key (updated by `ibv_bind_mw`).
    pub rkey: u32,
    /// Handle.
    pub handle: u32,
    /// `enum ibv_mw_type` (1 or 2).
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind_info` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    /// The region the window goes onto.
    pub mr: *mut ibv_mr,
    /// First byte.
    pub addr: u64,
    /// Length (0 unbinds a type 1 window).
    pub length: u64,
    /// `ibv_access_flags`.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`'s argument, 40 bytes).
#[repr(C)]
pub struct ibv_mw_bind {
    /// Cookie of the bind's completion.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED` etc.
    pub send_flags: c_uint,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `struct ibv_send_wr`'s last union (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// The R_Key it answers to after the bind.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_mr` (48 bytes); programs read `addr`, `length`, `lkey`, `rkey`.
#[repr(C)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// PD.
    pub pd: *mut ibv_pd,
    /// First byte.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
    /// Handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_comp_channel` (16 bytes); programs poll `fd`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Pollable descriptor.
    pub fd: c_int,
    /// CQs using this channel.
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub struct ibv_cq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// The program's cookie.
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Capacity.
    pub cqe: c_int,
    /// Guards the event counters.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when events are acknowledged.
    pub cond: libc::pthread_cond_t,
    /// Acknowledged completion events.
    pub comp_events_completed: u32,
    /// Acknowledged async events.
    pub async_events_completed: u32,
}

/// `struct ibv_cq_ex` (288 bytes): an `ibv_cq` (`ibv_cq_ex_to_cq` is a cast) plus the
/// iterator-style poll API. Every CQ is allocated as this struct; the function pointers
/// are filled only for CQs from `ibv_create_cq_ex`.
#[repr(C)]
pub struct ibv_cq_ex {
    /// The classic CQ (C repeats its members inline; the layout test checks them as
    /// `ibv_cq`'s and `comp_mask` at 128).
    pub cq_base: ibv_cq,
    /// Valid extensions (none).
    pub comp_mask: u32,
    /// Status of the current completion.
    pub status: c_int,
    /// wr_id of the current completion.
    pub wr_id: u64,
    /// `start_poll(cq, attr)`: 0, or ENOENT when empty.
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void) -> c_int>,
    /// `next_poll(cq)`: 0, or ENOENT.
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `end_poll(cq)`.
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    /// `read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_imm_data` (network order).
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    /// `read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `read_completion_ts`.
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    /// `read_cvlan`.
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    /// `read_flow_tag`.
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `read_tm_info`.
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    /// `read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    /// Minimum entries.
    pub cqe: u32,
    /// The program's cookie.
    pub cq_context: *mut c_void,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector.
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*` fields the program will read.
    pub wc_flags: u64,
    /// `enum ibv_cq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_create_cq_attr_flags`.
    pub flags: u32,
    /// Parent domain (IBV_CQ_INIT_ATTR_MASK_PD).
    pub parent_domain: *mut ibv_pd,
}

/// Size of `struct ibv_cq_ex`: every CQ is allocated as an [`ibv_cq_ex`].
pub const IBV_CQ_EX_SIZE: usize = std::mem::size_of::<ibv_cq_ex>();
const _: () = assert!(IBV_CQ_EX_SIZE == 288);

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub struct ibv_qp {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The program's cookie.
    pub qp_context: *mut c_void,
    /// PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (`ibv_srq`), or NULL.
    pub srq: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// QP number (exchanged out of band by every program).
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: c_int,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    /// Guards `events_completed`.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when events are acknowledged.
    pub cond: libc::pthread_cond_t,
    /// Acknowledged async events.
    pub events_completed: u32,
}

/// Size of `struct ibv_qp_ex` in rdma-core HEAD (352 in v44, which lacks `wr_flush`):
/// every QP is allocated as a [`ibv_qp_ex`].
pub const IBV_QP_EX_SIZE: usize = std::mem::size_of::<ibv_qp_ex>();
const _: () = assert!(IBV_QP_EX_SIZE == 360);

/// `struct ibv_qp_ex` (v44: 352 bytes; HEAD appends `wr_flush`, 360): the `ibv_wr_*`
/// post API. Every QP is allocated as this struct; the function pointers are filled
/// only for QPs created through `ibv_create_qp_ex` with send-ops flags.
#[repr(C)]
pub struct ibv_qp_ex {
    /// The classic QP (`ibv_qp_ex_to_qp` is a cast).
    pub qp_base: ibv_qp,
    /// Valid extensions (none).
    pub comp_mask: u64,
    /// wr_id of the next WR built.
    pub wr_id: u64,
    /// `ibv_send_flags` of the next WR built.
    pub wr_flags: c_uint,
    /// `wr_atomic_cmp_swp(qp, rkey, remote_addr, compare, swap)`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    /// `wr_atomic_fetch_add(qp, rkey, remote_addr, add)`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    /// `wr_bind_mw`.
    pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const c_void)>,
    /// `wr_local_inv(qp, rkey)`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `wr_rdma_read(qp, rkey, remote_addr)`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `wr_rdma_write(qp, rkey, remote_addr)`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `wr_rdma_write_imm(qp, rkey, remote_addr, imm_be)`.
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `wr_send(qp)`.
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `wr_send_imm(qp, imm_be)`.
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `wr_send_inv(qp, rkey)`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `wr_send_tso(qp, hdr, hdr_sz, mss)`.
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    /// `wr_set_ud_addr(qp, ah, remote_qpn, remote_qkey)`.
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    /// `wr_set_xrc_srqn(qp, srqn)`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `wr_set_inline_data(qp, addr, length)`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    /// `wr_set_inline_data_list(qp, num_buf, buf_list)`.
    pub wr_set_inline_data_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const c_void)>,
    /// `wr_set_sge(qp, lkey, addr, length)`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `wr_set_sge_list(qp, num_sge, sg_list)`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    /// `wr_start(qp)`.
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `wr_complete(qp)`: posts the batch; 0 or an errno.
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    /// `wr_abort(qp)`.
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `wr_atomic_write(qp, rkey, remote_addr, atomic_wr)`.
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    /// `wr_flush` (rdma-core HEAD only; not in v44's header).
    pub wr_flush: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8)>,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes); beyond the classic fields this library
/// reads `comp_mask`, `pd`, `xrcd`, `create_flags` and `send_ops_flags`.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// Cookie for `qp->qp_context`.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut c_void,
    /// Sizes (in and out).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    /// Signal every send.
    pub sq_sig_all: c_int,
    /// `enum ibv_qp_init_attr_mask`.
    pub comp_mask: u32,
    /// PD (IBV_QP_INIT_ATTR_PD).
    pub pd: *mut ibv_pd,
    /// XRC domain of an `IBV_QPT_XRC_RECV` QP (IBV_QP_INIT_ATTR_XRCD).
    pub xrcd: *mut ibv_xrcd,
    /// `enum ibv_qp_create_flags`.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RSS indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf`: function (u8), key length (u8), key pointer, fields
    /// mask (u64).
    pub rx_hash_conf: [u64; 3],
    /// Source QPN.
    pub source_qpn: u32,
    /// `enum ibv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct ibv_srq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The program's cookie.
    pub srq_context: *mut c_void,
    /// PD.
    pub pd: *mut ibv_pd,
    /// Handle (the NIC's SRQ handle).
    pub handle: u32,
    /// Guards `events_completed`.
    pub mutex: libc::pthread_mutex_t,
    /// Signalled when events are acknowledged.
    pub cond: libc::pthread_cond_t,
    /// Acknowledged async events.
    pub events_completed: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_srq_attr {
    /// Most outstanding WRs.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// The limit that raises IBV_EVENT_SRQ_LIMIT_REACHED (0: not armed).
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// The program's cookie.
    pub srq_context: *mut c_void,
    /// Requested attributes (the granted ones are written back).
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq_init_attr_ex` (64 bytes): an [`ibv_srq_init_attr`] followed by the
/// extension fields (`ibv_create_srq_ex` passes a basic one to `ibv_create_srq` as
/// its first 24 bytes).
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    /// The program's cookie.
    pub srq_context: *mut c_void,
    /// Requested attributes (the granted ones are written back).
    pub attr: ibv_srq_attr,
    /// `enum ibv_srq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_srq_type` (`IBV_SRQT_BASIC` 0, `_XRC` 1, `_TM` 2).
    pub srq_type: u32,
    /// The PD (`IBV_SRQ_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// The XRC domain (`IBV_SRQ_INIT_ATTR_XRCD`).
    pub xrcd: *mut ibv_xrcd,
    /// The CQ of an XRC SRQ (`IBV_SRQ_INIT_ATTR_CQ`).
    pub cq: *mut ibv_cq,
    /// `struct ibv_tm_cap` (tag matching): `max_num_tags`, `max_ops`.
    pub tm_cap: [u32; 2],
}

/// `struct ibv_async_event` (16 bytes): the element (a CQ, QP, SRQ, WQ pointer or a
/// port number) and `enum ibv_event_type`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_async_event {
    /// `element.{cq,qp,srq,wq}` (or `port_num` in the low bytes).
    pub element: *mut c_void,
    /// `enum ibv_event_type`.
    pub event_type: c_int,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    /// Send WRs.
    pub max_send_wr: u32,
    /// Receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
pub struct ibv_qp_init_attr {
    /// Cookie for `qp->qp_context`.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut c_void,
    /// Requested (in) / granted (out) sizes.
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    /// GRH (required on RoCE).
    pub grh: ibv_global_route,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// 1 when `grh` is valid.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    /// `enum ibv_qp_state`.
    pub qp_state: c_int,
    /// Current state (modify: the caller's belief).
    pub cur_qp_state: c_int,
    /// `enum ibv_mtu`.
    pub path_mtu: c_int,
    /// `enum ibv_mig_state`.
    pub path_mig_state: c_int,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QPN.
    pub dest_qp_num: u32,
    /// `ibv_access_flags`.
    pub qp_access_flags: c_uint,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD event request.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Outstanding READ/atomic as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer (encoded).
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ACK timeout (encoded).
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
}

/// `struct ibv_ah` (24 bytes).
#[repr(C)]
pub struct ibv_ah {
    /// Owning context.
    pub context: *mut ibv_context,
    /// PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_wr {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct atomic_wr {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare (CAS) or add (FAA) value.
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ud_wr {
    /// Address handle.
    pub ah: *mut c_void,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union wr_union {
    /// RDMA WRITE / READ.
    pub rdma: rdma_wr,
    /// Atomics.
    pub atomic: atomic_wr,
    /// UD.
    pub ud: ud_wr,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct ibv_send_wr {
    /// Cookie returned in the completion.
    pub wr_id: u64,
    /// Next WR, or NULL.
    pub next: *mut ibv_send_wr,
    /// SGEs (`struct ibv_sge`, the same layout as verbs-api's `Sge`).
    pub sg_list: *mut verbs_api::Sge,
    /// SGE count.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: c_int,
    /// `enum ibv_send_flags`.
    pub send_flags: c_uint,
    /// Immediate data, network order (or invalidate rkey).
    pub imm_data: u32,
    /// Operation arguments.
    pub wr: wr_union,
    /// `qp_type.xrc.remote_srqn`: the remote XRC SRQ of a WR on an `IBV_QPT_XRC_SEND`
    /// QP.
    pub qp_type: u32,
    /// `bind_mw` (`IBV_WR_BIND_MW`; the union's `tso` member is unused here).
    pub bind_mw: send_wr_bind_mw,
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
pub struct ibv_recv_wr {
    /// Cookie.
    pub wr_id: u64,
    /// Next WR, or NULL.
    pub next: *mut ibv_recv_wr,
    /// SGEs.
    pub sg_list: *mut verbs_api::Sge,
    /// SGE count.
    pub num_sge: c_int,
}

/// `struct ibv_sge` (16 bytes), for the layout check of verbs-api's `Sge`.
pub type ibv_sge = verbs_api::Sge;

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    /// Cookie.
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: c_int,
    /// `enum ibv_wc_opcode`.
    pub opcode: c_int,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes.
    pub byte_len: u32,
    /// Immediate data, network order.
    pub imm_data: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Source QPN (UD).
    pub src_qp: u32,
    /// `enum ibv_wc_flags`.
    pub wc_flags: c_uint,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

/// `IBV_NODE_CA`.
pub const IBV_NODE_CA: c_int = 1;
/// `IBV_TRANSPORT_IB` (RoCE devices report InfiniBand transport).
pub const IBV_TRANSPORT_IB: c_int = 0;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: c_int = 4;
/// `IBV_DEVICE_SYS_IMAGE_GUID` (`enum ibv_device_cap_flags`).
pub const IBV_DEVICE_SYS_IMAGE_GUID: c_uint = 1 << 11;
/// `IBV_DEVICE_RC_RNR_NAK_GEN`.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;
/// `IBV_DEVICE_MEM_WINDOW`.
pub const IBV_DEVICE_MEM_WINDOW: c_uint = 1 << 17;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`.
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: c_uint = 1 << 24;
/// `IBV_DEVICE_XRC`.
pub const IBV_DEVICE_XRC: c_uint = 1 << 20;

/// `IBV_ATOMIC_HCA`.
pub const IBV_ATOMIC_HCA: c_int = 1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2` (`enum ibv_gid_type_sysfs`, rdma-core's `driver.h`).
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;
/// `IBV_FORK_ENABLED`.
pub const IBV_FORK_ENABLED: c_int = 1;

/// One row of the layout table: `offsetof(struct strukt, field) == offset` and
/// `sizeof(field) == size`, or (for `verbs_context` ops, [`Kind::FromContext`]) the
/// op's distance to the embedded `context`.
#[derive(Debug, Clone, Copy)]
pub struct FieldLayout {
    /// C struct name (without `struct`).
    pub strukt: &'static str,
    /// C field name.
    pub field: &'static str,
    /// What `value` means.
    pub kind: Kind,
    /// Offset, or distance to `context`.
    pub value: usize,
    /// `sizeof` the field.
    pub size: usize,
}

/// How a [`FieldLayout`] is to be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `offsetof(struct, field) == value`.
    Offset,
    /// `offsetof(struct, context) - offsetof(struct, field) == value`.
    FromContext,
}

/// One row of the struct-size table.
#[derive(Debug, Clone, Copy)]
pub struct StructSize {
    /// C struct name.
    pub strukt: &'static str,
    /// Our `size_of`.
    pub size: usize,
    /// How the C size must compare with ours.
    pub rule: SizeRule,
}

/// How a C struct's size must compare with [`StructSize::size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRule {
    /// Equal.
    Exact,
    /// The C struct may be larger: it grows at the end and callers pass their size.
    CMayBeLarger,
    /// The C struct may be smaller: we allocate room for newer headers' fields.
    CMayBeSmaller,
}

/// Pushes one [`FieldLayout`] per field of a `#[repr(C)]` mirror onto `$out`
/// (`fields!(v, Offset, ibv_pd { context, handle })`; `field as "c.name"` names a C
/// member path that differs). Exported for softnic-rdmacm's own layout table.
#[macro_export]
#[doc(hidden)]
macro_rules! fields {
    ($out:ident, $kind:ident, $t:ident { $($f:ident $(as $c:literal)?),* $(,)? }) => {
        $(
            $out.push($crate::abi::FieldLayout {
                strukt: stringify!($t),
                field: $crate::fields!(@name $f $($c)?),
                kind: $crate::abi::Kind::$kind,
                value: $crate::fields!(@value $kind $t $f),
                size: {
                    fn size_of_field<T>(_: *const T) -> usize { std::mem::size_of::<T>() }
                    let u = std::mem::MaybeUninit::<$t>::uninit();
                    // SAFETY: addr_of! computes a field address without reading it.
                    size_of_field(unsafe { std::ptr::addr_of!((*u.as_ptr()).$f) })
                },
            });
        )*
    };
    (@name $f:ident) => { stringify!($f) };
    (@name $f:ident $c:literal) => { $c };
    (@value Offset $t:ident $f:ident) => { std::mem::offset_of!($t, $f) };
    (@value FromContext $t:ident $f:ident) => {
        std::mem::offset_of!($t, context) - std::mem::offset_of!($t, $f)
    };
}

/// Every field this library fills, with its Rust offset and size; `tests/layout.rs`
/// compares them with the C header.
pub fn layout_table() -> Vec<FieldLayout> {
    let mut v = Vec::new();
    fields!(
        v,
        Offset,
        ibv_device {
            _ops,
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        }
    );
    fields!(
        v,
        Offset,
        ibv_context_ops {
            _compat_query_device,
            _compat_query_port,
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            post_srq_recv,
            post_send,
            post_recv
        }
    );
    fields!(
        v,
        Offset,
        ibv_context {
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        }
    );
    fields!(v, FromContext, verbs_context {
        query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
        create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
        modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
        modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
        post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
        create_wq, query_rt_values, create_cq_ex, priv_ as "priv", query_device_ex,
        ibv_destroy_flow, abi_placeholder2 as "ABI_placeholder2", ibv_create_flow,
        abi_placeholder1 as "ABI_placeholder1", open_qp, create_qp_ex, get_srq_num,
        create_srq_ex, open_xrcd, close_xrcd, abi_placeholder3 as "_ABI_placeholder3", sz
    });
    fields!(
        v,
        Offset,
        ibv_device_attr {
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt
        }
    );
    fields!(
        v,
        Offset,
        ibv_device_attr_ex {
            orig_attr,
            comp_mask,
            odp_caps,
            completion_timestamp_mask,
            hca_core_clock,
            max_dm_size,
            xrc_odp_caps,
            phys_port_cnt_ex
        }
    );
    fields!(
        v,
        Offset,
        ibv_values_ex {
            comp_mask,
            raw_clock
        }
    );
    fields!(
        v,
        Offset,
        ibv_dm {
            context,
            memcpy_to_dm,
            memcpy_from_dm,
            comp_mask,
            handle
        }
    );
    fields!(
        v,
        Offset,
        ibv_alloc_dm_attr {
            length,
            log_align_req,
            comp_mask
        }
    );
    fields!(
        v,
        Offset,
        ibv_srq_init_attr_ex {
            srq_context,
            attr,
            comp_mask,
            srq_type,
            pd,
            xrcd,
            cq,
            tm_cap
        }
    );
    fields!(v, Offset, ibv_td_init_attr { comp_mask });
    fields!(v, Offset, ibv_td { context });
    fields!(
        v,
        Offset,
        ibv_parent_domain_init_attr {
            pd,
            td,
            comp_mask,
            alloc,
            free,
            pd_context
        }
    );
    fields!(
        v,
        Offset,
        ibv_odp_caps {
            general_caps,
            rc_odp_caps as "per_transport_caps.rc_odp_caps",
            uc_odp_caps as "per_transport_caps.uc_odp_caps",
            ud_odp_caps as "per_transport_caps.ud_odp_caps"
        }
    );
    fields!(
        v,
        Offset,
        ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2
        }
    );
    fields!(
        v,
        Offset,
        ibv_gid_entry {
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        }
    );
    fields!(v, Offset, ibv_pd { context, handle });
    fields!(
        v,
        Offset,
        ibv_mw {
            context,
            pd,
            rkey,
            handle,
            mw_type as "type"
        }
    );
    fields!(
        v,
        Offset,
        ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags
        }
    );
    fields!(
        v,
        Offset,
        ibv_mw_bind {
            wr_id,
            send_flags,
            bind_info
        }
    );
    fields!(
        v,
        Offset,
        ibv_ah {
            context,
            pd,
            handle
        }
    );
    fields!(
        v,
        Offset,
        ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        }
    );
    fields!(
        v,
        Offset,
        ibv_comp_channel {
            context,
            fd,
            refcnt
        }
    );
    fields!(
        v,
        Offset,
        ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed
        }
    );
    fields!(
        v,
        Offset,
        ibv_srq {
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed
        }
    );
    fields!(
        v,
        Offset,
        ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit
        }
    );
    fields!(v, Offset, ibv_srq_init_attr { srq_context, attr });
    fields!(v, Offset, ibv_xrcd { context });
    fields!(
        v,
        Offset,
        ibv_xrcd_init_attr {
            comp_mask,
            fd,
            oflags
        }
    );
    fields!(
        v,
        Offset,
        ibv_async_event {
            element as "element.srq",
            event_type
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp_init_attr {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all
        }
    );
    fields!(
        v,
        Offset,
        ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class
        }
    );
    fields!(
        v,
        Offset,
        ibv_ah_attr {
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp_attr {
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit
        }
    );
    fields!(
        v,
        Offset,
        ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            wr,
            qp_type,
            bind_mw
        }
    );
    fields!(
        v,
        Offset,
        ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        }
    );
    fields!(v, Offset, ibv_sge { addr, length, lkey });
    fields!(
        v,
        Offset,
        ibv_wc {
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp_ex {
            qp_base,
            comp_mask,
            wr_id,
            wr_flags,
            wr_atomic_cmp_swp,
            wr_atomic_fetch_add,
            wr_bind_mw,
            wr_local_inv,
            wr_rdma_read,
            wr_rdma_write,
            wr_rdma_write_imm,
            wr_send,
            wr_send_imm,
            wr_send_inv,
            wr_send_tso,
            wr_set_ud_addr,
            wr_set_xrc_srqn,
            wr_set_inline_data,
            wr_set_inline_data_list,
            wr_set_sge,
            wr_set_sge_list,
            wr_start,
            wr_complete,
            wr_abort,
            wr_atomic_write
        }
    );
    fields!(
        v,
        Offset,
        ibv_qp_init_attr_ex {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
            comp_mask,
            pd,
            xrcd,
            create_flags,
            max_tso_header,
            rwq_ind_tbl,
            rx_hash_conf,
            source_qpn,
            send_ops_flags
        }
    );
    fields!(
        v,
        Offset,
        ibv_cq_ex {
            comp_mask,
            status,
            wr_id,
            start_poll,
            next_poll,
            end_poll,
            read_opcode,
            read_vendor_err,
            read_byte_len,
            read_imm_data,
            read_qp_num,
            read_src_qp,
            read_wc_flags,
            read_slid,
            read_sl,
            read_dlid_path_bits,
            read_completion_ts,
            read_cvlan,
            read_flow_tag,
            read_tm_info,
            read_completion_wallclock_ns
        }
    );
    fields!(
        v,
        Offset,
        ibv_cq_init_attr_ex {
            cqe,
            cq_context,
            channel,
            comp_vector,
            wc_flags,
            comp_mask,
            flags,
            parent_domain
        }
    );
    // The members of ibv_send_wr's `wr` union, as `wr.rdma.rkey` etc.
    let wr = std::mem::offset_of!(ibv_send_wr, wr);
    for (field, off, size) in [
        (
            "wr.rdma.remote_addr",
            std::mem::offset_of!(rdma_wr, remote_addr),
            8,
        ),
        ("wr.rdma.rkey", std::mem::offset_of!(rdma_wr, rkey), 4),
        (
            "wr.atomic.remote_addr",
            std::mem::offset_of!(atomic_wr, remote_addr),
            8,
        ),
        (
            "wr.atomic.compare_add",
            std::mem::offset_of!(atomic_wr, compare_add),
            8,
        ),
        ("wr.atomic.swap", std::mem::offset_of!(atomic_wr, swap), 8),
        ("wr.atomic.rkey", std::mem::offset_of!(atomic_wr, rkey), 4),
        ("wr.ud.ah", std::mem::offset_of!(ud_wr, ah), 8),
        (
            "wr.ud.remote_qpn",
            std::mem::offset_of!(ud_wr, remote_qpn),
            4,
        ),
        (
            "wr.ud.remote_qkey",
            std::mem::offset_of!(ud_wr, remote_qkey),
            4,
        ),
        // Not a member of `wr`: `qp_type` follows it; the loop adds the union's offset.
        (
            "qp_type.xrc.remote_srqn",
            std::mem::offset_of!(ibv_send_wr, qp_type) - wr,
            4,
        ),
    ] {
        v.push(FieldLayout {
            strukt: "ibv_send_wr",
            field,
            kind: Kind::Offset,
            value: wr + off,
            size,
        });
    }
    v
}

/// The struct sizes the layout test compares.
pub fn size_table() -> Vec<StructSize> {
    use std::mem::size_of;
    vec![
        StructSize {
            strukt: "ibv_device",
            size: size_of::<ibv_device>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_mw",
            size: size_of::<ibv_mw>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_mw_bind",
            size: size_of::<ibv_mw_bind>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_mw_bind_info",
            size: size_of::<ibv_mw_bind_info>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_srq",
            size: size_of::<ibv_srq>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_srq_attr",
            size: size_of::<ibv_srq_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_srq_init_attr",
            size: size_of::<ibv_srq_init_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_async_event",
            size: size_of::<ibv_async_event>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_context_ops",
            size: size_of::<ibv_context_ops>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_context",
            size: size_of::<ibv_context>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_device_attr",
            size: size_of::<ibv_device_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_device_attr_ex",
            size: size_of::<ibv_device_attr_ex>(),
            rule: SizeRule::CMayBeLarger,
        },
        StructSize {
            strukt: "ibv_dm",
            size: size_of::<ibv_dm>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_alloc_dm_attr",
            size: size_of::<ibv_alloc_dm_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_srq_init_attr_ex",
            size: size_of::<ibv_srq_init_attr_ex>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_xrcd",
            size: size_of::<ibv_xrcd>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_xrcd_init_attr",
            size: size_of::<ibv_xrcd_init_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_td_init_attr",
            size: size_of::<ibv_td_init_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_td",
            size: size_of::<ibv_td>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_parent_domain_init_attr",
            size: size_of::<ibv_parent_domain_init_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_values_ex",
            size: size_of::<ibv_values_ex>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_odp_caps",
            size: size_of::<ibv_odp_caps>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_port_attr",
            size: size_of::<ibv_port_attr>(),
            rule: SizeRule::CMayBeLarger,
        },
        StructSize {
            strukt: "ibv_gid_entry",
            size: size_of::<ibv_gid_entry>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_pd",
            size: size_of::<ibv_pd>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_ah",
            size: size_of::<ibv_ah>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_mr",
            size: size_of::<ibv_mr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_comp_channel",
            size: size_of::<ibv_comp_channel>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_cq",
            size: size_of::<ibv_cq>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_cq_ex",
            size: IBV_CQ_EX_SIZE,
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_qp",
            size: size_of::<ibv_qp>(),
            rule: SizeRule::Exact,
        },
        // v44's ibv_qp_ex is 352 bytes, HEAD's 360: QPs are allocated at the larger.
        StructSize {
            strukt: "ibv_qp_ex",
            size: IBV_QP_EX_SIZE,
            rule: SizeRule::CMayBeSmaller,
        },
        StructSize {
            strukt: "ibv_cq_init_attr_ex",
            size: size_of::<ibv_cq_init_attr_ex>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_qp_init_attr_ex",
            size: size_of::<ibv_qp_init_attr_ex>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_qp_cap",
            size: size_of::<ibv_qp_cap>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_qp_init_attr",
            size: size_of::<ibv_qp_init_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_global_route",
            size: size_of::<ibv_global_route>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_ah_attr",
            size: size_of::<ibv_ah_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_qp_attr",
            size: size_of::<ibv_qp_attr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_send_wr",
            size: size_of::<ibv_send_wr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_recv_wr",
            size: size_of::<ibv_recv_wr>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_sge",
            size: size_of::<ibv_sge>(),
            rule: SizeRule::Exact,
        },
        StructSize {
            strukt: "ibv_wc",
            size: size_of::<ibv_wc>(),
            rule: SizeRule::Exact,
        },
    ]
}

/// `sz` as this library sets it: from the first (NULL) newer-op slot to the end of
/// `context`, i.e. the whole [`verbs_context`].
pub const VERBS_CONTEXT_SZ: usize = std::mem::size_of::<verbs_context>();

const _: () = assert!(std::mem::size_of::<ibv_device>() == 664);
const _: () = assert!(std::mem::size_of::<ibv_context>() == 328);
const _: () = assert!(std::mem::size_of::<ibv_port_attr>() >= COMPAT_PORT_ATTR_SIZE);
const _: () = assert!(
    std::mem::offset_of!(verbs_context, context) + std::mem::size_of::<ibv_context>()
        == VERBS_CONTEXT_SZ
);

/// Compiles C source `c` with the system C compiler (`$CC`, else `cc`) in syntax-only
/// mode, as the layout tests of this crate and of softnic-rdmacm do with their generated
/// `_Static_assert`s against the real rdma-core headers. `Err` holds the compiler's
/// messages. Panics when no compiler can be run: those tests must fail, not skip.
#[doc(hidden)]
pub fn c_syntax_check(tag: &str, c: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("softnic-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("check.c");
    std::fs::write(&src, c).map_err(|e| e.to_string())?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
