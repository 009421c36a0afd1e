#!/usr/bin/env python3
"""Security tests of the listening surfaces (issue 9 item 4).

usage: security.py --run DPTP_RUN --check DPTP_CHECK [--only CASE,...]

  store_bind      rank 0 of a torchrun-style job (MASTER_ADDR=127.0.0.1,
                  no agent store) hosts the TCPStore: it must listen on
                  MASTER_ADDR's address only, never on 0.0.0.0 / ::.
  store_sizes     that store closes a connection announcing a key of 2^63
                  bytes, and 64 connections that each announce an 8 MiB
                  value (and never send it) leave its RSS bounded.
  pmix_tmpdir     dptp-run's PMIx tmpdir is 0700, owned by us, and removed
                  after a run that passes, one whose worker fails, and one
                  ended by SIGTERM.
"""
import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ARGS = None
FAILURES = []


def fail(case, msg):
    FAILURES.append("%s: %s" % (case, msg))
    print("FAIL %s: %s" % (case, msg), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def listeners(port, pid):
    """(family, local address) of the LISTEN sockets on port owned by pid."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    out = []
    for fam in ("tcp", "tcp6"):
        try:
            lines = open("/proc/net/" + fam).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            addr, p = f[1].split(":")
            if int(p, 16) == port and f[3] == "0A" and f[9] in inodes:
                if fam == "tcp":
                    a = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(addr, 16)))
                else:
                    raw = bytes.fromhex(addr)
                    a = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                out.append((fam, a))
    return out


def start_rank0(port):
    """Rank 0 of a 2-rank torchrun-style job; it hosts the store and waits
    for rank 1, which never comes."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
               GROUP_RANK="0", GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_USE_AGENT_STORE="False", TORCHELASTIC_RUN_ID="security")
    env.pop("PMIX_NAMESPACE", None)
    p = subprocess.Popen([ARGS.check, "--tokens", "8", "--hidden", "64", "--timeout", "20"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if p.poll() is not None:
            return p, []
        ls = listeners(port, p.pid)
        if ls:
            return p, ls
        time.sleep(0.01)
    return p, []


def rss_kb(pid):
    for ln in open("/proc/%d/status" % pid):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    return 0


def case_store_bind():
    port = free_port()
    p, ls = start_rank0(port)
    try:
        if not ls:
            fail("store_bind", "rank 0 never listened on port %d: %s" % (port, p.stderr.read() if p.poll() is not None else ""))
            return
        wild = [l for l in ls if l[1] in ("0.0.0.0", "::")]
        if wild:
            fail("store_bind", "MASTER_ADDR=127.0.0.1, but the store listens on %s (every interface)" % ls)
        else:
            print("ok store_bind: listens on %s only" % ls, flush=True)
    finally:
        p.kill()
        p.wait()


def u64(v):
    return struct.pack("<Q", v)


VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def closed_by_peer(s, limit=3.0):
    s.settimeout(limit)
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def case_store_sizes():
    port = free_port()
    p, ls = start_rank0(port)
    try:
        if not ls:
            fail("store_sizes", "rank 0 never listened")
            return
        # a key of 2^63 bytes: refused on the prefix alone
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(VALIDATE + b"\x01" + u64(1 << 63))
        if not closed_by_peer(s):
            fail("store_sizes", "a 2^63-byte key prefix did not close the connection")
        else:
            print("ok store_sizes: a 2^63-byte key length closes the connection", flush=True)
        s.close()
        # a count of 2^40 keys
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(VALIDATE + b"\x0b" + u64(1 << 40))
        if not closed_by_peer(s):
            fail("store_sizes", "a MULTI_SET of 2^40 keys did not close the connection")
        s.close()
        # 64 clients announce 8 MiB values and send nothing more
        before = rss_kb(p.pid)
        socks = []
        for i in range(64):
            c = socket.create_connection(("127.0.0.1", port))
            key = b"/k%d" % i
            c.sendall(VALIDATE + b"\x01" + u64(len(key)) + key + u64(8 * 1024 * 1024) + b"x" * 65536)
            socks.append(c)
        time.sleep(1.0)
        after = rss_kb(p.pid)
        grow = (after - before) / 1024
        print("store_sizes: 64 clients announcing 8 MiB values (64 KiB sent each): RSS %d -> %d KiB (+%.1f MiB)"
              % (before, after, grow), flush=True)
        if grow > 64 * 8 * 0.5:
            fail("store_sizes", "RSS grew by %.0f MiB for 64 announced (unsent) 8 MiB values" % grow)
        for c in socks:
            c.close()
    finally:
        p.kill()
        p.wait()


def pmix_tmpdirs():
    base = os.environ.get("TMPDIR", "/tmp")
    return {os.path.join(base, n) for n in os.listdir(base) if n.startswith("dptp-run.")}


def case_pmix_tmpdir():
    probe = ('d="$PMIX_SERVER_TMPDIR"; [ -n "$d" ] || d="$PMIX_SYSTEM_TMPDIR"; '
             'stat -c "%a %u %n" "$d"; exit ${FAIL:-0}')
    for what, extra_env, sig in (("pass", {}, None), ("worker exit 3", {"FAIL": "3"}, None),
                                 ("SIGTERM", {}, signal.SIGTERM)):
        before = pmix_tmpdirs()
        env = dict(os.environ, **extra_env)
        cmd = [ARGS.run, "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
               probe + ("; sleep 30" if sig else "")]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if sig:
            time.sleep(1.0)
            p.send_signal(sig)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            fail("pmix_tmpdir", "%s: dptp-run did not exit" % what)
            continue
        lines = [ln.split() for ln in out.splitlines() if ln.strip()]
        if not lines:
            fail("pmix_tmpdir", "%s: the workers saw no PMIX_SERVER_TMPDIR/PMIX_SYSTEM_TMPDIR (rc %d): %s"
                 % (what, p.returncode, err[-300:]))
            continue
        for mode, uid, path in lines:
            if mode != "700" or int(uid) != os.geteuid():
                fail("pmix_tmpdir", "%s: %s has mode %s owner %s (want 700, %d)" % (what, path, mode, uid, os.geteuid()))
        left = pmix_tmpdirs() - before
        paths = {l[2] for l in lines}
        if left or any(os.path.exists(x) for x in paths):
            fail("pmix_tmpdir", "%s: tmpdir left behind: %s" % (what, sorted(left | {x for x in paths if os.path.exists(x)})))
        else:
            print("ok pmix_tmpdir (%s): %s mode %s, removed after the run (dptp-run rc %d)"
                  % (what, lines[0][2], lines[0][0], p.returncode), flush=True)


CASES = {"store_bind": case_store_bind, "store_sizes": case_store_sizes, "pmix_tmpdir": case_pmix_tmpdir}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--check", required=True)
    ap.add_argument("--only")
    ARGS = ap.parse_args()
    names = ARGS.only.split(",") if ARGS.only else list(CASES)
    for n in names:
        CASES[n]()
    for f in FAILURES:
        print("FAIL:", f)
    print("%d cases, %d failures" % (len(names), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
