/* ABI probe for softnic's libibverbs.so.1, compiled against Debian's
 * <infiniband/verbs.h> and run by softnic/tests/ibverbs_stock.rs through
 * `softnic exec`. It prints one "key value" line per fact; the Rust test checks them.
 * Canary bytes after every caller buffer show that no verb writes past the size the
 * caller declared. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

#define CANARY 0x5a

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
	printf("device_ex_canary %d zero_tail %d same_vendor %d\n",
	       canary_ok(exbuf, sizeof(*dax), sizeof(exbuf)),
	       dax->comp_mask == 0 && dax->odp_caps.general_caps == 0 &&
		       dax->phys_port_cnt_ex == 0,
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
	printf("gid_ex_bad_index %d\n", ibv_query_gid_ex(ctx, 1, 7, &ge, 0));
	struct ibv_gid_entry tbl[4];
	printf("gid_table %zd\n", ibv_query_gid_table(ctx, tbl, 4, 0));
	printf("gid_table_small %zd\n", ibv_query_gid_table(ctx, tbl, 1, 0));
	__be16 pkey = 0;
	rc = ibv_query_pkey(ctx, 1, 0, &pkey);
	printf("pkey rc %d 0x%04x pkey1 %d\n", rc, be16toh(pkey), ibv_query_pkey(ctx, 1, 1, &pkey));
	printf("fork %d init %d\n", ibv_is_fork_initialized(), ibv_fork_init());

	/* Verbs not implemented yet answer EOPNOTSUPP, never success. */
	errno = 0;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	printf("alloc_pd %s errno %d\n", pd ? "ptr" : "null", errno);
	errno = 0;
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	printf("create_cq %s errno %d\n", cq ? "ptr" : "null", errno);
	errno = 0;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	printf("create_comp_channel %s errno %d\n", ch ? "ptr" : "null", errno);
	errno = 0;
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 16 };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cq_attr);
	printf("create_cq_ex %s errno %d\n", cqx ? "ptr" : "null", errno);
	errno = 0;
	struct ibv_mw *mw = ibv_alloc_mw((struct ibv_pd *)&(struct ibv_pd){ .context = ctx },
					 IBV_MW_TYPE_1);
	printf("alloc_mw %s errno %d\n", mw ? "ptr" : "null", errno);
	printf("EOPNOTSUPP %d\n", EOPNOTSUPP);
	printf("close %d\n", ibv_close_device(ctx));
	return 0;
}
