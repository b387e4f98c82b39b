//! softnic: a userspace RDMA NIC speaking RoCEv2 over UDP.
//!
//! * [`decode`] — the capture decoder behind `softnic decode`.
//! * [`nic`] — the NIC process behind `softnic run`: control socket, shared-memory
//!   rings, UDP I/O, around the sans-IO transport in `softnic-transport`.

pub mod decode;
pub mod nic;
pub mod perf;
