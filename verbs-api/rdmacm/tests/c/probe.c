/* librdmacm calls on softnic. `probe strings` prints rdma_event_str for every value
 * from -2 to 17 (run on rdma-core's library and on softnic's, and compared); `probe`
 * checks softnic's answers that need no NIC and prints "ok" (with $SOFTNIC_DIR empty);
 * `probe nic NAME` checks those with one NIC, NAME, the only device shown
 * (`softnic exec -d NAME`). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <rdma/rdma_verbs.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s failed (errno %d)\n", \
	__FILE__, __LINE__, #c, errno); return 1; } } while (0)

static int nic(const char *name)
{
	/* The device list: the NIC's context, usable for verbs, the same on a second call. */
	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 1 && devs[0] && devs[1] == NULL);
	CHECK(!strcmp(ibv_get_device_name(devs[0]->device), name));
	struct ibv_pd *pd = ibv_alloc_pd(devs[0]);
	CHECK(pd && ibv_dealloc_pd(pd) == 0);
	struct ibv_context **again = rdma_get_devices(NULL);
	CHECK(again && again[0] == devs[0]);
	rdma_free_devices(again);
	rdma_free_devices(devs);
	/* An event channel's fd polls: nothing pending. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch && ch->fd >= 0);
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0);
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	/* RDMA_PS_IB ids are RC ids (rdma_create_ep makes XRC ones); IPoIB is not
	 * served. */
	struct rdma_cm_id *id = NULL;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_IB) == 0 && id->ps == RDMA_PS_IB &&
	      id->qp_type == IBV_QPT_RC);
	CHECK(rdma_destroy_id(id) == 0);
	id = NULL;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_IPOIB) == -1 && errno == EOPNOTSUPP);
	CHECK(rdma_create_id(ch, &id, NULL, 0x1234) == -1 && errno == EINVAL && id == NULL);
	CHECK(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);
	/* rdma_bind_addr to port 0 reserves a port at once (rdma_get_src_port names it
	 * before any listen, as qperf's server needs); another id cannot bind it
	 * (EADDRINUSE, as Linux) until the first is destroyed. */
	struct sockaddr_in any = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
	struct rdma_cm_id *a = NULL, *b = NULL;
	CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(a, (struct sockaddr *)&any) == 0);
	uint16_t port = rdma_get_src_port(a);
	CHECK(ntohs(port) >= 49152);
	/* A bound id carries its device's PD, as rdma-core's ucma_get_device sets it. */
	CHECK(a->verbs && a->pd && a->pd->context == a->verbs);
	/* ... and its verbs is the context rdma_get_devices lists (libfabric allocates its
	 * PD there and creates QPs on ids with it). */
	struct ibv_context **listed = rdma_get_devices(NULL);
	CHECK(listed && listed[0] == a->verbs);
	CHECK(!strcmp(ibv_get_device_name(a->verbs->device), name));
	rdma_free_devices(listed);
	struct sockaddr_in same = any;
	same.sin_port = port;
	CHECK(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(b, (struct sockaddr *)&same) == -1 && errno == EADDRINUSE);
	CHECK(rdma_listen(a, 0) == 0 && rdma_get_src_port(a) == port);
	CHECK(rdma_destroy_id(a) == 0);
	CHECK(rdma_bind_addr(b, (struct sockaddr *)&same) == 0 && rdma_get_src_port(b) == port);
	CHECK(rdma_destroy_id(b) == 0);
	/* SRQs on ids: rdma_create_srq needs a bound id (EINVAL before), keeps the SRQ as
	 * id->srq, and rdma_create_qp gives it to a QP created without one;
	 * rdma_create_srq_ex needs IBV_SRQ_INIT_ATTR_TYPE (EINVAL) and makes basic and
	 * XRC SRQs (tag matching: EOPNOTSUPP). An XRC SRQ given no domain and no CQ is
	 * made in the device's XRC domain with a receive CQ made for it, id->recv_cq,
	 * which rdma_destroy_srq destroys with it. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 10, .max_sge = 1 } };
	CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_create_srq(a, NULL, &sa) == -1 && errno == EINVAL);
	CHECK(rdma_bind_addr(a, (struct sockaddr *)&any) == 0);
	struct ibv_srq_init_attr_ex sx = { .attr = { .max_wr = 4, .max_sge = 1 } };
	CHECK(rdma_create_srq_ex(a, &sx) == -1 && errno == EINVAL);
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	sx.srq_type = IBV_SRQT_TM;
	CHECK(rdma_create_srq_ex(a, &sx) == -1 && errno == EOPNOTSUPP && a->srq == NULL);
	sx.srq_type = IBV_SRQT_XRC;
	uint32_t srqn = 0;
	CHECK(rdma_create_srq_ex(a, &sx) == 0 && a->srq && a->recv_cq && a->recv_cq_channel);
	CHECK(a->srq->pd == a->pd && ibv_get_srq_num(a->srq, &srqn) == 0 && srqn != 0);
	rdma_destroy_srq(a);
	CHECK(a->srq == NULL && a->recv_cq == NULL && a->recv_cq_channel == NULL);
	CHECK(rdma_create_srq(a, NULL, &sa) == 0 && a->srq && sa.attr.max_wr >= 10);
	CHECK(a->srq->pd == a->pd);
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	CHECK(rdma_create_qp(a, NULL, &qa) == 0 && a->qp->srq == a->srq);
	rdma_destroy_qp(a);
	rdma_destroy_srq(a);
	CHECK(a->srq == NULL);
	CHECK(rdma_destroy_id(a) == 0);
	/* Options: the ACK timeout is taken on an RC id (at most 31; a UD id has no ACKs:
	 * EINVAL), TOS is accepted, a wrong size is EINVAL, an unknown option ENOSYS. */
	uint8_t t = 12, big = 32, tos = 0;
	int one = 1;
	CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 1) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &big, 1) == -1 &&
	      errno == EINVAL);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 4) == -1 &&
	      errno == EINVAL);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, 99, &one, sizeof one) == -1 && errno == ENOSYS);
	CHECK(rdma_bind_addr(a, (struct sockaddr *)&any) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 1) == 0);
	CHECK(rdma_destroy_id(a) == 0);
	CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_set_option(a, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 1) == -1 &&
	      errno == EINVAL);
	CHECK(rdma_destroy_id(a) == 0);
	/* Multicast: only a UD id bound to a device joins (EINVAL), an IPv4 multicast
	 * group (IPv6: EOPNOTSUPP, as RoCEv2's CM; a unicast address: EINVAL); a group
	 * not joined cannot be left (EADDRNOTAVAIL). A join raises MULTICAST_JOIN with
	 * the group's address vector, QPN 0xFFFFFF, RDMA_UDP_QKEY and the join's context
	 * as private data (length 0); with no QP on the id nothing is attached. */
	struct sockaddr_in grp = { .sin_family = AF_INET,
				   .sin_addr.s_addr = inet_addr("239.1.2.3") };
	struct sockaddr_in6 grp6 = { .sin6_family = AF_INET6 };
	CHECK(inet_pton(AF_INET6, "ff0e::1", &grp6.sin6_addr) == 1);
	struct sockaddr_in uni = grp;
	uni.sin_addr.s_addr = inet_addr("127.0.0.9");
	CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(a, (struct sockaddr *)&any) == 0);
	CHECK(rdma_join_multicast(a, (struct sockaddr *)&grp, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(a) == 0);
	CHECK(rdma_create_id(ch, &b, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_join_multicast(b, (struct sockaddr *)&grp, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_bind_addr(b, (struct sockaddr *)&any) == 0);
	CHECK(rdma_join_multicast(b, (struct sockaddr *)&grp6, NULL) == -1 &&
	      errno == EOPNOTSUPP);
	CHECK(rdma_join_multicast(b, (struct sockaddr *)&uni, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_leave_multicast(b, (struct sockaddr *)&grp) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_join_multicast(b, (struct sockaddr *)&grp, (void *)0x1234) == 0);
	/* rdma_migrate_id: the id's pending event moves with it to the new channel, whose
	 * fd becomes readable; the old one's does not. */
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	CHECK(ch2 && rdma_migrate_id(b, ch2) == 0 && b->channel == ch2);
	struct pollfd two[2] = { { .fd = ch->fd, .events = POLLIN },
				 { .fd = ch2->fd, .events = POLLIN } };
	CHECK(poll(two, 2, 1000) == 1 && two[1].revents == POLLIN && two[0].revents == 0);
	struct rdma_cm_event *ev = NULL;
	CHECK(rdma_get_cm_event(ch2, &ev) == 0 && ev->id == b);
	CHECK(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0);
	CHECK(ev->param.ud.private_data == (void *)0x1234 && ev->param.ud.private_data_len == 0);
	CHECK(ev->param.ud.qp_num == 0xFFFFFF && ev->param.ud.qkey == RDMA_UDP_QKEY);
	const uint8_t mgid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3 };
	struct ibv_ah_attr *ah = &ev->param.ud.ah_attr;
	CHECK(ah->is_global == 1 && !memcmp(ah->grh.dgid.raw, mgid, 16));
	CHECK(ah->grh.sgid_index == 1 && ah->grh.hop_limit == 64 && ah->dlid == 0);
	CHECK(rdma_ack_cm_event(ev) == 0);
	CHECK(rdma_leave_multicast(b, (struct sockaddr *)&grp) == 0);
	CHECK(rdma_leave_multicast(b, (struct sockaddr *)&grp) == -1 && errno == EADDRNOTAVAIL);
	/* To NULL: the id becomes synchronous, on a channel of its own. */
	CHECK(rdma_migrate_id(b, NULL) == 0 && b->channel && b->channel != ch2 && b->channel != ch);
	CHECK(rdma_destroy_id(b) == 0);
	rdma_destroy_event_channel(ch2);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "strings")) {
		for (int i = -2; i < 18; i++)
			printf("%d %s\n", i, rdma_event_str(i));
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "nic"))
		return nic(argv[2]);
	/* rdma_getaddrinfo: passive gives a source address, active a destination. */
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	CHECK(rdma_getaddrinfo("127.0.0.2", "7174", &hints, &res) == 0);
	struct sockaddr_in *sin = (struct sockaddr_in *)res->ai_src_addr;
	CHECK(res->ai_dst_addr == NULL && sin && sin->sin_family == AF_INET);
	CHECK(ntohs(sin->sin_port) == 7174 && sin->sin_addr.s_addr == inet_addr("127.0.0.2"));
	CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP);
	rdma_freeaddrinfo(res);
	hints.ai_flags = 0;
	hints.ai_port_space = RDMA_PS_UDP;
	CHECK(rdma_getaddrinfo("127.0.0.3", "18515", &hints, &res) == 0);
	sin = (struct sockaddr_in *)res->ai_dst_addr;
	CHECK(res->ai_src_addr == NULL && sin && ntohs(sin->sin_port) == 18515);
	CHECK(res->ai_qp_type == IBV_QPT_UD && res->ai_port_space == RDMA_PS_UDP);
	rdma_freeaddrinfo(res);
	hints.ai_port_space = RDMA_PS_IB;
	CHECK(rdma_getaddrinfo("127.0.0.3", "1", &hints, &res) == 0);
	CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_IB);
	rdma_freeaddrinfo(res);
	hints.ai_qp_type = IBV_QPT_XRC_SEND;
	CHECK(rdma_getaddrinfo("127.0.0.3", "1", &hints, &res) == 0);
	CHECK(res->ai_qp_type == IBV_QPT_XRC_SEND && res->ai_port_space == RDMA_PS_IB);
	rdma_freeaddrinfo(res);
	hints.ai_port_space = RDMA_PS_IPOIB;
	CHECK(rdma_getaddrinfo("127.0.0.3", "1", &hints, &res) == -1 && errno == ENOSYS);
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);
	/* Neither node nor service: one entry made of the hints, as rdma-core answers
	 * (pyverbs asks this way for a multicast group's address as a source). */
	struct sockaddr_in group = { .sin_family = AF_INET };
	group.sin_addr.s_addr = inet_addr("230.0.2.1");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_UDP;
	hints.ai_src_addr = (struct sockaddr *)&group;
	hints.ai_src_len = sizeof group;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0);
	sin = (struct sockaddr_in *)res->ai_src_addr;
	CHECK(res->ai_dst_addr == NULL && res->ai_next == NULL && sin != &group);
	CHECK(res->ai_src_len == sizeof group && sin->sin_addr.s_addr == group.sin_addr.s_addr);
	CHECK(res->ai_port_space == RDMA_PS_UDP);
	rdma_freeaddrinfo(res);
	/* No NIC: no devices, an empty NULL-terminated list. */
	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 0 && devs[0] == NULL);
	rdma_free_devices(devs);
	/* What softnic does not serve answers an errno. */
	/* rsockets: a stream socket needs no NIC until it binds or connects; datagram
	 * rsockets are not served; riomap needs a connected socket. */
	char b1;
	int rs = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rs >= 0);
	CHECK(rrecv(rs, &b1, 1, 0) == -1 && errno == ENOTCONN);
	CHECK(rclose(rs) == 0);
	CHECK(rrecv(rs, &b1, 1, 0) == -1 && errno == EBADF);
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == EOPNOTSUPP);
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == ENOTSUP);
	CHECK(riomap(rs, &b1, 1, PROT_WRITE, 0, 0) == -1 && errno == EBADF);
	CHECK(riowrite(rs, &b1, 1, 0, 0) == (size_t)-1 && errno == EBADF);
	CHECK(riounmap(rs, &b1, 1) == -1 && errno == EBADF);
	rs = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rs >= 0);
	CHECK(riomap(rs, &b1, 1, PROT_WRITE, 0, 0) == -1 && errno == EINVAL);
	CHECK(riowrite(rs, &b1, 1, 0, 0) == (size_t)-1 && errno == ENOTCONN);
	CHECK(rclose(rs) == 0);
	CHECK(rdma_join_multicast(NULL, NULL, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_create_srq(NULL, NULL, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_set_local_ece(NULL, NULL) == -1 && errno == EOPNOTSUPP);
	CHECK(rdma_ack_cm_event(NULL) == -1 && errno == EINVAL);
	CHECK(rdma_get_cm_event(NULL, NULL) == -1 && errno == EINVAL);
	/* rpoll is poll(2) on ordinary descriptors alone. */
	int p[2];
	CHECK(pipe(p) == 0 && write(p[1], "x", 1) == 1);
	struct pollfd pfd = { .fd = p[0], .events = POLLIN };
	CHECK(rpoll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN));
	printf("ok\n");
	return 0;
}
