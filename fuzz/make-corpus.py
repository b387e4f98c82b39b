#!/usr/bin/env python3
"""Builds the fuzz seed corpus from the real captures in tests/data/captures/.

For every distinct BTH opcode found there it writes the shortest RoCEv2 UDP payload
(BTH ... ICRC) carrying it to fuzz/corpus/<target>/op<opcode>-<capture>, for both fuzz
targets. parse_datagram also gets a few whole Ethernet frames (first IPv4 and first IPv6
one), since it feeds its input to frame::parse_ethernet too.

Standard library only. Reads classic pcap (either byte order, us or ns timestamps) with
Ethernet link type; other files are skipped with a note. Re-running it gives the same
files: captures are read in sorted order and ties keep the first packet seen.

    python3 fuzz/make-corpus.py            # from the repository root or from fuzz/
"""
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "tests" / "data" / "captures"
CORPUS = ROOT / "fuzz" / "corpus"
TARGETS = ("parse_datagram", "roundtrip")
ROCE_PORT = 4791
LINKTYPE_ETHERNET = 1


def pcap_frames(path):
    """Yields the captured bytes of each frame of a classic pcap file."""
    data = path.read_bytes()
    if len(data) < 24:
        return
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        print(f"skip {path}: not a classic pcap file", file=sys.stderr)
        return
    linktype = struct.unpack(end + "I", data[20:24])[0] & 0x0FFFFFFF
    if linktype != LINKTYPE_ETHERNET:
        print(f"skip {path}: link type {linktype}", file=sys.stderr)
        return
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(end + "I", data[off + 8 : off + 12])[0]
        off += 16
        if off + incl > len(data):
            break
        yield data[off : off + incl]
        off += incl


def roce_payload(frame):
    """Returns (ip_version, UDP payload) for a RoCEv2 frame, else None."""
    if len(frame) < 14:
        return None
    off = 12
    ethertype = struct.unpack(">H", frame[off : off + 2])[0]
    while ethertype in (0x8100, 0x88A8) and off + 6 <= len(frame):
        off += 4
        ethertype = struct.unpack(">H", frame[off : off + 2])[0]
    ip = frame[off + 2 :]
    if ethertype == 0x0800 and len(ip) >= 20 and ip[9] == 17:
        ihl = (ip[0] & 0x0F) * 4
        udp = ip[ihl:]
        version = 4
    elif ethertype == 0x86DD and len(ip) >= 40 and ip[6] == 17:
        udp = ip[40:]
        version = 6
    else:
        return None
    if len(udp) < 8 or struct.unpack(">H", udp[2:4])[0] != ROCE_PORT:
        return None
    udp_len = struct.unpack(">H", udp[4:6])[0]
    if udp_len < 8 or udp_len > len(udp):
        return None
    return version, udp[8:udp_len]


def main():
    best = {}  # opcode -> (payload, capture stem)
    frames = {}  # ip version -> (frame, capture stem)
    for path in sorted(CAPTURES.rglob("*.pcap")):
        for frame in pcap_frames(path):
            r = roce_payload(frame)
            if r is None or len(r[1]) < 12:
                continue
            version, roce = r
            frames.setdefault(version, (frame, path.stem))
            op = roce[0]
            if op not in best or len(roce) < len(best[op][0]):
                best[op] = (roce, path.stem)
    if not best:
        sys.exit("no RoCEv2 packets found under " + str(CAPTURES))
    for target in TARGETS:
        d = CORPUS / target
        d.mkdir(parents=True, exist_ok=True)
        for op, (roce, stem) in sorted(best.items()):
            (d / f"op{op:02x}-{stem}").write_bytes(roce)
    d = CORPUS / "parse_datagram"
    for version, (frame, stem) in sorted(frames.items()):
        (d / f"frame-ipv{version}-{stem}").write_bytes(frame)
    print(f"{len(best)} opcodes: " + " ".join(f"{op:#04x}" for op in sorted(best)))
    print(f"wrote {CORPUS}/{{{','.join(TARGETS)}}}")


if __name__ == "__main__":
    main()
