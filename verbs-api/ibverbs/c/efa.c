/* Stub libefa.so.1 for softnic: perftest links libefa and calls these only for EFA
 * devices; each answers "not supported" as rdma-core does. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

void *efadv_create_qp_ex(void *context, void *attr_ex, void *efa_attr, uint32_t inlen)
{ (void)context; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }

int efadv_query_device(void *context, void *attr, uint32_t inlen)
{ (void)context; (void)attr; (void)inlen; return EOPNOTSUPP; }
