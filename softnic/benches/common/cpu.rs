//! CPU time of the calling thread, shared by the benches that report it (`dataplane`,
//! `udp_ref`): unlike wall time, it barely moves with other load on the machine.
//!
//! It is `verbs_api::os::thread_cpu_ns` (`CLOCK_THREAD_CPUTIME_ID`). Why that clock and
//! not `/proc/thread-self/schedstat` (which the benches read until session 37): the
//! scheduler brings a running thread's `sum_exec_runtime` up to date only at a tick or
//! a switch, so the file lags by up to a tick (4 ms at `HZ=250`) and a thread that
//! never sleeps reads whole ticks. A 0.26 s round then moved in steps of 1.5 %, and the
//! best of seven snapped to a tick (the `dataplane` 64 KiB figure read 12.10 GB/s, 65
//! ticks, on two different CPUs). The clock adds the time since the last update
//! (`task_sched_runtime`): the runtime as of the call, in nanoseconds.

pub use verbs_api::os::thread_cpu_ns;
