//! Atomics between two real NICs from two concurrent QPs: two client threads on NIC A,
//! each with its own device context, PD, CQ and QP, fire pipelined FETCH_ADDs and
//! CMP_AND_SWAPs at one memory region on NIC B. IBTA 9.4.5: an atomic operation
//! is atomic with respect to every other atomic on the same HCA, whichever QP it came
//! in on — so the counter ends at the exact sum, every original value is handed out
//! exactly once, and exactly one CMP_AND_SWAP per word wins.

mod nic_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use nic_support::*;
use verbs_api::qp::AhAttr;
use verbs_api::{
    AccessFlags, CompletionQueue, Device, MemoryRegion, Mtu, QpAttr, QpCap, QpEndpoint, QpInitAttr,
    QpState, QpType, QueuePair, SendWr, WcOpcode, WcStatus, WrOpcode,
};

/// Client threads (= QPs) on NIC A.
const CLIENTS: usize = 2;
/// FETCH_ADD(+1)s per client.
const ADDS: usize = 5000;
/// CMP_AND_SWAP words raced for; both clients swap every word, client 0 from the first
/// word up, client 1 from the last word down, so they collide in flight in the middle
/// and each wins some.
const WORDS: usize = 200;
/// Atomics each client keeps outstanding (capped by the device's max_qp_rd_atom).
const WINDOW: usize = 16;
/// B's region: the counter at offset 0, the CMP_AND_SWAP words from offset 8.
const COUNTER: usize = 0;
const CAS_BASE: usize = 8;

/// INIT → RTR → RTS towards `remote` with `rd_atomic` outstanding READ/atomics both
/// ways (IBV_QP_MAX_DEST_RD_ATOMIC / IBV_QP_MAX_QP_RD_ATOMIC; the pingpong helpers use 1,
/// which would serialize the requester and hide a responder race).
fn connect(qp: &mut QueuePair, remote: &QpEndpoint, my_psn: u32, rd_atomic: u8) {
    qp.to_init(AccessFlags::ALL).expect("init");
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qp_num: Some(remote.qpn),
        rq_psn: Some(remote.psn),
        ah_attr: Some(AhAttr {
            dgid: remote.gid,
            sgid_index: verbs_api::gid::ADDRESS_GID_INDEX as u8,
            hop_limit: 1,
            traffic_class: 0,
            udp_port: remote.udp_port,
        }),
        max_dest_rd_atomic: Some(rd_atomic),
        min_rnr_timer: Some(12),
        ..QpAttr::default()
    })
    .expect("rtr");
    qp.modify(&QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(my_psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(rd_atomic),
        ..QpAttr::default()
    })
    .expect("rts");
}

fn rc_qp(pd: &verbs_api::ProtectionDomain, cq: &CompletionQueue) -> verbs_api::Result<QueuePair> {
    pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 2 * WINDOW as u32,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
}

/// Waits (bounded by [`WAIT`]) until `n` parties called this on `gate`, so that the
/// clients start each phase together; a party that panicked before arriving makes the
/// others fail instead of hang.
fn rendezvous(gate: &AtomicUsize, n: usize) {
    gate.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while gate.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "the other client never arrived");
        std::thread::yield_now();
    }
}

/// One client's queue pair, its completion queue and the region that receives the
/// original values.
struct Client {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

impl Client {
    /// Posts `n` signaled atomics (`op(i)`, original value into 8-byte slot `base + i`
    /// of the region), at most [`WINDOW`] outstanding, and checks every completion's
    /// fields. Returns the original values in posting order.
    fn run(
        &mut self,
        base: usize,
        n: usize,
        op: impl Fn(usize) -> WrOpcode,
        want: WcOpcode,
    ) -> Vec<u64> {
        let slot = |i: usize| (base + i) * 8;
        for i in 0..n {
            self.mr.write(slot(i), &u64::MAX.to_ne_bytes());
        }
        let (mut posted, mut done) = (0, 0);
        while done < n {
            while posted < n && posted - done < WINDOW {
                let sge = [self.mr.sge(slot(posted), 8)];
                self.qp
                    .post_send(&[SendWr::new(posted as u64, op(posted), &sge).signaled()])
                    .expect("post atomic");
                posted += 1;
            }
            let c = poll_one(&mut self.cq);
            // An RC send queue completes its work requests in order (IBTA 9.5).
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.byte_len, c.qp_num),
                (done as u64, WcStatus::Success, want, 8, self.qp.qp_num()),
                "{c:?}"
            );
            done += 1;
        }
        // Every slot was written: the sentinel u64::MAX is not a value either test
        // can produce.
        (0..n)
            .map(|i| u64::from_ne_bytes(self.mr.read_array(slot(i))))
            .collect()
    }
}

/// What one client thread saw.
struct ClientResult {
    /// Original counter values of its FETCH_ADDs, in posting order.
    adds: Vec<u64>,
    /// Original values of its CMP_AND_SWAPs, indexed by word.
    swaps: Vec<u64>,
}

#[test]
fn concurrent_atomics_from_two_qps_are_atomic() {
    let a = NicProc::start("atom-a", "127.0.0.43", 0, &[]);
    let b = NicProc::start("atom-b", "127.0.0.44", 0, &[]);

    // NIC B: one context, one region (counter + CAS words), one QP per client.
    let ctx_b = Device::open(&b.name).expect("open b");
    let rd_atomic = ctx_b.attributes().max_qp_rd_atom.clamp(1, WINDOW as u32) as u8;
    let pd_b = ctx_b.alloc_pd().expect("pd b");
    let mr_b = pd_b
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
        .expect("mr b");
    assert!(CAS_BASE + 8 * WORDS <= mr_b.len());
    let cq_b = ctx_b.create_cq(64).expect("cq b");
    let (addr_b, rkey_b) = (mr_b.addr(), mr_b.rkey());

    let gate = AtomicUsize::new(0);
    let mut qps_b = Vec::new();
    let results: Vec<ClientResult> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for id in 0..CLIENTS {
            // The client sends its QPN, gets B's endpoint back.
            let (to_main, from_client) = mpsc::channel::<QpEndpoint>();
            let (to_client, from_main) = mpsc::channel::<QpEndpoint>();
            let (a, gate) = (&a, &gate);
            handles.push(s.spawn(move || {
                let ctx = Device::open(&a.name).expect("open a");
                let pd = ctx.alloc_pd().expect("pd a");
                let mr = pd
                    .alloc_mr(8 * (ADDS + WORDS), AccessFlags::LOCAL_WRITE)
                    .expect("mr a");
                let cq = ctx.create_cq(4 * WINDOW as u32).expect("cq a");
                let qp = rc_qp(&pd, &cq).expect("qp a");
                let mut c = Client { qp, cq, mr };
                // Requests' PSNs wrap around 2^24 part way through the FETCH_ADDs.
                let my_psn = 0xFF_F000 + 0x100 * id as u32;
                to_main
                    .send(a.endpoint(c.qp.qp_num(), my_psn))
                    .expect("send");
                let remote = from_main.recv_timeout(WAIT).expect("B endpoint");
                connect(&mut c.qp, &remote, my_psn, rd_atomic);

                rendezvous(gate, CLIENTS);
                let adds = c.run(
                    0,
                    ADDS,
                    |_| WrOpcode::AtomicFetchAndAdd {
                        remote_addr: addr_b + COUNTER as u64,
                        rkey: rkey_b,
                        add: 1,
                    },
                    WcOpcode::FetchAdd,
                );

                rendezvous(gate, 2 * CLIENTS);
                let word_of = |i: usize| if id % 2 == 0 { i } else { WORDS - 1 - i };
                let in_order = c.run(
                    ADDS,
                    WORDS,
                    |i| WrOpcode::AtomicCmpAndSwp {
                        remote_addr: addr_b + (CAS_BASE + 8 * word_of(i)) as u64,
                        rkey: rkey_b,
                        compare: 0,
                        swap: id as u64 + 1,
                    },
                    WcOpcode::CompSwap,
                );
                let mut swaps = vec![0; WORDS];
                for (i, v) in in_order.into_iter().enumerate() {
                    swaps[word_of(i)] = v;
                }
                ClientResult { adds, swaps }
            }));
            let ep = from_client.recv_timeout(WAIT).expect("client endpoint");
            let mut qp = rc_qp(&pd_b, &cq_b).expect("qp b");
            let psn_b = 0x1000 * (id as u32 + 1);
            connect(&mut qp, &ep, psn_b, rd_atomic);
            to_client
                .send(b.endpoint(qp.qp_num(), psn_b))
                .expect("send");
            qps_b.push(qp);
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });

    // FETCH_ADD: the exact sum, and every original value 0..N handed out exactly once.
    let total = (CLIENTS * ADDS) as u64;
    let counter = mr_b
        .atomic_u64(COUNTER)
        .expect("counter")
        .load(Ordering::SeqCst);
    assert_eq!(counter, total, "counter after {total} FETCH_ADD(+1)s");
    let mut all: Vec<u64> = results
        .iter()
        .flat_map(|r| r.adds.iter().copied())
        .collect();
    all.sort_unstable();
    assert!(
        all.iter().copied().eq(0..total),
        "original values are not exactly 0..{total}: first mismatch at {:?}",
        all.iter().zip(0..).find(|(v, i)| **v != *i)
    );
    // One QP's atomics execute in PSN order at the responder (IBTA 9.5).
    for (id, r) in results.iter().enumerate() {
        assert!(
            r.adds.windows(2).all(|w| w[0] < w[1]),
            "client {id}: originals not increasing"
        );
    }
    // How often the two QPs' adds interleaved (a handoff between clients in value
    // order); informational — on a loaded host one may finish before the other starts.
    let mut owner = vec![0usize; total as usize];
    for (id, r) in results.iter().enumerate() {
        for &v in &r.adds {
            owner[v as usize] = id;
        }
    }
    let handoffs = owner.windows(2).filter(|w| w[0] != w[1]).count();

    // CMP_AND_SWAP race: on every word exactly one client saw 0 (and won), the other
    // saw the winner's id; the word holds the winner's id.
    let mut wins = [0usize; CLIENTS];
    for w in 0..WORDS {
        let word = mr_b
            .atomic_u64(CAS_BASE + 8 * w)
            .expect("cas word")
            .load(Ordering::SeqCst);
        let seen: Vec<u64> = results.iter().map(|c| c.swaps[w]).collect();
        let winners: Vec<usize> = (0..CLIENTS).filter(|&i| seen[i] == 0).collect();
        assert_eq!(winners.len(), 1, "word {w}: originals {seen:?}, now {word}");
        let won = winners[0];
        assert_eq!(word, won as u64 + 1, "word {w} holds the winner's id");
        for (i, &v) in seen.iter().enumerate() {
            if i != won {
                assert_eq!(v, won as u64 + 1, "word {w}: loser {i} saw the winner's id");
            }
        }
        wins[won] += 1;
    }
    eprintln!(
        "{total} FETCH_ADDs from {CLIENTS} QPs ({handoffs} handoffs between QPs), \
         {WORDS} CMP_AND_SWAP words won {wins:?}, rd_atomic {rd_atomic}"
    );
    assert_eq!(b.stat("rx_drop_bad_icrc"), 0);
    drop(qps_b);
}
