/* What the rsockets test programs (rsocket.c, riomap.c) share: a check that names the
 * failing line and errno and exits 1, an IPv4 address from text, and the command line
 * (`PROG server ADDR PORT` or `PROG client SADDR PORT CADDR`). */
#ifndef SOFTNIC_RS_COMMON_H
#define SOFTNIC_RS_COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                   \
	do {                                                                       \
		if (!(c)) {                                                        \
			fprintf(stderr, "%s:%d: check failed: %s (errno %d %s)\n", \
				__FILE__, __LINE__, #c, errno, strerror(errno));   \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

static inline struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	return a;
}

/* Runs `server` or `client` as the command line says; 2 for a wrong one. */
static inline int rs_main(int argc, char **argv, int (*server)(const char *, int),
			  int (*client)(const char *, int, const char *))
{
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(argv[2], atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), argv[4]);
	fprintf(stderr, "usage: %s server ADDR PORT | client SADDR PORT CADDR\n", argv[0]);
	return 2;
}

#endif
