#!/usr/bin/env python3
"""Real PyTorch programs (gloo, CPU) under dptp-run, checked against the same
programs without it or under torch's own launcher.

usage: torch_e2e.py TORCH_PYTHON DPTP_RUN CASE [DPTP_CHECK]
TORCH_PYTHON is an interpreter that imports torch; '' skips (exit 77).
Cases: store, ddp, groups, check_torch_store (needs DPTP_CHECK)."""
import json
import os
import re
import subprocess
import sys
import time

from e2e_util import check, clean_env, fail, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
if len(sys.argv) < 4 or not sys.argv[1]:
    print("no python with torch: skipped")
    sys.exit(77)
PY, RUN, CASE = sys.argv[1:4]
CHECK = sys.argv[4] if len(sys.argv) > 4 else ""


def env(**extra):
    return clean_env(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", **extra)


def start(cmd, e):
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs, timeout=120):
    """Waits for every process; kills them all past the timeout."""
    res, t0 = [], time.monotonic()
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.communicate()
            fail("%s did not finish within %d s" % (p.args, timeout))
        res.append((p.returncode, out, err))
    return res


def launched(args_per_node, worker_args, e=None, timeout=120):
    """dptp-run nodes (one argument list each) running the worker; all output."""
    procs = [start([RUN] + a + ["--no-python", PY, WORKER] + worker_args, e or env()) for a in args_per_node]
    res = finish(procs, timeout)
    for k, (rc, out, err) in enumerate(res):
        check(rc == 0, "node %d rc %d\n%s\n%s" % (k, rc, out, err[-3000:]))
    return "".join(out for _, out, _ in res)


def by_rank(out, pattern):
    got = {}
    for line in out.splitlines():
        m = re.match(pattern, line)
        if m:
            got[int(m.group(1))] = line
    return got


def case_store():
    out = launched([["--nproc-per-node=2", "--master-port=%d" % free_port()]], ["store"])
    print(out)
    check(sorted(re.findall(r"rank (\d) store ok", out)) == ["0", "1"], out)
    check("DIFFERENT" not in out, out)


def case_ddp():
    # by hand: no launcher, rank 0 hosts the store (env://)
    port = free_port()
    procs = [start([PY, WORKER, "ddp"], env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=str(port))) for r in range(2)]
    res = finish(procs)
    for r, (rc, out, err) in enumerate(res):
        check(rc == 0, "by hand, rank %d rc %d: %s" % (r, rc, err[-3000:]))
    ref = by_rank("".join(o for _, o, _ in res), r"rank (\d) of 2 losses")
    check(sorted(ref) == [0, 1] and all("params_equal True" in v for v in ref.values()), ref)
    print("by hand:", *ref.values(), sep="\n  ")
    p1, p2 = free_port(), free_port()
    runs = {
        "one node": [["--nproc-per-node=2", "--master-port=%d" % free_port()]],
        "two static nodes": [["--nnodes=2", "--node-rank=%d" % k, "--nproc-per-node=1", "--master-addr=127.0.0.1",
                              "--master-port=%d" % p1] for k in range(2)],
        "two c10d nodes": [["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=127.0.0.1:%d" % p2, "--rdzv-id=ddp",
                            "--rdzv-conf=last_call_timeout=1"] for _ in range(2)],
    }
    for name, nodes in runs.items():
        t0 = time.monotonic()
        got = by_rank(launched(nodes, ["ddp"]), r"rank (\d) of 2 losses")
        print("%s (%.1f s):" % (name, time.monotonic() - t0), *got.values(), sep="\n  ")
        check(got == ref, "%s: per-rank losses differ from the run by hand:\n%s\n%s" % (name, got, ref))


def case_groups():
    out = launched([["--nproc-per-node=4", "--master-port=%d" % free_port()]], ["groups"])
    print(out)
    got = by_rank(out, r"rank (\d) groups ok")
    check(sorted(got) == [0, 1, 2, 3], out)
    check("half [0, 1] sum 1" in got[1] and "half [2, 3] sum 5" in got[2], out)


def case_check_torch_store():
    """dptp-check's torchrun bootstrap against a store torch hosts, as torch's
    own agent does (TORCHELASTIC_USE_AGENT_STORE=True): every rank a client
    of torch's TCPStore server, whatever its version speaks."""
    if not CHECK:
        print("no dptp-check built: skipped")
        sys.exit(77)
    host = ("import datetime, sys, torch, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)\n"
            "print(s.port, torch.__version__, flush=True)\n"
            "sys.stdin.read()\n")
    store = subprocess.Popen([PY, "-c", host], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, version = store.stdout.readline().split()
        out_json = os.path.join(os.environ.get("TMPDIR", "/tmp"), "torch_store_check_%d.json" % os.getpid())
        n = 4
        procs = [start([CHECK, "--dp", "2", "--tp", "2", "--format", "json", "--output", out_json, "--timeout", "60", "--tokens", "8", "--hidden", "64"],
                       env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                           GROUP_RANK="0", GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                           TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="torchstore",
                           TORCHELASTIC_RESTART_COUNT="0", NO_COLOR="1",
                           DPTP_GPU_SHARING="1"))  # 4 ranks, maybe on one GPU
                 for r in range(n)]
        res = finish(procs)
        for r, (rc, out, err) in enumerate(res):
            check(rc == 0, "rank %d rc %d: %s %s" % (r, rc, out[-2000:], err[-2000:]))
        with open(out_json) as f:
            rep = json.load(f)
        os.unlink(out_json)
        statuses = sorted({c["status"] for x in rep["replicas"] for c in x["checks"]})
        print("torch %s hosts the store: dptp-check bootstrap %s, world %d, statuses %s" % (
            version, rep["bootstrap"], rep["layout"]["world"], statuses))
        check(rep["bootstrap"] == "torchrun" and rep["layout"]["world"] == n and statuses == ["pass"], rep)
    finally:
        store.stdin.close()
        store.wait(timeout=30)


if __name__ == "__main__":
    {"store": case_store, "ddp": case_ddp, "groups": case_groups,
     "check_torch_store": case_check_torch_store}[CASE]()
    print("ok", CASE)
