//! Links `<target>/<profile>/softnic-rdmacm/`: `libibverbs.so.1` from this crate's
//! staticlib (softnic-ibverbs plus the rdma_* code, exported as `softnic_rdma_*`), the
//! forwarding `librdmacm.so.1`, and the stub `libmlx5.so.1` / `libefa.so.1` — with
//! softnic-ibverbs' builder ([`softnic_ibverbs::builder::ensure_flavour`]).
//!
//! `softnic exec` puts this directory first in `LD_LIBRARY_PATH`, so a program gets
//! both drop-in libraries, which share one set of objects.

use std::path::{Path, PathBuf};

use softnic_ibverbs::builder::{ensure_flavour, Companion, Flavour};

use crate::exports;

/// Name of the library directory inside a cargo profile directory.
pub const LIB_DIR_NAME: &str = "softnic-rdmacm";

/// Links the libraries into `<profile_dir>/softnic-rdmacm/` unless they are newer than
/// the staticlib, and returns that directory.
pub fn ensure(profile_dir: &Path) -> Result<PathBuf, String> {
    let (map, asm, private) = (
        exports::version_script(),
        exports::trampolines(),
        exports::private_node(),
    );
    ensure_flavour(
        profile_dir,
        &Flavour {
            staticlib: "softnic_rdmacm",
            dir: LIB_DIR_NAME,
            extra_nodes: &private,
            companions: &[Companion {
                soname: "librdmacm.so.1",
                asm: &asm,
                map: &map,
            }],
        },
    )
}
