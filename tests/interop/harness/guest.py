"""One rxe guest: qemu (TCG; KVM cannot boot a stock kernel on these hosts) on the tap of
the private namespace, with a 9p share through which jobs are handed to the agent in
guest/init.sh. A guest is booted once per batch of scenarios with the same link MTU and
rebooted when it stops answering."""

import os
import shutil
import time

from . import net, util

BOOT_TIMEOUT = 120  # seconds from qemu start to the agent's "ready" file (normally ~8 s)


class Guest:
    def __init__(self, procs, netns, image, rundir, mtu):
        self.procs, self.netns, self.image, self.mtu = procs, netns, image, mtu
        self.share = os.path.join(rundir, "share")
        self.jobs = os.path.join(self.share, "jobs")
        self.console = os.path.join(rundir, "console.log")
        self.qemu = None
        self.next_job = 1
        self.boot_seconds = None
        self.info = ""

    def boot(self):
        """Starts qemu and waits until the agent reports rxe0 up. Raises on failure."""
        shutil.rmtree(self.share, ignore_errors=True)
        os.makedirs(self.jobs)
        self.next_job = 1
        append = ("console=ttyS0 quiet panic=-1 iop.ip=%s/%d iop.mtu=%d"
                  % (net.GUEST_IP, net.PREFIXLEN, self.mtu))
        cmd = self.netns.cmd([
            "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1",
            "-nographic", "-no-reboot", "-kernel", self.image.vmlinuz, "-initrd", self.image.initrd,
            "-append", append,
            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
            "-device", "virtio-net-pci,netdev=n0,mac=%s" % net.GUEST_MAC,
            "-virtfs", "local,path=%s,mount_tag=host0,security_model=none,id=fs0" % self.share])
        t0 = time.monotonic()
        self.qemu = self.procs.start(cmd, stdout=open(self.console, "ab"))
        ready = os.path.join(self.share, "ready")
        util.wait_for(lambda: os.path.exists(ready) or self.qemu.poll() is not None,
                      BOOT_TIMEOUT, step=0.05)
        if not os.path.exists(ready):
            why = "exited rc=%s" % self.qemu.returncode if self.qemu.poll() is not None \
                else "not ready after %ds" % BOOT_TIMEOUT
            self.kill()
            raise RuntimeError("guest boot failed (%s); console: %s"
                               % (why, util.tail(util.read(self.console), 3)))
        self.boot_seconds = time.monotonic() - t0
        self.info = util.read(ready)
        util.log("guest up in %.1fs (mtu %d): %s" % (self.boot_seconds, self.mtu,
                                                    self.info.replace("\n", "; ")))

    def alive(self):
        return self.qemu is not None and self.qemu.poll() is None

    def submit(self, script, timeout):
        """Hands a shell script to the agent; it is killed after timeout seconds."""
        n = self.next_job
        self.next_job += 1
        base = os.path.join(self.jobs, str(n))
        with open(base + ".timeout", "w") as f:
            f.write("%d\n" % timeout)
        with open(base + ".sh.tmp", "w") as f:
            f.write(script.replace("@JOB@", "/mnt/jobs/%d" % n))
        os.rename(base + ".sh.tmp", base + ".sh")
        return Job(base)

    def shutdown(self):
        if self.qemu is None:
            return
        if self.alive():
            open(os.path.join(self.jobs, "poweroff"), "w").close()
            util.wait_for(lambda: not self.alive(), 15)
        self.kill()

    def kill(self):
        if self.qemu is not None:
            self.procs.stop(self.qemu, grace=2)
            self.qemu = None


class Job:
    """A job in the guest: files N.sh, N.out, N.ready (written by the job), N.rc."""

    def __init__(self, base):
        self.base = base

    def ready(self):
        return os.path.exists(self.base + ".ready")

    def rc(self):
        s = util.read(self.base + ".rc").strip()
        return int(s) if s.lstrip("-").isdigit() else None

    def cancel(self, wait=5.0):
        """Asks the agent to kill the job; True once its status is in."""
        if self.rc() is None:
            open(self.base + ".cancel", "w").close()
            util.wait_for(lambda: self.rc() is not None, wait)
        return self.rc() is not None

    def output(self):
        return util.read(self.base + ".out")
