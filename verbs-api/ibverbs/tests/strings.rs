//! The `ibv_*_str` helpers print exactly what rdma-core's do: one C program, compiled
//! against Debian's `<infiniband/verbs.h>`, runs once on rdma-core's `libibverbs.so.1`
//! (installed with `libibverbs-dev`) and once on softnic's (`LD_LIBRARY_PATH`), and the
//! outputs must be identical. Fails if the compiler, header or library is missing.

use std::path::Path;
use std::process::Command;

use softnic_ibverbs::builder;

#[test]
fn string_helpers_match_rdma_core() {
    let exe_path = std::env::current_exe().unwrap();
    let lib_dir = builder::ensure(&builder::profile_dir_of(&exe_path)).expect("link the libraries");
    let dir = std::env::temp_dir().join(format!("softnic-ibverbs-strings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("strings");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let o = Command::new(&cc)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/strings.c"))
        .arg("-libverbs")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    assert!(
        o.status.success(),
        "compiling strings.c (libibverbs-dev installed?): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let run = |ld: Option<&Path>| {
        let mut c = Command::new(&exe);
        c.env_remove("LD_LIBRARY_PATH");
        if let Some(d) = ld {
            c.env("LD_LIBRARY_PATH", d);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let rdma_core = run(None);
    let ours = run(Some(&lib_dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(rdma_core.lines().count() >= 4 * 42);
    for (a, b) in rdma_core.lines().zip(ours.lines()) {
        assert_eq!(a, b, "rdma-core vs softnic");
    }
    assert_eq!(rdma_core, ours);
}
