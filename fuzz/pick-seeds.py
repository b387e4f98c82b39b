#!/usr/bin/env python3
"""Picks a small seed corpus for the `responder` fuzz target out of a fuzzing corpus.

The target prints, with RESPONDER_STATS set, what each input did: datagrams dropped
and handled, memory accesses by kind, successful completions, packets the XRC receive
QP took with and without an XRC SRQ, every QP counter and every XRC SRQ counter.
This script replays a corpus directory through the built target, and greedily picks
inputs until every counter that any input made non-zero is non-zero in at least one
pick (the input adding the most such counters first, the smaller on ties). The picks
are copied to fuzz/corpus/responder/ as NN-<first counter it added>.

    cargo fuzz build -s none responder
    cargo fuzz run -s none responder /tmp/corpus -- -max_total_time=600
    python3 fuzz/pick-seeds.py /tmp/corpus      # from the repository root or fuzz/

Standard library only. Existing seeds in fuzz/corpus/responder/ are replaced, except
those named keep-* (reproducers of bugs found and fixed, kept so CI replays them).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = ROOT / "fuzz" / "target" / "x86_64-unknown-linux-gnu" / "release" / "responder"
OUT = ROOT / "fuzz" / "corpus" / "responder"


def features(files):
    """Maps each input file to the set of counters it makes non-zero."""
    feats = {}
    env = dict(os.environ, RESPONDER_STATS="1")
    for i in range(0, len(files), 200):
        chunk = [str(f) for f in files[i : i + 200]]
        err = subprocess.run(
            [str(TARGET), "-runs=1"] + chunk, env=env, capture_output=True, text=True
        ).stderr
        cur, qp, srq = None, 0, 0
        for line in err.splitlines():
            if line.startswith("Running: "):
                cur, qp, srq = line[len("Running: ") :].strip(), 0, 0
                feats[cur] = set()
            elif cur and line.startswith("Stats"):
                for name in ("touches", "success", "xrc"):
                    m = re.search(name + r": \[([^\]]*)\]", line)
                    vals = m.group(1).split(",") if m else []
                    feats[cur] |= {f"{name}[{j}]" for j, v in enumerate(vals) if int(v)}
            elif cur and line.startswith("QpCounters"):
                pairs = re.findall(r"(\w+): (\d+)", line)
                feats[cur] |= {f"qp{qp}.{k}" for k, v in pairs if int(v)}
                qp += 1
            elif cur and line.startswith("SrqCounters"):
                pairs = re.findall(r"(\w+): (\d+)", line)
                feats[cur] |= {f"srq{srq}.{k}" for k, v in pairs if int(v)}
                srq += 1
    return feats


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    src = pathlib.Path(sys.argv[1])
    files = sorted(p for p in src.iterdir() if p.is_file())
    feats = features(files)
    covered, picks = set(), []
    while True:
        best = max(feats, key=lambda f: (len(feats[f] - covered), -os.path.getsize(f)))
        gain = feats[best] - covered
        if not gain:
            break
        picks.append((best, sorted(gain)[0]))
        covered |= gain
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        if not old.name.startswith("keep-"):
            old.unlink()
    for n, (f, first) in enumerate(picks):
        name = f"{n:02}-{re.sub(r'[^A-Za-z0-9_.-]', '_', first)}"
        shutil.copyfile(f, OUT / name)
        print(f"{name}: {os.path.getsize(f)} bytes")
    total = set().union(*feats.values()) if feats else set()
    print(f"{len(picks)} seeds cover {len(covered)} of {len(total)} counters")


if __name__ == "__main__":
    main()
