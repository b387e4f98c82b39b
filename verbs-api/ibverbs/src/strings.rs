//! String helpers (`ibv_wc_status_str`, `ibv_node_type_str`, `ibv_port_state_str`,
//! `ibv_event_type_str`), the fork API and the sysfs helpers rdma-core exports.
//!
//! The strings are rdma-core's, byte for byte: `tests/strings.rs` prints every value
//! through rdma-core's own library and through this one and compares.

use std::ffi::{c_char, c_int, CStr};

fn s(b: &'static [u8]) -> *const c_char {
    b.as_ptr() as *const c_char
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: [&[u8]; 24] = [
        b"success\0",
        b"local length error\0",
        b"local QP operation error\0",
        b"local EE context operation error\0",
        b"local protection error\0",
        b"Work Request Flushed Error\0",
        b"memory management operation error\0",
        b"bad response error\0",
        b"local access error\0",
        b"remote invalid request error\0",
        b"remote access error\0",
        b"remote operation error\0",
        b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0",
        b"local RDD violation error\0",
        b"remote invalid RD request\0",
        b"aborted error\0",
        b"invalid EE context number\0",
        b"invalid EE context state\0",
        b"fatal error\0",
        b"response timeout error\0",
        b"general error\0",
        b"TM error\0",
        b"TM software rendezvous\0",
    ];
    lookup(&T, status)
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: [&[u8]; 8] = [
        b"unknown\0",
        b"InfiniBand channel adapter\0",
        b"InfiniBand switch\0",
        b"InfiniBand router\0",
        b"iWARP NIC\0",
        b"usNIC\0",
        b"usNIC UDP\0",
        b"unspecified\0",
    ];
    lookup(&T, node_type)
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    const T: [&[u8]; 6] = [
        b"no state change (NOP)\0",
        b"down\0",
        b"init\0",
        b"armed\0",
        b"active\0",
        b"active defer\0",
    ];
    lookup(&T, port_state)
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: [&[u8]; 20] = [
        b"CQ error\0",
        b"local work queue catastrophic error\0",
        b"invalid request local work queue error\0",
        b"local access violation work queue error\0",
        b"communication established\0",
        b"send queue drained\0",
        b"path migrated\0",
        b"path migration request error\0",
        b"local catastrophic error\0",
        b"port active\0",
        b"port error\0",
        b"LID change\0",
        b"P_Key change\0",
        b"SM change\0",
        b"SRQ catastrophic error\0",
        b"SRQ limit reached\0",
        b"last WQE reached\0",
        b"client reregistration\0",
        b"GID table change\0",
        b"WQ fatal\0",
    ];
    lookup(&T, event)
}

fn lookup(table: &[&'static [u8]], i: c_int) -> *const c_char {
    match usize::try_from(i).ok().and_then(|i| table.get(i)) {
        Some(t) => s(t),
        None => s(b"unknown\0"),
    }
}

/// `ibv_fork_init`: nothing to do, registrations are always fork-protected (see
/// [`ibv_is_fork_initialized`]).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_ENABLED`. Registered pages are marked
/// `MADV_DONTFORK` (see [`crate::mr`]), which is what rdma-core's `ibv_fork_init`
/// arranges: a child after `fork()` does not see them, so it cannot write into the
/// parent's registered memory.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    crate::abi::IBV_FORK_ENABLED
}

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` (honoured only when not set-uid, as rdma-core
/// does), else `/sys`. softnic devices have no sysfs entries.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: plain syscalls.
        let setuid = unsafe { libc::getuid() != libc::geteuid() };
        let p = std::env::var("SYSFS_PATH")
            .ok()
            .filter(|p| !setuid && !p.is_empty())
            .map(|p| p.trim_end_matches('/').to_string())
            .unwrap_or_else(|| "/sys".to_string());
        std::ffi::CString::new(p).unwrap_or_else(|_| c"/sys".to_owned())
    })
    .as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (at most `size - 1` bytes, NUL
/// terminated, a trailing newline dropped) and returns the length, or -1. softnic
/// devices have empty sysfs paths, so reads about them fail, as for a missing file.
///
/// # Safety
/// `dir` and `file` are C strings; `buf` is writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        crate::errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller passes C strings.
    let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = format!("{}/{}", dir.to_string_lossy(), file.to_string_lossy());
    let mut data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => {
            crate::errno::set(e.raw_os_error().unwrap_or(libc::EIO));
            return -1;
        }
    };
    data.truncate(size - 1);
    if data.last() == Some(&b'\n') {
        data.pop();
    }
    // SAFETY: data.len() < size bytes plus the NUL fit in buf.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, data.len());
        *buf.add(data.len()) = 0;
    }
    data.len() as c_int
}
