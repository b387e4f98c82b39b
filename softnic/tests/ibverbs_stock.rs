//! Unmodified Debian binaries (ibverbs-utils, perftest) on softnic's drop-in
//! `libibverbs.so.1`, started through `softnic exec` as a user would.
//!
//! These tests FAIL (never skip) when a stock binary, the C compiler or the rdma-core
//! headers are missing: `.ci/run` installs `ibverbs-utils`, `perftest` and
//! `libibverbs-dev`.

mod nic_support;
mod prereq;
mod stock_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nic_support::{softnic_dir, NicProc};
use stock_support::{tcp_port, text};

/// `softnic exec [ARGS…]` with this test's `$SOFTNIC_DIR`.
fn exec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softnic"))
        .arg("exec")
        .args(args)
        .env("SOFTNIC_DIR", softnic_dir())
        .env_remove(softnic::exec::LIB_DIR_ENV)
        .output()
        .expect("run softnic exec")
}

/// A stock binary, which must be installed.
fn stock(name: &str) -> PathBuf {
    stock_support::stock(name, "ibverbs-utils and perftest")
}

fn guid_hex(nic: &NicProc) -> String {
    format!(
        "{:016x}",
        verbs_api::gid::node_guid(std::net::SocketAddr::new(nic.addr, nic.port))
    )
}

#[test]
fn ibv_devices_lists_running_nics_only() {
    let a = NicProc::start("ibvstock-a", "127.0.0.1", 0, &[]);
    let b = NicProc::start("ibvstock-b", "127.0.0.1", 0, &[]);
    // A socket nobody listens on (a NIC that died) is not a device.
    let stale = softnic_dir().join("ibvstock-dead.sock");
    let _ = std::fs::remove_file(&stale);
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let bin = stock("ibv_devices");
    let o = exec(&["--", bin.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for nic in [&a, &b] {
        let line = format!("{}\t{}", nic.name, guid_hex(nic));
        assert!(
            String::from_utf8_lossy(&o.stdout).lines().any(|l| l
                .split_whitespace()
                .collect::<Vec<_>>()
                .join("\t")
                == line),
            "no line `{line}`:\n{out}"
        );
    }
    assert!(!out.contains("ibvstock-dead"), "{out}");
    // -d limits the list.
    let o = exec(&["-d", "ibvstock-b", "--", bin.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success() && out.contains("ibvstock-b"), "{out}");
    assert!(!out.contains("ibvstock-a"), "{out}");
}

/// A second NIC started under the name of one that runs is refused at its start: the
/// stock programs find a device by name (its socket in `$SOFTNIC_DIR`), so two tests
/// of this binary whose NICs shared a name would use one test's NICs for both, until
/// the first test to end stopped them under the other (`stock_perftest_over_xrc` and
/// `xrc_through_the_c_abi` both had `ibvstock-xrc`: "Did not detect devices",
/// "Couldn't allocate MR", "Couldn't destroy XRC domain").
#[test]
fn a_nic_name_in_use_cannot_be_started_again() {
    let first = NicProc::start("ibvstock-dup", "127.0.0.1", 0, &[]);
    let second = std::panic::catch_unwind(|| NicProc::start("ibvstock-dup", "127.0.0.1", 0, &[]));
    let msg = match second {
        Ok(nic) => panic!("a second NIC named ibvstock-dup started: port {}", nic.port),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(msg.contains("NIC name ibvstock-dup is taken"), "{msg}");
    let server = first.pid().map(|p| p.to_string()).unwrap_or_default();
    assert!(msg.contains(&server), "{msg}");
}

#[test]
fn ibv_devinfo_verbose_describes_the_nic() {
    let nic = NicProc::start("ibvstock-info", "127.0.0.1", 0, &[]);
    let bin = stock("ibv_devinfo");
    let o = exec(&["-d", &nic.name, "--", bin.to_str().unwrap(), "-v"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let g = guid_hex(&nic);
    let guid = format!("{}:{}:{}:{}", &g[0..4], &g[4..8], &g[8..12], &g[12..16]);
    let ll = verbs_api::gid::gid_table(std::net::SocketAddr::new(nic.addr, nic.port))[0];
    for want in [
        format!("hca_id:\t{}", nic.name),
        "transport:\t\t\tInfiniBand (0)".to_string(),
        format!("node_guid:\t\t\t{guid}"),
        "vendor_id:\t\t\t0xffffff".to_string(),
        "phys_port_cnt:\t\t\t1".to_string(),
        "atomic_cap:\t\t\tATOMIC_HCA (1)".to_string(),
        "state:\t\t\tPORT_ACTIVE (4)".to_string(),
        "link_layer:\t\tEthernet".to_string(),
        "gid_tbl_len:\t\t1024".to_string(),
        // What softnic does (query.rs DEVICE_CAP_FLAGS): no flag for what it does not.
        "device_cap_flags:\t\t0x01121800".to_string(),
        "max_srq:\t\t\t4096".to_string(),
        "max_srq_wr:\t\t\t32768".to_string(),
        "max_srq_sge:\t\t\t4".to_string(),
        "max_ah:\t\t\t\t2147483647".to_string(),
        "max_msg_sz:\t\t0x7fffff00".to_string(),
        format!("GID[  0]:\t\t{ll}, RoCE v2"),
        "GID[  1]:\t\t::ffff:127.0.0.1, RoCE v2".to_string(),
    ] {
        assert!(out.contains(&want), "missing `{want}`:\n{out}");
    }
}

/// Two NICs at the RoCEv2 port (`stock_support::nic_pair`).
fn nic_pair(tag: &str, host: u8) -> (NicProc, NicProc) {
    stock_support::nic_pair(100, tag, host)
}

/// Runs stock `prog -p PORT ARGS` as server on `server` and as client on `client`
/// (through `softnic exec -d`), the client connecting to 127.0.0.1:PORT; both must
/// succeed. Returns both outputs (`stock_support::pair_run_with`).
fn pair_run(
    prog: &str,
    server: &NicProc,
    client: &NicProc,
    port: u16,
    args: &[&str],
) -> (String, String) {
    let bin = stock(prog);
    let side = |nic: &NicProc, p: &str, peer: Option<&str>| {
        let mut c = stock_support::exec_on(nic, &bin);
        c.args(["-p", p]).args(args).args(peer);
        c
    };
    stock_support::pair_run_with(
        &format!("{prog} {args:?}"),
        &|p| side(server, p, None),
        &|p| side(client, p, Some("127.0.0.1")),
        port,
    )
}

/// Stock `ibv_rc_pingpong` between two softnic NICs, both ways, with rdma-core's own
/// data check (`-c`), in event mode (`-e`: completion channels) and busy-polling, at
/// sizes 1, 4096 and 65536 and path MTUs 1024 and 4096, with the `ibv_wr_*` post
/// API (`-N`), with on-demand paging (`-o`) and implicit ODP (`-o -O`), with device
/// memory (`-j`), and with completion timestamps (`-t`, [`check_timestamp_spacing`]).
#[test]
fn stock_rc_pingpong_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-rc", 2);
    for (srv, cli, args) in [
        (&a, &b, vec!["-e", "-c", "-n", "100"]),
        (&b, &a, vec!["-e", "-c", "-n", "100"]),
        (&a, &b, vec!["-e", "-c", "-n", "20", "-s", "65536"]),
        (
            &b,
            &a,
            vec!["-e", "-c", "-n", "50", "-s", "1", "-m", "1024"],
        ),
        (
            &a,
            &b,
            vec!["-e", "-c", "-n", "20", "-s", "4096", "-m", "1024"],
        ),
        (&b, &a, vec!["-c", "-n", "5"]),
        // The ibv_wr_* post API (ibv_create_qp_ex with send-ops flags).
        (&a, &b, vec!["-N", "-e", "-c", "-n", "50"]),
        (
            &b,
            &a,
            vec!["-N", "-e", "-c", "-n", "20", "-s", "65536", "-m", "1024"],
        ),
        // Path MTU 4096 (the NIC's own MTU): 8 KiB messages are two full packets.
        (
            &a,
            &b,
            vec!["-e", "-c", "-n", "20", "-s", "8192", "-m", "4096"],
        ),
        // On-demand paging (`-o`: the buffer registered with IBV_ACCESS_ON_DEMAND, after
        // checking the device's ODP capabilities) and implicit ODP (`-O`: one MR for
        // the whole address space).
        (&b, &a, vec!["-o", "-c", "-n", "50"]),
        (&a, &b, vec!["-o", "-O", "-c", "-n", "50", "-s", "8192"]),
        // Device memory (`-j`: the buffer in an ibv_alloc_dm allocation, registered
        // with ibv_reg_dm_mr, zero-based, filled with ibv_memcpy_to_dm).
        (&a, &b, vec!["-j", "-c", "-n", "50"]),
        // Completion timestamps (`-t`: an extended CQ with
        // IBV_WC_EX_WITH_COMPLETION_TIMESTAMP; it prints the receive completions'
        // spacing in clock cycles of `hca_core_clock`).
        (&b, &a, vec!["-t", "-c", "-n", "100"]),
    ] {
        let mut all = vec!["-g", "1"];
        all.extend_from_slice(&args);
        let (s, c) = pair_run("ibv_rc_pingpong", srv, cli, tcp_port(), &all);
        let n = args[args.iter().position(|x| *x == "-n").unwrap() + 1];
        for out in [&s, &c] {
            assert!(out.contains(&format!("{n} iters in")), "{out}");
            if args.contains(&"-t") {
                check_timestamp_spacing(out);
            }
        }
        assert!(
            c.contains(&format!("GID {}", verbs_api::Gid::from_ip(srv.addr))),
            "{c}"
        );
    }
}

/// `ibv_rc_pingpong -t`'s output: the average spacing of receive completions, in
/// cycles of the 1 GHz completion clock, is the round trip it printed per iteration (in
/// µs), within a factor of 4 both ways — the timestamps count nanoseconds. A wrong unit
/// (µs, ticks) or a clock that stands still is off by 1000 or is 0.
fn check_timestamp_spacing(out: &str) {
    let value = |key: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{key}:\n{out}"));
        let v = if key == "usec/iter" {
            line.split(" = ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
        } else {
            line.rsplit(" = ").next()
        };
        v.and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    let avg_ns = value("Average receive completion clock cycles");
    let iter_ns = value("usec/iter") * 1000.0;
    assert!(
        avg_ns > iter_ns / 4.0 && avg_ns < iter_ns * 4.0,
        "receive completions {avg_ns} ns apart against {iter_ns} ns per iteration:\n{out}"
    );
}

/// `tests/ibverbs/timestamps.c`: completion timestamps through the C ABI between two
/// NICs — the 64-bit 1 GHz clock `ibv_query_device_ex` reports, `ibv_query_rt_values_ex`
/// reading `CLOCK_MONOTONIC`, and for 20 SENDs each send and receive completion's
/// `ibv_wc_read_completion_ts` between `CLOCK_MONOTONIC` before the post and after the
/// poll, never backwards, its wall-clock reading within a second of `CLOCK_REALTIME`.
#[test]
fn completion_timestamps_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-ts", 44);
    let exe = compile_c("timestamps", &[]);
    run_c_pair(&exe, &a, &b, None);
}

/// Stock `ibv_uc_pingpong` (unreliable connection) between two softnic NICs.
#[test]
fn stock_uc_pingpong_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-uc", 4);
    let (s, c) = pair_run(
        "ibv_uc_pingpong",
        &a,
        &b,
        tcp_port(),
        &["-g", "1", "-e", "-c", "-n", "50"],
    );
    assert!(
        s.contains("50 iters in") && c.contains("50 iters in"),
        "{s}\n{c}"
    );
}

/// Stock `ibv_ud_pingpong` between two softnic NICs, both ways (the receive buffers
/// start with the 40-byte GRH).
#[test]
fn stock_ud_pingpong_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-ud", 10);
    for (srv, cli) in [(&a, &b), (&b, &a)] {
        let (s, c) = pair_run(
            "ibv_ud_pingpong",
            srv,
            cli,
            tcp_port(),
            &["-g", "1", "-e", "-c", "-n", "50", "-s", "1024"],
        );
        assert!(
            s.contains("50 iters in") && c.contains("50 iters in"),
            "{s}\n{c}"
        );
    }
}

/// Stock `ibv_srq_pingpong` (4 QPs sharing one SRQ, rdma-core's data check) and
/// perftest's `ib_send_bw --use-srq` between two softnic NICs, one each way.
#[test]
fn stock_srq_programs_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-srq", 12);
    let (s, c) = pair_run(
        "ibv_srq_pingpong",
        &a,
        &b,
        tcp_port(),
        &["-g", "1", "-q", "4", "-c", "-n", "50"],
    );
    assert!(
        s.contains("50 iters in") && c.contains("50 iters in"),
        "{s}\n{c}"
    );
    let (s, c) = pair_run(
        "ib_send_bw",
        &b,
        &a,
        tcp_port(),
        &["-x", "1", "-F", "--use-srq", "-s", "4096", "-n", "50"],
    );
    assert!(c.contains("#bytes"), "no result table\n{c}");
    for out in [&s, &c] {
        assert!(out.contains("Using SRQ      : ON"), "{out}");
    }
}

/// perftest's UD multicast, `ib_send_bw -c UD -g`: the server attaches its QP to the
/// group with `ibv_attach_mcast`, the client sends to it (QPN 0xFFFFFF). The group is
/// given as an IPv4-mapped MGID (`-M`, 16 decimal bytes): perftest refuses its default
/// IPv6-style MGID with an IPv4 GID ("Incompatibility issue with GID types"), on rxe
/// too. The server counts every message it was sent.
#[test]
fn stock_ib_send_bw_to_a_multicast_group() {
    let (a, b) = nic_pair("ibvstock-mcg", 38);
    let pid = std::process::id();
    let (x, y) = (150 + pid % 50, 1 + (pid / 100) % 250);
    let mgid = format!("0:0:0:0:0:0:0:0:0:0:255:255:239:{x}:{y}:38");
    let args = [
        "-x", "1", "-c", "UD", "-g", "-M", &mgid, "-s", "1024", "-n", "200",
    ];
    let (s, c) = pair_run("ib_send_bw", &a, &b, tcp_port(), &args);
    let shown = format!("MGID: 00:00:00:00:00:00:00:00:00:00:255:255:239:{x:02}:{y:02}:38");
    for out in [&s, &c] {
        assert!(out.contains(&shown) && out.contains("#bytes"), "{out}");
    }
    assert!(c.contains("remote address: LID 0000 QPN 0xffffff"), "{c}");
}

/// Runs a C test program `EXE A B [MODE]` on the two NICs through `softnic exec`; it
/// must exit 0 with `ok` as its last line.
fn run_c_pair(exe: &Path, a: &NicProc, b: &NicProc, mode: Option<&str>) -> String {
    let mut args = vec!["-d", &a.name, "-d", &b.name, "--", exe.to_str().unwrap()];
    args.extend([a.name.as_str(), b.name.as_str()]);
    args.extend(mode);
    let o = exec(&args);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).lines().last() == Some("ok"),
        "{mode:?}: {}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `tests/ibverbs/srq.c` through the C ABI between two NICs: SRQ create / query /
/// modify (the limit; resizing is EOPNOTSUPP) / post / destroy (EBUSY with a QP on
/// it), SENDs landing in SRQ buffers in order, the SRQ limit event on `async_fd` and
/// `ibv_get_async_event`, and `ibv_init_ah_from_wc` / `ibv_create_ah_from_wc` on IPv4
/// and IPv6 GRHs.
#[test]
fn srq_verbs_and_limit_event_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-srqc", 14);
    let exe = compile_c("srq", &[]);
    run_c_pair(&exe, &a, &b, None);
}

/// `tests/ibverbs/async.c` through the C ABI between two NICs: a SEND longer than the
/// peer's receive buffer raises IBV_EVENT_QP_REQ_ERR on the responder — `async_fd`
/// readable, `ibv_get_async_event` naming the program's `ibv_qp`, `ibv_ack_async_event`
/// counting it, once (EAGAIN after) — and nothing on the requester; a forked child
/// that closes its copy of the context neither hangs nor stops the parent's event
/// watcher. The library's
/// event watchers wait on the NIC's readiness pipe: the responder's context asks the
/// NIC once, for its one event, and the requester's, idle with a QP for over 600 ms
/// (the program's two 300 ms waits), never (a watcher that polled every 10 ms asked
/// some 60 times each).
#[test]
fn qp_error_event_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-async", 24);
    let exe = compile_c("async", &[]);
    let out = run_c_pair(&exe, &a, &b, None);
    assert!(out.contains("event 2 "), "{out}");
    assert_eq!(a.stat("async_event_requests"), 0, "the idle context asked");
    assert_eq!(b.stat("async_event_requests"), 1, "one event, one request");
}

/// `tests/ibverbs/fork.c`: a child after `fork()` that posts on the parent's QP,
/// polls its CQ or writes its registered buffer dies by SIGSEGV (rings and MRs are
/// `MADV_DONTFORK`), and the parent's QP, CQ and bytes are intact afterwards.
#[test]
fn a_forked_child_cannot_touch_the_parents_rings_or_mrs() {
    let (a, b) = nic_pair("ibvstock-fork", 16);
    let exe = compile_c("fork", &[]);
    for mode in ["post", "poll", "mr"] {
        run_c_pair(&exe, &a, &b, Some(mode));
    }
}

/// `tests/ibverbs/odp.c`: on-demand paging through the C ABI between two NICs — the
/// ODP capabilities; an ODP MR over a range not mapped at registration (a plain MR
/// there is EFAULT), mapped afterwards and sent from; a RECV into never-touched
/// pages; RDMA WRITE into and READ out of ODP memory; an implicit MR (NULL, SIZE_MAX)
/// carrying SENDs from the heap and the stack; `ibv_advise_mr` faulting exactly the
/// advised pages in (mincore) and its EFAULT/EINVAL/EOPNOTSUPP answers; `fork()`
/// while registered (the child reads and writes the buffer); and a SEND from a range
/// unmapped after registration completing with an error.
#[test]
fn on_demand_paging_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-odp", 42);
    let exe = compile_c("odp", &[]);
    println!("{}", run_c_pair(&exe, &a, &b, None));
}

/// `tests/ibverbs/parent_domain.c`: thread and parent domains through the C ABI
/// between two NICs — `ibv_alloc_td` and `ibv_alloc_parent_domain` and their EINVAL
/// answers, the PD and TD EBUSY beneath a live parent domain, an extended CQ with the
/// parent domain, SENDs and an RDMA WRITE from a QP on the parent domain with MRs on
/// it and on the plain PD beneath, every byte checked, the allocators not called, and
/// everything freed in order.
#[test]
fn parent_domains_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-pdom", 46);
    let exe = compile_c("parent_domain", &[]);
    run_c_pair(&exe, &a, &b, None);
}

/// `tests/ibverbs/xrc.c`: XRC through the C ABI between two NICs — `ibv_open_xrcd`
/// (shared by two opens of one file; EINVAL, EOPNOTSUPP, EBADF, EAGAIN and O_EXCL's
/// EINVAL), XRC SRQs from `ibv_create_srq_ex` with `ibv_get_srq_num`, XRC_SEND and
/// XRC_RECV QPs from `ibv_create_qp_ex` connected both ways with the kernel's masks;
/// SENDs (with immediate data, inline), an RDMA WRITE, READ and FETCH_AND_ADD naming
/// the remote SRQ, each receive completing on the SRQ's CQ with the XRC_RECV QP's
/// number; `ibv_wr_set_xrc_srqn`; post_recv on XRC QPs refused; `ibv_close_xrcd`, the
/// SRQ's CQ and PD EBUSY while in use, then everything freed.
#[test]
fn xrc_through_the_c_abi() {
    let (a, b) = nic_pair("ibvstock-xrc", 48);
    let exe = compile_c("xrc", &[]);
    run_c_pair(&exe, &a, &b, None);
}

/// `tests/ibverbs/mr_matrix.c`: inline SENDs from unregistered stack memory
/// (`ibv_post_send` and `ibv_wr_set_inline_data`); `ibv_reg_mr` on memalign, mmap,
/// unaligned malloc, a struct field, a static buffer, sub-page and page-straddling
/// buffers, the stack (also with `fork()` while registered), SysV shm, `MAP_SHARED`
/// anonymous, `/dev/shm`, a shared file, read-only memory, hugepages (`MAP_HUGETLB`
/// and SysV `SHM_HUGETLB`; required under SOFTNIC_CI), after `fork()`, after free +
/// re-malloc, several live MRs on the same pages (same buffer twice, nested,
/// overlapping, running on past them, the first deregistered) and `madvise`, with
/// canaries around every buffer and a SEND or WRITE into each registered one; a WRITE
/// one byte past a sub-page MR refused; heap neighbours on a registered buffer's last
/// page written by another thread during a thousand registrations, none lost; and
/// the NIC's throughput into and out of a 1 MiB region per mechanism. Prints its
/// per-case lines (costs, throughputs) with `--nocapture`, and on failure.
#[test]
fn memory_registration_matrix_with_canaries() {
    let (a, b) = nic_pair("ibvstock-mrm", 18);
    let exe = compile_c("mr_matrix", &["-pthread"]);
    // Its per-case costs and throughputs (`--nocapture`), for docs/ibverbs.md.
    println!("{}", run_c_pair(&exe, &a, &b, None));
}

/// Stock perftest between two softnic NICs, half the cases each way: every RC test,
/// SEND over UD, WRITE and SEND over UC run to their result table (perftest itself
/// checks no data; `softnic perf --verify` and the pingpongs' `-c` do).
#[test]
fn stock_perftest_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-perf", 6);
    let cases: [(&str, &[&str]); 16] = [
        ("ib_write_bw", &["-s", "65536", "-n", "50"]),
        ("ib_read_bw", &["-s", "65536", "-n", "50"]),
        ("ib_send_bw", &["-s", "65536", "-n", "50"]),
        ("ib_atomic_bw", &["-n", "50"]),
        ("ib_atomic_bw", &["-A", "CMP_AND_SWAP", "-n", "50"]),
        ("ib_write_bw", &["-q", "4", "-s", "4096", "-n", "50"]),
        ("ib_send_bw", &["-e", "-s", "4096", "-n", "50"]),
        ("ib_write_lat", &["-s", "8", "-n", "20"]),
        ("ib_send_lat", &["-s", "8", "-n", "20"]),
        ("ib_read_lat", &["-s", "8", "-n", "20"]),
        ("ib_send_bw", &["-c", "UD", "-s", "1024", "-n", "50"]),
        ("ib_send_lat", &["-c", "UD", "-s", "8", "-n", "20"]),
        ("ib_write_bw", &["-c", "UC", "-s", "4096", "-n", "50"]),
        ("ib_send_bw", &["-c", "UC", "-s", "4096", "-n", "50"]),
        ("ib_atomic_lat", &["-n", "50"]),
        ("ib_atomic_lat", &["-A", "CMP_AND_SWAP", "-n", "50"]),
    ];
    for (i, (prog, args)) in cases.into_iter().enumerate() {
        let mut all = vec!["-x", "1", "-F"];
        all.extend_from_slice(args);
        let (srv, cli) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let (s, c) = pair_run(prog, srv, cli, tcp_port(), &all);
        // The client always prints the result table (a READ latency server is passive).
        assert!(
            c.contains("#bytes"),
            "{prog} {args:?}: no result table\n{c}"
        );
        for out in [&s, &c] {
            assert!(out.contains("GID index       : 1"), "{out}");
        }
    }
}

/// Stock `ib_write_bw`, `ib_read_bw` and `ib_send_bw` with `-a` (every size perftest
/// runs, 2 B to 8 MiB) between two softnic NICs, alternating directions: the client
/// must print a result row for each size, so one size that fails or stalls fails the
/// test. `-n 5` keeps the 8 MiB rows cheap. (perftest refuses `-a` for `ib_atomic_bw`:
/// "Message size cannot be changed for Atomic tests"; both atomics run at their one
/// 8-byte size in `stock_perftest_between_two_nics`.)
#[test]
fn stock_perftest_all_sizes_between_two_nics() {
    let (a, b) = nic_pair("ibvstock-all", 22);
    let sizes: Vec<u64> = (1..=23).map(|k| 1u64 << k).collect();
    for (i, prog) in ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
        .into_iter()
        .enumerate()
    {
        let args = ["-x", "1", "-F", "-a", "-n", "5"];
        let (srv, cli) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let (s, c) = pair_run(prog, srv, cli, tcp_port(), &args);
        // #bytes #iterations BW-peak BW-average MsgRate
        let rows: Vec<u64> = c
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() == 5 && f[1] == "5")
            .filter_map(|f| f[0].parse().ok())
            .collect();
        assert_eq!(rows, sizes, "{prog} -a: result rows\n{c}\nserver:\n{s}");
    }
}

/// Stock `ib_write_bw -q 1000`: perftest puts every QP's send completions on one CQ
/// of `tx_depth` × QPs entries (128,000 here), above a work queue's 32,768
/// (`MAX_RING_ENTRIES`), where it failed with "Couldn't create CQ" until CQs got a
/// limit of their own (`MAX_CQ_ENTRIES`, the device's `max_cqe`). `-n 100`: Debian's
/// perftest 4.5-0.17 counts `cq_mod` (100) per completion, so with a QP count above 1
/// an iteration count that is not a multiple of it can leave the run spinning without
/// polling (fixed upstream in perftest 5ff3afa); `-N` skips perftest's own BW-peak
/// search, which tries every pair of post and completion (100,000² here).
#[test]
fn stock_perftest_with_a_thousand_qps() {
    let (a, b) = nic_pair("ibvstock-kqp", 30);
    let args = ["-x", "1", "-F", "-q", "1000", "-s", "8", "-n", "100", "-N"];
    let (s, c) = pair_run("ib_write_bw", &a, &b, tcp_port(), &args);
    // #bytes #iterations BW-peak BW-average MsgRate: one row, all QPs' messages.
    let row = c
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 5 && f[0] == "8");
    assert_eq!(
        row.map(|f| f[1]),
        Some("100000"),
        "ib_write_bw -q 1000: result row\n{c}\nserver:\n{s}"
    );
}

/// Completion events as rxe gives them (`tests/ibverbs/cq_events.c`): an arm raises an
/// event for the CQ's next completion only, never for completions already waiting,
/// and a CQ not re-armed raises none.
#[test]
fn cq_events_arm_for_the_next_completion_as_rxe() {
    let (a, _b) = nic_pair("ibvstock-cqev", 32);
    c_program_passes(&a, "cq_events", &[], "ok");
}

/// Destroying an object with events out, as rdma-core does it
/// (`tests/ibverbs/destroy_waits.c`): `ibv_destroy_cq` waits for the acknowledgement of
/// a completion event another thread still holds, `ibv_destroy_qp` for that of an
/// asynchronous event, and a QP's event not taken yet is dropped at its destroy
/// instead of naming the freed QP later.
#[test]
fn destroy_waits_for_the_events_taken_and_drops_the_rest() {
    let (a, _b) = nic_pair("ibvstock-destroy", 50);
    let exe = compile_c("destroy_waits", &["-lpthread"]);
    let o = stock_support::exec_on(&a, &exe)
        .arg(&a.name)
        .output()
        .expect("run softnic exec");
    assert!(
        o.status.success() && text(&o).contains("ok"),
        "{}",
        text(&o)
    );
}

/// Stock perftest over XRC (`-c XRC`): perftest makes an XRC domain, XRC SRQs and one
/// XRC send and one XRC receive QP per connection, passes RC's attribute masks to both
/// halves (which `ibv_modify_qp` must ignore where a half lacks them, as the kernel's
/// `modify_qp_mask` does), and names the peer's SRQ in every work request. SEND,
/// WRITE, READ and atomics, bandwidth and latency, one and four QPs, both directions.
#[test]
fn stock_perftest_over_xrc() {
    let (a, b) = nic_pair("ibvstock-xrcperf", 52);
    let cases: [(&str, &[&str]); 6] = [
        ("ib_send_bw", &["-n", "200"]),
        ("ib_send_bw", &["-q", "4", "-n", "100"]),
        ("ib_write_bw", &["-n", "200"]),
        ("ib_read_bw", &["-n", "200"]),
        ("ib_atomic_bw", &["-n", "200"]),
        ("ib_send_lat", &["-s", "8", "-n", "200"]),
    ];
    for (i, (prog, args)) in cases.into_iter().enumerate() {
        let mut all = vec!["-c", "XRC", "-x", "1", "-F"];
        all.extend_from_slice(args);
        let (srv, cli) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let (s, c) = pair_run(prog, srv, cli, tcp_port(), &all);
        assert!(
            c.contains("#bytes") && c.contains("Connection type : XRC") && !c.contains("Couldn't"),
            "{prog} {args:?} -c XRC: client\n{c}\nserver:\n{s}"
        );
    }
}

/// Stock perftest latency tests with completion events (`-e`), both directions.
/// perftest 4.5 acks each event, re-arms that CQ and polls it once, with one channel
/// for its send and receive CQs; while `ibv_req_notify_cq` raised an event at once for
/// completions already waiting, every completion gave a second event that woke the
/// wrong wait, and `ib_send_lat -e` failed within ~40 iterations ("Couldn't post
/// send: scnt=36").
#[test]
fn stock_perftest_latency_with_completion_events() {
    let (a, b) = nic_pair("ibvstock-lat-e", 34);
    let cases: [(&str, &[&str]); 4] = [
        ("ib_send_lat", &["-s", "8", "-n", "300"]),
        ("ib_send_lat", &["-c", "UD", "-s", "8", "-n", "300"]),
        ("ib_atomic_lat", &["-n", "300"]),
        ("ib_read_lat", &["-s", "8", "-n", "300"]),
    ];
    for (i, (prog, args)) in cases.into_iter().enumerate() {
        let mut all = vec!["-x", "1", "-F", "-e"];
        all.extend_from_slice(args);
        let (srv, cli) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let (s, c) = pair_run(prog, srv, cli, tcp_port(), &all);
        assert!(
            c.contains("#bytes") && !c.contains("Couldn't"),
            "{prog} {args:?} -e: client\n{c}\nserver:\n{s}"
        );
    }
}

/// Signals reach the program as with rdma-core (`tests/ibverbs/signals.c`): a
/// process-directed SIGALRM runs the program's handler on its own thread, never on
/// the library's event watcher (which blocks every signal), and interrupts a blocked
/// `ibv_get_cq_event` with EINTR when the handler lacks SA_RESTART, while a
/// SA_RESTART handler leaves the wait to go on until the CQ's event; likewise a
/// blocked `rdma_get_cm_event` (through softnic's librdmacm). qperf ends each
/// timed test so; without both, its `rc_rdma_write_lat` hung in the wait now and then
/// ("failed to receive synchronization after test").
#[test]
fn signals_interrupt_a_completion_wait_as_with_rdma_core() {
    let (a, _b) = nic_pair("ibvstock-sig", 26);
    c_program_passes(&a, "signals", &["-pthread", "-lrdmacm"], "ok ");
}

/// Compiles `tests/ibverbs/NAME.c` (with `cflags`), runs it through `softnic exec` on
/// `nic` with the device's name as its argument, and asserts that it exits 0 printing
/// `want`.
fn c_program_passes(nic: &NicProc, name: &str, cflags: &[&str], want: &str) {
    let exe = compile_c(name, cflags);
    let o = stock_support::exec_on(nic, &exe)
        .arg(&nic.name)
        .output()
        .expect("run softnic exec");
    assert!(
        o.status.success() && text(&o).contains(want),
        "{}",
        text(&o)
    );
}

/// A C program whose NIC dies (SIGKILL, while the NIC slept and had asked to be
/// woken) survives its next post (`tests/ibverbs/nic_gone.c`): the wake-up the post
/// makes gets an error (EIO: the NIC's life sign), not a SIGPIPE that would kill it (Rust
/// programs ignore SIGPIPE, C programs do not; rdma-core's libraries never raise one); a
/// loop polling its empty
/// CQ gets a negative `ibv_poll_cq` (it spun for ever before session 26); and its
/// `async_fd` delivers `IBV_EVENT_DEVICE_FATAL`, as a kernel device's removal does.
#[test]
fn a_post_after_the_nic_died_does_not_kill_the_program() {
    let exe = compile_c("nic_gone", &[]);
    // Once with hybrid polling, once spinning as on hardware: the poll itself reads the
    // NIC's life sign, whatever happens between polls.
    nic_gone_run(&exe, "ibvstock-gone", 28, None);
    nic_gone_run(&exe, "ibvstock-gone-spin", 36, Some("0"));
}

/// One run of `nic_gone.c` (see [`a_post_after_the_nic_died_does_not_kill_the_program`])
/// with `SOFTNIC_IBV_POLL_YIELD` set to `poll_yield` if given.
fn nic_gone_run(exe: &Path, tag: &str, host: u8, poll_yield: Option<&str>) {
    use std::io::{BufRead, Write};
    let (a, _b) = nic_pair(tag, host);
    let mut cmd = stock_support::exec_on(&a, exe);
    if let Some(v) = poll_yield {
        cmd.env("SOFTNIC_IBV_POLL_YIELD", v);
    }
    let mut child = cmd
        .arg(&a.name)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run softnic exec");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the program did not start");
    // Idle for far longer than the NIC's 100 µs spin: it sleeps and set NEED_WAKEUP.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SIGKILL, not the SIGTERM of NicProc's drop: a NIC that stops cleanly clears the
    // flag on its way out.
    let pid = a.pid().expect("the NIC runs") as libc::pid_t;
    // SAFETY: kill(2) on the PID of the NIC this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(a);
    child.stdin.take().unwrap().write_all(b"post\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(
        o.status.success()
            && rest.contains("post after the NIC died: 5 (")
            && rest.contains("poll after the NIC died: negative")
            && rest.contains("IBV_EVENT_DEVICE_FATAL"),
        "{poll_yield:?} {:?}: {rest}{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Compiles `tests/ibverbs/NAME.c` against the real `<infiniband/verbs.h>` (and
/// `-libverbs`, which `softnic exec` then replaces) into this test's directory.
fn compile_c(name: &str, extra: &[&str]) -> PathBuf {
    let dir = softnic_dir().join("c-build");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/ibverbs/{name}.c")))
        .args(extra)
        .arg("-libverbs")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc:?} (a C compiler is required): {e}"));
    assert!(
        o.status.success(),
        "compiling {name}.c (libibverbs-dev?): {}",
        text(&o)
    );
    exe
}

/// Zero system calls per `ibv_post_send` / `ibv_post_recv` / `ibv_poll_cq` through the
/// C ABI: `tests/ibverbs/nosyscall.c` runs 1000 SEND round trips between two
/// `--busy-poll` NICs in a thread under a seccomp filter that kills the process on any
/// syscall but `exit`, once with classic CQs and once polling one side with the
/// `ibv_cq_ex` API, both with the idle yield off (`SOFTNIC_IBV_POLL_YIELD=0`); and with
/// the default (an empty poll streak yields, and sleeps on a futex after the spin
/// window: hybrid polling) under a filter that allows only `sched_yield` and `futex`. Control: the same loop with one `getppid` must die by SIGSYS.
#[test]
fn post_and_poll_make_no_syscalls_through_the_c_abi() {
    use std::os::unix::process::ExitStatusExt;
    let pid = std::process::id();
    let net = format!("127.{}.{}", 100 + pid % 100, 1 + (pid / 100) % 250);
    let a = NicProc::start("ibvstock-ns-a", &format!("{net}.8"), 4791, &["--busy-poll"]);
    let b = NicProc::start("ibvstock-ns-b", &format!("{net}.9"), 4791, &["--busy-poll"]);
    let exe = compile_c("nosyscall", &["-pthread"]);
    // `yield` keeps the library's default: an empty poll streak yields the core.
    // The other modes spin without yielding (SOFTNIC_IBV_POLL_YIELD=0).
    let run = |mode: &str| {
        let yield_every = if mode == "yield" { None } else { Some("0") };
        let mut c = Command::new(env!("CARGO_BIN_EXE_softnic"));
        c.args(["exec", "-d", &a.name, "-d", &b.name, "--"])
            .arg(&exe)
            .args([&a.name, &b.name, mode])
            .env("SOFTNIC_DIR", softnic_dir())
            .env_remove(softnic::exec::LIB_DIR_ENV)
            .env_remove(softnic_ibverbs::objects::POLL_YIELD_ENV);
        if let Some(v) = yield_every {
            c.env(softnic_ibverbs::objects::POLL_YIELD_ENV, v);
        }
        c.output().expect("run softnic exec")
    };
    let o = run("clean");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ok 1000 rounds without a system call"),
        "{}",
        text(&o)
    );
    // The same under the filter with y's CQ from ibv_create_cq_ex, polled with
    // ibv_start_poll / ibv_wc_read_* / ibv_next_poll / ibv_end_poll.
    let o = run("cqex");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ok 1000 rounds without a system call"),
        "{}",
        text(&o)
    );
    // The library's default under a filter that allows sched_yield and futex only.
    let o = run("yield");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ok 1000 rounds without a system call but sched_yield and futex"),
        "{}",
        text(&o)
    );
    let o = run("getppid");
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGSYS),
        "the filter did not bite: {}",
        text(&o)
    );
}

/// Every symbol (and version node) that the installed stock binaries import resolves
/// against the drop-in directory: they are BIND_NOW, so one missing symbol stops them
/// from starting at all.
#[test]
fn every_stock_binary_links_against_the_drop_in() {
    let o = exec(&["--print-lib-dir"]);
    assert!(o.status.success(), "{}", text(&o));
    let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
    for name in [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_asyncwatch",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
    ] {
        let out = stock_support::assert_links_against(&stock(name), &dir, &["libibverbs.so.1"]);
        if out.contains("libmlx5.so.1") {
            assert!(
                out.contains(&format!("libmlx5.so.1 => {dir}/libmlx5.so.1")),
                "{out}"
            );
            assert!(
                out.contains(&format!("libefa.so.1 => {dir}/libefa.so.1")),
                "{out}"
            );
        }
    }
}

/// `tests/ibverbs/probe.c`, compiled against the real `<infiniband/verbs.h>`: queries
/// at every caller size (with canaries), the GID table, P_Keys, the object verbs' error
/// paths (EBUSY, EINVAL, EOPNOTSUPP for what is not supported), MR registration by
/// remap (contents and a neighbour on the same page kept, a second MR on the same
/// pages and an unaligned one, re-registration after deregistration), and EOPNOTSUPP
/// from the verbs not implemented yet.
#[test]
fn c_abi_probe() {
    let nic = NicProc::start("ibvstock-probe", "127.0.0.1", 0, &[]);
    let exe = compile_c("probe", &[]);
    let o = exec(&["-d", &nic.name, "--", exe.to_str().unwrap(), &nic.name]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let ll = verbs_api::gid::gid_table(std::net::SocketAddr::new(nic.addr, nic.port))[0];
    let eop = libc::EOPNOTSUPP;
    let einval = libc::EINVAL;
    let ebusy = libc::EBUSY;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    for want in [
        "num_devices 1".to_string(),
        format!("device {} index 0 guid {}", nic.name, guid_hex(&nic)),
        "node_type 1 transport 0".into(),
        "num_comp_vectors 1".into(),
        "async_fd_valid 1".into(),
        "extended 1".into(),
        "query_device 0".into(),
        "vendor_id 0xffffff part 0 ports 1 max_qp 4096 atomic 1".into(),
        "query_device_ex 0".into(),
        "device_ex_canary 1 odp 1 clock 1 zero_tail 1 same_vendor 1".into(),
        format!("query_device_ex_bad_input {einval}"),
        "query_port 0".into(),
        "port state 4 link_layer 2 active_mtu 5 gid_tbl_len 1024 pkey_tbl_len 1 lid 0 canary 1"
            .into(),
        format!("query_port_2 {einval}"),
        "compat_query_port 0 state 4 link_layer 2 written_48 1 canary_after_48 1".into(),
        "op_query_port_8 0 canary_after_8 1".into(),
        format!("gid 0 rc 0 {ll}"),
        "gid 1 rc 0 ::ffff:127.0.0.1".into(),
        "gid 2 rc 0 ::".into(),
        "gid_ex rc 0 index 1 port 1 type 2".into(),
        format!("gid_ex_empty_index {}", libc::ENODATA),
        format!("gid_ex_bad_index {einval}"),
        "gid_type_empty 0 type 0".into(),
        "gid_table 2".into(),
        format!("gid_table_small -{einval}"),
        "pkey rc 0 0xffff pkey1 -1".into(),
        "fork 1 init 0".into(),
        "alloc_pd ok".into(),
        "create_comp_channel ok fd_valid 1".into(),
        "create_cq ok cqe_ge_16 1".into(),
        format!("channel_busy {ebusy}"),
        "poll_empty 0".into(),
        "notify 0".into(),
        format!("cq_event_nonblocking -1 errno {}", libc::EAGAIN),
        format!("reg_mr ok addr_ok 1 len {} bytes_kept 1", page + 100),
        "neighbour_write 1".into(),
        "reg_overlap ok errno 0".into(),
        "dereg_overlap 0".into(),
        "reg_unaligned ok errno 0".into(),
        "dereg_unaligned 0".into(),
        format!("reg_bad_access null errno {einval}"),
        format!("dealloc_pd_busy {ebusy}"),
        "dereg 0".into(),
        "rereg ok byte0_kept 1".into(),
        "fork_child_segv 1 parent_byte1_kept 1".into(),
        "rereg_access 0 keys_kept 1".into(),
        format!("rereg_access_unflagged -1 errno {einval}"),
        "rereg_translation 0 moved 1 len 1 byte0_kept 1".into(),
        "create_ud_qp ok".into(),
        "destroy_ud_qp 0".into(),
        format!("create_ah_lid_only null errno {einval}"),
        "create_ah ok".into(),
        "destroy_ah 0".into(),
        "create_rc_qp ok state 0 cap_send_ge_4 1".into(),
        format!("destroy_cq_busy {ebusy}"),
        "modify_init 0 state 1".into(),
        format!("modify_init_to_rts {einval}"),
        format!("modify_alt_path {eop}"),
        "query_qp 0 state 1 port 1 send_cq_ok 1".into(),
        "post_recv 0".into(),
        format!("post_send_in_init {einval} bad_is_wr 1"),
        "qp_ex null".into(),
        "destroy_qp 0".into(),
        "destroy_cq 0".into(),
        "dereg 0".into(),
        "destroy_channel 0".into(),
        "dealloc_pd 0".into(),
        format!("create_cq_ex_cvlan null errno {eop}"),
        "create_cq_ex_timestamp ok".into(),
        "create_cq_ex ok".into(),
        format!("cq_ex_empty {}", libc::ENOENT),
        "destroy_cq_ex 0".into(),
        format!("alloc_dm ptr too_big null errno {einval}"),
        format!("dm_copy 0 0 same 1 unaligned {einval} past_end {einval}"),
        format!("reg_dm_mr_not_zero_based null errno {einval}"),
        format!("reg_dm_mr ptr addr_null 1 free_busy {}", libc::EBUSY),
        "dm_dereg 0 free 0".into(),
        "alloc_mw ptr type 1 rkey_set 1".into(),
        format!("alloc_mw_type3 null errno {einval}"),
        format!("dealloc_pd_with_mw {ebusy}"),
        "dealloc_mw 0 dealloc_pd 0".into(),
        "close 0".into(),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "missing line `{want}`:\n{out}"
        );
    }
}

/// Free 2 MiB hugepages on this machine (`HugePages_Free` of /proc/meminfo).
fn free_hugepages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The BW average (MB/s) of perftest's result line for `size`.
fn bw_average(out: &str, size: &str) -> Option<f64> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0] == size)
        .and_then(|f| f[3].parse().ok())
}

/// Stock `ib_write_bw --use_hugepages`, both ways: perftest's buffers are a SysV
/// `SHM_HUGETLB` segment (`shmget` + `shmat`), which softnic's `ibv_reg_mr` registers
/// through the NIC's copy path (docs/ibverbs.md). Each run is followed by the same
/// run without `--use_hugepages` (zero-copy memfd buffers), and the ratio of their
/// averages is printed (`--nocapture`). Needs free hugepages (`vm.nr_hugepages`:
/// `.ci/run` reserves 64); fails without them in CI.
#[test]
fn stock_perftest_with_hugepages() {
    if free_hugepages() < 8 {
        prereq::missing("free 2 MiB hugepages (vm.nr_hugepages; .ci/run reserves 64)");
        return;
    }
    let (a, b) = nic_pair("ibvstock-huge", 20);
    for (srv, cli) in [(&a, &b), (&b, &a)] {
        let mut bw = [0.0; 2];
        for (j, huge) in [true, false].into_iter().enumerate() {
            let mut args = vec!["-x", "1", "-F", "-s", "65536", "-n", "200"];
            if huge {
                args.push("--use_hugepages");
            }
            let (s, c) = pair_run("ib_write_bw", srv, cli, tcp_port(), &args);
            bw[j] = bw_average(&c, "65536")
                .unwrap_or_else(|| panic!("no result line\n{c}\nserver:\n{s}"));
        }
        println!(
            "ib_write_bw -s 65536, {} -> {}: --use_hugepages (copied) {:.0} MB/s, memfd \
             buffers (zero-copy) {:.0} MB/s, ratio {:.2}",
            cli.name,
            srv.name,
            bw[0],
            bw[1],
            bw[0] / bw[1]
        );
    }
}

/// perftest's `--tclass` reaches the wire, as a tcpdump on `lo` sees each packet's IP
/// TOS: it sets the address vector of both sides' QPs (RC: every WRITE and every ACK;
/// UD: the address handle of each datagram). (`-R -T`, the rdma_cm form, is
/// `rdmacm_stock::perftest_tos_over_rdma_cm_reaches_the_wire`.)
#[test]
fn stock_perftest_traffic_class_reaches_the_wire() {
    if !prereq::network_lab(&["tcpdump"]) {
        return;
    }
    let (a, b) = nic_pair("ibvstock-tclass", 40);
    let cases: [(&str, &[&str], u8); 2] = [
        (
            "ib_write_bw",
            &["--tclass=96", "-s", "4096", "-n", "200"],
            96,
        ),
        (
            "ib_send_bw",
            &["-c", "UD", "--tclass=46", "-s", "1024", "-n", "100"],
            46,
        ),
    ];
    for (i, (prog, args, tos)) in cases.into_iter().enumerate() {
        let mut all = vec!["-x", "1", "-F"];
        all.extend_from_slice(args);
        let cap = stock_support::LoCapture::start(a.addr, b.addr, &format!("tclass{i}"));
        let (_, c) = pair_run(prog, &a, &b, tcp_port(), &all);
        assert!(c.contains("#bytes"), "{prog} {args:?}: {c}");
        let seen = cap.stop();
        let data: Vec<_> = seen.iter().filter(|p| p.dest_qpn != 1).collect();
        let from = |nic: &NicProc| data.iter().filter(|p| p.src == nic.addr).count();
        // The client (b) sends the data; a RC server answers with ACKs. (On `lo` a GSO
        // send is one captured packet: a few dozen for the whole run.)
        assert!(from(&b) > 0, "{prog} {args:?}: no packet from the client");
        if !args.contains(&"UD") {
            assert!(from(&a) > 0, "{prog} {args:?}: no packet from the server");
        }
        let wrong: Vec<_> = data.iter().filter(|p| p.tos != tos).take(5).collect();
        assert!(
            wrong.is_empty(),
            "{prog} {args:?}: TOS other than {tos}: {wrong:?}"
        );
    }
}
