"""Small helpers shared by the harness: logging, bounded waits, and a registry of the
processes this harness started, so teardown kills exactly those (by PID) and no others."""

import os
import signal
import subprocess
import sys
import time

VERBOSE = False


class ToolFailure(RuntimeError):
    """A tool under test misbehaved (as opposed to the harness itself)."""


def log(msg):
    """Progress line on stderr (stdout carries only the PASS/FAIL lines and the summary)."""
    if VERBOSE:
        print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def note(msg):
    """A line the user should see even without --verbose."""
    print("interop: %s" % msg, file=sys.stderr, flush=True)


def run(cmd, timeout=60, check=True, **kw):
    """Runs a short command to completion with a timeout; returns CompletedProcess."""
    log("$ " + " ".join(cmd))
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    res = subprocess.run(cmd, timeout=timeout, text=True, **kw)
    if check and res.returncode != 0:
        raise RuntimeError("%s failed (rc=%d): %s" % (" ".join(cmd), res.returncode,
                                                      (res.stderr or res.stdout or "").strip()[-400:]))
    return res


def wait_for(pred, timeout, step=0.05):
    """Polls pred() until it returns a truthy value or timeout seconds pass (bounded loop)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            return v
        time.sleep(step)


class Procs:
    """Every long-running child (qemu, tcpdump, softnic, clients) is started here, each in
    its own session, so cleanup can signal its whole process group by the PID we got."""

    def __init__(self):
        self.live = []

    def start(self, cmd, stdout, stderr=subprocess.STDOUT, env=None):
        log("& " + " ".join(cmd))
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                             env=env, start_new_session=True)
        self.live.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, grace=3.0):
        """Signals p's process group, waits up to grace seconds, then SIGKILLs it."""
        if p.poll() is None:
            _killpg(p, sig)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _killpg(p, signal.SIGKILL)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if p in self.live:
            self.live.remove(p)
        return p.returncode

    def stop_all(self):
        for p in list(self.live):
            self.stop(p, signal.SIGKILL, grace=2)


def _killpg(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def tail(text, n=1, width=160):
    """The last n non-empty lines of text, joined and shortened: the usual failure reason."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    s = " | ".join(lines[-n:])
    return s if len(s) <= width else s[:width - 3] + "..."


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default
