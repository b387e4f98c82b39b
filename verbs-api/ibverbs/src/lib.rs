//! A drop-in `libibverbs.so.1` for softnic: rdma-core's C ABI over [`verbs_api`].
//!
//! Unmodified programs linked against rdma-core's libibverbs (ibverbs-utils, perftest,
//! pyverbs) load this library instead when its directory comes first in
//! `LD_LIBRARY_PATH` (`softnic exec` sets that up). They then see every NIC running
//! under `$SOFTNIC_DIR` as an RDMA device. See `docs/ibverbs.md` for what works.
//!
//! How the `.so` is made: this crate is a `staticlib`; [`builder`] links that archive
//! with `cc -shared` and `libibverbs.map` (rdma-core's version nodes `IBVERBS_1.0` …
//! `IBVERBS_1.18`, plus `IBVERBS_PRIVATE_34` for `ibv_query_gid_type`), and builds the
//! stub `libmlx5.so.1` / `libefa.so.1` that perftest links. A `cdylib` cannot do it:
//! rustc passes its own version script and the symbols come out unversioned, which the
//! loader rejects for binaries that import `ibv_get_device_list@IBVERBS_1.1`.
//!
//! Modules:
//! * [`abi`]: `#[repr(C)]` mirrors of the structs we fill, and the layout table the C
//!   test checks against `<infiniband/verbs.h>`.
//! * [`device`]: device list, open/close, device names/GUIDs.
//! * [`query`]: `ibv_query_device(_ex)`, `ibv_query_port`, GIDs, P_Keys.
//! * [`objects`]: PDs, CQs (`poll_cq`, `req_notify_cq`), completion channels.
//! * [`cq_ex`]: `ibv_create_cq_ex` and its `ibv_start_poll` … `ibv_wc_read_*` API.
//! * [`mr`]: `ibv_reg_mr` by remapping the program's pages onto a memfd.
//! * [`qp`]: RC/UC/UD QPs, `ibv_modify_qp`/`ibv_query_qp`, `post_send`/`post_recv`.
//! * [`srq`]: shared receive queues (`ibv_create_srq`, `post_srq_recv`, …).
//! * [`async_event`]: `ibv_get_async_event` and the watcher that feeds `async_fd`.
//! * [`ah`]: address handles for UD.
//! * [`wr`]: the `ibv_wr_*` post API of `ibv_qp_ex`.
//! * [`xrc`]: XRC domains and XRC SRQs (`ibv_open_xrcd`, `ibv_create_srq_ex`, …).
//! * [`strings`]: `ibv_*_str` helpers and the fork API.
//! * [`unsupported`]: every other verb the stock tools import, answering the errno
//!   rdma-core gives for a verb the provider does not implement.
//! * [`builder`]: links the shared libraries (used by `softnic exec` and the tests).
//! * [`internal`]: what the drop-in `librdmacm.so.1` (crate `softnic-rdmacm`, linked into
//!   the same library so both share one set of objects) needs from this one.
//!
//! Every `extern "C"` entry point is `unsafe`: its pointer arguments are trusted as the
//! C API documents them (as rdma-core does); NULL is checked where rdma-core checks it.
//! A Rust panic cannot cross the boundary (`extern "C"` aborts on unwind).

pub mod abi;
pub mod ah;
pub mod async_event;
pub mod builder;
pub mod cq_ex;
pub mod cq_resize;
pub mod device;
pub mod dm;
pub mod errno;
pub mod internal;
pub mod mr;
mod mr_backing;
pub mod mw;
pub mod objects;
pub mod odp;
pub mod parent_domain;
pub mod qp;
pub mod query;
pub mod srq;
pub mod strings;
mod unacked;
pub mod unsupported;
pub mod wr;
mod write_fence;
pub mod xrc;
