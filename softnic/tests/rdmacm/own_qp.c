/* A program that creates its QPs itself (ibv_create_qp, not rdma_create_qp) and moves
 * them with rdma_init_qp_attr + ibv_modify_qp, as MPI/UCX/NVMe-oF style programs do,
 * connecting with rdma_connect/rdma_accept and the QPN in conn_param->qp_num.
 *
 *   own_qp server ADDR PORT          own_qp client SERVER_ADDR PORT CLIENT_ADDR
 *
 * Connection 1 (own QPs): the server, on CONNECT_REQUEST, moves its QP to INIT, RTR
 * and RTS before rdma_accept; the client moves its QP to RTR and RTS on
 * CONNECT_RESPONSE and calls rdma_establish. Each mask must be exactly librdmacm's
 * (ib_cm_init_qp_attr); the REP's private data carries the server's RTR/RTS PSNs, QPN
 * and buffer, so the client checks the starting-PSN rule across the two sides
 * (its sq_psn = the server's rq_psn and the other way round). The client SENDs a
 * message, RDMA WRITEs into the server's buffer and SENDs again; the server checks
 * both messages' and the written bytes.
 *
 * Connection 2 (rdma_create_qp on both sides, which the NIC moves): once ESTABLISHED,
 * rdma_init_qp_attr(RTR/RTS) must equal what ibv_query_qp says the NIC applied — the
 * attributes a program moving its own QP gets are the CM's own.
 *
 * Prints "ok" and exits 0, or prints what failed and exits 1. */
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CHECK(c) do { if (!(c)) FAIL("%s:%d: check failed: %s (errno %d)", __FILE__, __LINE__, #c, errno); } while (0)

#define INIT_MASK (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT)
#define RTR_MASK (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | \
                  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)

static const char MSG1[] = "own-qp SEND one";
static const char MSG2[] = "own-qp SEND two";
#define WRITE_OFF 2048
#define WRITE_LEN 1000

/* What the server tells the client in its REP. */
struct rep_info {
	uint32_t rq_psn, sq_psn, qp_num, rkey;
	uint64_t addr;
};

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want)
		FAIL("expected %s, got %s (status %d)", rdma_event_str(want), rdma_event_str(e->event),
		     e->status);
	return e;
}

struct conn {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[8192];
};

static void make_qp(struct conn *c, struct ibv_context *verbs)
{
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	CHECK((c->pd = ibv_alloc_pd(verbs)) != NULL);
	CHECK((c->cq = ibv_create_cq(verbs, 16, NULL, NULL, 0)) != NULL);
	ia.send_cq = ia.recv_cq = c->cq;
	CHECK((c->qp = ibv_create_qp(c->pd, &ia)) != NULL);
	CHECK((c->mr = ibv_reg_mr(c->pd, c->buf, sizeof c->buf,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) != NULL);
}

static void free_qp(struct conn *c)
{
	CHECK(ibv_dereg_mr(c->mr) == 0);
	CHECK(ibv_destroy_qp(c->qp) == 0);
	CHECK(ibv_destroy_cq(c->cq) == 0);
	CHECK(ibv_dealloc_pd(c->pd) == 0);
}

/* rdma_init_qp_attr for `state`, checked against librdmacm's mask, applied. */
static struct ibv_qp_attr move(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state,
			       int want_mask)
{
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0);
	if (mask != want_mask)
		FAIL("rdma_init_qp_attr(%d) mask %#x, librdmacm's is %#x", state, mask, want_mask);
	CHECK(a.qp_state == state);
	if (state == IBV_QPS_RTR) {
		CHECK(a.ah_attr.is_global == 1);
		CHECK(a.ah_attr.port_num == id->port_num);
		CHECK(memcmp(&a.ah_attr.grh.dgid, &id->route.addr.addr.ibaddr.dgid, 16) == 0);
		CHECK(a.path_mtu >= IBV_MTU_256 && a.path_mtu <= IBV_MTU_4096);
	}
	if (state == IBV_QPS_INIT)
		CHECK(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
	return a;
}

/* States that make no sense, and an id with no connection yet: EINVAL. */
static void expect_einval(struct rdma_cm_id *id, enum ibv_qp_state state)
{
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	errno = 0;
	if (rdma_init_qp_attr(id, &a, &mask) != -1 || errno != EINVAL)
		FAIL("rdma_init_qp_attr(%d) with nothing to answer: want -1/EINVAL, errno %d", state,
		     errno);
}

static void post_recv(struct conn *c, int slot)
{
	struct ibv_sge s = {.addr = (uintptr_t)c->buf + 64 * slot, .length = 64, .lkey = c->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &s, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(c->qp, &wr, &bad) == 0);
}

static struct ibv_wc wait_wc(struct conn *c)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000L; i++) {
		int n = ibv_poll_cq(c->cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				FAIL("completion %s (opcode %d)", ibv_wc_status_str(wc.status), wc.opcode);
			return wc;
		}
	}
	FAIL("no completion");
}

/* rdma_init_qp_attr(RTR, RTS) on a connected rdma_create_qp id equals the QP the NIC
 * moved. */
static void same_as_nic(struct rdma_cm_id *id)
{
	struct ibv_qp_attr rtr, rts, q;
	struct ibv_qp_init_attr qi;
	int m1 = 0, m2 = 0;
	memset(&rtr, 0, sizeof rtr);
	memset(&rts, 0, sizeof rts);
	rtr.qp_state = IBV_QPS_RTR;
	rts.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(id, &rtr, &m1) == 0 && m1 == RTR_MASK);
	CHECK(rdma_init_qp_attr(id, &rts, &m2) == 0 && m2 == RTS_MASK);
	CHECK(ibv_query_qp(id->qp, &q, RTR_MASK | RTS_MASK, &qi) == 0);
	CHECK(q.qp_state == IBV_QPS_RTS);
#define SAME(a, f) if (a.f != q.f) FAIL("rdma_init_qp_attr " #f " %u, the NIC applied %u", (unsigned)a.f, (unsigned)q.f)
	SAME(rtr, path_mtu);
	SAME(rtr, dest_qp_num);
	SAME(rtr, rq_psn);
	SAME(rtr, max_dest_rd_atomic);
	SAME(rtr, min_rnr_timer);
	SAME(rts, sq_psn);
	SAME(rts, timeout);
	SAME(rts, retry_cnt);
	SAME(rts, rnr_retry);
	SAME(rts, max_rd_atomic);
	CHECK(memcmp(&rtr.ah_attr.grh.dgid, &q.ah_attr.grh.dgid, 16) == 0);
	CHECK(rtr.ah_attr.grh.sgid_index == q.ah_attr.grh.sgid_index);
}

static struct sockaddr_storage addr_of(const char *host, const char *port)
{
	struct addrinfo *ai, hints = {.ai_flags = AI_NUMERICHOST};
	struct sockaddr_storage s;
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0);
	memcpy(&s, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return s;
}

static struct rdma_conn_param conn_param(uint32_t qp_num)
{
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				    .rnr_retry_count = 7, .qp_num = qp_num};
	return p;
}

/* Connection 2 on `id`: a QP from rdma_create_qp, connected by rdma_accept (server) or
 * rdma_connect, ESTABLISHED, checked against rdma_init_qp_attr — which needs the
 * connection up, so the client SENDs once it has checked, and the server, having
 * checked and received that SEND, disconnects. */
static void cm_qp_connection(struct rdma_event_channel *ch, struct rdma_cm_id *id, int server)
{
	struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	struct rdma_conn_param p = conn_param(0);
	static char done[16] = "checked";
	struct ibv_mr *mr;
	struct ibv_sge sge = {.addr = (uintptr_t)done, .length = sizeof done};
	struct ibv_recv_wr rw = {.sg_list = &sge, .num_sge = 1}, *rbad;
	struct ibv_send_wr sw = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *sbad;
	struct ibv_wc wc;
	int n;

	CHECK(rdma_create_qp(id, NULL, &ia) == 0);
	CHECK((mr = ibv_reg_mr(id->pd, done, sizeof done, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	sge.lkey = mr->lkey;
	if (server) {
		CHECK(ibv_post_recv(id->qp, &rw, &rbad) == 0);
		CHECK(rdma_accept(id, &p) == 0);
	} else {
		CHECK(rdma_connect(id, &p) == 0);
	}
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	same_as_nic(id);
	if (!server)
		CHECK(ibv_post_send(id->qp, &sw, &sbad) == 0);
	struct ibv_cq *cq = server ? id->recv_cq : id->send_cq;
	long spins = 0;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && ++spins < 200000000L)
		;
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(mr) == 0);
}

static void disconnect(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	CHECK(rdma_disconnect(id) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
}

static void server(const char *host, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen, *id;
	struct rdma_cm_event *e;
	struct sockaddr_storage sa = addr_of(host, port);
	struct conn c;
	struct rep_info info;
	struct rdma_conn_param p;
	uint32_t peer_qpn;

	CHECK(ch != NULL);
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&sa) == 0);
	CHECK(rdma_listen(listen, 4) == 0);
	expect_einval(listen, IBV_QPS_RTR); /* no connection */
	expect_einval(listen, IBV_QPS_RTS);

	/* Connection 1: our own QP, moved to RTS before the accept. */
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = e->id;
	peer_qpn = e->param.conn.qp_num;
	rdma_ack_cm_event(e);
	make_qp(&c, id->verbs);
	move(id, c.qp, IBV_QPS_INIT, INIT_MASK);
	post_recv(&c, 0);
	post_recv(&c, 1);
	struct ibv_qp_attr rtr = move(id, c.qp, IBV_QPS_RTR, RTR_MASK);
	CHECK(rtr.dest_qp_num == peer_qpn);
	struct ibv_qp_attr rts = move(id, c.qp, IBV_QPS_RTS, RTS_MASK);
	expect_einval(id, IBV_QPS_SQD);
	expect_einval(id, IBV_QPS_ERR);
	info = (struct rep_info){.rq_psn = rtr.rq_psn, .sq_psn = rts.sq_psn, .qp_num = c.qp->qp_num,
				 .rkey = c.mr->rkey, .addr = (uintptr_t)c.buf + WRITE_OFF};
	p = conn_param(c.qp->qp_num);
	p.private_data = &info;
	p.private_data_len = sizeof info;
	CHECK(rdma_accept(id, &p) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	struct ibv_wc wc = wait_wc(&c);
	CHECK(wc.opcode == IBV_WC_RECV && wc.wr_id == 0 && wc.byte_len == sizeof MSG1);
	CHECK(memcmp(c.buf, MSG1, sizeof MSG1) == 0);
	wc = wait_wc(&c);
	CHECK(wc.opcode == IBV_WC_RECV && wc.wr_id == 1 && wc.byte_len == sizeof MSG2);
	CHECK(memcmp(c.buf + 64, MSG2, sizeof MSG2) == 0);
	for (int i = 0; i < WRITE_LEN; i++)
		if ((unsigned char)c.buf[WRITE_OFF + i] != (unsigned char)(i * 7 + 3))
			FAIL("RDMA WRITE byte %d is %#x", i, (unsigned char)c.buf[WRITE_OFF + i]);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	CHECK(rdma_destroy_id(id) == 0);
	free_qp(&c);

	/* Connection 2: rdma_create_qp; the NIC moves the QP. */
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = e->id;
	rdma_ack_cm_event(e);
	cm_qp_connection(ch, id, 1);
	disconnect(ch, id);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(listen) == 0);
	rdma_destroy_event_channel(ch);
}

static struct rdma_cm_id *resolve(struct rdma_event_channel *ch, const char *srv, const char *port,
				  const char *me)
{
	struct rdma_cm_id *id;
	struct sockaddr_storage dst = addr_of(srv, port), src = addr_of(me, "0");
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	return id;
}

static void client(const char *srv, const char *port, const char *me)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_event *e;
	struct conn c;
	struct rep_info info;
	struct rdma_conn_param p;
	CHECK(ch != NULL);

	/* Connection 1: our own QP, moved on CONNECT_RESPONSE. */
	struct rdma_cm_id *id = resolve(ch, srv, port, me);
	expect_einval(id, IBV_QPS_RTR); /* no REP yet */
	make_qp(&c, id->verbs);
	move(id, c.qp, IBV_QPS_INIT, INIT_MASK);
	p = conn_param(c.qp->qp_num);
	CHECK(rdma_connect(id, &p) == 0);
	e = expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(e->param.conn.private_data_len >= sizeof info);
	memcpy(&info, e->param.conn.private_data, sizeof info);
	CHECK(e->param.conn.qp_num == info.qp_num);
	rdma_ack_cm_event(e);
	struct ibv_qp_attr rtr = move(id, c.qp, IBV_QPS_RTR, RTR_MASK);
	struct ibv_qp_attr rts = move(id, c.qp, IBV_QPS_RTS, RTS_MASK);
	CHECK(rdma_establish(id) == 0);
	if (rtr.dest_qp_num != info.qp_num)
		FAIL("RTR dest_qp_num %#x, the server's QP is %#x", rtr.dest_qp_num, info.qp_num);
	if (rts.sq_psn != info.rq_psn || rtr.rq_psn != info.sq_psn)
		FAIL("PSNs: ours sq %u rq %u, the server's rq %u sq %u", rts.sq_psn, rtr.rq_psn,
		     info.rq_psn, info.sq_psn);

	memcpy(c.buf, MSG1, sizeof MSG1);
	memcpy(c.buf + 64, MSG2, sizeof MSG2);
	for (int i = 0; i < WRITE_LEN; i++)
		c.buf[WRITE_OFF + i] = (char)(i * 7 + 3);
	struct ibv_sge s1 = {.addr = (uintptr_t)c.buf, .length = sizeof MSG1, .lkey = c.mr->lkey};
	struct ibv_sge sw = {.addr = (uintptr_t)c.buf + WRITE_OFF, .length = WRITE_LEN,
			     .lkey = c.mr->lkey};
	struct ibv_sge s2 = {.addr = (uintptr_t)c.buf + 64, .length = sizeof MSG2, .lkey = c.mr->lkey};
	struct ibv_send_wr w2 = {.wr_id = 3, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr ww = {.wr_id = 2, .next = &w2, .sg_list = &sw, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr w1 = {.wr_id = 1, .next = &ww, .sg_list = &s1, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	ww.wr.rdma.remote_addr = info.addr;
	ww.wr.rdma.rkey = info.rkey;
	CHECK(ibv_post_send(c.qp, &w1, &bad) == 0);
	for (uint64_t want = 1; want <= 3; want++)
		CHECK(wait_wc(&c).wr_id == want);
	disconnect(ch, id);
	CHECK(rdma_destroy_id(id) == 0);
	free_qp(&c);

	/* Connection 2: rdma_create_qp. */
	id = resolve(ch, srv, port, me);
	cm_qp_connection(ch, id, 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		server(argv[2], argv[3]);
	else if (argc == 5 && strcmp(argv[1], "client") == 0)
		client(argv[2], argv[3], argv[4]);
	else
		FAIL("usage: own_qp server ADDR PORT | own_qp client SERVER_ADDR PORT CLIENT_ADDR");
	printf("ok\n");
	return 0;
}
