/* Shared by the C programs of softnic/tests/ibverbs: die(), open_named(), side_open(),
 * qp_to_init(), pair_open() (two connected sides), and rc_connect(), which takes an RC QP through INIT, RTR and RTS to a
 * peer QP (GID index 1, the NIC's address, as stock programs use with -g 1 / -x 1). */
#ifndef SOFTNIC_TEST_RC_PAIR_H
#define SOFTNIC_TEST_RC_PAIR_H
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static inline void die(const char *what)
{
	fprintf(stderr, "FAIL %s\n", what);
	exit(2);
}

/* One end of an RC pair: a device, PD, CQ, a 4 KiB registered buffer and an RC QP (64
 * inline bytes). */
struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx; /* set when cq came from ibv_create_cq_ex */
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
	union ibv_gid gid;
};

/* With s->ctx, s->pd and s->cq set: the buffer (filled with `fill`), its MR, the QP
 * and the GID at index 1. */
static inline void side_finish(struct side *s, int fill)
{
	s->buf = memalign(4096, 4096);
	if (!s->pd || !s->cq || !s->buf)
		die("pd/cq/buf");
	memset(s->buf, fill, 4096);
	s->mr = ibv_reg_mr(s->pd, s->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->mr || !s->qp || ibv_query_gid(s->ctx, 1, 1, &s->gid))
		die("mr/qp/gid");
}

/* Opens the device called `name`. */
static inline struct ibv_context *open_named(const char *name)
{
	int n;
	struct ibv_context *ctx = NULL;
	struct ibv_device **l = ibv_get_device_list(&n);
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name))
			ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	if (!ctx)
		die("open");
	return ctx;
}

/* A side on the device `name`: its PD and a 32-entry CQ, on a new completion channel
 * (`s.cq->channel`) when `with_channel`, then side_finish(s, 0). */
static inline struct side side_open(const char *name, int with_channel)
{
	struct side s = { .ctx = open_named(name) };
	struct ibv_comp_channel *ch = NULL;
	if (with_channel && !(ch = ibv_create_comp_channel(s.ctx)))
		die("channel");
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 32, NULL, ch, 0);
	side_finish(&s, 0);
	return s;
}

/* Takes `qp` from RESET to INIT on port 1 with `access` (ibv_access_flags). */
static inline void qp_to_init(struct ibv_qp *qp, unsigned int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = access };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS))
		die("init");
}

static inline void rc_connect(struct ibv_qp *qp, struct ibv_qp *peer_qp, union ibv_gid peer_gid)
{
	qp_to_init(qp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer_gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("rtr");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	/* 1 s local ACK timeout (4.096 us * 2^18): on a loaded 2-vCPU host the NICs can be
	 * descheduled long enough to exhaust 7 retries of rdma-core's usual 67 ms. */
	a.timeout = 18;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC))
		die("rts");
}

/* Two sides, x on device `a` and y on device `b`, each with its PD and a 64-entry CQ,
 * their QPs connected to each other. */
static inline void pair_open(struct side *x, struct side *y, const char *a, const char *b)
{
	x->ctx = open_named(a);
	x->pd = ibv_alloc_pd(x->ctx);
	x->cq = ibv_create_cq(x->ctx, 64, NULL, NULL, 0);
	side_finish(x, 0);
	y->ctx = open_named(b);
	y->pd = ibv_alloc_pd(y->ctx);
	y->cq = ibv_create_cq(y->ctx, 64, NULL, NULL, 0);
	side_finish(y, 0);
	rc_connect(x->qp, y->qp, y->gid);
	rc_connect(y->qp, x->qp, x->gid);
}

#endif
