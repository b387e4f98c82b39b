/* Signals through softnic's C ABI, as rdma-core delivers them. Run by
 * softnic/tests/ibverbs_stock.rs through `softnic exec` against one NIC.
 *
 *   signals DEV
 *
 * rdma-core's libibverbs runs no thread of its own and blocks in read(2) on the
 * completion channel, so a program's signal reaches the program's thread and
 * interrupts ibv_get_cq_event exactly when its handler lacks SA_RESTART. qperf relies
 * on it: a repeating SIGALRM ends each timed test by making the wait fail with EINTR.
 *
 * With a QP created (which starts softnic's event watcher thread) and a CQ armed on a
 * completion channel:
 *  0. A SIGALRM sent to the process while the main thread blocks it stays pending (no
 *     other thread may take it) and runs the handler on the main thread once it is
 *     unblocked.
 *  1. SIGALRM from a repeating timer, its handler without SA_RESTART, no completion
 *     coming: ibv_get_cq_event returns -1 with errno EINTR, and every alarm ran the
 *     handler on the main thread (none was taken by the library's thread).
 *  2. The handler with SA_RESTART: the wait goes on through the alarms and returns
 *     the CQ's event when a second thread, five alarms later, moves the QP to ERR
 *     (its posted receive is flushed to the CQ).
 *  4. ibv_get_async_event with no event coming, handler without SA_RESTART: -1 with
 *     errno EINTR (rdma-core's is a read of async_fd).
 *  3. rdma_get_cm_event with no event coming (librdmacm's blocking write(2) to its
 *     device in rdma-core), handler without SA_RESTART: -1 with errno EINTR.
 * Prints "ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "rc_pair.h"

static volatile sig_atomic_t alarms, on_main;
static pid_t main_tid;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
	if ((pid_t)syscall(SYS_gettid) == main_tid)
		on_main++;
}

static void set_handler(int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL))
		die("sigaction");
}

static void timer_ms(long first, long every)
{
	struct itimerval t = {
		.it_value = { .tv_sec = first / 1000, .tv_usec = (first % 1000) * 1000 },
		.it_interval = { .tv_sec = every / 1000, .tv_usec = (every % 1000) * 1000 },
	};
	if (setitimer(ITIMER_REAL, &t, NULL))
		die("setitimer");
}

static struct ibv_qp *qp_for_error;

/* Moves the QP to ERR after five more alarms: its posted receive is flushed, which
 * completes on the armed CQ and wakes the main thread's wait. */
static void *flusher(void *arg)
{
	(void)arg;
	int start = alarms;
	while (alarms < start + 5)
		usleep(1000);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	if (ibv_modify_qp(qp_for_error, &a, IBV_QP_STATE))
		die("modify to ERR");
	return NULL;
}

/* Ends the program if a wait never returns (a library that retries every EINTR). */
static void *watchdog(void *arg)
{
	(void)arg;
	sleep(20);
	fprintf(stderr, "FAIL a wait is still going after 20 s (%d alarms)\n",
		(int)alarms);
	_exit(3);
}

/* Starts the watchdog with every signal blocked in it, so that it takes no SIGALRM. */
static void start_watchdog(void)
{
	sigset_t all, old;
	pthread_t t;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if (pthread_create(&t, NULL, watchdog, NULL))
		die("pthread_create");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: signals DEV");
	main_tid = (pid_t)syscall(SYS_gettid);
	start_watchdog();
	/* Creates the QP: the event watcher thread starts. */
	struct side s = side_open(argv[1], 1);
	struct ibv_comp_channel *ch = s.cq->channel;
	if (ibv_req_notify_cq(s.cq, 0))
		die("req_notify");

	/* 0. Only this thread takes the program's signals. */
	set_handler(0);
	sigset_t alrm;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, NULL);
	kill(getpid(), SIGALRM);
	usleep(50000);
	if (alarms != 0)
		die("a thread of the library took the program's SIGALRM");
	pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
	if (alarms != 1 || on_main != 1)
		die("the pending SIGALRM did not run on the main thread");

	/* 1. No SA_RESTART: EINTR, and the handler ran on this thread. */
	timer_ms(20, 10);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	int err = errno;
	timer_ms(0, 0);
	if (r != -1 || err != EINTR) {
		fprintf(stderr, "FAIL get_cq_event returned %d errno %d, want -1 EINTR\n", r, err);
		return 2;
	}
	if (alarms < 1 || on_main != alarms) {
		fprintf(stderr, "FAIL %d alarms, %d of them on the main thread\n", (int)alarms,
			(int)on_main);
		return 2;
	}

	/* 2. SA_RESTART: the wait survives the alarms and returns the CQ's event. */
	qp_to_init(s.qp, 0);
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 64, .lkey = s.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s.qp, &rw, &bad))
		die("post_recv");
	set_handler(SA_RESTART);
	qp_for_error = s.qp;
	pthread_t t;
	timer_ms(5, 5);
	if (pthread_create(&t, NULL, flusher, NULL))
		die("pthread_create");
	r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	err = errno;
	timer_ms(0, 0);
	pthread_join(t, NULL);
	if (r != 0 || ev_cq != s.cq) {
		fprintf(stderr, "FAIL with SA_RESTART: get_cq_event returned %d errno %d\n", r, err);
		return 2;
	}
	ibv_ack_cq_events(s.cq, 1);
	struct ibv_wc wc;
	if (ibv_poll_cq(s.cq, 1, &wc) != 1 || wc.wr_id != 7 || wc.status != IBV_WC_WR_FLUSH_ERR)
		die("the flushed receive");
	/* 4. The async event wait, handler without SA_RESTART. */
	set_handler(0);
	timer_ms(20, 10);
	struct ibv_async_event aev;
	r = ibv_get_async_event(s.ctx, &aev);
	err = errno;
	timer_ms(0, 0);
	if (r != -1 || err != EINTR) {
		fprintf(stderr, "FAIL ibv_get_async_event returned %d errno %d, want -1 EINTR\n",
			r, err);
		return 2;
	}

	/* 3. The CM's event wait, handler without SA_RESTART. */
	struct rdma_event_channel *cm = rdma_create_event_channel();
	if (!cm)
		die("rdma_create_event_channel");
	set_handler(0);
	timer_ms(20, 10);
	struct rdma_cm_event *cev;
	r = rdma_get_cm_event(cm, &cev);
	err = errno;
	timer_ms(0, 0);
	if (r != -1 || err != EINTR) {
		fprintf(stderr, "FAIL rdma_get_cm_event returned %d errno %d, want -1 EINTR\n", r,
			err);
		return 2;
	}
	rdma_destroy_event_channel(cm);
	printf("ok %d alarms\n", (int)alarms);
	return 0;
}
