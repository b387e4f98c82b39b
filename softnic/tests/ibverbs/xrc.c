/* XRC through the C ABI between two NICs.
 *
 *   xrc DEV_A DEV_B
 *
 * Each side (x on DEV_A, y on DEV_B) opens an XRC domain from a temporary file, makes
 * an XRC SRQ with its CQ, an XRC_SEND QP and an XRC_RECV QP; x's send QP is connected
 * to y's receive QP and the other way round (INIT/RTR/RTS with exactly the masks the
 * kernel's table requires: an XRC_RECV QP's RTR->RTS takes TIMEOUT|SQ_PSN only). Cases:
 *  - IBV_DEVICE_XRC in device_cap_flags; the XRC ODP capabilities.
 *  - ibv_open_xrcd: EINVAL without FD or OFLAGS, EOPNOTSUPP for a reserved mask bit,
 *    EBADF for a closed descriptor, EAGAIN for a file without a domain opened without
 *    O_CREAT, EINVAL for O_CREAT|O_EXCL on a file that has one (also from another
 *    context, which opens that domain without O_CREAT); fd -1 is a domain of its own. x opens its file twice: its SRQ is made through one open and its
 *    XRC_RECV QP through the other, so a SEND reaching that QP proves the two opens
 *    share one domain.
 *  - ibv_create_srq_ex: EINVAL without XRCD or CQ, EOPNOTSUPP for a tag-matching SRQ;
 *    a basic SRQ through the op has no XRC number (ibv_get_srq_num: EINVAL); the XRC
 *    SRQs' numbers are non-zero 24-bit numbers; ibv_query_srq and ibv_modify_srq (the
 *    limit) on an XRC SRQ.
 *  - ibv_create_qp_ex: EINVAL for XRC_RECV without XRCD and XRC_SEND without PD;
 *    ibv_query_qp reports each type, with no receive queue (and an XRC_RECV QP no send
 *    queue).
 *  - post_recv on either XRC QP and post_send on an XRC_RECV QP are refused, bad_wr
 *    naming the WR.
 *  - SENDs both ways naming the remote SRQ (qp_type.xrc.remote_srqn), one with
 *    immediate data and one inline: the bytes land in the SRQ's buffers, the receive
 *    completion on the SRQ's CQ names the XRC_RECV QP; the send completion names the
 *    XRC_SEND QP.
 *  - An RDMA WRITE, an RDMA READ and a FETCH_AND_ADD through XRC (keys of the SRQ's PD).
 *  - The ibv_wr_* API on an extended XRC_SEND QP to a second XRC_RECV QP of y's
 *    domain: ibv_wr_set_xrc_srqn (and EINVAL at ibv_wr_complete without it); the SEND
 *    lands in the same SRQ, its completion naming the second QP.
 *  - ibv_close_xrcd is EBUSY while the SRQ or QP made through that open lives, and so
 *    are destroying the SRQ's CQ and deallocating its PD; then everything is freed in
 *    order, 0 each.
 * Prints "ok" at the end; any mismatch prints FAIL and exits 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define BUF 4096

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "FAIL %s (errno %d)\n", what, errno);
		exit(2);
	}
}

/* One XRC side. */
struct xside {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int fd;
	char path[64];
	struct ibv_xrcd *xrcd;	/* the SRQ's open */
	struct ibv_xrcd *xrcd2; /* x: a second open of the same file, for its XRC_RECV QP */
	struct ibv_srq *srq;
	uint32_t srqn;
	struct ibv_qp *sqp, *rqp;
	unsigned char *buf;
	struct ibv_mr *mr;
	union ibv_gid gid;
};

static struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags)
{
	struct ibv_xrcd_init_attr a = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd,
		.oflags = oflags,
	};
	return ibv_open_xrcd(ctx, &a);
}

static struct ibv_srq *xrc_srq(struct xside *s, struct ibv_xrcd *xrcd, uint32_t mask)
{
	struct ibv_srq_init_attr_ex a = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = mask,
		.srq_type = IBV_SRQT_XRC,
		.pd = s->pd,
		.xrcd = xrcd,
		.cq = s->cq,
	};
	return ibv_create_srq_ex(s->ctx, &a);
}

static struct ibv_qp *xrc_recv_qp(struct ibv_context *ctx, struct ibv_xrcd *xrcd, uint32_t mask)
{
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = mask,
		.xrcd = xrcd,
	};
	return ibv_create_qp_ex(ctx, &a);
}

static struct ibv_qp *xrc_send_qp(struct xside *s, uint32_t mask, uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = s->cq,
		/* Given as pyverbs gives it; an XRC_SEND QP has no receive queue to use it. */
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_XRC_SEND,
		.cap = { .max_send_wr = 16, .max_send_sge = 1, .max_inline_data = 64 },
		.comp_mask = mask,
		.pd = s->pd,
		.send_ops_flags = send_ops,
	};
	return ibv_create_qp_ex(s->ctx, &a);
}

static void side_open_xrc(struct xside *s, const char *dev, int second_open)
{
	s->ctx = open_named(dev);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	check(s->pd && s->cq, "pd/cq");
	strcpy(s->path, "/tmp/softnic-xrc.XXXXXX");
	s->fd = mkstemp(s->path);
	check(s->fd >= 0, "mkstemp");
	s->xrcd = open_xrcd(s->ctx, s->fd, O_CREAT);
	check(s->xrcd && s->xrcd->context == s->ctx, "open_xrcd O_CREAT");
	s->xrcd2 = s->xrcd;
	if (second_open) {
		/* The file has a domain now: no O_CREAT needed, and the same domain. */
		s->xrcd2 = open_xrcd(s->ctx, s->fd, 0);
		check(s->xrcd2 && s->xrcd2 != s->xrcd, "a second open of the same file");
	}
	s->srq = xrc_srq(s, s->xrcd, IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
					     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ);
	check(s->srq != NULL, "create XRC SRQ");
	check(ibv_get_srq_num(s->srq, &s->srqn) == 0 && s->srqn != 0 && s->srqn < (1u << 24),
	      "ibv_get_srq_num: a non-zero 24-bit number");
	s->sqp = xrc_send_qp(s, IBV_QP_INIT_ATTR_PD, 0);
	check(s->sqp != NULL, "create XRC_SEND QP");
	s->rqp = xrc_recv_qp(s->ctx, s->xrcd2, IBV_QP_INIT_ATTR_XRCD);
	check(s->rqp != NULL, "create XRC_RECV QP");
	check(s->sqp->qp_type == IBV_QPT_XRC_SEND && s->rqp->qp_type == IBV_QPT_XRC_RECV &&
		      s->sqp->pd == s->pd && s->sqp->send_cq == s->cq && s->rqp->pd == NULL,
	      "the public QP fields");
	s->buf = memalign(4096, BUF);
	check(s->buf != NULL, "memalign");
	memset(s->buf, 0, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	check(s->mr != NULL, "reg_mr");
	check(!ibv_query_gid(s->ctx, 1, 1, &s->gid), "query_gid");
}

static void to_init(struct ibv_qp *qp, unsigned int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = access };
	check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS),
	      "INIT");
}

static void rtr_attr(struct ibv_qp_attr *a, uint32_t dest_qpn, union ibv_gid gid)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_RTR;
	a->path_mtu = IBV_MTU_1024;
	a->dest_qp_num = dest_qpn;
	a->rq_psn = 0;
	a->max_dest_rd_atomic = 1;
	a->min_rnr_timer = 12;
	a->ah_attr.is_global = 1;
	a->ah_attr.grh.dgid = gid;
	a->ah_attr.grh.sgid_index = 1;
	a->ah_attr.grh.hop_limit = 1;
	a->ah_attr.port_num = 1;
}

/* An XRC_SEND QP to the peer's XRC_RECV QP `dest` on the NIC of `gid`. */
static void connect_send(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a;
	to_init(qp, 0);
	rtr_attr(&a, dest, gid);
	check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
	      "XRC_SEND RTR (AV, PATH_MTU, DEST_QPN, RQ_PSN)");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 18; /* 1 s: a loaded 2-vCPU host (see rc_pair.h) */
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC),
	      "XRC_SEND RTS");
}

/* An XRC_RECV QP from the peer's XRC_SEND QP `dest` on the NIC of `gid`. */
static void connect_recv(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a;
	to_init(qp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC);
	rtr_attr(&a, dest, gid);
	check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	      "XRC_RECV RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 18;
	a.sq_psn = 0;
	check(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN),
	      "XRC_RECV RTS (TIMEOUT, SQ_PSN only)");
}

static struct ibv_wc one_wc(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 2000000000L; spins++)
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				fprintf(stderr, "%s: status %d (%s) vendor_err 0x%x\n", what,
					wc.status, ibv_wc_status_str(wc.status), wc.vendor_err);
			check(wc.status == IBV_WC_SUCCESS, what);
			return wc;
		}
	check(0, what);
	return wc;
}

static void post_srq_buf(struct xside *s, uint64_t wr_id, size_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)(s->buf + off), len, s->mr->lkey };
	struct ibv_recv_wr r = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	check(!ibv_post_srq_recv(s->srq, &r, &bad), "post_srq_recv");
}

/* `from` SENDs `len` bytes at `from->buf + off` (or inline) to `to`'s SRQ, which has a
 * buffer at `to->buf + off`; checks both completions and the bytes. */
static void xrc_send(struct xside *from, struct xside *to, size_t off, uint32_t len,
		     unsigned char fill, int imm, int inline_, uint64_t wr_id)
{
	memset(from->buf + off, fill, len);
	memset(to->buf + off, 0, len);
	post_srq_buf(to, wr_id, off, len);
	struct ibv_sge sge = { (uintptr_t)(from->buf + off), len, from->mr->lkey };
	struct ibv_send_wr w = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				 .opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED | (inline_ ? IBV_SEND_INLINE : 0) },
			   *bad;
	w.imm_data = htobe32(0x1234abcd);
	w.qp_type.xrc.remote_srqn = to->srqn;
	check(!ibv_post_send(from->sqp, &w, &bad), "post_send XRC SEND");
	struct ibv_wc s = one_wc(from->cq, "the XRC SEND completes");
	check(s.wr_id == wr_id && s.opcode == IBV_WC_SEND && s.qp_num == from->sqp->qp_num,
	      "the send completion names the XRC_SEND QP");
	struct ibv_wc r = one_wc(to->cq, "the XRC receive completes on the SRQ's CQ");
	check(r.wr_id == wr_id && r.opcode == IBV_WC_RECV && r.byte_len == len,
	      "the receive completion's wr_id, opcode and length");
	check(r.qp_num == to->rqp->qp_num, "the receive completion names the XRC_RECV QP");
	check(!imm || ((r.wc_flags & IBV_WC_WITH_IMM) && r.imm_data == htobe32(0x1234abcd)),
	      "the immediate data");
	for (uint32_t k = 0; k < len; k++)
		check(to->buf[off + k] == fill, "every byte of the XRC SEND landed");
}

static void error_cases(struct xside *x, const char *dev)
{
	struct ibv_device_attr da;
	check(!ibv_query_device(x->ctx, &da) && (da.device_cap_flags & IBV_DEVICE_XRC),
	      "IBV_DEVICE_XRC");
	struct ibv_device_attr_ex dax;
	check(!ibv_query_device_ex(x->ctx, NULL, &dax) &&
		      (dax.xrc_odp_caps & IBV_ODP_SUPPORT_SRQ_RECV),
	      "the XRC ODP capabilities");

	char path[] = "/tmp/softnic-xrc-e.XXXXXX";
	int fd = mkstemp(path);
	check(fd >= 0, "mkstemp");
	struct ibv_xrcd_init_attr a = { .comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = fd,
					.oflags = O_CREAT };
	errno = 0;
	check(!ibv_open_xrcd(x->ctx, &a) && errno == EINVAL, "open_xrcd without OFLAGS: EINVAL");
	a.comp_mask = IBV_XRCD_INIT_ATTR_OFLAGS;
	errno = 0;
	check(!ibv_open_xrcd(x->ctx, &a) && errno == EINVAL, "open_xrcd without FD: EINVAL");
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS |
		      IBV_XRCD_INIT_ATTR_RESERVED;
	errno = 0;
	check(!ibv_open_xrcd(x->ctx, &a) && errno == EOPNOTSUPP,
	      "open_xrcd with a reserved bit: EOPNOTSUPP");
	errno = 0;
	check(!open_xrcd(x->ctx, fd, 0) && errno == EAGAIN,
	      "a file without a domain, no O_CREAT: EAGAIN");
	struct ibv_xrcd *d = open_xrcd(x->ctx, fd, O_CREAT | O_EXCL);
	check(d != NULL, "O_CREAT|O_EXCL on a file without a domain");
	errno = 0;
	check(!open_xrcd(x->ctx, fd, O_CREAT | O_EXCL) && errno == EINVAL,
	      "O_CREAT|O_EXCL on a file with a domain: EINVAL");
	struct ibv_xrcd *d2 = open_xrcd(x->ctx, fd, O_CREAT);
	check(d2 != NULL, "O_CREAT on a file with a domain opens it");
	/* Another context of the same user sees the file's domain too. */
	struct ibv_context *ctx2 = open_named(dev);
	errno = 0;
	check(!open_xrcd(ctx2, fd, O_CREAT | O_EXCL) && errno == EINVAL,
	      "O_CREAT|O_EXCL from another context: EINVAL");
	struct ibv_xrcd *d3 = open_xrcd(ctx2, fd, 0);
	check(d3 != NULL, "another context opens the file's domain without O_CREAT");
	check(!ibv_close_xrcd(d3) && !ibv_close_device(ctx2), "close the other context's open");
	check(!ibv_close_xrcd(d2) && !ibv_close_xrcd(d), "close both opens");
	errno = 0;
	check(!open_xrcd(x->ctx, fd, 0) && errno == EAGAIN,
	      "the domain is gone with its last open: EAGAIN");
	struct ibv_xrcd *p1 = open_xrcd(x->ctx, -1, O_CREAT);
	struct ibv_xrcd *p2 = open_xrcd(x->ctx, -1, O_CREAT | O_EXCL);
	check(p1 && p2, "fd -1: a domain of its own each time");
	close(fd);
	unlink(path);
	errno = 0;
	check(!open_xrcd(x->ctx, fd, O_CREAT) && errno == EBADF, "a closed fd: EBADF");

	/* SRQs: XRC without XRCD or CQ, tag matching; a basic SRQ through the op. */
	struct xside t = *x;
	errno = 0;
	check(!xrc_srq(&t, p1, IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				       IBV_SRQ_INIT_ATTR_CQ) &&
		      errno == EINVAL,
	      "an XRC SRQ without XRCD: EINVAL");
	errno = 0;
	check(!xrc_srq(&t, p1, IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				       IBV_SRQ_INIT_ATTR_XRCD) &&
		      errno == EINVAL,
	      "an XRC SRQ without CQ: EINVAL");
	struct ibv_srq_init_attr_ex tm = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
			     IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM,
		.pd = x->pd,
		.cq = x->cq,
		.tm_cap = { .max_num_tags = 4, .max_ops = 4 },
	};
	errno = 0;
	check(!ibv_create_srq_ex(x->ctx, &tm) && errno == EOPNOTSUPP,
	      "a tag-matching SRQ: EOPNOTSUPP");
	struct ibv_srq_init_attr_ex basic = {
		.attr = { .max_wr = 10, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_BASIC,
		.pd = x->pd,
		.cq = x->cq,
	};
	struct ibv_srq *bs = ibv_create_srq_ex(x->ctx, &basic);
	uint32_t n = 7;
	check(bs && basic.attr.max_wr >= 10, "a basic SRQ through ibv_create_srq_ex");
	check(ibv_get_srq_num(bs, &n) == EINVAL && n == 7, "a basic SRQ has no XRC number");
	check(!ibv_destroy_srq(bs), "destroy the basic SRQ");

	/* QPs: each XRC type without what it needs. */
	errno = 0;
	check(!xrc_recv_qp(x->ctx, p1, IBV_QP_INIT_ATTR_PD) && errno == EINVAL,
	      "XRC_RECV without IBV_QP_INIT_ATTR_XRCD: EINVAL");
	errno = 0;
	check(!xrc_send_qp(x, IBV_QP_INIT_ATTR_XRCD, 0) && errno == EINVAL,
	      "XRC_SEND without IBV_QP_INIT_ATTR_PD: EINVAL");
	check(!ibv_close_xrcd(p1) && !ibv_close_xrcd(p2), "close the private domains");
}

/* ibv_query_qp's type and queues; posts the XRC QPs refuse. */
static void query_and_refusals(struct xside *s)
{
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr ia;
	check(!ibv_query_qp(s->sqp, &qa, IBV_QP_STATE, &ia) && ia.qp_type == IBV_QPT_XRC_SEND &&
		      qa.qp_state == IBV_QPS_RTS && ia.cap.max_send_wr >= 16 &&
		      ia.cap.max_recv_wr == 0 && ia.cap.max_recv_sge == 0,
	      "query XRC_SEND");
	check(!ibv_query_qp(s->rqp, &qa, IBV_QP_STATE, &ia) && ia.qp_type == IBV_QPT_XRC_RECV &&
		      qa.qp_state == IBV_QPS_RTS && ia.cap.max_send_wr == 0 &&
		      ia.cap.max_recv_wr == 0,
	      "query XRC_RECV");
	struct ibv_srq_attr sa;
	check(!ibv_query_srq(s->srq, &sa) && sa.max_wr >= 16 && sa.max_sge == 1,
	      "query the XRC SRQ");
	sa.srq_limit = 3;
	check(!ibv_modify_srq(s->srq, &sa, IBV_SRQ_LIMIT) && !ibv_query_srq(s->srq, &sa) &&
		      sa.srq_limit == 3,
	      "arm the XRC SRQ's limit");
	sa.srq_limit = 0;
	check(!ibv_modify_srq(s->srq, &sa, IBV_SRQ_LIMIT), "disarm it");
	struct ibv_sge sge = { (uintptr_t)s->buf, 8, s->mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *rbad = NULL;
	check(ibv_post_recv(s->sqp, &r, &rbad) == EINVAL && rbad == &r,
	      "post_recv on XRC_SEND: EINVAL");
	rbad = NULL;
	check(ibv_post_recv(s->rqp, &r, &rbad) == EINVAL && rbad == &r,
	      "post_recv on XRC_RECV: EINVAL");
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND },
			   *sbad = NULL;
	check(ibv_post_send(s->rqp, &w, &sbad) == EINVAL && sbad == &w,
	      "post_send on XRC_RECV: EINVAL");
}

int main(int argc, char **argv)
{
	struct xside x = { 0 }, y = { 0 };
	if (argc != 3)
		die("usage: xrc DEV_A DEV_B");
	side_open_xrc(&x, argv[1], 1);
	side_open_xrc(&y, argv[2], 0);
	error_cases(&x, argv[1]);
	connect_send(x.sqp, y.rqp->qp_num, y.gid);
	connect_recv(y.rqp, x.sqp->qp_num, x.gid);
	connect_send(y.sqp, x.rqp->qp_num, x.gid);
	connect_recv(x.rqp, y.sqp->qp_num, y.gid);
	query_and_refusals(&x);
	query_and_refusals(&y);

	/* SENDs both ways, with immediate data and inline. */
	xrc_send(&x, &y, 0, 1024, 0x5a, 0, 0, 11);
	xrc_send(&y, &x, 0, 1024, 0xa5, 0, 0, 12);
	xrc_send(&x, &y, 1024, 100, 0x3c, 1, 0, 13);
	xrc_send(&y, &x, 2048, 48, 0xc3, 0, 1, 14);

	/* An RDMA WRITE, an RDMA READ and a FETCH_AND_ADD through XRC, with y's keys. */
	memset(x.buf + 3072, 0x77, 512);
	memset(y.buf + 3072, 0, 512);
	struct ibv_sge ws = { (uintptr_t)(x.buf + 3072), 512, x.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 21, .sg_list = &ws, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	w.wr.rdma.remote_addr = (uintptr_t)(y.buf + 3072);
	w.wr.rdma.rkey = y.mr->rkey;
	w.qp_type.xrc.remote_srqn = y.srqn;
	check(!ibv_post_send(x.sqp, &w, &bad), "post XRC RDMA WRITE");
	struct ibv_wc wc = one_wc(x.cq, "the XRC WRITE completes");
	check(wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 21, "the WRITE's completion");
	for (int k = 0; k < 512; k++)
		check(y.buf[3072 + k] == 0x77, "every byte of the XRC WRITE landed");
	memset(y.buf + 3584, 0x99, 256);
	memset(x.buf + 3584, 0, 256);
	struct ibv_sge rs = { (uintptr_t)(x.buf + 3584), 256, x.mr->lkey };
	w.wr_id = 22;
	w.sg_list = &rs;
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = (uintptr_t)(y.buf + 3584);
	check(!ibv_post_send(x.sqp, &w, &bad), "post XRC RDMA READ");
	wc = one_wc(x.cq, "the XRC READ completes");
	check(wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 256, "the READ's completion");
	for (int k = 0; k < 256; k++)
		check(x.buf[3584 + k] == 0x99, "every byte of the XRC READ arrived");
	uint64_t *target = (uint64_t *)(y.buf + 3840), *result = (uint64_t *)(x.buf + 3840);
	*target = 40;
	*result = 0;
	struct ibv_sge as = { (uintptr_t)result, 8, x.mr->lkey };
	struct ibv_send_wr aw = { .wr_id = 23, .sg_list = &as, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED };
	aw.wr.atomic.remote_addr = (uintptr_t)target;
	aw.wr.atomic.rkey = y.mr->rkey;
	aw.wr.atomic.compare_add = 2;
	aw.qp_type.xrc.remote_srqn = y.srqn;
	check(!ibv_post_send(x.sqp, &aw, &bad), "post XRC FETCH_AND_ADD");
	wc = one_wc(x.cq, "the XRC FETCH_AND_ADD completes");
	check(wc.opcode == IBV_WC_FETCH_ADD && *result == 40 && *target == 42,
	      "the FETCH_AND_ADD's old value and new value");

	/* The ibv_wr_* API: a second XRC_SEND QP of x, extended, to a second XRC_RECV QP
	 * of y's domain, whose SENDs land in the same SRQ. */
	struct ibv_qp *sqp2 = xrc_send_qp(&x, IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					  IBV_QP_EX_WITH_SEND);
	struct ibv_qp *rqp2 = xrc_recv_qp(y.ctx, y.xrcd, IBV_QP_INIT_ATTR_XRCD);
	check(sqp2 && rqp2, "a second XRC QP pair");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(sqp2);
	check(qx != NULL, "ibv_qp_to_qp_ex of an extended XRC_SEND QP");
	connect_send(sqp2, rqp2->qp_num, y.gid);
	connect_recv(rqp2, sqp2->qp_num, x.gid);
	memset(x.buf, 0xe1, 200);
	memset(y.buf, 0, 200);
	post_srq_buf(&y, 31, 0, 200);
	ibv_wr_start(qx);
	qx->wr_id = 31;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, x.mr->lkey, (uintptr_t)x.buf, 200);
	check(ibv_wr_complete(qx) == EINVAL, "ibv_wr_complete without the XRC SRQ number: EINVAL");
	ibv_wr_start(qx);
	qx->wr_id = 31;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_xrc_srqn(qx, y.srqn);
	ibv_wr_set_sge(qx, x.mr->lkey, (uintptr_t)x.buf, 200);
	check(ibv_wr_complete(qx) == 0, "ibv_wr_complete with ibv_wr_set_xrc_srqn");
	wc = one_wc(x.cq, "the ibv_wr_send completes");
	check(wc.qp_num == sqp2->qp_num && wc.wr_id == 31, "its send completion");
	wc = one_wc(y.cq, "its receive completes on the SRQ's CQ");
	check(wc.qp_num == rqp2->qp_num && wc.byte_len == 200 && wc.wr_id == 31,
	      "the receive completion names the second XRC_RECV QP");
	for (int k = 0; k < 200; k++)
		check(y.buf[k] == 0xe1, "every byte of the ibv_wr_send landed");

	/* In use: the opens, the SRQ's CQ and PD. */
	check(ibv_close_xrcd(x.xrcd) == EBUSY, "close_xrcd with its SRQ: EBUSY");
	check(ibv_close_xrcd(x.xrcd2) == EBUSY, "close_xrcd with its XRC_RECV QP: EBUSY");
	check(ibv_destroy_cq(x.cq) == EBUSY, "destroy_cq of an XRC SRQ's CQ: EBUSY");
	check(ibv_dealloc_pd(y.pd) == EBUSY, "dealloc_pd of an XRC SRQ's PD: EBUSY");
	check(!ibv_destroy_qp(sqp2) && !ibv_destroy_qp(rqp2), "destroy the second pair");
	struct xside *sides[2] = { &x, &y };
	for (int i = 0; i < 2; i++) {
		struct xside *s = sides[i];
		check(!ibv_destroy_qp(s->sqp), "destroy XRC_SEND");
		check(!ibv_destroy_qp(s->rqp), "destroy XRC_RECV");
		if (s->xrcd2 != s->xrcd)
			check(!ibv_close_xrcd(s->xrcd2), "close the QP's open");
		check(ibv_close_xrcd(s->xrcd) == EBUSY, "close_xrcd with its SRQ: EBUSY");
		check(!ibv_destroy_srq(s->srq), "destroy the XRC SRQ");
		check(!ibv_close_xrcd(s->xrcd), "close the SRQ's open");
		check(!ibv_dereg_mr(s->mr) && !ibv_destroy_cq(s->cq) && !ibv_dealloc_pd(s->pd),
		      "dereg MR, destroy CQ, dealloc PD");
		close(s->fd);
		unlink(s->path);
		check(!ibv_close_device(s->ctx), "close the device");
	}
	printf("ok\n");
	return 0;
}
