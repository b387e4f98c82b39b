/* ABI probe for softnic's libibverbs.so.1, compiled against Debian's
 * <infiniband/verbs.h> and run by softnic/tests/ibverbs_stock.rs through
 * `softnic exec`. It prints one "key value" line per fact; the Rust test checks them.
 * Canary bytes after every caller buffer show that no verb writes past the size the
 * caller declared. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

#define CANARY 0x5a

/* IBVERBS_PRIVATE_34 (rdma-core's driver.h, not installed): ibv_devinfo imports it. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       int *type);

static int canary_ok(const unsigned char *p, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		if (p[i] != CANARY)
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) {
		printf("list_error %d\n", errno);
		return 1;
	}
	printf("num_devices %d\n", n);
	for (int i = 0; i < n; i++)
		printf("device %s index %d guid %016llx\n", ibv_get_device_name(list[i]),
		       ibv_get_device_index(list[i]),
		       (unsigned long long)be64toh(ibv_get_device_guid(list[i])));
	if (list[n] != NULL)
		printf("list_not_null_terminated\n");
	if (n < 1 || argc < 2) {
		ibv_free_device_list(list);
		return 0;
	}
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	if (!dev) {
		printf("no_device %s\n", argv[1]);
		return 1;
	}
	printf("node_type %d transport %d\n", dev->node_type, dev->transport_type);
	struct ibv_context *ctx = ibv_open_device(dev);
	ibv_free_device_list(list); /* the device must outlive the list */
	if (!ctx) {
		printf("open_error %d\n", errno);
		return 1;
	}
	printf("num_comp_vectors %d\n", ctx->num_comp_vectors);
	printf("async_fd_valid %d\n", ctx->async_fd >= 0);
	printf("extended %d\n", verbs_get_ctx(ctx) != NULL);

	struct ibv_device_attr da;
	printf("query_device %d\n", ibv_query_device(ctx, &da));
	printf("vendor_id 0x%x part %u ports %u max_qp %d atomic %d\n", da.vendor_id,
	       da.vendor_part_id, da.phys_port_cnt, da.max_qp, da.atomic_cap);

	/* ibv_query_device_ex at the caller's size, with canaries behind it. */
	unsigned char exbuf[sizeof(struct ibv_device_attr_ex) + 64];
	memset(exbuf, CANARY, sizeof(exbuf));
	struct ibv_device_attr_ex *dax = (void *)exbuf;
	printf("query_device_ex %d\n", ibv_query_device_ex(ctx, NULL, dax));
	printf("device_ex_canary %d odp %d clock %d zero_tail %d same_vendor %d\n",
	       canary_ok(exbuf, sizeof(*dax), sizeof(exbuf)),
	       dax->odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) &&
		       !(dax->odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC),
	       dax->completion_timestamp_mask == UINT64_MAX && dax->hca_core_clock == 1000000,
	       dax->comp_mask == 0 && dax->device_cap_flags_ex == 0 &&
		       dax->tso_caps.max_tso == 0 && dax->pci_atomic_caps.fetch_add == 0 &&
		       dax->xrc_odp_caps == (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE |
					      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_SRQ_RECV) &&
		       dax->phys_port_cnt_ex == 1,
	       dax->orig_attr.vendor_id == da.vendor_id);
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	printf("query_device_ex_bad_input %d\n", ibv_query_device_ex(ctx, &in, dax));

	/* ibv_query_port through the inline wrapper (the query_port op, full size). */
	unsigned char pbuf[sizeof(struct ibv_port_attr) + 16];
	memset(pbuf, CANARY, sizeof(pbuf));
	struct ibv_port_attr *pa = (void *)pbuf;
	printf("query_port %d\n", ibv_query_port(ctx, 1, pa));
	printf("port state %d link_layer %d active_mtu %d gid_tbl_len %d pkey_tbl_len %d lid %d "
	       "canary %d\n",
	       pa->state, pa->link_layer, pa->active_mtu, pa->gid_tbl_len, pa->pkey_tbl_len,
	       pa->lid, canary_ok(pbuf, sizeof(*pa), sizeof(pbuf)));
	printf("query_port_2 %d\n", ibv_query_port(ctx, 2, pa));

	/* The exported ibv_query_port@IBVERBS_1.1 writes only the 48-byte compat struct. */
	memset(pbuf, CANARY, sizeof(pbuf));
	int rc = (ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)pbuf);
	printf("compat_query_port %d state %d link_layer %d written_48 %d canary_after_48 %d\n",
	       rc, pa->state, pa->link_layer, !canary_ok(pbuf, 40, 48),
	       canary_ok(pbuf, 48, sizeof(pbuf)));

	/* The op itself honours a smaller caller size. */
	memset(pbuf, CANARY, sizeof(pbuf));
	rc = verbs_get_ctx(ctx)->query_port(ctx, 1, pa, 8);
	printf("op_query_port_8 %d canary_after_8 %d\n", rc, canary_ok(pbuf, 8, sizeof(pbuf)));

	for (int i = 0; i < 3; i++) {
		union ibv_gid g;
		char s[64];
		memset(&g, 0, sizeof(g));
		rc = ibv_query_gid(ctx, 1, i, &g);
		inet_ntop(AF_INET6, &g, s, sizeof(s));
		printf("gid %d rc %d %s\n", i, rc, rc ? "-" : s);
	}
	struct ibv_gid_entry ge;
	rc = ibv_query_gid_ex(ctx, 1, 1, &ge, 0);
	printf("gid_ex rc %d index %u port %u type %u\n", rc, ge.gid_index, ge.port_num,
	       ge.gid_type);
	/* 7 is an empty entry (ENODATA, as rxe); 1024 is past gid_tbl_len (EINVAL). */
	printf("gid_ex_empty_index %d\n", ibv_query_gid_ex(ctx, 1, 7, &ge, 0));
	printf("gid_ex_bad_index %d\n", ibv_query_gid_ex(ctx, 1, 1024, &ge, 0));
	int gt = -1;
	rc = ibv_query_gid_type(ctx, 1, 7, &gt);
	printf("gid_type_empty %d type %d\n", rc, gt);
	struct ibv_gid_entry tbl[4];
	printf("gid_table %zd\n", ibv_query_gid_table(ctx, tbl, 4, 0));
	printf("gid_table_small %zd\n", ibv_query_gid_table(ctx, tbl, 1, 0));
	__be16 pkey = 0;
	rc = ibv_query_pkey(ctx, 1, 0, &pkey);
	printf("pkey rc %d 0x%04x pkey1 %d\n", rc, be16toh(pkey), ibv_query_pkey(ctx, 1, 1, &pkey));
	printf("fork %d init %d\n", ibv_is_fork_initialized(), ibv_fork_init());

	/* Objects: PD, CQ on a completion channel, MRs by in-place remap. */
	errno = 0;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	printf("alloc_pd %s\n", pd ? "ok" : "null");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	printf("create_comp_channel %s fd_valid %d\n", ch ? "ok" : "null", ch && ch->fd >= 0);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	printf("create_cq %s cqe_ge_16 %d\n", cq ? "ok" : "null", cq && cq->cqe >= 16);
	printf("channel_busy %d\n", ibv_destroy_comp_channel(ch));
	struct ibv_wc wc[4];
	rc = ibv_poll_cq(cq, 4, wc);
	printf("poll_empty %d\n", rc);
	printf("notify %d\n", ibv_req_notify_cq(cq, 0));
	fcntl(ch->fd, F_SETFL, O_NONBLOCK);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	printf("cq_event_nonblocking %d errno %d\n", rc, errno);

	long page = sysconf(_SC_PAGESIZE);
	/* Two pages: the buffer is page 0 plus 100 bytes of page 1; the rest of page 1 is
	 * a "neighbour" that must keep its bytes through the remap. */
	unsigned char *buf = memalign(page, 2 * page);
	for (long i = 0; i < 2 * page; i++)
		buf[i] = (unsigned char)(i * 7 + 3);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, page + 100, IBV_ACCESS_LOCAL_WRITE);
	int same = 1;
	for (long i = 0; i < 2 * page; i++)
		same &= buf[i] == (unsigned char)(i * 7 + 3);
	printf("reg_mr %s addr_ok %d len %zu bytes_kept %d\n", mr ? "ok" : "null",
	       mr && mr->addr == buf, mr ? mr->length : 0, same);
	buf[page + 200] = 0xee; /* the neighbour stays writable */
	printf("neighbour_write %d\n", buf[page + 200] == 0xee);
	errno = 0;
	/* On the registered pages (shared with the live MR), and not page-aligned. */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf + page, 64, IBV_ACCESS_LOCAL_WRITE);
	printf("reg_overlap %s errno %d\n", mr2 ? "ok" : "null", mr2 ? 0 : errno);
	printf("dereg_overlap %d\n", mr2 ? ibv_dereg_mr(mr2) : -1);
	errno = 0;
	mr2 = ibv_reg_mr(pd, buf + 8, 64, IBV_ACCESS_LOCAL_WRITE);
	printf("reg_unaligned %s errno %d\n", mr2 ? "ok" : "null", mr2 ? 0 : errno);
	printf("dereg_unaligned %d\n", mr2 ? ibv_dereg_mr(mr2) : -1);
	errno = 0;
	mr2 = ibv_reg_mr(pd, buf, 64, 1 << 15);
	printf("reg_bad_access %s errno %d\n", mr2 ? "ok" : "null", errno);
	printf("dealloc_pd_busy %d\n", ibv_dealloc_pd(pd));
	printf("dereg %d\n", ibv_dereg_mr(mr));
	mr = ibv_reg_mr(pd, buf, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	printf("rereg %s byte0_kept %d\n", mr ? "ok" : "null", buf[0] == 3);
	if (!mr)
		return 1;
	/* fork: the registered pages are MADV_DONTFORK, so a child cannot write into the
	 * parent's MR (it faults); the parent's bytes stay. */
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		buf[1] = 0x99;
		_exit(0);
	}
	int wstatus = 0;
	waitpid(child, &wstatus, 0);
	printf("fork_child_segv %d parent_byte1_kept %d\n",
	       WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGSEGV, buf[1] == (unsigned char)10);
	/* ibv_rereg_mr: new rights keep the keys; access without its flag is an input
	 * error; a new translation moves the MR onto other memory (new keys). */
	uint32_t lkey0 = mr->lkey, rkey0 = mr->rkey;
	rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	printf("rereg_access %d keys_kept %d\n", rc, mr->lkey == lkey0 && mr->rkey == rkey0);
	errno = 0;
	rc = ibv_rereg_mr(mr, 0, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	printf("rereg_access_unflagged %d errno %d\n", rc, errno);
	unsigned char *moved = memalign(page, page);
	moved[0] = 0x5a;
	rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, pd, moved, page, 0);
	printf("rereg_translation %d moved %d len %d byte0_kept %d\n", rc, mr->addr == moved,
	       mr->length == (size_t)page, moved[0] == 0x5a);

	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	printf("create_ud_qp %s\n", qp ? "ok" : "null");
	if (qp)
		printf("destroy_ud_qp %d\n", ibv_destroy_qp(qp));
	struct ibv_ah_attr aha = { .is_global = 0, .port_num = 1 };
	errno = 0;
	struct ibv_ah *ah = ibv_create_ah(pd, &aha);
	printf("create_ah_lid_only %s errno %d\n", ah ? "ok" : "null", errno);
	aha.is_global = 1;
	aha.grh.sgid_index = 1;
	ah = ibv_create_ah(pd, &aha);
	printf("create_ah %s\n", ah ? "ok" : "null");
	printf("destroy_ah %d\n", ah ? ibv_destroy_ah(ah) : -1);
	qia.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &qia);
	printf("create_rc_qp %s state %d cap_send_ge_4 %d\n", qp ? "ok" : "null",
	       qp ? (int)qp->state : -1, qia.cap.max_send_wr >= 4);
	printf("destroy_cq_busy %d\n", ibv_destroy_cq(cq));
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	rc = ibv_modify_qp(qp, &qa,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	printf("modify_init %d state %d\n", rc, (int)qp->state);
	qa.qp_state = IBV_QPS_RTS;
	printf("modify_init_to_rts %d\n", ibv_modify_qp(qp, &qa, IBV_QP_STATE));
	printf("modify_alt_path %d\n", ibv_modify_qp(qp, &qa, IBV_QP_ALT_PATH));
	struct ibv_qp_init_attr qia2;
	memset(&qa, 0, sizeof(qa));
	rc = ibv_query_qp(qp, &qa, IBV_QP_STATE, &qia2);
	printf("query_qp %d state %d port %d send_cq_ok %d\n", rc, (int)qa.qp_state, qa.port_num,
	       qia2.send_cq == cq);
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = NULL, .num_sge = 0 }, *bad_r = NULL;
	printf("post_recv %d\n", ibv_post_recv(qp, &rwr, &bad_r));
	/* The QP is still in INIT (RTS from INIT is illegal): a send is EINVAL, as on rxe.
	 * (A bad lkey is no post error: it completes with IBV_WC_LOC_PROT_ERR.) */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad_s = NULL;
	rc = ibv_post_send(qp, &swr, &bad_s);
	printf("post_send_in_init %d bad_is_wr %d\n", rc, bad_s == &swr);
	printf("qp_ex %s\n", ibv_qp_to_qp_ex(qp) ? "ptr" : "null");
	printf("destroy_qp %d\n", ibv_destroy_qp(qp));
	printf("destroy_cq %d\n", ibv_destroy_cq(cq));
	printf("dereg %d\n", ibv_dereg_mr(mr));
	printf("destroy_channel %d\n", ibv_destroy_comp_channel(ch));
	printf("dealloc_pd %d\n", ibv_dealloc_pd(pd));

	/* Verbs not implemented yet answer EOPNOTSUPP, never success. */
	errno = 0;
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_CVLAN };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cq_attr);
	printf("create_cq_ex_cvlan %s errno %d\n", cqx ? "ptr" : "null", errno);
	cq_attr.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	cqx = ibv_create_cq_ex(ctx, &cq_attr);
	printf("create_cq_ex_timestamp %s\n", cqx ? "ok" : "null");
	if (cqx)
		ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
	cq_attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	cqx = ibv_create_cq_ex(ctx, &cq_attr);
	struct ibv_poll_cq_attr pca = { 0 };
	printf("create_cq_ex %s\n", cqx ? "ok" : "null");
	if (cqx) {
		printf("cq_ex_empty %d\n", ibv_start_poll(cqx, &pca));
		printf("destroy_cq_ex %d\n", ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)));
	}
	/* Device memory: bounded allocations, 4-byte-aligned copies inside them, regions
	 * only zero-based, and an allocation with a region on it is busy. */
	struct ibv_alloc_dm_attr dma = { .length = 1000 };
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &dma);
	struct ibv_alloc_dm_attr big = { .length = 1 << 30 };
	errno = 0;
	struct ibv_dm *too_big = ibv_alloc_dm(ctx, &big);
	printf("alloc_dm %s too_big %s errno %d\n", dm ? "ptr" : "null",
	       too_big ? "ptr" : "null", errno);
	if (dm) {
		unsigned char in[16], out[16];
		memset(in, 0x5A, sizeof in);
		memset(out, 0, sizeof out);
		int to = ibv_memcpy_to_dm(dm, 992, in, 8);
		int from = ibv_memcpy_from_dm(out, dm, 992, 8);
		int unaligned = ibv_memcpy_to_dm(dm, 2, in, 8);
		int past_end = ibv_memcpy_to_dm(dm, 996, in, 8);
		printf("dm_copy %d %d same %d unaligned %d past_end %d\n", to, from,
		       !memcmp(in, out, 8), unaligned, past_end);
		struct ibv_pd *dpd = ibv_alloc_pd(ctx);
		errno = 0;
		struct ibv_mr *not_zero = ibv_reg_dm_mr(dpd, dm, 0, 64, IBV_ACCESS_LOCAL_WRITE);
		printf("reg_dm_mr_not_zero_based %s errno %d\n", not_zero ? "ptr" : "null", errno);
		struct ibv_mr *dmr = ibv_reg_dm_mr(dpd, dm, 64, 512,
						   IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
		int busy = ibv_free_dm(dm);
		printf("reg_dm_mr %s addr_null %d free_busy %d\n", dmr ? "ptr" : "null",
		       dmr && !dmr->addr, busy);
		int dereg = dmr ? ibv_dereg_mr(dmr) : -1;
		printf("dm_dereg %d free %d\n", dereg, ibv_free_dm(dm));
		ibv_dealloc_pd(dpd);
	}
	/* Memory windows: types 1 and 2 exist, type 3 is EINVAL; a PD with a window is busy. */
	struct ibv_pd *mpd = ibv_alloc_pd(ctx);
	struct ibv_mw *mw = ibv_alloc_mw(mpd, IBV_MW_TYPE_1);
	printf("alloc_mw %s type %d rkey_set %d\n", mw ? "ptr" : "null", mw ? (int)mw->type : -1,
	       mw && mw->rkey != 0);
	errno = 0;
	struct ibv_mw *mw3 = ibv_alloc_mw(mpd, (enum ibv_mw_type)3);
	printf("alloc_mw_type3 %s errno %d\n", mw3 ? "ptr" : "null", errno);
	printf("dealloc_pd_with_mw %d\n", ibv_dealloc_pd(mpd));
	rc = mw ? ibv_dealloc_mw(mw) : -1;
	printf("dealloc_mw %d dealloc_pd %d\n", rc, ibv_dealloc_pd(mpd));
	printf("EOPNOTSUPP %d\n", EOPNOTSUPP);
	printf("close %d\n", ibv_close_device(ctx));
	return 0;
}
