/* A post after the NIC died. Run by softnic/tests/ibverbs_stock.rs through `softnic
 * exec` against one NIC, which the test kills (SIGKILL) while this program waits.
 *
 *   nic_gone DEV
 *
 * Opens DEV, makes an RC QP and takes it to INIT, prints "ready" and reads a line from
 * stdin (the test kills the NIC meanwhile, long after it went to sleep and asked to be
 * woken), then posts a receive. With rdma-core a device that disappears never kills
 * the program. softnic's post fails with EIO, as it reads the NIC's life sign (a word
 * the kernel marks when the NIC ends); before that it woke the NIC through a datagram
 * socket (ECONNREFUSED, no SIGPIPE), and before that a pipe's write killed the program
 * with SIGPIPE. Then the context's async_fd becomes
 * readable within 10 s and ibv_get_async_event returns IBV_EVENT_DEVICE_FATAL, as a
 * kernel device raises when it goes away (rxe's `rdma link delete`). Before that, a
 * busy ibv_poll_cq loop on the empty CQ must return a negative value within 10 s.
 * Prints the post's result and exits 0. */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: nic_gone DEV");
	struct side s = side_open(argv[1], 0);
	qp_to_init(s.qp, 0);
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		die("stdin");
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 64, .lkey = s.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	int r = ibv_post_recv(s.qp, &rw, &bad);
	printf("post after the NIC died: %d (%s)\n", r, r ? strerror(r) : "ok");
	/* A program that only polls learns it too: an empty CQ's poll fails once the NIC
	 * has ended (the NIC's life sign, a word the kernel marks), where it spun for ever. */
	struct ibv_wc wc;
	int n = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		n = ibv_poll_cq(s.cq, 1, &wc);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (n == 0 && t.tv_sec - t0.tv_sec < 10);
	if (n >= 0)
		die("ibv_poll_cq still found the CQ merely empty 10 s after the NIC's death");
	printf("poll after the NIC died: negative\n");
	struct pollfd p = { .fd = s.ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, 10000) != 1)
		die("no async event within 10 s of the NIC's death");
	struct ibv_async_event ev;
	if (ibv_get_async_event(s.ctx, &ev))
		die("ibv_get_async_event");
	if (ev.event_type != IBV_EVENT_DEVICE_FATAL) {
		fprintf(stderr, "FAIL async event %d, want IBV_EVENT_DEVICE_FATAL\n", ev.event_type);
		return 2;
	}
	ibv_ack_async_event(&ev);
	printf("IBV_EVENT_DEVICE_FATAL\n");
	return 0;
}
