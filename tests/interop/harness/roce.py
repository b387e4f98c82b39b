"""Just enough RoCEv2 for the harness's own checks, written independently of the wire crate
so that it can serve as a second opinion: the ICRC (IBTA Annex A17.3.3, "invariant CRC",
with the masking the rxe captures were verified against; see shared/roce/README.md), BTH
and AETH layouts (IBTA 9.2, 9.3.3.2), and a classic-pcap reader for the capture check."""

import socket
import struct
import zlib

ROCE_PORT = 4791

# BTH opcodes (IBTA 9.2.1, table 38): RC = 0b000xxxxx
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY = 0x00, 0x01, 0x02, 0x04
ACKNOWLEDGE = 0x11
AETH_ACK_UNLIMITED = 0x1F  # syndrome: ACK with "invalid credit count" (no end-to-end credits)
PSN_MASK = 0xFFFFFF


def icrc_ipv4(ip_header, udp_header, roce):
    """ICRC over an IPv4 RoCEv2 packet; roce is the UDP payload without its 4-byte ICRC.
    Masked with ones: an 8-byte stand-in for the LRH, IPv4 TOS, TTL and header checksum,
    the UDP checksum, and BTH byte 4 (FECN/BECN/reserved). The IPv4 ID is covered."""
    ip = bytearray(ip_header[:20])
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    udp = bytearray(udp_header[:8])
    udp[6:8] = b"\xff\xff"
    bth = bytearray(roce[:12])
    bth[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + bytes(roce[12:]))


def icrc_ipv6(ip_header, udp_header, roce):
    """ICRC over an IPv6 RoCEv2 packet: traffic class, flow label and hop limit masked."""
    ip = bytearray(ip_header[:40])
    ip[0] = (ip[0] & 0xF0) | 0x0F
    ip[1] = 0xFF
    ip[2] = 0xFF
    ip[3] = 0xFF
    ip[7] = 0xFF
    udp = bytearray(udp_header[:8])
    udp[6:8] = b"\xff\xff"
    bth = bytearray(roce[:12])
    bth[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + bytes(roce[12:]))


def ipv4_header_for_icrc(src, dst, udp_len, ident=0, dont_fragment=True):
    """The IPv4 header Linux will put on a datagram from an unconnected UDP socket with
    IP_PMTUDISC_DO: DF set, so the ID is 0 (ip_select_ident_segs). TOS/TTL/checksum are
    masked anyway."""
    flags = 0x4000 if dont_fragment else 0
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, ident, flags, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))


def bth(opcode, dest_qpn, psn, ack_req=False, solicited=False, pad=0):
    b1 = (0x80 if solicited else 0) | ((pad & 3) << 4)  # SE, M=0, PadCnt, TVer=0
    return struct.pack(">BBHII", opcode, b1, 0xFFFF, dest_qpn & PSN_MASK,
                       (0x80000000 if ack_req else 0) | (psn & PSN_MASK))


def parse_bth(roce):
    if len(roce) < 16:
        return None
    opcode, b1, pkey, dqp, apsn = struct.unpack(">BBHII", roce[:12])
    return {"opcode": opcode, "pad": (b1 >> 4) & 3, "dest_qpn": dqp & PSN_MASK,
            "ack_req": bool(apsn >> 31), "psn": apsn & PSN_MASK}


def aeth(syndrome, msn):
    return struct.pack(">I", ((syndrome & 0xFF) << 24) | (msn & PSN_MASK))


def psn_diff(a, b):
    """a - b in 24-bit serial-number arithmetic, as a signed value."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d & 0x800000 else d


def pcap_frames(path):
    """Yields (linktype, frame bytes) of a classic pcap file (tcpdump -w writes these)."""
    with open(path, "rb") as f:
        hdr = f.read(24)
        if len(hdr) < 24:
            return
        magic = hdr[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            e = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            e = ">"
        else:
            raise ValueError("%s: not a classic pcap file" % path)
        linktype = struct.unpack(e + "I", hdr[20:24])[0]
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            caplen = struct.unpack(e + "IIII", rec)[2]
            data = f.read(caplen)
            if len(data) < caplen:
                return
            yield linktype, data


def roce_packets(path):
    """Yields (frame number, IP header, UDP header, UDP payload with its ICRC, ICRC
    function) for every RoCEv2 packet (UDP to 4791, IPv4 or IPv6) in an Ethernet pcap."""
    for n, (linktype, fr) in enumerate(pcap_frames(path), 1):
        if linktype != 1 or len(fr) < 14:
            continue
        etype = struct.unpack(">H", fr[12:14])[0]
        off = 14
        while etype in (0x8100, 0x88A8) and len(fr) >= off + 4:
            etype = struct.unpack(">H", fr[off + 2:off + 4])[0]
            off += 4
        if etype == 0x0800 and len(fr) >= off + 28:
            ihl = (fr[off] & 0x0F) * 4
            tot = struct.unpack(">H", fr[off + 2:off + 4])[0]
            if fr[off + 9] != 17 or ihl != 20:
                continue
            ip, l4 = fr[off:off + 20], off + 20
            end = off + tot
            calc = icrc_ipv4
        elif etype == 0x86DD and len(fr) >= off + 48:
            if fr[off + 6] != 17:
                continue
            ip, l4 = fr[off:off + 40], off + 40
            end = l4 + struct.unpack(">H", fr[off + 4:off + 6])[0]
            calc = icrc_ipv6
        else:
            continue
        udp = fr[l4:l4 + 8]
        if len(udp) < 8 or struct.unpack(">H", udp[2:4])[0] != ROCE_PORT:
            continue
        yield n, ip, udp, fr[l4 + 8:end], calc


def check_capture(path):
    """Counts RoCEv2 packets in an Ethernet pcap and verifies each ICRC.
    Returns (packets, icrc_ok, first_bad_description_or_None)."""
    total = ok = 0
    first_bad = None
    for n, ip, udp, payload, calc in roce_packets(path):
        total += 1
        if len(payload) < 16:
            first_bad = first_bad or "frame %d: RoCE payload too short" % n
            continue
        want = struct.unpack("<I", payload[-4:])[0]
        got = calc(ip, udp, payload[:-4])
        if want == got:
            ok += 1
        elif first_bad is None:
            first_bad = "frame %d: ICRC %08x on the wire, %08x computed" % (n, want, got)
    return total, ok, first_bad


# CM attribute IDs (IBTA 16.7.3 / table 93 of chapter 12) and the names `softnic decode`
# prints; the management class of the CM is 0x07 (IBTA 13.4.4, table 86).
UD_SEND_ONLY = 0x64
CM_CLASS = 0x07
CM_ATTRS = {0x0010: "ConnectRequest", 0x0011: "MsgRcptAck", 0x0012: "ConnectReject",
            0x0013: "ConnectReply", 0x0014: "ReadyToUse", 0x0015: "DisconnectRequest",
            0x0016: "DisconnectReply", 0x0017: "ServiceIDResReq", 0x0018: "ServiceIDResReqResp",
            0x0019: "LoadAlternatePath", 0x001A: "AlternatePathResponse"}


def cm_mads(path):
    """(frame number, CM message name or a description of what is wrong) for every RoCEv2
    packet to QP1 in a pcap: a UD SEND Only with a DETH, then a 256-byte MAD of the CM
    class (IBTA 13.4.3: base version 1, class version 2) whose attribute ID is known."""
    out = []
    for n, _ip, _udp, p, _calc in roce_packets(path):
        b = parse_bth(p)
        if b is None or b["dest_qpn"] != 1:
            continue
        mad = p[12 + 8:-4]  # after BTH and DETH, before the ICRC
        if b["opcode"] != UD_SEND_ONLY or len(mad) != 256:
            out.append((n, None, "opcode %#x, MAD %d bytes" % (b["opcode"], len(mad))))
            continue
        base, mclass, cver = mad[0], mad[1], mad[2]
        attr = struct.unpack(">H", mad[16:18])[0]
        if (base, mclass, cver) != (1, CM_CLASS, 2) or attr not in CM_ATTRS:
            out.append((n, None, "MAD base %d class %#x version %d attribute %#x"
                        % (base, mclass, cver, attr)))
            continue
        out.append((n, CM_ATTRS[attr], ""))
    return out


def corrupt_one_roce_byte(path):
    """The bytes of a classic pcap with one bit flipped inside the first RoCEv2 packet's
    BTH (its destination QP), which the ICRC covers: a decoder that verifies ICRCs must
    reject the result."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    e = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off = 24
    while off + 16 <= len(data):
        caplen = struct.unpack(e + "I", data[off + 8:off + 12])[0]
        fr = off + 16
        # Ethernet + IPv4 (IHL 5) + UDP to 4791 only: the reference capture is exactly that.
        if (caplen >= 14 + 20 + 8 + 16 and data[fr + 12:fr + 14] == b"\x08\x00"
                and data[fr + 14] == 0x45 and data[fr + 23] == 17
                and struct.unpack(">H", data[fr + 36:fr + 38])[0] == ROCE_PORT):
            data[fr + 42 + 7] ^= 0x01
            return bytes(data)
        off = fr + caplen
    raise ValueError("%s holds no IPv4 RoCEv2 packet" % path)
