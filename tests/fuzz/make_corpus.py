#!/usr/bin/env python3
"""Writes the seed corpora in corpus/<harness>/ (checked in; rerun to refresh).
TCPStore seeds are the client->server frames captured from torch 2.11 in
tests/data/tcpstore/*.txt (lines "N> hex"), one frame per file, plus a whole
session per trace and a few hostile length prefixes."""
import hashlib
import os
import re
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))


def put(name, data):
    d = os.path.join(here, "corpus", name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def argv(*a):
    return "\0".join(a)


# dptp-check options
for a in [argv("--dp", "2", "--tp", "2"),
          argv("--checks", "broadcast,opid", "--inject", "bcast-global-src", "--format", "json"),
          argv("--tokens=8", "--hidden=64", "--dtype", "fp32", "--seed", "16", "--timeout", "2.5"),
          argv("--output", "/tmp/r.xml", "--format=junit", "-v", "-v", "--bench"),
          argv("--list"), argv("--hidden", "4G"), argv("--tok", "1K"), argv("-h")]:
    put("check_options", a)

# dptp-run options
for a in [argv("--nproc-per-node=2", "--no-python", "/bin/true"),
          argv("--standalone", "--nproc_per_node", "4", "-r", "0:1,1:2", "--tee", "3", "x.py", "--a"),
          argv("--nnodes", "1:2", "--node-rank", "0", "--master-addr", "[::1]", "--master-port", "29500", "-m", "mod"),
          argv("--rdzv-endpoint", "host:1234", "--rdzv-conf", "timeout=10", "--max-restarts", "3", "s.py"),
          argv("--local-ranks-filter", "0,1", "--signals-to-handle", "SIGTERM,SIGINT", "--log-dir", "/tmp/l", "s.py"),
          argv("--monitor-interval", "0.1", "--start-method", "fork", "--numa-binding", "node", "s.py"),
          argv("--help")]:
    put("run_args", a)

# TCPStore frames
frames = []
for path in sorted(os.listdir(os.path.join(root, "tests", "data", "tcpstore"))):
    sess = b""
    for line in open(os.path.join(root, "tests", "data", "tcpstore", path)):
        m = re.match(r"^\d+> ([0-9a-f]+)\s*$", line)
        if m:
            fr = bytes.fromhex(m.group(1))
            frames.append(fr)
            sess += fr
    if sess:
        put("tcpstore_scan", sess)
        put("tcpstore_server", b"\0" + sess)  # low bit 0: the session brings its VALIDATE
for fr in set(frames):
    put("tcpstore_scan", fr)
    put("tcpstore_server", b"\1" + fr)
u64 = lambda v: struct.pack("<Q", v)
for hostile in [b"\x01" + u64(2**64 - 1), b"\x01" + u64(4) + b"/key" + u64(2**63),
                b"\x0b" + u64(2**40), b"\x06" + u64(3) + u64(2**62),
                b"\x02" + u64(1) + b"k" + u64(8 * 1024 * 1024 + 1)]:
    put("tcpstore_scan", hostile)
    put("tcpstore_server", b"\1" + hostile)

# report: shape byte, then NUL-separated strings and bytes
for a in [b"\x05dptp-check\x000.1.0\x00host\x00pmix\x00\x01\x02broadcast\x00\x01rank 1: \"quoted\" <b>&amp;\n\x00",
          b"\xd7t\x00v\x00h\x00b\x00dptp-run\x00\x00\x00x\xff\xfe\x00a\x00\x10\x00\xc3\x28\xed\xa0\x80\x00]]></testcase>\x00",
          b"\x3f" + bytes(range(1, 32)) + b"\x00\xe2\x82\xac\xf0\x9f\x98\x80\x00\x7f\x00"]:
    put("report", a)

# layout: world, dp, pp, tp big-endian int32, then a fault list
L = lambda *v: b"".join(struct.pack(">i", x) for x in v)
for a in [L(4, 2, 1, 2) + b"bcast-global-src,opid-seeded", L(8, 0, 2, 2) + b"all",
          L(4, 3, 1, 2) + b"none", L(16, 2, 2, 4) + b"dispatch-ep-group,dispatch-ep-group",
          L(1, 0, 0, 0) + b"", L(4096, 0, 0, 4096) + b"world-workspace,device-tp-rank"]:
    put("layout", a)

# c10d rendezvous states: every state torch 2.11 wrote (the captures) and
# the Python-pickled cases, good and bad (tests/data/c10d)
for name in ("c10d_fixed_states_2.11.txt", "c10d_elastic_latejoin_states_2.11.txt", "python_states.txt"):
    with open(os.path.join(root, "tests", "data", "c10d", name)) as f:
        lines = f.read().split("\n")
    for prev, line in zip(lines, lines[1:]):
        if prev.startswith("== ") and re.fullmatch(r"[0-9a-f]{8,}", line):
            put("rdzv_state", bytes.fromhex(line))
