"""The fuzz stage (issue 13): `softnic fuzz` against stock servers on Linux rxe in the guest.

For each target the guest restarts a stock server in a loop (`ibv_rc_pingpong`, then perftest's
`ib_write_bw`, `ib_read_bw` and `ib_atomic_bw`, whose QPs allow the remote access each tests):
every fuzzing connection ends with a request that puts the server's QP in the
error state and the TCP close, so the server exits and the loop starts the next one. The fuzzer
runs in the private namespace on the softnic side's address, with its own UDP socket (no
`softnic run`); it probes the peer on a fresh connection after every batch, and a probe that gets
no answer is a finding it saves (pcap + replay file) and minimises.

What the fuzzer cannot see, the harness checks: the guest's kernel log. After each target a job
in the guest prints `dmesg`; with the serial console it is searched for WARN/BUG/Oops and the
like (KERNEL_TROUBLE), and a guest that died or stopped answering is a finding too.

Findings of either kind are results, not failures: they are written to OUT/fuzz.md and the
stage still PASSes. The stage FAILs only when the fuzzer itself broke: an error exit or a
signal, no banner, or no answer from the peer at all (only silence and QP death reached).
"""

import os
import re
import shutil
import time

from . import capture, guest, net, runner, util

# (name, --exchange, --probe: an operation the server's QP allows, the server the guest
# restarts in a loop)
TARGETS = (
    ("rc_pingpong", "pingpong", "send", "ibv_rc_pingpong -d rxe0 -g 1 -n 1000000000"),
    ("write_bw", "perftest", "write", "ib_write_bw -d rxe0 -x 1 -F"),
    ("read_bw", "perftest", "read", "ib_read_bw -d rxe0 -x 1 -F"),
    ("atomic_bw", "perftest", "atomic", "ib_atomic_bw -d rxe0 -x 1 -F"),
)
# The guest is qemu TCG: rxe answers in milliseconds, not microseconds. These keep the
# fuzzer's answer window and probe above what the guest needs, and the rate below what it
# can take without dropping (a drop would read as silence).
RATE = 2000
ANSWER_MS = 40
PROBE_TIMEOUT_MS = 3000
BATCH = 200
# Minimisation of a liveness finding: at most this many trials (each two connections), and
# the fuzzer is stopped this long after its --seconds (CI's 20 minutes must hold).
MAX_TRIALS = 40
MINIMIZE_LIMIT = 300
# What in the guest's kernel log is a finding: WARN_ON, BUG_ON, Oops, sanitizer reports,
# lockups, list/refcount corruption.
KERNEL_TROUBLE = re.compile(
    r"WARNING: CPU|------------\[ cut here \]|kernel BUG|BUG: |Oops|general protection fault|"
    r"Call Trace|RIP: |UBSAN|KASAN|refcount_t|list_(add|del) corruption|soft lockup|"
    r"hard LOCKUP|blocked for more than|rcu_sched detected stalls|Kernel panic")


class Outcome:
    """One target's run: status PASS/FAIL (the fuzzer worked or broke), the fuzzer's text,
    its findings (replay files), and the kernel-log lines that are findings."""

    def __init__(self, name):
        self.name = name
        self.status = "FAIL"
        self.reason = ""
        self.seconds = 0.0
        self.text = ""
        self.rc = None
        self.findings = []
        self.kernel = []
        self.restarts = 0
        self.guest_died = False

    def classes(self):
        """The coverage table's rows with a non-zero count: {class: (sequences, first at)}."""
        got = {}
        for ln in self.text.splitlines():
            f = ln.split()
            if len(f) == 3 and f[1].isdigit() and re.fullmatch(r"[A-Z][A-Z-]+", f[0]):
                if int(f[1]) > 0:
                    got[f[0]] = (int(f[1]), f[2])
        return got


def server_loop(cmd):
    """The guest job: the stock server restarted until the job is cancelled; one line per
    exit (its status and last output line), so the host can count the connections served."""
    return "\n".join([
        "n=0",
        "while :; do",
        "  %s > /tmp/server.log 2>&1; rc=$?" % cmd,
        "  n=$((n + 1)); echo \"== exit $n rc=$rc: $(tail -n 1 /tmp/server.log)\"",
        "done", ""])


def run_target(ctx, name, exchange, probe, cmd, seconds, seed, out):
    """Fuzzes one server for `seconds`; the guest must be up. Returns an Outcome."""
    o = Outcome(name)
    t0 = time.monotonic()
    fdir = os.path.join(out, "fuzz-%s" % name)
    shutil.rmtree(fdir, ignore_errors=True)
    os.makedirs(fdir)
    log_path = os.path.join(out, "fuzz-%s.log" % name)
    console_at = len(util.read(ctx.guest.console))
    # The whole run on the bridge (a few hundred datagrams a second: small), to look up
    # what the peer answered to any packet. Not checked: the fuzzer's bad ICRCs are on purpose.
    pcap = os.path.join(out, "fuzz-%s.pcap" % name)
    cap = capture.Capture(ctx.procs, ctx.netns, pcap, os.path.join(ctx.rundir, "tcpdump-fuzz.log"))
    cap.start()
    job = ctx.guest.submit(server_loop(cmd), int(seconds) + 600)
    argv = [ctx.softnic.bin, "fuzz", "--target", net.GUEST_IP, "--local", net.SOFTNIC_IP,
            "--exchange", exchange, "--probe", probe, "--seed", str(seed), "--seconds", str(int(seconds)),
            "--packets", "1000000000", "--rate", str(RATE), "--batch", str(BATCH),
            "--answer-ms", str(ANSWER_MS), "--probe-timeout-ms", str(PROBE_TIMEOUT_MS),
            "--max-trials", str(MAX_TRIALS), "--out", fdir]
    side_log = os.path.join(ctx.rundir, "fuzz-%s.out" % name)
    # Bounded: the fuzzer's own --seconds, then minimisation (--max-trials trials of a few
    # seconds each), then we stop it. A guest that dies ends the run at once (a finding).
    limit = seconds + MINIMIZE_LIMIT
    p = ctx.procs.start(ctx.netns.cmd(argv), stdout=open(side_log, "wb"))
    util.wait_for(lambda: p.poll() is not None or not ctx.guest.alive(), limit, step=0.2)
    o.guest_died = not ctx.guest.alive()
    if p.poll() is None:
        ctx.procs.stop(p, grace=3)
        if not o.guest_died:
            o.reason = "softnic fuzz did not finish within %ds" % limit
    o.rc = p.returncode
    o.text = util.read(side_log)
    tcpdump = cap.stop()
    alive = ctx.guest.alive()
    job.cancel()
    server_out = job.output()
    o.restarts = server_out.count("== exit ")
    dmesg = ""
    if alive:
        d = ctx.guest.submit("dmesg\n", 30)
        util.wait_for(lambda: d.rc() is not None or not ctx.guest.alive(), 40)
        dmesg = d.output()
        if d.rc() is None:
            o.kernel.append("the guest did not run a dmesg job within 40 s (hung?)")
            ctx.guest_suspect = True
    else:
        o.kernel.append("the guest died during the run (qemu exited rc=%s)"
                        % (ctx.guest.qemu.returncode if ctx.guest.qemu else "?"))
    console = util.read(ctx.guest.console)[console_at:]
    seen = set()
    for ln in (dmesg + "\n" + console).splitlines():
        if KERNEL_TROUBLE.search(ln) and ln.strip() not in seen:
            seen.add(ln.strip())
            o.kernel.append(ln.rstrip())
    with open(os.path.join(out, "fuzz-%s.dmesg" % name), "w") as f:
        f.write(dmesg)
    o.findings = sorted(os.path.join(fdir, f) for f in os.listdir(fdir) if f.endswith(".json"))
    o.seconds = time.monotonic() - t0
    if not o.reason:
        o.reason = verdict(o)
    o.status = "PASS" if not o.reason else "FAIL"
    runner.write_log(log_path, [("fuzz target", "%s (guest: %s)" % (name, cmd)),
                                ("softnic fuzz", " ".join(argv)),
                                ("tcpdump", "%s: %s" % (pcap, tcpdump))],
                     {"softnic fuzz output (exit %s)" % o.rc: o.text,
                      "guest server loop (%d exits)" % o.restarts: util.tail(server_out, 20, 4000),
                      "kernel-log findings": "\n".join(o.kernel) or "none"},
                     o.reason or None)
    return o


def verdict(o):
    """Why the fuzzer itself broke, or "" (findings in rxe are not failures)."""
    if "to:    the QP of the server at" in o.text and o.guest_died:
        return ""  # stopped because the guest died: a kernel finding, not a fuzzer failure
    if o.rc is None or o.rc < 0:
        return "softnic fuzz was killed (rc=%s)" % o.rc
    if o.rc not in (0, 2):
        return "softnic fuzz failed (rc=%d): %s" % (o.rc, util.tail(o.text, 2))
    if "to:    the QP of the server at" not in o.text:
        return "softnic fuzz printed no banner"
    # Every batch opens with a probe the peer must answer (else exit 1 above); this catches
    # a run whose answers were all lost or misread: only the inferred classes reached.
    if not set(o.classes()) - {"SILENCE", "QP-DEATH"}:
        return "no answer from the peer: only silence and QP death reached"
    return ""


def run(ctx, img, seconds, seed, out, mtu=1500):
    """The stage: a fresh guest, then each target for its share of `seconds`. Returns the
    Outcomes; writes OUT/fuzz.md."""
    share = max(10.0, seconds / len(TARGETS))
    outcomes = []
    if ctx.guest is not None:
        ctx.guest.shutdown()  # the matrix's last guest, left up by --keep
    ctx.netns.set_mtu(mtu)
    ctx.guest = guest.Guest(ctx.procs, ctx.netns, img, ctx.rundir, mtu)
    for name, exchange, probe, cmd in TARGETS:
        if not ctx.guest.alive() or ctx.guest_suspect:
            if ctx.guest.qemu is not None:
                util.note("rebooting the guest")
                ctx.guest.kill()
            ctx.guest_suspect = False
            try:
                ctx.guest.boot()
            except RuntimeError as e:
                o = Outcome(name)
                o.reason = str(e)
                outcomes.append(o)
                continue
        outcomes.append(run_target(ctx, name, exchange, probe, cmd, share, seed, out))
    ctx.guest.shutdown()
    write_md(os.path.join(out, "fuzz.md"), outcomes, img, seconds, seed)
    return outcomes


def summary(o):
    """The one-line result."""
    m = re.search(r"(\d+) fuzz packets \((\d+) datagrams\) in (\d+) sequences over (\d+) "
                  r"connections, ([0-9.]+) s", o.text)
    what = ("%s fuzz packets over %s connections in %s s" % (m[1], m[4], m[5])) if m else "no summary"
    return "%s; %d classes; %d findings; %d kernel-log findings" % (
        what, len(o.classes()), len(o.findings), len(o.kernel))


def write_md(path, outcomes, img, seconds, seed):
    """OUT/fuzz.md: per target, the fuzzer's summary and coverage table, its findings with
    their replay commands, and the kernel-log findings."""
    with open(path, "w") as f:
        f.write("softnic fuzz against Linux %s rxe (qemu TCG guest), %s, %.0f s, seed %d, "
                "rate %d/s, batch %d, --answer-ms %d\n\n" % (
                    img.kernel_release, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    seconds, seed, RATE, BATCH, ANSWER_MS))
        for o in outcomes:
            f.write("## %s: %s (%.0f s)%s\n\n" % (o.name, o.status, o.seconds,
                                                   " " + o.reason if o.reason else ""))
            table = [ln for ln in o.text.splitlines()
                     if re.match(r"(answer class|[A-Z][A-Z-]+ +\d+ |classes reached|\d+ fuzz packets)",
                                 ln)]
            f.write("```\n%s\n```\n\n" % "\n".join(table))
            f.write("server restarts in the guest: %d\n\n" % o.restarts)
            for j in o.findings:
                f.write("- finding `%s` (pcap `%s`); replay: `tests/interop/run --fuzz-replay %s`\n"
                        % (j, j[:-5] + ".pcap", j))
            for k in o.kernel:
                f.write("- kernel log: `%s`\n" % k.strip())
            if not o.findings and not o.kernel:
                f.write("no findings\n")
            f.write("\n")


def replay(ctx, img, path, out, mtu=1500):
    """`--fuzz-replay FILE`: a fresh guest, the server the file's exchange needs restarted in
    a loop, `softnic fuzz replay FILE`, and the kernel log. Returns (rc, text)."""
    # The target from the directory the stage wrote it to (OUT/fuzz-NAME/finding-N.json)
    # or the file's name; the file itself holds the exchange and the probe.
    where = os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path)
    cmd = next((c for n, _, _, c in TARGETS if n in where), None)
    if cmd is None:
        raise RuntimeError("%s: names no target (its directory or name must contain one of %s)"
                           % (path, ", ".join(t[0] for t in TARGETS)))
    ctx.netns.set_mtu(mtu)
    ctx.guest = guest.Guest(ctx.procs, ctx.netns, img, ctx.rundir, mtu)
    ctx.guest.boot()
    job = ctx.guest.submit(server_loop(cmd), 900)
    pcap = os.path.join(out, "fuzz-replay.pcap")
    cap = capture.Capture(ctx.procs, ctx.netns, pcap, os.path.join(ctx.rundir, "tcpdump-fuzz.log"))
    cap.start()
    argv = [ctx.softnic.bin, "fuzz", "replay", path, "--target", net.GUEST_IP,
            "--local", net.SOFTNIC_IP, "--answer-ms", str(ANSWER_MS),
            "--probe-timeout-ms", str(PROBE_TIMEOUT_MS)]
    side_log = os.path.join(ctx.rundir, "fuzz-replay.out")
    p = ctx.procs.start(ctx.netns.cmd(argv), stdout=open(side_log, "wb"))
    util.wait_for(lambda: p.poll() is not None, 300, step=0.2)
    if p.poll() is None:
        ctx.procs.stop(p, grace=3)
    text = util.read(side_log)
    cap.stop()
    text += "\n== the RoCEv2 packets on the bridge (%s)\n%s" % (pcap, roce_summary(pcap))
    job.cancel()
    if ctx.guest.alive():
        d = ctx.guest.submit("dmesg\n", 30)
        util.wait_for(lambda: d.rc() is not None, 40)
        trouble = [ln for ln in d.output().splitlines() if KERNEL_TROUBLE.search(ln)]
        text += "\n== guest kernel log: %s\n%s\n" % (
            "%d lines of trouble" % len(trouble) if trouble else "clean", "\n".join(trouble))
    else:
        text += "\n== the guest died\n"
    ctx.guest.shutdown()
    return p.returncode, text


def roce_summary(pcap):
    """One line per RoCEv2 packet of a capture (tshark): who, opcode, PSN, AETH syndrome,
    and an atomic ACK's original data: what a replay drew from the peer."""
    fields = ["frame.number", "ip.src", "infiniband.bth.opcode", "infiniband.bth.psn",
              "infiniband.aeth.syndrome", "infiniband.atomicacketh.origremdt"]
    argv = ["tshark", "-r", pcap, "-Y", "udp.port == 4791", "-T", "fields"]
    for f in fields:
        argv += ["-e", f]
    r = util.run(argv, timeout=60, check=False)
    if r.returncode != 0:
        return "tshark failed: " + util.tail(r.stderr, 2)
    return "frame src opcode psn aeth-syndrome atomic-orig-data\n" + r.stdout
