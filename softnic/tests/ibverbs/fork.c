/* A child after fork() cannot corrupt the parent's rings or registered memory.
 * Run by softnic/tests/ibverbs_stock.rs through `softnic exec` against two NICs.
 *
 *   fork DEV_A DEV_B post|poll|mr
 *
 * Connects an RC pair (x on DEV_A, y on DEV_B), then forks. The child uses the
 * parent's objects: `post` calls ibv_post_send on x's QP (a WR that would reach the
 * NIC through the shared send ring), `poll` calls ibv_poll_cq on x's CQ (which would
 * consume the parent's completions), `mr` writes x's registered buffer. Each must die
 * by SIGSEGV (the rings and MRs are MADV_DONTFORK), which the parent checks; then the
 * parent runs a round trip and checks that its CQ holds exactly its own completion and
 * its buffer its own bytes. Prints "ok". */
#define _GNU_SOURCE
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define MSG 64

static void setup(struct side *s, const char *name)
{
	s->ctx = open_named(name);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	side_finish(s, 'P');
}

static int post(struct side *s, uint64_t id, int recv)
{
	struct ibv_sge sg = { (uintptr_t)s->buf, MSG, s->mr->lkey };
	if (recv) {
		struct ibv_recv_wr r = { .wr_id = id, .sg_list = &sg, .num_sge = 1 }, *br;
		return ibv_post_recv(s->qp, &r, &br);
	}
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &sg, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bw;
	return ibv_post_send(s->qp, &w, &bw);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		die("usage: fork DEV_A DEV_B post|poll|mr");
	struct side x = { 0 }, y = { 0 };
	setup(&x, argv[1]);
	setup(&y, argv[2]);
	rc_connect(x.qp, y.qp, y.gid);
	rc_connect(y.qp, x.qp, x.gid);
	/* Receives for the child's SEND (if it got through) and the parent's. */
	if (post(&y, 1, 1) || post(&y, 2, 1))
		die("post_recv");

	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		struct ibv_wc wc;
		if (!strcmp(argv[3], "post"))
			post(&x, 666, 0);
		else if (!strcmp(argv[3], "poll"))
			ibv_poll_cq(x.cq, 1, &wc);
		else
			memset(x.buf, 'C', 4096);
		_exit(0); /* reached only if the child could use the parent's objects */
	}
	int st;
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV) {
		fprintf(stderr, "FAIL child status %#x (wanted SIGSEGV)\n", st);
		return 2;
	}
	for (int i = 0; i < 4096; i++)
		if (x.buf[i] != 'P')
			die("parent's registered bytes changed");

	memset(x.buf, 'Q', MSG);
	if (post(&x, 7, 0))
		die("post_send");
	int sends = 0, recvs = 0;
	struct ibv_wc wc;
	for (long spins = 0; (sends < 1 || recvs < 1) && spins < 2000000000L; spins++) {
		if (ibv_poll_cq(x.cq, 1, &wc) == 1) {
			if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 7)
				die("x completion is not the parent's SEND");
			sends++;
		}
		if (ibv_poll_cq(y.cq, 1, &wc) == 1) {
			if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 1 || y.buf[0] != 'Q')
				die("y received something else than the parent's SEND");
			recvs++;
		}
	}
	if (sends != 1 || recvs != 1)
		die("round trip");
	/* Nothing more: the child's WR did not reach the NIC. */
	usleep(200000);
	if (ibv_poll_cq(x.cq, 1, &wc) != 0 || ibv_poll_cq(y.cq, 1, &wc) != 0)
		die("an extra completion (the child's WR was sent)");
	printf("ok\n");
	return 0;
}
