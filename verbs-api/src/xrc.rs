//! XRC, the extended reliable connected transport (IBTA annex A14): XRC domains
//! (`ibv_open_xrcd`), XRC SRQs (`ibv_create_srq_ex` with `IBV_SRQT_XRC`), and the two
//! XRC QP types.
//!
//! Why XRC: with RC, a process that receives from N peer processes needs a QP per
//! peer process and posts receives to each (or to an SRQ per QP's PD). With XRC, one
//! *initiator* QP ([`crate::QpType::XrcSend`], created on a PD with a send CQ) is connected,
//! like an RC QP, to one *target* QP ([`crate::QpType::XrcRecv`], created in an XRC domain
//! with no PD, no CQ and no work queues) of the remote NIC, and every work request
//! names the remote *XRC SRQ* its message is to be received through
//! ([`crate::SendWr::to_xrc_srq`]; on the wire the XRCETH, IBTA A14.4.1). Any SRQ of
//! the target QP's domain can be named, so one connection reaches every receive queue
//! of that domain. The SRQ supplies the receive WQE, checks the memory keys against
//! its own PD, and its CQ (given at creation) gets the completion, which carries the
//! target QP's number (`qp_num`).
//!
//! Domains: [`Context::open_xrcd`] takes an optional file. Opens naming the same file
//! (by `(st_dev, st_ino)`, what the kernel keys its domains by: an inode) share one
//! domain, so that a target QP made through one and an SRQ made through another meet,
//! in one process or several; the NIC shares a domain between the contexts of one
//! user (the kernel, between all processes that can open the file). Without a file,
//! every open is a domain of its own. The flags follow `ibv_open_xrcd(3)`: without
//! [`XrcdFlags::create`] a file must already have a domain; with
//! [`XrcdFlags::exclusive`] too it must not.
//!
//! Lifetimes: SRQs and target QPs keep their domain's open alive (an `Arc`, as QPs keep
//! their PD); the open is closed at the NIC when the [`Xrcd`] and all of them are
//! gone. [`Xrcd::close`] closes it now, and refuses while SRQs or QPs made through it
//! remain ([`Error::Busy`]), as the kernel refuses `ibv_close_xrcd` with EBUSY.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::abi::control::{Handle, Reply, Request};
use crate::device::Context;
use crate::error::{Error, Result};
use crate::qp::QueuePair;

/// `ibv_xrcd_init_attr.oflags`, as far as an XRC domain uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XrcdFlags {
    /// `O_CREAT`: create the file's domain if it has none yet. Without it, opening a
    /// file that has no domain fails (the NIC answers `NotFound`; the kernel's errno
    /// is EAGAIN). Ignored without a file: such an open always creates.
    pub create: bool,
    /// `O_EXCL` (with `O_CREAT`): fail if the file already has a domain
    /// (the NIC answers `InvalidArgument`, checking and creating in one step; the
    /// kernel's errno is EINVAL). Ignored without a file.
    pub exclusive: bool,
}

/// What an open of a domain is, shared by the [`Xrcd`] and the SRQs and target QPs
/// made through it; dropping the last of them closes the open at the NIC.
pub(crate) struct XrcdShared {
    pub ctx: Context,
    pub handle: Handle,
    /// The file's identity, if the open named one.
    inode: Option<(u64, u64)>,
    /// Still open at the NIC (false once [`Xrcd::close`] closed it).
    open: AtomicBool,
}

impl XrcdShared {
    /// Sends CloseXrcd.
    fn close_now(&self) -> Result<()> {
        close_open(&self.ctx, self.handle)?;
        self.open.store(false, Ordering::Release);
        Ok(())
    }
}

/// CloseXrcd of `handle`.
fn close_open(ctx: &Context, handle: Handle) -> Result<()> {
    let req = Request::CloseXrcd { xrcd: handle };
    match ctx.inner.call("ibv_close_xrcd", &req, &[])?.0 {
        Reply::Done => Ok(()),
        other => Err(Error::Protocol(format!(
            "CloseXrcd answered with {other:?}"
        ))),
    }
}

/// OpenXrcd; the handle of the new open.
fn open_once(ctx: &Context, inode: Option<(u64, u64)>, flags: XrcdFlags) -> Result<Handle> {
    let req = Request::OpenXrcd {
        inode,
        create: flags.create,
        exclusive: flags.create && flags.exclusive,
    };
    match ctx.inner.call("ibv_open_xrcd", &req, &[])?.0 {
        Reply::Xrcd { xrcd } => Ok(xrcd),
        other => Err(Error::Protocol(format!("OpenXrcd answered with {other:?}"))),
    }
}

impl Drop for XrcdShared {
    fn drop(&mut self) {
        if self.open.load(Ordering::Acquire) {
            // Best effort: if the NIC is gone, everything is gone with the connection.
            let _ = self.close_now();
        }
    }
}

/// An open XRC domain (`struct ibv_xrcd`). `Send + Sync`.
pub struct Xrcd {
    pub(crate) shared: Arc<XrcdShared>,
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xrcd")
            .field("handle", &self.shared.handle)
            .field("inode", &self.shared.inode)
            .finish()
    }
}

/// `(st_dev, st_ino)` of `fd`'s file: what names a shared domain.
fn file_identity(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a valid descriptor (BorrowedFd); `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::Io {
            what: "fstat of the XRC domain's file",
            source: std::io::Error::last_os_error(),
        });
    }
    // st_dev/st_ino are u64 on Linux targets, but not on every libc target.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.st_dev as u64, st.st_ino as u64))
}

impl Context {
    /// Opens an XRC domain (`ibv_open_xrcd`): the domain of `file` (shared by every
    /// open of this context naming the same file), or with `None` (fd −1) a new domain
    /// no other open can name. See the module doc and [`XrcdFlags`].
    /// With `O_CREAT|O_EXCL` the NIC checks that the file has no domain and makes it
    /// in one step, as the kernel does.
    pub fn open_xrcd(&self, file: Option<BorrowedFd<'_>>, flags: XrcdFlags) -> Result<Xrcd> {
        let inode = file.map(file_identity).transpose()?;
        let handle = open_once(self, inode, flags)?;
        Ok(Xrcd {
            shared: Arc::new(XrcdShared {
                ctx: self.clone(),
                handle,
                inode,
                open: AtomicBool::new(true),
            }),
        })
    }
}

impl Xrcd {
    /// The NIC's handle of this open.
    pub fn handle(&self) -> Handle {
        self.shared.handle
    }

    /// The context it was opened on.
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    /// `(st_dev, st_ino)` of the file it was opened with, if any.
    pub fn file(&self) -> Option<(u64, u64)> {
        self.shared.inode
    }

    /// Whether `ctx` is the context this domain was opened on.
    pub(crate) fn same_context(&self, ctx: &Context) -> bool {
        Arc::ptr_eq(&self.shared.ctx.inner, &ctx.inner)
    }

    /// Closes this open now (`ibv_close_xrcd`). While SRQs or target QPs made through
    /// it remain, it is refused with [`Error::Busy`] and the open is handed back, as
    /// the kernel answers EBUSY and the program keeps its `ibv_xrcd`; so is a refusal
    /// by the NIC. (Dropping the `Xrcd` instead never fails: the open is then closed
    /// when the last of them goes.)
    pub fn close(self) -> std::result::Result<(), (Xrcd, Error)> {
        let users = Arc::strong_count(&self.shared) - 1;
        if users > 0 {
            let e = Error::Busy(format!(
                "ibv_close_xrcd: {users} XRC SRQ(s) or receive QP(s) still use this XRC \
                 domain open"
            ));
            return Err((self, e));
        }
        match self.shared.close_now() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    /// Creates an XRC target QP (`ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`) in this
    /// domain: no PD, no CQs, no work queues (posting to it is refused). Connect it like
    /// an RC QP to a remote [`crate::QpType::XrcSend`] QP; the requests it receives are
    /// executed through the XRC SRQs of this domain they name.
    pub fn create_recv_qp(&self) -> Result<QueuePair> {
        QueuePair::create_xrc_recv(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two descriptors of one file name one domain; another file another.
    #[test]
    fn file_identity_is_the_inode() {
        let dir = std::env::temp_dir();
        let a = dir.join(format!("softnic-xrcd-a-{}", std::process::id()));
        let b = dir.join(format!("softnic-xrcd-b-{}", std::process::id()));
        let fa = std::fs::File::create(&a).unwrap();
        let fa2 = std::fs::File::open(&a).unwrap();
        let fb = std::fs::File::create(&b).unwrap();
        use std::os::fd::AsFd;
        let ia = file_identity(fa.as_fd()).unwrap();
        assert_eq!(file_identity(fa2.as_fd()).unwrap(), ia);
        assert_ne!(file_identity(fb.as_fd()).unwrap(), ia);
        let _ = std::fs::remove_file(a);
        let _ = std::fs::remove_file(b);
    }
}
