//! A drop-in `librdmacm.so.1` for softnic: rdma-core's RDMA CM C ABI over
//! [`verbs_api::cm`], whose connection manager (IBTA ch. 12 on QP1) runs in the NIC.
//!
//! Stock librdmacm is a client of the kernel's `/dev/infiniband/rdma_cm`, which a
//! softnic machine does not have. This crate implements the same calls — event
//! channels, ids, address/route resolution, listen/connect/accept/reject/disconnect,
//! QPs on ids, `rdma_getaddrinfo`, the endpoint calls of `<rdma/rdma_verbs.h>` — with
//! rdma-core's structs (`abi`, checked against `<rdma/rdma_cma.h>` by
//! `tests/layout.rs`) and errno conventions (0, or -1 with `errno`). See
//! `docs/rdmacm.md` for what works.
//!
//! How the libraries are made ([`builder`], [`exports`]): this crate's staticlib
//! contains softnic-ibverbs too, and *that* is linked into `libibverbs.so.1`, so the
//! `ibv_context`, PD, CQs and QP of an `rdma_cm_id` are the libibverbs objects
//! themselves; `librdmacm.so.1` carries rdma-core's version nodes and one jump per
//! symbol into libibverbs.so.1.
//!
//! Modules: [`channel`] (event channels, events), [`id`] (ids and the connection
//! calls), [`qp`] (QPs on ids, `rdma_init_qp_attr`), [`addr`] (`sockaddr`,
//! `rdma_getaddrinfo`), [`ep`] (`rdma_create_ep`, `rdma_get_request`), [`mcast`]
//! (joining and leaving multicast groups), [`rsocket`] (rsockets: stream sockets over
//! RC, rdma-core's protocol), [`misc`] (strings, devices, options, and what softnic
//! does not serve).
//!
//! Every `extern "C"` entry point is `unsafe`: pointer arguments are trusted as the C
//! API documents them; NULL is checked where rdma-core checks it.

pub mod abi;
pub mod addr;
pub mod builder;
pub mod channel;
pub mod ep;
pub mod exports;
pub mod id;
mod live;
pub mod mcast;
pub mod misc;
pub mod qp;
pub mod rsocket;
