//! The operating-system seam: the few Linux-specific calls softnic needs, in one place.
//!
//! * shared memory: `memfd_create` + `ftruncate` + `fallocate` + seals ([`memfd`],
//!   [`check_shm`], [`map_shared`], and the NIC's [`map_peer_shm`]);
//! * wake-ups: `eventfd` ([`eventfd`], [`eventfd_signal`], [`eventfd_drain`],
//!   [`eventfd_take_nowait`], [`wait_readable`], [`wait_any_readable`]) and a pipe
//!   where the reader must not share the writer's open file ([`pipe`],
//!   [`pipe_signal`], [`pipe_drain`], [`pipe_take`], [`SignalPipe`]) or the writer the
//!   reader's ([`WakePipe`], a socket pair that acts as one, and [`wake_signal`]: a
//!   client's wake-up of the NIC, an error rather than SIGPIPE once the NIC is gone),
//!   `epoll` to wait on several as one descriptor ([`epoll`], [`epoll_add`]), and
//!   `ppoll` to wait on several to the microsecond and learn which are ready
//!   ([`PollSet`], the NIC's sleep);
//! * hybrid CQ polling: a shared (cross-process) futex on a word of the doorbell page
//!   ([`futex_wait`], [`futex_wake`]);
//! * whether the NIC still runs, readable without a syscall: a robust futex the kernel
//!   marks when the NIC exits ([`life_sign`], [`LifeSignView`]; a macOS port would fall
//!   back to polling the control socket now and then);
//! * fd passing: `sendmsg`/`recvmsg` with `SCM_RIGHTS` ([`send_with_fds`],
//!   [`recv_with_fds`]);
//! * clocks: `CLOCK_MONOTONIC` and `CLOCK_REALTIME` in nanoseconds ([`monotonic_ns`],
//!   [`realtime_ns`]; completion timestamps), and the thread's CPU time
//!   ([`thread_cpu_ns`]; the benches);
//! * signals as rdma-core's libraries leave them to the program: a library thread that
//!   takes none ([`spawn_without_signals`]) and blocking waits that end with EINTR as a
//!   `read(2)` would ([`interrupted_wait_restarts`], [`wait_readable_as_read`]).
//!
//! A macOS port would substitute `shm_open` + `shm_unlink`, a pipe or kqueue user event,
//! and the same SCM_RIGHTS (which BSD has) behind these signatures, and for the futex
//! `os_sync_wait_on_address` / `os_sync_wake_by_address_all` (macOS 14.4, shared flag).
//!
//! Written directly against `libc` (already a workspace dependency) rather than `nix` or
//! `rustix`: it is a dozen calls, and each wrapper here returns `OwnedFd` as soon as the
//! kernel hands back a descriptor, which is the property that matters (no leaks on any
//! error path). `rustix` would be the choice if this seam grew.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;
#[cfg(target_os = "linux")]
mod life_sign;
#[cfg(target_os = "linux")]
pub use life_sign::{life_sign, LifeSign, LifeSignView, LIFE_SIGN_LEN};
#[cfg(target_os = "linux")]
mod poll_set;
#[cfg(target_os = "linux")]
pub use poll_set::PollSet;

#[cfg(not(target_os = "linux"))]
compile_error!("verbs-api's os seam is implemented for Linux only (see src/os/mod.rs)");
