/* Stub libmlx5.so.1 for softnic: perftest links libmlx5 and imports these, but calls
 * them only for Mellanox devices (vendor_part_id it knows). softnic is not one, so
 * each answers "not supported" as rdma-core does: NULL with errno = EOPNOTSUPP, or
 * EOPNOTSUPP returned. No rdma-core header is needed: only pointers are passed. */
#include <errno.h>
#include <stddef.h>

void *mlx5dv_create_qp(void *context, void *qp_attr, void *mlx5_qp_attr)
{ (void)context; (void)qp_attr; (void)mlx5_qp_attr; errno = EOPNOTSUPP; return NULL; }

int mlx5dv_devx_general_cmd(void *context, const void *in, size_t inlen, void *out, size_t outlen)
{ (void)context; (void)in; (void)inlen; (void)out; (void)outlen; return EOPNOTSUPP; }

void *mlx5dv_open_device(void *device, void *attr)
{ (void)device; (void)attr; errno = EOPNOTSUPP; return NULL; }

void *mlx5dv_create_mkey(void *mkey_init_attr)
{ (void)mkey_init_attr; errno = EOPNOTSUPP; return NULL; }

int mlx5dv_destroy_mkey(void *mkey)
{ (void)mkey; return EOPNOTSUPP; }

void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp)
{ (void)qp; errno = EOPNOTSUPP; return NULL; }

int mlx5dv_crypto_login(void *context, void *login_attr)
{ (void)context; (void)login_attr; return EOPNOTSUPP; }

void *mlx5dv_dek_create(void *context, void *init_attr)
{ (void)context; (void)init_attr; errno = EOPNOTSUPP; return NULL; }

int mlx5dv_dek_destroy(void *dek)
{ (void)dek; return EOPNOTSUPP; }
