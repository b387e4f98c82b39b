//! The Rust mirrors of rdma-core's structs against the real `<infiniband/verbs.h>`.
//!
//! [`softnic_ibverbs::abi::layout_table`] becomes one `_Static_assert` per field (offset
//! and size), per struct (size) and per `verbs_context` op (distance to the embedded
//! `ibv_context`, the "grows up" rule), compiled with the system C compiler against
//! Debian's `libibverbs-dev` headers. A missing compiler or header FAILS the test:
//! `.ci/run` installs both.

use softnic_ibverbs::abi::{
    c_syntax_check, layout_table, size_table, Kind, SizeRule, VERBS_CONTEXT_SZ,
};

fn c_source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdint.h>\n#include <infiniband/verbs.h>\n\
         #define FIELD_SIZE(s, f) sizeof(((struct s *)0)->f)\n",
    );
    for f in layout_table() {
        let (s, n) = (f.strukt, f.field);
        match f.kind {
            Kind::Offset => c.push_str(&format!(
                "_Static_assert(offsetof(struct {s}, {n}) == {v}, \
                 \"offsetof({s}.{n}) != {v} (Rust)\");\n",
                v = f.value
            )),
            Kind::FromContext => c.push_str(&format!(
                "_Static_assert(offsetof(struct {s}, context) - offsetof(struct {s}, {n}) \
                 == {v}, \"{s}.{n}: distance to context != {v} (Rust)\");\n\
                 _Static_assert(sizeof(struct {s}) - offsetof(struct {s}, {n}) <= {sz}, \
                 \"verbs_get_ctx_op would refuse {n}: sz {sz} too small\");\n",
                v = f.value,
                sz = VERBS_CONTEXT_SZ
            )),
        }
        c.push_str(&format!(
            "_Static_assert(FIELD_SIZE({s}, {n}) == {z}, \"sizeof({s}.{n}) != {z} (Rust)\");\n",
            z = f.size
        ));
    }
    for s in size_table() {
        let (name, z) = (s.strukt, s.size);
        let op = match s.rule {
            SizeRule::Exact => "==",
            SizeRule::CMayBeLarger => ">=",
            SizeRule::CMayBeSmaller => "<=",
        };
        c.push_str(&format!(
            "_Static_assert(sizeof(struct {name}) {op} {z}, \"sizeof({name}) {op} {z} (Rust) fails\");\n"
        ));
    }
    // The negative-offset rule itself: `context` is the last member, so the ops a
    // program's header knows sit at fixed distances before it (checked above) and
    // `verbs_get_ctx` finds the container by subtracting offsetof(context).
    c.push_str(
        "_Static_assert(offsetof(struct verbs_context, context) + sizeof(struct ibv_context) \
         == sizeof(struct verbs_context), \"context is not last in verbs_context\");\n",
    );
    c.push_str("int main(void) { return 0; }\n");
    c
}

#[test]
fn rust_mirrors_match_the_system_verbs_h() {
    if let Err(e) = c_syntax_check("ibverbs-layout", &c_source()) {
        panic!(
            "layout check against <infiniband/verbs.h> failed (libibverbs-dev installed?):\n{e}"
        );
    }
}

/// The generated checks must be able to fail: a deliberately wrong offset is rejected
/// by the same compiler and header.
#[test]
fn a_wrong_offset_is_caught() {
    let good = c_source();
    let wrong = good.replace(
        "offsetof(struct ibv_context, async_fd) == 268",
        "offsetof(struct ibv_context, async_fd) == 272",
    );
    assert_ne!(
        good, wrong,
        "the table no longer has ibv_context.async_fd at 268"
    );
    let e = c_syntax_check("ibverbs-layout-neg", &wrong).expect_err("a wrong offset compiled");
    assert!(e.contains("async_fd"), "{e}");
}
