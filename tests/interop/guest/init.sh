#!/bin/sh
# /init of the interop guest (busybox sh, PID 1): a Debian kernel with rdma_rxe and the
# stock rdma-core/perftest tools, driven by the host through a 9p share.
#
# Kernel command line parameters:
#   iop.ip=198.18.0.11/24   address of eth0 (inside the harness's private netns only)
#   iop.mtu=1500            link MTU of eth0 (rxe's active_mtu follows: 1500 -> 1024, 9000 -> 4096)
#
# Protocol with the host (tests/interop/harness/guest.py), all files in the share (/mnt):
#   ready              written once rxe0 is up (contents: kernel release, rxe GIDs)
#   jobs/N.sh          job N, created by the host with rename() so it appears complete;
#   jobs/N.timeout     seconds after which the agent kills job N (written before N.sh)
#   jobs/N.out         the job's stdout+stderr
#   jobs/N.rc          its exit status, written (rename) when it has finished
#   jobs/N.cancel      the host gives up on job N: it is killed (status 137)
#   jobs/poweroff      stop the agent and power the guest off
# Jobs run one at a time, in order. After each job every other process is killed and the
# qdisc of eth0 is reset, so a failed or hung job cannot leak into the next one.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
echo /sbin/modprobe > /proc/sys/kernel/modprobe
up() { cut -d' ' -f1 /proc/uptime; }
echo "IOP-INIT uptime=$(up)"
# insmod in dependency order (resolved on the host with modprobe --show-depends)
for m in $(cat /etc/modules.order); do insmod "$m" 2>/dev/null; done

IP=198.18.0.11/24; MTU=1500
for x in $(cat /proc/cmdline); do
  case "$x" in
    iop.ip=*) IP="${x#iop.ip=}";;
    iop.mtu=*) MTU="${x#iop.mtu=}";;
  esac
done
hostname rxe
# busybox prefers its own ip/tc applets; they cannot do netem: use iproute2 by full path
/usr/sbin/ip link set lo up
/usr/sbin/ip link set eth0 mtu "$MTU" up
/usr/sbin/ip addr add "$IP" dev eth0
rdma link add rxe0 type rxe netdev eth0
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host0 /mnt || echo "IOP-NO-SHARE"
{
  echo "kernel $(uname -r)"
  echo "uptime $(up)"
  ibv_devinfo -d rxe0 | grep -E 'fw_ver|active_mtu|state'
  echo "gid1 $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
} > /mnt/ready.tmp 2>&1
mv /mnt/ready.tmp /mnt/ready
echo "IOP-READY ip=$IP mtu=$MTU uptime=$(up)"

n=1
while :; do
  if [ -e "/mnt/jobs/$n.sh" ]; then
    t=$(cat "/mnt/jobs/$n.timeout" 2>/dev/null); [ -n "$t" ] || t=60
    echo "IOP-JOB $n start uptime=$(up)"
    rm -f /tmp/rc
    ( timeout -s KILL "$t" sh "/mnt/jobs/$n.sh" > "/mnt/jobs/$n.out" 2>&1; echo $? > /tmp/rc ) &
    while [ ! -e /tmp/rc ]; do
      if [ -e "/mnt/jobs/$n.cancel" ]; then
        # the host gave up on this job (its other side failed): kill all but PID 1
        kill -KILL -1 2>/dev/null
        [ -e /tmp/rc ] || echo 137 > /tmp/rc
      fi
      sleep 0.1
    done
    wait
    cp /tmp/rc "/mnt/jobs/$n.rc.tmp"
    mv "/mnt/jobs/$n.rc.tmp" "/mnt/jobs/$n.rc"
    echo "IOP-JOB $n done uptime=$(up)"
    kill -KILL -1 2>/dev/null
    /usr/sbin/tc qdisc del dev eth0 root 2>/dev/null
    n=$((n + 1))
  elif [ -e /mnt/jobs/poweroff ]; then
    break
  else
    sleep 0.1
  fi
done
sync
umount /mnt 2>/dev/null
echo "IOP-POWEROFF uptime=$(up)"
poweroff -f
