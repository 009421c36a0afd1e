#!/usr/bin/python3
"""Captures torch 1.13's TCPStore traffic (client and server both torch) through
a logging proxy, in the trace format of the *_trace_2.11.txt files beside it.

usage: /usr/bin/python3 capture_legacy.py > tcpstore_ops_trace_1.13.txt

Connections 1 and 2 are one torch TCPStore client (its query connection and
the callback connection it opens and leaves idle); 3 and 4 speak the same
protocol by hand for what torch 1.13's Python API does not reach (CHECK,
WATCH_KEY and the messages a watching connection gets)."""
import datetime
import socket
import struct
import sys
import threading
import time

import torch
import torch.distributed as dist

T = datetime.timedelta
server = dist.TCPStore("127.0.0.1", 0, None, True, T(seconds=30), wait_for_workers=False)
lines, lock, nconn = [], threading.Lock(), [0]


def log(text):
    with lock:
        lines.append(text)


def recv_or_eof(sock):
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def pump(src, dst, conn, arrow):
    tag = "%d%s " % (conn, arrow)
    for b in iter(lambda: recv_or_eof(src), b""):
        with lock:  # a frame written in several sends arrives in pieces: one line
            if lines and lines[-1].startswith(tag):
                lines[-1] += b.hex()
            else:
                lines.append(tag + b.hex())
        dst.sendall(b)
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen()


def accept_loop():
    while True:
        c, _ = lsock.accept()
        u = socket.create_connection(("127.0.0.1", server.port))
        nconn[0] += 1
        n = nconn[0]
        threading.Thread(target=pump, args=(c, u, n, ">"), daemon=True).start()
        threading.Thread(target=pump, args=(u, c, n, "<"), daemon=True).start()


threading.Thread(target=accept_loop, daemon=True).start()
port = lsock.getsockname()[1]


def step(comment, fn):
    log("# " + comment)
    r = fn()
    time.sleep(0.1)  # lets the proxy log each reply before the next request
    return r


c = dist.TCPStore("127.0.0.1", port, None, False, T(seconds=30), wait_for_workers=False)
time.sleep(0.3)
step("c.set('k','v1')", lambda: c.set("k", "v1"))
step("c.get('k')", lambda: c.get("k"))
step("c.add('n',5)", lambda: c.add("n", 5))
step("c.add('n',-7)", lambda: c.add("n", -7))
step("c.compare_set('k','v1','v2')", lambda: c.compare_set("k", "v1", "v2"))
step("c.compare_set('k','zz','v3')", lambda: c.compare_set("k", "zz", "v3"))
step("c.compare_set('fresh','','f')", lambda: c.compare_set("fresh", "", "f"))
step("c.compare_set('none','e','d')", lambda: c.compare_set("none", "e", "d"))
step("c.num_keys()", lambda: c.num_keys())
step("c.delete_key('n')", lambda: c.delete_key("n"))
step("c.delete_key('n')", lambda: c.delete_key("n"))
step("c.wait(['k'])", lambda: c.wait(["k"]))


def wait_timeout():
    try:
        c.wait(["zz"], T(seconds=0.5))
    except RuntimeError:
        pass


step("c.wait(['zz'],T(seconds=0.5)): times out in the client, no cancel", wait_timeout)
step("c.get('fresh')", lambda: c.get("fresh"))


def S(b):
    return struct.pack("<Q", len(b)) + b


r = socket.create_connection(("127.0.0.1", port))
time.sleep(0.1)
w = socket.create_connection(("127.0.0.1", port))
time.sleep(0.1)
step("CHECK ['/k','/q']", lambda: r.sendall(b"\x04" + struct.pack("<Q", 2) + S(b"/k") + S(b"/q")))
step("CHECK ['/k']", lambda: r.sendall(b"\x04" + struct.pack("<Q", 1) + S(b"/k")))
step("WATCH_KEY '/w' (on a connection of its own)", lambda: w.sendall(b"\x07" + S(b"/w")))
step("WAIT ['/w'] (answered by the SET below)", lambda: r.sendall(b"\x05" + struct.pack("<Q", 1) + S(b"/w")))
step("SET '/w'='a': KEY_CREATED", lambda: r.sendall(b"\x00" + S(b"/w") + S(b"a")))
step("SET '/w'='b': KEY_UPDATED", lambda: r.sendall(b"\x00" + S(b"/w") + S(b"b")))
step("ADD '/w' on a text value closes the connection: not replayed", lambda: None)
step("COMPARE_SET '/w' 'b' -> 'c': KEY_UPDATED", lambda: r.sendall(b"\x01" + S(b"/w") + S(b"b") + S(b"c")))
step("COMPARE_SET '/w' 'x' -> 'y': no message", lambda: r.sendall(b"\x01" + S(b"/w") + S(b"x") + S(b"y")))
step("DELETE_KEY '/w': KEY_DELETED", lambda: r.sendall(b"\x08" + S(b"/w")))
step("ADD '/w' 3: KEY_CREATED", lambda: r.sendall(b"\x03" + S(b"/w") + struct.pack("<q", 3)))
step("ADD '/w' 4: KEY_UPDATED", lambda: r.sendall(b"\x03" + S(b"/w") + struct.pack("<q", 4)))
step("GETNUMKEYS", lambda: r.sendall(b"\x06"))
time.sleep(0.3)
print("# torch %s's TCPStore, client and server, through a logging proxy (capture_legacy.py)" % torch.__version__)
print("\n".join(lines))
