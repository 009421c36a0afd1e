"""A TCP proxy in front of a TCPStore that counts the requests it forwards.

Clients connect to Proxy.port; each connection gets its own connection to the
store, bytes pass unchanged both ways, and the client-to-store stream is cut
into torch's TCPStore frames (the current dialect: VALIDATE first) to count
them per opcode, the COMPARE_SETs per key with a non-empty expected value
(writes of a read state; torch's constructor compares against ""), and per key
the connections that sent a GET or a COMPARE_SET of it (each reply carries the
value: the connections the value went to).

One thread, selectors; Proxy.start() runs it in a daemon thread,
Proxy.close() stops it. Proxy.go_silent() plays the store's host gone from
the network: the proxy keeps every connection open and answers nothing
more, not even the store's own closing; new connections are accepted and
never answered. Proxy.drop_all(match) closes every connection open now
that sent a key holding one of the byte strings in match (every one
without match), both ends, as a store that drops its clients would, and
goes on forwarding the new ones."""
import collections
import selectors
import socket
import struct
import threading

OPS = ["validate", "set", "compare_set", "get", "add", "check", "wait", "getnumkeys", "delete_key", "append",
       "multi_get", "multi_set", "cancel_wait", "ping", "queue_push", "queue_pop", "queue_len", "list_keys"]
# each opcode's fields after the opcode byte: "s" a string (u64 length + bytes),
# "4"/"8" fixed bytes, "n" a u64 count of strings, "m" a u64 count of pairs
LAYOUT = {0: "4", 1: "ss", 2: "sss", 3: "s", 4: "s8", 5: "n", 6: "n", 7: "", 8: "s", 9: "ss", 10: "n", 11: "m",
          12: "", 13: "4", 14: "ss", 15: "s", 16: "s", 17: ""}


def cut(buf, off):
    """(frame length, opcode, [strings]) of the frame at off, or None."""
    if off >= len(buf):
        return None
    op = buf[off]
    if op not in LAYOUT:
        raise ValueError("opcode %d" % op)
    p = off + 1
    strs = []

    def string(p):
        if p + 8 > len(buf):
            return None, p
        n = struct.unpack_from("<Q", buf, p)[0]
        if p + 8 + n > len(buf):
            return None, p
        return bytes(buf[p + 8:p + 8 + n]), p + 8 + n

    for f in LAYOUT[op]:
        if f in "48":
            p += int(f)
            if p > len(buf):
                return None
        elif f == "s":
            s, p = string(p)
            if s is None:
                return None
            strs.append(s)
        else:
            if p + 8 > len(buf):
                return None
            n = struct.unpack_from("<Q", buf, p)[0] * (2 if f == "m" else 1)
            p += 8
            for _ in range(n):
                s, p = string(p)
                if s is None:
                    return None
                strs.append(s)
    return p - off, op, strs


class Pair:
    def __init__(self, c, u):
        self.c, self.u = c, u
        self.to_u, self.to_c = bytearray(), bytearray()
        self.parse = bytearray()
        self.dropped = False
        self.keys = set()  # the first keys the client sent (drop_all's match)


class Proxy:
    def __init__(self, upstream_port, host="127.0.0.1"):
        self.up = (host, upstream_port)
        self.ls = socket.socket()
        self.ls.bind((host, 0))
        self.ls.listen(4096)
        self.ls.setblocking(False)
        self.port = self.ls.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.ls, selectors.EVENT_READ, None)
        self.ops = collections.Counter()
        self.cas = collections.Counter()  # key -> COMPARE_SETs with a non-empty expected value
        self.readers = collections.defaultdict(set)  # key -> ids of the connections that GOT or COMPARE_SET it
        self.connections = 0
        self.live = 0  # connections open now
        self.peak = 0  # the most open at once
        self.bad = None
        self._stop = False
        self._t = None
        self.silent = False
        self._drop_all = False
        self._drop_match = None
        self._held = []  # silent: the sockets kept open, never read

    def start(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def go_silent(self):
        self.silent = True

    def matching(self, match):
        """How many live connections sent a key containing one of match
        (0 where the proxy's thread changed them meanwhile: ask again)."""
        try:
            return sum(1 for key in list(self.sel.get_map().values())
                       if key.data is not None and not key.data.dropped and key.fileobj is key.data.c
                       and any(s in k for s in match for k in list(key.data.keys)))
        except RuntimeError:
            return 0

    def drop_all(self, match=None):
        self._drop_match = match
        self._drop_all = True

    def close(self):
        self._stop = True
        if self._t:
            self._t.join(5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        for s in self._held:
            s.close()
        self.sel.close()

    def _events(self, pr):
        for s, out in ((pr.c, pr.to_c), (pr.u, pr.to_u)):
            ev = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
            self.sel.modify(s, ev, pr)

    def _drop(self, pr):
        if not pr.dropped:
            pr.dropped = True
            self.live -= 1
        for s in (pr.c, pr.u):
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _count(self, pr, data):
        pr.parse += data
        off = 0
        try:
            while True:
                f = cut(pr.parse, off)
                if f is None:
                    break
                n, op, strs = f
                self.ops[OPS[op]] += 1
                if len(pr.keys) < 16:
                    pr.keys.update(strs[:16])
                if op == 2 and strs[1]:
                    self.cas[strs[0].decode("utf-8", "replace")] += 1
                if op in (2, 3):
                    self.readers[strs[0].decode("utf-8", "replace")].add(id(pr))
                off += n
        except ValueError as e:
            self.bad = str(e)
            off = len(pr.parse)
        del pr.parse[:off]

    def _run(self):
        while not self._stop:
            if self._drop_all:
                self._drop_all = False
                for key in list(self.sel.get_map().values()):
                    pr, m = key.data, self._drop_match
                    if pr is not None and (m is None or any(s in k for s in m for k in pr.keys)):
                        self._drop(pr)
            if self.silent:
                for key in list(self.sel.get_map().values()):
                    if key.data is not None:
                        self.sel.unregister(key.fileobj)
                        self._held.append(key.fileobj)
            for key, mask in self.sel.select(0.1):
                if key.data is None:
                    try:
                        c, _ = self.ls.accept()
                    except OSError:
                        continue
                    if self.silent:
                        self._held.append(c)
                        continue
                    u = socket.create_connection(self.up)
                    for s in (c, u):
                        s.setblocking(False)
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    pr = Pair(c, u)
                    self.connections += 1
                    self.live += 1
                    self.peak = max(self.peak, self.live)
                    self.sel.register(c, selectors.EVENT_READ, pr)
                    self.sel.register(u, selectors.EVENT_READ, pr)
                    continue
                pr, s = key.data, key.fileobj
                try:
                    if mask & selectors.EVENT_READ:
                        data = s.recv(1 << 20)
                        if not data:
                            self._drop(pr)
                            continue
                        if s is pr.c:
                            self._count(pr, data)
                            pr.to_u += data
                        else:
                            pr.to_c += data
                    for dst, out in ((pr.c, pr.to_c), (pr.u, pr.to_u)):
                        if out:
                            try:
                                k = dst.send(out)
                                del out[:k]
                            except BlockingIOError:
                                pass
                    self._events(pr)
                except (ConnectionError, OSError, ValueError, KeyError):
                    self._drop(pr)
