"""Host packages and the guest image: Debian's kernel (which has rdma_rxe as a module)
plus a busybox initramfs with the host's rdma-core, ibverbs-utils, perftest, rdmacm-utils,
qperf and iproute2 binaries copied in with their shared libraries.

The kernel .deb is only downloaded and unpacked, never installed on the host. The image is
cached under a key that covers everything it is built from (kernel package, guest init,
this file, the versions of the copied tools), so a change to any of them rebuilds it.
"""

import hashlib
import os
import shutil
import subprocess
import time

from . import util

HERE = os.path.dirname(os.path.abspath(__file__))
INIT = os.path.join(os.path.dirname(HERE), "guest", "init.sh")

# Host packages: qemu for the guest, the tools whose binaries go into the guest, and what
# the harness itself uses on the host (capture, decode fallback, netns plumbing).
HOST_PACKAGES = ["qemu-system-x86", "busybox-static", "rdma-core", "ibverbs-providers",
                 "ibverbs-utils", "perftest", "rdmacm-utils", "qperf", "iproute2", "tcpdump", "tshark",
                 "kmod", "cpio", "ethtool", "python3"]
# Tools copied into the guest: their versions are part of the cache key.
TOOL_PACKAGES = ["busybox-static", "rdma-core", "ibverbs-providers", "ibverbs-utils",
                 "perftest", "rdmacm-utils", "qperf", "iproute2", "kmod"]

# Modules loaded in the guest (dependencies are added by modprobe --show-depends).
# crc32_generic/crc32-pclmul: rxe asks the crypto API for "crc32" (its ICRC).
# sch_netem: loss inside the guest (the host kernel has no netem).
MODULES = ["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "crc32_generic", "crc32-pclmul",
           "udp_tunnel", "ip6_udp_tunnel", "ib_core", "ib_uverbs", "rdma_rxe", "ib_cm", "iw_cm",
           "rdma_cm", "rdma_ucm", "ib_umad", "sch_netem"]

BINARIES = ["/usr/bin/ibv_devices", "/usr/bin/ibv_devinfo", "/usr/bin/ibv_rc_pingpong",
            "/usr/bin/ibv_uc_pingpong", "/usr/bin/ibv_ud_pingpong", "/usr/bin/ibv_srq_pingpong",
            "/usr/bin/ib_write_bw", "/usr/bin/ib_read_bw", "/usr/bin/ib_send_bw",
            "/usr/bin/ib_atomic_bw", "/usr/bin/ib_write_lat", "/usr/bin/ib_read_lat",
            "/usr/bin/ib_send_lat", "/usr/bin/ib_atomic_lat", "/usr/bin/rping",
            "/usr/bin/ucmatose", "/usr/bin/udaddy", "/usr/bin/mckey", "/usr/bin/rstream",
            "/usr/bin/riostream", "/usr/bin/qperf",
            "/usr/bin/rdma", "/usr/sbin/ip", "/usr/sbin/tc", "/usr/bin/kmod"]
# dlopen()ed, so ldd does not list them: the rxe verbs provider, and libgcc_s, which glibc
# loads for pthread_exit (without it rping aborts at exit).
EXTRA_FILES = ["/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
               "/lib/x86_64-linux-gnu/libgcc_s.so.1"]


def default_cache():
    return os.environ.get("SOFTNIC_INTEROP_CACHE", "/var/cache/softnic-interop")


def ensure_host_packages():
    """apt-get installs whichever HOST_PACKAGES are missing (update only if needed)."""
    missing = [p for p in HOST_PACKAGES if not _installed(p)]
    if not missing:
        return []
    util.note("installing host packages: " + " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends"] + missing
    if util.run(cmd, timeout=1200, check=False, env=env).returncode != 0:
        util.run(["apt-get", "update"], timeout=600, env=env)
        util.run(cmd, timeout=1200, env=env)
    return missing


def _installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return r.returncode == 0 and r.stdout.endswith(" installed")


def _version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return r.stdout.strip()


def kernel_package():
    """linux-image-<abi>-amd64 that Debian's linux-image-amd64 currently points at
    (override: SOFTNIC_INTEROP_KPKG)."""
    if os.environ.get("SOFTNIC_INTEROP_KPKG"):
        return os.environ["SOFTNIC_INTEROP_KPKG"]
    r = util.run(["apt-cache", "depends", "linux-image-amd64"], timeout=60, check=False)
    if r.returncode != 0:  # no package lists yet (fresh CI image)
        util.run(["apt-get", "update"], timeout=600,
                 env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        r = util.run(["apt-cache", "depends", "linux-image-amd64"], timeout=60)
    out = r.stdout
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split()[1]
    raise RuntimeError("apt-cache depends linux-image-amd64 names no linux-image-* package")


def _download_kernel(cache, kpkg):
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    have = [f for f in os.listdir(debs) if f.startswith(kpkg + "_") and f.endswith(".deb")]
    if have:
        return os.path.join(debs, sorted(have)[-1])
    util.note("downloading %s" % kpkg)
    cmd = ["apt-get", "download", kpkg]
    if util.run(cmd, timeout=900, check=False, cwd=debs).returncode != 0:
        util.run(["apt-get", "update"], timeout=600)
        util.run(cmd, timeout=900, cwd=debs)
    have = [f for f in os.listdir(debs) if f.startswith(kpkg + "_") and f.endswith(".deb")]
    if not have:
        raise RuntimeError("apt-get download %s produced no .deb in %s" % (kpkg, debs))
    return os.path.join(debs, sorted(have)[-1])


def _cache_key(deb):
    h = hashlib.sha256()
    h.update(os.path.basename(deb).encode())
    for path in (INIT, os.path.abspath(__file__)):
        with open(path, "rb") as f:
            h.update(f.read())
    for p in TOOL_PACKAGES:
        h.update(("%s=%s\n" % (p, _version(p))).encode())
    return h.hexdigest()[:16]


class Image:
    """A built guest: vmlinuz, initrd.img and the kernel release they boot."""

    def __init__(self, path):
        self.path = path
        self.vmlinuz = os.path.join(path, "vmlinuz")
        self.initrd = os.path.join(path, "initrd.img")
        self.kernel_release = util.read(os.path.join(path, "kernel-release")).strip()
        self.kernel_package = util.read(os.path.join(path, "kernel-package")).strip()


def prepare(cache, rebuild=False):
    """Returns a cached Image, building it first if its key changed. Also returns the
    seconds spent building (0.0 when cached)."""
    kpkg = kernel_package()
    deb = _download_kernel(cache, kpkg)
    key = _cache_key(deb)
    dest = os.path.join(cache, "images", key)
    if os.path.exists(os.path.join(dest, "initrd.img")) and not rebuild:
        return Image(dest), 0.0
    t0 = time.monotonic()
    util.note("building guest image %s from %s" % (key, os.path.basename(deb)))
    work = os.path.join(cache, "build.%d" % os.getpid())
    shutil.rmtree(work, ignore_errors=True)
    try:
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        _build(deb, kpkg, work, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(cache, keep_image=key, keep_deb=os.path.basename(deb))
    return Image(dest), time.monotonic() - t0


def _prune(cache, keep_image, keep_deb):
    """Only the current image and kernel .deb stay in the cache (older ones are 20 and
    70 MB each, and a CI cache would otherwise grow with every kernel update)."""
    images = os.path.join(cache, "images")
    for d in os.listdir(images):
        if d != keep_image:
            shutil.rmtree(os.path.join(images, d), ignore_errors=True)
    debs = os.path.join(cache, "debs")
    for f in os.listdir(debs):
        if f != keep_deb and f.endswith(".deb"):
            os.remove(os.path.join(debs, f))


def _build(deb, kpkg, work, out):
    kdir = os.path.join(work, "kpkg")
    root = os.path.join(work, "rootfs")
    os.makedirs(kdir)
    util.run(["dpkg-deb", "-x", deb, kdir], timeout=300)
    kv = kpkg[len("linux-image-"):]
    if not os.path.exists(os.path.join(kdir, "boot", "vmlinuz-" + kv)):
        raise RuntimeError("%s has no boot/vmlinuz-%s" % (deb, kv))
    util.run(["depmod", "-b", kdir, kv], timeout=300)  # the .deb ships no modules.dep

    for d in ["bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "mnt", "run", "root",
              "usr/bin", "usr/sbin", "lib", "lib64", "etc/libibverbs.d"]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    shutil.copy2("/bin/busybox", os.path.join(root, "bin", "busybox"))
    applets = util.run([os.path.join(root, "bin", "busybox"), "--list"]).stdout.split()
    for a in applets:
        link = os.path.join(root, "bin", a)
        if not os.path.lexists(link):
            os.symlink("busybox", link)

    order = []
    for m in MODULES:
        deps = util.run(["modprobe", "-d", kdir, "-S", kv, "--show-depends", m]).stdout
        for line in deps.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod":
                rel = os.path.relpath(parts[1], kdir)
                if "/" + rel not in order:
                    _copy(parts[1], os.path.join(root, rel))
                    order.append("/" + rel)
    with open(os.path.join(root, "etc", "modules.order"), "w") as f:
        f.write("\n".join(order) + "\n")
    util.run(["depmod", "-b", root, kv], timeout=120)

    for b in BINARIES + EXTRA_FILES:
        _copy_with_libs(b, root)
    for a in ["modprobe", "insmod", "lsmod", "rmmod", "depmod", "modinfo"]:
        _force_symlink("/usr/bin/kmod", os.path.join(root, "sbin", a))
    # prefer iproute2's ip/tc over busybox applets (busybox tc cannot configure netem)
    for a in ["ip", "tc"]:
        p = os.path.join(root, "bin", a)
        if os.path.lexists(p):
            os.remove(p)
    _force_symlink("/usr/sbin/ip", os.path.join(root, "sbin", "ip"))
    _write(os.path.join(root, "etc", "libibverbs.d", "rxe.driver"), "driver rxe\n")
    _write(os.path.join(root, "etc", "passwd"), "root:x:0:0:root:/root:/bin/sh\n")
    _write(os.path.join(root, "etc", "group"), "root:x:0:\n")
    _write(os.path.join(root, "etc", "hosts"), "127.0.0.1 localhost\n")
    _write(os.path.join(root, "etc", "nsswitch.conf"), "hosts: files dns\n")
    for f in ["/etc/protocols", "/etc/services"]:
        if os.path.exists(f):
            shutil.copy2(f, os.path.join(root, "etc"))
    shutil.copy2(INIT, os.path.join(root, "init"))
    os.chmod(os.path.join(root, "init"), 0o755)

    initrd = os.path.join(out, "initrd.img")
    util.run(["bash", "-c", "set -o pipefail; cd \"$1\" && find . -print0 | "
              "cpio --null -o -H newc --quiet | gzip -1 > \"$2\"", "cpio", root, initrd],
             timeout=300)
    shutil.copy2(os.path.join(kdir, "boot", "vmlinuz-" + kv), os.path.join(out, "vmlinuz"))
    _write(os.path.join(out, "kernel-release"), kv + "\n")
    _write(os.path.join(out, "kernel-package"), os.path.basename(deb) + "\n")
    manifest = ["kernel %s" % os.path.basename(deb)] + \
        ["%s %s" % (p, _version(p)) for p in TOOL_PACKAGES] + ["modules:"] + order
    _write(os.path.join(out, "manifest.txt"), "\n".join(manifest) + "\n")


def _copy(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.exists(dst):
        shutil.copy2(src, dst, follow_symlinks=True)


def _copy_with_libs(path, root):
    if not os.path.exists(path):
        raise RuntimeError("%s is missing on the host (package not installed?)" % path)
    _copy(path, root + path)
    out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        # "libx.so => /lib/.../libx.so (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        lib = parts[2] if "=>" in parts and len(parts) > 2 else (parts[0] if parts else "")
        if lib.startswith("/") and os.path.exists(lib):
            _copy(lib, root + lib)


def _force_symlink(target, link):
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
