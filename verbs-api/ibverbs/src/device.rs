//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, `ibv_close_device`
//! and the device-name helpers.
//!
//! A device is a NIC whose control socket in `$SOFTNIC_DIR` answers QueryDevice (a
//! stale socket of a dead NIC is not listed). Device objects live for the rest of the
//! process, one per socket path, as rdma-core keeps its device list: a program may keep
//! an `ibv_device *` after `ibv_free_device_list` (contexts point at it), and listing
//! again returns the same pointers.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Mutex;

use verbs_api::{Context, Device, DeviceAttributes};

use crate::abi::*;
use crate::errno;

/// Environment variable limiting the device list to these NIC names
/// ([`verbs_api::device::DEVICES_ENV`]: [`Device::list`] applies it).
pub use verbs_api::device::DEVICES_ENV;

/// A device as rdma-core allocates it: `struct ibv_device` first, then (at offset 664,
/// where rdma-core's `struct verbs_device` has its `ops`) a non-NULL pointer that is not
/// any vendor's ops table, so a vendor library asking "is this mine?" says no.
#[repr(C)]
pub struct SoftnicDevice {
    /// The public part.
    pub dev: ibv_device,
    verbs_ops: *const c_void,
    path: PathBuf,
    index: c_int,
    /// Node GUID (host order), as of the last listing.
    guid: std::sync::atomic::AtomicU64,
}

/// What `verbs_ops` points at: nothing a vendor library recognises.
static NOT_A_VENDOR_DEVICE: u8 = 0;

struct Registry(Vec<*mut SoftnicDevice>);
// SAFETY: the pointers are leaked boxes, never freed, only read through &.
unsafe impl Send for Registry {}

static DEVICES: Mutex<Registry> = Mutex::new(Registry(Vec::new()));

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The registry entry for `path`, created on first sight.
fn device_for(path: PathBuf, name: &str, guid: u64) -> *mut SoftnicDevice {
    let mut reg = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    for &d in &reg.0 {
        // SAFETY: registry pointers are leaked boxes, valid for the process lifetime.
        let dev = unsafe { &*d };
        if dev.path == path {
            dev.guid.store(guid, std::sync::atomic::Ordering::Relaxed);
            return d;
        }
    }
    // SAFETY: ibv_device is plain data (pointers, ints, char arrays): all-zero is valid.
    let mut pub_dev: ibv_device = unsafe { std::mem::zeroed() };
    pub_dev.node_type = IBV_NODE_CA;
    pub_dev.transport_type = IBV_TRANSPORT_IB;
    copy_cstr(&mut pub_dev.name, name);
    copy_cstr(&mut pub_dev.dev_name, name);
    let d = Box::into_raw(Box::new(SoftnicDevice {
        dev: pub_dev,
        verbs_ops: &NOT_A_VENDOR_DEVICE as *const u8 as *const c_void,
        path,
        index: reg.0.len() as c_int,
        guid: std::sync::atomic::AtomicU64::new(guid),
    }));
    reg.0.push(d);
    d
}

/// The [`SoftnicDevice`] around a device pointer this library handed out.
///
/// # Safety
/// `dev` must come from [`ibv_get_device_list`].
unsafe fn softnic_device<'a>(dev: *mut ibv_device) -> &'a SoftnicDevice {
    // SAFETY: `dev` is the first field of a leaked SoftnicDevice (repr(C)).
    unsafe { &*(dev as *const SoftnicDevice) }
}

/// `ibv_get_device_list`: every running NIC under `$SOFTNIC_DIR` (only those named in
/// [`DEVICES_ENV`] if set: [`Device::list`]), sorted by name, in a NULL-terminated array freed by
/// [`ibv_free_device_list`].
///
/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    let devices = match Device::list() {
        Ok(d) => d,
        Err(e) => return errno::null(errno::of(&e)),
    };
    let mut running = Vec::new();
    for d in devices {
        if let Ok(attr) = d.query() {
            let guid = guid_of(&attr);
            running.push(device_for(d.path().to_path_buf(), d.name(), guid));
        }
    }
    // SAFETY: calloc of (n + 1) pointers; NULL checked. libc allocation so that
    // ibv_free_device_list can free it whatever allocator Rust uses.
    let list = unsafe { libc::calloc(running.len() + 1, std::mem::size_of::<*mut ibv_device>()) }
        as *mut *mut ibv_device;
    if list.is_null() {
        return errno::null(libc::ENOMEM);
    }
    for (i, d) in running.iter().enumerate() {
        // SAFETY: i < n + 1 slots allocated above; d points at a live SoftnicDevice.
        unsafe { *list.add(i) = std::ptr::addr_of_mut!((**d).dev) };
    }
    if !num_devices.is_null() {
        // SAFETY: caller passes NULL or a writable int.
        unsafe { *num_devices = running.len() as c_int };
    }
    list
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` is NULL or came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: allocated with calloc in ibv_get_device_list (free(NULL) is a no-op).
    unsafe { libc::free(list as *mut c_void) };
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `device` is NULL or came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if device.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: a live device (caller contract).
    unsafe { (*device).name.as_ptr() }
}

/// `ibv_get_device_guid`: the node GUID, network byte order.
///
/// # Safety
/// `device` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    if device.is_null() {
        return 0;
    }
    // SAFETY: caller contract.
    let d = unsafe { softnic_device(device) };
    d.guid.load(std::sync::atomic::Ordering::Relaxed).to_be()
}

/// `ibv_get_device_index`: the device's position in this process's registry (stable
/// for the process; rdma-core returns the kernel's ibdev index).
///
/// # Safety
/// `device` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    if device.is_null() {
        return -1;
    }
    // SAFETY: caller contract.
    unsafe { softnic_device(device) }.index
}

fn guid_of(attr: &DeviceAttributes) -> u64 {
    verbs_api::gid::node_guid(std::net::SocketAddr::new(attr.addr, attr.port))
}

/// An open device: rdma-core's `verbs_context` (which ends with the public
/// `ibv_context`), then our state.
#[repr(C)]
pub struct SoftnicContext {
    /// The ABI part; `vctx.context` is what programs hold.
    pub vctx: verbs_context,
    /// The verbs-api connection to the NIC.
    pub api: Context,
    /// Attributes as of open.
    pub attr: DeviceAttributes,
    /// Node GUID, host order.
    pub guid: u64,
    /// Behind `context.async_fd`: a semaphore eventfd counting queued asynchronous
    /// events ([`crate::async_event`]).
    async_fd: OwnedFd,
    /// Asynchronous events and the objects they name.
    pub(crate) events: crate::async_event::Events,
    /// Behind `context.cmd_fd`: an eventfd standing in for the kernel command fd, which
    /// softnic does not have (the control socket stays private to verbs-api).
    cmd_fd: OwnedFd,
}

impl SoftnicContext {
    /// The eventfd behind `context.async_fd`.
    pub(crate) fn async_fd(&self) -> &OwnedFd {
        &self.async_fd
    }
}

/// The [`SoftnicContext`] around a context pointer this library handed out.
///
/// # Safety
/// `ctx` must come from [`ibv_open_device`] and not be closed.
pub unsafe fn softnic_context<'a>(ctx: *mut ibv_context) -> &'a SoftnicContext {
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: ctx is the `context` field of the `vctx` field (offset 0) of a live,
    // boxed SoftnicContext.
    unsafe { &*((ctx as *mut u8).sub(off) as *const SoftnicContext) }
}

fn eventfd(flags: c_int) -> Result<OwnedFd, c_int> {
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ibv_open_device`: connects to the NIC (verbs-api OpenDevice).
///
/// # Safety
/// `device` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    if device.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let d = unsafe { softnic_device(device) };
    let api = match Device::open_at(&d.path) {
        Ok(c) => c,
        Err(e) => return errno::null(errno::of(&e)),
    };
    // SAFETY: forwarded caller contract.
    unsafe { context_around(device, api) }
}

/// The `ibv_context` of the device registered for `path` (as [`ibv_get_device_list`]
/// registers it) around an open verbs-api context: what [`ibv_open_device`] returns,
/// closed by [`ibv_close_device`]. For `librdmacm`, whose ids bring their own
/// connection to the NIC (see [`crate::internal::wrap_context`]).
pub(crate) fn context_for_path(path: PathBuf, api: Context) -> *mut ibv_context {
    let guid = guid_of(api.attributes());
    let device = device_for(path, api.name(), guid);
    // SAFETY: device_for returns a live registry entry (never freed).
    unsafe { context_around(std::ptr::addr_of_mut!((*device).dev), api) }
}

/// # Safety
/// `device` came from [`ibv_get_device_list`] (or [`device_for`]).
unsafe fn context_around(device: *mut ibv_device, api: Context) -> *mut ibv_context {
    // SAFETY: caller contract.
    let d = unsafe { softnic_device(device) };
    let (async_fd, cmd_fd) = match (eventfd(libc::EFD_SEMAPHORE), eventfd(0)) {
        (Ok(a), Ok(c)) => (a, c),
        (Err(e), _) | (_, Err(e)) => return errno::null(e),
    };
    let attr = api.attributes().clone();
    let guid = guid_of(&attr);
    d.guid.store(guid, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: verbs_context is pointers, integers and a pthread mutex: all-zero is a
    // valid (NULL ops) value; the mutex is initialised below before any use.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.query_port = Some(crate::query::query_port_op);
    vctx.query_device_ex = Some(crate::query::query_device_ex_op);
    vctx.advise_mr = Some(crate::odp::advise_mr_op);
    vctx.query_rt_values = Some(crate::query::query_rt_values_op);
    vctx.alloc_dm = Some(crate::dm::alloc_dm_op);
    vctx.free_dm = Some(crate::dm::free_dm_op);
    vctx.reg_dm_mr = Some(crate::dm::reg_dm_mr_op);
    vctx.alloc_td = Some(crate::parent_domain::alloc_td_op);
    vctx.dealloc_td = Some(crate::parent_domain::dealloc_td_op);
    vctx.alloc_parent_domain = Some(crate::parent_domain::alloc_parent_domain_op);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex_op);
    vctx.open_xrcd = Some(crate::xrc::open_xrcd_op);
    vctx.close_xrcd = Some(crate::xrc::close_xrcd_op);
    vctx.create_srq_ex = Some(crate::xrc::create_srq_ex_op);
    vctx.get_srq_num = Some(crate::xrc::get_srq_num_op);
    vctx.create_cq_ex = Some(crate::cq_ex::create_cq_ex_op);
    vctx.sz = VERBS_CONTEXT_SZ;
    vctx.context.device = device;
    vctx.context.ops = crate::unsupported::context_ops();
    vctx.context.cmd_fd = cmd_fd.as_raw_fd();
    vctx.context.async_fd = async_fd.as_raw_fd();
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = usize::MAX as *mut c_void;
    let ctx = Box::into_raw(Box::new(SoftnicContext {
        vctx,
        api,
        attr,
        guid,
        async_fd,
        events: Default::default(),
        cmd_fd,
    }));
    // SAFETY: ctx is a fresh box; the mutex is at its final address (never moved).
    unsafe {
        libc::pthread_mutex_init(
            std::ptr::addr_of_mut!((*ctx).vctx.context.mutex),
            std::ptr::null(),
        );
        std::ptr::addr_of_mut!((*ctx).vctx.context)
    }
}

/// `ibv_close_device`: closes the connection; the NIC destroys what the context
/// created (as on a client exit).
///
/// # Safety
/// `context` came from [`ibv_open_device`] and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    if context.is_null() {
        return libc::EINVAL;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: reverses the Box::into_raw of ibv_open_device (caller contract: once).
    let ctx = unsafe { Box::from_raw((context as *mut u8).sub(off) as *mut SoftnicContext) };
    ctx.events.stop();
    // SAFETY: initialised in ibv_open_device, unlocked (nothing here locks it).
    unsafe {
        libc::pthread_mutex_destroy(std::ptr::addr_of!(ctx.vctx.context.mutex).cast_mut());
    }
    drop(ctx);
    0
}
