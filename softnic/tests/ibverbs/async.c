/* QP affiliated asynchronous events through softnic's C ABI.
 * Run by softnic/tests/ibverbs_stock.rs through `softnic exec` against two NICs.
 *
 *   async DEV_A DEV_B
 *
 * x (on DEV_A) and y (on DEV_B) are a connected RC pair. y posts an 8-byte receive and
 * x SENDs 64 bytes: y NAKs Invalid Request, completes its receive with LOC_LEN_ERR and
 * enters ERR. Checks: y's async_fd becomes readable (poll(2)); ibv_get_async_event
 * returns IBV_EVENT_QP_REQ_ERR whose element is y's own ibv_qp; ibv_ack_async_event
 * counts it on the QP (events_completed); with async_fd non-blocking, a second
 * ibv_get_async_event fails with EAGAIN (the event is raised once); x's async_fd stays
 * quiet (the requester learns of the failure from its REM_INV_REQ_ERR completion);
 * both QPs destroy. Before the SEND, a child of fork(2) closes its copy of y's context
 * and exits: that must neither hang the child (the event watcher thread is not in it)
 * nor stop the parent's watcher. Prints "ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

static void check(int ok, const char *what)
{
	if (!ok)
		die(what);
}

static struct ibv_wc poll_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		check(n >= 0, "poll_cq");
		if (n == 1)
			return wc;
	}
	die("no completion");
	return wc;
}

static struct side open_side(const char *dev)
{
	struct side s = { .ctx = open_named(dev) };
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 32, NULL, NULL, 0);
	side_finish(&s, 0);
	return s;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		die("usage: async DEV_A DEV_B");
	struct side x = open_side(argv[1]), y = open_side(argv[2]);
	rc_connect(x.qp, y.qp, y.gid);
	rc_connect(y.qp, x.qp, x.gid);

	pid_t pid = fork();
	check(pid >= 0, "fork");
	if (pid == 0) {
		alarm(10); /* a hang in ibv_close_device fails the check below */
		ibv_close_device(y.ctx);
		_exit(0);
	}
	int st;
	check(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "a forked child closes its copy of the context");

	struct ibv_sge rs = { (uintptr_t)y.buf, 8, y.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
	check(ibv_post_recv(y.qp, &rw, &rbad) == 0, "post_recv");
	struct ibv_sge ss = { (uintptr_t)x.buf, 64, x.mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *sbad = NULL;
	check(ibv_post_send(x.qp, &sw, &sbad) == 0, "post_send");
	struct ibv_wc wc = poll_wc(x.cq);
	check(wc.wr_id == 2 && wc.status == IBV_WC_REM_INV_REQ_ERR, "x: REM_INV_REQ_ERR");
	wc = poll_wc(y.cq);
	check(wc.wr_id == 1 && wc.status == IBV_WC_LOC_LEN_ERR, "y: LOC_LEN_ERR");

	struct pollfd pfd = { .fd = y.ctx->async_fd, .events = POLLIN };
	check(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN), "y async_fd readable");
	struct ibv_async_event ev;
	check(ibv_get_async_event(y.ctx, &ev) == 0, "get_async_event");
	printf("event %d (%s) qp %u\n", ev.event_type, ibv_event_type_str(ev.event_type),
	       ev.element.qp ? ev.element.qp->qp_num : 0);
	check(ev.event_type == IBV_EVENT_QP_REQ_ERR, "IBV_EVENT_QP_REQ_ERR");
	check(ev.element.qp == y.qp, "element is y's ibv_qp");
	uint32_t before = y.qp->events_completed;
	ibv_ack_async_event(&ev);
	check(y.qp->events_completed == before + 1, "ack counted on the QP");

	/* Raised once: give the watcher time to deliver a (wrong) second event. */
	check(poll(&pfd, 1, 300) == 0, "no second event");
	int fl = fcntl(y.ctx->async_fd, F_GETFL);
	check(fl >= 0 && fcntl(y.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	errno = 0;
	check(ibv_get_async_event(y.ctx, &ev) == -1 && errno == EAGAIN, "EAGAIN when empty");
	struct pollfd xfd = { .fd = x.ctx->async_fd, .events = POLLIN };
	check(poll(&xfd, 1, 300) == 0, "requester raises no event");

	check(ibv_destroy_qp(x.qp) == 0 && ibv_destroy_qp(y.qp) == 0, "destroy_qp");
	printf("ok\n");
	return 0;
}
