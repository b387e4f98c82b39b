/* On-demand paging through the C ABI between two NICs: what an ODP registration
 * promises beyond "SEND works", each case failing if softnic pinned, converted or
 * checked the memory at registration as a plain ibv_reg_mr does.
 *
 *   odp DEV_A DEV_B
 *
 * x (DEV_A) and y (DEV_B) are an RC pair. Cases:
 *  - ibv_query_device_ex reports ODP and implicit ODP; RC SEND/RECV/WRITE/READ/SRQ_RECV
 *    without ATOMIC; UD SEND/RECV.
 *  - An ODP MR over a range that is not mapped at registration (a plain MR there is
 *    EFAULT); the range is mapped afterwards and a SEND from it arrives.
 *  - A RECV into an ODP MR over fresh, never-touched mmap pages; the bytes land where
 *    the program reads them.
 *  - RDMA WRITE into and RDMA READ out of ODP MRs with remote rights.
 *  - An implicit ODP MR (NULL, SIZE_MAX): addr NULL and length SIZE_MAX, and its L_Key
 *    carries a SEND from the heap and one from the stack.
 *  - ibv_advise_mr: PREFETCH_WRITE faults fresh pages in (mincore), NO_FAULT does not;
 *    EFAULT for a range outside the MR, an L_Key that is not ODP, PREFETCH_WRITE on an
 *    MR without local write; EINVAL for unknown flags or no SGE; EOPNOTSUPP for an
 *    unknown advice.
 *  - fork() while registered: the child reads and writes the buffer (copy-on-write,
 *    nothing is MADV_DONTFORK) and the parent's bytes are unchanged.
 *  - munmap while registered: a SEND from the range completes with an error (the QP
 *    goes to error; last).
 * Prints "ok" at the end; any mismatch prints FAIL and exits 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_pair.h"

#define PAGE 4096
#define MSG 256
#define ODP (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)
#define ODP_REMOTE (ODP | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct side x, y;
static uint64_t seq;

static void check(int ok, const char *name, const char *what)
{
	if (!ok) {
		fprintf(stderr, "FAIL %s: %s (errno %d)\n", name, what, errno);
		exit(2);
	}
}

/* One completion on `cq`; its status. */
static enum ibv_wc_status one_wc(struct ibv_cq *cq, const char *name)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 2000000000L; spins++)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc.status;
	check(0, name, "no completion");
	return IBV_WC_GENERAL_ERR;
}

/* Posts a SEND of `len` bytes at `src` (lkey `lk`) from x into y's `dst` (lkey `dk`);
 * the status of x's completion. */
static enum ibv_wc_status try_send(const char *name, void *src, uint32_t lk, void *dst,
				   uint32_t dk, size_t len)
{
	struct ibv_sge rs = { (uintptr_t)dst, len, dk }, ss = { (uintptr_t)src, len, lk };
	struct ibv_recv_wr r = { .wr_id = ++seq, .sg_list = &rs, .num_sge = 1 }, *br;
	struct ibv_send_wr w = { .wr_id = seq, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bw;
	check(!ibv_post_recv(y.qp, &r, &br) && !ibv_post_send(x.qp, &w, &bw), name, "post");
	return one_wc(x.cq, name);
}

/* The SEND of try_send, which must arrive. */
static void send(const char *name, void *src, uint32_t lk, void *dst, uint32_t dk, size_t len)
{
	check(try_send(name, src, lk, dst, dk, len) == IBV_WC_SUCCESS, name, "send status");
	check(one_wc(y.cq, name) == IBV_WC_SUCCESS, name, "recv status");
}

/* An RDMA `op` of `len` bytes between x's `local` (lkey `lk`) and y's `remote`. */
static void rdma(const char *name, enum ibv_wr_opcode op, void *local, uint32_t lk, void *remote,
		 uint32_t rkey, size_t len)
{
	struct ibv_sge s = { (uintptr_t)local, len, lk };
	struct ibv_send_wr w = { .wr_id = ++seq, .sg_list = &s, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED },
			   *bw;
	w.wr.rdma.remote_addr = (uintptr_t)remote;
	w.wr.rdma.rkey = rkey;
	check(!ibv_post_send(x.qp, &w, &bw), name, "post");
	check(one_wc(x.cq, name) == IBV_WC_SUCCESS, name, "status");
}

static void fill(unsigned char *p, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + salt);
}

static int same(const unsigned char *p, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 31 + salt))
			return 0;
	return 1;
}

/* SENDs MSG bytes at `src` (lkey `lk`) into y's buffer, which must then hold the
 * pattern `salt`. */
static void send_checked(const char *name, void *src, uint32_t lk, int salt)
{
	memset(y.buf, 0, MSG);
	send(name, src, lk, y.buf, y.mr->lkey, MSG);
	check(same(y.buf, MSG, salt), name, "the bytes that arrived");
}

static void *fresh(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	check(p != MAP_FAILED, "mmap", "fresh pages");
	return p;
}

/* Fresh pages registered on demand on `pd`. */
static unsigned char *fresh_odp(struct ibv_pd *pd, size_t len, int access, struct ibv_mr **mr,
				const char *name)
{
	unsigned char *p = fresh(len);
	*mr = ibv_reg_mr(pd, p, len, access);
	check(*mr != NULL, name, "reg");
	return p;
}

/* Deregisters `mr` and unmaps its `len` bytes at `p`. */
static void release(const char *name, struct ibv_mr *mr, void *p, size_t len)
{
	check(!ibv_dereg_mr(mr), name, "dereg");
	munmap(p, len);
}

static int resident(void *p)
{
	unsigned char v = 0;
	check(mincore(p, PAGE, &v) == 0, "mincore", "mincore");
	return v & 1;
}

static void caps(void)
{
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof a);
	check(!ibv_query_device_ex(x.ctx, NULL, &a), "caps", "query_device_ex");
	check((a.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
		      (a.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT),
	      "caps", "general");
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_SRQ_RECV;
	check((a.odp_caps.per_transport_caps.rc_odp_caps & rc) == rc, "caps", "rc");
	check(!(a.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC), "caps",
	      "rc atomics on ODP memory are not offered");
	uint32_t ud = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
	check((a.odp_caps.per_transport_caps.ud_odp_caps & ud) == ud, "caps", "ud");
	printf("case caps: general %#llx rc %#x uc %#x ud %#x\n",
	       (unsigned long long)a.odp_caps.general_caps,
	       a.odp_caps.per_transport_caps.rc_odp_caps,
	       a.odp_caps.per_transport_caps.uc_odp_caps,
	       a.odp_caps.per_transport_caps.ud_odp_caps);
}

static void unmapped_at_registration(void)
{
	const char *name = "registered before it is mapped";
	unsigned char *p = fresh(4 * PAGE);
	check(munmap(p, 4 * PAGE) == 0, name, "munmap");
	errno = 0;
	check(!ibv_reg_mr(x.pd, p, 4 * PAGE, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT, name,
	      "a plain MR over a hole is EFAULT");
	struct ibv_mr *mr = ibv_reg_mr(x.pd, p, 4 * PAGE, ODP);
	check(mr != NULL, name, "ODP registration of a hole");
	check(mmap(p, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		   -1, 0) == p,
	      name, "map it now");
	fill(p + PAGE + 7, MSG, 1);
	send_checked(name, p + PAGE + 7, mr->lkey, 1);
	release(name, mr, p, 4 * PAGE);
	printf("case %s: sent\n", name);
}

static void recv_into_fresh_pages(void)
{
	const char *name = "RECV into never-touched pages";
	struct ibv_mr *mr;
	unsigned char *p = fresh_odp(y.pd, 8 * PAGE, ODP, &mr, name);
	fill(x.buf, MSG, 2);
	send(name, x.buf, x.mr->lkey, p + 5 * PAGE - 100, mr->lkey, MSG);
	check(same(p + 5 * PAGE - 100, MSG, 2), name, "the bytes are where the program reads");
	check(p[0] == 0 && p[8 * PAGE - 1] == 0, name, "neighbours untouched");
	release(name, mr, p, 8 * PAGE);
	printf("case %s: received\n", name);
}

static void write_and_read(void)
{
	const char *name = "RDMA WRITE into and READ out of ODP memory";
	struct ibv_mr *lm, *rm;
	unsigned char *lp = fresh_odp(x.pd, 4 * PAGE, ODP, &lm, name);
	unsigned char *rp = fresh_odp(y.pd, 4 * PAGE, ODP_REMOTE, &rm, name);
	struct ibv_qp_attr qa = { .qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
						     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	check(!ibv_modify_qp(y.qp, &qa, IBV_QP_ACCESS_FLAGS), name, "allow READs");
	fill(lp, 3 * PAGE, 3);
	rdma(name, IBV_WR_RDMA_WRITE, lp, lm->lkey, rp + 11, rm->rkey, 3 * PAGE);
	check(same(rp + 11, 3 * PAGE, 3), name, "written");
	fill(rp + 2 * PAGE, 1000, 4);
	memset(lp, 0, 4 * PAGE);
	rdma(name, IBV_WR_RDMA_READ, lp + 3, lm->lkey, rp + 2 * PAGE, rm->rkey, 1000);
	check(same(lp + 3, 1000, 4), name, "read");
	release(name, lm, lp, 4 * PAGE);
	release(name, rm, rp, 4 * PAGE);
	printf("case %s: written and read\n", name);
}

static void implicit(void)
{
	const char *name = "implicit ODP";
	struct ibv_mr *mr = ibv_reg_mr(x.pd, NULL, SIZE_MAX, ODP);
	check(mr != NULL, name, "reg");
	check(mr->addr == NULL && mr->length == SIZE_MAX, name, "addr NULL, length SIZE_MAX");
	unsigned char *heap = malloc(3 * MSG);
	fill(heap + 5, MSG, 5);
	send_checked(name, heap + 5, mr->lkey, 5);
	unsigned char stack[MSG + 16];
	fill(stack + 3, MSG, 6);
	send_checked(name, stack + 3, mr->lkey, 6);
	free(heap);
	check(!ibv_dereg_mr(mr), name, "dereg");
	printf("case %s: sent from the heap and the stack\n", name);
}

static void advise(void)
{
	const char *name = "ibv_advise_mr";
	struct ibv_mr *mr;
	unsigned char *p = fresh_odp(x.pd, 16 * PAGE, ODP, &mr, name);
	struct ibv_mr *ro = ibv_reg_mr(x.pd, p, 16 * PAGE, IBV_ACCESS_ON_DEMAND);
	check(ro != NULL, name, "reg read-only");
	check(!resident(p + 3 * PAGE) && !resident(p + 9 * PAGE), name, "fresh pages");
	struct ibv_sge s = { (uintptr_t)(p + 2 * PAGE + 100), 4 * PAGE, mr->lkey };
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH,
			    &s, 1) == 0 && !resident(p + 3 * PAGE),
	      name, "NO_FAULT faults nothing in");
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &s, 1) == 0,
	      name, "PREFETCH_WRITE");
	check(resident(p + 2 * PAGE) && resident(p + 3 * PAGE) && resident(p + 6 * PAGE) &&
		      !resident(p + 9 * PAGE),
	      name, "exactly the advised pages are resident");
	check(p[3 * PAGE] == 0, name, "contents unchanged");
	struct ibv_sge out = { (uintptr_t)(p + 15 * PAGE), 2 * PAGE, mr->lkey };
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &out, 1) == EFAULT, name,
	      "past the MR's end");
	struct ibv_sge plain = { (uintptr_t)x.buf, 64, x.mr->lkey };
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &plain, 1) == EFAULT, name,
	      "an MR that is not ODP");
	struct ibv_sge ros = { (uintptr_t)p, PAGE, ro->lkey };
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &ros, 1) == EFAULT, name,
	      "PREFETCH_WRITE without local write");
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &ros, 1) == 0, name,
	      "PREFETCH (read) without local write");
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &s, 1) == EINVAL, name,
	      "unknown flags");
	check(ibv_advise_mr(x.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 0) == EINVAL, name,
	      "no SGE");
	check(ibv_advise_mr(x.pd, 7, 0, &s, 1) == EOPNOTSUPP, name, "unknown advice");
	check(!ibv_dereg_mr(ro), name, "dereg read-only");
	release(name, mr, p, 16 * PAGE);
	printf("case %s: prefetched, refused as the man page says\n", name);
}

static void fork_while_registered(void)
{
	const char *name = "fork() while registered";
	struct ibv_mr *mr;
	unsigned char *p = fresh_odp(x.pd, 2 * PAGE, ODP, &mr, name);
	fill(p, MSG, 7);
	fflush(stdout);
	pid_t c = fork();
	check(c >= 0, name, "fork");
	if (c == 0)
		_exit(same(p, MSG, 7) ? (memset(p, 0, MSG), 0) : 3);
	int st = 0;
	check(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, name,
	      "the child reads and writes the buffer");
	check(same(p, MSG, 7), name, "the parent's bytes");
	send_checked(name, p, mr->lkey, 7);
	release(name, mr, p, 2 * PAGE);
	printf("case %s: child read and wrote, parent sent\n", name);
}

static void unmapped_at_access(void)
{
	const char *name = "unmapped when the NIC reads it";
	struct ibv_mr *mr;
	unsigned char *p = fresh_odp(x.pd, 2 * PAGE, ODP, &mr, name);
	check(munmap(p, 2 * PAGE) == 0, name, "munmap");
	enum ibv_wc_status st = try_send(name, p, mr->lkey, y.buf, y.mr->lkey, MSG);
	check(st != IBV_WC_SUCCESS, name, "the SEND must fail");
	printf("case %s: %s\n", name, ibv_wc_status_str(st));
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		die("usage: odp DEV_A DEV_B");
	pair_open(&x, &y, argv[1], argv[2]);
	caps();
	unmapped_at_registration();
	recv_into_fresh_pages();
	write_and_read();
	implicit();
	advise();
	fork_while_registered();
	unmapped_at_access();
	printf("ok\n");
	return 0;
}
