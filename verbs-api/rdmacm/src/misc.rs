//! The rest of librdmacm's ABI: `rdma_event_str`, `rdma_get_devices`,
//! `rdma_set_option`, and the calls softnic does not serve (SRQs on ids, ECE), each
//! answering an errno rather than pretending.

use std::ffi::{c_char, c_int, c_void};

use softnic_ibverbs::abi::ibv_context;
use softnic_ibverbs::{device, errno};

use crate::abi::*;
use crate::channel::fail;

/// rdma-core's names, indexed by `enum rdma_cm_event_type`.
const EVENT_NAMES: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// `rdma_event_str`: the event's name, "UNKNOWN EVENT" out of range (rdma-core's
/// strings; `tests/strings.rs` compares them with the system library's).
#[export_name = "softnic_rdma_event_str"]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    usize::try_from(event)
        .ok()
        .and_then(|i| EVENT_NAMES.get(i))
        .copied()
        .unwrap_or(c"UNKNOWN EVENT")
        .as_ptr()
}

/// `rdma_get_devices`: an `ibv_context` for every softnic device, NULL-terminated
/// (freed with `rdma_free_devices`; the contexts stay open). Each is the context of
/// that device every id bound there carries as `id->verbs` (`id::device_context`), as
/// in rdma-core, so a PD allocated on it serves `rdma_create_qp` on those ids.
///
/// # Safety
/// `num_devices` is NULL or writable.
#[export_name = "softnic_rdma_get_devices"]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let mut n: c_int = 0;
    // SAFETY: n is writable.
    let list = unsafe { device::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return std::ptr::null_mut();
    }
    let mut out = Vec::new();
    for k in 0..n as usize {
        // SAFETY: k < n entries of the list.
        let dev = unsafe { *list.add(k) };
        // SAFETY: a device of the list; its name is a C string.
        let name = unsafe { std::ffi::CStr::from_ptr(device::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a device of the list.
        let c = crate::id::device_context(&name, || unsafe { device::ibv_open_device(dev) });
        if !c.is_null() {
            out.push(c);
        }
    }
    // SAFETY: from ibv_get_device_list.
    unsafe { device::ibv_free_device_list(list) };
    // SAFETY: calloc of n + 1 pointers, checked; freed by rdma_free_devices.
    let arr = unsafe { libc::calloc(out.len() + 1, std::mem::size_of::<usize>()) }
        as *mut *mut ibv_context;
    if arr.is_null() {
        return errno::null(libc::ENOMEM);
    }
    for (k, c) in out.iter().enumerate() {
        // SAFETY: k < n + 1 slots.
        unsafe { *arr.add(k) = *c };
    }
    if !num_devices.is_null() {
        // SAFETY: caller contract.
        unsafe { *num_devices = out.len() as c_int };
    }
    arr
}

/// `rdma_free_devices`: the array (not the contexts).
///
/// # Safety
/// `list` came from [`rdma_get_devices`].
#[export_name = "softnic_rdma_free_devices"]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: calloc'ed by rdma_get_devices (free(NULL) is a no-op).
    unsafe { libc::free(list.cast()) };
}

// `rdma_set_option` levels and names (`<rdma/rdma_cma.h>`).
const RDMA_OPTION_ID: c_int = 0;
const RDMA_OPTION_ID_TOS: c_int = 0;
const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
const RDMA_OPTION_ID_AFONLY: c_int = 2;
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
const RDMA_OPTION_IB: c_int = 1;
const RDMA_OPTION_IB_PATH: c_int = 1;

/// `rdma_set_option`. `RDMA_OPTION_ID_ACK_TIMEOUT` sets the local ACK timeout of the
/// id's QP at RTS (`CmId::set_ack_timeout`; EINVAL past 31 or on a UD id);
/// `RDMA_OPTION_ID_TOS` the traffic class (IP TOS) of its connection
/// (`CmId::set_tos`). `_REUSEADDR` and `_AFONLY` are checked for size (EINVAL) and
/// accepted but have no effect yet: softnic allows no port reuse and binds one address
/// family. `RDMA_OPTION_IB_PATH` (setting path records by hand) is EOPNOTSUPP; anything
/// else ENOSYS, as the kernel answers an unknown option.
///
/// # Safety
/// `id` is live; `optval` readable for `optlen`.
#[export_name = "softnic_rdma_set_option"]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: caller contract.
    let Some(i) = (unsafe { crate::id::id(id) }) else {
        return fail(libc::EINVAL);
    };
    if optval.is_null() {
        return fail(libc::EINVAL);
    }
    let want = match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) | (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => 1,
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => {
            std::mem::size_of::<c_int>()
        }
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => return fail(libc::EOPNOTSUPP),
        _ => return fail(libc::ENOSYS),
    };
    if optlen != want {
        return fail(libc::EINVAL);
    }
    if level == RDMA_OPTION_ID && matches!(optname, RDMA_OPTION_ID_ACK_TIMEOUT | RDMA_OPTION_ID_TOS)
    {
        // SAFETY: one readable byte (size checked above).
        let v = unsafe { *(optval as *const u8) };
        return i.with_api(|api| {
            if optname == RDMA_OPTION_ID_TOS {
                api.set_tos(v)
            } else {
                api.set_ack_timeout(v)
            }
        });
    }
    0
}

/// `rdma_notify`: softnic reports no asynchronous QP events to the CM; accepted as a
/// no-op (the CM needs no hint: the NIC moves the QP itself).
///
/// # Safety
/// `id` is live.
#[export_name = "softnic_rdma_notify"]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // SAFETY: caller contract.
    if unsafe { crate::id::id(id) }.is_none() {
        return fail(libc::EINVAL);
    }
    0
}

/// `rdma_set_local_ece`, `rdma_get_remote_ece`, `rdma_reject_ece`: EOPNOTSUPP
/// (softnic's CM carries no enhanced connection establishment data).
#[export_name = "softnic_rdma_ece_unsupported"]
pub extern "C" fn rdma_ece_unsupported() -> c_int {
    fail(libc::EOPNOTSUPP)
}
