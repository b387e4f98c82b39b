/* Completion events through softnic's C ABI, as rxe and the kernel's verbs give them.
 * Run by softnic/tests/ibverbs_stock.rs through `softnic exec` against one NIC.
 *
 *   cq_events DEV
 *
 * ibv_req_notify_cq arms a CQ for its *next* completion (IB_CQ_NEXT_COMP): completions
 * already waiting raise no event, so a program re-arms and then polls. perftest 4.5's
 * latency tests with -e rely on it: they ack an event, re-arm that CQ and poll it once,
 * and a second event for the completion just polled woke the wrong wait ("Couldn't post
 * send"). With one QP on a CQ on a completion channel, completions made by flushing
 * (the QP moved to ERR, then a receive posted to it in ERR):
 *  1. Armed, two receives flushed: one event for the CQ.
 *  2. Re-armed with both completions still in the CQ: no event within 300 ms.
 *  3. Both polled, one more receive posted (flushed at once): the armed CQ's event.
 *  4. Not re-armed, one more flushed receive: no event.
 * Prints "ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

/* Whether the channel has an event within `ms`. */
static int readable(struct ibv_comp_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r < 0)
		die("poll");
	return r == 1;
}

static void take_event(struct ibv_comp_channel *ch, struct ibv_cq *want)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (!readable(ch, 5000))
		die("no event within 5 s");
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != want)
		die("get_cq_event");
	ibv_ack_cq_events(ev_cq, 1);
}

static void post_recv(struct side *s, int id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &rw, &bad))
		die("post_recv");
}

/* Polls exactly `n` flushed completions, waiting at most 5 s for them. */
static void poll_flushed(struct side *s, int n)
{
	struct ibv_wc wc[4];
	int got = 0;
	for (int i = 0; i < 5000 && got < n; i++) {
		int r = ibv_poll_cq(s->cq, 4, wc);
		if (r < 0)
			die("poll_cq");
		for (int k = 0; k < r; k++)
			if (wc[k].status != IBV_WC_WR_FLUSH_ERR)
				die("a completion that is not a flush");
		got += r;
		if (got < n)
			usleep(1000);
	}
	if (got != n) {
		fprintf(stderr, "FAIL polled %d completions, want %d\n", got, n);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: cq_events DEV");
	struct side s = side_open(argv[1], 1);
	struct ibv_comp_channel *ch = s.cq->channel;
	qp_to_init(s.qp, 0);

	/* 1. */
	post_recv(&s, 1);
	post_recv(&s, 2);
	if (ibv_req_notify_cq(s.cq, 0))
		die("req_notify");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	if (ibv_modify_qp(s.qp, &a, IBV_QP_STATE))
		die("modify to ERR");
	take_event(ch, s.cq);

	/* 2. */
	if (ibv_req_notify_cq(s.cq, 0))
		die("req_notify again");
	if (readable(ch, 300))
		die("an event for completions that were waiting before the arm");

	/* 3. */
	poll_flushed(&s, 2);
	post_recv(&s, 3);
	take_event(ch, s.cq);
	poll_flushed(&s, 1);

	/* 4. */
	post_recv(&s, 4);
	poll_flushed(&s, 1);
	if (readable(ch, 100))
		die("an event without an arm");
	printf("ok\n");
	return 0;
}
