/* rdma_destroy_id returns only once every event of the id the program was given is
 * acknowledged (rdma-core's rule, which multithreaded programs such as libfabric's
 * verbs provider rely on: one thread reads events while another closes endpoints).
 *
 *   destroy_waits ADDR        (ADDR: the NIC's address; the program resolves it)
 *
 * Part 1: an ADDR_RESOLVED event is taken in the main thread and acknowledged by
 * another 300 ms later, after it read event->id->context; rdma_destroy_id, called
 * meanwhile, must not return before that acknowledgement.
 *
 * Part 2: a thread takes every event of a channel and checks that the id it names is
 * one whose rdma_destroy_id has not returned, while the main thread makes, resolves
 * and destroys 200 ids on that channel, destroying each at a varying moment after its
 * resolution began (before, during or after its event is handed out).
 *
 * Prints "ok" and exits 0, or prints what failed and exits 1. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CHECK(c) do { if (!(c)) FAIL("%s:%d: check failed: %s (errno %d)", __FILE__, __LINE__, #c, errno); } while (0)

#define MAGIC 0x5EED1D5u
#define IDS 200

static struct sockaddr_in dst;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* What each id's context points to: alive until its rdma_destroy_id returned. */
struct ctx {
	unsigned magic;
	atomic_int alive;
};

/* Part 1. */
static struct rdma_cm_event *held;
static struct ctx one = { MAGIC, 1 };
static double acked_at;

static void *ack_later(void *arg)
{
	(void)arg;
	usleep(300 * 1000);
	struct ctx *c = held->id->context;
	if (c != &one || c->magic != MAGIC || !atomic_load(&c->alive))
		FAIL("part 1: the event's id was gone before it was acknowledged");
	acked_at = now();
	CHECK(rdma_ack_cm_event(held) == 0);
	return NULL;
}

static void part1(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, &one, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(rdma_get_cm_event(ch, &held) == 0);
	if (held->event != RDMA_CM_EVENT_ADDR_RESOLVED || held->id != id)
		FAIL("part 1: got %s", rdma_event_str(held->event));
	pthread_t t;
	CHECK(pthread_create(&t, NULL, ack_later, NULL) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	double returned = now();
	atomic_store(&one.alive, 0);
	CHECK(pthread_join(t, NULL) == 0);
	if (returned < acked_at)
		FAIL("part 1: rdma_destroy_id returned %.1f ms before its event was acknowledged",
		     (acked_at - returned) * 1e3);
	rdma_destroy_event_channel(ch);
}

/* Part 2. */
static struct rdma_event_channel *ch2;
static atomic_int stop, seen;

static void *reader(void *arg)
{
	(void)arg;
	struct pollfd p = { .fd = ch2->fd, .events = POLLIN };
	while (!atomic_load(&stop)) {
		if (poll(&p, 1, 10) <= 0)
			continue;
		struct rdma_cm_event *e;
		if (rdma_get_cm_event(ch2, &e) != 0) {
			CHECK(errno == EAGAIN);
			continue;
		}
		struct ctx *c = e->id->context;
		if (!c || c->magic != MAGIC || !atomic_load(&c->alive))
			FAIL("part 2: an event (%s) names an id already destroyed",
			     rdma_event_str(e->event));
		usleep(200); /* the program works on the event a little */
		if (!atomic_load(&c->alive))
			FAIL("part 2: an id was destroyed under an event not acknowledged");
		atomic_fetch_add(&seen, 1);
		CHECK(rdma_ack_cm_event(e) == 0);
	}
	return NULL;
}

static void part2(void)
{
	ch2 = rdma_create_event_channel();
	CHECK(ch2);
	int fl = fcntl(ch2->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ch2->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, reader, NULL) == 0);
	for (int i = 0; i < IDS; i++) {
		/* Never freed: a stale context must read as dead, not as reused memory. */
		struct ctx *c = calloc(1, sizeof *c);
		CHECK(c);
		c->magic = MAGIC;
		atomic_store(&c->alive, 1);
		struct rdma_cm_id *id;
		CHECK(rdma_create_id(ch2, &id, c, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
		/* Destroyed 0-0.9 ms after the resolution began, the last 20 after 5 ms (so
		 * that some events are surely handed out first, even on a loaded machine). */
		usleep(i < IDS - 20 ? (i % 10) * 100 : 5000);
		CHECK(rdma_destroy_id(id) == 0);
		atomic_store(&c->alive, 0);
	}
	atomic_store(&stop, 1);
	CHECK(pthread_join(t, NULL) == 0);
	rdma_destroy_event_channel(ch2);
	/* Some of the ids must have had their event handed out before they were
	 * destroyed, or the race this part is about was not run. */
	if (atomic_load(&seen) == 0)
		FAIL("part 2: no event was handed out");
	fprintf(stderr, "part 2: %d of %d events handed out\n", atomic_load(&seen), IDS);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		FAIL("usage: destroy_waits ADDR");
	dst.sin_family = AF_INET;
	dst.sin_port = htons(7471);
	CHECK(inet_pton(AF_INET, argv[1], &dst.sin_addr) == 1);
	part1();
	part2();
	printf("ok\n");
	return 0;
}
