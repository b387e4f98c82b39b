"""Runs one (scenario, direction): capture on, softnic side and guest side started in the
right order, each bounded by the scenario's timeout, capture off, verdict. Everything a
scenario starts is stopped before it returns, whatever happened."""

import os
import re
import shlex
import sys
import time

from . import capture, net, nic, scenarios, util

FAKEPEER = [sys.executable, "-B", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                               "fakepeer.py")]
CAPTURE_FAIL = "capture: "  # marks a failed capture check appended to another reason
SERVER_READY_TIMEOUT = 30  # seconds for a server to listen on its TCP port
MAX_RERUNS = 3  # starts over of a scenario that lost a known race (Scenario.rerun_if)


class Result:
    def __init__(self, status, seconds, reason=""):
        self.status, self.seconds, self.reason = status, seconds, reason
        self.rerun = False  # failed by the scenario's known race: worth starting over


def run_with_reruns(ctx, sc, direction):
    """run(), started over while it fails by the scenario's known race (at most
    MAX_RERUNS times); the result says how many runs were lost."""
    r = run(ctx, sc, direction)
    lost = 0
    while r.rerun and lost < MAX_RERUNS:
        lost += 1
        util.note("%s: lost the race /%s/, starting over" % (scenarios.ident(sc, direction),
                                                             sc.rerun_if))
        r = run(ctx, sc, direction)
    if lost:
        r.reason = "%s(%d earlier run(s) lost the race /%s/)" % (r.reason + " " if r.reason else "",
                                                      lost, sc.rerun_if)
    return r


def guest_script(cmd, server, sc, tool_timeout):
    """The job the guest agent runs: setup, the tool (server: signal readiness once its TCP
    port listens), post lines; the tool's status is the job's."""
    port = "%04X" % sc.port
    lines = ["up() { cut -d' ' -f1 /proc/uptime; }",
             # kill -0 succeeds on a zombie: look at the state instead
             "running() { [ -e /proc/$1 ] && ! grep -q 'State:.*zombie' /proc/$1/status 2>/dev/null; }",
             sc.guest_setup,
             'echo "== $(up) rxe: %s"' % cmd.replace('"', '\\"'),
             "timeout -s INT %d %s &" % (tool_timeout, cmd), "p=$!"]
    if server:
        listening = "grep -qE ':%s [0-9A-F]+:0000 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null" % port
        if sc.cm:  # the kernel CM's listening ids (a wildcard listen has one per device)
            listening = ("/usr/bin/rdma res show cm_id 2>/dev/null | grep -E 'state LISTEN' "
                         "| grep -qE 'src-addr [^ ]*:%d( |$)'" % sc.port)
        if not sc.listens:
            listening = "true"  # nothing to wait for (Scenario.listens)
        lines += ["i=0",
                  "while ! %s; do" % listening,
                  "  i=$((i + 1)); [ $i -gt 400 ] && break; running $p || break; sleep 0.05",
                  "done", "%s && touch @JOB@.ready" % listening]
    lines += ["wait $p; rc=$?", 'echo "== $(up) rxe: rc=$rc"', sc.guest_post,
              # on failure, what the kernel said (rxe logs QP errors and bad packets there)
              '[ $rc -eq 0 ] || { echo "== dmesg"; dmesg | tail -n 15; }', "exit $rc"]
    return "\n".join(ln for ln in lines if ln) + "\n"


def host_listening(pid, port):
    """Whether something in pid's network namespace listens on TCP port (LISTEN = 0A)."""
    pat = re.compile(r":%04X [0-9A-F]+:0000 0A " % port)
    for f in ("tcp", "tcp6"):
        if pat.search(util.read("/proc/%d/net/%s" % (pid, f))):
            return True
    return False


def cm_listening(the_nic):
    """Whether the softnic NIC has a CM listener (its `cm_listening` gauge)."""
    m = re.search(r"^cm_listening (\d+)$", the_nic.stats() if the_nic else "", re.M)
    return bool(m and int(m.group(1)) > 0)


def server_listening(sc, side, the_nic):
    """The softnic-side server is ready: its TCP port listens, or (CM rows) the NIC has
    a CM listener."""
    if not sc.listens:
        return True
    return cm_listening(the_nic) if sc.cm else host_listening(side.pid, sc.port)


def softnic_argv(sc, ctx, nic_name, client=False):
    subst = {"softnic": ctx.softnic.bin or "softnic",
             "dev": nic_name or "", "addr": net.softnic_addr(sc),
             "peer": net.GUEST_IP6 if sc.ipv6 else net.GUEST_IP}
    subst.update((k, v or k) for k, v in ctx.softnic.examples.items())
    argv = []
    for tok in shlex.split(sc.softnic_client if client and sc.softnic_client else sc.softnic):
        if tok == "{fakepeer}":
            argv += FAKEPEER
        else:
            argv.append(tok.format(**subst))
    return argv


def run(ctx, sc, direction):
    """ctx: procs, netns, guest (booted, right MTU), softnic (nic.Softnic), out dir, rundir."""
    t0 = time.monotonic()
    sid = scenarios.ident(sc, direction)
    missing = ctx.softnic.missing(sc.needs)
    if missing:
        return Result("SKIP", 0.0, missing)
    pcap = os.path.join(ctx.out, sid + ".pcap")
    addr = net.softnic_addr(sc)
    logs = {}
    log = [("scenario", "%s  (link MTU %d, timeout %ds)" % (sid, sc.link_mtu, sc.timeout))]
    cap = capture.Capture(ctx.procs, ctx.netns, pcap, os.path.join(ctx.rundir, "tcpdump.log"))
    the_nic = None
    side = None
    verdict = None
    job = None
    side_rc = rxe_rc = None
    try:
        cap.start()
        if sc.ipv6:
            ctx.netns.enable_ipv6()
        for c in sc.netns_setup:
            util.run(ctx.netns.cmd(list(c)), timeout=10)
        if "run" in sc.needs:
            the_nic = nic.Nic(ctx.procs, ctx.netns, ctx.softnic, addr, sc.nic_mtu,
                              list(sc.nic_args), ctx.rundir, os.path.join(ctx.rundir, "softnic-run.log"),
                              pcap=os.path.join(ctx.out, sid + ".softnic.pcap"))
            log.append(("softnic run", " ".join(the_nic.cmd)))
            the_nic.start()
        argv = softnic_argv(sc, ctx, the_nic.name if the_nic else None)
        env = the_nic.env if the_nic else None
        side_log = os.path.join(ctx.rundir, "softnic-side.log")
        deadline = time.monotonic() + sc.timeout
        if direction == "rxe-server":
            script = guest_script(sc.rxe, True, sc, sc.timeout)
            job = ctx.guest.submit(script, sc.timeout + 10)
            log.append(("rxe (server)", sc.rxe))
            util.wait_for(lambda: job.ready() or job.rc() is not None or not ctx.guest.alive(),
                          SERVER_READY_TIMEOUT)
            if not job.ready():
                verdict = "rxe server never listened: " + util.tail(job.output(), 1)
            else:
                if sc.softnic_client:
                    argv = softnic_argv(sc, ctx, the_nic.name if the_nic else None, client=True)
                else:
                    argv.append(net.GUEST_IP)
                log.append(("softnic side (client)", " ".join(argv)))
                side = ctx.procs.start(ctx.netns.cmd(argv), stdout=open(side_log, "wb"), env=env)
        else:
            log.append(("softnic side (server)", " ".join(argv)))
            side = ctx.procs.start(ctx.netns.cmd(argv), stdout=open(side_log, "wb"), env=env)
            util.wait_for(lambda: server_listening(sc, side, the_nic) or side.poll() is not None,
                          SERVER_READY_TIMEOUT, step=0.1)
            if not server_listening(sc, side, the_nic):
                verdict = "softnic side never listened (rc=%s): %s" % (
                    side.poll(), util.tail(util.read(side_log)))
            else:
                peer = net.SOFTNIC_IP6 if sc.ipv6 else net.SOFTNIC_IP
                cmd = sc.rxe_client.replace("{peer}", peer) if sc.rxe_client \
                    else "%s %s" % (sc.rxe, net.SOFTNIC_IP)
                log.append(("rxe (client)", cmd))
                job = ctx.guest.submit(guest_script(cmd, False, sc, sc.timeout), sc.timeout + 10)
        # Both sides run now (unless a verdict is already in): wait for both, bounded.
        if verdict is None:
            wait_both(ctx, side, job, deadline)
        side_rc = None
        if side is not None:
            side_rc = side.poll()
            if side_rc is None:
                ctx.procs.stop(side, grace=3)
        rxe_rc = job.rc() if job is not None else None
        if job is not None and rxe_rc is None:
            job.cancel()  # rxe_rc stays None: it did not finish by itself
        if job is not None:
            logs["rxe output"] = job.output()
        if side is not None:
            logs["softnic side output"] = util.read(side_log)
        if the_nic is not None:
            logs["softnic stats"] = the_nic.stats()
            if the_nic.proc.poll() is not None:
                verdict = "softnic run died during the scenario (rc=%s): %s" % (
                    the_nic.proc.returncode, util.tail(util.read(the_nic.logpath), 1))
        if verdict is None and sc.judge is None:
            verdict = judge(sc, direction, side_rc, rxe_rc, logs, ctx)
    except util.ToolFailure as e:
        verdict = verdict or str(e)
    except Exception as e:  # noqa: BLE001 - any harness error is this scenario's FAIL reason
        verdict = verdict or "harness error: %s" % e
    finally:
        if job is not None and job.rc() is None:
            ctx.guest_suspect = True  # the agent still runs the job: reboot before the next
        if side is not None and side.poll() is None:
            ctx.procs.stop(side, grace=3)
        if the_nic is not None:
            rc = the_nic.stop()
            nic_log = util.read(the_nic.logpath)
            logs["softnic run log (exit %s)" % rc] = nic_log
            if "panicked at" in nic_log and verdict is None:
                verdict = "softnic run panicked: " + util.tail(
                    nic_log[nic_log.index("panicked at"):], 1)
        log.append(("tcpdump", cap.stop()))
    # The captures are checked even when the scenario already failed: a failure that is
    # expected (scenarios.EXPECTED_FAILURES) must not hide a bad packet on the wire.
    if os.path.exists(pcap):
        ok, why, details = capture.check(pcap, ctx.softnic.bin, ctx.softnic.caps.get("decode") is None)
        log.append(("capture", details))
        extra = os.path.join(ctx.out, sid + ".softnic.pcap")
        if ok and os.path.exists(extra):
            ok, why, d2 = capture.check(extra, ctx.softnic.bin, ctx.softnic.caps.get("decode") is None)
            log.append(("softnic --pcap", d2))
            why = why and "softnic --pcap: " + why
        if not ok and verdict is None:
            verdict = why
        elif not ok and why != capture.NO_ROCE:  # a scenario that failed before any traffic
            verdict = "%s; %s%s" % (verdict, CAPTURE_FAIL, why)
    elif verdict is None:
        verdict = "no capture file"
    if verdict is None and sc.judge is not None:
        out = Outcome(sc, direction, side_rc, rxe_rc, logs,
                      [p for p in (pcap, os.path.join(ctx.out, sid + ".softnic.pcap"))
                       if os.path.exists(p)])
        verdict = sc.judge(out)
        log.append(("scenario check", "\n".join(out.notes)))
    write_log(os.path.join(ctx.out, sid + ".log"), log, logs, verdict)
    secs = time.monotonic() - t0
    r = Result("PASS" if verdict is None else "FAIL", secs, verdict or "")
    r.rerun = bool(verdict and sc.rerun_if and CAPTURE_FAIL not in verdict and re.search(
        sc.rerun_if, "\n".join((verdict, logs.get("rxe output", ""),
                                logs.get("softnic side output", "")))))
    return r


class Outcome:
    """What a scenario's own judge sees: exit statuses (None: stopped), the logs, the
    captures (bridge first, then softnic's --pcap). It appends what it found to notes."""

    def __init__(self, sc, direction, side_rc, rxe_rc, logs, pcaps):
        self.sc, self.direction, self.side_rc, self.rxe_rc = sc, direction, side_rc, rxe_rc
        self.logs, self.pcaps, self.notes = logs, pcaps, []


def wait_both(ctx, side, job, deadline, grace=3.0):
    """Until both sides have exited or the deadline passes; once one side has failed, the
    other gets `grace` seconds to finish on its own (it usually hangs waiting for its peer)."""
    failed_at = None
    while time.monotonic() < deadline:
        side_rc = side.poll() if side is not None else 0
        job_rc = job.rc() if job is not None else 0
        if job_rc is None and not ctx.guest.alive():
            return
        if side_rc is not None and job_rc is not None:
            return
        if side_rc not in (None, 0) or job_rc not in (None, 0):
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > grace:
                return
        time.sleep(0.05)


def judge(sc, direction, side_rc, rxe_rc, logs, ctx):
    """Reason for failure from the two exit statuses (None: did not finish by itself and
    was stopped) and outputs, or None. A side that failed by itself is named first."""
    why = []
    if rxe_rc not in (None, 0):
        why.append("rxe rc=%d: %s" % (rxe_rc, util.tail(_strip(logs.get("rxe output", "")), 1, 100)))
    if side_rc not in (None, 0):
        why.append("softnic side rc=%d: %s"
                   % (side_rc, util.tail(logs.get("softnic side output", ""), 1, 100)))
    if why:  # the other side was stopped because its peer failed: not news
        return "; ".join(why)
    if rxe_rc is None:
        why.append("rxe side did not finish within %ds%s"
                   % (sc.timeout, "" if ctx.guest.alive() else " (guest died)"))
    if side_rc is None:
        why.append("softnic side did not finish within %ds" % sc.timeout)
    if why:
        return "; ".join(why)
    expect = sc.expect_rxe
    if direction == "rxe-server" and sc.expect_rxe_server is not None:
        expect = sc.expect_rxe_server
    if expect and not re.search(expect, logs.get("rxe output", "")):
        return "rxe output lacks /%s/" % expect
    return None


def _strip(text):
    """The guest tool's own output: no '== ...' marker lines, no dmesg tail."""
    text = text.split("\n== dmesg", 1)[0]
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("== "))


def write_log(path, header, logs, verdict):
    with open(path, "w") as f:
        for k, v in header:
            f.write("## %s\n%s\n\n" % (k, v))
        for k, v in logs.items():
            f.write("## %s\n%s\n\n" % (k, (v or "").rstrip()))
        f.write("## verdict\n%s\n" % ("PASS" if verdict is None else "FAIL: " + verdict))
