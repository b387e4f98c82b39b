//! The Rust mirrors of rdma-core's structs against the real `<infiniband/verbs.h>`.
//!
//! [`softnic_ibverbs::abi::layout_table`] becomes one `_Static_assert` per field (offset
//! and size), per struct (size) and per `verbs_context` op (distance to the embedded
//! `ibv_context`, the "grows up" rule), compiled with the system C compiler against
//! Debian's `libibverbs-dev` headers. A missing compiler or header FAILS the test:
//! `.ci/run` installs both.

use std::process::Command;

use softnic_ibverbs::abi::{layout_table, size_table, Kind, SizeRule, VERBS_CONTEXT_SZ};

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
    let dir = std::env::temp_dir().join(format!("softnic-ibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    std::fs::write(&src, c_source()).unwrap();
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "layout check against <infiniband/verbs.h> failed (libibverbs-dev installed?):\n{stderr}"
    );
}

/// The generated checks must be able to fail: a deliberately wrong offset is rejected
/// by the same compiler and header.
#[test]
fn a_wrong_offset_is_caught() {
    let dir =
        std::env::temp_dir().join(format!("softnic-ibverbs-layout-neg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("wrong.c");
    let good = c_source();
    let wrong = good.replace(
        "offsetof(struct ibv_context, async_fd) == 268",
        "offsetof(struct ibv_context, async_fd) == 272",
    );
    assert_ne!(
        good, wrong,
        "the table no longer has ibv_context.async_fd at 268"
    );
    std::fs::write(&src, wrong).unwrap();
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?}: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "a wrong offset compiled");
    assert!(String::from_utf8_lossy(&out.stderr).contains("async_fd"));
}
