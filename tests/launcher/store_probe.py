#!/usr/bin/env python3
"""A worker that talks to the agent store the way PyTorch's env:// client
does (TORCHRUN.md D): VALIDATE+PING, ADD "init/" 1, then keys with a leading
"/". No torch needed.

usage: store_probe.py check            connect, SET/GET a key of its own
       store_probe.py stale-then-fail  attempt 0: SET /stale_<rank>, exit 3;
                                       later attempts: /stale_* must be gone
       store_probe.py sleep S          connect, sleep S seconds, exit 0
"""
import os
import socket
import struct
import sys
import time


class Store:
    def __init__(self, host, port, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", os.getpid()))
        assert struct.unpack("<I", self._recv(4))[0] == os.getpid()
        self.init = self.add("init/", 1, raw=True)

    def _recv(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise EOFError("store closed the connection")
            b += c
        return b

    @staticmethod
    def _str(b):
        b = b.encode() if isinstance(b, str) else b
        return struct.pack("<Q", len(b)) + b

    def _key(self, k, raw=False):
        return self._str(k if raw else "/" + k)

    def set(self, k, v):
        self.s.sendall(b"\x01" + self._key(k) + self._str(v))

    def add(self, k, d, raw=False):
        self.s.sendall(b"\x04" + self._key(k, raw) + struct.pack("<q", d))
        return struct.unpack("<q", self._recv(8))[0]

    def get(self, k):
        self.s.sendall(b"\x06" + struct.pack("<Q", 1) + self._key(k))
        assert self._recv(1) == b"\x00"
        self.s.sendall(b"\x03" + self._key(k))
        n = struct.unpack("<Q", self._recv(8))[0]
        return self._recv(n)

    def check(self, keys):
        self.s.sendall(b"\x05" + struct.pack("<Q", len(keys)) + b"".join(self._key(k) for k in keys))
        return self._recv(1) == b"\x00"


def main():
    e = os.environ
    assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True", e["TORCHELASTIC_USE_AGENT_STORE"]
    st = Store(e["MASTER_ADDR"], int(e["MASTER_PORT"]))
    rank, world, attempt = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["TORCHELASTIC_RESTART_COUNT"])
    what = sys.argv[1]
    if what == "check":
        st.set("probe/%d" % rank, "hello %d" % rank)
        peers = [st.get("probe/%d" % r).decode() for r in range(world)]
        assert peers == ["hello %d" % r for r in range(world)], peers
        print("store ok rank %d of %d" % (rank, world), flush=True)
    elif what == "stale-then-fail":
        if attempt == 0:
            st.set("stale_%d" % rank, "attempt 0")
            st.get("stale_%d" % (world - 1 - rank))  # every rank has set its key
            sys.exit(3 if rank == world - 1 else 0)
        stale = [r for r in range(world) if st.check(["stale_%d" % r])]
        if stale:
            print("stale keys of attempt 0 seen by rank %d: %s" % (rank, stale), flush=True)
            sys.exit(4)
        print("fresh store rank %d attempt %d" % (rank, attempt), flush=True)
    elif what == "sleep":
        time.sleep(float(sys.argv[2]))


if __name__ == "__main__":
    main()
