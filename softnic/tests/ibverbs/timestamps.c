/* Completion timestamps through the C ABI between two NICs.
 *
 *   timestamps DEV_A DEV_B
 *
 * ibv_query_device_ex reports a 64-bit, 1 GHz completion clock; ibv_query_rt_values_ex
 * reads it (CLOCK_MONOTONIC). x's send CQ and y's receive CQ are extended CQs with
 * IBV_WC_EX_WITH_COMPLETION_TIMESTAMP and _WALLCLOCK. For 20 SENDs x -> y, every
 * completion's timestamp lies between CLOCK_MONOTONIC read before the post and after
 * the poll, never goes backwards on a CQ, and its wall-clock reading is within a
 * second of CLOCK_REALTIME; a receive is not stamped before its send was posted.
 * Prints "ok" at the end; any mismatch prints FAIL and exits 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define FLAGS (IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | \
	       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "FAIL %s (errno %d)\n", what, errno);
		exit(2);
	}
}

static uint64_t ns(clockid_t id)
{
	struct timespec t;
	clock_gettime(id, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

/* One completion from `cq`: its timestamp and wall-clock reading. */
static void poll_one(struct ibv_cq_ex *cq, uint64_t *ts, uint64_t *wall)
{
	struct ibv_poll_cq_attr a = {};
	int rc;
	for (long spins = 0; (rc = ibv_start_poll(cq, &a)) == ENOENT && spins < 2000000000L;
	     spins++)
		;
	check(rc == 0 && cq->status == IBV_WC_SUCCESS, "completion");
	*ts = ibv_wc_read_completion_ts(cq);
	*wall = ibv_wc_read_completion_wallclock_ns(cq);
	ibv_end_poll(cq);
}

static struct ibv_cq_ex *ts_cq(struct ibv_context *ctx)
{
	struct ibv_cq_init_attr_ex a = { .cqe = 64, .wc_flags = FLAGS };
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
	check(cq != NULL, "ibv_create_cq_ex with timestamps");
	return cq;
}

int main(int argc, char **argv)
{
	struct side x = {}, y = {};
	if (argc != 3)
		die("usage: timestamps DEV_A DEV_B");
	x.ctx = open_named(argv[1]);
	y.ctx = open_named(argv[2]);
	struct ibv_device_attr_ex dx;
	memset(&dx, 0, sizeof dx);
	check(!ibv_query_device_ex(x.ctx, NULL, &dx), "query_device_ex");
	check(dx.completion_timestamp_mask == UINT64_MAX && dx.hca_core_clock == 1000000,
	      "a 64-bit clock at 1,000,000 kHz");
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	uint64_t before = ns(CLOCK_MONOTONIC);
	check(!ibv_query_rt_values_ex(x.ctx, &v) && v.comp_mask == IBV_VALUES_MASK_RAW_CLOCK,
	      "query_rt_values_ex");
	uint64_t raw = (uint64_t)v.raw_clock.tv_sec * 1000000000ull + v.raw_clock.tv_nsec;
	check(before <= raw && raw <= ns(CLOCK_MONOTONIC), "raw_clock is CLOCK_MONOTONIC");
	struct ibv_values_ex bad = { .comp_mask = 2 };
	check(ibv_query_rt_values_ex(x.ctx, &bad) == EINVAL, "unknown comp_mask bits");

	struct ibv_cq_ex *xs = ts_cq(x.ctx), *yr = ts_cq(y.ctx);
	x.pd = ibv_alloc_pd(x.ctx);
	y.pd = ibv_alloc_pd(y.ctx);
	x.cq = ibv_cq_ex_to_cq(xs);
	y.cq = ibv_cq_ex_to_cq(yr);
	side_finish(&x, 7);
	side_finish(&y, 0);
	rc_connect(x.qp, y.qp, y.gid);
	rc_connect(y.qp, x.qp, x.gid);
	uint64_t last_s = 0, last_r = 0;
	for (int i = 0; i < 20; i++) {
		struct ibv_sge rs = { (uintptr_t)y.buf, 64, y.mr->lkey };
		struct ibv_sge ss = { (uintptr_t)x.buf, 64, x.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = i, .sg_list = &rs, .num_sge = 1 }, *br;
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bw;
		check(!ibv_post_recv(y.qp, &r, &br), "post_recv");
		uint64_t t0 = ns(CLOCK_MONOTONIC);
		check(!ibv_post_send(x.qp, &w, &bw), "post_send");
		uint64_t s_ts, s_wall, r_ts, r_wall;
		poll_one(xs, &s_ts, &s_wall);
		poll_one(yr, &r_ts, &r_wall);
		uint64_t t1 = ns(CLOCK_MONOTONIC), real = ns(CLOCK_REALTIME);
		check(t0 <= s_ts && s_ts <= t1, "the send's timestamp is between post and poll");
		check(t0 <= r_ts && r_ts <= t1, "the receive's timestamp is between post and poll");
		check(s_ts >= last_s && r_ts >= last_r, "timestamps never go backwards on a CQ");
		check(s_wall + 1000000000ull > real && s_wall <= real + 1000000000ull &&
			      r_wall + 1000000000ull > real && r_wall <= real + 1000000000ull,
		      "wall-clock readings are CLOCK_REALTIME");
		last_s = s_ts;
		last_r = r_ts;
	}
	printf("ok\n");
	return 0;
}
