/* What ibv_reg_mr costs on softnic's libibverbs (in-place remap onto a memfd): time per
 * registration + deregistration of page-aligned, touched buffers of several sizes.
 * Not a test; the numbers in docs/ibverbs.md come from it.
 *
 *   cc -O2 -o mr_cost verbs-api/ibverbs/bench/mr_cost.c -libverbs
 *   softnic exec -d NIC -- ./mr_cost */
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		return 1;
	struct ibv_context *c = ibv_open_device(l[0]);
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	if (!pd)
		return 1;
	size_t sizes[] = { 4096, 65536, 1 << 20, 16 << 20, 64 << 20 };
	printf("%10s %6s %14s %14s\n", "bytes", "reps", "us/reg+dereg", "GB/s");
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		int reps = n <= (1 << 20) ? 200 : 10;
		double total = 0;
		for (int r = 0; r < reps; r++) {
			/* A fresh buffer each time: the first registration converts it. */
			char *b = memalign(4096, n);
			memset(b, r, n);
			double t0 = now();
			struct ibv_mr *mr = ibv_reg_mr(pd, b, n, IBV_ACCESS_LOCAL_WRITE);
			if (!mr || ibv_dereg_mr(mr))
				return 2;
			total += now() - t0;
			free(b);
		}
		double per = total / reps;
		printf("%10zu %6d %14.1f %14.2f\n", n, reps, per * 1e6, n / per / 1e9);
	}
	return 0;
}
