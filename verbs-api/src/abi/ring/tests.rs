use super::*;
use crate::abi::{CQ_ARMED, NEED_WAKEUP};
use memmap2::MmapMut;
use proptest::prelude::*;
use std::collections::VecDeque;

fn anon(len: usize) -> Arc<MmapRaw> {
    Arc::new(MmapRaw::from(MmapMut::map_anon(len).unwrap()))
}

fn pair(cap: u32) -> (Producer<u64>, Consumer<u64>) {
    let map = anon(crate::abi::layout::ring_bytes::<u64>(cap).unwrap());
    let r = Ring::<u64>::new(map.clone(), 0, cap).unwrap();
    r.init();
    let c = Ring::<u64>::new(map, 0, cap).unwrap();
    c.check_header().unwrap();
    (r.into_producer(), c.into_consumer())
}

fn header_of<T: Slot>(r: &Ring<T>) -> &RingHeader {
    r.header()
}

#[derive(Debug, Clone)]
enum Op {
    Push(u64),
    Publish,
    Pop,
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u64>().prop_map(Op::Push),
        1 => Just(Op::Publish),
        3 => Just(Op::Pop),
        1 => Just(Op::Release),
    ]
}

proptest! {
    /// The ring behaves like a bounded queue whose pushes become visible on publish and
    /// whose slots become free on release.
    #[test]
    fn ring_matches_vecdeque_model(cap_log in 0u32..5, ops in proptest::collection::vec(op(), 0..300)) {
        let cap = 1u32 << cap_log;
        let (mut p, mut c) = pair(cap);
        let mut pending: VecDeque<u64> = VecDeque::new();
        let mut visible: VecDeque<u64> = VecDeque::new();
        let mut unreleased = 0usize;
        for op in ops {
            match op {
                Op::Push(v) => {
                    let used = pending.len() + visible.len() + unreleased;
                    let r = p.push(&v);
                    if used == cap as usize {
                        prop_assert_eq!(r, Err(RingError::Full));
                    } else {
                        prop_assert_eq!(r, Ok(()));
                        pending.push_back(v);
                    }
                }
                Op::Publish => {
                    p.publish();
                    visible.extend(pending.drain(..));
                }
                Op::Pop => {
                    let got = c.pop().unwrap();
                    let want = visible.pop_front();
                    if want.is_some() {
                        unreleased += 1;
                    }
                    prop_assert_eq!(got, want);
                }
                Op::Release => {
                    c.release();
                    unreleased = 0;
                }
            }
            prop_assert_eq!(c.ring().len().unwrap() as usize, visible.len() + unreleased);
        }
    }
}

#[test]
fn two_thread_spsc_delivers_every_value_in_order() {
    const N: u64 = 100_000;
    // Spins are bounded so a bug shows as a failure, not a hang.
    const MAX_SPINS: u64 = 200_000_000;
    let (mut p, mut c) = pair(64);
    let producer = std::thread::spawn(move || {
        let mut spins = 0u64;
        let mut next = 0u64;
        while next < N {
            match p.push(&next) {
                Ok(()) => {
                    next += 1;
                    if next.is_multiple_of(7) {
                        p.publish();
                    }
                }
                Err(RingError::Full) => {
                    p.publish();
                    spins += 1;
                    assert!(spins < MAX_SPINS, "producer starved");
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
        p.publish();
    });
    let mut expect = 0u64;
    let mut spins = 0u64;
    while expect < N {
        match c.pop().unwrap() {
            Some(v) => {
                assert_eq!(v, expect);
                expect += 1;
                if expect.is_multiple_of(5) {
                    c.release();
                }
            }
            None => {
                c.release();
                spins += 1;
                assert!(spins < MAX_SPINS, "consumer starved");
                std::thread::yield_now();
            }
        }
    }
    producer.join().unwrap();
    assert_eq!(c.pop().unwrap(), None);
}

#[test]
fn consumer_refuses_producer_index_beyond_capacity() {
    let (mut p, mut c) = pair(8);
    p.push(&1).unwrap();
    p.publish();
    assert_eq!(c.pop().unwrap(), Some(1));
    // A hostile producer claims 9 entries past our head (capacity 8).
    header_of(c.ring())
        .producer
        .0
        .store(1 + 9, Ordering::Release);
    assert_eq!(
        c.pop(),
        Err(RingError::Corrupt {
            producer: 10,
            consumer: 1
        })
    );
    // Sticky: even a repaired header is not trusted again.
    header_of(c.ring()).producer.0.store(1, Ordering::Release);
    assert!(c.pop().is_err());
    assert!(c.ring().len().is_ok());
}

#[test]
fn consumer_index_going_backwards_is_corrupt_for_the_producer() {
    let (mut p, _c) = pair(4);
    for v in 0..4 {
        p.push(&v).unwrap();
    }
    p.publish();
    // Consumer claims to be ahead of the producer (wraps to a huge used count).
    header_of(p.ring()).consumer.0.store(100, Ordering::Release);
    assert!(matches!(p.push(&9), Err(RingError::Corrupt { .. })));
}

#[test]
fn wrapping_indices_near_u32_max_work() {
    let map = anon(crate::abi::layout::ring_bytes::<u64>(4).unwrap());
    let r = Ring::<u64>::new(map.clone(), 0, 4).unwrap();
    r.init();
    header_of(&r)
        .producer
        .0
        .store(u32::MAX - 1, Ordering::Relaxed);
    header_of(&r)
        .consumer
        .0
        .store(u32::MAX - 1, Ordering::Relaxed);
    let mut p = r.into_producer();
    let mut c = Ring::<u64>::new(map, 0, 4).unwrap().into_consumer();
    for round in 0..5u64 {
        for v in 0..4 {
            p.push(&(round * 10 + v)).unwrap();
        }
        assert_eq!(p.push(&0), Err(RingError::Full));
        p.publish();
        for v in 0..4 {
            assert_eq!(c.pop().unwrap(), Some(round * 10 + v));
        }
        assert_eq!(c.pop().unwrap(), None);
        c.release();
    }
}

#[test]
fn corrupt_capacity_and_entry_size_never_change_addressing() {
    let (mut p, mut c) = pair(4);
    let h = header_of(p.ring());
    h.capacity.store(u32::MAX, Ordering::Relaxed);
    h.entry_size.store(1 << 30, Ordering::Relaxed);
    assert!(matches!(
        c.ring().check_header(),
        Err(LayoutError::HeaderMismatch { .. })
    ));
    // Still a 4-slot ring inside the mapping.
    for v in 0..4 {
        p.push(&v).unwrap();
    }
    assert_eq!(p.push(&4), Err(RingError::Full));
    p.publish();
    for v in 0..4 {
        assert_eq!(c.pop().unwrap(), Some(v));
    }
}

#[test]
fn ring_outside_mapping_is_refused() {
    let map = anon(4096);
    assert!(matches!(
        Ring::<u64>::new(map.clone(), 0, 1024),
        Err(LayoutError::OutsideMapping { .. })
    ));
    assert!(matches!(
        Ring::<u64>::new(map.clone(), 8, 4),
        Err(LayoutError::Misaligned { offset: 8 })
    ));
    assert!(matches!(
        Ring::<u64>::new(map.clone(), usize::MAX - 63, 4),
        Err(LayoutError::TooLarge { .. })
    ));
    assert!(matches!(
        Ring::<u64>::new(map, 0, 3),
        Err(LayoutError::NotPowerOfTwo { capacity: 3 })
    ));
}

#[test]
fn need_wakeup_is_seen_by_the_poster() {
    let (mut p, c) = pair(4);
    p.push(&1).unwrap();
    assert!(!p.publish_and_check(NEED_WAKEUP));
    c.ring().set_flags(NEED_WAKEUP);
    p.push(&2).unwrap();
    assert!(p.publish_and_check(NEED_WAKEUP));
    c.ring().clear_flags(NEED_WAKEUP);
    assert!(!p.publish_and_check(NEED_WAKEUP));
}

#[test]
fn cq_armed_wakes_once_per_arm() {
    let (mut p, mut c) = pair(4);
    assert_eq!(c.arm(CQ_ARMED), Ok(true), "empty ring: may sleep");
    p.push(&1).unwrap();
    assert!(p.publish_and_take(CQ_ARMED));
    assert_eq!(c.ring().flags() & CQ_ARMED, 0);
    p.push(&2).unwrap();
    assert!(
        !p.publish_and_take(CQ_ARMED),
        "not re-armed: no second wake-up"
    );
    assert_eq!(c.arm(CQ_ARMED), Ok(false), "entries waiting: don't sleep");
}

#[test]
fn release_except_frees_only_completed_slots_and_never_moves_back() {
    let (mut p, mut c) = pair(4);
    for v in 0..4 {
        p.push(&v).unwrap();
    }
    p.publish();
    for _ in 0..4 {
        c.pop().unwrap().unwrap();
    }
    // All four popped, three still outstanding (e.g. receive WQEs not yet completed).
    assert_eq!(c.release_except(3), 1, "one slot released");
    assert_eq!(p.free(4).unwrap(), 1);
    p.push(&4).unwrap();
    assert_eq!(p.push(&5), Err(RingError::Full));
    // More held than unreleased (or a stale, larger count): nothing moves back.
    assert_eq!(c.release_except(4), 0);
    assert_eq!(c.release_except(9), 0);
    assert_eq!(header_of(c.ring()).consumer.0.load(Ordering::Relaxed), 1);
    assert_eq!(p.free(4).unwrap(), 0);
    assert_eq!(c.release_except(1), 2);
    assert_eq!(p.free(4).unwrap(), 2);
    c.release();
    assert_eq!(p.free(4).unwrap(), 3);
}

/// Slots are copied in and out a word at a time (`read_slot`, `write_slot`), by `pop`
/// and by `pop_into`: every byte a send WQE uses (`Slot::used_len`: the fixed fields,
/// `num_sge` gather entries, the UD destination with UD_DEST, `inline_len` inline bytes
/// with IBV_SEND_INLINE), the last inline byte included, survives the trip, and
/// nothing past it is written into the slot or copied out of it.
#[test]
fn word_copies_keep_every_used_byte_of_a_send_wqe() {
    use crate::abi::slots::{send_flags, Slot};
    use crate::abi::SendWqe;
    let cap = 4;
    let map = anon(crate::abi::layout::ring_bytes::<SendWqe>(cap).unwrap());
    let r = Ring::<SendWqe>::new(map.clone(), 0, cap).unwrap();
    r.init();
    let (mut p, mut c) = (
        r.into_producer(),
        Ring::<SendWqe>::new(map, 0, cap).unwrap().into_consumer(),
    );
    let bytes = |v: &SendWqe| -> Vec<u8> {
        // SAFETY: SendWqe is plain data without padding (a `Slot`).
        unsafe { core::slice::from_raw_parts((v as *const SendWqe).cast::<u8>(), 400) }.to_vec()
    };
    // Every byte set, so that a byte copied past the used ones would show.
    let full = {
        let mut w = SendWqe {
            wr_id: u64::MAX,
            imm: u32::MAX,
            remote_addr: u64::MAX,
            rkey: u32::MAX,
            compare_add: u64::MAX,
            swap: u64::MAX,
            tail: [0xA5; 256],
            ..SendWqe::default()
        };
        for g in &mut w.sges {
            g.addr = u64::MAX;
            g.length = u32::MAX;
            g.lkey = 0xDEAD_BEEF;
        }
        w.ud.qpn = 0xFF_FFFF;
        w.ud.gid = [0x5A; 16];
        w
    };
    for k in 0..24u8 {
        let inline_len = [256, 0, 1, 13][usize::from(k % 4)];
        let inline = k % 3 != 1;
        let ud = k % 5 == 0;
        let mut w = full;
        w.wr_id ^= u64::from(k);
        w.num_sge = k % 6; // 4 and 5 copy all four entries, no more
        w.inline_len = inline_len;
        w.flags =
            if inline { send_flags::INLINE } else { 0 } | if ud { send_flags::UD_DEST } else { 0 };
        for (i, b) in w.inline_area_mut().iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ k;
        }
        p.push(&w).unwrap();
        p.publish();
        let used = w.used_len().div_ceil(8) * 8;
        let expect = if inline && inline_len > 0 {
            let at = if ud { SendWqe::INLINE_AT } else { 48 };
            at + (inline_len as usize).div_ceil(8) * 8
        } else if ud {
            SendWqe::INLINE_AT
        } else if inline {
            48
        } else {
            48 + 16 * usize::from(w.num_sge.min(4))
        };
        assert_eq!(used, expect, "wqe {k}");
        let (got, rest) = if k % 2 == 0 {
            (c.pop().unwrap().unwrap(), vec![0u8; 400 - used])
        } else {
            // pop_into overwrites what is used and leaves the rest as it was.
            let mut out = SendWqe {
                tail: [0xEE; 256],
                ..SendWqe::default()
            };
            let kept = bytes(&out)[used..].to_vec();
            assert!(c.pop_into(&mut out).unwrap());
            let before = out;
            assert!(!c.pop_into(&mut out).unwrap(), "empty");
            assert_eq!(out, before, "an empty ring leaves the place as it was");
            (out, kept)
        };
        assert_eq!(
            bytes(&got)[..used],
            bytes(&w)[..used],
            "the used bytes, exactly"
        );
        assert_eq!(bytes(&got)[used..], rest[..], "nothing past them");
        c.release();
    }
}

/// A send ring whose slots are only as far apart as the QP's shape needs
/// (`send_wqe_stride`): values round-trip, none spills into its neighbour, and a
/// hostile producer's slot that claims more inline bytes than the stride holds is
/// copied only up to the stride — with the ring's last slot at the end of the readable
/// memory, so a read past it would fault.
#[test]
fn strided_send_ring_stays_within_each_slot() {
    use crate::abi::layout::{ring_bytes_strided, send_wqe_stride, SqShape};
    use crate::abi::slots::send_flags;
    use crate::abi::SendWqe;
    let shape = SqShape {
        max_sge: 1,
        max_inline: 16,
        ud: false,
    };
    let (cap, stride) = (4u32, send_wqe_stride(shape));
    assert_eq!(stride, 64);
    let bytes = ring_bytes_strided(cap, stride).unwrap();
    // Two pages, the second made inaccessible; the ring ends where the first does.
    let map = anon(8192);
    // SAFETY: the second page of our own anonymous mapping, which nothing else uses.
    let rc = unsafe { libc::mprotect(map.as_mut_ptr().add(4096).cast(), 4096, libc::PROT_NONE) };
    assert_eq!(rc, 0);
    let offset = 4096 - bytes;
    assert_eq!(offset % 64, 0);
    let r = Ring::<SendWqe>::with_stride(map.clone(), offset, cap, stride).unwrap();
    r.init();
    assert_eq!(r.stride(), 64);
    let (mut p, mut c) = (
        r.into_producer(),
        Ring::<SendWqe>::with_stride(map.clone(), offset, cap, stride)
            .unwrap()
            .into_consumer(),
    );
    c.ring().check_header().unwrap();
    let wqe = |k: u8| {
        let mut w = SendWqe {
            wr_id: u64::from(k),
            flags: send_flags::INLINE,
            inline_len: 16,
            ..SendWqe::default()
        };
        w.inline_area_mut()[..16].fill(k);
        w
    };
    for k in 0..cap as u8 {
        p.push(&wqe(k)).unwrap();
    }
    p.publish();
    for k in 0..cap as u8 {
        assert_eq!(c.pop().unwrap().unwrap(), wqe(k), "slot {k} intact");
    }
    c.release();
    // A producer that ignores the stride: the last slot (ending at the protected page)
    // says 256 inline bytes. Only the stride's 16 are copied; the rest is zero (`pop`)
    // or what `out` held (`pop_into`).
    let last = offset + RING_HEADER_SIZE + (cap as usize - 1) * stride;
    let inline_len_at = last + core::mem::offset_of!(SendWqe, inline_len);
    for round in 0..2 {
        for k in 0..cap as u8 - 1 {
            p.push(&wqe(k)).unwrap();
        }
        p.push(&wqe(9)).unwrap();
        // SAFETY: a word inside the last slot, in the readable page; nobody reads the
        // slot meanwhile (it is not published yet).
        unsafe { map.as_mut_ptr().add(inline_len_at).cast::<u32>().write(256) };
        p.publish();
        for k in 0..cap as u8 - 1 {
            assert_eq!(c.pop().unwrap().unwrap(), wqe(k));
        }
        if round == 0 {
            let got = c.pop().unwrap().unwrap();
            assert_eq!(got.inline_len, 256);
            assert_eq!(got.inline_payload()[..16], [9; 16]);
            assert!(got.inline_payload()[16..].iter().all(|&b| b == 0));
        } else {
            let mut out = SendWqe::default();
            out.inline_area_mut().fill(0xEE);
            assert!(c.pop_into(&mut out).unwrap());
            assert_eq!(out.inline_payload()[..16], [9; 16]);
            assert!(out.inline_payload()[16..].iter().all(|&b| b == 0xEE));
        }
        c.release();
    }
}

#[test]
fn with_stride_takes_only_strides_a_slot_can_live_in() {
    use crate::abi::SendWqe;
    let map = anon(1 << 16);
    let ok = |stride| Ring::<SendWqe>::with_stride(map.clone(), 0, 4, stride).is_ok();
    assert!(ok(48) && ok(64) && ok(144) && ok(152) && ok(400));
    assert!(!ok(40), "shorter than the head");
    assert!(!ok(148), "not a whole number of words");
    assert!(!ok(408), "longer than the slot");
    // A peer that built the ring with another stride is refused at attach.
    let r = Ring::<SendWqe>::with_stride(map.clone(), 0, 4, 400).unwrap();
    r.init();
    let other = Ring::<SendWqe>::with_stride(map.clone(), 0, 4, 144).unwrap();
    assert!(matches!(
        other.check_header(),
        Err(LayoutError::HeaderMismatch {
            entry_size: 400,
            expected_entry_size: 144,
            ..
        })
    ));
}

#[test]
fn move_unconsumed_carries_what_the_consumer_has_not_taken_in_order() {
    let (mut p, mut c) = pair(4);
    for v in 0..4 {
        p.push(&v).unwrap();
    }
    p.publish();
    assert_eq!(c.pop().unwrap(), Some(0));
    c.release();
    // 1, 2, 3 are not taken: they do not fit in 2 slots, they do in 4.
    let (mut small, _sc) = pair(2);
    assert_eq!(p.move_unconsumed(&mut small), Err(RingError::Full));
    let (mut big, mut bc) = pair(4);
    assert_eq!(p.unconsumed().unwrap(), 3);
    assert_eq!(p.move_unconsumed(&mut big).unwrap(), 3);
    let got: Vec<u64> = std::iter::from_fn(|| bc.pop().unwrap()).collect();
    assert_eq!(got, [1, 2, 3]);
}

#[test]
fn unpop_returns_the_slot_to_the_next_pop_unless_released() {
    let (mut p, mut c) = pair(4);
    for v in 0..2 {
        p.push(&v).unwrap();
    }
    p.publish();
    assert_eq!(c.pop().unwrap(), Some(0));
    c.unpop();
    assert_eq!(c.pop().unwrap(), Some(0));
    c.release();
    c.unpop(); // released: stays taken
    assert_eq!(c.pop().unwrap(), Some(1));
}

proptest! {
    /// `retain` drops exactly the published slots `keep` refuses, keeps the others in
    /// order, leaves slots published after it (and unpublished pushes) alone, and
    /// frees the dropped slots for the producer once released, across the wrap.
    #[test]
    fn retain_drops_exactly_the_refused_slots(
        skip in 0u32..8,
        values in proptest::collection::vec(0u64..4, 0..8),
        later in proptest::collection::vec(0u64..4, 0..4),
    ) {
        let cap = 8;
        let (mut p, mut c) = pair(cap);
        // Move the indexes so the slots below wrap.
        for i in 0..skip {
            p.push(&(100 + u64::from(i))).unwrap();
            p.publish();
            c.pop().unwrap().unwrap();
            c.release();
        }
        for v in &values {
            p.push(v).unwrap();
        }
        p.publish();
        let dropped = c.retain(|&v| v != 0).unwrap();
        let kept: Vec<u64> = values.iter().copied().filter(|&v| v != 0).collect();
        prop_assert_eq!(dropped as usize, values.len() - kept.len());
        c.release();
        // The dropped slots are free again: the producer can fill the ring.
        let room = cap as usize - kept.len();
        for v in later.iter().take(room) {
            p.push(v).unwrap();
        }
        p.publish();
        let mut got = Vec::new();
        while let Some(v) = c.pop().unwrap() {
            got.push(v);
        }
        let want: Vec<u64> = kept.iter().chain(later.iter().take(room)).copied().collect();
        prop_assert_eq!(got, want);
    }
}
