//! CPU time of the calling thread, shared by the benches that report it (`dataplane`,
//! `udp_ref`): unlike wall time, it barely moves with other load on the machine.

/// Nanoseconds this thread has run on a CPU (the first field of
/// `/proc/thread-self/schedstat`, the scheduler's `sum_exec_runtime`).
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat")
}
