//! The verbs objects of one rsocket connection ([`Endpoint`]) and the sizes they are
//! made with ([`Sizes`]): what rdma-core's `rs_create_ep` and `rs_init_bufs` make.

use verbs_api::cm::CmId;
use verbs_api::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr,
    QpType, QueuePair, RecvWr,
};

use super::proto::{self, ConnData, Sge};
use super::stream::RECV_FLAG;

/// Queue and buffer sizes, from the socket options (`SO_SNDBUF`, `SO_RCVBUF`,
/// `RDMA_SQSIZE`, `RDMA_RQSIZE`, `RDMA_INLINE`); rdma-core's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Send queue depth (4 of it kept for control messages).
    pub sq_size: u32,
    /// Receive queue depth: the credits offered to the peer.
    pub rq_size: u32,
    /// Inline bytes per send.
    pub sq_inline: u32,
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes (two halves the peer writes in turn).
    pub rbuf_size: u32,
    /// Entries of the iomap array the peer's `riomap`s fill (`RDMA_IOMAPSIZE`, as
    /// its 8-bit scale rounds it; 0 = the peer may map nothing here).
    pub iomap_size: u32,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            sq_size: 384,
            rq_size: 384,
            sq_inline: 64,
            sbuf_size: 1 << 17,
            rbuf_size: 1 << 17,
            iomap_size: 0,
        }
    }
}

/// Largest buffer a socket option may ask for (1 GiB each way).
const MAX_BUF: u32 = 1 << 30;

/// The verbs objects of one connection: PD, one CQ for both queues, the RC QP, the
/// send buffer (with the control-message slots after it), the receive buffer and the
/// target SGL array the peer writes grants into, followed by the iomap array its
/// `riomap`s fill.
pub struct Endpoint {
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) qp: QueuePair,
    pub(super) sbuf: MemoryRegion,
    pub(super) rbuf: MemoryRegion,
    pub(super) tgt: MemoryRegion,
    pub(super) sizes: Sizes,
}

impl Endpoint {
    /// Creates the objects on `ctx` for `id`, moves the QP to INIT as the CM does and
    /// posts every receive (`rs_create_ep`). Sizes are clamped to the device and to
    /// rsockets' limits.
    pub fn create(ctx: &Context, id: &CmId, mut sizes: Sizes) -> verbs_api::Result<Endpoint> {
        let max = ctx.attributes().max_qp_wr.min(proto::QP_MAX_SIZE);
        sizes.sq_size = sizes.sq_size.clamp(proto::QP_MIN_SIZE, max);
        sizes.rq_size = sizes.rq_size.clamp(proto::QP_MIN_SIZE, max);
        sizes.sq_inline = sizes.sq_inline.min(ctx.attributes().max_inline);
        sizes.sbuf_size = sizes.sbuf_size.clamp(proto::SNDLOWAT << 1, MAX_BUF);
        // Two non-empty halves, each at least one low-water mark.
        sizes.rbuf_size = sizes.rbuf_size.clamp(proto::SNDLOWAT << 1, MAX_BUF) & !1;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(sizes.sq_size + sizes.rq_size)?;
        let mut qp = pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: sizes.sq_size,
                max_recv_wr: sizes.rq_size,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: sizes.sq_inline,
            },
            sq_sig_all: true,
        })?;
        sizes.sq_inline = qp.cap().max_inline_data;
        id.init_qp(&mut qp)?;
        let ctrl = proto::SGE_LEN * proto::QP_CTRL_SIZE as usize;
        let sbuf = pd.alloc_mr(sizes.sbuf_size as usize + ctrl, AccessFlags::LOCAL_WRITE)?;
        let remote = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
        sizes.iomap_size = proto::scale_to_value(proto::value_to_scale(sizes.iomap_size));
        let tgt_len = proto::SGE_LEN * proto::SGL_SIZE as usize
            + proto::IOMAP_LEN * sizes.iomap_size as usize;
        let tgt = pd.alloc_mr(tgt_len, remote)?;
        let rbuf = pd.alloc_mr(sizes.rbuf_size as usize, remote)?;
        let mut ep = Endpoint {
            pd,
            cq,
            qp,
            sbuf,
            rbuf,
            tgt,
            sizes,
        };
        for _ in 0..sizes.rq_size {
            ep.post_recv()?;
        }
        Ok(ep)
    }

    /// The QP (for the CM's connect and accept).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// What this side tells the peer (`rs_format_conn_data`): its credits, target SGL
    /// array (and the size of the iomap array after it) and the first half of its
    /// receive buffer.
    pub fn conn_data(&self) -> ConnData {
        ConnData {
            flags: proto::CONN_FLAG_IOMAP
                | if proto::HOST_IS_NET {
                    proto::CONN_FLAG_NET
                } else {
                    0
                },
            credits: self.sizes.rq_size as u16,
            target_iomap_size: proto::value_to_scale(self.sizes.iomap_size),
            target_sgl: Sge {
                addr: self.tgt.addr(),
                key: self.tgt.rkey(),
                length: proto::SGL_SIZE,
            },
            data_buf: Sge {
                addr: self.rbuf.addr(),
                key: self.rbuf.rkey(),
                length: self.sizes.rbuf_size >> 1,
            },
        }
    }

    /// The sizes in force (after clamping).
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    /// One zero-length receive: the peer's WRITE with immediate places the data, the
    /// receive only carries the immediate.
    pub(super) fn post_recv(&mut self) -> verbs_api::Result<()> {
        self.qp.post_recv(&[RecvWr::new(RECV_FLAG, &[])])
    }
}
