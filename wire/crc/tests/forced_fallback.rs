//! `SOFTNIC_CRC_FALLBACK` makes a process take crc32fast, as a CPU without
//! VPCLMULQDQ does: the test runs itself again with the variable set (the detection is
//! once per process) and checks there that the public functions take the fallback and
//! still compute the right CRC and copy.

use std::process::Command;

use softnic_crc::{Path, FORCE_FALLBACK_ENV};

const CHILD_DONE: &str = "forced-fallback child checked";

fn child() {
    assert_eq!(Path::auto(), Path::Fallback);
    assert_eq!(Path::runnable(), vec![Path::Fallback]);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    assert_eq!(softnic_crc::update(3, &data), {
        let mut h = crc32fast::Hasher::new_with_initial(3);
        h.update(&data);
        h.finalize()
    });
    let mut dst = vec![0u8; data.len()];
    assert_eq!(
        softnic_crc::copy_update(0, &data, &mut dst),
        crc32fast::hash(&data)
    );
    assert_eq!(dst, data);
    dst.fill(0);
    // SAFETY: `data` is `dst.len()` readable bytes, not overlapping `dst`.
    let c = unsafe { softnic_crc::copy_update_raw(0, data.as_ptr(), &mut dst) };
    assert_eq!((c, &dst), (crc32fast::hash(&data), &data));
    println!("{CHILD_DONE}");
}

#[test]
fn env_forces_the_fallback() {
    if std::env::var_os(FORCE_FALLBACK_ENV).is_some_and(|v| !v.is_empty()) {
        return child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "env_forces_the_fallback", "--nocapture"])
        .env(FORCE_FALLBACK_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(CHILD_DONE),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
