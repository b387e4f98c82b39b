//! softnic: a userspace RDMA NIC speaking RoCEv2 over UDP.
//!
//! * [`decode`] — the capture decoder behind `softnic decode`.
//! * [`fuzz`] — `softnic fuzz`, a stateful RoCEv2 fuzzer aimed at a live peer.
//! * [`nic`] — the NIC process behind `softnic run`: control socket, shared-memory
//!   rings, UDP I/O, around the sans-IO transport in `softnic-transport`.
//! * [`perf`] — perftest-compatible benchmarks behind `softnic perf`.
//! * [`exec`] — `softnic exec`: run a stock libibverbs program on softnic.

pub mod decode;
pub mod exec;
pub mod fuzz;
pub mod nic;
pub mod perf;
