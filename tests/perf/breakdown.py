#!/usr/bin/env python3
"""Splits `softnic perf send_lat` round trips into stages (issue 12).

    tests/perf/breakdown.py NIC_C.trace NIC_S.trace CLIENT.stamps SERVER.stamps

Inputs, all on CLOCK_MONOTONIC: the traces of the client's NIC (C) and the server's NIC
(S) from `softnic run --trace-lat FILE` (nic/trace.rs: `kind opcode qpn psn start_ns
call_ns at_ns`), and the stamps of both `softnic perf send_lat --breakdown FILE` sides (`post N
ns`, `seen N ns`). Iteration k is: the client posts SEND k, the server polls its receive
completion and posts SEND k back, the client polls that. The k-th distinct PSN of the
SENDs a NIC sent or received is message k (a retransmission repeats a PSN). Every stage
is the gap between two stamps, so the stages of one iteration add up exactly to its
round trip; stamps from different processes share the clock, nothing is estimated.
A loopback sendmsg delivers to the peer's socket before it returns, so a kernel stage
can be slightly negative for one message (the peer received before the sender's return
was stamped); medians are not affected.
"""

import bisect
import sys

# RC, UC and UD SEND opcodes (ONLY, ONLY with immediate; FIRST..LAST for larger sizes).
SENDS = {op | t for t in (0x00, 0x20, 0x60) for op in range(0x00, 0x06)}

STAGES = [
    # (label, what runs there)
    ("client posts -> NIC C loop picks it up", "wake"),
    ("NIC C: pass start -> sendmsg called", "nic"),
    ("NIC C: sendmsg called -> returned", "kernel"),
    ("kernel: NIC C sendmsg -> NIC S recv returned", "kernel+wake"),
    ("NIC S: recv -> completion published", "nic"),
    ("server: completion published -> polled", "wake"),
    ("server: polled -> reply posted", "client"),
    ("server posts -> NIC S loop picks it up", "wake"),
    ("NIC S: pass start -> sendmsg called", "nic"),
    ("NIC S: sendmsg called -> returned", "kernel"),
    ("kernel: NIC S sendmsg -> NIC C recv returned", "kernel+wake"),
    ("NIC C: recv -> completion published", "nic"),
    ("client: completion published -> polled", "wake"),
]


def read_trace(path):
    """(tx, rx, cqe): tx/rx are [(start, call, at)] per distinct SEND PSN in order."""
    tx, rx, cqe = [], [], []
    seen = {"tx": set(), "rx": set()}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) != 7:
                continue
            kind, op, qpn, psn = p[0], int(p[1]), p[2], p[3]
            start, call, at = int(p[4]), int(p[5]), int(p[6])
            if kind == "cqe":
                cqe.append(at)
            elif op in SENDS and (qpn, psn) not in seen[kind]:
                seen[kind].add((qpn, psn))
                (tx if kind == "tx" else rx).append((start, call, at))
    cqe.sort()
    return tx, rx, cqe


def read_stamps(path):
    out = {"post": {}, "seen": {}}
    with open(path) as f:
        for line in f:
            what, n, t = line.split()
            out[what][int(n)] = int(t)
    return out


def first_after(times, t):
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def stages(nic_c, nic_s, cli, srv, skip=100):
    """Per-stage lists of microseconds, and the round trips; the first `skip`
    iterations (warm-up) are left out."""
    ctx, crx, ccqe = nic_c
    stx, srx, scqe = nic_s
    n = min(len(ctx), len(crx), len(stx), len(srx), len(cli["post"]), len(srv["post"]))
    per = [[] for _ in STAGES]
    rtt = []
    for k in range(skip + 1, n + 1):
        try:
            c_post, c_seen = cli["post"][k], cli["seen"][k]
            s_seen, s_post = srv["seen"][k], srv["post"][k]
        except KeyError:
            continue
        s_cqe = first_after(scqe, srx[k - 1][2])
        c_cqe = first_after(ccqe, crx[k - 1][2])
        if s_cqe is None or c_cqe is None:
            continue
        t = [c_post, *ctx[k - 1], srx[k - 1][2], s_cqe, s_seen, s_post, *stx[k - 1],
             crx[k - 1][2], c_cqe, c_seen]
        for i in range(len(STAGES)):
            per[i].append((t[i + 1] - t[i]) / 1000)
        rtt.append((c_seen - c_post) / 1000)
    return per, rtt


def table(per, rtt):
    """Rows (label, kind, median, p99) and a last row for the whole round trip."""
    rows = [(label, kind, pct(v, 0.5), pct(v, 0.99)) for (label, kind), v in zip(STAGES, per)
            if v]
    if rtt:
        rows.append(("round trip (client post -> client polled)", "", pct(rtt, 0.5),
                     pct(rtt, 0.99)))
    return rows


def analyse(nic_c, nic_s, cli, srv):
    per, rtt = stages(read_trace(nic_c), read_trace(nic_s), read_stamps(cli),
                      read_stamps(srv))
    return table(per, rtt), len(rtt)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    rows, n = analyse(*sys.argv[1:])
    print(f"{n} round trips")
    for label, kind, med, p99 in rows:
        print(f"{label:<48}{kind:<12}{med:>9.2f}{p99:>9.2f}")


if __name__ == "__main__":
    main()
