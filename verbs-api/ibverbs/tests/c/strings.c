/* Prints every value of rdma-core's string helpers, in and out of range; run against
 * rdma-core's libibverbs and against softnic's by tests/strings.rs, which compares. */
#include <stdio.h>
#include <infiniband/verbs.h>

int main(void)
{
	for (int i = -2; i < 40; i++) {
		printf("wc %d %s\n", i, ibv_wc_status_str(i));
		printf("node %d %s\n", i, ibv_node_type_str(i));
		printf("port %d %s\n", i, ibv_port_state_str(i));
		printf("event %d %s\n", i, ibv_event_type_str(i));
	}
	return 0;
}
