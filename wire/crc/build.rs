//! Sets `softnic_crc_vpclmul` when rustc is 1.89 or newer: that release stabilized the
//! AVX-512 and VPCLMULQDQ target features and intrinsics both kernels need. Older
//! compilers (the workspace MSRV is 1.88) build the crate with the crc32fast fallback only.

use std::{env, process::Command};

fn main() {
    println!("cargo:rustc-check-cfg=cfg(softnic_crc_vpclmul)");
    // Only this file decides (a new rustc rebuilds everything anyway): no rerun on each
    // edit of the crate's sources.
    println!("cargo:rerun-if-changed=build.rs");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()));
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=softnic_crc_vpclmul");
    }
}
