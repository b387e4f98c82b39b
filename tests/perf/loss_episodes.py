#!/usr/bin/env python3
"""Where the time of each loss recovery goes (issue 12, docs/perf.md "Goodput under loss").

    tests/perf/loss_episodes.py [--exe PATH] [-n MESSAGES] [--keep DIR]
    tests/perf/loss_episodes.py --traces REQUESTER.trace RESPONDER.trace

Runs `softnic perf write_bw -s 65536 -n MESSAGES` (default 1,000) between two NICs on
127.0.0.0/8 that drop 5 % of every packet they send (`--loss 0.05`, seeds 5 and 6) and
record every packet they send and receive (`--trace-lat`, nic/trace.rs: `kind opcode
qpn psn start_ns call_ns at_ns` on CLOCK_MONOTONIC), or reads two such traces. A dropped packet
never reaches the trace (the fault injector drops it before the send), so a loss shows
as a gap at the responder.

A recovery ("episode") starts when the requester's `sendmsg` carrying the PSN before a
lost one X returns and ends when X reaches the responder. Those repaired by a PSN
sequence NAK are split into stages: the responder meets the gap (receives a later PSN),
its NAK leaves, the NAK is received, the resend of X leaves, X is received. The others
(a lost NAK, a lost resend, a tail loss) were repaired by the retransmission timer.
"Sent in vain" counts the requester's packets between the loss and the resend. Exit
status 1 when the run or the traces give no episode.
"""

import argparse
import bisect
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile

ACK = 0x11
# RC SEND and WRITE request opcodes (First, Middle, Last, Only, with immediate).
DATA = set(range(0x00, 0x06)) | set(range(0x06, 0x0C))


def load(path):
    """(at_ns, kind, opcode, psn, start_ns) per packet event, in file order."""
    ev = []
    with open(path) as f:
        for line in f:
            k, op, _qpn, psn, t0, _call, t = line.split()
            if k != "cqe":
                ev.append((int(t), k, int(op), int(psn), int(t0)))
    return ev


def responder_gaps(resp):
    """Each gap the responder saw: expected PSN X, when a later PSN first arrived, when
    its NAK for X left (None if lost: not in the trace), when X arrived."""
    epsn, cur, gaps = None, None, []
    for t, k, op, psn, _ in resp:
        if k == "rx" and op in DATA:
            if epsn is None:
                epsn = psn
            if psn == epsn:
                if cur is not None:
                    cur["fill"] = t
                    gaps.append(cur)
                    cur = None
                epsn = (epsn + 1) & 0xFFFFFF
            elif 0 < (psn - epsn) & 0xFFFFFF < 1 << 23 and cur is None:
                cur = {"X": epsn, "detect": t, "nak": None}
        elif k == "tx" and op == ACK and cur is not None and psn == cur["X"] \
                and cur["nak"] is None:
            cur["nak"] = t
    return gaps


def episodes(req, resp):
    tx = [(t, psn) for t, k, op, psn, _ in req if k == "tx" and op in DATA]
    tx_t = [t for t, _ in tx]
    acks = [(t, psn) for t, k, op, psn, _ in req if k == "rx" and op == ACK]
    acks_t = [t for t, _ in acks]
    out = []
    for g in responder_gaps(resp):
        x, before = g["X"], (g["X"] - 1) & 0xFFFFFF
        i = bisect.bisect_right(tx_t, g["detect"]) - 1
        while i >= 0 and tx[i][1] != before:
            i -= 1
        j = bisect.bisect_left(tx_t, g["detect"])
        while j < len(tx) and tx[j][1] != x:
            j += 1
        if i < 0 or j >= len(tx):
            continue
        nak_rx = None
        if g["nak"] is not None:
            r = bisect.bisect_left(acks_t, g["nak"])
            while r < len(acks) and acks[r][1] != x:
                r += 1
            if r < len(acks) and acks[r][0] <= tx[j][0]:
                nak_rx = acks[r][0]
        out.append(dict(lost=tx[i][0], detect=g["detect"], nak=g["nak"], nak_rx=nak_rx,
                        resend=tx[j][0], fill=g["fill"], vain=j - i - 1))
    return out


def summary(values, unit_sum=" ms", scale=1000):
    """Median, p10, p90 and the sum (of microseconds, in ms; or of counts)."""
    v = sorted(values)
    if not v:
        return "-"
    n = len(v)
    return (f"median {v[n // 2]:.0f}, p10 {v[n // 10]:.0f}, p90 {v[9 * n // 10]:.0f}, "
            f"sum {sum(v) / scale:.1f}{unit_sum}")


def report(req, resp):
    eps = episodes(req, resp)
    if not eps:
        print("no loss recovery in the traces", file=sys.stderr)
        return 1
    span = (max(e[0] for e in req) - min(e[0] for e in req)) / 1e6
    print(f"{len(eps)} recoveries over a {span:.1f} ms run (times in us)")
    group = [e for e in eps if e["nak_rx"] is not None]

    def us(a, b):
        return [(e[b] - e[a]) / 1000 for e in group]

    print(f"repaired by a NAK: {len(group)}")
    for label, a, b in (("loss -> responder meets the gap", "lost", "detect"),
                        ("gap -> NAK sent", "detect", "nak"),
                        ("NAK sent -> received", "nak", "nak_rx"),
                        ("NAK received -> resend sent", "nak_rx", "resend"),
                        ("resend sent -> received", "resend", "fill"),
                        ("whole recovery", "lost", "fill")):
        print(f"  {label:34} {summary(us(a, b))}")
    print(f"  {'packets sent in vain':34} {summary([e['vain'] for e in group], '', 1)}")
    group = [e for e in eps if e["nak_rx"] is None]
    print(f"repaired by the timer: {len(group)}")
    print(f"  {'loss -> resend sent':34} {summary(us('lost', 'resend'))}")
    print(f"  {'whole recovery':34} {summary(us('lost', 'fill'))}")
    return 0


def run(exe, n, keep):
    """Runs the lossy pair with traces; returns (requester trace, responder trace)."""
    here = os.path.dirname(os.path.abspath(__file__))
    loader = importlib.machinery.SourceFileLoader("perfrun", os.path.join(here, "run"))
    spec = importlib.util.spec_from_loader("perfrun", loader)
    pr = importlib.util.module_from_spec(spec)
    loader.exec_module(pr)
    sdir = keep or tempfile.mkdtemp(prefix="softnic-loss-")
    pid, net = os.getpid(), 100 + os.getpid() % 100
    paths = [os.path.join(sdir, f"{s}.trace") for s in ("responder", "requester")]
    nics = [pr.Nic(exe, f"lossep-{s}-{pid}", f"127.{net}.7.{2 + k}", sdir,
                   ["--loss", "0.05", "--seed", str(5 + k), "--trace-lat", paths[k]])
            for k, s in enumerate(("s", "c"))]
    try:
        out = pr.perf(exe, sdir, nics[0], nics[1], "write_bw", ["-s", "65536", "-n", str(n)])
        print(f"write_bw at 5 % loss: {pr.result_row(out, 65536)[2]:.0f} MB/s")
    finally:
        for nic in nics:
            nic.stop()  # the traces are written when the NICs stop
    return paths[1], paths[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", help="softnic binary (default: target/release/softnic)")
    ap.add_argument("-n", type=int, default=1000, help="64 KiB messages")
    ap.add_argument("--keep", help="directory for the traces (default: a new temporary one)")
    ap.add_argument("--traces", nargs=2, metavar=("REQUESTER", "RESPONDER"),
                    help="analyse these traces instead of running")
    o = ap.parse_args()
    if o.traces:
        return report(load(o.traces[0]), load(o.traces[1]))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exe = os.path.abspath(o.exe or os.path.join(root, "target", "release", "softnic"))
    req, resp = run(exe, o.n, o.keep)
    try:
        return report(load(req), load(resp))
    finally:
        if not o.keep:
            shutil.rmtree(os.path.dirname(req), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
