/* Zero system calls per ibv_post_send / ibv_post_recv / ibv_poll_cq through softnic's
 * C ABI, shown with seccomp. Run by softnic/tests/ibverbs_stock.rs through
 * `softnic exec` against two NICs started with --busy-poll (a sleeping NIC would make
 * the next post write its wake pipe: one legitimate syscall).
 *
 *   nosyscall DEV_A DEV_B clean|getppid|cqex|yield
 *
 * Sets up an RC QP pair (x on DEV_A, y on DEV_B) with the ordinary verbs, then a
 * thread installs a filter that kills the process (SIGSYS) on every system call but
 * exit, and runs ROUNDS of: post a RECV on y, post a signaled SEND on x, poll both CQs
 * until both completions arrive. It ends with a raw exit; the main thread checks the
 * results. In `getppid` mode the loop makes one getppid() half-way: the process must
 * die by SIGSYS, which shows the filter bites. In `cqex` mode y's CQ comes from
 * ibv_create_cq_ex and is polled with ibv_start_poll / ibv_wc_read_* / ibv_end_poll.
 * The strict modes run with SOFTNIC_IBV_POLL_YIELD=0 (set by the test): by default
 * an empty poll streak yields the core (sched_yield), and after 50 µs without a
 * completion sleeps on a futex the NIC wakes (hybrid polling); `yield` mode runs with
 * that default under a filter that allows sched_yield and futex and nothing else (the
 * clock it reads is the vDSO's). */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define ROUNDS 1000
#define MSG 64

static struct side x, y;
static int mode_getppid, mode_cqex, mode_yield;
static volatile int done;	 /* 1: the filtered loop finished */
static volatile int failures; /* completions that were not what was posted */

static void open_side(struct side *s, const char *name)
{
	s->ctx = open_named(name);
	s->pd = ibv_alloc_pd(s->ctx);
	if (mode_cqex && s == &y) {
		struct ibv_cq_init_attr_ex ca = {
			.cqe = 64,
			.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM |
				    IBV_WC_EX_WITH_IMM,
		};
		s->cqx = ibv_create_cq_ex(s->ctx, &ca);
		s->cq = s->cqx ? ibv_cq_ex_to_cq(s->cqx) : NULL;
	} else {
		s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	}
	side_finish(s, 0);
}

/* One round: RECV on y, SEND on x, both completions. Returns 0 or a failure count. */
static int round_trip(int i)
{
	struct ibv_sge rs = { (uintptr_t)y.buf, MSG, y.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 1000000 + i, .sg_list = &rs, .num_sge = 1 }, *br;
	struct ibv_sge ss = { (uintptr_t)x.buf, MSG, x.mr->lkey };
	struct ibv_send_wr w = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bw;
	x.buf[0] = (unsigned char)i;
	if (ibv_post_recv(y.qp, &r, &br) || ibv_post_send(x.qp, &w, &bw))
		return 1;
	int got_send = 0, got_recv = 0, bad = 0;
	struct ibv_wc wc;
	for (long spins = 0; (!got_send || !got_recv) && spins < 2000000000L; spins++) {
		if (!got_send && ibv_poll_cq(x.cq, 1, &wc) == 1) {
			got_send = 1;
			bad += wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)i;
		}
		if (!got_recv && mode_cqex) {
			struct ibv_poll_cq_attr pa = { 0 };
			if (ibv_start_poll(y.cqx, &pa) == 0) {
				got_recv = 1;
				bad += y.cqx->status != IBV_WC_SUCCESS ||
				       y.cqx->wr_id != (uint64_t)(1000000 + i) ||
				       ibv_wc_read_opcode(y.cqx) != IBV_WC_RECV ||
				       ibv_wc_read_byte_len(y.cqx) != MSG ||
				       ibv_wc_read_qp_num(y.cqx) != y.qp->qp_num ||
				       (ibv_wc_read_wc_flags(y.cqx) & IBV_WC_WITH_IMM) ||
				       y.buf[0] != (unsigned char)i;
				bad += ibv_next_poll(y.cqx) != ENOENT;
				ibv_end_poll(y.cqx);
			}
		} else if (!got_recv && ibv_poll_cq(y.cq, 1, &wc) == 1) {
			got_recv = 1;
			bad += wc.status != IBV_WC_SUCCESS || wc.byte_len != MSG ||
			       wc.wr_id != (uint64_t)(1000000 + i) || y.buf[0] != (unsigned char)i;
		}
	}
	return bad + !got_send + !got_recv;
}

static void forbid_syscalls_but_exit(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 5),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, mode_yield ? SYS_sched_yield : SYS_exit, 1, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, mode_yield ? SYS_futex : SYS_exit, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
	};
	struct sock_fprog p = { .len = sizeof(f) / sizeof(f[0]), .filter = f };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p))
		die("seccomp");
}

static void *filtered(void *arg)
{
	(void)arg;
	forbid_syscalls_but_exit();
	int bad = 0;
	for (int i = 1; i <= ROUNDS; i++) {
		if (mode_getppid && i == ROUNDS / 2)
			bad += getppid() == 0;
		bad += round_trip(i);
	}
	failures = bad;
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
	syscall(SYS_exit, 0);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		die("usage: nosyscall DEV_A DEV_B clean|getppid|cqex|yield");
	mode_getppid = !strcmp(argv[3], "getppid");
	mode_yield = !strcmp(argv[3], "yield");
	mode_cqex = !strcmp(argv[3], "cqex");
	open_side(&x, argv[1]);
	open_side(&y, argv[2]);
	rc_connect(x.qp, y.qp, y.gid);
	rc_connect(y.qp, x.qp, x.gid);
	if (round_trip(0)) /* warm-up, unfiltered */
		die("warm-up round");
	pthread_t t;
	if (pthread_create(&t, NULL, filtered, NULL))
		die("pthread_create");
	for (int ms = 0; ms < 120000 && !__atomic_load_n(&done, __ATOMIC_ACQUIRE); ms += 10) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	if (!done)
		die("the filtered loop did not finish");
	if (failures)
		die("bad completions");
	printf("ok %d rounds without a system call%s\n", ROUNDS, mode_yield ? " but sched_yield and futex" : "");
	return 0;
}
