//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`,
//! `ibv_query_srq`) and the asynchronous events they raise.
//!
//! An SRQ is one receive ring in a client-created memfd (layout
//! [`crate::abi::SrqLayout`]), shared with the NIC exactly like a QP's RQ: posting
//! validates each work request, writes its slot, publishes and rings the SRQ's doorbell,
//! with no syscall unless the NIC has set NEED_WAKEUP. QPs created with
//! [`ProtectionDomain::create_qp_with_srq`] take their receive WQEs from it, in posting
//! order; their receive completions carry their own QP number (`qp_num`).
//!
//! The SRQ limit ("low watermark", `ibv_modify_srq(3)`): once armed, the NIC raises
//! [`AsyncEvent::SrqLimitReached`] the first time a QP takes a WQE and fewer than the
//! limit remain, and disarms it (`query` reads 0 again). A QP on the SRQ that enters
//! ERR raises [`AsyncEvent::QpLastWqeReached`] once. Events are fetched with
//! [`Context::poll_async_events`] (the `ibv_get_async_event` of this library: it never
//! blocks); [`Context::async_event_channel`] gives a descriptor to `poll(2)` on until
//! there are some.
//!
//! An XRC SRQ ([`ProtectionDomain::create_xrc_srq`]) belongs to an XRC domain and
//! has a CQ of its own: it receives the requests that arrive on the XRC target QPs of
//! its domain naming its number ([`SharedReceiveQueue::srq_num`]), and their
//! completions go to its CQ, each with the target QP's number (see [`crate::xrc`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use crate::abi::control::{AsyncEvent, Reply, Request, SrqAttr, XrcSrqInit};
use crate::abi::{Producer, RecvWqe, Ring, SrqLayout};
use crate::cq::{CompletionQueue, CqShared};
use crate::device::Context;
use crate::error::{io, Error, PostError, Result};
use crate::os;
use crate::pd::{PdShared, ProtectionDomain};
use crate::qp::{QpState, QpType};
use crate::wr::{build_recv_wqe, QpLimits, RecvWr};
use crate::xrc::{Xrcd, XrcdShared};

/// `struct ibv_srq_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInitAttr {
    /// Most outstanding WQEs (rounded up to a power of two).
    pub max_wr: u32,
    /// SGEs per WQE (≤ 4).
    pub max_sge: u32,
    /// Limit armed at creation (0 = not armed).
    pub srq_limit: u32,
}

/// What QPs on an SRQ keep alive: the NIC's SRQ is destroyed when the
/// [`SharedReceiveQueue`] and every QP created on it are gone.
pub(crate) struct SrqShared {
    pub handle: u32,
    pub pd: Arc<PdShared>,
    /// An XRC SRQ's domain open and CQ, released after the SRQ is destroyed (fields
    /// drop after `Drop::drop`).
    _xrcd: Option<Arc<XrcdShared>>,
    _cq: Option<Arc<CqShared>>,
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        // Best effort: if the NIC is gone, everything is gone with the connection.
        let _ = self.pd.ctx.inner.call(
            "ibv_destroy_srq",
            &Request::DestroySrq { srq: self.handle },
            &[],
        );
    }
}

/// A shared receive queue (`struct ibv_srq`). `Send`; single producer (`&mut self` to
/// post).
pub struct SharedReceiveQueue {
    handle: u32,
    /// An XRC SRQ's number; 0 for a basic SRQ.
    srq_num: u32,
    /// Its slot on the context's doorbell page.
    doorbell: u32,
    attr: SrqAttr,
    ring: Producer<RecvWqe>,
    pd: Arc<PdShared>,
    pub(crate) shared: Arc<SrqShared>,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("handle", &self.handle)
            .field("attr", &self.attr)
            .finish()
    }
}

impl SharedReceiveQueue {
    pub(crate) fn create(
        pd: &ProtectionDomain,
        init: &SrqInitAttr,
        xrc: Option<(&Xrcd, &CompletionQueue)>,
    ) -> Result<Self> {
        let ctx = &pd.inner.ctx;
        if let Some((xrcd, cq)) = xrc {
            if !xrcd.same_context(ctx) || !Arc::ptr_eq(&cq.shared.ctx.inner, &ctx.inner) {
                return Err(Error::InvalidArgument(
                    "the XRC domain, the CQ and the PD of an XRC SRQ must belong to one \
                     device context"
                        .into(),
                ));
            }
        }
        let dev = ctx.inner.attr();
        let max_sge = dev.max_sge.min(crate::abi::MAX_SGE as u32);
        if init.max_sge > max_sge {
            return Err(Error::InvalidArgument(format!(
                "SRQ max_sge {} exceeds the device's {max_sge}",
                init.max_sge
            )));
        }
        let layout = SrqLayout::new(init.max_wr)?;
        let fd = os::memfd("softnic-srq", layout.len).map_err(io("creating the SRQ memfd"))?;
        let map = Arc::new(os::map_shared(fd.as_fd(), layout.len).map_err(io("mapping the SRQ"))?);
        let ring = Ring::<RecvWqe>::new(map, layout.offset, layout.capacity)?;
        ring.init();
        let req = Request::CreateSrq {
            pd: pd.inner.handle,
            attr: SrqAttr {
                max_wr: init.max_wr,
                max_sge: init.max_sge,
                srq_limit: init.srq_limit,
            },
            xrc: xrc.map(|(xrcd, cq)| XrcSrqInit {
                xrcd: xrcd.handle(),
                cq: cq.shared.handle,
            }),
        };
        let (reply, _) = pd
            .inner
            .ctx
            .inner
            .call("ibv_create_srq", &req, &[fd.as_fd()])?;
        let (handle, srq_num, attr, doorbell) = match reply {
            Reply::Srq {
                srq,
                srq_num,
                attr,
                doorbell,
            } => (srq, srq_num, attr, doorbell),
            other => {
                return Err(Error::Protocol(format!(
                    "CreateSrq answered with {other:?}"
                )))
            }
        };
        // A basic SRQ has no number (the reply's is 0 then; not trusted to be).
        let srq_num = if xrc.is_some() { srq_num } else { 0 };
        if xrc.is_some() && (srq_num == 0 || srq_num > 0xFF_FFFF) {
            // Destroyed again by the SrqShared below going out of scope.
            let _gone = SrqShared {
                handle,
                pd: pd.inner.clone(),
                _xrcd: None,
                _cq: None,
            };
            return Err(Error::Protocol(format!(
                "CreateSrq answered XRC SRQ number {srq_num:#x}, not a 24-bit non-zero one"
            )));
        }
        Ok(SharedReceiveQueue {
            handle,
            srq_num,
            doorbell,
            attr,
            ring: ring.into_producer(),
            pd: pd.inner.clone(),
            shared: Arc::new(SrqShared {
                handle,
                pd: pd.inner.clone(),
                _xrcd: xrc.map(|(x, _)| x.shared.clone()),
                _cq: xrc.map(|(_, c)| c.shared.clone()),
            }),
        })
    }

    /// An XRC SRQ's number (`ibv_get_srq_num`): what an XRC initiator names in its
    /// work requests ([`crate::SendWr::to_xrc_srq`]) to be received here; 24 bits,
    /// never 0. 0 for a basic SRQ.
    pub fn srq_num(&self) -> u32 {
        self.srq_num
    }

    /// Whether this is an XRC SRQ.
    pub fn is_xrc(&self) -> bool {
        self.srq_num != 0
    }

    /// The NIC's handle of this SRQ (what [`AsyncEvent`]s name).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Attributes granted at creation (`max_wr` is the ring capacity).
    pub fn attr(&self) -> SrqAttr {
        self.attr
    }

    pub(crate) fn same_pd(&self, pd: &ProtectionDomain) -> bool {
        Arc::ptr_eq(&self.pd, &pd.inner)
    }

    /// Posts receive work requests (`ibv_post_srq_recv`), with the conventions of
    /// [`crate::QueuePair::post_recv`]: on error the earlier ones are posted. No
    /// syscall unless the NIC is asleep.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.pd.ctx.inner.check_nic_alive()?;
        let q = QpLimits {
            qp_type: QpType::Rc,
            state: QpState::Init,
            max_send_sge: 0,
            max_recv_sge: self.attr.max_sge,
            max_inline: 0,
            sq_sig_all: false,
        };
        let mut result = Ok(());
        let mut pushed = 0usize;
        {
            for (index, wr) in wrs.iter().enumerate() {
                let pushed_one = build_recv_wqe(wr, &q).and_then(|wqe| {
                    let capacity = self.ring.ring().capacity();
                    self.ring.push(&wqe).map_err(|e| match e {
                        crate::abi::RingError::Full => PostError::QueueFull { capacity },
                        e => PostError::Ring(e),
                    })
                });
                if let Err(reason) = pushed_one {
                    result = Err(Error::Post {
                        index,
                        wr_id: wr.wr_id,
                        reason,
                    });
                    break;
                }
                pushed += 1;
            }
        }
        if pushed > 0 {
            self.ring.publish();
            self.pd.ctx.inner.ring_doorbell(self.doorbell)?;
        }
        result
    }

    /// `ibv_modify_srq` with IBV_SRQ_LIMIT: arms the limit event at `srq_limit`
    /// (0 disarms). Resizing is not supported.
    pub fn modify_limit(&mut self, srq_limit: u32) -> Result<()> {
        let req = Request::ModifySrq {
            srq: self.handle,
            max_wr: None,
            srq_limit: Some(srq_limit),
        };
        self.pd.ctx.inner.call("ibv_modify_srq", &req, &[])?;
        Ok(())
    }

    /// `ibv_query_srq`: `max_wr`, `max_sge` and the armed limit (0 once the limit event
    /// has fired).
    pub fn query(&self) -> Result<SrqAttr> {
        let req = Request::QuerySrq { srq: self.handle };
        match self.pd.ctx.inner.call("ibv_query_srq", &req, &[])?.0 {
            Reply::SrqInfo(a) => Ok(a),
            other => Err(Error::Protocol(format!("QuerySrq answered with {other:?}"))),
        }
    }
}

impl ProtectionDomain {
    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, init: &SrqInitAttr) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::create(self, init, None)
    }

    /// Creates an XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`) in `xrcd`, whose
    /// completions go to `cq`: it receives what remote XRC initiators send to the XRC
    /// target QPs of the domain naming its [`SharedReceiveQueue::srq_num`], checking
    /// memory keys against this PD. It keeps `xrcd`'s open and `cq` alive.
    pub fn create_xrc_srq(
        &self,
        xrcd: &Xrcd,
        cq: &CompletionQueue,
        init: &SrqInitAttr,
    ) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::create(self, init, Some((xrcd, cq)))
    }
}

impl Context {
    /// The asynchronous events the NIC has for this context, oldest first (empty if
    /// none). Never blocks: call it when convenient, e.g. between polls of a CQ.
    pub fn poll_async_events(&self) -> Result<Vec<AsyncEvent>> {
        match self
            .inner
            .call("ibv_get_async_event", &Request::GetAsyncEvents, &[])?
            .0
        {
            Reply::AsyncEvents(v) => Ok(v),
            other => Err(Error::Protocol(format!(
                "GetAsyncEvents answered with {other:?}"
            ))),
        }
    }

    /// A descriptor that becomes readable when the NIC has asynchronous events for this
    /// context: the read end of a pipe (non-blocking) the NIC writes when its list of
    /// pending events goes from empty to not empty. Wait on it with `poll(2)`, read it
    /// empty ([`crate::os::pipe_drain`]), *then* call [`Context::poll_async_events`]:
    /// an event noticed after that answer writes the pipe again. End of file means the
    /// NIC is gone. Every call returns the same pipe.
    pub fn async_event_channel(&self) -> Result<OwnedFd> {
        let req = Request::AsyncEventChannel;
        let (reply, mut fds) = self.inner.call("ibv_get_async_event", &req, &[])?;
        match (reply, fds.pop()) {
            (Reply::Done, Some(fd)) if fds.is_empty() => Ok(fd),
            (other, _) => Err(Error::Protocol(format!(
                "AsyncEventChannel answered with {other:?} and not one descriptor"
            ))),
        }
    }
}
