/* SRQ verbs, the SRQ limit event and ibv_init_ah_from_wc through softnic's C ABI.
 * Run by softnic/tests/ibverbs_stock.rs through `softnic exec` against two NICs.
 *
 *   srq DEV_A DEV_B
 *
 * x (on DEV_A) has an RC QP; y (on DEV_B) has an SRQ and an RC QP on it. Checks:
 * ibv_create_srq writes back the granted sizes; ibv_query_srq; resizing is EOPNOTSUPP;
 * the limit armed by ibv_modify_srq; ibv_post_srq_recv; three SENDs from x land in SRQ
 * buffers in posting order with y's QP number; the limit event then arrives on
 * async_fd (poll(2)) and through ibv_get_async_event naming the SRQ, and
 * ibv_ack_async_event counts it; the limit reads 0 again; ibv_destroy_srq is EBUSY
 * while the QP uses it. Then ibv_init_ah_from_wc / ibv_create_ah_from_wc on an IPv4
 * and an IPv6 GRH as the NIC writes them. Prints "ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define MSG 64
#define NRECV 8

static void check(int ok, const char *what)
{
	if (!ok)
		die(what);
}

static void ah_from_wc(struct ibv_pd *pd)
{
	unsigned char grh[40] = { 0 };
	struct ibv_wc wc = { .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RECV };
	struct ibv_ah_attr a;
	/* IPv4: bytes 20..40 are the IPv4 header, TOS 0xb8, TTL 63, source 10.1.2.3. */
	grh[20] = 0x45, grh[21] = 0xb8, grh[28] = 63;
	grh[32] = 10, grh[33] = 1, grh[34] = 2, grh[35] = 3;
	check(ibv_init_ah_from_wc(pd->context, 1, &wc, (struct ibv_grh *)grh, &a) == 0,
	      "init_ah_from_wc v4");
	static const unsigned char v4[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3 };
	check(a.is_global == 1 && a.port_num == 1 && a.grh.sgid_index == 1 &&
		      a.grh.hop_limit == 63 && a.grh.traffic_class == 0xb8 &&
		      !memcmp(a.grh.dgid.raw, v4, 16),
	      "ah attr v4");
	/* Sent to a multicast group (239.1.1.1): nothing to answer from, EINVAL. */
	grh[36] = 239, grh[37] = 1, grh[38] = 1, grh[39] = 1;
	errno = 0;
	check(ibv_init_ah_from_wc(pd->context, 1, &wc, (struct ibv_grh *)grh, &a) != 0 &&
		      errno == EINVAL,
	      "multicast destination refused");
	/* IPv6: version 6, traffic class 0x12, flow label 0x34567, hop limit 62, source
	 * fd00::5. */
	memset(grh, 0, sizeof grh);
	grh[0] = 0x61, grh[1] = 0x23, grh[2] = 0x45, grh[3] = 0x67, grh[7] = 62;
	grh[8] = 0xfd, grh[23] = 5;
	check(ibv_init_ah_from_wc(pd->context, 1, &wc, (struct ibv_grh *)grh, &a) == 0,
	      "init_ah_from_wc v6");
	check(a.grh.traffic_class == 0x12 && a.grh.flow_label == 0x34567 &&
		      a.grh.hop_limit == 62 && a.grh.dgid.raw[0] == 0xfd && a.grh.dgid.raw[15] == 5,
	      "ah attr v6");
	struct ibv_ah *ah = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)grh, 1);
	check(ah && ibv_destroy_ah(ah) == 0, "create_ah_from_wc");
	/* Neither IPv4 nor IPv6: refused. */
	memset(grh, 0, sizeof grh);
	errno = 0;
	check(ibv_init_ah_from_wc(pd->context, 1, &wc, (struct ibv_grh *)grh, &a) != 0 &&
		      errno == EINVAL,
	      "garbage GRH refused");
}

int main(int argc, char **argv)
{
	if (argc != 3)
		die("usage: srq DEV_A DEV_B");
	struct ibv_context *xc = open_named(argv[1]), *yc = open_named(argv[2]);
	struct ibv_pd *xpd = ibv_alloc_pd(xc), *ypd = ibv_alloc_pd(yc);
	struct ibv_cq *xcq = ibv_create_cq(xc, 64, NULL, NULL, 0);
	struct ibv_cq *ycq = ibv_create_cq(yc, 64, NULL, NULL, 0);
	unsigned char *xb = memalign(4096, 4096), *yb = memalign(4096, 4096);
	check(xpd && ypd && xcq && ycq && xb && yb, "pd/cq/buf");
	memset(xb, 0, 4096);
	memset(yb, 0, 4096);
	struct ibv_mr *xmr = ibv_reg_mr(xpd, xb, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *ymr = ibv_reg_mr(ypd, yb, 4096, IBV_ACCESS_LOCAL_WRITE);
	check(xmr && ymr, "mr");

	struct ibv_srq_init_attr si = { .srq_context = (void *)0x5151,
					.attr = { .max_wr = 10, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(ypd, &si);
	check(srq != NULL, "create_srq");
	check(si.attr.max_wr >= 10 && si.attr.max_sge == 1, "granted sizes");
	check(srq->context == yc && srq->pd == ypd && srq->srq_context == (void *)0x5151,
	      "srq fields");
	struct ibv_srq_attr sa = { 0 };
	check(ibv_query_srq(srq, &sa) == 0 && sa.max_wr == si.attr.max_wr && sa.srq_limit == 0,
	      "query_srq");
	sa.max_wr = 64;
	check(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == EOPNOTSUPP, "resize refused");

	struct ibv_qp_init_attr xa = {
		.send_cq = xcq, .recv_cq = xcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_init_attr ya = xa;
	ya.send_cq = ycq, ya.recv_cq = ycq, ya.srq = srq;
	struct ibv_qp *xq = ibv_create_qp(xpd, &xa), *yq = ibv_create_qp(ypd, &ya);
	check(xq && yq && yq->srq == srq, "qps");
	union ibv_gid xg, yg;
	check(!ibv_query_gid(xc, 1, 1, &xg) && !ibv_query_gid(yc, 1, 1, &yg), "gid");
	rc_connect(xq, yq, yg);
	rc_connect(yq, xq, xg);
	check(ibv_destroy_srq(srq) == EBUSY, "destroy_srq with a QP on it");

	/* NRECV receives (a list: one post), then arm the limit at NRECV - 2. */
	struct ibv_sge rs[NRECV];
	struct ibv_recv_wr rw[NRECV], *bad = NULL;
	for (int i = 0; i < NRECV; i++) {
		rs[i] = (struct ibv_sge){ (uintptr_t)(yb + i * MSG), MSG, ymr->lkey };
		rw[i] = (struct ibv_recv_wr){ .wr_id = 100 + i, .sg_list = &rs[i], .num_sge = 1,
					      .next = i + 1 < NRECV ? &rw[i + 1] : NULL };
	}
	check(ibv_post_srq_recv(srq, rw, &bad) == 0, "post_srq_recv");
	sa.srq_limit = NRECV - 2;
	check(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "arm limit");
	check(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == NRECV - 2, "limit armed");

	/* Three SENDs: the SRQ falls below the limit after the third. */
	for (int i = 0; i < 3; i++) {
		memset(xb + i * MSG, 'a' + i, MSG);
		struct ibv_sge ss = { (uintptr_t)(xb + i * MSG), MSG, xmr->lkey };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bw;
		check(ibv_post_send(xq, &w, &bw) == 0, "post_send");
	}
	int sends = 0, recvs = 0;
	struct ibv_wc wc;
	for (long spins = 0; (sends < 3 || recvs < 3) && spins < 2000000000L; spins++) {
		if (ibv_poll_cq(xcq, 1, &wc) == 1) {
			check(wc.status == IBV_WC_SUCCESS, "send status");
			sends++;
		}
		if (ibv_poll_cq(ycq, 1, &wc) == 1) {
			check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
				      wc.byte_len == MSG && wc.qp_num == yq->qp_num &&
				      wc.wr_id == (uint64_t)(100 + recvs),
			      "recv completion (SRQ order, the QP's number)");
			check(yb[recvs * MSG] == 'a' + recvs && yb[recvs * MSG + MSG - 1] == 'a' + recvs,
			      "received bytes");
			recvs++;
		}
	}
	check(sends == 3 && recvs == 3, "3 SENDs and 3 receives");

	struct pollfd pfd = { .fd = yc->async_fd, .events = POLLIN };
	check(poll(&pfd, 1, 10000) == 1, "async_fd readable");
	struct ibv_async_event ev;
	check(ibv_get_async_event(yc, &ev) == 0, "get_async_event");
	check(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
	      "SRQ limit event names the SRQ");
	ibv_ack_async_event(&ev);
	check(srq->events_completed == 1, "ack counted");
	check(poll(&pfd, 1, 0) == 0, "one event only");
	check(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0, "limit disarmed");

	ah_from_wc(ypd);

	check(ibv_destroy_qp(yq) == 0 && ibv_destroy_srq(srq) == 0, "destroy");
	printf("ok\n");
	return 0;
}
