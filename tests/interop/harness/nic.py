"""The softnic side: finding the binaries, probing which parts are built (scenarios that
need a missing part are SKIPped, not failed), and running `softnic run` for a scenario."""

import os
import random
import shutil
import subprocess
import tempfile

from . import roce, util

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# verbs-api examples the scenarios run ({rc_pingpong}, {uc_pingpong}, ...).
EXAMPLES = ("rc_pingpong", "uc_pingpong", "ud_pingpong", "srq_pingpong")
# Stock rdma-core/perftest binaries run on softnic through `softnic exec` (the drop-in
# libibverbs.so.1); HOST_PACKAGES in image.py installs them.
STOCK = ("ibv_uc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong", "ibv_rc_pingpong",
         "ib_send_bw", "ib_write_bw", "ib_send_lat", "ib_read_lat", "rping", "ucmatose",
         "udaddy", "mckey")
GOOD_CAPTURE = os.path.join(REPO, "tests", "data", "captures", "rxe-lab", "rc_send.pcap")


def target_dirs():
    dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.append(os.environ["CARGO_TARGET_DIR"])
    dirs.append(os.path.join(REPO, "target"))
    return dirs


def find_binary(explicit, rel_paths):
    """explicit path, else the newest of <target>/{release,debug}/<rel> that exists."""
    if explicit:
        return os.path.abspath(explicit) if os.access(explicit, os.X_OK) else None
    found = []
    for t in target_dirs():
        for prof in ("release", "debug"):
            for rel in rel_paths:
                p = os.path.join(t, prof, rel)
                if os.path.isfile(p) and os.access(p, os.X_OK):
                    found.append(p)
    return max(found, key=os.path.getmtime) if found else None


def build(release=True):
    """cargo build of the softnic binary and the verbs-api examples (for --build). Returns
    the paths of what it built: (softnic, rc_pingpong). They are used as they are, not
    "the newest binary": cargo leaves an up-to-date binary's mtime alone, so a debug build
    made later (say by the unit tests) would otherwise win."""
    prof = ["--release"] if release else []
    for cmd in (["cargo", "build", "-p", "softnic", "--bins"] + prof,
                ["cargo", "build", "-p", "verbs-api", "--examples"] + prof):
        util.note("$ " + " ".join(cmd))
        subprocess.run(cmd, cwd=REPO, check=True, timeout=3600)
    out = os.path.join(target_dirs()[0], "release" if release else "debug")
    return os.path.join(out, "softnic"), os.path.join(out, "examples", "rc_pingpong")


class Softnic:
    """Paths and capabilities. caps maps a capability to None (available) or to the reason
    it is not, e.g. {"run": "softnic run has no --addr (not built yet)"}."""

    CAPS = ("run", "rc_pingpong", "perf", "loss", "pcap", "decode", "stats") + EXAMPLES[1:] \
        + ("exec", "drop_cm")

    def __init__(self, softnic=None, rc_pingpong=None):
        self.bin = find_binary(softnic, ["softnic"])
        self.rc_pingpong = find_binary(rc_pingpong, ["examples/rc_pingpong", "rc_pingpong"])
        # The other examples come from the same build as rc_pingpong.
        self.examples = {"rc_pingpong": self.rc_pingpong}
        for ex in EXAMPLES[1:]:
            p = os.path.join(os.path.dirname(self.rc_pingpong), ex) if self.rc_pingpong else None
            self.examples[ex] = p if p and os.access(p, os.X_OK) else None
        self.caps = {}
        self.probe()

    def _help(self, *sub):
        try:
            r = subprocess.run([self.bin] + list(sub) + ["--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        return r.returncode, r.stdout

    def probe(self):
        c = self.caps
        if self.bin is None:
            for k in self.CAPS:
                c[k] = "no softnic binary (build it or pass --softnic)"
            if self.rc_pingpong is None:
                c["rc_pingpong"] = "no rc_pingpong example binary (pass --rc-pingpong)"
            return
        rc, out = self._help("run")
        has = lambda flag: rc == 0 and flag in out  # noqa: E731
        c["run"] = None if has("--addr") and has("--name") else \
            "softnic run has no --name/--addr (not built yet)"
        c["loss"] = None if has("--loss") else \
            "softnic run has no --loss (fault injection not built yet)"
        c["pcap"] = None if has("--pcap") else "softnic run has no --pcap"
        c["drop_cm"] = None if has("--drop-cm") else "softnic run has no --drop-cm"
        rc_p, _ = self._help("perf")
        c["perf"] = None if rc_p == 0 else "softnic perf not built yet"
        rc_s, out_s = self._help("stats")
        c["stats"] = None if rc_s == 0 and "--name" in out_s else "softnic stats has no --name"
        c["rc_pingpong"] = None if self.rc_pingpong else \
            "no rc_pingpong example binary (cargo build -p verbs-api --examples)"
        for ex in EXAMPLES[1:]:
            c[ex] = None if self.examples[ex] else \
                "no %s example binary (cargo build -p verbs-api --examples)" % ex
        c["decode"] = self._probe_decode()
        c["exec"] = self._probe_exec()

    def _probe_exec(self):
        """`softnic exec` is usable when it finds (or links) the drop-in library and the
        stock binaries are installed."""
        missing = [b for b in STOCK if not shutil.which(b)]
        if missing:
            return "stock binaries missing: %s (ibverbs-utils, perftest)" % " ".join(missing)
        try:
            r = subprocess.run([self.bin, "exec", "--print-lib-dir"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return "softnic exec failed to run: %s" % e
        if r.returncode != 0:
            return "softnic exec has no drop-in library: " + util.tail(r.stdout, 1)
        return None

    def _probe_decode(self):
        """Ready when it accepts a known-good rxe capture AND rejects a copy with one
        payload byte flipped (so it really verifies ICRCs)."""
        if not os.path.exists(GOOD_CAPTURE):
            return "reference capture %s missing" % GOOD_CAPTURE
        try:
            good = subprocess.run([self.bin, "decode", GOOD_CAPTURE], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=60).returncode
            with tempfile.NamedTemporaryFile(suffix=".pcap") as t:
                t.write(roce.corrupt_one_roce_byte(GOOD_CAPTURE))
                t.flush()
                bad = subprocess.run([self.bin, "decode", t.name], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, timeout=60).returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            return "softnic decode failed to run: %s" % e
        if good != 0:
            return "softnic decode rejects a good rxe capture (rc=%d): not ready" % good
        if bad == 0:
            return "softnic decode accepts a corrupted capture: not ready"
        return None

    def missing(self, needs):
        """Reason a scenario with these needs cannot run, or None."""
        for k in needs:
            if self.caps.get(k, "unknown capability %s" % k):
                return self.caps[k]
        return None


class Nic:
    """One `softnic run` inside the namespace for one scenario."""

    def __init__(self, procs, netns, softnic, addr, mtu, extra, rundir, logpath, pcap=None):
        self.procs, self.netns, self.softnic = procs, netns, softnic
        self.name = "iop%d" % random.randrange(1 << 20)
        self.dir = os.path.join(rundir, "softnic-dir")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.env = dict(os.environ, SOFTNIC_DIR=self.dir)
        self.cmd = [softnic.bin, "run", "--name", self.name, "--addr", addr, "--mtu", str(mtu)] + extra
        if pcap and softnic.caps.get("pcap") is None:
            self.cmd += ["--pcap", pcap]
        self.logpath = logpath
        self.proc = None

    def start(self):
        self.proc = self.procs.start(self.netns.cmd(self.cmd), stdout=open(self.logpath, "wb"),
                                     env=self.env)
        sock = os.path.join(self.dir, self.name + ".sock")
        util.wait_for(lambda: os.path.exists(sock) or self.proc.poll() is not None, 15)
        if not os.path.exists(sock):
            why = ("exited rc=%s" % self.proc.returncode) if self.proc.poll() is not None \
                else "no control socket after 15s"
            raise util.ToolFailure("softnic run %s: %s" % (why, util.tail(util.read(self.logpath), 2)))

    def stats(self):
        if self.softnic.caps.get("stats") is not None or self.proc is None:
            return ""
        try:
            r = subprocess.run(self.netns.cmd([self.softnic.bin, "stats", "--name", self.name]),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=10, env=self.env)
            return r.stdout
        except subprocess.TimeoutExpired:
            return "(softnic stats timed out)"

    def stop(self):
        """SIGTERM (softnic stops cleanly), SIGKILL after 5 s. Returns its exit status."""
        if self.proc is None:
            return None
        rc = self.procs.stop(self.proc, grace=5)
        self.proc = None
        return rc
