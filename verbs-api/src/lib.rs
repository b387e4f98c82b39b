//! softnic's verbs client library, and the shared-memory ABI between clients and the NIC.
//!
//! ```text
//!   application ── verbs-api ──(control: Unix socket, slow path)──► softnic run
//!                      │                                                │
//!                      └──(doorbell page, SQ/RQ/CQ rings, MRs: memfds)──┘
//!                          post/poll = loads and stores, no syscalls
//! ```
//!
//! (A post that finds the NIC asleep — idle for 100 µs, unless it runs with
//! `--busy-poll` — also writes the wake pipe: one `send(2)`.)
//!
//! The names follow libibverbs: [`Device::list`] / [`Device::open`] → [`Context`] →
//! [`ProtectionDomain`] → [`MemoryRegion`]; [`Context::create_cq`] →
//! [`CompletionQueue`]; [`ProtectionDomain::create_qp`] → [`QueuePair`], moved through
//! RESET → INIT → RTR → RTS with [`QueuePair::modify`] (or `to_init`/`to_rtr`/`to_rts`),
//! then [`QueuePair::post_send`] / [`QueuePair::post_recv`] and
//! [`CompletionQueue::poll`].
//!
//! ```no_run
//! use verbs_api::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Device::open("softnic0")?;
//! let pd = ctx.alloc_pd()?;
//! let mut mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let mut cq = ctx.create_cq(16)?;
//! let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
//! let mut qp = pd.create_qp(&QpInitAttr {
//!     qp_type: QpType::Rc, send_cq: &cq, recv_cq: &cq, cap, sq_sig_all: false,
//! })?;
//! qp.to_init(AccessFlags::REMOTE_WRITE)?;
//! let remote = QpEndpoint::default(); // from the out-of-band exchange (verbs_api::oob)
//! qp.to_rtr(&remote, Mtu::Mtu1024)?;
//! qp.to_rts(0)?;
//! mr.write(0, b"hello");
//! let sge = [mr.sge(0, 5)];
//! qp.post_send(&[SendWr::new(1, WrOpcode::RdmaWrite { remote_addr: 0x1000, rkey: 0x42 }, &sge).signaled()])?;
//! let mut wc = [WorkCompletion::default(); 4];
//! while cq.poll(&mut wc)? == 0 {}
//! # Ok(()) }
//! ```
//!
//! Modules:
//! * [`abi`]: ring layout, slots, layout functions, control messages — shared with the
//!   `softnic` NIC process, which depends on this crate for exactly that.
//! * [`os`]: the Linux seam (memfd, eventfd, pipes, SCM_RIGHTS).
//! * [`oob`]: the `ibv_rc_pingpong` TCP address exchange.
//! * [`xrc`]: XRC domains, XRC SRQs and the XRC QP types.

pub mod abi;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod fd_mr;
pub mod gid;
pub mod hint;
pub mod mr;
pub mod mw;
pub mod oob;
pub mod os;
pub mod pd;
pub mod poll_idle;
pub mod qp;
pub mod srq;
pub mod wr;
pub mod xrc;

pub use abi::control::{AsyncEvent, SrqAttr};
pub use cq::{CompletionQueue, PollIdle, WcOpcode, WcStatus, WorkCompletion};
pub use device::{Context, Device, DeviceAttributes};
pub use error::{Error, PostError, Result};
pub use fd_mr::FdMemoryRegion;
pub use gid::{Gid, ROCE_V2_PORT};
pub use mr::{AccessFlags, MemoryRegion};
pub use mw::{MemoryWindow, MwBindInfo};
pub use pd::ProtectionDomain;
pub use qp::{
    AhAttr, Mtu, QpAttr, QpCap, QpEndpoint, QpInitAttr, QpState, QpType, QueuePair,
    XrcSendQpInitAttr, DEFAULT_QKEY,
};
pub use srq::{SharedReceiveQueue, SrqInitAttr};
pub use wr::{RecvWr, SendFlags, SendWr, Sge, UdAddress, WrOpcode};
pub use xrc::{Xrcd, XrcdFlags};

#[cfg(test)]
mod tests {
    /// UD users (and `ibv_ud_pingpong` ports) need the Q_Key that `to_init` programs
    /// without reaching into the `qp` module; it is `ibv_ud_pingpong`'s 0x11111111.
    #[test]
    fn default_qkey_is_exported_at_the_root() {
        let root: u32 = crate::DEFAULT_QKEY;
        assert_eq!(root, 0x1111_1111);
        assert_eq!(root, crate::qp::DEFAULT_QKEY);
    }
}
