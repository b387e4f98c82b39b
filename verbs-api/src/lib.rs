//! softnic's verbs client library, and the shared-memory ABI between clients and the NIC.
//!
//! * [`abi`]: ring layout, slots, layout functions, control messages — shared with the
//!   `softnic` NIC process, which depends on this crate for exactly that.
//! * [`os`]: the Linux seam (memfd, eventfd, SCM_RIGHTS).

pub mod abi;
pub mod os;
