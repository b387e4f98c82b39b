//! librdmacm calls that need no NIC, through a C program compiled against Debian's
//! `<rdma/rdma_cma.h>` (`tests/c/probe.c`): `rdma_event_str` prints byte for byte what
//! rdma-core's library prints (the program runs on both and the outputs are compared);
//! `rdma_getaddrinfo`, `rdma_get_devices`, `rpoll` and the errno of every call softnic
//! does not serve are checked on softnic's. Fails if the compiler, header or library
//! is missing (`.ci/run` installs `librdmacm-dev`).

use std::path::{Path, PathBuf};
use std::process::Command;

use softnic_ibverbs::builder::profile_dir_of;

fn probe() -> (PathBuf, PathBuf) {
    let exe_path = std::env::current_exe().unwrap();
    let lib_dir = softnic_rdmacm::builder::ensure(&profile_dir_of(&exe_path)).expect("link");
    let dir = std::env::temp_dir().join(format!("softnic-rdmacm-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("probe");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let o = Command::new(&cc)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/probe.c"))
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    assert!(
        o.status.success(),
        "compiling probe.c (librdmacm-dev installed?): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (exe, lib_dir)
}

fn run(exe: &Path, ld: Option<&Path>, arg: Option<&str>, softnic_dir: &Path) -> String {
    let mut c = Command::new(exe);
    c.env_remove("LD_LIBRARY_PATH")
        .env("SOFTNIC_DIR", softnic_dir);
    c.args(arg);
    if let Some(d) = ld {
        c.env("LD_LIBRARY_PATH", d);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn event_strings_match_rdma_core_and_nic_free_calls_answer_as_documented() {
    let (exe, lib_dir) = probe();
    let empty = exe.parent().unwrap().join("no-nics");
    std::fs::create_dir_all(&empty).unwrap();
    let rdma_core = run(&exe, None, Some("strings"), &empty);
    let ours = run(&exe, Some(&lib_dir), Some("strings"), &empty);
    assert_eq!(rdma_core.lines().count(), 20);
    assert_eq!(rdma_core, ours, "rdma_event_str: rdma-core vs softnic");
    assert_eq!(run(&exe, Some(&lib_dir), None, &empty), "ok\n");
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}
