"""The scenario table: issue 5's RC matrix, as data.

Each row runs in both directions unless it says otherwise:
  rxe-server      the guest's stock tool is the server; the softnic side connects to it
  softnic-server  the softnic side is the server; the guest's tool connects to it
The client gets the server's address appended, as ibv_rc_pingpong and perftest expect.

Placeholders in `softnic`: {softnic} (the binary), {rc_pingpong} (the example), {dev} (the
NIC's name), {addr} (its address), {fakepeer} (the harness's Python peer). GID index: rxe's
IPv4-mapped GID is index 1 (`-g 1` / `-x 1`), and so is softnic's (same table layout).

`needs` lists softnic capabilities (nic.Softnic.CAPS); a row whose needs are not built
is reported SKIP with the reason.
"""

import ipaddress
import re
from dataclasses import dataclass, field, replace

from . import cmcheck, net, tclass, ucloss

DIRECTIONS = ("rxe-server", "softnic-server")


@dataclass
class Scenario:
    name: str
    rxe: str                     # the guest's command (server form)
    softnic: str                 # the softnic side's command (server form)
    needs: tuple = ("run",)
    link_mtu: int = 1500         # link MTU of the guest, bridge and veth (9000 for path MTU 4096)
    nic_args: tuple = ()         # extra `softnic run` arguments
    guest_setup: str = ""        # shell lines run in the guest before the tool
    guest_post: str = ""         # shell lines run in the guest after it
    timeout: int = 45            # seconds for the whole exchange
    expect_rxe: str = ""         # regex the guest tool's output must contain
    expect_rxe_server: str = None  # ... when it is the server, if that differs
    directions: tuple = DIRECTIONS
    port: int = 18515
    group: str = ""
    note: str = field(default="", repr=False)
    # A verdict of its own instead of "both tools exit 0" (runner.judge): called after the
    # captures are checked, as judge(Outcome); returns the failure reason or None.
    judge: object = field(default=None, repr=False)
    ipv6: bool = False           # softnic and rxe on their IPv6 addresses (net.*_IP6)
    # RDMA CM rows: the server listens through the CM (no TCP port to look for; the
    # runner waits for the listen in `rdma res` / `softnic stats`), and the client's
    # command, if given, is its own line with {peer} for the server's address.
    cm: bool = False
    rxe_client: str = None
    softnic_client: str = None
    # A failure whose tools' output matches this regex is a known race of the stock
    # tools, not a fault: the runner starts the scenario over (runner.MAX_RERUNS times)
    # and says so in the result.
    rerun_if: str = ""
    # False: the server opens no port and no CM listener to wait for (mckey's receiver
    # only joins a group; its sender waits 3 s after its own join before sending).
    listens: bool = True
    netns_setup: tuple = ()      # commands (argv tuples) run in the namespace first
    link_local: bool = False     # ... their link-local ones (net.*_LL6), with ipv6

    @property
    def nic_mtu(self):
        """softnic's --mtu: the largest IB MTU the link carries (IBTA 9.6.1.1 / rxe)."""
        return 4096 if self.link_mtu >= 4096 + 100 else 1024


PINGPONG_OK = r"\d+ iters in [0-9.]+ seconds"
PERF_OK = r"#bytes"
NETEM = "/usr/sbin/tc qdisc add dev eth0 root netem loss 5%"
NETEM_SHOW = "/usr/sbin/tc -s qdisc show dev eth0"


def _pingpong():
    rows = []
    for mtu, link in ((1024, 1500), (4096, 9000)):
        for size in (1, 3000, 8192):
            args = "-s %d -m %d -n 20 -c" % (size, mtu)
            rows.append(Scenario(
                name="pingpong_s%d_m%d" % (size, mtu), group="rc_pingpong",
                rxe="ibv_rc_pingpong -d rxe0 -g 1 " + args,
                softnic="{rc_pingpong} -d {dev} -g 1 " + args,
                needs=("run", "rc_pingpong"), link_mtu=link, expect_rxe=PINGPONG_OK))
    return rows


def _perf(name, tool, args, test, extra_needs=(), **kw):
    """A perftest row. `--verify` makes the softnic side check the data wherever it is the
    side the data lands on (docs/perf-tool.md): written/sent bytes on a softnic server,
    read bytes on a softnic client, every atomic's original value on a softnic client, the
    atomic targets on a softnic server. perftest itself checks nothing."""
    return Scenario(
        name=name, group=kw.pop("group", "perftest"),
        rxe="%s -d rxe0 -x 1 -F %s" % (tool, args),
        softnic="{softnic} perf %s -d {dev} -x 1 -F --verify %s" % (test, args),
        needs=("run", "perf") + tuple(extra_needs), expect_rxe=PERF_OK, **kw)


def _stock(tool):
    """A stock rdma-core/perftest binary on softnic's drop-in libibverbs.so.1."""
    return "{softnic} exec -d {dev} -- " + tool


# Path MTUs and the link MTU that gives each (rxe's active_mtu follows the link).
MTUS = ((1024, 1500), (4096, 9000))


def _ibv_pp(kind, sizes_by_mtu, rxe_flags, ours_flags, stock=True, timeout=45):
    """ibv_{kind}_pingpong rows: per path MTU and size, our example ({kind}_pingpong)
    and (if `stock`) the stock binary over `softnic exec`, against the stock binary on rxe."""
    rows = []
    for mtu, link in MTUS:
        for size in sizes_by_mtu(mtu):
            args = rxe_flags(size, mtu)
            name = "%s_pp_s%d_m%d" % (kind, size, mtu)
            rxe = "ibv_%s_pingpong -d rxe0 -g 1 %s" % (kind, args)
            for suffix, softnic, needs in [
                    ("", "{%s_pingpong} -d {dev} -g 1 %s" % (kind, ours_flags(size, mtu)),
                     ("run", "%s_pingpong" % kind)),
                    ("_stock", _stock("ibv_%s_pingpong -d {dev} -g 1 %s" % (kind, args)),
                     ("run", "exec"))][:2 if stock else 1]:
                rows.append(Scenario(name=name + suffix, group=kind + "_pingpong", rxe=rxe,
                                     softnic=softnic, needs=needs, link_mtu=link,
                                     expect_rxe=PINGPONG_OK, timeout=timeout))
    return rows


def _uc_ud_srq():
    """Issue 10's UC, UD and SRQ rows."""
    return (
        # UC: 1 byte, one packet, and 8 KiB (8 or 2 packets) per path MTU
        _ibv_pp("uc", lambda mtu: (1, 1024, 8192),
                lambda size, mtu: "-s %d -m %d -n 20 -c" % (size, mtu),
                lambda size, mtu: "-s %d -m %d -n 20" % (size, mtu))
        # UD: the payload must fit one packet: 1, 1024 and the path MTU
        + _ibv_pp("ud", lambda mtu: sorted({1, 1024, mtu}),
                  lambda size, mtu: "-s %d -n 20 -c" % size,
                  lambda size, mtu: "-s %d -n 20" % size)
        # SRQ: 4 RC QPs on one shared receive queue, multi-packet messages; our example
        # and the stock binary over the drop-in library.
        + _ibv_pp("srq", lambda mtu: (4096,) if mtu == 1024 else (8192,),
                  lambda size, mtu: "-q 4 -s %d -m %d -n 40" % (size, mtu),
                  lambda size, mtu: "-q 4 -s %d -m %d -n 40" % (size, mtu)))


BW = "-s 65536 -n 50"
LAT = "-s 64 -n 200"

SCENARIOS = [
    # Harness self-test: the guest's ibv_rc_pingpong against the Python peer. Needs no softnic.
    Scenario(name="selftest_fakepeer", group="selftest",
             rxe="ibv_rc_pingpong -d rxe0 -g 1 -s 3000 -m 1024 -n 8 -c",
             softnic="{fakepeer} --local {addr} -s 3000 -m 1024 -n 8",
             needs=(), expect_rxe=PINGPONG_OK, timeout=40),
] + _pingpong() + [
    _perf("send_bw", "ib_send_bw", BW, "send_bw"),
    _perf("write_bw", "ib_write_bw", BW, "write_bw"),
    _perf("read_bw", "ib_read_bw", BW, "read_bw"),
    _perf("atomic_bw_fadd", "ib_atomic_bw", "-A FETCH_AND_ADD -n 200", "atomic_bw"),
    _perf("atomic_bw_cas", "ib_atomic_bw", "-A CMP_AND_SWAP -n 200", "atomic_bw"),
    _perf("write_lat", "ib_write_lat", LAT, "write_lat"),
    _perf("send_lat", "ib_send_lat", LAT, "send_lat"),
    # perftest's read_lat server only waits and closes: it prints no result table
    _perf("read_lat", "ib_read_lat", LAT, "read_lat", expect_rxe_server=r"remote address: LID"),
    # several QPs at once
    _perf("write_bw_q4", "ib_write_bw", BW + " -q 4", "write_bw", group="multi-qp"),
    _perf("send_bw_q4", "ib_send_bw", BW + " -q 4", "send_bw", group="multi-qp"),
    # 5% loss inside the guest (netem; the host kernel has no sch_netem)
    Scenario(name="loss_guest_pingpong", group="loss-guest",
             rxe="ibv_rc_pingpong -d rxe0 -g 1 -s 3000 -m 1024 -n 100 -c",
             softnic="{rc_pingpong} -d {dev} -g 1 -s 3000 -m 1024 -n 100 -c",
             needs=("run", "rc_pingpong"), guest_setup=NETEM, guest_post=NETEM_SHOW,
             expect_rxe=PINGPONG_OK, timeout=90),
    _perf("loss_guest_write_bw", "ib_write_bw", BW, "write_bw", group="loss-guest",
          guest_setup=NETEM, guest_post=NETEM_SHOW, timeout=90),
    _perf("loss_guest_read_bw", "ib_read_bw", BW, "read_bw", group="loss-guest",
          guest_setup=NETEM, guest_post=NETEM_SHOW, timeout=90),
    # 5% loss from softnic's own fault injection (seeded: reproducible). The softnic side
    # keeps its QP for 1 s after its last completion (--linger-ms): softnic drops 5 % of
    # the ACKs it sends too, and when the ACK of rxe's last SEND is one of them, rxe
    # (retry_cnt 7: no limit) resends that SEND until the scenario times out unless a QP
    # is still there to acknowledge the duplicate (IBTA 9.7.5.1.3).
    Scenario(name="loss_softnic_pingpong", group="loss-softnic",
             rxe="ibv_rc_pingpong -d rxe0 -g 1 -s 3000 -m 1024 -n 100 -c",
             softnic="{rc_pingpong} -d {dev} -g 1 -s 3000 -m 1024 -n 100 -c --linger-ms 1000",
             needs=("run", "rc_pingpong", "loss"), nic_args=("--loss", "0.05", "--seed", "1"),
             expect_rxe=PINGPONG_OK, timeout=90),
    _perf("loss_softnic_write_bw", "ib_write_bw", BW, "write_bw", extra_needs=("loss",),
          group="loss-softnic", nic_args=("--loss", "0.05", "--seed", "2"), timeout=90),
    _perf("loss_softnic_read_bw", "ib_read_bw", BW, "read_bw", extra_needs=("loss",),
          group="loss-softnic", nic_args=("--loss", "0.05", "--seed", "3"), timeout=90),
]


# Issue 10: UC, UD and SRQ against rxe. perftest over UD and UC: `softnic perf` has RC
# and UC (with --use-srq for the SEND tests); UD runs the stock perftest over the drop-in
# library. UD and UC have no retransmission: a packet lost on the bridge leaves the
# receiving side waiting, so the counts stay small.
UC_BW = "-c UC -s 8192 -n 100"
SCENARIOS += _uc_ud_srq() + [
    _perf("uc_send_bw", "ib_send_bw", UC_BW, "send_bw", group="uc-perftest"),
    _perf("uc_write_bw", "ib_write_bw", UC_BW, "write_bw", group="uc-perftest"),
    _perf("srq_send_bw", "ib_send_bw", BW + " --use-srq", "send_bw", group="srq-perftest"),
] + [
    Scenario(name=name, group=group, rxe="%s -d rxe0 -x 1 -F %s" % (tool, args),
             softnic=_stock("%s -d {dev} -x 1 -F %s" % (tool, args)), needs=("run", "exec"),
             expect_rxe=PERF_OK, **kw)
    for name, group, tool, args, kw in (
        ("ud_send_bw_stock", "ud-perftest", "ib_send_bw", "-c UD -s 1024 -n 100", {}),
        ("ud_send_lat_stock", "ud-perftest", "ib_send_lat", "-c UD -s 64 -n 200", {}),
        # UD multicast without the CM: the server attaches its QP to 239.77.1.2 with
        # ibv_attach_mcast (an IPv4-mapped MGID: perftest refuses its default one with
        # an IPv4 GID), the client sends to QPN 0xFFFFFF. softnic-server only: rxe's
        # attach joins no IP group (docs/interop.md, "rxe behaviour worth knowing"), so
        # an rxe receiver gets nothing without the CM's join (the mckey row).
        ("mcg_send_bw_stock", "ud-perftest", "ib_send_bw",
         "-c UD -g -M 0:0:0:0:0:0:0:0:0:0:255:255:239:77:1:2 -s 1024 -n 100",
         {"directions": ("softnic-server",)}),
        ("uc_send_bw_stock", "uc-perftest", "ib_send_bw", UC_BW, {}),
        ("uc_write_bw_stock", "uc-perftest", "ib_write_bw", UC_BW, {}),
    )
] + [
    # UC under 5 % loss on rxe's egress: softnic must drop every message that lost a
    # packet, whole (harness/ucloss.py). Only rxe sends, so only softnic-server.
    # `--timeout` bounds the receiver's wait for messages that never come (the run ends
    # on it) and also its wait for rxe's TCP connection to the exchange, whose packets
    # netem drops too: with 3 s, a lost SYN (or ARP) and a lost first SYN retransmission
    # (TCP retries after 1 s, then 3 s) left rxe "Couldn't connect" and the capture
    # empty (session 6). 10 s covers SYN retries at 1, 3 and 7 s.
    Scenario(name="loss_guest_uc_send", group="loss-guest",
             rxe="ib_send_bw -d rxe0 -x 1 -F -c UC -s 8192 -n 200",
             softnic="{softnic} perf send_bw -d {dev} -x 1 -F -c UC -s 8192 -n 200 --timeout 10",
             needs=("run", "perf", "stats"), guest_setup=NETEM, guest_post=NETEM_SHOW,
             directions=("softnic-server",), judge=ucloss.judge, timeout=45),
]


# Issue 11: the RDMA CM against the kernel CM on rxe. The guest runs the stock rdmacm-utils
# and perftest `-R` binaries; softnic runs the same binaries over `softnic exec` (the
# drop-in librdmacm.so.1 and libibverbs.so.1: the CM on QP1 runs in the NIC). The servers
# listen through the CM, so the runner waits for the listen itself (Scenario.cm).
def _cm(name, server, client, port, expect="", **kw):
    """A CM row: `server` / `client` are the stock command lines (client with {peer});
    the guest runs them on rxe0, softnic through `softnic exec`."""
    return Scenario(name=name, group=kw.pop("group", "rdma-cm"), cm=True, port=port,
                    rxe=server.format(addr=net.GUEST_IP, dev="rxe0"),
                    rxe_client=client.format(dev="rxe0", peer="{peer}"),
                    softnic=_stock(server.format(addr="{addr}", dev="{dev}")),
                    softnic_client=_stock(client.format(dev="{dev}", peer="{peer}")),
                    needs=("run", "exec") + tuple(kw.pop("extra_needs", ())), expect_rxe=expect,
                    **kw)


def _rping(size, count, verbose):
    """rping: SEND of the buffer address, RDMA READ of the client's buffer, RDMA WRITE back,
    `count` times, every ping validated (-V) on both sides; -v prints each one."""
    flags = "-C %d -S %d -V%s" % (count, size, " -v" if verbose else "")
    return _cm("rping_s%d" % size, "rping -s -a {addr} -p 7174 " + flags,
               "rping -c -a {peer} -p 7174 " + flags, 7174,
               expect=r"rdma-ping-%d: " % (count - 1) if verbose else "")


# perftest 4.5's listen race (docs/rdmacm.md): the server destroys its listener after the
# first connection and listens again later; a quick client's second REQ can come in
# between and is refused (REJ reason 8) by the server's CM, Linux's or softnic's alike,
# and perftest's client cannot retry (fixed upstream after 4.5).
LISTEN_RACE = r"RDMA_CM_EVENT_REJECTED; error: 8"
# Against the TCG guest's slow server the softnic client lost that race in most runs of
# ib_read_lat: its second REQ (the test connection's) is therefore dropped once on
# purpose, so the CM resends it after its response timeout (268 ms), when the server
# listens again. Only softnic's active side sends REQs: no effect as a server.
SLOW_SECOND_REQ = ("--drop-cm", "REQ:2")
CM_BW = "-R -F -s 65536 -n 50"
CM_LAT = "-R -F -s 64 -n 200"
SCENARIOS += [
    _rping(64, 10, True),
    _rping(4096, 10, False),
    _rping(65535, 10, False),
    # four RC connections at once, 10 SENDs each way on each
    _cm("ucmatose_c4", "ucmatose -b {addr} -c 4 -C 10", "ucmatose -s {peer} -c 4 -C 10", 7471,
        expect=r"test complete"),
    # RDMA_PS_UDP: SIDR REQ/REP (IBTA 12.11) resolves the UD QP; two ids, 10 SENDs each
    _cm("udaddy_c2", "udaddy -b {addr} -c 2 -C 10", "udaddy -s {peer} -c 2 -C 10", 7174,
        expect=r"test complete"),
    _cm("write_bw_cm", "ib_write_bw -d {dev} " + CM_BW, "ib_write_bw -d {dev} %s {peer}" % CM_BW,
        18515, expect=PERF_OK, rerun_if=LISTEN_RACE, nic_args=SLOW_SECOND_REQ,
        extra_needs=("drop_cm",)),
    # rsockets: rdma-core's protocol (rsocket.c in the guest's librdmacm, softnic's
    # rsocket/ over its NIC's CM): the REQ/REP's rs_conn_data, RDMA WRITEs with immediate
    # into the peer's buffer halves, credit and grant updates, the closing DISCONNECT;
    # rstream checks every byte (-T v), blocking (-T b: the guest's CPU is slow), 50
    # transfers of 100,000 bytes each way (the rings wrap mid-transfer).
    _cm("rstream", "rstream -b {addr} -p 7472 -T v -T b -S 100000 -C 50",
        "rstream -s {peer} -p 7472 -T v -T b -S 100000 -C 50", 7472, expect=r"custom"),
    # riostream: each side riomaps its buffer (RDMA_IOMAPSIZE in the REQ/REP's
    # rs_conn_data, the mapping sent as an RDMA WRITE with immediate into the peer's
    # iomap array), the peer riowrites each transfer straight into it (RDMA WRITEs
    # without immediate), the reader spins on the buffer's last byte; -T v checks it all.
    _cm("riostream", "riostream -b {addr} -p 7476 -T v -T b -S 100000 -C 20",
        "riostream -s {peer} -p 7476 -T v -T b -S 100000 -C 20", 7476, expect=r"custom"),
    # perftest's read_lat server prints no result table, only its address lines
    _cm("read_lat_cm", "ib_read_lat -d {dev} " + CM_LAT, "ib_read_lat -d {dev} %s {peer}" % CM_LAT,
        18515, expect=r"remote address", rerun_if=LISTEN_RACE, nic_args=SLOW_SECOND_REQ,
        extra_needs=("drop_cm",)),
]

# UD multicast through the CM: rdmacm-utils' mckey. The receiver (the "server") joins an
# IPv4 group (rdma_resolve_addr to the group, rdma_join_multicast: the kernel CM's IGMP
# join on rxe, a group socket in softnic) and waits for the sender's ten 100-byte SENDs
# with immediate to QPN 0xFFFFFF; the sender joins as well and sends 3 s after its
# MULTICAST_JOIN (mckey's own pause for a subnet manager), so there is nothing to wait
# for before starting it. A receiver that misses a datagram never finishes.
MCAST_GROUP = "239.77.1.1"
SCENARIOS += [
    Scenario(name="mckey", group="rdma-cm-mcast", cm=True, listens=False,
             rxe="mckey -m %s -b %s" % (MCAST_GROUP, net.GUEST_IP),
             rxe_client="mckey -m %s -b %s -s" % (MCAST_GROUP, net.GUEST_IP),
             softnic=_stock("mckey -m %s -b {addr}" % MCAST_GROUP),
             softnic_client=_stock("mckey -m %s -b {addr} -s" % MCAST_GROUP),
             needs=("run", "exec"), expect_rxe=r"data transfers complete"),
]

# A lost REQ, REP or RTU (IBTA 12.9): softnic drops exactly one of its own MADs
# (`softnic run --drop-cm MSG:1`) and the connection must still come up, the MAD resent
# by whichever side the spec makes responsible (harness/cmcheck.py). REQ and RTU come
# from the active side (softnic connects: rxe-server), the REP from the passive one.
PING = "-C 10 -S 64 -V"
SCENARIOS += [
    _cm("cm_lost_%s" % msg.lower(), "rping -s -a {addr} -p 7174 " + PING,
        "rping -c -a {peer} -p 7174 " + PING, 7174, group="cm-loss",
        nic_args=("--drop-cm", msg + ":1"), directions=(direction,), extra_needs=("drop_cm",),
        judge=cmcheck.dropped_and_resent(msg), timeout=30)
    for msg, direction in (("REQ", "rxe-server"), ("REP", "softnic-server"),
                           ("RTU", "rxe-server"))
] + [
    # 20 % loss on the guest's egress (its REPs and DREPs to softnic's REQs and DREQs,
    # and its RC packets): softnic resends after its CM response timeout, Linux answers a
    # resent REQ with its REP again — or Linux resends first (its REP after ≈ 256 ms
    # without an RTU, its DREQ without a DREP), which a fast KVM guest wins. 8
    # connections, so that 16 of the guest's MADs are exposed (with 4, runs that lost
    # none were common; with 16 the TCG guest answered so slowly that softnic resent most
    # REQs until Linux's MRAs came); a run in which neither CM resent anything tests
    # nothing here: it is started over.
    _cm("cm_loss_guest_ucmatose", "ucmatose -b {addr} -c 8 -C 4",
        "ucmatose -s {peer} -c 8 -C 4", 7471, group="cm-loss",
        guest_setup=NETEM.replace("5%", "20%") + "\n" + cmcheck.GUEST_CM_RETRIES_BEFORE,
        guest_post=NETEM_SHOW + "\n" + cmcheck.GUEST_CM_RETRIES_AFTER,
        directions=("rxe-server",), judge=cmcheck.lost_on_the_guest,
        rerun_if=cmcheck.NO_CM_LOSS, timeout=60),
]

# Refused and unanswered connections end in an event, not a hang. A listener on port
# 7175 gives the runner a server to wait for; the client connects to 7176, where nobody
# listens: the peer's CM answers REJ reason 8 (invalid service ID) — Linux's to
# softnic, softnic's to Linux. And softnic's REQ to an address nobody has (a static
# neighbour entry makes its frames reach the bridge) is resent MAX_CM_RETRIES times
# and then reported UNREACHABLE, status -ETIMEDOUT.
DEAD_IP = "198.18.0.99"
SCENARIOS += [
    _cm("cm_refused", "rping -s -a {addr} -p 7175 -C 1", "rping -c -a {peer} -p 7176 -C 1",
        7175, group="cm-refused",
        judge=cmcheck.refused("RDMA_CM_EVENT_REJECTED", 8, rej_reason=8, req_count=1, bound=5),
        timeout=20),
    _cm("cm_unreachable", "rping -s -a {addr} -p 7175 -C 1",
        "rping -c -a %s -p 7175 -C 1" % DEAD_IP, 7175, group="cm-refused",
        netns_setup=(("ip", "neigh", "replace", DEAD_IP, "lladdr", "02:00:00:00:00:99",
                      "dev", "sn0"),),
        directions=("rxe-server",),
        judge=cmcheck.refused("RDMA_CM_EVENT_UNREACHABLE", -110,
                              req_count=1 + cmcheck.SOFTNIC_MAX_CM_RETRIES),
        timeout=20),
]

# qperf (Debian's stock binary; docs/ibverbs.md): its RC tests over the CM (-cm1), its
# own exchange on TCP 19765, where the server listens from the start (so this is not a
# `cm` row: the server's CM id exists only once a client asked for a test). Each test
# makes one connection; `ver_rc_fetch_add` checks every value the atomics return, and
# `quit` ends the server. The verdict: both exit 0 and the client's output, whichever
# side it is, has every test's figure.
#
# qperf's own listen race: its server sends the client its CM port over TCP *before* it
# calls rdma_listen (cm_open_server: rdma_bind_addr, send_mesg, rdma_listen), so a quick
# client's REQ can arrive first; the server's CM, Linux's or softnic's, refuses it (REJ
# reason 8, invalid service ID) and qperf's client reports the REJECTED event and cannot
# retry. In the slow TCG guest the window is wide enough to be hit (CI, 2026-12-03,
# rxe-server: the capture showed the REQ and a REJ with reason 8).
QPERF_LISTEN_RACE = r"unexpected event from RDMA CM: Event rejected"
QPERF_TESTS = ("rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_lat", "ver_rc_fetch_add")
QPERF_CLIENT = "qperf -lp 19765 -cm1 -t 2 {peer} %s quit" % " ".join(QPERF_TESTS)


def _qperf_judge(out):
    """Both sides exit 0, and each of QPERF_TESTS printed its result line in the client's
    output (the softnic side's when rxe serves, the guest's otherwise)."""
    if out.rxe_rc != 0 or out.side_rc != 0:
        return "rxe rc=%s, softnic side rc=%s" % (out.rxe_rc, out.side_rc)
    client = out.logs.get("softnic side output" if out.direction == "rxe-server"
                          else "rxe output", "")
    for t in QPERF_TESTS:
        m = re.search(r"(?m)^%s:\n\s+(bw|latency|msg_rate)\s+=\s+([0-9.]+) (\S+)" % t, client)
        if not m:
            return "no %s result in the client's output" % t
        out.notes.append("%s: %s = %s %s" % (t, m.group(1), m.group(2), m.group(3)))
    return None


SCENARIOS += [
    Scenario(name="qperf_rc_cm", group="qperf", port=19765,
             rxe="qperf -lp 19765", rxe_client=QPERF_CLIENT,
             softnic=_stock("qperf -lp 19765"), softnic_client=_stock(QPERF_CLIENT),
             needs=("run", "exec"), judge=_qperf_judge, rerun_if=QPERF_LISTEN_RACE,
             timeout=90),
]

# Traffic class (IP TOS, tclass.py): perftest's --tclass puts it in each side's address
# vector (RC: every WRITE one way, every ACK the other; UD: the address handle), and
# with -R -T the active side's id TOS travels in the REQ's primary path, from which the
# passive side's QP takes it — Linux's ib_cm on rxe, softnic's CM here.
SCENARIOS += [
    Scenario(name=name, group="tclass", rxe="%s -d rxe0 -x 1 -F %s" % (tool, args),
             softnic=_stock("%s -d {dev} -x 1 -F %s" % (tool, args)), needs=("run", "exec"),
             expect_rxe=PERF_OK, judge=tclass.every_packet(tos, both_ways))
    for name, tool, args, tos, both_ways in (
        ("tclass_write_bw_stock", "ib_write_bw", "--tclass=96 " + BW, 96, True),
        ("tclass_ud_send_bw_stock", "ib_send_bw", "-c UD --tclass=46 -s 1024 -n 100", 46,
         False),
    )
] + [
    _cm("tos_write_bw_cm", "ib_write_bw -d {dev} -T 184 " + CM_BW,
        "ib_write_bw -d {dev} -T 184 %s {peer}" % CM_BW, 18515, group="tclass",
        expect=PERF_OK, rerun_if=LISTEN_RACE, judge=tclass.cm_connection(184)),
    # UD: the client's id TOS is the traffic class of its ESTABLISHED address; the server
    # answers through ibv_create_ah_from_wc, which reads the TOS from the GRH (the IP
    # header as it arrived): every datagram both ways carries it.
    _cm("tos_udaddy", "udaddy -b {addr} -t 72 -C 10", "udaddy -s {peer} -t 72 -C 10", 7174,
        group="tclass", expect=r"test complete", judge=tclass.every_packet(72)),
]

# IPv6 (issue 10): the guest gets net.GUEST_IP6 and the GID index rxe lists it at (it
# appends GIDs as addresses appear, so the index is looked up, into $G); softnic's
# address GID is index 1 whatever the family. The TCP exchanges stay on IPv4; the RoCE
# traffic goes where the GIDs say.
def _guest_v6(addr, peer):
    """Guest lines: `addr` on eth0, $G = the rxe GID index it appears at, then wait until
    eth0 is usable and learn `peer` (softnic)."""
    return "\n".join([
        "/usr/sbin/ip -6 addr add %s/%d dev eth0 nodad 2>/dev/null" % (addr, net.PREFIXLEN6),
        "G=; i=0",
        "while [ -z \"$G\" ] && [ $i -lt 40 ]; do",
        "  for x in 0 1 2 3 4 5 6 7 8 9; do",
        "    [ \"$(cat /sys/class/infiniband/rxe0/ports/1/gids/$x 2>/dev/null)\" = %s ] && G=$x"
        % ipaddress.ip_address(addr).exploded,
        "  done",
        "  [ -n \"$G\" ] || sleep 0.05; i=$((i + 1))",
        "done",
        "echo \"== rxe GID index of %s: ${G:-none}\"" % addr,
        # rxe resolves the peer's MAC when the QP goes to RTR and fails ("Failed to modify
        # QP to RTR") while eth0's link-local address is tentative (just after boot) and
        # the neighbour unknown: wait for DAD to finish, then learn the neighbour.
        "i=0; while [ -n \"$(/usr/sbin/ip -6 addr show dev eth0 tentative)\" ] && [ $i -lt 60 ]; do",
        "  sleep 0.05; i=$((i + 1))",
        "done",
        "ping -6 -c 1 -W 2 %s >/dev/null 2>&1 || echo \"== ping -6 %s failed\"" % (peer, peer)])


GUEST_V6 = _guest_v6(net.GUEST_IP6, net.SOFTNIC_IP6)
# Link-local: the guest's own fe80::11 (its GID too), softnic's fe80::2 reached on eth0.
GUEST_LL6 = _guest_v6(net.GUEST_LL6, net.SOFTNIC_LL6 + "%eth0")


def _v6(s, link_local=False):
    """The same row over IPv6 (ULAs, or link-local addresses with their link)."""
    rxe = s.rxe.replace(" -g 1 ", " -g $G ").replace(" -x 1 ", " -x $G ")
    assert "$G" in rxe, s.name
    setup = GUEST_LL6 if link_local else GUEST_V6
    return replace(s, name=s.name + ("_ll6" if link_local else "_v6"), group="ipv6", rxe=rxe,
                   ipv6=True, link_local=link_local,
                   guest_setup="\n".join(x for x in (setup, s.guest_setup) if x))


# The RC matrix over IPv6 (a representative part: every operation, both path MTUs),
# and UC/UD (the UD GRH is then the IPv6 header).
V6_ROWS = ("pingpong_s8192_m1024", "pingpong_s8192_m4096", "send_bw", "write_bw", "read_bw",
           "atomic_bw_fadd", "atomic_bw_cas", "write_lat", "send_lat", "read_lat",
           "write_bw_q4", "uc_pp_s8192_m1024", "ud_pp_s1024_m1024", "ud_pp_s4096_m4096",
           "srq_pp_s4096_m1024")
# Link-local (fe80::, `softnic run --addr fe80::2%sn0`): RC both path MTUs, READ, UD.
LL6_ROWS = ("pingpong_s8192_m1024", "pingpong_s8192_m4096", "write_bw", "read_bw",
            "ud_pp_s1024_m1024")
SCENARIOS += ([_v6(s) for s in SCENARIOS if s.name in V6_ROWS]
              + [_v6(s, link_local=True) for s in SCENARIOS if s.name in LL6_ROWS])

# The RDMA CM over IPv6: the IP CM header and the GIDs carry the ULAs; the tools are
# given IPv6 addresses ({peer} is then the other side's ULA). perftest -R is not among
# them: without its IPv6 options perftest 4.5 resolves the server as IPv4 ("Address
# family for hostname not supported").
CM_V6_ROWS = ("rping_s64", "ucmatose_c4", "udaddy_c2")
SCENARIOS += [replace(s, name=s.name + "_v6", group="ipv6", ipv6=True,
                      rxe=s.rxe.replace(net.GUEST_IP, net.GUEST_IP6),
                      guest_setup="\n".join(x for x in (GUEST_V6, s.guest_setup) if x))
              for s in SCENARIOS if s.name in CM_V6_ROWS]
assert len([s for s in SCENARIOS if s.ipv6]) == len(V6_ROWS) + len(LL6_ROWS) + len(CM_V6_ROWS)


@dataclass(frozen=True)
class Xfail:
    """An expected failure: `reason` is the one-line verdict; `behaviour` the rxe or
    softnic behaviour behind it (mirrored in docs/interop.md, "Expected failures")."""
    reason: str
    behaviour: str
    match: str = ""  # regex the FAIL reason must contain (else it is an unexpected FAIL)


# "name.direction" -> Xfail. `--ci` reports these as XFAIL (and an unexpected pass as
# XPASS); neither fails the run. Every entry must name a concrete cause; a softnic bug that
# can be fixed is fixed, not listed here.
EXPECTED_FAILURES: dict = {}


def expected_failure(s, d):
    return EXPECTED_FAILURES.get(ident(s, d))


def check_table():
    """Every expected failure names a real scenario and gives its reasons (a renamed row
    must not silently turn an XFAIL into a FAIL, or leave a stale entry behind)."""
    known = {ident(s, d) for s, d in expand()}
    bad = [k for k, x in EXPECTED_FAILURES.items()
           if k not in known or not x.reason or not x.behaviour or not x.match]
    if bad:
        raise SystemExit("scenarios.EXPECTED_FAILURES: unknown or incomplete entries: %s"
                         % ", ".join(sorted(bad)))


def expand(scenarios=None):
    """(scenario, direction) pairs in table order."""
    return [(s, d) for s in (scenarios or SCENARIOS) for d in s.directions]


def ident(s, d):
    return "%s.%s" % (s.name, d)
