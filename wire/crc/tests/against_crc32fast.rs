//! Every path this CPU can run ([`Path::runnable`]) against crc32fast: all lengths the
//! kernel's branches switch at, every source and destination alignment in a 64-byte
//! line, random initial CRCs, chained updates, and the fused copies' bytes.

use proptest::prelude::*;
use softnic_crc::{copy_update_on, copy_update_raw_on, copy_update_to_raw_on, update_on, Path};

/// crc32fast from a finished CRC (the reference).
fn reference(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// `len` pseudo-random bytes.
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 7) as u8
        })
        .collect()
}

/// Checks every path on `data[src_off..][..len]` copied to a buffer at `dst_off`.
fn check(crc: u32, data: &[u8], src_off: usize, dst_off: usize, len: usize) {
    let src = &data[src_off..src_off + len];
    let want = reference(crc, src);
    for path in Path::runnable() {
        assert_eq!(
            update_on(path, crc, src),
            want,
            "update {path:?} len {len} at {src_off}"
        );
        let mut buf = vec![0xA5u8; dst_off + len + 64];
        let got = copy_update_on(path, crc, src, &mut buf[dst_off..dst_off + len]);
        assert_eq!(
            got, want,
            "copy_update {path:?} len {len} src {src_off} dst {dst_off}"
        );
        assert_eq!(
            &buf[dst_off..dst_off + len],
            src,
            "copied bytes {path:?} len {len}"
        );
        assert!(
            buf[..dst_off].iter().all(|&b| b == 0xA5),
            "wrote before dst"
        );
        assert!(
            buf[dst_off + len..].iter().all(|&b| b == 0xA5),
            "wrote past dst"
        );
        let mut raw = vec![0u8; len];
        // SAFETY: `src` is `len` readable bytes, not overlapping `raw`.
        let got = unsafe { copy_update_raw_on(path, crc, src.as_ptr(), &mut raw) };
        assert_eq!(got, want, "copy_update_raw {path:?} len {len}");
        assert_eq!(raw, src);
        let mut out = vec![0xA5u8; dst_off + len + 64];
        // SAFETY: `out[dst_off..]` has `len` writable bytes, not overlapping `src`.
        let got = unsafe { copy_update_to_raw_on(path, crc, src, out.as_mut_ptr().add(dst_off)) };
        assert_eq!(got, want, "copy_update_to_raw {path:?} len {len}");
        assert_eq!(&out[dst_off..dst_off + len], src, "copied bytes {path:?}");
        assert!(
            out[..dst_off].iter().all(|&b| b == 0xA5),
            "wrote before dst"
        );
        assert!(
            out[dst_off + len..].iter().all(|&b| b == 0xA5),
            "wrote past dst"
        );
    }
}

/// The lengths where the kernel's phases switch, the ICRC's usual body sizes, at every
/// source and destination alignment.
#[test]
fn boundary_lengths_every_alignment() {
    let data = bytes(20_000, 7);
    let lens = [
        0usize, 1, 15, 16, 63, 64, 127, 128, 255, 256, 257, 319, 320, 383, 384, 447, 448, 511, 512,
        513, 575, 576, 1024, 4095, 4096, 4097, 4112, 4128, 4159, 4160, 4224, 4288, 8192, 9000,
    ];
    for len in lens {
        for off in 0..64 {
            check(0x1234_5678 ^ len as u32, &data, off, (off * 7) % 64, len);
        }
    }
}

/// Every length up to 1100 (all combinations of extra 64-byte chunks, 16-byte blocks
/// and tail bytes, over one to four rounds). The source is an allocation of exactly
/// `len` bytes (as `check`'s raw destination is), so that under AddressSanitizer
/// (`-Zsanitizer=address`) a load or store one byte past the end faults.
#[test]
fn every_length_to_1100() {
    let data = bytes(1100, 11);
    for len in 0..=1100 {
        let src = data[..len].to_vec();
        check(!(len as u32), &src, 0, (len * 7 + 3) % 64, len);
    }
}

#[test]
fn hash_of_empty_and_known_vector() {
    for path in Path::runnable() {
        assert_eq!(update_on(path, 0, b""), 0);
        assert_eq!(update_on(path, 0, b"123456789"), 0xCBF4_3926);
        let zeros = [0u8; 4096];
        assert_eq!(update_on(path, 0, &zeros), crc32fast::hash(&zeros));
    }
}

/// The public functions agree with the explicit paths (they take one of them).
#[test]
fn public_functions() {
    let data = bytes(5000, 3);
    assert_eq!(softnic_crc::update(0, &data), crc32fast::hash(&data));
    let mut dst = vec![0; 5000];
    assert_eq!(
        softnic_crc::copy_update(9, &data, &mut dst),
        reference(9, &data)
    );
    assert_eq!(dst, data);
    // SAFETY: `data` is 5000 readable bytes, not overlapping `dst`.
    let c = unsafe { softnic_crc::copy_update_raw(0, data.as_ptr(), &mut dst[..4096]) };
    assert_eq!(c, crc32fast::hash(&data[..4096]));
}

#[test]
#[should_panic(expected = "lengths differ")]
fn copy_update_rejects_unequal_lengths() {
    let mut dst = [0u8; 3];
    copy_update_on(Path::Fallback, 0, &[1, 2], &mut dst);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_length_alignment_and_crc(
        len in 0usize..10_000, src_off in 0usize..64, dst_off in 0usize..64,
        crc in any::<u32>(), seed in any::<u32>(),
    ) {
        let data = bytes(len + 64, seed);
        check(crc, &data, src_off, dst_off, len);
    }

    #[test]
    fn chained_updates_compose(
        parts in proptest::collection::vec(0usize..5_000, 1..5), crc in any::<u32>(),
        seed in any::<u32>(),
    ) {
        let total: usize = parts.iter().sum();
        let data = bytes(total, seed);
        for path in Path::runnable() {
            let (mut c, mut copy_c, mut at) = (crc, crc, 0);
            let mut dst = vec![0u8; total];
            for &p in &parts {
                c = update_on(path, c, &data[at..at + p]);
                copy_c = copy_update_on(path, copy_c, &data[at..at + p], &mut dst[at..at + p]);
                at += p;
            }
            prop_assert_eq!(c, reference(crc, &data));
            prop_assert_eq!(copy_c, reference(crc, &data));
            prop_assert_eq!(&dst, &data);
        }
    }
}

/// In CI (SOFTNIC_CI=1) on an x86-64 CPU with AVX-512F and VPCLMULQDQ (with AVX2 and
/// VPCLMULQDQ), the 512-bit (256-bit) kernel must be among the paths the tests above
/// run: a build without it (rustc < 1.89, a broken build.rs or detection) fails here
/// instead of testing only the fallback. A CPU with AVX-512 runs both kernels, so the
/// 256-bit one is tested there too, not only on CPUs without AVX-512 (which take it).
/// (A CPU without the features runs the fallback only, as it should, and passes.)
#[test]
fn wide_path_runs_here_in_ci() {
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("SOFTNIC_CI").is_some()
        && std::env::var_os(softnic_crc::FORCE_FALLBACK_ENV).is_none_or(|v| v.is_empty())
    {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq");
        assert_eq!(Path::runnable().contains(&Path::Wide), has);
        // The 256-bit kernel (session 11) where AVX2 and VPCLMULQDQ are: a Zen 3 would
        // otherwise test, and run, crc32fast only without anyone noticing, and a Zen 4
        // would test only the 512-bit expansion of the kernel both share.
        let has_ymm = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("vpclmulqdq");
        assert_eq!(Path::runnable().contains(&Path::Ymm), has_ymm);
    }
}
