//! Attack: a malicious local client predicts other clients' R_Keys and QPNs from its
//! own (issue 9, item 1; ReDMArk, USENIX Security 2021).
//!
//! The attacker knows softnic's source code. Keys used to be consecutive outputs of one
//! SplitMix64 generator shared by every client, and QPNs counted up by one: a client
//! that registers one region and creates one QP learns two consecutive generator
//! outputs and a QPN, inverts SplitMix64 (a 2^32 search over the 32 output bits it does
//! not see) and predicts the keys and QPN the next client gets. These tests play that
//! client against a real NIC; the prediction must fail.

mod nic_support;

use nic_support::*;
use verbs_api::{
    AccessFlags, CompletionQueue, Device, ProtectionDomain, QpCap, QpInitAttr, QpType,
};

/// SplitMix64 (Steele, Lea, Flood 2014), and its inverse, as an attacker writes them.
mod splitmix {
    pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    const C1: u64 = 0xBF58_476D_1CE4_E5B9;
    const C2: u64 = 0x94D0_49BB_1331_11EB;

    /// The inverse of odd `a` modulo 2^64 (Newton: each step doubles the correct bits).
    const fn inverse(a: u64) -> u64 {
        let mut x = a;
        let mut i = 0;
        while i < 6 {
            x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
            i += 1;
        }
        x
    }
    const I1: u64 = inverse(C1);
    const I2: u64 = inverse(C2);

    /// The output for state `s` (the state after its increment).
    #[inline(always)]
    pub fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(C1);
        z = (z ^ (z >> 27)).wrapping_mul(C2);
        z ^ (z >> 31)
    }

    /// The state whose output is `z`.
    #[inline(always)]
    pub fn unmix(mut z: u64) -> u64 {
        z ^= (z >> 31) ^ (z >> 62);
        z = z.wrapping_mul(I2);
        z ^= (z >> 27) ^ (z >> 54);
        z = z.wrapping_mul(I1);
        z ^ (z >> 30) ^ (z >> 60)
    }

    /// 32-bit key `i` outputs after state `s` (softnic's old `next_u32`: the top half).
    pub fn key(s: u64, i: u64) -> u32 {
        (mix(s.wrapping_add(GAMMA.wrapping_mul(i))) >> 32) as u32
    }

    /// Every state `s` with `key(s, 0) == k0` and `key(s, 1) == k1`, for the unseen
    /// low output bits in `lows`: what an attacker who saw two consecutive keys gets.
    /// Two threads (the search is 2^32 steps of a few multiplications).
    pub fn states(k0: u32, k1: u32, lows: std::ops::Range<u64>) -> Vec<u64> {
        let mid = lows.start + (lows.end - lows.start) / 2;
        let half = |r: std::ops::Range<u64>| {
            let mut out = Vec::new();
            for low in r {
                let s = unmix((u64::from(k0) << 32) | low);
                if key(s, 1) == k1 {
                    out.push(s);
                }
            }
            out
        };
        std::thread::scope(|t| {
            let h = t.spawn(|| half(lows.start..mid));
            let mut v = half(mid..lows.end);
            v.extend(h.join().expect("search thread"));
            v
        })
    }
}

#[test]
fn the_attacker_inverts_splitmix64_from_two_keys() {
    // The attack itself works: keys from a SplitMix64 state are predicted from two
    // consecutive ones. (A state whose first output has small low bits, so the search
    // range is short; against the NIC the full 2^32 range is searched.)
    let s = splitmix::unmix(0xDEAD_BEEF_0000_0309);
    assert_eq!(splitmix::mix(s), 0xDEAD_BEEF_0000_0309);
    let seen = [splitmix::key(s, 0), splitmix::key(s, 1)];
    let found = splitmix::states(seen[0], seen[1], 0..4096);
    assert!(found.contains(&s));
    let predicted: Vec<[u32; 2]> = found
        .iter()
        .map(|&c| [splitmix::key(c, 2), splitmix::key(c, 3)])
        .collect();
    assert!(predicted.contains(&[splitmix::key(s, 2), splitmix::key(s, 3)]));
}

#[test]
fn a_client_cannot_predict_another_clients_keys_from_its_own() {
    let nic = NicProc::start("predict-keys", "127.0.0.64", 0, &[]);
    let attacker = Device::open(&nic.name).expect("open");
    let apd = attacker.alloc_pd().expect("pd");
    let amr = apd.alloc_mr(4096, AccessFlags::ALL).expect("mr");
    // The next registration on the NIC is the victim's.
    let victim = Device::open(&nic.name).expect("open");
    let vpd = victim.alloc_pd().expect("pd");
    let vmr = vpd.alloc_mr(4096, AccessFlags::ALL).expect("mr");

    let candidates = splitmix::states(amr.lkey(), amr.rkey(), 0..1 << 32);
    let predicted: Vec<[u32; 2]> = candidates
        .iter()
        .map(|&s| [splitmix::key(s, 2), splitmix::key(s, 3)])
        .collect();
    assert!(
        !predicted.contains(&[vmr.lkey(), vmr.rkey()]),
        "the attacker predicted the victim's L_Key and R_Key from its own ({} candidate states)",
        candidates.len()
    );
    // Nor is the victim's R_Key its L_Key, or the attacker's, plus one.
    assert_ne!(vmr.rkey(), vmr.lkey().wrapping_add(1));
    assert_ne!(vmr.lkey(), amr.rkey().wrapping_add(1));
}

fn qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> u32 {
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap,
        sq_sig_all: false,
    })
    .expect("create qp")
    .qp_num()
}

#[test]
fn qpns_and_keys_are_not_sequences() {
    let nic = NicProc::start("predict-qpn", "127.0.0.65", 0, &[]);
    let attacker = Device::open(&nic.name).expect("open");
    let apd = attacker.alloc_pd().expect("pd");
    let acq = attacker.create_cq(16).expect("cq");
    let mine = qp(&apd, &acq);
    let victim = Device::open(&nic.name).expect("open");
    let vpd = victim.alloc_pd().expect("pd");
    let vcq = victim.create_cq(16).expect("cq");
    let theirs = qp(&vpd, &vcq);
    assert_ne!(
        theirs,
        mine + 1,
        "the attacker guessed the victim's QPN as its own plus one"
    );

    // Sanity checks that cannot flake: 32 QPNs (24 random bits each) and 64 keys (32
    // bits) drawn one after another. A +1 between neighbours has probability below
    // 32 * 2^-24 + 64 * 2^-32 < 2 * 10^-6 for random values, and certainty for a
    // counter; QPNs 0, 1 (special QPs) and 0xFFFFFF (multicast) never appear.
    let mut qpns = vec![mine];
    let mut keep = Vec::new();
    for _ in 0..31 {
        // Keep each QP alive (dropping it destroys it and could free its number).
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let q = apd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &acq,
                recv_cq: &acq,
                cap,
                sq_sig_all: false,
            })
            .expect("create qp");
        qpns.push(q.qp_num());
        keep.push(q);
    }
    for w in qpns.windows(2) {
        assert_ne!(w[1], w[0].wrapping_add(1), "consecutive QPNs {qpns:x?}");
    }
    assert!(
        qpns.iter().all(|&q| (2..0xFF_FFFF).contains(&q)),
        "{qpns:x?}"
    );
    let mut keys = Vec::new();
    let mut mrs = Vec::new();
    for _ in 0..32 {
        let mr = apd.alloc_mr(64, AccessFlags::ALL).expect("mr");
        keys.extend([mr.lkey(), mr.rkey()]);
        mrs.push(mr);
    }
    for w in keys.windows(2) {
        assert_ne!(w[1], w[0].wrapping_add(1), "consecutive keys {keys:x?}");
    }
    assert!(keys.iter().all(|&k| k != 0));
}
