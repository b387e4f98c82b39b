//! What `librdmacm.so.1` exports, in which version node, and which function of
//! `libibverbs.so.1` each export jumps to; [`version_script`], [`trampolines`] and
//! [`private_node`] are generated from this one table.
//!
//! Why trampolines: the rdma_* code must live in the same shared object as the
//! `ibv_*` code (see [`softnic_ibverbs::internal`]), yet programs import
//! `rdma_connect@RDMACM_1.0` *from librdmacm.so.1* (the loader checks that the library
//! defines the version). So libibverbs.so.1 exports the code as `softnic_rdma_*`
//! (node `SOFTNIC_RDMACM_PRIVATE`), and librdmacm.so.1 is one `jmp` per symbol: no
//! signatures to restate, nothing on the stack, the callee returns to the program.

/// rdma-core's version nodes (`librdmacm/librdmacm.map`), each with the symbols it
/// defines and their targets; RDMACM_1.0 … 1.3, what Debian 12's rdma-core 44 has.
pub const EXPORTS: &[(&str, &[(&str, &str)])] = &[
    (
        "RDMACM_1.0",
        &[
            (
                "rdma_create_event_channel",
                "softnic_rdma_create_event_channel",
            ),
            (
                "rdma_destroy_event_channel",
                "softnic_rdma_destroy_event_channel",
            ),
            ("rdma_create_id", "softnic_rdma_create_id"),
            ("rdma_destroy_id", "softnic_rdma_destroy_id"),
            ("rdma_bind_addr", "softnic_rdma_bind_addr"),
            ("rdma_resolve_addr", "softnic_rdma_resolve_addr"),
            ("rdma_resolve_route", "softnic_rdma_resolve_route"),
            ("rdma_create_qp", "softnic_rdma_create_qp"),
            ("rdma_create_qp_ex", "softnic_rdma_create_qp_ex"),
            ("rdma_destroy_qp", "softnic_rdma_destroy_qp"),
            ("rdma_connect", "softnic_rdma_connect"),
            ("rdma_listen", "softnic_rdma_listen"),
            ("rdma_accept", "softnic_rdma_accept"),
            ("rdma_reject", "softnic_rdma_reject"),
            ("rdma_notify", "softnic_rdma_notify"),
            ("rdma_disconnect", "softnic_rdma_disconnect"),
            ("rdma_get_cm_event", "softnic_rdma_get_cm_event"),
            ("rdma_ack_cm_event", "softnic_rdma_ack_cm_event"),
            ("rdma_get_src_port", "softnic_rdma_get_src_port"),
            ("rdma_get_dst_port", "softnic_rdma_get_dst_port"),
            ("rdma_join_multicast", "softnic_rdma_join_multicast"),
            ("rdma_leave_multicast", "softnic_rdma_leave_multicast"),
            ("rdma_get_devices", "softnic_rdma_get_devices"),
            ("rdma_free_devices", "softnic_rdma_free_devices"),
            ("rdma_event_str", "softnic_rdma_event_str"),
            ("rdma_set_option", "softnic_rdma_set_option"),
            ("rdma_migrate_id", "softnic_rdma_migrate_id"),
            ("rdma_getaddrinfo", "softnic_rdma_getaddrinfo"),
            ("rdma_freeaddrinfo", "softnic_rdma_freeaddrinfo"),
            ("rdma_get_request", "softnic_rdma_get_request"),
            ("rdma_create_ep", "softnic_rdma_create_ep"),
            ("rdma_destroy_ep", "softnic_rdma_destroy_ep"),
            ("rdma_create_srq", "softnic_rdma_create_srq"),
            ("rdma_create_srq_ex", "softnic_rdma_create_srq_ex"),
            ("rdma_destroy_srq", "softnic_rdma_destroy_srq"),
            ("rpoll", "softnic_rpoll"),
            ("rselect", "softnic_rselect"),
            ("rsocket", "softnic_rsocket"),
            ("rbind", "softnic_rbind"),
            ("rlisten", "softnic_rlisten"),
            ("raccept", "softnic_raccept"),
            ("rconnect", "softnic_rconnect"),
            ("rshutdown", "softnic_rshutdown"),
            ("rclose", "softnic_rclose"),
            ("rrecv", "softnic_rrecv"),
            ("rrecvfrom", "softnic_rrecvfrom"),
            ("rrecvmsg", "softnic_rrecvmsg"),
            ("rsend", "softnic_rsend"),
            ("rsendto", "softnic_rsendto"),
            ("rsendmsg", "softnic_rsendmsg"),
            ("rread", "softnic_rread"),
            ("rreadv", "softnic_rreadv"),
            ("rwrite", "softnic_rwrite"),
            ("rwritev", "softnic_rwritev"),
            ("rgetpeername", "softnic_rgetpeername"),
            ("rgetsockname", "softnic_rgetsockname"),
            ("rsetsockopt", "softnic_rsetsockopt"),
            ("rgetsockopt", "softnic_rgetsockopt"),
            ("rfcntl", "softnic_rfcntl"),
            ("riomap", "softnic_riomap"),
            ("riounmap", "softnic_riounmap"),
            ("riowrite", "softnic_riowrite"),
        ],
    ),
    (
        "RDMACM_1.1",
        &[("rdma_join_multicast_ex", "softnic_rdma_join_multicast_ex")],
    ),
    (
        "RDMACM_1.2",
        &[
            ("rdma_establish", "softnic_rdma_establish"),
            ("rdma_init_qp_attr", "softnic_rdma_init_qp_attr"),
        ],
    ),
    (
        "RDMACM_1.3",
        &[
            ("rdma_get_remote_ece", "softnic_rdma_ece_unsupported"),
            ("rdma_reject_ece", "softnic_rdma_ece_unsupported"),
            ("rdma_set_local_ece", "softnic_rdma_ece_unsupported"),
        ],
    ),
];

/// The node of libibverbs.so.1 that exports the targets.
pub const PRIVATE_NODE: &str = "SOFTNIC_RDMACM_PRIVATE";

/// librdmacm.so.1's version script: rdma-core's nodes, each inheriting the previous.
pub fn version_script() -> String {
    let mut s =
        String::from("/* softnic librdmacm.so.1: generated from softnic_rdmacm::exports */\n");
    let mut prev: Option<&str> = None;
    for (node, syms) in EXPORTS {
        s.push_str(&format!("{node} {{\n\tglobal:\n"));
        for (name, _) in *syms {
            s.push_str(&format!("\t\t{name};\n"));
        }
        if prev.is_none() {
            s.push_str("\tlocal: *;\n");
        }
        match prev {
            Some(p) => s.push_str(&format!("}} {p};\n")),
            None => s.push_str("};\n"),
        }
        prev = Some(node);
    }
    s
}

/// The version node appended to libibverbs.so.1's script: every target.
pub fn private_node() -> String {
    let mut targets: Vec<&str> = EXPORTS
        .iter()
        .flat_map(|(_, syms)| syms.iter().map(|(_, t)| *t))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    let mut s = format!("{PRIVATE_NODE} {{\n\tglobal:\n");
    for t in targets {
        s.push_str(&format!("\t\t{t};\n"));
    }
    s.push_str("};\n");
    s
}

/// librdmacm.so.1's code (GNU assembler, preprocessed: x86-64 and AArch64): for each
/// export a function that tail-jumps through the PLT to its target.
pub fn trampolines() -> String {
    let mut s = String::from(
        "/* softnic librdmacm.so.1: generated from softnic_rdmacm::exports */\n\
         #if defined(__x86_64__)\n#define JUMP(t) jmp t@PLT\n\
         #elif defined(__aarch64__)\n#define JUMP(t) b t\n\
         #else\n#error \"softnic librdmacm trampolines: x86-64 or AArch64 only\"\n#endif\n\
         \t.text\n",
    );
    for (_, syms) in EXPORTS {
        for (name, target) in *syms {
            s.push_str(&format!(
                "\t.globl {name}\n\t.type {name}, %function\n\t.p2align 4\n{name}:\n\
                 \tJUMP({target})\n\t.size {name}, .-{name}\n"
            ));
        }
    }
    s.push_str("\t.section .note.GNU-stack,\"\",%progbits\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader rejects a library that lacks a node a binary names, and a binary
    /// imports each symbol from one node: every node and each symbol exactly once.
    #[test]
    fn every_symbol_once_in_rdma_cores_nodes() {
        let nodes: Vec<&str> = EXPORTS.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            nodes,
            ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"]
        );
        let mut names: Vec<&str> = EXPORTS
            .iter()
            .flat_map(|(_, s)| s.iter().map(|(n, _)| *n))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a symbol is listed twice");
        let script = version_script();
        assert!(script.contains("RDMACM_1.2 {\n\tglobal:\n\t\trdma_establish;"));
        assert!(script.contains("} RDMACM_1.2;\n"));
    }
}
