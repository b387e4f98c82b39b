"""The private network: one network namespace holding a bridge, the guest's tap and a veth
pair whose namespace-side end (sn0) carries the softnic side's address. Nothing is
configured outside the namespace; addresses come from 198.18.0.0/15 (RFC 2544 benchmarking
range) and exist only inside it.

    guest eth0 (198.18.0.11, rxe0) -- tap0 --+
                                            br0  (captured with tcpdump)
    sn0 (198.18.0.2, softnic) -- sn0-br ----+

IPv6 scenarios add SOFTNIC_IP6 on sn0 and GUEST_IP6 on the guest's eth0 (ULAs).
"""

import os
import subprocess

from . import util

PREFIX = "softnic-iop-"
SOFTNIC_IP = "198.18.0.2"
GUEST_IP = "198.18.0.11"
GUEST_MAC = "52:54:00:12:34:11"
PREFIXLEN = 24
# IPv6 (issue 10): unique local addresses (RFC 4193), also only inside the namespace.
SOFTNIC_IP6 = "fdc6:5f1c:0:1::2"
GUEST_IP6 = "fdc6:5f1c:0:1::11"
PREFIXLEN6 = 64
# And link-local ones (fe80::/10: only meaningful with the link, sn0 / eth0).
SOFTNIC_LL6 = "fe80::2"
GUEST_LL6 = "fe80::11"


def softnic_addr(sc):
    """softnic's `--addr` for scenario `sc`: IPv4, a ULA, or link-local on sn0."""
    if sc.link_local:
        return SOFTNIC_LL6 + "%sn0"
    return SOFTNIC_IP6 if sc.ipv6 else SOFTNIC_IP


class Netns:
    def __init__(self, name=None):
        self.name = name or "%s%d" % (PREFIX, os.getpid())
        self.created = False
        self.ipv6 = False

    def cmd(self, argv):
        """argv run inside the namespace (ip netns exec execs it: the PID is the command's)."""
        return ["ip", "netns", "exec", self.name] + list(argv)

    def _ip(self, *args):
        util.run(["ip", "-n", self.name] + list(args), timeout=30)

    def up(self):
        reap_stale()
        util.run(["ip", "netns", "add", self.name], timeout=30)
        self.created = True
        self._ip("link", "set", "lo", "up")
        self._ip("link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
        self._ip("tuntap", "add", "dev", "tap0", "mode", "tap")
        self._ip("link", "add", "sn0", "type", "veth", "peer", "name", "sn0-br")
        self._ip("link", "set", "tap0", "master", "br0")
        self._ip("link", "set", "sn0-br", "master", "br0")
        self._ip("addr", "add", "%s/%d" % (SOFTNIC_IP, PREFIXLEN), "dev", "sn0")
        for dev in ("br0", "tap0", "sn0-br", "sn0"):
            self._ip("link", "set", dev, "up")
        # IPv4 unless an IPv6 scenario enables it on sn0 (enable_ipv6): keeps router
        # solicitations/MLD out of the captures.
        util.run(self.cmd(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]), check=False)
        # Real UDP checksums in the capture (veth would otherwise leave them partial).
        util.run(self.cmd(["ethtool", "-K", "sn0", "tx", "off"]), check=False)

    def enable_ipv6(self):
        """IPv6 on sn0 only (the bridge forwards it at layer 2 anyway), with SOFTNIC_IP6
        and SOFTNIC_LL6 usable at once: no duplicate address detection (nodad,
        accept_dad=0)."""
        if self.ipv6:
            return
        for k, v in (("accept_dad", 0), ("disable_ipv6", 0)):
            util.run(self.cmd(["sysctl", "-qw", "net.ipv6.conf.sn0.%s=%d" % (k, v)]))
        self._ip("-6", "addr", "add", "%s/%d" % (SOFTNIC_IP6, PREFIXLEN6), "dev", "sn0", "nodad")
        self._ip("-6", "addr", "add", "%s/64" % SOFTNIC_LL6, "dev", "sn0", "nodad")
        self.ipv6 = True

    def set_mtu(self, mtu):
        """Link MTU of every port and of the bridge (the bridge takes the ports' minimum)."""
        for dev in ("tap0", "sn0-br", "sn0", "br0"):
            self._ip("link", "set", dev, "mtu", str(mtu))

    def down(self):
        if self.created:
            util.run(["ip", "netns", "del", self.name], timeout=30, check=False)
            self.created = False


def reap_stale():
    """Deletes namespaces left by earlier harness runs that were SIGKILLed (their PID is in
    the name and no longer runs). Processes are never killed here."""
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):]
        if pid.isdigit() and not os.path.exists("/proc/%s" % pid):
            util.note("deleting stale namespace %s" % name)
            util.run(["ip", "netns", "del", name], check=False)
