"""Per-scenario capture on the bridge and the check of what was captured.

The check has up to three opinions:
  * `softnic decode FILE` (exit 0 = every RoCEv2 packet parsed and its ICRC verified), when
    the decoder is built (probed in nic.py);
  * the harness's own ICRC check (roce.check_capture), always: independent of the wire crate;
  * when the decoder is not ready, tshark must see RRoCE packets (it decodes but never
    validates ICRCs, so it only proves the capture holds RoCEv2).
"""

import os
import signal
import subprocess
import time

from . import roce, util

NO_ROCE = "capture holds no RoCEv2 packets"


class Capture:
    def __init__(self, procs, netns, pcap, logpath):
        self.procs, self.netns, self.pcap, self.logpath = procs, netns, pcap, logpath
        self.proc = None

    def start(self):
        if os.path.exists(self.pcap):
            os.remove(self.pcap)
        # -Z root: tcpdump would otherwise drop to user tcpdump and fail to write here.
        # --immediate-mode: without it libpcap hands packets over only when a ring block
        # retires (up to ~1 s), and a short scenario's packets die with the SIGINT.
        # -B: a 64 MiB ring; with the default 2 MiB the kernel dropped ~30% of a 4-QP
        # write_bw before tcpdump could copy it out.
        cmd = self.netns.cmd(["tcpdump", "-i", "br0", "-s", "0", "-B", "65536", "-U", "--immediate-mode",
                              "-n", "-Z", "root",
                              "-w", self.pcap, "not ip6 or udp"])  # no ND/MLD
        self.proc = self.procs.start(cmd, stdout=open(self.logpath, "wb"))
        ok = util.wait_for(lambda: "listening on" in util.read(self.logpath)
                           or self.proc.poll() is not None, 15)
        if not ok or self.proc.poll() is not None:
            raise RuntimeError("tcpdump did not start: " + util.tail(util.read(self.logpath), 2))

    def stop(self):
        """Stops tcpdump; returns its closing statistics (under CPU load the kernel drops
        packets before tcpdump sees them: the capture is then a sample, and the check
        covers only what was captured)."""
        if self.proc is not None:
            time.sleep(0.3)  # let the last frames (final ACKs) reach the capture
            self.procs.stop(self.proc, signal.SIGINT, grace=5)
            self.proc = None
        return ", ".join(ln.strip() for ln in util.read(self.logpath).splitlines()
                         if ln.strip().split(" ", 1)[0].isdigit())


def check_cm_names(pcap, decoded, details):
    """Every packet to QP1 is a CM MAD (the harness's own reading, roce.cm_mads) and
    `softnic decode` names it the same: its line for that frame holds `cm(NAME `.
    Returns the first problem, or None; appends a summary to details."""
    lines = {}
    for ln in decoded.splitlines():
        head = ln.split(" ", 1)[0]
        if head.isdigit():
            lines[int(head)] = ln
    mads = roce.cm_mads(pcap)
    if not mads:
        return None
    count = {}
    for n, name, why in mads:
        if name is None:
            return "frame %d: a packet to QP1 that is not a CM MAD (%s)" % (n, why)
        if "cm(%s " % name not in lines.get(n, ""):
            return "frame %d: softnic decode does not name the CM MAD %s" % (n, name)
        count[name] = count.get(name, 0) + 1
    details.append("CM MADs on QP1: %d, each named by softnic decode (%s)" % (
        len(mads), ", ".join("%s %d" % kv for kv in sorted(count.items()))))
    return None


def check(pcap, softnic_bin, decoder_ready):
    """Returns (ok, reason, details) for one capture."""
    if not os.path.exists(pcap):
        return False, "no capture file", ""
    total, good, first_bad = roce.check_capture(pcap)
    details = ["harness ICRC check: %d RoCEv2 packets, %d ICRC OK%s"
               % (total, good, "" if first_bad is None else "; first bad: " + first_bad)]
    if total == 0:
        return False, NO_ROCE, "\n".join(details)
    if decoder_ready:
        r = subprocess.run([softnic_bin, "decode", pcap], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        details.append("softnic decode: rc=%d, %s" % (r.returncode, util.tail(r.stdout + r.stderr, 2)))
        with open(pcap + ".decode.txt", "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            return False, "softnic decode rc=%d: %s" % (r.returncode, util.tail(r.stderr or r.stdout)), \
                "\n".join(details)
        bad = check_cm_names(pcap, r.stdout, details)
        if bad:
            return False, bad, "\n".join(details)
    else:
        r = subprocess.run(["tshark", "-n", "-r", pcap, "-Y", "udp.dstport==4791 && infiniband",
                            "-T", "fields", "-e", "frame.number"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=120)
        n = len(r.stdout.split())
        details.append("tshark: %d frames decode as RRoCE (softnic decode not ready)" % n)
        if n != total:
            return False, "tshark decodes %d of %d RoCEv2 packets" % (n, total), "\n".join(details)
    if good != total:
        return False, "ICRC mismatch: " + (first_bad or ""), "\n".join(details)
    return True, "", "\n".join(details)
