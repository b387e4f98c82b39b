/* rsockets' direct writes on softnic (riomap, riowrite, riounmap), compiled against
 * the real <rdma/rsocket.h> and run through `softnic exec`.
 *
 *   riomap server ADDR PORT         (prints "ok" and exits 0 when every check held)
 *   riomap client SADDR PORT CADDR
 *
 * The client offers an iomap array of 2 entries (RDMA_IOMAPSIZE; 200 reads back as
 * 128, the connection data's 8-bit scale); the server offers none. The server maps a
 * heap buffer at offset 0 and an mmap'ed one at offset 1,000,000 for the client to
 * write into; a third writable map finds the client's array full (ENOMEM), a
 * read-only one is local and needs no entry. The client's writable map finds the
 * server's array empty (ENOMEM). The client riowrites patterned bytes into both
 * windows (a write running past a window's end stops there; an offset in no window is
 * EINVAL), then sends "done": RC delivers that message after the WRITEs, and the
 * server finds every byte in place. riounmap takes exactly what riomap made (other
 * lengths are EINVAL), and the program's buffer stays its own afterwards.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rs_common.h"

#define WIN1 300000
#define WIN2 65536
#define WIN2_AT 1000000

static unsigned char pattern(size_t i, int salt)
{
	return (unsigned char)((i * 13 + salt) % 253);
}

static int server(const char *ip, int port)
{
	struct sockaddr_in a = addr_of(ip, port);
	int one = 1, l, c;
	unsigned char small[8], local[64];
	unsigned char *win1 = malloc(WIN1);
	unsigned char *win2 = mmap(NULL, WIN2, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(win1 && win2 != MAP_FAILED);
	memset(win1, 0xEE, WIN1);
	memset(win2, 0xEE, WIN2);
	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(rlisten(l, 4) == 0);
	/* Nothing to map on a socket that is not connected, nor on no socket. */
	CHECK(riomap(l, win1, WIN1, PROT_WRITE, 0, 0) == -1 && errno == EINVAL);
	CHECK(riomap(l + 1000, win1, WIN1, PROT_WRITE, 0, 0) == -1 && errno == EBADF);
	c = raccept(l, NULL, NULL);
	CHECK(c >= 0);

	CHECK(riomap(c, win1, WIN1, PROT_READ, 0, 0) == -1 && errno == EINVAL);
	CHECK(riomap(c, win1, WIN1, PROT_WRITE, 0, 0) == 0);
	CHECK(riomap(c, win2, WIN2, PROT_WRITE, 0, WIN2_AT) == WIN2_AT);
	/* The client's array has two entries, both taken now. */
	CHECK(riomap(c, local, sizeof local, PROT_WRITE, 0, 5000) == -1 && errno == ENOMEM);
	/* A read-only map stays local: no entry needed; offset -1 is the address. */
	CHECK(riomap(c, local, sizeof local, PROT_NONE, 0, -1) == (off_t)(uintptr_t)local);
	CHECK(riounmap(c, local, sizeof local) == 0);
	/* The maps go before this message. */
	CHECK(rsend(c, "maps", 4, 0) == 4);
	CHECK(rrecv(c, small, 4, MSG_WAITALL) == 4 && !memcmp(small, "done", 4));
	for (size_t i = 0; i < WIN1; i++)
		CHECK(win1[i] == pattern(i, 3));
	for (size_t i = 0; i < WIN2; i++)
		CHECK(win2[i] == pattern(i, 4));

	CHECK(riounmap(c, win1, WIN1 - 1) == -1 && errno == EINVAL);
	CHECK(riounmap(c, win1, WIN1) == 0);
	CHECK(riounmap(c, win1, WIN1) == -1 && errno == EINVAL);
	CHECK(riounmap(c, win2, WIN2) == 0);
	/* The buffers are the program's own again: same bytes, writable. */
	CHECK(win1[WIN1 - 1] == pattern(WIN1 - 1, 3) && win2[0] == pattern(0, 4));
	memset(win1, 1, WIN1);
	memset(win2, 2, WIN2);
	CHECK(win1[12345] == 1 && win2[WIN2 - 1] == 2);
	free(win1);
	CHECK(munmap(win2, WIN2) == 0);
	CHECK(rclose(c) == 0);
	CHECK(rclose(l) == 0);
	printf("ok\n");
	return 0;
}

static int connect_retrying(const char *sip, int port, const char *cip)
{
	struct sockaddr_in a = addr_of(sip, port), b = addr_of(cip, 0);
	unsigned char local[4096];

	for (int tries = 0; tries < 200; tries++) {
		int s = rsocket(AF_INET, SOCK_STREAM, 0), size = 200, got = 0;
		socklen_t len = sizeof got;

		CHECK(s >= 0);
		CHECK(rsetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &size, sizeof size) == 0);
		CHECK(rgetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &got, &len) == 0 && got == 128);
		size = 2;
		CHECK(rsetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &size, sizeof size) == 0);
		CHECK(rgetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &got, &len) == 0 && got == 2);
		CHECK(riomap(s, local, sizeof local, PROT_WRITE, 0, 0) == -1 && errno == EINVAL);
		CHECK(rbind(s, (struct sockaddr *)&b, sizeof b) == 0);
		if (rconnect(s, (struct sockaddr *)&a, sizeof a) == 0)
			return s;
		CHECK(errno == ECONNREFUSED); /* the server is not listening yet */
		CHECK(rclose(s) == 0);
		usleep(50000);
	}
	CHECK(!"the server never listened");
	return -1;
}

static int client(const char *sip, int port, const char *cip)
{
	int s = connect_retrying(sip, port, cip);
	unsigned char small[8], local[4096];
	unsigned char *p3 = malloc(WIN1), *p4 = malloc(WIN2);

	CHECK(p3 && p4);
	for (size_t i = 0; i < WIN1; i++)
		p3[i] = pattern(i, 3);
	for (size_t i = 0; i < WIN2; i++)
		p4[i] = pattern(i, 4);
	/* The server's array is empty: nothing of ours can be mapped there. */
	CHECK(riomap(s, local, sizeof local, PROT_WRITE, 0, 0) == -1 && errno == ENOMEM);
	CHECK(rrecv(s, small, 4, MSG_WAITALL) == 4 && !memcmp(small, "maps", 4));
	/* Ten bytes from 5 before the first window's end: the 5 that fit. */
	memset(local, 0x55, 10);
	CHECK(riowrite(s, local, 10, WIN1 - 5, 0) == 5);
	CHECK(riowrite(s, p3, WIN1, 0, 0) == WIN1);
	CHECK(riowrite(s, p4, WIN2, WIN2_AT, 0) == WIN2);
	CHECK(riowrite(s, local, 1, WIN1, 0) == (size_t)-1 && errno == EINVAL);
	CHECK(riowrite(s, local, 1, WIN2_AT + WIN2, MSG_DONTWAIT) == (size_t)-1 &&
	      errno == EINVAL);
	CHECK(rsend(s, "done", 4, 0) == 4);
	CHECK(rrecv(s, small, sizeof small, 0) == 0); /* the server's close */
	CHECK(riowrite(s, p4, 1, WIN2_AT, 0) == (size_t)-1);
	CHECK(rclose(s) == 0);
	free(p3);
	free(p4);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	return rs_main(argc, argv, server, client);
}
