/* rsockets on softnic, compiled against the real <rdma/rsocket.h> and run through
 * `softnic exec`: the stream semantics a socket program relies on.
 *
 *   rsocket server ADDR PORT         (prints "ok" and exits 0 when every check held)
 *   rsocket client SADDR PORT CADDR
 *
 * Connection 1 (blocking): 1,000,000 patterned bytes client -> server read with
 * MSG_WAITALL; MSG_PEEK then a read of the same bytes; 300,000 bytes back through
 * rwritev (two iovecs); the client's SHUT_WR is end-of-stream (0) at the server, the
 * server's close is end-of-stream at the client after all its data.
 * Connection 2 (non-blocking): EINPROGRESS, rpoll for POLLOUT, SO_ERROR 0; the
 * listener is found readable by rpoll beside an ordinary pipe that is not; a receive
 * with nothing queued is EAGAIN; rselect waits for the reply.
 * Connection 3 (blocking): one thread blocks in rrecv while another sends on the same
 * socket, the send that the reply waits for (a lock held while blocked would hang it).
 * Before both, a connect to a port nobody listens on is ECONNREFUSED (blocking) and,
 * non-blocking, POLLERR with SO_ERROR ECONNREFUSED, read once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <unistd.h>

#include "rs_common.h"

#define BIG 1000000
#define BACK 300000

static unsigned char pattern(size_t i, int salt)
{
	return (unsigned char)((i * 7 + salt) % 251);
}

static void send_all(int s, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t k = rsend(s, p, n > 100000 ? 100000 : n, 0);
		CHECK(k > 0);
		p += k;
		n -= k;
	}
}

/* Waits (at most 10 s) for `events` on rsocket `s`; returns revents. */
static short wait_for(int s, short events)
{
	struct pollfd p = { .fd = s, .events = events };
	CHECK(rpoll(&p, 1, 10000) == 1);
	return p.revents;
}

static int server(const char *ip, int port)
{
	struct sockaddr_in a = addr_of(ip, port), got;
	socklen_t len = sizeof got;
	int one = 1, l, c, pipefd[2];
	static unsigned char buf[BIG];
	unsigned char small[16];

	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(rlisten(l, 4) == 0);
	CHECK(rgetsockname(l, (struct sockaddr *)&got, &len) == 0);
	CHECK(len == sizeof got && got.sin_port == htons(port));

	/* Connection 1, blocking. */
	len = sizeof got;
	c = raccept(l, (struct sockaddr *)&got, &len);
	CHECK(c >= 0);
	CHECK(got.sin_family == AF_INET);
	CHECK(rrecv(c, buf, BIG, MSG_WAITALL) == BIG);
	for (size_t i = 0; i < BIG; i++)
		CHECK(buf[i] == pattern(i, 1));
	CHECK(rrecv(c, small, 4, MSG_PEEK) == 4 && !memcmp(small, "peek", 4));
	CHECK(rrecv(c, small, 8, MSG_WAITALL) == 8 && !memcmp(small, "peekaboo", 8));
	for (size_t i = 0; i < BACK; i++)
		buf[i] = pattern(i, 2);
	struct iovec iov[2] = { { buf, BACK / 2 }, { buf + BACK / 2, BACK - BACK / 2 } };
	size_t sent = 0;
	while (sent < BACK) {
		ssize_t k;
		if (sent == 0) {
			k = rwritev(c, iov, 2);
		} else {
			k = rwrite(c, buf + sent, BACK - sent);
		}
		CHECK(k > 0);
		sent += k;
	}
	CHECK(rrecv(c, small, sizeof small, 0) == 0); /* the client's SHUT_WR */
	CHECK(rclose(c) == 0);

	/* Connection 2, non-blocking listener. */
	CHECK(rfcntl(l, F_SETFL, O_NONBLOCK) == 0);
	CHECK(rfcntl(l, F_GETFL) & O_NONBLOCK);
	CHECK(pipe(pipefd) == 0);
	struct pollfd p[2] = { { .fd = pipefd[0], .events = POLLIN }, { .fd = l, .events = POLLIN } };
	CHECK(rpoll(p, 2, 10000) == 1);
	CHECK(p[0].revents == 0 && (p[1].revents & POLLIN));
	c = raccept(l, NULL, NULL);
	CHECK(c >= 0);
	CHECK(rfcntl(c, F_GETFL) & O_NONBLOCK); /* inherited from the listener */
	CHECK(rrecv(c, small, sizeof small, 0) == -1 && errno == EAGAIN);
	CHECK(rsend(c, "go", 2, 0) == 2);
	CHECK(wait_for(c, POLLIN) & POLLIN);
	ssize_t k;
	do {
		k = rrecv(c, small, 4, MSG_WAITALL);
	} while (k == -1 && errno == EAGAIN);
	CHECK(k == 4 && !memcmp(small, "done", 4));
	CHECK(rclose(c) == 0);

	/* Connection 3, blocking again: answers "ping" with "pong". */
	CHECK(rfcntl(l, F_SETFL, 0) == 0);
	c = raccept(l, NULL, NULL);
	CHECK(c >= 0);
	CHECK(rrecv(c, small, 4, MSG_WAITALL) == 4 && !memcmp(small, "ping", 4));
	CHECK(rsend(c, "pong", 4, 0) == 4);
	CHECK(rclose(c) == 0);
	CHECK(rclose(l) == 0);
	CHECK(rclose(l) == -1 && errno == EBADF);
	printf("ok\n");
	return 0;
}

static int connect_retrying(const char *sip, int port, const char *cip)
{
	struct sockaddr_in a = addr_of(sip, port), b = addr_of(cip, 0);
	for (int tries = 0; tries < 40; tries++) {
		int s = rsocket(AF_INET, SOCK_STREAM, 0);
		CHECK(s >= 0);
		CHECK(rbind(s, (struct sockaddr *)&b, sizeof b) == 0);
		if (rconnect(s, (struct sockaddr *)&a, sizeof a) == 0)
			return s;
		CHECK(errno == ECONNREFUSED); /* the server is not listening yet */
		rclose(s);
		usleep(250000);
	}
	CHECK(!"the server never listened");
	return -1;
}

static void *read_pong(void *arg)
{
	unsigned char small[4];
	CHECK(rrecv(*(int *)arg, small, 4, MSG_WAITALL) == 4 && !memcmp(small, "pong", 4));
	return NULL;
}

static int client(const char *sip, int port, const char *cip)
{
	struct sockaddr_in nobody = addr_of(sip, port + 1), b = addr_of(cip, 0);
	static unsigned char buf[BIG];
	unsigned char small[16];
	int s, err;
	socklen_t len;

	/* Nobody listens: refused, blocking and non-blocking. */
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rbind(s, (struct sockaddr *)&b, sizeof b) == 0);
	CHECK(rconnect(s, (struct sockaddr *)&nobody, sizeof nobody) == -1 && errno == ECONNREFUSED);
	CHECK(rclose(s) == 0);
	s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(rbind(s, (struct sockaddr *)&b, sizeof b) == 0);
	CHECK(rconnect(s, (struct sockaddr *)&nobody, sizeof nobody) == -1 && errno == EINPROGRESS);
	CHECK(wait_for(s, POLLOUT) & POLLERR);
	len = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == ECONNREFUSED);
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
	CHECK(rclose(s) == 0);

	/* Connection 1, blocking. */
	s = connect_retrying(sip, port, cip);
	for (size_t i = 0; i < BIG; i++)
		buf[i] = pattern(i, 1);
	send_all(s, buf, BIG);
	send_all(s, (const unsigned char *)"peekaboo", 8);
	CHECK(rshutdown(s, SHUT_WR) == 0);
	CHECK(rsend(s, "x", 1, 0) == -1 && errno == EPIPE);
	memset(buf, 0, BACK);
	CHECK(rrecv(s, buf, BACK, MSG_WAITALL) == BACK);
	for (size_t i = 0; i < BACK; i++)
		CHECK(buf[i] == pattern(i, 2));
	CHECK(rrecv(s, small, sizeof small, 0) == 0); /* the server's close */
	CHECK(rclose(s) == 0);

	/* Connection 2, non-blocking. */
	struct sockaddr_in a = addr_of(sip, port);
	s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(rbind(s, (struct sockaddr *)&b, sizeof b) == 0);
	int r = rconnect(s, (struct sockaddr *)&a, sizeof a);
	CHECK(r == 0 || errno == EINPROGRESS);
	CHECK(wait_for(s, POLLOUT) == POLLOUT);
	len = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
	fd_set rd;
	FD_ZERO(&rd);
	FD_SET(s, &rd);
	struct timeval tv = { .tv_sec = 10 };
	CHECK(rselect(s + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(s, &rd));
	ssize_t k;
	do {
		k = rrecv(s, small, 2, MSG_WAITALL);
	} while (k == -1 && errno == EAGAIN);
	CHECK(k == 2 && !memcmp(small, "go", 2));
	CHECK(rsend(s, "done", 4, 0) == 4);
	/* The server closes: readable, then end-of-stream. */
	CHECK(wait_for(s, POLLIN) & (POLLIN | POLLHUP));
	do {
		k = rrecv(s, small, sizeof small, 0);
	} while (k == -1 && errno == EAGAIN);
	CHECK(k == 0);
	CHECK(rclose(s) == 0);

	/* Connection 3: a thread blocks reading while another sends on the same socket
	 * (the reply comes only after the send). */
	s = connect_retrying(sip, port, cip);
	pthread_t reader;
	CHECK(pthread_create(&reader, NULL, read_pong, &s) == 0);
	usleep(200000); /* let the reader block first */
	CHECK(rsend(s, "ping", 4, 0) == 4);
	CHECK(pthread_join(reader, NULL) == 0);
	CHECK(rclose(s) == 0);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	return rs_main(argc, argv, server, client);
}
