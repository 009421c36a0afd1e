#!/usr/bin/env python3
"""Attacks from outside the job (issue 14), against real processes.

usage: attacks.py --run DPTP_RUN --check DPTP_CHECK [--only CASE,...] [--attempts N]

Each case runs dptp-check jobs while an attacker does its worst, and counts
attempts, hangs (a job alive past --timeout + margin), false verdicts (a
`fail` the job's own code did not earn) and what was left behind (processes
of the job, /dev/shm/dptp-* files). Every count but attempts must be 0.

  ipc_flood       uid nobody (setpriv) reads the @/tmp/mcastmem-socket-*
                  names from /proc/net/unix and fills their queues with
                  datagrams: the job ends within --timeout, and passes.
  ipc_inject      same, with valid-looking payloads naming global rank 1
                  and a descriptor: never "crossed groups"; the detail names
                  the foreign sender (pid, uid).
  faults_still    opid-seeded and world-workspace still fail as they do.
  output_paths    --output to what a user can name: /dev/null, /dev/full,
                  /dev/stdout (device nodes made in a scratch tmpfs bound
                  over /dev inside `unshare -m`: the real /dev is never
                  touched; skipped when not root), a FIFO, /dev/fd/N, a
                  254-byte name, `-`: written in place, never replaced.
  store_memory    rank 0's TCPStore with DPTP_STORE_MAX_BYTES=64M: 32
                  clients each send 12 MiB of a MULTI_SET of 48 MiB and
                  stop; its peak RSS (VmHWM from /proc) stays under the
                  budget + 48 MiB, and rank 1 then joins and the job passes.
  store_keys      rank 0's TCPStore with DPTP_STORE_MAX_BYTES=16M: a client
                  of the job's own user floods QUEUE_PUSH with new key names
                  and SETs of 8-byte keys with empty values (issue 24 item
                  2: neither was counted): its RSS (VmHWM) grows by less
                  than twice the budget, and the flood is refused.
  store_outsider  the same flood as uid nobody (setpriv; the job's own user
                  when not root), over as many connections as it likes:
                  RSS grows by less than the budget, and rank 1 then joins
                  and the job passes (the outsider gets an eighth).
  waiter_bomb     the same store: 1000 keys set, then 400 clients WAIT on
                  all of them plus one that never comes; a client's SET
                  round trip is printed (a figure, not asserted) and rank 1
                  then joins and the job passes.
  mpirun_colour   mpirun -np 2 dptp-check > file: no colour codes (the
                  ranks' stdout is Open MPI's relay pty); skipped without mpirun.
  stale_slot      an earlier attempt of the same torchrun-style job (same
                  run id, address, port) left /dev/shm/dptp-* slots of two
                  killed ranks and holds one of a live rank: the next attempt
                  passes, removes the first, never touches the last; after
                  that rank is killed the attempt after leaves nothing.
  forged_static   static rendezvous, --nnodes 2: a fake node 0 (hosting
                  the store) writes its node record, role_info and node
                  1's assigned_ranks: worlds of 65538 and 2^20, ranks that
                  collide with node 0's, a value past 2^32: the real node 1
                  exits 1 with one line, starts no worker, leaves nothing.
  forged_c10d     c10d, --nnodes 2: a fake peer joins the rendezvous state
                  as rank 0 and writes the round's keys (WORLD_SIZE=65538),
                  or forges the state (a rank out of range, a rank twice, 3
                  nodes); --nnodes 1:2000: the same, one line each.
  forged_node0    two real static nodes; a fake peer overwrites node 0's
                  role_info (65536 workers) before node 1 joins: node 0
                  refuses, node 1 stops on its refusal; one line each.
  nnodes_mismatch two real static nodes with --nnodes 3 and 2 (and 2 and 3):
                  both exit 1 within seconds, node 1 naming both counts.
  torchrun_env    torchrun-style environments: MASTER_PORT, RANK, WORLD_SIZE
                  or LOCAL_RANK set but empty, LOCAL_RANK unset with
                  LOCAL_WORLD_SIZE=2, no store at --timeout 2: exit 3, one
                  line, within --timeout + 3 s; a RANK claimed twice: every
                  process exits 3 naming the claim, none times out.

The attacker is this script, run again with --attacker MODE.
"""
import argparse
import array
import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import security  # noqa: E402
from security import free_port, VALIDATE, u64  # noqa: E402

ARGS = None
FAILURES = []
FIGURES = {}
IPC_MAGIC = 0x64707470


def fail(case, msg):
    FAILURES.append("%s: %s" % (case, msg))
    print("FAIL %s: %s" % (case, msg), flush=True)


def figure(case, **kw):
    f = FIGURES.setdefault(case, {"attempts": 0, "hangs": 0, "false_verdicts": 0,
                                  "processes_left": 0, "shm_left": 0})
    for k, v in kw.items():
        f[k] = f.get(k, 0) + v


# ---------------------------------------------------------------- attacker

def ipc_names():
    out = set()
    try:
        with open("/proc/net/unix") as f:
            for ln in f.read().splitlines()[1:]:
                p = ln.split()
                if len(p) >= 8 and p[7].startswith("@/tmp/mcastmem-socket-"):
                    out.add(p[7][1:])
    except OSError:
        pass
    return out


def attacker(mode, seconds):
    """Floods every IPC socket name it sees until killed or `seconds`."""
    end = time.monotonic() + seconds
    memfd = os.memfd_create("attacker")
    os.write(memfd, struct.pack("<i", 1))
    sent = 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    while time.monotonic() < end:
        for name in ipc_names():
            # payload: magic, global rank 1, group rank 1, buffer 0, opid
            msg = struct.pack("<IiiiQ", IPC_MAGIC, 1, 1, 0, 0)
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [memfd]))] if mode == "inject" else []
            for _ in range(64):
                try:
                    s.sendmsg([msg], anc, 0, "\0" + name)
                    sent += 1
                except OSError:
                    break
        time.sleep(0.0005)
    print("attacker sent %d datagrams" % sent, flush=True)
    return 0


def store_flood(port, seconds, keys=1 << 20, conns=32):
    """QUEUE_PUSH of new key names and SETs of 8-byte keys, both with empty
    values, over up to `conns` connections (a new one when the store closes
    one): what the budget once missed. Returns (requests sent, connections
    the store closed or refused)."""
    end = time.monotonic() + seconds
    batch = 8192
    sent = closed = 0
    c = None
    i = 0
    while i < keys and time.monotonic() < end and closed < conns:
        if c is None:
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=2)
                c.sendall(VALIDATE)
            except OSError:
                closed += 1
                c = None
                continue
        blob = b"".join(b"\x0e" + u64(10) + b"/q%08x" % (i + j) + u64(0) +
                        b"\x01" + u64(8) + b"k%07x" % (i + j) + u64(0) for j in range(batch))
        try:
            c.sendall(blob)
            sent += 2 * batch
            i += batch
        except OSError:
            closed += 1
            c.close()
            c = None
    if c is not None:
        c.close()
    return sent, closed


def start_attacker(mode, seconds, port=0):
    cmd = [sys.executable, os.path.abspath(__file__), "--attacker", mode, "--seconds", str(seconds),
           "--port", str(port)]
    if os.getuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ---------------------------------------------------------------- jobs

def tagged(tag):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if ("DPTP_ATTACK_TAG=" + tag).encode() in f.read():
                    with open("/proc/%s/stat" % d) as g:
                        st = g.read()
                    if st[st.rindex(")") + 2] not in "ZX":
                        out.append(int(d))
        except (OSError, ValueError):
            pass
    return out


def shm_files():
    return set(glob.glob("/dev/shm/dptp-*"))


def run_job(case, tmp, args, timeout, margin=15.0, env_extra=None):
    """Runs one 4-rank job; returns (rc, report or None, stderr, seconds)."""
    tag = uuid.uuid4().hex
    out = os.path.join(tmp, "r-%s.json" % tag[:8])
    cmd = [ARGS.run, "--nproc-per-node=4", "--no-python", ARGS.check, "--tokens", "8", "--hidden", "64",
           "--timeout", str(timeout), "--format", "json", "--output", out] + args
    env = dict(os.environ, DPTP_ATTACK_TAG=tag, NO_COLOR="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if env_extra:
        env.update(env_extra)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True, cwd=tmp)
    figure(case, attempts=1)
    try:
        _, err = p.communicate(timeout=timeout * 3 + margin)
    except subprocess.TimeoutExpired:
        figure(case, hangs=1)
        fail(case, "job still alive %.0f s after start (--timeout %d)" % (time.monotonic() - t0, timeout))
        for pid in tagged(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        p.kill()
        _, err = p.communicate()
    secs = time.monotonic() - t0
    time.sleep(0.2)
    left = tagged(tag)
    if left:
        figure(case, processes_left=len(left))
        fail(case, "processes of the job left: %s" % left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    rep = None
    try:
        with open(out) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        pass
    return p.returncode, rep, err, secs


def statuses(rep):
    """{(dp, check): (status, detail)}"""
    out = {}
    for r in rep.get("replicas", []):
        for c in r.get("checks", []):
            out[(r["dp"], c["name"])] = (c["status"], c.get("detail", ""))
    return out


def case_ipc(case, mode):
    shm0 = shm_files()
    named = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ARGS.attempts):
            atk = start_attacker(mode, 60)
            time.sleep(0.3)
            rc, rep, err, secs = run_job(case, tmp, ["--dp", "2", "--tp", "2", "--checks", "opid,fused-allreduce"],
                                         timeout=10)
            atk.kill()
            atk_out = atk.communicate()[0]
            if rep is None:
                fail(case, "attempt %d: no report (rc %d) after %.1f s: %s" % (i, rc, secs, "\n".join(ln for ln in err.splitlines() if "dptp-run]" not in ln)[:1500]))
                continue
            st = statuses(rep)
            for (dp, chk), (s, d) in sorted(st.items()):
                if s == "fail":
                    figure(case, false_verdicts=1)
                    fail(case, "attempt %d: dp%d/%s fail: %s" % (i, dp, chk, d))
                elif s != "pass":
                    fail(case, "attempt %d: dp%d/%s %s: %s" % (i, dp, chk, s, d))
                if "outside the job" in d:
                    named += 1
                    if "uid 65534" not in d and os.getuid() == 0:
                        fail(case, "attempt %d: foreign datagrams not named with uid 65534: %s" % (i, d))
            if rc != 0:
                fail(case, "attempt %d: exit %d after %.1f s: %s" % (i, rc, secs, err.strip()[-400:]))
            print("attempt %d: exit %d in %.1f s, %s" % (i, rc, secs, atk_out.strip()), flush=True)
    left = shm_files() - shm0
    if left:
        figure(case, shm_left=len(left))
        fail(case, "left in /dev/shm: %s" % sorted(left))
    if named == 0:
        print("note %s: the attacker never landed a datagram in %d attempts" % (case, ARGS.attempts), flush=True)
    FIGURES[case]["details_naming_attacker"] = named


def case_faults_still():
    case = "faults_still"
    with tempfile.TemporaryDirectory() as tmp:
        for fault, chk, want in (("opid-seeded", "opid", {0: "fail", 1: "fail"}),
                                 ("world-workspace", "fused-allreduce", {1: "fail"})):
            rc, rep, err, secs = run_job(case, tmp, ["--dp", "2", "--tp", "2", "--checks", chk, "--inject", fault],
                                         timeout=10)
            if rep is None:
                fail(case, "%s: no report (rc %d): %s" % (fault, rc, err.strip()[-400:]))
                continue
            st = statuses(rep)
            for dp, s in want.items():
                got = st.get((dp, chk), ("missing", ""))
                if got[0] != s:
                    fail(case, "%s: dp%d/%s is %s, want %s: %s" % (fault, dp, chk, got[0], s, got[1]))
            if rc != 1:
                fail(case, "%s: exit %d, want 1" % (fault, rc))
            print("%s: exit %d, %s" % (fault, rc, {"dp%d" % k[0]: v[0] for k, v in st.items()}), flush=True)


def tr_env(rank, world, port, **kw):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_RUN_ID="attack-" + uuid.uuid4().hex[:6], NO_COLOR="1")
    env.pop("PMIX_NAMESPACE", None)
    for k, v in kw.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def case_torchrun_env():
    case = "torchrun_env"
    dead = free_port()  # nothing listens there
    # hex is refused as torch's int() refuses it (issue 24 item 6: it was
    # read with strtoull base 0, RANK=0x1 as 1)
    bad = [("MASTER_PORT", ""), ("RANK", ""), ("WORLD_SIZE", ""), ("LOCAL_RANK", ""),
           ("LOCAL_RANK", None), ("no store", ""), ("RANK", "0x1"), ("WORLD_SIZE", "0x2"), ("MASTER_PORT", "0x50")]
    for var, val in bad:
        env = tr_env(1, 2, dead) if var == "no store" else tr_env(1, 2, dead, **{var: val})
        t0 = time.monotonic()
        figure(case, attempts=1)
        try:
            p = subprocess.run([ARGS.check, "--timeout", "2", "--tokens", "8", "--hidden", "64"], env=env,
                               capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            figure(case, hangs=1)
            fail(case, "%s=%r: still running after 30 s (--timeout 2)" % (var, val))
            continue
        secs = time.monotonic() - t0
        lines = p.stderr.strip().splitlines()
        what = "%s %s" % (var, "unset" if val is None else "=%r" % val)
        if p.returncode != 3 or len(lines) != 1 or (var != "no store" and var not in lines[0]):
            if p.returncode == 1:
                figure(case, false_verdicts=1)
            fail(case, "%s: exit %d, want 3 and one line naming it: %r" % (what, p.returncode, p.stderr[-300:]))
        elif secs > 5:
            figure(case, hangs=1)
            fail(case, "%s: took %.1f s at --timeout 2" % (what, secs))
        else:
            print("ok %s: exit 3 in %.2f s: %s" % (what, secs, lines[0]), flush=True)
    # leading zeros are decimal, as torch reads them: RANK=010 is ten (it
    # was octal 8), MASTER_PORT=0NNNNN the port, WORLD_SIZE=01 one rank
    port = free_port()
    figure(case, attempts=1)
    env = tr_env("00", "01", "0%d" % port, LOCAL_RANK="00", LOCAL_WORLD_SIZE="01")
    p = subprocess.run([ARGS.check, "--timeout", "5", "--tokens", "8", "--hidden", "64"], env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(case, "RANK=00 WORLD_SIZE=01 MASTER_PORT=0%d: exit %d: %r" % (port, p.returncode, p.stderr[-300:]))
    else:
        print("ok leading zeros: RANK=00 WORLD_SIZE=01 MASTER_PORT=0%d passes" % port, flush=True)
    p = subprocess.run([ARGS.check, "--timeout", "2", "--tokens", "8", "--hidden", "64"],
                       env=tr_env("010", 9, port), capture_output=True, text=True, timeout=30)
    if p.returncode != 3 or "invalid RANK='010': expected an integer in 0..8" not in p.stderr:
        fail(case, "RANK=010 in a world of 9: exit %d, want 3 naming it (10, not octal 8): %r" % (
            p.returncode, p.stderr[-300:]))
    else:
        print("ok RANK=010 in a world of 9: exit 3: %s" % p.stderr.strip(), flush=True)
    # RANK 1 claimed twice in a world of 3 (rank 2 never comes)
    port = free_port()
    procs = []
    for r in (0, 1, 1):
        procs.append(subprocess.Popen([ARGS.check, "--timeout", "3", "--tokens", "8", "--hidden", "64"],
                                      env=tr_env(r, 3, port, TORCHELASTIC_RUN_ID="dup-%d" % port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
        time.sleep(0.3)
    figure(case, attempts=1)
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            figure(case, hangs=1)
        if p.returncode != 3 or "claimed by two processes" not in err:
            fail(case, "duplicate RANK: process %d exit %s: %r" % (i, p.returncode, err[-300:]))
    if not any(f.startswith(case + ": duplicate") for f in FAILURES):
        print("ok duplicate RANK: all three exit 3 naming the claim", flush=True)


def single_env():
    env = dict(os.environ, NO_COLOR="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    return env


CHECK1 = ["--checks", "broadcast", "--tokens", "8", "--hidden", "64", "--timeout", "10"]

DEV_SCRIPT = r"""
set -e
mount -t tmpfs tmpfs "$S"
mknod "$S/null" c 1 3; mknod "$S/full" c 1 7
ln -s /proc/self/fd "$S/fd"; ln -s /proc/self/fd/1 "$S/stdout"
mkdir "$S/shm"; mount --bind /dev/shm "$S/shm"
mount --bind "$S" /dev
set +e
"$CHECK" $ARGS --format json --output /dev/null; echo "null rc=$? $(stat -c %F /dev/null)"
"$CHECK" $ARGS --format json --output /dev/full 2>"$S/err"; echo "full rc=$? $(stat -c %F /dev/full) lines=$(wc -l <"$S/err") $(cat "$S/err")"
"$CHECK" $ARGS --format text --output /dev/stdout >"$S/out"; echo "stdout rc=$? $(stat -L -c %F "$S/out") bytes=$(wc -c <"$S/out")"
"""


def case_output_paths():
    case = "output_paths"
    env = single_env()
    base = [ARGS.check] + CHECK1 + ["--format", "json", "--output"]
    if os.getuid() == 0:
        with tempfile.TemporaryDirectory() as scratch:
            figure(case, attempts=3)
            p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", DEV_SCRIPT],
                               env=dict(env, S=scratch, CHECK=ARGS.check, ARGS=" ".join(CHECK1)),
                               capture_output=True, text=True, timeout=60)
            out = p.stdout
            for want in ("null rc=0 character special file", "full rc=3 character special file lines=1",
                         "stdout rc=0 regular file bytes=[1-9]"):
                if not re.search(want, out):
                    fail(case, "in a private /dev: want %r in %r (stderr %r)" % (want, out, p.stderr[-300:]))
            if "/dev/full" not in out:
                fail(case, "/dev/full: the error does not name it: %r" % out)
            print("devices (private mount namespace): %s" % out.strip().replace("\n", "; "), flush=True)
    else:
        print("skip devices: not root (unshare -m needs it)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        # a FIFO with a reader: written in place, still a FIFO
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        rd = subprocess.Popen(["cat", fifo], stdout=subprocess.PIPE, text=True)
        figure(case, attempts=1)
        p = subprocess.run(base + [fifo], env=env, capture_output=True, text=True, timeout=60)
        got = rd.communicate(timeout=20)[0]
        ok = p.returncode == 0 and got.lstrip().startswith("{") and os.path.exists(fifo) and \
            not os.path.isfile(fifo)
        (print if ok else lambda m: fail(case, m))("%s fifo: exit %d, reader got %d bytes, %s" % (
            "ok" if ok else "bad", p.returncode, len(got), "still a FIFO" if not os.path.isfile(fifo) else "REPLACED"))
        # /dev/fd/N (what process substitution hands over)
        r, w = os.pipe()
        figure(case, attempts=1)
        p = subprocess.Popen(base + ["/dev/fd/%d" % w], env=env, pass_fds=(w,), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read()
        p.wait(timeout=60)
        ok = p.returncode == 0 and got.lstrip().startswith("{")
        (print if ok else lambda m: fail(case, m))("%s /dev/fd/N: exit %d, %d bytes through the pipe %s" % (
            "ok" if ok else "bad", p.returncode, len(got), p.stderr.read().strip()))
        # a 254-byte name: the temporary sibling must not need more
        longname = os.path.join(tmp, "r" * 249 + ".json")
        figure(case, attempts=1)
        p = subprocess.run(base + [longname], env=env, capture_output=True, text=True, timeout=60)
        left = [n for n in os.listdir(tmp) if "tmp" in n]
        ok = p.returncode == 0 and os.path.isfile(longname) and not left
        (print if ok else lambda m: fail(case, m))("%s 254-byte name: exit %d %s, temporaries left %s" % (
            "ok" if ok else "bad", p.returncode, p.stderr.strip()[-200:], left))
        # "-": standard output
        figure(case, attempts=1)
        p = subprocess.run(base + ["-"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp)
        ok = p.returncode == 0 and p.stdout.lstrip().startswith("{") and not os.path.exists(os.path.join(tmp, "-"))
        (print if ok else lambda m: fail(case, m))("%s '-': exit %d, stdout starts %r" % (
            "ok" if ok else "bad", p.returncode, p.stdout[:20]))


def vm_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith(field + ":"):
                return int(ln.split()[1])
    return 0


def rank1_joins(case, p, port):
    """After an attack on rank 0's store (security.start_rank0): rank 1
    joins, and both ranks must pass."""
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
               GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_USE_AGENT_STORE="False", TORCHELASTIC_RUN_ID="security")
    env.pop("PMIX_NAMESPACE", None)
    r1 = subprocess.run([ARGS.check, "--tokens", "8", "--hidden", "64", "--timeout", "20"], env=env,
                        capture_output=True, text=True, timeout=120)
    rc0 = p.wait(timeout=60)
    if r1.returncode != 0 or rc0 != 0:
        figure(case, false_verdicts=1)
        fail(case, "after the attack: rank 0 exit %s, rank 1 exit %s: %s %s" % (
            rc0, r1.returncode, p.stderr.read()[-300:], r1.stderr[-300:]))
    else:
        print("ok %s: the job passed after the attack" % case, flush=True)


def case_store_memory():
    case = "store_memory"
    security.ARGS = ARGS
    port = free_port()
    os.environ["DPTP_STORE_MAX_BYTES"] = ARGS.store_budget
    try:
        p, ls = security.start_rank0(port)
    finally:
        del os.environ["DPTP_STORE_MAX_BYTES"]
    figure(case, attempts=1)
    socks = []
    try:
        if not ls:
            fail(case, "rank 0 never listened on %d" % port)
            return
        hwm0 = vm_kb(p.pid, "VmHWM")
        chunk = b"x" * (1 << 20)
        refused = 0
        why = ""
        for i in range(32):
            c = socket.create_connection(("127.0.0.1", port))
            c.settimeout(2)
            key = b"/bomb%d/" % i
            try:
                # MULTI_SET of 6 values of 8 MiB (the per-value limit):
                # 12 MiB of it sent, the rest never comes
                c.sendall(VALIDATE + b"\x0b" + u64(6))
                for j in range(2):
                    kj = key + b"%d" % j
                    c.sendall(u64(len(kj)) + kj + u64(8 << 20))
                    for _ in range(8 if j == 0 else 4):
                        c.sendall(chunk)
            except OSError as e:
                refused += 1
                why = str(e)
            socks.append(c)
        time.sleep(1.0)
        hwm = vm_kb(p.pid, "VmHWM")
        grow = (hwm - hwm0) / 1024
        FIGURES[case]["peak_rss_growth_mib"] = round(grow, 1)
        FIGURES[case]["connections_refused"] = refused
        print("store_memory: 32 clients x 12 MiB of 48 MiB frames, budget %s: peak RSS %d -> %d KiB "
              "(+%.1f MiB), %d connections refused (%s)" % (ARGS.store_budget, hwm0, hwm, grow, refused, why), flush=True)
        budget_mib = int(ARGS.store_budget.rstrip("M"))
        if grow > budget_mib + 48:
            fail(case, "peak RSS grew by %.0f MiB with a %d MiB budget" % (grow, budget_mib))
        for c in socks:
            c.close()
        rank1_joins(case, p, port)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def sstr(b):
    return u64(len(b)) + b


def store_flood_case(case, outsider):
    """store_keys (outsider False) and store_outsider: see the docstring."""
    security.ARGS = ARGS
    port = free_port()
    budget = 16
    os.environ["DPTP_STORE_MAX_BYTES"] = "%dM" % budget
    try:
        p, ls = security.start_rank0(port)
    finally:
        del os.environ["DPTP_STORE_MAX_BYTES"]
    figure(case, attempts=1)
    try:
        if not ls:
            return fail(case, "rank 0 never listened on %d" % port)
        hwm0 = vm_kb(p.pid, "VmHWM")
        t0 = time.monotonic()
        if outsider:
            a = start_attacker("store", 8, port)
            out = a.communicate(timeout=60)[0].strip()
        else:
            out = "sent %d requests, %d connections closed" % store_flood(port, 8)
        secs = time.monotonic() - t0
        time.sleep(0.3)
        grow = (vm_kb(p.pid, "VmHWM") - hwm0) / 1024
        FIGURES[case]["peak_rss_growth_mib"] = round(grow, 1)
        print("%s: budget %d MiB, flood of empty queue pushes and 8-byte keys for %.1f s (%s): peak RSS +%.1f MiB"
              % (case, budget, secs, out, grow), flush=True)
        m = re.search(r"sent (\d+) requests, (\d+) connections closed", out)
        if not m or int(m.group(2)) == 0:
            fail(case, "the flood was never refused: %s" % out)
        limit = budget if outsider else 2 * budget
        if grow > limit:
            fail(case, "peak RSS grew by %.0f MiB with a %d MiB budget (limit %d)" % (grow, budget, limit))
        if outsider:
            rank1_joins(case, p, port)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def case_waiter_bomb():
    case = "waiter_bomb"
    security.ARGS = ARGS
    port = free_port()
    p, ls = security.start_rank0(port)
    figure(case, attempts=1)
    if not ls:
        p.kill()
        p.wait()
        return fail(case, "rank 0 never listened on port %d" % port)
    socks = []
    try:
        keys = [b"/p%d" % i for i in range(1000)]
        a = socket.create_connection(("127.0.0.1", port))
        a.sendall(VALIDATE + b"\x0b" + u64(len(keys)) + b"".join(sstr(k) + sstr(b"v") for k in keys))
        wait = b"\x06" + u64(len(keys) + 1) + b"".join(sstr(k) for k in keys) + sstr(b"/never")
        for i in range(400):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(VALIDATE + wait)
            socks.append(c)
        time.sleep(1.0)
        # a client's SET + GET round trips while the 400 waiters wait
        n = 200
        t0 = time.monotonic()
        for i in range(n):
            a.sendall(b"\x01" + sstr(b"/x") + sstr(b"%d" % i) + b"\x03" + sstr(b"/x"))
            got = b""
            while len(got) < 8 + len(b"%d" % i):
                got += a.recv(4096)
        per = (time.monotonic() - t0) / n * 1000
        FIGURES[case]["set_round_trip_ms"] = round(per, 3)
        print("waiter_bomb: 400 waiters on 1001 keys each: SET+GET round trip %.3f ms" % per, flush=True)
        rank1_joins(case, p, port)
        a.close()
    finally:
        for c in socks:
            c.close()
        if p.poll() is None:
            p.kill()
            p.wait()


def case_mpirun_colour():
    case = "mpirun_colour"
    import shutil
    if not shutil.which("mpirun"):
        print("skip mpirun_colour: no mpirun", flush=True)
        return
    env = single_env()
    env.pop("NO_COLOR", None)
    figure(case, attempts=1)
    with tempfile.TemporaryFile() as out:
        rc = subprocess.call(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                              ARGS.check, "--tokens", "8", "--hidden", "64", "--timeout", "20"],
                             env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120)
        out.seek(0)
        text = out.read()
    if rc != 0 or b"\x1b[" in text or b"summary:" not in text:
        fail(case, "exit %d, %d escape codes in the redirected report" % (rc, text.count(b"\x1b[")))
    else:
        print("ok mpirun_colour: the redirected report has no colour codes", flush=True)


HOLD_SLOT = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 4096)
os.pwrite(fd, b"earlier attempt", 0)
print("ready", flush=True)
time.sleep(600)
"""


def stale_run(case, run_id, port):
    """One 2-rank torchrun-style attempt; returns (exit codes, stderr tails)."""
    figure(case, attempts=1)
    procs = [subprocess.Popen([ARGS.check, "--tokens", "8", "--hidden", "64", "--timeout", "20"],
                              env=tr_env(r, 2, port, TORCHELASTIC_RUN_ID=run_id), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errs = []
    for p in procs:
        try:
            errs.append(p.communicate(timeout=60)[1])
        except subprocess.TimeoutExpired:
            p.kill()
            errs.append(p.communicate()[1])
            figure(case, hangs=1)
    rcs = [p.returncode for p in procs]
    if any(rcs):
        figure(case, false_verdicts=1)
    return rcs, " ".join(e.strip()[-200:] for e in errs)


def case_stale_slot():
    """Slots are /dev/shm/dptp-<job>-<attempt nonce>-<rank>. An earlier
    attempt of the same job (same run id, address, port): its rank 1 was
    killed and left its slot (so did its rank 3: that attempt had 4),
    its rank 0 is still alive (stuck) and holds its own. The next attempt
    (2 ranks) passes, removes the dead ones' slots, never
    opens the live one's (content, inode and times unchanged); once that
    one is SIGKILLed too, the attempt after removes its slot: nothing of
    the job is left in /dev/shm."""
    case = "stale_slot"
    port = free_port()
    run_id = "stale-%d" % port
    job = "tr-%s-0-127.0.0.1-%d" % (run_id, port)
    h = 1469598103934665603
    for ch in job.encode():
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    mine = "/dev/shm/dptp-lk-%016x-" % h
    earlier = os.urandom(8).hex()
    dead = "%s%s-1" % (mine, earlier)
    gone = "%s%s-3" % (mine, earlier)  # a rank the next attempt (world 2) does not have
    for f in (dead, gone):
        with open(f, "wb") as out:
            out.write(b"\0" * 4096)
    live = "%s%s-0" % (mine, earlier)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SLOT, live], stdout=subprocess.PIPE, text=True)
    problems = []
    try:
        if holder.stdout.readline().strip() != "ready":
            return fail(case, "the earlier attempt's rank 0 could not make its slot %s" % live)
        before = os.stat(live)
        rcs, errs = stale_run(case, run_id, port)
        after = os.stat(live) if os.path.exists(live) else None
        with open(live, "rb") as f:
            content = f.read(15) if after else b""
        if rcs != [0, 0]:
            problems.append("attempt 1 exits %s: %s" % (rcs, errs))
        for f in (dead, gone):
            if os.path.exists(f):
                problems.append("the killed rank's slot %s is still there" % f)
        if not after or (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns) != \
                (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns) or content != b"earlier attempt":
            problems.append("the live earlier rank's slot %s was touched" % live)
        others = set(glob.glob(mine + "*")) - {live}
        if others:
            figure(case, shm_left=len(others))
            problems.append("attempt 1 left %s" % sorted(others))
    finally:
        holder.kill()
        holder.wait()
    rcs, errs = stale_run(case, run_id, port)
    if rcs != [0, 0]:
        problems.append("attempt 2 exits %s: %s" % (rcs, errs))
    left = glob.glob(mine + "*")
    if left:
        figure(case, shm_left=len(left))
        problems.append("left in /dev/shm: %s" % left)
        for f in left:
            os.unlink(f)
    if problems:
        fail(case, "; ".join(problems))
    else:
        print("ok stale_slot: attempt 1 passed, removed the killed ranks' %s and -3, left the live one's alone; "
              "attempt 2 passed after it was killed and nothing of the job is left" % os.path.basename(dead), flush=True)


# ---------------------------------------------------------------- forged records

def store_client(port, timeout=20):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launcher"))
    from store_probe import Store
    return Store("127.0.0.1", port, timeout=timeout)


def role_info(rank, lws):
    return '{"role": "default", "rank": %d, "local_world_size": %d}' % (rank, lws)


def forged_node(case, tmp, what, args, want, before=None, timeout=60):
    """Runs one dptp-run node (2 workers that write their WORLD_SIZE) after
    before(); it must exit non-zero within `timeout` with one error line
    matching `want`, start no worker and leave nothing (processes, files
    in its TMPDIR: PMIx tmpdir, log dirs). /dev/shm is not looked at: this
    dptp-run makes none, and other jobs on the machine do."""
    tag = uuid.uuid4().hex
    out = os.path.join(tmp, "world-%s" % tag[:8])
    tdir = tempfile.mkdtemp(dir=tmp)
    cmd = [ARGS.run, "--nproc-per-node=2"] + args + ["--no-python", "/bin/sh", "-c", 'echo "$WORLD_SIZE" >> ' + out]
    env = dict(os.environ, DPTP_ATTACK_TAG=tag, TMPDIR=tdir, DPTP_RUN_STOP_TIMEOUT="5")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    figure(case, attempts=1)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    fake = None
    try:
        fake = before(p) if before else None
        try:
            err = p.communicate(timeout=timeout)[1]
        except subprocess.TimeoutExpired:
            figure(case, hangs=1)
            p.kill()
            err = p.communicate()[1]
            fail(case, "%s: dptp-run still alive after %d s" % (what, timeout))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if fake:
            fake()
    secs = time.monotonic() - t0
    time.sleep(0.2)
    errs = [ln for ln in err.splitlines() if "error" in ln.lower()]
    worlds = open(out).read().split() if os.path.exists(out) else []
    left = tagged(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    files = [os.path.join(d, f) for d, _, fs in os.walk(tdir) for f in fs] + \
        [d for d, ds, _ in os.walk(tdir) if d != tdir]
    FIGURES[case].pop("shm_left", None)  # not measured here (see above)
    figure(case, processes_left=len(left), bytes_left=sum(
        os.path.getsize(f) for f in files if os.path.isfile(f)), files_left=len(files))
    if worlds:
        figure(case, false_verdicts=1)
    problems = []
    if p.returncode == 0 or len(errs) != 1 or not re.search(want, errs[0] if errs else ""):
        problems.append("exit %s, error lines %s (want one matching %r)" % (p.returncode, errs, want))
    if worlds:
        problems.append("workers started with WORLD_SIZE %s" % worlds)
    if left or files:
        problems.append("left: processes %s, files %s" % (left, files))
    if problems:
        fail(case, "%s: %s" % (what, "; ".join(problems)))
    else:
        print("ok %s (%s): exit %d in %.1f s, no worker, nothing left: %s" % (case, what, p.returncode, secs,
                                                                          errs[0].strip()), flush=True)


def case_forged_static():
    """Static rendezvous, --nnodes 2: a fake node 0 hosts the store (a
    dptp-check rank 0, a real TCPStore) and writes, as node 0 would, its
    node record and role_info and node 1's assigned_ranks: the issue's
    WORLD_SIZE=65538, one of 2^20, the node record alone, a plausible
    world whose ranks collide with node 0's, a number past 2^32. The real
    dptp-run node 1 refuses each."""
    case = "forged_static"
    security.ARGS = ARGS
    forgeries = [  # (what, node 0's record and role_info, node 1's assigned_ranks, error)
        ("world 65538", 65536, 65536, "[65536, 65538, 65536, 65538]", r"node 0's role_info claims 65536 workers"),
        ("world 2^20", 1048574, 1048574, "[1048574, 1048576, 1048574, 1048576]",
         r"node 0's role_info claims 1048574 workers"),
        ("node record alone", 65536, 2, "[2, 4, 2, 4]", r"node 0's dptp record '65536 \d+ 2 evil-node0' claims 65536"),
        ("ranks of node 0", 2, 2, "[0, 4, 0, 4]", r"assigned_ranks \[0, 4, 0, 4\] of node 1 disagree with the "
         r"nodes' role_info, which give \[2, 4, 2, 4\]"),
        ("world 2^32 + 4", 2, 2, "[2, 4294967300, 2, 4]", r"assigned_ranks '\[2, 4294967300, 2, 4\]' is not"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for what, rec, lws, ranks, want in forgeries:
            port = free_port()
            store, ls = security.start_rank0(port)
            if not ls:
                store.kill()
                store.wait()
                fail(case, "the fake node 0's store never listened on port %d" % port)
                continue
            run_id = "forged-%d" % port
            st = store_client(port)
            st.set("%s/dptp/0/node/0" % run_id, "%d %d 2 evil-node0" % (rec, store.pid))
            st.set("%s/torchelastic/role_info/0" % run_id, role_info(0, lws))
            st.set("%s/torchelastic/assigned_ranks/1" % run_id, ranks)

            def stop(store=store, st=st):
                st.s.close()
                store.kill()
                store.wait()
            forged_node(case, tmp, what, ["--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
                                          "--master-port=%d" % port, "--rdzv-id=" + run_id],
                        want, before=lambda p, stop=stop: stop, timeout=40)


def case_forged_c10d():
    """c10d rendezvous, --nnodes 2: the real dptp-run hosts the c10d store
    and joins; a fake peer adds itself to the rendezvous state (pickled
    with stand-ins of torch's classes) as rank 0, completes the round, and
    writes the round's keys as rank 0 would: MASTER_ADDR/PORT, its
    role_info, the node's assigned_ranks (the issue's WORLD_SIZE=65538).
    Then forged states: a rank out of range, ranks twice, 3 nodes for
    --nnodes 2. The real node refuses each; and --nnodes 1:2000 (more
    nodes than the state holds) is refused at start."""
    case = "forged_c10d"
    import base64
    import datetime
    import pickle
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "c10d"))
    import standins
    utc = datetime.timezone.utc
    forgeries = [
        ("world 65538", "keys", r"node 0's role_info claims 65536 workers"),
        ("rank out of range", "rank5", r"rank 5: ranks must be 0\.\.1, each once"),
        ("rank twice", "twice", r"ranks must be 0\.\.1, each once"),
        ("3 nodes", "three", r"completed with 3 nodes; --nnodes=2:2"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for what, how, want in forgeries:
            port = free_port()
            run_id = "forged-%d" % port
            key = "torch.rendezvous." + run_id

            def peer(p, port=port, run_id=run_id, key=key, how=how):
                try:
                    return forge_c10d(p, port, run_id, key, how)
                except (OSError, EOFError, AssertionError) as e:
                    fail(case, "%s: the fake peer failed: %r" % (what, e))
                    return None

            def forge_c10d(p, port, run_id, key, how):
                st = store_client(port)
                rnd = "torch.rendezvous.%s.0/" % run_id
                if how == "keys":
                    st.set(rnd + "MASTER_ADDR", "127.0.0.1")
                    st.set(rnd + "MASTER_PORT", str(free_port()))
                    st.set(rnd + "torchelastic/role_info/0", role_info(0, 65536))
                    st.set(rnd + "torchelastic/assigned_ranks/1", "[65536, 65538, 65536, 65538]")
                end = time.monotonic() + 20
                while time.monotonic() < end and p.poll() is None:
                    try:
                        s = pickle.loads(base64.b64decode(st.get(key)))
                    except Exception:
                        s = None
                    if s is not None and not isinstance(s, bytes) and len(s.participants) == 1:
                        break
                    time.sleep(0.05)
                else:
                    return None
                real = next(iter(s.participants))
                now = datetime.datetime.now(utc)
                fakes = [standins._NodeDesc("!fake%d" % i, 1 + i, 0) for i in range(2 if how == "three" else 1)]
                for f in fakes:
                    s.participants[f] = 0
                    s.last_heartbeats[f] = now
                for r, n in enumerate(sorted(s.participants)):
                    s.participants[n] = r
                if how == "rank5":
                    s.participants[real] = 5
                elif how == "twice":
                    s.participants[real] = 0
                s.complete = True
                s.deadline = None
                st.set(key, base64.b64encode(pickle.dumps(s, protocol=4)))
                return lambda: st.s.close()
            forged_node(case, tmp, what, ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % port,
                                          "--rdzv-id=" + run_id, "--rdzv-conf=last_call_timeout=1,"
                                          "keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=30"],
                        want, before=peer, timeout=60)
        # the node count itself: more than the state can hold
        forged_node(case, tmp, "--nnodes 1:9000", ["--nnodes=1:9000", "--rdzv-backend=c10d",
                                                   "--rdzv-endpoint=127.0.0.1:%d" % free_port()],
                    r"--nnodes=1:9000: the c10d rendezvous state holds at most 8192 nodes", timeout=20)


def reap_nodes(case, ps, tag, t0):
    """Waits up to 60 s for each node; (stderr texts, seconds, processes of
    the job left, which are killed)."""
    errs = []
    for p in ps:
        try:
            errs.append(p.communicate(timeout=60)[1])
        except subprocess.TimeoutExpired:
            figure(case, hangs=1)
            p.kill()
            errs.append(p.communicate()[1])
    secs = time.monotonic() - t0
    time.sleep(0.2)
    left = tagged(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return errs, secs, left


def case_forged_node0():
    """Two real static nodes; once node 0 has written its role_info, a fake
    peer overwrites it (65536 workers), then node 1 starts. Node 0 refuses
    the assignment, and node 1, waiting for its ranks, stops on node 0's
    refusal: both exit 1 with one line naming the forgery, no worker, nothing
    left, within seconds."""
    case = "forged_node0"
    port = free_port()
    run_id = "forged0-%d" % port
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "worlds")
        env = dict(os.environ, DPTP_ATTACK_TAG=tag, TMPDIR=tmp)
        common = ["--master-addr=127.0.0.1", "--master-port=%d" % port, "--nproc-per-node=2", "--nnodes=2",
                  "--rdzv-id=" + run_id, "--no-python", "/bin/sh", "-c", 'echo "$WORLD_SIZE" >> ' + out]
        figure(case, attempts=1)
        t0 = time.monotonic()
        start = lambda k: subprocess.Popen([ARGS.run, "--node-rank=%d" % k] + common, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ps = [start(0)]
        try:
            st = store_client(port)
            key = "%s/torchelastic/role_info/0" % run_id
            end = time.monotonic() + 20
            while time.monotonic() < end and not st.check([key]):
                time.sleep(0.02)
            st.set(key, role_info(0, 65536))
            ps.append(start(1))
            st.check([key])  # the SET is in before the peer hangs up
            st.s.close()
        except (OSError, EOFError, AssertionError) as e:
            fail(case, "the fake peer failed: %r" % e)
        errs, secs, left = reap_nodes(case, ps, tag, t0)
        worlds = open(out).read().split() if os.path.exists(out) else []
        files = [os.path.join(d, f) for d, ds, fs in os.walk(tmp) for f in fs + ds if os.path.join(d, f) != out]
        figure(case, processes_left=len(left), files_left=len(files), false_verdicts=1 if worlds else 0)
        FIGURES[case].pop("shm_left", None)
        lines = [[ln for ln in e.splitlines() if "error" in ln.lower()] for e in errs]
        want = [r"^dptp-run: error: node 0's role_info claims 65536 workers",
                r"^dptp-run: error: node 0 refused the rendezvous: node 0's role_info claims 65536 workers"]
        rcs = [p.returncode for p in ps]
        if len(ps) != 2 or 0 in rcs or worlds or left or files or secs > 30 or \
                any(len(l) != 1 or not re.search(w, l[0]) for l, w in zip(lines, want)):
            fail(case, "exits %s in %.1f s, lines %s, WORLD_SIZE %s, left %s %s" % (rcs, secs, lines, worlds, left,
                                                                                 files))
        else:
            print("ok forged_node0: exits %s in %.1f s, no worker, nothing left: %s | %s" % (
                rcs, secs, lines[0][0].strip(), lines[1][0].strip()), flush=True)


def case_nnodes_mismatch():
    """Two real static nodes started with different --nnodes (3 and 2, then
    2 and 3): the one that sees node 0's count differ exits 1 with one line
    naming both counts, node 0 stops too (its rendezvous, or its workers on
    the failed attempt), both within seconds, not the rendezvous timeout."""
    case = "nnodes_mismatch"
    want = r"the nodes disagree on --nnodes: node 1 runs with (\d), node 0 with (\d)"
    for n0, n1 in ((3, 2), (2, 3)):
        port = free_port()
        tag = uuid.uuid4().hex
        env = dict(os.environ, DPTP_ATTACK_TAG=tag)
        common = ["--master-addr=127.0.0.1", "--master-port=%d" % port, "--nproc-per-node=1",
                  "--rdzv-id=mm-%d" % port, "--no-python", "sleep", "5"]
        figure(case, attempts=1)
        t0 = time.monotonic()
        ps = [subprocess.Popen([ARGS.run, "--nnodes=%d" % n, "--node-rank=%d" % k] + common, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for k, n in ((0, n0), (1, n1))]
        errs, secs, left = reap_nodes(case, ps, tag, t0)
        figure(case, processes_left=len(left))
        lines1 = [ln for ln in errs[1].splitlines() if "error" in ln.lower()]
        m = re.search(want, lines1[0]) if len(lines1) == 1 else None
        rcs = [p.returncode for p in ps]
        if 0 in rcs or not m or (m.group(1), m.group(2)) != (str(n1), str(n0)) or left or secs > 30:
            fail(case, "--nnodes %d vs %d: exits %s in %.1f s, node 1 said %s, left %s" % (n0, n1, rcs, secs, lines1,
                                                                                          left))
        else:
            print("ok nnodes_mismatch (%d vs %d): exits %s in %.1f s: %s" % (n0, n1, rcs, secs, lines1[0].strip()),
                  flush=True)


CASES = {
    "ipc_flood": lambda: case_ipc("ipc_flood", "flood"),
    "ipc_inject": lambda: case_ipc("ipc_inject", "inject"),
    "faults_still": case_faults_still,
    "torchrun_env": case_torchrun_env,
    "output_paths": case_output_paths,
    "store_memory": case_store_memory,
    "store_keys": lambda: store_flood_case("store_keys", False),
    "store_outsider": lambda: store_flood_case("store_outsider", True),
    "waiter_bomb": case_waiter_bomb,
    "mpirun_colour": case_mpirun_colour,
    "stale_slot": case_stale_slot,
    "forged_static": case_forged_static,
    "forged_c10d": case_forged_c10d,
    "forged_node0": case_forged_node0,
    "nnodes_mismatch": case_nnodes_mismatch,
}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--run")
    ap.add_argument("--check")
    ap.add_argument("--only")
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--attacker")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--store-budget", default="64M", help="DPTP_STORE_MAX_BYTES for store_memory (in M)")
    ARGS = ap.parse_args()
    if ARGS.attacker == "store":
        print("attacker sent %d requests, %d connections closed" % store_flood(ARGS.port, ARGS.seconds), flush=True)
        return 0
    if ARGS.attacker:
        return attacker(ARGS.attacker, ARGS.seconds)
    ARGS.run = os.path.abspath(ARGS.run)
    ARGS.check = os.path.abspath(ARGS.check)
    names = ARGS.only.split(",") if ARGS.only else list(CASES)
    for n in names:
        CASES[n]()
    # the hardening rows of bench/results/hardening.md come from these lines
    print("\n".join("figures %s: %s" % (c, json.dumps(f, sort_keys=True)) for c, f in FIGURES.items()))
    if ARGS.json:
        with open(ARGS.json, "w") as out:
            json.dump({"figures": FIGURES, "failures": FAILURES}, out, indent=1)
    print("%d cases, %d failures%s" % (len(names), len(FAILURES),
                                       "".join("\nFAIL: " + f.splitlines()[0] for f in FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
