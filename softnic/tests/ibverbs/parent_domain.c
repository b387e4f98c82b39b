/* Thread domains and parent domains through the C ABI between two NICs.
 *
 *   parent_domain DEV_A DEV_B
 *
 * x (DEV_A) works through a parent domain over its PD, with a thread domain and the
 * program's allocators; y (DEV_B) is a plain side. Cases:
 *  - ibv_alloc_td: EINVAL for a NULL attribute and an unknown comp_mask bit.
 *  - ibv_alloc_parent_domain: EINVAL for a NULL attribute, a NULL pd, an unknown
 *    comp_mask bit, a parent domain as the pd, and a td of another context.
 *  - While the parent domain lives its PD and TD are EBUSY to deallocate.
 *  - An extended CQ takes the parent domain (IBV_CQ_INIT_ATTR_MASK_PD; a plain PD
 *    there is EINVAL); the MR and RC QP of side_finish are made on the parent domain.
 *  - SENDs from x's parent-domain QP: one from the MR registered on the parent domain,
 *    one from an MR registered on the plain PD beneath it (the same protection
 *    domain), and an RDMA WRITE from the latter; every byte lands at y.
 *  - The allocators are accepted and not called (softnic's queues are memory the NIC
 *    maps, docs/ibverbs.md).
 *  - The parent domain is EBUSY while its QP and MR live; then everything is freed in
 *    order (parent domain, TD, PD: 0 each).
 * Prints "ok" at the end; any mismatch prints FAIL and exits 2. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

static int alloc_calls;

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "FAIL %s (errno %d)\n", what, errno);
		exit(2);
	}
}

static void *count_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
			 uint64_t resource_type)
{
	(void)pd;
	(void)pd_context;
	(void)size;
	(void)alignment;
	(void)resource_type;
	alloc_calls++;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void count_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type)
{
	(void)pd;
	(void)pd_context;
	(void)ptr;
	(void)resource_type;
	alloc_calls++;
}

static void one_wc(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 2000000000L; spins++)
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			check(wc.status == IBV_WC_SUCCESS, what);
			return;
		}
	check(0, what);
}

int main(int argc, char **argv)
{
	struct side x = {}, y = {};
	if (argc != 3)
		die("usage: parent_domain DEV_A DEV_B");
	x.ctx = open_named(argv[1]);
	y.ctx = open_named(argv[2]);
	struct ibv_pd *pd = ibv_alloc_pd(x.ctx);
	check(pd != NULL, "alloc_pd");

	struct ibv_td_init_attr ta = { .comp_mask = 1 };
	errno = 0;
	check(!ibv_alloc_td(x.ctx, NULL) && errno == EINVAL, "alloc_td(NULL): EINVAL");
	errno = 0;
	check(!ibv_alloc_td(x.ctx, &ta) && errno == EINVAL, "alloc_td comp_mask: EINVAL");
	ta.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(x.ctx, &ta);
	struct ibv_td *other_td = ibv_alloc_td(y.ctx, &ta);
	check(td && td->context == x.ctx && other_td, "alloc_td");

	struct ibv_parent_domain_init_attr pa = {
		.pd = pd,
		.td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = count_alloc,
		.free = count_free,
		.pd_context = &alloc_calls,
	};
	errno = 0;
	check(!ibv_alloc_parent_domain(x.ctx, NULL) && errno == EINVAL, "NULL attr: EINVAL");
	struct ibv_parent_domain_init_attr bad = pa;
	bad.pd = NULL;
	errno = 0;
	check(!ibv_alloc_parent_domain(x.ctx, &bad) && errno == EINVAL, "NULL pd: EINVAL");
	bad = pa;
	bad.comp_mask |= 1 << 2;
	errno = 0;
	check(!ibv_alloc_parent_domain(x.ctx, &bad) && errno == EINVAL, "comp_mask: EINVAL");
	bad = pa;
	bad.td = other_td;
	errno = 0;
	check(!ibv_alloc_parent_domain(x.ctx, &bad) && errno == EINVAL,
	      "a td of another context: EINVAL");
	struct ibv_pd *parent = ibv_alloc_parent_domain(x.ctx, &pa);
	check(parent && parent->context == x.ctx, "alloc_parent_domain");
	bad = pa;
	bad.pd = parent;
	errno = 0;
	check(!ibv_alloc_parent_domain(x.ctx, &bad) && errno == EINVAL,
	      "a parent domain over a parent domain: EINVAL");
	check(ibv_dealloc_pd(pd) == EBUSY, "the PD is EBUSY under a parent domain");
	check(ibv_dealloc_td(td) == EBUSY, "the TD is EBUSY under a parent domain");

	struct ibv_cq_init_attr_ex ca = {
		.cqe = 64,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
		.parent_domain = pd,
	};
	errno = 0;
	check(!ibv_create_cq_ex(x.ctx, &ca) && errno == EINVAL,
	      "an extended CQ with a plain PD as parent domain: EINVAL");
	ca.parent_domain = parent;
	x.cqx = ibv_create_cq_ex(x.ctx, &ca);
	check(x.cqx != NULL, "create_cq_ex with the parent domain");
	x.cq = ibv_cq_ex_to_cq(x.cqx);
	x.pd = parent;
	side_finish(&x, 0x5a);
	check(x.qp->pd == parent && x.mr->pd == parent, "QP and MR on the parent domain");
	y.pd = ibv_alloc_pd(y.ctx);
	y.cq = ibv_create_cq(y.ctx, 64, NULL, NULL, 0);
	side_finish(&y, 0);
	rc_connect(x.qp, y.qp, y.gid);
	rc_connect(y.qp, x.qp, x.gid);

	/* An MR on the plain PD beneath serves the parent domain's QP. */
	unsigned char *plain_buf = malloc(4096);
	check(plain_buf != NULL, "malloc");
	memset(plain_buf, 0xc3, 4096);
	struct ibv_mr *plain = ibv_reg_mr(pd, plain_buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	check(plain != NULL, "reg_mr on the plain PD");
	struct { void *buf; uint32_t lkey; unsigned char fill; } from[2] = {
		{ x.buf, x.mr->lkey, 0x5a }, { plain_buf, plain->lkey, 0xc3 },
	};
	for (int i = 0; i < 2; i++) {
		memset(y.buf, 0, 4096);
		struct ibv_sge rs = { (uintptr_t)y.buf, 1024, y.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = i, .sg_list = &rs, .num_sge = 1 }, *br;
		check(!ibv_post_recv(y.qp, &r, &br), "post_recv");
		struct ibv_sge ss = { (uintptr_t)from[i].buf, 1024, from[i].lkey };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bw;
		check(!ibv_post_send(x.qp, &w, &bw), "post_send");
		one_wc(x.cq, "the SEND completes");
		one_wc(y.cq, "the RECV completes");
		for (int k = 0; k < 1024; k++)
			check(y.buf[k] == from[i].fill, "every byte of the SEND landed");
	}
	/* An RDMA WRITE from the plain PD's MR into y (remote write granted by y's QP). */
	struct ibv_mr *ywin = ibv_reg_mr(y.pd, y.buf + 2048, 2048,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	check(ywin != NULL, "reg_mr with remote write");
	memset(y.buf + 2048, 0, 2048);
	struct ibv_sge ws = { (uintptr_t)plain_buf, 2048, plain->lkey };
	struct ibv_send_wr ww = { .wr_id = 9, .sg_list = &ws, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *bww;
	ww.wr.rdma.remote_addr = (uintptr_t)(y.buf + 2048);
	ww.wr.rdma.rkey = ywin->rkey;
	check(!ibv_post_send(x.qp, &ww, &bww), "post WRITE");
	one_wc(x.cq, "the WRITE completes");
	for (int k = 2048; k < 4096; k++)
		check(y.buf[k] == 0xc3, "every byte of the WRITE landed");
	check(alloc_calls == 0, "the allocators are not called");

	check(ibv_dealloc_pd(parent) == EBUSY, "the parent domain is EBUSY with a QP and MR");
	check(!ibv_destroy_qp(x.qp) && !ibv_dereg_mr(x.mr), "destroy QP, dereg MR");
	check(!ibv_destroy_cq(x.cq), "destroy the extended CQ");
	check(!ibv_dereg_mr(plain), "dereg the plain MR");
	check(ibv_dealloc_pd(parent) == 0, "dealloc the parent domain");
	check(ibv_dealloc_td(td) == 0 && ibv_dealloc_td(other_td) == 0, "dealloc the TDs");
	check(ibv_dealloc_pd(pd) == 0, "dealloc the PD");
	printf("ok\n");
	return 0;
}
