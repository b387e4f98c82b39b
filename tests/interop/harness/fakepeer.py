#!/usr/bin/env python3
"""A deliberately small RC peer in Python (plain TCP and UDP sockets) that completes a real
`ibv_rc_pingpong` exchange with the guest's rxe. It exists to prove the harness end to end
without softnic: namespace, bridge, guest, rxe, the TCP side channel, capture and the
capture check, and that rxe accepts ICRCs computed with the recipe in roce.py (rxe drops
packets whose ICRC is wrong, so a pass shows the recipe is right on the send side too).

It is not a NIC: one QP, SEND only, go-back-N by resending the whole outstanding message,
an ACK for every packet that asks for one. The guest echoes each message back (rc_pingpong
sends from the buffer it received into), so every echo is compared with what was sent.

Usage (inside the namespace), with ibv_rc_pingpong's convention: no host = server:
  fakepeer.py --local 198.18.0.2 [-p PORT] [-s SIZE] [-n ITERS] [-m MTU] [HOST]
Exit status 0 when all ITERS round trips completed and verified.
"""

import argparse
import os
import random
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import roce  # noqa: E402

PAGE = 4096
RTO = 0.5  # seconds before resending an unacknowledged message
MAX_RESENDS = 40


def exchange_msg(qpn, psn, ip):
    """ibv_rc_pingpong's 52-byte "LID:QPN:PSN:GID" message (GID ::ffff:a.b.c.d)."""
    gid = socket.inet_pton(socket.AF_INET6, "::ffff:" + ip)
    return ("%04x:%06x:%06x:%s" % (0, qpn, psn, gid.hex())).encode() + b"\0"


def parse_msg(b):
    parts = b.rstrip(b"\0").decode().split(":")
    return int(parts[1], 16), int(parts[2], 16), bytes.fromhex(parts[3])


def recv_exact(s, n, deadline):
    buf = b""
    while len(buf) < n:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def side_channel(args, my_qpn, my_psn, deadline):
    """The TCP exchange: the client sends first, the server answers, the client says done."""
    mine = exchange_msg(my_qpn, my_psn, args.local)
    if args.peer is None:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((args.local, args.port))
        ls.listen(1)
        print("fakepeer: listening on tcp %s:%d" % (args.local, args.port), flush=True)
        ls.settimeout(max(0.1, deadline - time.monotonic()))
        c, addr = ls.accept()
        ls.close()
        args.peer = addr[0]
        theirs = recv_exact(c, 52, deadline)
        c.sendall(mine)
        recv_exact(c, 5, deadline)  # "done\0"
    else:
        c = None
        while c is None:
            try:
                c = socket.create_connection((args.peer, args.port), timeout=2)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        c.sendall(mine)
        theirs = recv_exact(c, 52, deadline)
        c.sendall(b"done\0")
    c.close()
    if len(theirs) != 52:
        raise RuntimeError("side channel: got %d bytes, want 52" % len(theirs))
    return parse_msg(theirs)


class RcQp:
    """The RC requester and responder halves of one QP, driven by run()."""

    def __init__(self, sock, args, my_qpn, my_psn, peer_qpn, peer_psn):
        self.sock, self.args = sock, args
        self.qpn, self.peer_qpn = my_qpn, peer_qpn
        self.sport = roce.ROCE_PORT  # the kernel sends from the bound port; the ICRC covers it
        self.next_psn = my_psn          # requester: next PSN to assign
        self.epsn = peer_psn            # responder: next PSN expected
        self.msn = 0                    # responder: messages completed
        self.outstanding = None         # (first_psn, [packets], payload)
        self.last_tx = 0.0
        self.resends = 0
        self.partial = b""
        self.received = []              # completed incoming messages
        self.stats = {"tx": 0, "rx": 0, "resent_msgs": 0, "naks_rx": 0, "dup_rx": 0}

    def _send(self, roce_no_icrc):
        ip = roce.ipv4_header_for_icrc(self.args.local, self.args.peer, 8 + len(roce_no_icrc) + 4)
        udp = struct.pack(">HHHH", self.sport, roce.ROCE_PORT, 8 + len(roce_no_icrc) + 4, 0)
        icrc = roce.icrc_ipv4(ip, udp, roce_no_icrc)
        self.sock.sendto(roce_no_icrc + icrc.to_bytes(4, "little"), (self.args.peer, roce.ROCE_PORT))
        self.stats["tx"] += 1

    def post_send(self, payload):
        """Segments one SEND by path MTU (First/Middle/Last or Only; IBTA 9.7.1)."""
        mtu = self.args.mtu
        chunks = [payload[i:i + mtu] for i in range(0, len(payload), mtu)] or [b""]
        pkts = []
        first = self.next_psn
        for i, ch in enumerate(chunks):
            if len(chunks) == 1:
                op = roce.SEND_ONLY
            elif i == 0:
                op = roce.SEND_FIRST
            elif i == len(chunks) - 1:
                op = roce.SEND_LAST
            else:
                op = roce.SEND_MIDDLE
            pad = (-len(ch)) % 4
            last = i == len(chunks) - 1
            pkts.append(roce.bth(op, self.peer_qpn, (first + i) & roce.PSN_MASK, ack_req=last,
                                 solicited=False, pad=pad) + ch + b"\0" * pad)
        self.next_psn = (first + len(chunks)) & roce.PSN_MASK
        self.outstanding = (first, pkts, payload)
        self.resends = 0
        self._transmit()

    def _transmit(self):
        for p in self.outstanding[1]:
            self._send(p)
        self.last_tx = time.monotonic()

    def tick(self):
        if self.outstanding and time.monotonic() - self.last_tx > RTO:
            self.resends += 1
            self.stats["resent_msgs"] += 1
            if self.resends > MAX_RESENDS:
                raise RuntimeError("no ACK after %d resends" % MAX_RESENDS)
            self._transmit()

    def _ack(self):
        self._send(roce.bth(roce.ACKNOWLEDGE, self.peer_qpn, (self.epsn - 1) & roce.PSN_MASK)
                   + roce.aeth(roce.AETH_ACK_UNLIMITED, self.msn))

    def handle(self, pkt):
        h = roce.parse_bth(pkt)
        if h is None or h["dest_qpn"] != self.qpn:
            return
        self.stats["rx"] += 1
        op, psn = h["opcode"], h["psn"]
        if op == roce.ACKNOWLEDGE and len(pkt) >= 20:
            syndrome = pkt[12]
            if self.outstanding is None:
                return
            first, pkts, _ = self.outstanding
            last = (first + len(pkts) - 1) & roce.PSN_MASK
            if syndrome >> 5 == 0 and roce.psn_diff(psn, last) >= 0:
                self.outstanding = None
            elif syndrome >> 5 == 3:  # NAK (IBTA 9.7.5.2.4): go back and resend
                self.stats["naks_rx"] += 1
                self._transmit()
            return
        if op not in (roce.SEND_FIRST, roce.SEND_MIDDLE, roce.SEND_LAST, roce.SEND_ONLY):
            return
        d = roce.psn_diff(psn, self.epsn)
        if d < 0:  # duplicate (our ACK was lost or late): acknowledge again (IBTA 9.7.5.1.1)
            self.stats["dup_rx"] += 1
            self._ack()
            return
        if d > 0:  # a gap: wait for the sender to resend from epsn
            return
        data = pkt[12:len(pkt) - 4 - h["pad"]]
        self.partial = data if op in (roce.SEND_FIRST, roce.SEND_ONLY) else self.partial + data
        self.epsn = (self.epsn + 1) & roce.PSN_MASK
        if op in (roce.SEND_LAST, roce.SEND_ONLY):
            self.msn = (self.msn + 1) & roce.PSN_MASK
            self.received.append(self.partial)
            self.partial = b""
        if h["ack_req"]:
            self._ack()


def pattern(size, i):
    """Message i: byte 0 of every page is 0, which is all `ibv_rc_pingpong -c` checks;
    the rest varies with i so that a stale or misplaced echo is caught here."""
    b = bytearray(((j * 31 + i * 7 + 1) & 0xFF) for j in range(size))
    for j in range(0, size, PAGE):
        b[j] = 0
    return bytes(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--local", required=True)
    ap.add_argument("peer", nargs="?", help="server to connect to (none: be the server)")
    ap.add_argument("-p", "--port", type=int, default=18515)
    ap.add_argument("-s", "--size", type=int, default=3000)
    ap.add_argument("-n", "--iters", type=int, default=8)
    ap.add_argument("-m", "--mtu", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=30)
    args = ap.parse_args()
    args.server = args.peer is None
    t0 = time.monotonic()
    deadline = t0 + args.timeout

    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # IP_MTU_DISCOVER (10) = IP_PMTUDISC_DO (2): DF set, so Linux sends IPv4 ID 0
    u.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", 10), 2)
    u.bind((args.local, roce.ROCE_PORT))
    my_qpn, my_psn = 0x000ABC, random.randrange(1 << 24)
    peer_qpn, peer_psn, peer_gid = side_channel(args, my_qpn, my_psn, deadline)
    print("fakepeer: local QPN 0x%06x PSN 0x%06x; remote QPN 0x%06x PSN 0x%06x GID %s"
          % (my_qpn, my_psn, peer_qpn, peer_psn, socket.inet_ntop(socket.AF_INET6, peer_gid)),
          flush=True)
    qp = RcQp(u, args, my_qpn, my_psn, peer_qpn, peer_psn)
    sent = []
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError("timeout: sent %d, received %d of %d" % (len(sent), len(qp.received),
                                                                        args.iters))
        if qp.outstanding is None and len(sent) < args.iters:
            if args.server and len(qp.received) > len(sent):
                sent.append(qp.received[len(sent)])           # echo, like rc_pingpong's server
                qp.post_send(sent[-1])
            elif not args.server and len(qp.received) == len(sent):
                sent.append(pattern(args.size, len(sent)))
                qp.post_send(sent[-1])
        if qp.outstanding is None and len(sent) == args.iters and len(qp.received) >= args.iters:
            break
        r, _, _ = select.select([u], [], [], 0.05)
        if r:
            pkt, _ = u.recvfrom(65535)
            qp.handle(pkt)
        qp.tick()
    if not args.server:
        for i, (a, b) in enumerate(zip(sent, qp.received)):
            if a != b:
                raise RuntimeError("echo %d differs from what was sent" % i)
    print("fakepeer: %d round trips of %d bytes in %.2fs, echoes verified; %s"
          % (args.iters, args.size, time.monotonic() - t0,
             " ".join("%s=%d" % kv for kv in qp.stats.items())), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - one line for the harness's reason column
        print("fakepeer: FAILED: %s" % e, flush=True)
        sys.exit(1)
