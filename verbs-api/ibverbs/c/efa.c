/* Stub libefa.so.1 for softnic: as the stub libmlx5 (mlx5.c), for the EFA_* symbols
 * Debian's perftest and python3-pyverbs import; return types from rdma-core 44's
 * <infiniband/efadv.h>. softnic is no EFA device: every function answers "not
 * supported". */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

/* errno and the return value both say EOPNOTSUPP: some callers read one, some the other. */
static int nosup(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }

/* EFA_1.2: struct efadv_cq *efadv_cq_from_ibv_cq_ex(...) */
void *efadv_cq_from_ibv_cq_ex(void) { errno = EOPNOTSUPP; return NULL; }
/* EFA_1.2: struct ibv_cq_ex *efadv_create_cq(...) */
void *efadv_create_cq(void) { errno = EOPNOTSUPP; return NULL; }
/* EFA_1.0: struct ibv_qp *efadv_create_driver_qp(...) */
void *efadv_create_driver_qp(void) { errno = EOPNOTSUPP; return NULL; }
/* EFA_1.1: struct ibv_qp *efadv_create_qp_ex(...) */
void *efadv_create_qp_ex(void) { errno = EOPNOTSUPP; return NULL; }
/* EFA_1.1: int efadv_query_ah(...) */
int efadv_query_ah(void) { return nosup(); }
/* EFA_1.1: int efadv_query_device(...) */
int efadv_query_device(void) { return nosup(); }
