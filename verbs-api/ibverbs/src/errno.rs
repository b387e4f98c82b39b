//! Reporting failures the way rdma-core does: a verb returning a pointer sets `errno`
//! and returns NULL; a verb returning `int` returns the errno value (positive) unless
//! rdma-core documents `-1` + `errno` for it.

use std::ffi::c_int;

/// Sets the calling thread's `errno`.
pub fn set(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Sets `errno` to `e` and returns NULL, for verbs that return a pointer.
pub fn null<T>(e: c_int) -> *mut T {
    set(e);
    std::ptr::null_mut()
}

/// The errno for a verbs-api error: what the kernel would have answered for the same
/// condition.
pub fn of(e: &verbs_api::Error) -> c_int {
    use verbs_api::abi::control::ErrorCode;
    match e {
        verbs_api::Error::NoDevice { .. } => libc::ENODEV,
        verbs_api::Error::Busy(_) => libc::EBUSY,
        verbs_api::Error::InvalidArgument(_) | verbs_api::Error::InvalidState { .. } => {
            libc::EINVAL
        }
        verbs_api::Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        verbs_api::Error::Nic { code, .. } => match code {
            ErrorCode::InvalidArgument | ErrorCode::InvalidState => libc::EINVAL,
            ErrorCode::NoResources => libc::ENOMEM,
            ErrorCode::NotFound => libc::ENOENT,
            ErrorCode::Busy => libc::EBUSY,
            ErrorCode::AbiMismatch => libc::EPROTO,
            ErrorCode::Protocol | ErrorCode::Internal => libc::EIO,
        },
        _ => libc::EIO,
    }
}
