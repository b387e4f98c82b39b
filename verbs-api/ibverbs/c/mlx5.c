/* Stub libmlx5.so.1 for softnic. Debian's perftest and python3-pyverbs link libmlx5 and
 * are BIND_NOW, so every function they import must exist for them to load; they call
 * them only for Mellanox devices, and softnic is not one (`mlx5dv_is_supported` is
 * false). Each function ignores its arguments and answers "not supported" as rdma-core
 * does: a pointer-returning one NULL with errno = EOPNOTSUPP, an int-returning one
 * EOPNOTSUPP (and errno), an fd-returning one -1 with errno. The list is every MLX5_*
 * symbol the two packages import; the return types are those of rdma-core 44's
 * <infiniband/mlx5dv.h>. No rdma-core header is included: no argument is read, and
 * under the x86-64/aarch64 calling conventions a caller passing arguments to a
 * function declared (void) is harmless. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

/* errno and the return value both say EOPNOTSUPP: some callers read one, some the other. */
static int nosup(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }

/* MLX5_1.20: int _mlx5dv_mkey_check(...) */
int _mlx5dv_mkey_check(void) { return nosup(); }
/* MLX5_1.19: int _mlx5dv_query_port(...) */
int _mlx5dv_query_port(void) { return nosup(); }
/* MLX5_1.12: struct mlx5dv_var *mlx5dv_alloc_var(...) */
void *mlx5dv_alloc_var(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.1: struct ibv_cq_ex *mlx5dv_create_cq(...) */
void *mlx5dv_create_cq(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.6: struct ibv_flow *mlx5dv_create_flow(...) */
void *mlx5dv_create_flow(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.7: struct ibv_flow_action *mlx5dv_create_flow_action_packet_reformat(...) */
void *mlx5dv_create_flow_action_packet_reformat(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.6: struct mlx5dv_flow_matcher *mlx5dv_create_flow_matcher(...) */
void *mlx5dv_create_flow_matcher(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_mkey *mlx5dv_create_mkey(...) */
void *mlx5dv_create_mkey(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.3: struct ibv_qp *mlx5dv_create_qp(...) */
void *mlx5dv_create_qp(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.21: int mlx5dv_crypto_login(...) */
int mlx5dv_crypto_login(void) { return nosup(); }
/* MLX5_1.24: struct mlx5dv_crypto_login_obj *mlx5dv_crypto_login_create(...) */
void *mlx5dv_crypto_login_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.24: int mlx5dv_crypto_login_destroy(...) */
int mlx5dv_crypto_login_destroy(void) { return nosup(); }
/* MLX5_1.24: int mlx5dv_crypto_login_query(...) */
int mlx5dv_crypto_login_query(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_crypto_login_query_state(...) */
int mlx5dv_crypto_login_query_state(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_crypto_logout(...) */
int mlx5dv_crypto_logout(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_dci_stream_id_reset(...) */
int mlx5dv_dci_stream_id_reset(void) { return nosup(); }
/* MLX5_1.21: struct mlx5dv_dek *mlx5dv_dek_create(...) */
void *mlx5dv_dek_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.21: int mlx5dv_dek_destroy(...) */
int mlx5dv_dek_destroy(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_dek_query(...) */
int mlx5dv_dek_query(void) { return nosup(); }
/* MLX5_1.6: int mlx5dv_destroy_flow_matcher(...) */
int mlx5dv_destroy_flow_matcher(void) { return nosup(); }
/* MLX5_1.10: int mlx5dv_destroy_mkey(...) */
int mlx5dv_destroy_mkey(void) { return nosup(); }
/* MLX5_1.23: struct mlx5dv_devx_msi_vector *mlx5dv_devx_alloc_msi_vector(...) */
void *mlx5dv_devx_alloc_msi_vector(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.7: struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(...) */
void *mlx5dv_devx_alloc_uar(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.23: struct mlx5dv_devx_eq *mlx5dv_devx_create_eq(...) */
void *mlx5dv_devx_create_eq(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.23: int mlx5dv_devx_destroy_eq(...) */
int mlx5dv_devx_destroy_eq(void) { return nosup(); }
/* MLX5_1.23: int mlx5dv_devx_free_msi_vector(...) */
int mlx5dv_devx_free_msi_vector(void) { return nosup(); }
/* MLX5_1.7: void mlx5dv_devx_free_uar(...) */
void mlx5dv_devx_free_uar(void) { }
/* MLX5_1.7: int mlx5dv_devx_general_cmd(...) */
int mlx5dv_devx_general_cmd(void) { return nosup(); }
/* MLX5_1.7: struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(...) */
void *mlx5dv_devx_obj_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.7: int mlx5dv_devx_obj_destroy(...) */
int mlx5dv_devx_obj_destroy(void) { return nosup(); }
/* MLX5_1.7: int mlx5dv_devx_obj_modify(...) */
int mlx5dv_devx_obj_modify(void) { return nosup(); }
/* MLX5_1.7: int mlx5dv_devx_obj_query(...) */
int mlx5dv_devx_obj_query(void) { return nosup(); }
/* MLX5_1.7: int mlx5dv_devx_query_eqn(...) */
int mlx5dv_devx_query_eqn(void) { return nosup(); }
/* MLX5_1.7: int mlx5dv_devx_umem_dereg(...) */
int mlx5dv_devx_umem_dereg(void) { return nosup(); }
/* MLX5_1.7: struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(...) */
void *mlx5dv_devx_umem_reg(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.19: struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(...) */
void *mlx5dv_devx_umem_reg_ex(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.19: void *mlx5dv_dm_map_op_addr(...) */
void *mlx5dv_dm_map_op_addr(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.14: struct mlx5dv_dr_action *mlx5dv_dr_action_create_default_miss(...) */
void *mlx5dv_dr_action_create_default_miss(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.16: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_array(...) */
void *mlx5dv_dr_action_create_dest_array(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.15: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_devx_tir(...) */
void *mlx5dv_dr_action_create_dest_devx_tir(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.21: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_ib_port(...) */
void *mlx5dv_dr_action_create_dest_ib_port(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_ibv_qp(...) */
void *mlx5dv_dr_action_create_dest_ibv_qp(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_table(...) */
void *mlx5dv_dr_action_create_dest_table(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_dest_vport(...) */
void *mlx5dv_dr_action_create_dest_vport(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_drop(...) */
void *mlx5dv_dr_action_create_drop(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_flow_counter(...) */
void *mlx5dv_dr_action_create_flow_counter(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.16: struct mlx5dv_dr_action *mlx5dv_dr_action_create_flow_sampler(...) */
void *mlx5dv_dr_action_create_flow_sampler(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_modify_header(...) */
void *mlx5dv_dr_action_create_modify_header(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_packet_reformat(...) */
void *mlx5dv_dr_action_create_packet_reformat(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.17: struct mlx5dv_dr_action *mlx5dv_dr_action_create_pop_vlan(...) */
void *mlx5dv_dr_action_create_pop_vlan(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.17: struct mlx5dv_dr_action *mlx5dv_dr_action_create_push_vlan(...) */
void *mlx5dv_dr_action_create_push_vlan(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: struct mlx5dv_dr_action *mlx5dv_dr_action_create_tag(...) */
void *mlx5dv_dr_action_create_tag(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: int mlx5dv_dr_action_destroy(...) */
int mlx5dv_dr_action_destroy(void) { return nosup(); }
/* MLX5_1.20: void mlx5dv_dr_domain_allow_duplicate_rules(...) */
void mlx5dv_dr_domain_allow_duplicate_rules(void) { }
/* MLX5_1.10: struct mlx5dv_dr_domain *mlx5dv_dr_domain_create(...) */
void *mlx5dv_dr_domain_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: int mlx5dv_dr_domain_destroy(...) */
int mlx5dv_dr_domain_destroy(void) { return nosup(); }
/* MLX5_1.10: int mlx5dv_dr_domain_sync(...) */
int mlx5dv_dr_domain_sync(void) { return nosup(); }
/* MLX5_1.10: struct mlx5dv_dr_matcher *mlx5dv_dr_matcher_create(...) */
void *mlx5dv_dr_matcher_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: int mlx5dv_dr_matcher_destroy(...) */
int mlx5dv_dr_matcher_destroy(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_dr_matcher_set_layout(...) */
int mlx5dv_dr_matcher_set_layout(void) { return nosup(); }
/* MLX5_1.10: struct mlx5dv_dr_rule *mlx5dv_dr_rule_create(...) */
void *mlx5dv_dr_rule_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: int mlx5dv_dr_rule_destroy(...) */
int mlx5dv_dr_rule_destroy(void) { return nosup(); }
/* MLX5_1.10: struct mlx5dv_dr_table *mlx5dv_dr_table_create(...) */
void *mlx5dv_dr_table_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.10: int mlx5dv_dr_table_destroy(...) */
int mlx5dv_dr_table_destroy(void) { return nosup(); }
/* MLX5_1.12: int mlx5dv_dump_dr_domain(...) */
int mlx5dv_dump_dr_domain(void) { return nosup(); }
/* MLX5_1.12: void mlx5dv_free_var(...) */
void mlx5dv_free_var(void) { }
/* MLX5_1.4: int mlx5dv_get_clock_info(...) */
int mlx5dv_get_clock_info(void) { return nosup(); }
/* MLX5_1.21: struct ibv_device **mlx5dv_get_vfio_device_list(...) */
void *mlx5dv_get_vfio_device_list(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.2: int mlx5dv_init_obj(...) */
int mlx5dv_init_obj(void) { return nosup(); }
/* MLX5_1.8: _Bool mlx5dv_is_supported(...) */
bool mlx5dv_is_supported(void) { return false; }
/* MLX5_1.20: int mlx5dv_map_ah_to_qp(...) */
int mlx5dv_map_ah_to_qp(void) { return nosup(); }
/* MLX5_1.14: int mlx5dv_modify_qp_lag_port(...) */
int mlx5dv_modify_qp_lag_port(void) { return nosup(); }
/* MLX5_1.17: int mlx5dv_modify_qp_sched_elem(...) */
int mlx5dv_modify_qp_sched_elem(void) { return nosup(); }
/* MLX5_1.17: int mlx5dv_modify_qp_udp_sport(...) */
int mlx5dv_modify_qp_udp_sport(void) { return nosup(); }
/* MLX5_1.7: struct ibv_context *mlx5dv_open_device(...) */
void *mlx5dv_open_device(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.13: struct mlx5dv_pp *mlx5dv_pp_alloc(...) */
void *mlx5dv_pp_alloc(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.13: void mlx5dv_pp_free(...) */
void mlx5dv_pp_free(void) { }
/* MLX5_1.20: int mlx5dv_qp_cancel_posted_send_wrs(...) */
int mlx5dv_qp_cancel_posted_send_wrs(void) { return nosup(); }
/* MLX5_1.10: struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(...) */
void *mlx5dv_qp_ex_from_ibv_qp_ex(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.0: int mlx5dv_query_device(...) */
int mlx5dv_query_device(void) { return nosup(); }
/* MLX5_1.14: int mlx5dv_query_qp_lag_port(...) */
int mlx5dv_query_qp_lag_port(void) { return nosup(); }
/* MLX5_1.18: int mlx5dv_reserved_qpn_alloc(...) */
int mlx5dv_reserved_qpn_alloc(void) { return nosup(); }
/* MLX5_1.18: int mlx5dv_reserved_qpn_dealloc(...) */
int mlx5dv_reserved_qpn_dealloc(void) { return nosup(); }
/* MLX5_1.17: struct mlx5dv_sched_leaf *mlx5dv_sched_leaf_create(...) */
void *mlx5dv_sched_leaf_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.17: int mlx5dv_sched_leaf_destroy(...) */
int mlx5dv_sched_leaf_destroy(void) { return nosup(); }
/* MLX5_1.17: int mlx5dv_sched_leaf_modify(...) */
int mlx5dv_sched_leaf_modify(void) { return nosup(); }
/* MLX5_1.17: struct mlx5dv_sched_node *mlx5dv_sched_node_create(...) */
void *mlx5dv_sched_node_create(void) { errno = EOPNOTSUPP; return NULL; }
/* MLX5_1.17: int mlx5dv_sched_node_destroy(...) */
int mlx5dv_sched_node_destroy(void) { return nosup(); }
/* MLX5_1.17: int mlx5dv_sched_node_modify(...) */
int mlx5dv_sched_node_modify(void) { return nosup(); }
/* MLX5_1.21: int mlx5dv_vfio_get_events_fd(...) */
int mlx5dv_vfio_get_events_fd(void) { errno = EOPNOTSUPP; return -1; }
/* MLX5_1.21: int mlx5dv_vfio_process_events(...) */
int mlx5dv_vfio_process_events(void) { return nosup(); }
