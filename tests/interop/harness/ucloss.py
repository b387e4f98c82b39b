"""UC under loss: the check that a message which lost a packet is dropped whole.

IBTA 9.8.3 (UC responder): a PSN gap, or a Middle/Last that does not continue the message
in progress, ends that message; it is silently discarded and its receive WQE is reused,
so the receiver never completes a message of which a packet is missing ("torn").

The scenario: rxe sends UC SENDs through 5 % netem loss on its own egress; softnic
receives them with `softnic perf send_bw -c UC`, which waits for every message and so
gives up (`--timeout`) once the sender is done. What softnic received is exactly what
its own `--pcap` recorded (the bridge capture is the fallback). From it this module
counts the messages that arrived intact (First, Middles, Last on consecutive PSNs, or an
Only) and those cut by a gap, and compares with softnic's counters:

  qp_completions_success + qp_drop_no_recv_wqe == intact    (no torn message completed,
                                                             no intact one lost)
  qp_drop_uc_message == messages cut after their First     (the last one may still be
                                                             "in progress": -1 allowed)
  cut >= 1                                                  (the loss was exercised)

A message whose First was lost never starts: its Middle/Last packets, like the rest of a
cut message, are dropped outside any message (counted here as "headless" packets, for
the log only).
"""

import re

from . import roce

# UC opcodes (IBTA 9.2.1, table 38): 0b001xxxxx
UC = 0x20
FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05


def uc_messages(path, dest_qpns=None):
    """Walks the UC SEND packets of a capture per destination QP, as the responder of
    IBTA 9.8.3 would. Returns (intact, cut, unfinished, headless, packets): messages
    whose packets all arrived; messages whose First arrived but not the rest (a gap or a
    new First ended them); of those, the one still in progress at the end of the
    capture (no later packet showed it cut); Middle/Last packets outside a message in
    progress (the rest of a cut message, or of one whose First was lost); UC SEND
    packets seen."""
    bths = (roce.parse_bth(payload) for _n, _ip, _udp, payload, _c in roce.roce_packets(path))
    return walk((b for b in bths if b is not None), dest_qpns)


def walk(bths, dest_qpns=None):
    """uc_messages over parsed BTHs (roce.parse_bth) in arrival order."""
    state = {}  # dest QPN -> (next PSN, a message in progress)
    intact = cut = headless = packets = 0
    for b in bths:
        if b["opcode"] & 0xE0 != UC:
            continue
        op = b["opcode"] & 0x1F
        if op not in (FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM):
            continue  # RDMA WRITEs: not what this scenario sends
        q = b["dest_qpn"]
        if dest_qpns is not None and q not in dest_qpns:
            continue
        packets += 1
        nxt, inside = state.get(q, (None, False))
        if inside and (b["psn"] != nxt or op in (FIRST, ONLY, ONLY_IMM)):
            cut += 1  # the message in progress lost a packet
            inside = False
        if op == FIRST:
            inside = True
        elif op in (ONLY, ONLY_IMM):
            intact += 1
        elif not inside:
            headless += 1
        elif op in (LAST, LAST_IMM):
            intact += 1
            inside = False
        state[q] = ((b["psn"] + 1) & roce.PSN_MASK, inside)
    unfinished = sum(1 for _, inside in state.values() if inside)
    return intact, cut + unfinished, unfinished, headless, packets


def stats(text):
    """`softnic stats` text output as a dict."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+) (\d+)$", line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def judge(o):
    """The UC-loss verdict (see the module doc); o is a runner.Outcome."""
    side = o.logs.get("softnic side output", "")
    if o.side_rc in (None, 0) or "no completion within" not in side:
        # Under 5 % loss some of the 200 multi-packet messages are always cut, so the
        # receiver must end by its --timeout, never with a full count or another error.
        return "softnic receiver did not end by its --timeout (rc=%s): %s" % (
            o.side_rc, side.strip().splitlines()[-1:] or "no output")
    if not o.pcaps:
        return "no capture to count messages in"
    pcap = o.pcaps[-1]  # softnic's own --pcap when there is one: exactly what it received
    intact, cut, unfinished, headless, packets = uc_messages(pcap)
    st = stats(o.logs.get("softnic stats", ""))
    need = ("qp_completions_success", "qp_drop_no_recv_wqe", "qp_drop_uc_message")
    if any(k not in st for k in need):
        return "softnic stats lacks %s" % ", ".join(k for k in need if k not in st)
    o.notes.append("%s: %d UC SEND packets; messages: %d intact, %d cut after their First "
                   "(%d unfinished at the end), %d packets outside a message in progress"
                   % (pcap, packets, intact, cut, unfinished, headless))
    o.notes.append("softnic: %d receive completions, %d messages dropped for lack of a WQE, "
                   "%d UC messages dropped (IBTA 9.8.3)" % tuple(st[k] for k in need))
    return verdict((intact, cut, unfinished, headless, packets), *(st[k] for k in need))


def verdict(counts, done, no_wqe, dropped):
    """counts: uc_messages(); the rest: softnic's counters. The failure reason or None."""
    intact, cut, unfinished, _headless, packets = counts
    if cut == 0:
        return "no UC message lost a packet: the loss was not exercised (%d packets)" % packets
    if done + no_wqe != intact:
        return ("softnic completed %d messages (+%d without a WQE) but %d arrived intact: %s"
                % (done, no_wqe, intact, "a torn message was delivered" if done + no_wqe > intact
                   else "an intact message was lost"))
    if not cut - unfinished <= dropped <= cut:
        return "softnic counted %d UC messages dropped, the capture shows %d cut after their First" \
            % (dropped, cut)
    return None


def self_test():
    """The check must be able to fail: a synthetic stream with one intact 3-packet
    message, one that lost its Middle, one that lost its First and an Only."""
    ops = [(FIRST, 0), (MIDDLE, 1), (LAST, 2), (FIRST, 3), (LAST, 5), (MIDDLE, 7), (LAST, 8),
           (ONLY, 9)]
    counts = walk({"opcode": UC | op, "dest_qpn": 17, "psn": psn} for op, psn in ops)
    assert counts == (2, 1, 0, 3, 8), counts
    assert verdict(counts, 2, 0, 1) is None
    assert "torn" in verdict(counts, 3, 0, 1)          # the cut message was completed
    assert "intact message was lost" in verdict(counts, 1, 0, 1)
    assert verdict(counts, 2, 0, 0) is not None        # the cut went uncounted
    assert "not exercised" in verdict((2, 0, 0, 0, 4), 2, 0, 0)
