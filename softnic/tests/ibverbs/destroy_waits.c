/* Destroying an object with events out, as rdma-core's libibverbs does it: ibv_destroy_cq
 * returns only once the completion events the program took for the CQ are acknowledged
 * (comp_events_completed reaches what was reported), ibv_destroy_qp only once the
 * QP's asynchronous events taken are acknowledged (events_completed), and a QP's
 * events not taken yet are dropped when it is destroyed (the kernel drops them), so no
 * event ever names a freed object. Multithreaded programs rely on it: one thread takes
 * events while another tears down. Run by softnic/tests/ibverbs_stock.rs through
 * `softnic exec` against one NIC.
 *
 *   destroy_waits DEV
 *
 * 1. A completion event is taken in the main thread and acknowledged by another 300 ms
 *    later, after that thread read the CQ's context through the event's CQ pointer;
 *    ibv_destroy_cq, called meanwhile (its QP destroyed first), must not return before
 *    the acknowledgement.
 * 2. The same with a QP on an SRQ moved to ERR: its IBV_EVENT_QP_LAST_WQE_REACHED taken
 *    with ibv_get_async_event, acknowledged 300 ms later; ibv_destroy_qp must wait.
 * 3. Another such QP's event waiting on async_fd (poll(2) says readable) when the QP is
 *    destroyed: async_fd no longer polls readable, and ibv_get_async_event on the
 *    non-blocking async_fd answers EAGAIN, never an event naming the destroyed QP.
 * Prints "ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

static int cq_magic;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* What the acknowledging thread works on, and when it acknowledged. */
struct later {
	struct ibv_cq *cq;            /* part 1 */
	struct ibv_async_event event; /* part 2 */
	void *want_context;
	double acked_at;
};

static void *ack_cq_later(void *arg)
{
	struct later *l = arg;
	usleep(300 * 1000);
	if (l->cq->cq_context != l->want_context)
		die("part 1: the event's CQ was gone before its event was acknowledged");
	l->acked_at = now();
	ibv_ack_cq_events(l->cq, 1);
	return NULL;
}

static void *ack_async_later(void *arg)
{
	struct later *l = arg;
	usleep(300 * 1000);
	if (l->event.element.qp->qp_context != l->want_context)
		die("part 2: the event's QP was gone before its event was acknowledged");
	l->acked_at = now();
	ibv_ack_async_event(&l->event);
	return NULL;
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r < 0)
		die("poll");
	return r == 1;
}

static void to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("modify to ERR");
}

/* A QP on `srq` (context `ctx_val`), in INIT. */
static struct ibv_qp *srq_qp(struct side *s, struct ibv_srq *srq, void *ctx_val)
{
	struct ibv_qp_init_attr ia = {
		.qp_context = ctx_val, .send_cq = s->cq, .recv_cq = s->cq, .srq = srq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
	if (!qp)
		die("create SRQ QP");
	qp_to_init(qp, 0);
	return qp;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: destroy_waits DEV");
	struct side s = side_open(argv[1], 1);
	s.cq->cq_context = &cq_magic;

	/* 1. */
	qp_to_init(s.qp, 0);
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 64, .lkey = s.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s.qp, &rw, &bad) || ibv_req_notify_cq(s.cq, 0))
		die("post_recv / arm");
	to_err(s.qp);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (!readable(s.cq->channel->fd, 5000) || ibv_get_cq_event(s.cq->channel, &ev_cq, &ev_ctx) ||
	    ev_cq != s.cq || ev_ctx != &cq_magic)
		die("part 1: completion event");
	struct ibv_wc wc;
	while (ibv_poll_cq(s.cq, 1, &wc) == 0)
		;
	if (ibv_destroy_qp(s.qp))
		die("destroy QP");
	struct later l1 = { .cq = ev_cq, .want_context = &cq_magic };
	pthread_t t;
	if (pthread_create(&t, NULL, ack_cq_later, &l1))
		die("thread");
	if (ibv_destroy_cq(s.cq))
		die("destroy CQ");
	double returned = now();
	pthread_join(t, NULL);
	if (returned < l1.acked_at) {
		fprintf(stderr, "FAIL part 1: ibv_destroy_cq returned %.1f ms before its event was acknowledged\n",
			(l1.acked_at - returned) * 1e3);
		return 2;
	}

	/* 2. */
	s.cq = ibv_create_cq(s.ctx, 32, NULL, NULL, 0);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = s.cq ? ibv_create_srq(s.pd, &sa) : NULL;
	if (!srq)
		die("CQ / SRQ");
	static int qp_magic2, qp_magic3;
	struct ibv_qp *q2 = srq_qp(&s, srq, &qp_magic2);
	to_err(q2);
	struct later l2 = { .want_context = &qp_magic2 };
	if (!readable(s.ctx->async_fd, 5000) || ibv_get_async_event(s.ctx, &l2.event) ||
	    l2.event.event_type != IBV_EVENT_QP_LAST_WQE_REACHED || l2.event.element.qp != q2)
		die("part 2: LAST_WQE_REACHED");
	if (pthread_create(&t, NULL, ack_async_later, &l2))
		die("thread");
	if (ibv_destroy_qp(q2))
		die("destroy q2");
	returned = now();
	pthread_join(t, NULL);
	if (returned < l2.acked_at) {
		fprintf(stderr, "FAIL part 2: ibv_destroy_qp returned %.1f ms before its event was acknowledged\n",
			(l2.acked_at - returned) * 1e3);
		return 2;
	}

	/* 3. */
	struct ibv_qp *q3 = srq_qp(&s, srq, &qp_magic3);
	to_err(q3);
	if (!readable(s.ctx->async_fd, 5000))
		die("part 3: no LAST_WQE_REACHED waiting");
	if (ibv_destroy_qp(q3))
		die("destroy q3");
	if (readable(s.ctx->async_fd, 0))
		die("part 3: async_fd polls readable with the destroyed QP's event dropped");
	int fl = fcntl(s.ctx->async_fd, F_GETFL);
	if (fl < 0 || fcntl(s.ctx->async_fd, F_SETFL, fl | O_NONBLOCK))
		die("O_NONBLOCK");
	struct ibv_async_event e;
	if (ibv_get_async_event(s.ctx, &e) == 0) {
		fprintf(stderr, "FAIL part 3: event %d for %s after the QP was destroyed\n",
			e.event_type, e.element.qp == q3 ? "that QP" : "another object");
		return 2;
	}
	if (errno != EAGAIN)
		die("part 3: ibv_get_async_event's errno");

	if (ibv_destroy_srq(srq) || ibv_destroy_cq(s.cq))
		die("teardown");
	printf("ok\n");
	return 0;
}
