//! The Rust mirrors of `<rdma/rdma_cma.h>`'s structs against the real header:
//! [`softnic_rdmacm::abi::layout_table`] becomes one `_Static_assert` per field (offset
//! and size) and per struct (size), compiled with the system C compiler against
//! Debian's `librdmacm-dev` headers. A missing compiler or header FAILS the test:
//! `.ci/run` installs both.

use softnic_ibverbs::abi::{c_syntax_check, Kind, SizeRule};
use softnic_rdmacm::abi::{layout_table, size_table};

fn c_source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <rdma/rdma_cma.h>\n\
         #define FIELD_SIZE(s, f) sizeof(((struct s *)0)->f)\n",
    );
    for f in layout_table() {
        assert_eq!(f.kind, Kind::Offset);
        let (s, n, v, z) = (f.strukt, f.field, f.value, f.size);
        c.push_str(&format!(
            "_Static_assert(offsetof(struct {s}, {n}) == {v}, \"offsetof({s}.{n}) != {v}\");\n\
             _Static_assert(FIELD_SIZE({s}, {n}) == {z}, \"sizeof({s}.{n}) != {z}\");\n"
        ));
    }
    for s in size_table() {
        assert_eq!(s.rule, SizeRule::Exact);
        let (n, z) = (s.strukt, s.size);
        c.push_str(&format!(
            "_Static_assert(sizeof(struct {n}) == {z}, \"sizeof({n}) != {z}\");\n"
        ));
    }
    c
}

#[test]
fn rust_mirrors_match_the_system_rdma_cma_h() {
    if let Err(e) = c_syntax_check("rdmacm-layout", &c_source()) {
        panic!("layout check against <rdma/rdma_cma.h> failed (librdmacm-dev installed?):\n{e}");
    }
    // Every struct a program allocates or walks is checked.
    let sizes: Vec<&str> = size_table().iter().map(|s| s.strukt).collect();
    for s in [
        "rdma_cm_id",
        "rdma_cm_event",
        "rdma_conn_param",
        "rdma_ud_param",
        "rdma_addrinfo",
    ] {
        assert!(sizes.contains(&s), "{s} not checked");
    }
}
