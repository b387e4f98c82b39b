"""Verdicts of the traffic class rows: the IP TOS (IPv4) / traffic class (IPv6) byte of
the packets on the bridge. rxe puts a QP's address-vector traffic class there
(`prepare4`/`prepare6` take `av->grh.traffic_class`), and so does softnic; with the CM,
the active side's id TOS travels in the REQ's primary path and the passive side's QP
takes it from there (Linux's ib_cm builds the passive address vector from the REQ).
Each judge gets a runner.Outcome and returns the reason for failure or None."""

from . import cmcheck, roce


def packets(pcap):
    """(source address bytes, TOS, BTH destination QPN, RoCE bytes) of every RoCEv2
    packet in an Ethernet pcap."""
    for _n, ip, _udp, roce_bytes, _calc in roce.roce_packets(pcap):
        if len(ip) == 20:
            src, tos = bytes(ip[12:16]), ip[1]
        else:
            src, tos = bytes(ip[8:24]), ((ip[0] & 0x0F) << 4) | (ip[1] >> 4)
        qpn = int.from_bytes(roce_bytes[5:8], "big") if len(roce_bytes) >= 12 else None
        yield src, tos, qpn, len(roce_bytes)


def _bad(pk, tos):
    bad = [p for p in pk if p[1] != tos]
    if bad:
        return "%d of %d packets with a TOS other than %d (first: TOS %d to QPN %#x)" % (
            len(bad), len(pk), tos, bad[0][1], bad[0][2])
    return None


def every_packet(tos, both_ways=True):
    """perftest `--tclass`: both tools succeed, and every packet but the CM's (QP 1)
    carries `tos`: RC (`both_ways`) the requests of one side and the ACKs of the other;
    UD the client's datagrams."""
    def judge(o):
        why = cmcheck.both_tools_ok(o)
        if why:
            return why
        pk = [p for p in packets(o.pcaps[0]) if p[2] not in (None, 1)]
        senders = {p[0] for p in pk}
        o.notes.append("%d packets from %d senders, TOS %s" % (
            len(pk), len(senders), sorted({p[1] for p in pk})))
        if len(senders) < (2 if both_ways else 1):
            return "packets from %d side(s) only" % len(senders)
        return _bad(pk, tos)
    return judge


def cm_connection(tos, min_len=1024):
    """perftest `-R -T tos`: both tools succeed, and the test connection — the QPs its
    WRITEs (RoCE packets longer than `min_len`) go to, and those the other side's
    answers with `tos` go to — carries `tos` on every packet, both ways. perftest trades
    its parameters over a second connection of its own, left at the default TOS 0,
    and the CM's MADs (QP 1) have TOS 0: neither is judged."""
    def judge(o):
        why = cmcheck.both_tools_ok(o)
        if why:
            return why
        pk = [p for p in packets(o.pcaps[0]) if p[2] not in (None, 1)]
        writes = [p for p in pk if p[3] > min_len]
        if not writes:
            return "no WRITE on the bridge"
        writer = writes[0][0]
        to_server = {p[2] for p in writes}
        answers = [p for p in pk if p[0] != writer and p[2] not in to_server and p[1] == tos]
        if not answers:
            return "the passive side sent nothing with TOS %d: it did not take the REQ's" % tos
        to_client = {p[2] for p in answers}
        conn = [p for p in pk if p[2] in to_server | to_client]
        o.notes.append("test connection: %d packets (%d WRITEs, %d answers)" % (
            len(conn), len(writes), len(answers)))
        return _bad(conn, tos)
    return judge
