/* The memory-registration matrix: ibv_reg_mr on every kind of memory a verbs program
 * hands it, with canary bytes around each buffer. Run by
 * softnic/tests/ibverbs_stock.rs through `softnic exec` against two NICs.
 *
 *   mr_matrix DEV_A DEV_B
 *
 * y (DEV_B) registers the buffer under test; x (DEV_A) SENDs 64 bytes into it, so a
 * registration that succeeds is shown to be the program's own memory (the bytes land
 * where the program reads them). Every case checks the buffer's contents and its
 * neighbours before and after registration, the SEND and deregistration, and what
 * softnic answers: registered, or EOPNOTSUPP where docs/ibverbs.md says it refuses.
 * One line per case: "case NAME: registered|refused, N us per reg+dereg".
 * Prints "ok" at the end; any mismatch prints FAIL and exits 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define PAGE 4096
#define MSG 64
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct side x, y;
static uint64_t seq;

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void check(int ok, const char *name, const char *what)
{
	if (!ok) {
		fprintf(stderr, "FAIL %s: %s\n", name, what);
		exit(2);
	}
}

static int all(const unsigned char *p, size_t n, int v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* Waits for one completion on x's CQ and one (wr_id seq) on y's, both successful. */
static void both_complete(const char *name)
{
	int got = 0;
	struct ibv_wc wc;
	for (long spins = 0; got < 2 && spins < 2000000000L; spins++) {
		if (ibv_poll_cq(x.cq, 1, &wc) == 1)
			check(wc.status == IBV_WC_SUCCESS, name, "send status"), got++;
		if (ibv_poll_cq(y.cq, 1, &wc) == 1)
			check(wc.status == IBV_WC_SUCCESS && wc.wr_id == seq, name, "recv"), got++;
	}
	check(got == 2, name, "completions");
}

/* The ibv_wr_* API on a new QP pair: ibv_wr_set_inline_data copies the bytes at once
 * — the stack buffer (no MR) is overwritten before ibv_wr_complete — and they arrive. */
static void inline_through_wr_api(void)
{
	const char *name = "ibv_wr_set_inline_data from the stack, reused before complete";
	struct ibv_qp_cap cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
				  .max_recv_sge = 1, .max_inline_data = MSG };
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = x.cq, .recv_cq = x.cq, .qp_type = IBV_QPT_RC, .cap = cap,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = x.pd, .send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	struct ibv_qp *xq = ibv_create_qp_ex(x.ctx, &ia);
	struct ibv_qp_init_attr ya = { .send_cq = y.cq, .recv_cq = y.cq, .qp_type = IBV_QPT_RC,
				       .cap = cap };
	struct ibv_qp *yq = ibv_create_qp(y.pd, &ya);
	check(xq && yq && ibv_qp_to_qp_ex(xq), name, "create");
	rc_connect(xq, yq, y.gid);
	rc_connect(yq, xq, x.gid);
	memset(y.buf, 0, MSG);
	struct ibv_sge rs = { (uintptr_t)y.buf, MSG, y.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = ++seq, .sg_list = &rs, .num_sge = 1 }, *br;
	check(!ibv_post_recv(yq, &r, &br), name, "post_recv");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(xq);
	unsigned char msg[MSG];
	memset(msg, 0x6D, MSG);
	ibv_wr_start(qx);
	qx->wr_id = seq;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, msg, MSG);
	memset(msg, 0, MSG);
	check(ibv_wr_complete(qx) == 0, name, "ibv_wr_complete");
	both_complete(name);
	check(all(y.buf, MSG, 0x6D), name, "the inline bytes did not arrive");
	check(!ibv_destroy_qp(xq) && !ibv_destroy_qp(yq), name, "destroy");
	printf("case %s: sent\n", name);
}

/* SEND 64 bytes of `fill` from x into y's [buf, buf + 64) under `mr`. */
static void send_into(const char *name, unsigned char *buf, struct ibv_mr *mr, int fill)
{
	struct ibv_sge rs = { (uintptr_t)buf, MSG, mr->lkey };
	struct ibv_recv_wr r = { .wr_id = ++seq, .sg_list = &rs, .num_sge = 1 }, *br;
	memset(x.buf, fill, MSG);
	struct ibv_sge ss = { (uintptr_t)x.buf, MSG, x.mr->lkey };
	struct ibv_send_wr w = { .wr_id = seq, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bw;
	check(!ibv_post_recv(y.qp, &r, &br) && !ibv_post_send(x.qp, &w, &bw), name, "post");
	both_complete(name);
	for (int i = 0; i < MSG; i++)
		check(buf[i] == fill, name, "the SEND did not land in the program's buffer");
}

/* An inline SEND from x's stack — memory no MR covers, lkey 0, as rdma_client sends —
 * into y's registered buffer; the stack bytes are overwritten as soon as ibv_post_send
 * returns (inline data is copied at post time, as by every provider). */
static void inline_from_stack(void)
{
	const char *name = "inline SEND from the stack (no MR, lkey 0)";
	unsigned char msg[MSG];
	memset(msg, 0x6C, MSG);
	memset(y.buf, 0, MSG);
	struct ibv_sge rs = { (uintptr_t)y.buf, MSG, y.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = ++seq, .sg_list = &rs, .num_sge = 1 }, *br;
	struct ibv_sge ss = { (uintptr_t)msg, MSG, 0 };
	struct ibv_send_wr w = { .wr_id = seq, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE },
			   *bw;
	check(!ibv_post_recv(y.qp, &r, &br) && !ibv_post_send(x.qp, &w, &bw), name, "post");
	memset(msg, 0x00, MSG);
	both_complete(name);
	check(all(y.buf, MSG, 0x6C), name, "the inline bytes did not arrive");
	printf("case %s: sent\n", name);
}

/* RDMA WRITE `len` bytes of `fill` from x to y's `buf` under `mr`'s rkey; the
 * completion status on x (-1 if none came). */
static int write_into(unsigned char *buf, struct ibv_mr *mr, size_t len, int fill)
{
	memset(x.buf, fill, len);
	struct ibv_sge ss = { (uintptr_t)x.buf, (uint32_t)len, x.mr->lkey };
	struct ibv_send_wr w = { .wr_id = ++seq, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *bw;
	w.wr.rdma.remote_addr = (uintptr_t)buf;
	w.wr.rdma.rkey = mr->rkey;
	if (ibv_post_send(x.qp, &w, &bw))
		return -1;
	struct ibv_wc wc;
	for (long spins = 0; spins < 2000000000L; spins++)
		if (ibv_poll_cq(x.cq, 1, &wc) == 1)
			return wc.status;
	return -1;
}

/* Registers [buf, buf + len) with `before` canary bytes before it and `after` after it
 * (all 0xCC; the buffer holds 0x5A). want_ok: 1 registered, 0 EOPNOTSUPP. */
static void one(const char *name, unsigned char *buf, size_t len, size_t before, size_t after,
		int want_ok)
{
	memset(buf - before, 0xCC, before);
	memset(buf + len, 0xCC, after);
	memset(buf, 0x5A, len);
	double t0 = now_us();
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(y.pd, buf, len, ACCESS);
	double t1 = now_us();
	if (!want_ok) {
		check(!mr && errno == EOPNOTSUPP, name, "expected EOPNOTSUPP");
		check(all(buf, len, 0x5A), name, "contents changed by a refused registration");
		printf("case %s: refused (EOPNOTSUPP)\n", name);
	} else {
		check(mr != NULL, name, "registration failed");
		check(all(buf, len, 0x5A), name, "contents changed by registration");
		check(all(buf - before, before, 0xCC) && all(buf + len, after, 0xCC), name,
		      "a neighbour changed at registration");
		send_into(name, buf, mr, 0x77);
		check(all(buf + MSG, len > MSG ? len - MSG : 0, 0x5A), name, "bytes past the SEND");
		double t2 = now_us();
		check(ibv_dereg_mr(mr) == 0, name, "dereg");
		double t3 = now_us();
		check(all(buf, MSG, 0x77), name, "contents changed by deregistration");
		printf("case %s: registered, %.0f us reg + %.0f us dereg\n", name, t1 - t0, t3 - t2);
	}
	check(all(buf - before, before, 0xCC) && all(buf + len, after, 0xCC), name,
	      "a neighbour changed");
}

/* Registers `buf` (private memory the NIC reaches by copying: the stack, MAP_HUGETLB),
 * forks, lets the child scribble over its copy and exit, then SENDs into the parent's
 * buffer: the NIC writes the parent's memory and the child's writes stay the child's. */
static void fork_while_registered(const char *name, unsigned char *buf)
{
	memset(buf, 0x5A, 2 * MSG);
	struct ibv_mr *mr = ibv_reg_mr(y.pd, buf, 2 * MSG, ACCESS);
	check(mr != NULL, name, "registration failed");
	pid_t pid = fork();
	if (pid == 0) {
		memset(buf, 0x99, 2 * MSG);
		_exit(0);
	}
	int st;
	check(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st), name, "child");
	check(all(buf, 2 * MSG, 0x5A), name, "the child's writes reached the parent");
	send_into(name, buf, mr, 0x78);
	check(all(buf + MSG, MSG, 0x5A), name, "bytes past the SEND");
	check(ibv_dereg_mr(mr) == 0, name, "dereg");
	printf("case %s: the NIC wrote the parent's buffer, the child's copy stayed its own\n",
	       name);
}

/* Throughput of the NIC into and out of `buf` (`len` bytes, registered here): RDMA
 * WRITEs by x into it (y's NIC writes the region), then RDMA WRITEs by y out of it
 * into x's buffer (y's NIC reads the region), `rounds` each, one outstanding at a
 * time; printed as GB/s, to compare the mechanisms within one run. */
static struct ibv_mr *big_mr;
static unsigned char *big;

/* `rounds` signaled RDMA WRITEs of `len` bytes on `from` from `src`/`lkey` to
 * `dst`/`rkey`, one at a time; GB/s. */
static double write_gbps(struct side *from, void *src, uint32_t lkey, void *dst, uint32_t rkey,
			 size_t len, int rounds)
{
	double t0 = now_us();
	for (int i = 0; i < rounds; i++) {
		struct ibv_sge ss = { (uintptr_t)src, (uint32_t)len, lkey };
		struct ibv_send_wr w = { .wr_id = ++seq, .sg_list = &ss, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
				   *bw;
		w.wr.rdma.remote_addr = (uintptr_t)dst;
		w.wr.rdma.rkey = rkey;
		check(!ibv_post_send(from->qp, &w, &bw), "throughput", "post");
		struct ibv_wc wc;
		long spins = 0;
		while (ibv_poll_cq(from->cq, 1, &wc) != 1 && ++spins < 4000000000L)
			;
		if (spins >= 4000000000L || wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "FAIL throughput: completion %s\n",
				spins >= 4000000000L ? "missing" : ibv_wc_status_str(wc.status));
			exit(2);
		}
	}
	return (double)len * rounds / ((now_us() - t0) * 1e3);
}

static void throughput(const char *name, unsigned char *buf, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(y.pd, buf, len, ACCESS);
	check(mr != NULL, name, "registration for the throughput run");
	memset(big, 0x3C, len);
	double in = write_gbps(&x, big, big_mr->lkey, buf, mr->rkey, len, 20);
	check(all(buf, len, 0x3C), name, "WRITE bytes");
	memset(buf, 0x3D, len);
	double out = write_gbps(&y, buf, mr->lkey, big, big_mr->rkey, len, 20);
	check(all(big, len, 0x3D), name, "bytes written out of the region");
	check(ibv_dereg_mr(mr) == 0, name, "dereg");
	printf("throughput %s: %zu KiB, NIC writes it %.2f GB/s, NIC reads it %.2f GB/s\n", name,
	       len >> 10, in, out);
}

/* Neighbours on the registered buffer's last page, written by another thread while
 * the buffer is registered and deregistered over and over: no write may be lost. The
 * writer sweeps the slots, writing generation g into each; before writing slot k it
 * reads back its own previous write (g - 1). A write that landed in a page which the
 * registration then replaced would read back an older value. */
#define SLOTS 496
#define REGS 1000
static volatile uint64_t *slots;
static volatile int stop_writer;
static uint64_t lost, gens;

static void *writer(void *arg)
{
	(void)arg;
	for (uint64_t g = 1; !stop_writer; g++) {
		for (int k = 0; k < SLOTS; k++) {
			if (slots[k] != g - 1)
				lost++;
			slots[k] = g;
		}
		gens = g;
	}
	return NULL;
}

static void neighbour_thread(void)
{
	const char *name = "neighbours written by another thread during registration";
	unsigned char *m = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	check(m != MAP_FAILED, name, "mmap");
	memset(m, 0, 3 * PAGE);
	/* The buffer: page 0 and 96 bytes of page 1; the neighbours: page 1 from 128. */
	size_t len = PAGE + 96;
	slots = (volatile uint64_t *)(m + PAGE + 128);
	pthread_t t;
	check(!pthread_create(&t, NULL, writer, NULL), name, "pthread_create");
	for (int i = 0; i < REGS; i++) {
		struct ibv_mr *mr = ibv_reg_mr(y.pd, m, len, ACCESS);
		check(mr && ibv_dereg_mr(mr) == 0, name, "reg/dereg");
	}
	stop_writer = 1;
	pthread_join(t, NULL);
	if (lost) {
		fprintf(stderr, "FAIL %s: %lu writes lost over %d registrations (%lu sweeps)\n",
			name, (unsigned long)lost, REGS, (unsigned long)gens);
		exit(2);
	}
	printf("case %s: no write lost in %lu sweeps of %d slots over %d registrations\n", name,
	       (unsigned long)gens, SLOTS, REGS);
}

/* A program's static data (.data / .bss: a private file mapping and anonymous pages). */
static unsigned char static_buf[8 * 1024];

struct with_field {
	char head[24];
	char field[200];
	char tail[24];
};

int main(int argc, char **argv)
{
	if (argc != 3)
		die("usage: mr_matrix DEV_A DEV_B");
	pair_open(&x, &y, argv[1], argv[2]);

	inline_from_stack();
	inline_through_wr_api();

	/* Page-aligned heap (memalign), sub-page and multi-page; the rest of the last page
	 * is heap the program may use. */
	unsigned char *a = memalign(PAGE, 4 * PAGE);
	one("memalign sub-page (100 B)", a, 100, 0, PAGE - 100, 1);
	one("memalign 3 pages + 10 B", a, 3 * PAGE + 10, 0, PAGE - 10, 1);
	/* Anonymous mmap, 64 KiB. */
	unsigned char *m = mmap(NULL, 18 * PAGE, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	one("mmap anonymous 64 KiB", m + PAGE, 16 * PAGE, PAGE, PAGE, 1);
	/* Not page-aligned: malloc in the middle of the heap, a struct field. */
	unsigned char *u = malloc(1000);
	one("malloc unaligned (1000 B)", u + 16, 900, 16, 84, 1);
	struct with_field *sf = malloc(sizeof *sf);
	one("struct field", (unsigned char *)sf->field, sizeof sf->field, 24, 24, 1);
	one("static buffer (.bss)", static_buf + 1000, 300, 1000, 300, 1);
	unsigned char *sub = memalign(PAGE, 2 * PAGE);
	one("sub-page in the middle of a page", sub + 1000, 100, 1000, PAGE - 1100, 1);
	one("unaligned across a page boundary", sub + PAGE - 50, 100, PAGE - 50, PAGE - 50, 1);
	/* The stack (the main thread's [stack]: copied by the NIC through /proc/self/mem),
	 * unaligned, with neighbours on both sides. */
	unsigned char stack[3 * PAGE];
	one("stack (copied)", stack + 100, PAGE, 100, 2 * PAGE - 100, 1);
	fork_while_registered("stack, fork() while registered", stack + 200);
	/* SysV shared memory (perftest --use_hugepages uses shmget): the NIC attaches the
	 * segment itself. */
	int id = shmget(IPC_PRIVATE, 4 * PAGE, IPC_CREAT | 0600);
	check(id >= 0, "shm", "shmget");
	unsigned char *sh = shmat(id, NULL, 0);
	shmctl(id, IPC_RMID, NULL);
	check(sh != (void *)-1, "shm", "shmat");
	one("SysV shm (NIC attaches it)", sh + 100, 2 * PAGE, 100, 2 * PAGE - 100, 1);
	/* After dereg: detach, attach a new segment at the same address, register again —
	 * the SEND must land in the new segment (the NIC attaches by id, afresh). */
	check(shmdt(sh) == 0, "shm", "shmdt");
	int id2 = shmget(IPC_PRIVATE, 4 * PAGE, IPC_CREAT | 0600);
	unsigned char *sh2 = id2 >= 0 ? shmat(id2, sh, 0) : (void *)-1;
	if (id2 >= 0)
		shmctl(id2, IPC_RMID, NULL);
	check(sh2 == sh, "shm", "a new segment at the same address");
	one("SysV shm, a new segment at the same address after dereg", sh2 + 100, 2 * PAGE, 100,
	    2 * PAGE - 100, 1);
	/* Shared memory other processes may map: MAP_SHARED anonymous, /dev/shm, a shared
	 * file mapping — copied, never remapped (that would un-share them). */
	unsigned char *sa = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	check(sa != MAP_FAILED, "shared anonymous", "mmap");
	one("mmap MAP_SHARED anonymous (copied)", sa + PAGE, PAGE + 10, PAGE, PAGE - 10, 1);
	char shm_name[64];
	snprintf(shm_name, sizeof shm_name, "/softnic-mr-matrix-%d", (int)getpid());
	int sfd = shm_open(shm_name, O_CREAT | O_RDWR | O_EXCL, 0600);
	check(sfd >= 0 && ftruncate(sfd, 4 * PAGE) == 0, "/dev/shm", "shm_open");
	unsigned char *ds = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
	shm_unlink(shm_name);
	check(ds != MAP_FAILED, "/dev/shm", "mmap");
	one("/dev/shm mapping (copied)", ds + 50, 2 * PAGE, 50, 2 * PAGE - 50, 1);
	char file_name[] = "/tmp/softnic-mr-matrix-XXXXXX";
	int ffd = mkstemp(file_name);
	check(ffd >= 0 && ftruncate(ffd, 4 * PAGE) == 0, "shared file", "mkstemp");
	unsigned char *fm = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, ffd, 0);
	unlink(file_name);
	check(fm != MAP_FAILED, "shared file", "mmap");
	one("shared file mapping (copied)", fm + PAGE, PAGE, PAGE, 2 * PAGE, 1);
	/* Read-only memory may be registered without LOCAL_WRITE only (as ib_umem_get). */
	unsigned char *ro = mmap(NULL, PAGE, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	errno = 0;
	check(!ibv_reg_mr(y.pd, ro, 64, ACCESS) && errno == EFAULT, "read-only", "LOCAL_WRITE");
	struct ibv_mr *rom = ibv_reg_mr(y.pd, ro, 64, 0);
	check(rom && ibv_dereg_mr(rom) == 0, "read-only", "without LOCAL_WRITE");
	printf("case read-only mapping: EFAULT with LOCAL_WRITE, registered without\n");
	/* Hugepages (MAP_HUGETLB, SysV SHM_HUGETLB): copied. Under SOFTNIC_CI=1 the
	 * machine must have them (.ci/run reserves some). */
	const char *ci = getenv("SOFTNIC_CI");
	int need_huge = ci && *ci && strcmp(ci, "0") && strcmp(ci, "false");
	unsigned char *hp = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	int hid = shmget(IPC_PRIVATE, 2 << 20, IPC_CREAT | SHM_HUGETLB | 0600);
	unsigned char *hs = hid >= 0 ? shmat(hid, NULL, 0) : (void *)-1;
	if (hid >= 0)
		shmctl(hid, IPC_RMID, NULL);
	if (hp == MAP_FAILED || hs == (void *)-1) {
		printf("case hugepages: not available on this machine (%s)\n", strerror(errno));
		check(!need_huge, "hugepages", "SOFTNIC_CI=1 but no hugepages (vm.nr_hugepages)");
	} else {
		one("hugepages MAP_HUGETLB (copied)", hp + 100, PAGE, 100, PAGE, 1);
		fork_while_registered("MAP_HUGETLB, fork() while registered", hp + 3 * PAGE);
		one("SysV SHM_HUGETLB (copied)", hs + 100, PAGE, 100, PAGE, 1);
	}

	/* fork() before registration: the child's copy is its own; the parent registers. */
	unsigned char *f = memalign(PAGE, PAGE);
	memset(f, 0x11, PAGE);
	pid_t pid = fork();
	if (pid == 0) {
		memset(f, 0x22, PAGE);
		_exit(f[0] == 0x22 ? 0 : 1);
	}
	int st;
	check(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st), "fork before",
	      "child");
	check(all(f, PAGE, 0x11), "fork before", "the child wrote the parent's page");
	one("after fork() (child exited)", f, 200, 0, PAGE - 200, 1);

	/* free + re-malloc after deregistration. */
	unsigned char *r = memalign(PAGE, 2 * PAGE);
	one("memalign before free", r, 2 * PAGE, 0, 0, 1);
	free(r);
	unsigned char *r2 = memalign(PAGE, 2 * PAGE);
	memset(r2, 0x33, 2 * PAGE);
	check(all(r2, 2 * PAGE, 0x33), "re-malloc", "reused memory does not hold its bytes");
	one("re-malloc after free", r2, 2 * PAGE, 0, 0, 1);

	/* Several live MRs on the same pages (rping registers two struct fields; the same
	 * buffer twice; nested and overlapping ranges; a range that runs on past pages a
	 * live MR converted, as a second heap buffer after a first): each shares the pages
	 * already converted, with its own keys and exact bounds. */
	unsigned char *o = memalign(PAGE, 3 * PAGE);
	memset(o, 0x5A, 3 * PAGE);
	struct ibv_mr *m1 = ibv_reg_mr(y.pd, o + 100, 200, ACCESS);
	double w0 = now_us();
	struct ibv_mr *m2 = ibv_reg_mr(y.pd, o + 400, 64, ACCESS);
	double w1 = now_us();
	struct ibv_mr *m3 = ibv_reg_mr(y.pd, o + 100, 200, ACCESS);
	struct ibv_mr *m4 = ibv_reg_mr(y.pd, o + 150, 300, ACCESS);
	check(m1 && m2 && m3 && m4, "shared pages", "two on one page / same twice / overlapping");
	check(m1->lkey != m3->lkey && m1->rkey != m3->rkey, "same buffer twice", "distinct keys");
	struct ibv_mr *m6 = ibv_reg_mr(y.pd, o + PAGE - 32, PAGE, ACCESS);
	check(m6 != NULL, "extending", "a range from live converted pages into new ones");
	check(all(o, 3 * PAGE, 0x5A), "shared pages", "registrations changed bytes");
	send_into("shared pages: first", o + 100, m1, 0x41);
	send_into("shared pages: second on the page", o + 400, m2, 0x42);
	send_into("shared pages: same buffer again", o + 100, m3, 0x43);
	send_into("shared pages: overlapping", o + 150, m4, 0x44);
	check(write_into(o + PAGE - 32, m6, MSG, 0x48) == IBV_WC_SUCCESS, "extending",
	      "WRITE across the page boundary");
	check(all(o + PAGE - 32, MSG, 0x48) && all(o + PAGE + 32, PAGE - 32 - 64, 0x5A), "extending",
	      "bytes of the WRITE across the page boundary");
	memset(o + PAGE - 32, 0x5A, MSG);
	check(write_into(o + 400, m2, MSG, 0x45) == IBV_WC_SUCCESS, "shared pages", "WRITE m2");
	check(all(o, 100, 0x5A) && all(o + 100, 50, 0x43) && all(o + 150, 64, 0x44) &&
		      all(o + 214, 186, 0x5A) && all(o + 400, 64, 0x45) &&
		      all(o + 464, 3 * PAGE - 464, 0x5A),
	      "shared pages", "bytes around the SENDs and the WRITE");
	/* The first MR (whose memfd the NIC mapped) goes; the others keep working, and a
	 * new window still shares the pages. */
	check(ibv_dereg_mr(m1) == 0, "shared pages", "dereg first");
	send_into("shared pages: second after the first's dereg", o + 400, m2, 0x46);
	struct ibv_mr *m5 = ibv_reg_mr(y.pd, o + 2000, 64, ACCESS);
	check(m5 != NULL, "shared pages", "a window after the first's dereg");
	send_into("shared pages: window after the first's dereg", o + 2000, m5, 0x47);
	check(ibv_dereg_mr(m2) == 0 && ibv_dereg_mr(m3) == 0 && ibv_dereg_mr(m4) == 0 &&
		      ibv_dereg_mr(m5) == 0 && ibv_dereg_mr(m6) == 0,
	      "shared pages", "dereg");
	check(all(o + 400, 64, 0x46) && all(o + 2000, 64, 0x47) && all(o + 2064, 100, 0x5A),
	      "shared pages", "bytes after dereg");
	/* All gone: the pages are private again and convert afresh. */
	one("across a page boundary after the others' dereg", o + PAGE - 10, 100, 10, 100, 1);
	printf("case two on one page / same buffer twice / overlapping / extending past live "
	       "pages / after the first's dereg: registered; a second MR on a live page %.0f us\n",
	       w1 - w0);

	/* madvise(MADV_DONTNEED) on a registered buffer: the pages are shared memory now,
	 * so they keep their bytes (no zero-fill) and stay the NIC's. */
	unsigned char *d = memalign(PAGE, 2 * PAGE);
	memset(d, 0x5A, 2 * PAGE);
	struct ibv_mr *dm = ibv_reg_mr(y.pd, d, 2 * PAGE, ACCESS);
	check(dm && madvise(d, 2 * PAGE, MADV_DONTNEED) == 0, "madvise", "reg/madvise");
	check(all(d, 2 * PAGE, 0x5A), "madvise", "MADV_DONTNEED changed a registered buffer");
	send_into("madvise", d, dm, 0x55);
	check(ibv_dereg_mr(dm) == 0, "madvise", "dereg");
	printf("case madvise(MADV_DONTNEED) on a registered buffer: bytes kept, NIC still writes it\n");

	neighbour_thread();

	/* Throughput per mechanism, 1 MiB regions, in this run. */
	const size_t MIB = 1 << 20;
	big = memalign(PAGE, MIB);
	memset(big, 0x3C, MIB);
	big_mr = ibv_reg_mr(x.pd, big, MIB, ACCESS);
	check(big_mr != NULL, "throughput", "source MR");
	throughput("memalign (memfd remap, zero-copy)", memalign(PAGE, MIB), MIB);
	int bid = shmget(IPC_PRIVATE, MIB, IPC_CREAT | 0600);
	unsigned char *bs = shmat(bid, NULL, 0);
	shmctl(bid, IPC_RMID, NULL);
	check(bs != (void *)-1, "throughput", "shmat");
	throughput("SysV shm (NIC attaches, zero-copy)", bs, MIB);
	unsigned char *bc = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
				 -1, 0);
	check(bc != MAP_FAILED, "throughput", "mmap");
	throughput("MAP_SHARED anonymous (copied via /proc/self/mem)", bc, MIB);
	if (hp != MAP_FAILED)
		throughput("MAP_HUGETLB (copied via /proc/self/mem)", hp, MIB);

	/* Exact bounds: a WRITE one byte past a sub-page MR is refused by the NIC (remote
	 * access error; the QP goes to error, so this is the last case) and the neighbour
	 * keeps its bytes. */
	unsigned char *e = memalign(PAGE, PAGE);
	memset(e, 0x5A, PAGE);
	struct ibv_mr *em = ibv_reg_mr(y.pd, e + 100, 64, ACCESS);
	check(em != NULL, "bounds", "reg");
	check(write_into(e + 100, em, 64, 0x61) == IBV_WC_SUCCESS, "bounds", "WRITE inside");
	check(write_into(e + 101, em, 64, 0x62) == IBV_WC_REM_ACCESS_ERR, "bounds",
	      "a WRITE one byte past the MR must be a remote access error");
	check(all(e, 100, 0x5A) && all(e + 100, 64, 0x61) && all(e + 164, PAGE - 164, 0x5A),
	      "bounds", "bytes outside the MR");
	printf("case WRITE past a sub-page MR's end: remote access error, neighbours intact\n");
	printf("ok\n");
	return 0;
}
