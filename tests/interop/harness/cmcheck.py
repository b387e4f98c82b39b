"""Verdicts of the RDMA CM rows that test more than "both tools exit 0" (issue 11):
a CM MAD lost on purpose and resent per IBTA 12.9, and connections the peer refuses or
that nobody answers, which must end in RDMA_CM_EVENT_REJECTED / _UNREACHABLE within
bounded time instead of hanging. Each judge gets a runner.Outcome and returns the
reason for failure or None, noting what it saw in outcome.notes."""

import re

from . import roce, util

# softnic's CM resends an unanswered REQ this many times (nic/cm/mod.rs MAX_CM_RETRIES)
SOFTNIC_MAX_CM_RETRIES = 7
NO_CM_LOSS = "no CM MAD was resent"  # a loss row whose random loss missed every CM MAD

# Linux's ib_cm counts its resends per port (/sys/class/infiniband/DEV/ports/PORT/
# cm_tx_retries/{req,rep,dreq,...}) over the guest's life, so a row reads them before
# and after its tool and prints the difference.
# Without that directory the line says "missing" and the verdict fails.
_GUEST_CM_RETRIES = ("cat /sys/class/infiniband/*/ports/*/cm_tx_retries/* 2>/dev/null"
                     " | awk '{s += $1; n++} END {print n ? s : \"missing\"}'")
GUEST_CM_RETRIES_BEFORE = "cm_retries_before=$(%s)" % _GUEST_CM_RETRIES
GUEST_CM_RETRIES_AFTER = "\n".join([
    "cm_retries_after=$(%s)" % _GUEST_CM_RETRIES,
    'case "$cm_retries_before$cm_retries_after" in',
    '  *missing*) echo "guest cm_tx_retries missing" ;;',
    '  *) echo "guest cm_tx_retries $((cm_retries_after - cm_retries_before))" ;;',
    "esac",
    "grep -H . /sys/class/infiniband/*/ports/*/cm_tx_retries/* 2>/dev/null | grep -v ':0$'"])


def stats(o):
    """softnic stats of the scenario as a dict."""
    out = {}
    for ln in o.logs.get("softnic stats", "").splitlines():
        parts = ln.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cm_names(pcap):
    return [name for _n, name, _why in roce.cm_mads(pcap)]


def both_tools_ok(o):
    """The default verdict (runner.judge) for a judged row."""
    from . import runner  # noqa: PLC0415 - runner imports scenarios, which imports us

    class _Guest:
        @staticmethod
        def alive():
            return True

    class _Ctx:
        guest = _Guest
    return runner.judge(o.sc, o.direction, o.side_rc, o.rxe_rc, o.logs, _Ctx)


def dropped_and_resent(msg):
    """`softnic run --drop-cm MSG:1`: the connection still comes up and works (both tools
    exit 0), the injector dropped exactly one packet, and the lost MAD was made up for:
    softnic resent its REQ/REP (cm_tx_retries), or for a lost RTU the peer resent its
    REP, which softnic answered again (cm_rx_duplicates) — unless RC traffic reached the
    peer first, which establishes the connection there too (IBTA 12.9.6, the
    'communication established' event), and the row then says so."""
    def judge(o):
        why = both_tools_ok(o)
        if why:
            return why
        s = stats(o)
        o.notes.append("fault_dropped %s, cm_tx_retries %s, cm_rx_duplicates %s" % (
            s.get("fault_dropped"), s.get("cm_tx_retries"), s.get("cm_rx_duplicates")))
        bridge = cm_names(o.pcaps[0])
        o.notes.append("CM MADs on the bridge: " + " ".join(bridge))
        if s.get("fault_dropped") != 1:
            return "the injector dropped %s packets, not the one %s" % (s.get("fault_dropped"), msg)
        if msg in ("REQ", "REP"):
            if s.get("cm_tx_retries", 0) < 1:
                return "the lost %s was not resent (cm_tx_retries 0)" % msg
            name = "ConnectRequest" if msg == "REQ" else "ConnectReply"
            if bridge.count(name) != 1:
                return "%d %s on the bridge, expected the one resend" % (bridge.count(name), name)
        if msg == "RTU":
            if bridge.count("ReadyToUse") < 1 and s.get("cm_rx_duplicates", 0) < 1:
                o.notes.append("the peer took the first RC packet as its RTU")
        return None
    return judge


def lost_on_the_guest(o):
    """netem on the guest's egress: both tools exit 0 and a CM's retry path ran: softnic
    resent a REQ/DREQ or answered a MAD the guest resent, or the guest's CM resent (a
    REP that drew no RTU because netem ate it, a DREQ whose DREP never came) and softnic
    took the late MAD. Which side resends first is a race of two ≈ 260 ms timers (a
    fast KVM guest's REP timer wins; a slow TCG guest lets softnic's REQ timer win), so
    either counts. A resend also follows a guest slower than softnic's 268 ms response
    timeout (without an MRA); the captures cannot tell the two apart, as netem drops
    before the bridge."""
    why = both_tools_ok(o)
    if why:
        return why
    s = stats(o)
    m = re.search(r"^guest cm_tx_retries (-?\d+)$", o.logs.get("rxe output", ""), re.M)
    if not m:
        return "the guest printed no cm_tx_retries count (ib_cm's sysfs counters missing?)"
    guest = int(m.group(1))
    o.notes.append("softnic cm_tx_retries %s, cm_rx_duplicates %s; guest cm_tx_retries %d" % (
        s.get("cm_tx_retries"), s.get("cm_rx_duplicates"), guest))
    if s.get("cm_tx_retries", 0) + s.get("cm_rx_duplicates", 0) + guest == 0:
        return NO_CM_LOSS
    return None


def _elapsed_in_guest(text):
    """Seconds between the guest job's '== T rxe: CMD' and '== T rxe: rc=' markers."""
    t = re.findall(r"^== ([0-9.]+) rxe: ", text, re.M)
    return float(t[-1]) - float(t[0]) if len(t) >= 2 else None


def refused(event, error, rej_reason=None, req_count=None, bound=None):
    """The client (the tool that connects: softnic's in rxe-server rows, the guest's in
    softnic-server rows) gave up by itself with `event` and status `error`, within
    `bound` seconds where the guest's clock shows it; the softnic capture shows the REQs
    (`req_count` of them, when given) and a REJ with `rej_reason` (when given)."""
    def judge(o):
        softnic_client = o.direction == "rxe-server"
        rc = o.side_rc if softnic_client else o.rxe_rc
        out = o.logs.get("softnic side output" if softnic_client else "rxe output", "")
        if rc is None:
            return "the client did not give up by itself within %ds (a hang)" % o.sc.timeout
        if rc == 0:
            return "the client connected"
        pat = r"%s, error %s\b" % (event, error)
        if not re.search(pat, out):
            return "client output lacks /%s/: %s" % (pat, util.tail(out, 2, 200))
        o.notes.append("client: " + re.search(pat, out).group(0))
        if not softnic_client:
            took = _elapsed_in_guest(out)
            o.notes.append("the guest client ran %.2fs" % took if took is not None else "?")
            if bound and took is not None and took > bound:
                return "the guest client took %.1fs to give up (bound %ds)" % (took, bound)
        pcap = o.pcaps[-1]  # softnic's own --pcap: every MAD it sent and received
        names = cm_names(pcap)
        o.notes.append("CM MADs (softnic --pcap): " + " ".join(names))
        if req_count is not None and names.count("ConnectRequest") != req_count:
            return "%d REQs, expected %d" % (names.count("ConnectRequest"), req_count)
        if rej_reason is not None:
            dec = util.read(pcap + ".decode.txt")
            if not re.search(r"cm\(ConnectReject .*reason=%d\b" % rej_reason, dec):
                return "no REJ with reason %d in the capture" % rej_reason
        return None
    return judge
