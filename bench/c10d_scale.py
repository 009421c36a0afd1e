#!/usr/bin/env python3
"""c10d rendezvous at scale: N agents of one worker each (`/bin/true`), all on
this host (endpoint 127.0.0.1, the first agent hosts the store,
join_timeout=900), timed from the first agent's start to the last agent's
exit. Prints N -> seconds for dptp-run and, where torchrun is installed (or
--torchrun names one), torchrun, side by side.

usage: bench/c10d_scale.py [--build build] [--sizes 64,128,256]
                           [--torchrun PATH|none] [--timeout 300]
                           [--mixed 128] [--nproc 128] [--static 1024]
                           [--stats] [--join-times]
                           [--json FILE]

--mixed N: next to the all-dptp-run round of N, a round of N-1 dptp-run
  agents (the first hosts the store) and one torchrun agent, and one where
  a torchrun agent hosts the store for N-1 dptp-run agents;
  --mixed-torchrun-heavy adds one dptp-run host with N-1 torchrun agents,
  and the all-torchrun round it compares with.
--static N,M: static rounds of N nodes (`--node-rank k --master-addr
  127.0.0.1`, node 0's store), dptp-run and, at the sizes of
  --torchrun-sizes, torchrun.
--nproc N,M: one agent of N workers (`--nproc-per-node N --no-python
  /bin/true`, static, one node), dptp-run and torchrun.
--stats: DPTP_RDZV_STATS=1 / DPTP_STORE_STATS=1: every dptp-run agent's
  store traffic and compare-set conflicts, the store host's operations per
  kind, summed (see bench/results/c10d-scale.md).
--join-times: LOGLEVEL=INFO for every agent, and the time each agent's
  "attempts to join the next round" and "has joined round" lines (torch's
  INFO lines, dptp-run prints them too; torch 1.13 logs only its agent's
  "Rendezvous'ing worker group" and "Rendezvous complete for workers")
  reach its log, seen every 50 ms:
  rdzv_s = the last "has joined" - the last "attempts to join", the
  rendezvous without the agents' own start (a torchrun agent's interpreter
  and torch import); last_attempt_s = when the slowest agent got there.

Counts the agents' "heartbeat" warnings and failures; a size fails when any
agent exits non-zero or the round takes past --timeout.
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def agent_cmd(kind, exe, n, port, run_id, idx, static=False):
    # underscores: torchrun 1.13 knows no other spelling (2.x both)
    if static:
        # torchrun's static rendezvous: node idx of n through node 0's store
        args = ["--nnodes=%d" % n, "--node_rank=%d" % idx, "--nproc_per_node=1",
                "--master_addr=127.0.0.1", "--master_port=%d" % port,
                "--max_restarts=0", "--no_python", "/bin/true"]
    else:
        conf = "join_timeout=900,is_host=%d" % (1 if idx == 0 else 0)
        args = ["--nnodes=%d" % n, "--nproc_per_node=1", "--rdzv_backend=c10d",
                "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=" + run_id, "--rdzv_conf=" + conf,
                "--max_restarts=0", "--no_python", "/bin/true"]
    if kind == "torchrun":
        args.insert(0, "--monitor_interval=0.1")
    return [exe] + args


# torch's rendezvous lines, or its agent's (torch 1.13 logs only the latter)
JOIN_RE = (("attempt", ("attempts to join the next round", "Rendezvous'ing worker group")),
           ("joined", ("has joined round", "Rendezvous complete for workers")))


def scan_joins(paths, offs, seen, now):
    """Reads what each log got since the last call; stamps the first line of
    each JOIN_RE kind per agent with now."""
    for i, path in enumerate(paths):
        if all(i in seen[k] for k, _ in JOIN_RE):
            continue
        try:
            with open(path, "rb") as f:
                f.seek(offs[i])
                data = f.read()
        except OSError:
            continue
        cut = data.rfind(b"\n") + 1
        offs[i] += cut
        text = data[:cut].decode("utf-8", "replace")
        for k, pats in JOIN_RE:
            if i not in seen[k] and any(p in text for p in pats):
                seen[k][i] = now


def run_round(kinds, exes, timeout, stats, tmp, join_times=False, static=False):
    """kinds: one entry per agent ('dptp' or 'torchrun'); agent 0 hosts.
    static: --node-rank rounds through node 0's store instead of c10d."""
    n = len(kinds)
    port = free_port()
    run_id = "bench%d" % port
    env = dict(os.environ)
    env.pop("TORCHELASTIC_RUN_ID", None)
    env["OMP_NUM_THREADS"] = "1"
    if stats:
        env["DPTP_RDZV_STATS"] = "1"
        env["DPTP_STORE_STATS"] = "1"
    if join_times:
        env["LOGLEVEL"] = "INFO"
    procs = []
    logs = []
    paths = []
    t0 = time.monotonic()
    for i, k in enumerate(kinds):
        paths.append(os.path.join(tmp, "a%d.log" % i))
        log = open(paths[-1], "w+")
        logs.append(log)
        procs.append(subprocess.Popen(agent_cmd(k, exes[k], n, port, run_id, i, static), stdout=log,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True))
        if i == 0:
            time.sleep(0.2)  # the host binds the store first
    deadline = t0 + timeout
    rcs = [None] * n
    offs = [0] * n
    seen = {k: {} for k, _ in JOIN_RE}
    while time.monotonic() < deadline and any(r is None for r in rcs):
        for i, p in enumerate(procs):
            if rcs[i] is None:
                rcs[i] = p.poll()
        if join_times:
            scan_joins(paths, offs, seen, time.monotonic() - t0)
        time.sleep(0.05)
    if join_times:
        scan_joins(paths, offs, seen, time.monotonic() - t0)
    secs = time.monotonic() - t0
    timed_out = any(r is None for r in rcs)
    # past the timeout: SIGTERM (each agent removes its PMIx folders in
    # /dev/shm), SIGKILL after 10 s
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        left = [p for i, p in enumerate(procs) if rcs[i] is None and p.poll() is None]
        for p in left:
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass
        end = time.monotonic() + grace
        for p in left:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    text = ""
    for log in logs:
        log.seek(0)
        text += log.read()
        log.close()
    hb = len(re.findall(r"heartbeat", text, re.I))
    fails = sum(1 for r in rcs if r not in (0,))
    out = {"n": n, "seconds": round(secs, 2), "failed_agents": fails, "timed_out": timed_out,
           "heartbeat_lines": hb}
    if stats:
        out["stats"] = sum_stats(text)
        out["per_agent"] = per_agent(out["stats"], n)
    if join_times:
        if len(seen["attempt"]) == n and len(seen["joined"]) == n:
            la = max(seen["attempt"].values())
            out["last_attempt_s"] = round(la, 2)
            out["rdzv_s"] = round(max(seen["joined"].values()) - la, 2)
        # per launcher: when its last agent got to the rendezvous and when
        # its last agent had joined (which side a mixed round waited for)
        out["by_kind"] = {}
        for kind in sorted(set(kinds)):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            out["by_kind"][kind] = {k: round(max((v[i] for i in idx if i in v), default=-1), 2)
                                    for k, v in seen.items()}
        else:
            out["join_lines"] = {k: len(v) for k, v in seen.items()}
    if fails:
        first = [l for l in text.splitlines() if "rror" in l or "fail" in l][:3]
        out["first_errors"] = first
    return out


def sum_stats(text):
    agg = {}
    for m in re.finditer(r"^.*?(rdzv stats|store stats): (.*)$", text, re.M):
        pre = "agent" if m.group(1) == "rdzv stats" else "store"
        for kv in m.group(2).split():
            if "=" not in kv:
                continue
            k, v = kv.split("=", 1)
            try:
                v = float(v)
            except ValueError:
                continue
            key = pre + "." + k
            if k.startswith("max_") or k.startswith("peak"):
                agg[key] = max(agg.get(key, 0), v)
            else:
                agg[key] = agg.get(key, 0) + v
    return {k: (int(v) if v == int(v) else round(v, 3)) for k, v in sorted(agg.items())}


OPS = ("set", "compare_set", "get", "add", "check", "wait", "append", "multi_get", "multi_set", "cancel_wait",
       "ping", "delete_key", "getnumkeys", "queue_push", "queue_pop", "queue_len", "list_keys")


def per_agent(st, n):
    """The store's operations and bytes (requests in, replies out) per agent:
    flat in N where no agent's traffic grows with the node count."""
    ops = sum(st.get("store." + o, 0) for o in OPS)
    bin_ = sum(st.get("store.%s_in" % o, 0) for o in OPS)
    bout = sum(st.get("store.%s_out" % o, 0) for o in OPS)
    return {"ops": round(ops / n, 1), "bytes_in": int(bin_ / n), "bytes_out": int(bout / n),
            "state_gets": round(st.get("agent.get", 0) / n, 2), "state_bytes": int(st.get("agent.recv", 0) / n)}


def run_nproc(kind, exe, nproc, timeout):
    args = [exe, "--nproc_per_node=%d" % nproc, "--no_python", "/bin/true"]
    if kind == "torchrun":
        args.insert(1, "--monitor_interval=0.1")
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.monotonic()
    try:
        p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = None
    return {"nproc": nproc, "seconds": round(time.monotonic() - t0, 2), "rc": rc}


def joins(r):
    if "rdzv_s" in r:
        return " (rdzv %.2f, last in at %.2f)" % (r["rdzv_s"], r["last_attempt_s"])
    return " (join lines %s)" % r["join_lines"] if "join_lines" in r else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dptp-run", default=None, help="the dptp-run binary (default BUILD/launcher/dptp-run)")
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--torchrun", default=None, help="torchrun to compare with; 'none' to skip")
    ap.add_argument("--torchrun-sizes", default=None, help="sizes for torchrun (default: --sizes)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--mixed", type=int, default=0)
    ap.add_argument("--mixed-torchrun-heavy", action="store_true",
                    help="with --mixed: also 1 dptp-run (the host) and N-1 torchrun agents")
    ap.add_argument("--nproc", default="", help="sizes: one agent of N workers, dptp-run and torchrun")
    ap.add_argument("--static", default="",
                    help="sizes of static rounds (--node-rank k, node 0's store), dptp-run and torchrun")
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--join-times", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None, help="keep the agents' output in this folder")
    a = ap.parse_args()
    dptp = a.dptp_run or os.path.join(a.build, "launcher", "dptp-run")
    if not os.access(dptp, os.X_OK):
        sys.exit("c10d_scale.py: no dptp-run at %s (--build or --dptp-run)" % dptp)
    tr = None if a.torchrun == "none" else (a.torchrun or shutil.which("torchrun"))
    exes = {"dptp": dptp, "torchrun": tr}
    nofile = raise_nofile()
    sizes = [int(x) for x in a.sizes.split(",") if x]
    tsizes = [int(x) for x in (a.torchrun_sizes or a.sizes).split(",") if x]
    res = {"host_cores": os.cpu_count(), "nofile": nofile, "dptp_run": [], "torchrun": [], "mixed": [], "nproc": [],
           "static": []}
    tmp = a.logs or tempfile.mkdtemp(prefix="c10d_scale.")
    os.makedirs(tmp, exist_ok=True)
    try:
        print("%6s  %12s  %12s" % ("N", "dptp-run s", "torchrun s"), flush=True)
        for n in sorted(set(sizes) | (set(tsizes) if tr else set())):
            row = [str(n), "-", "-"]
            if n in sizes:
                r = run_round(["dptp"] * n, exes, a.timeout, a.stats, tmp, a.join_times)
                res["dptp_run"].append(r)
                row[1] = "%.2f%s" % (r["seconds"], " FAIL" if r["failed_agents"] or r["timed_out"] else "")
                if r["heartbeat_lines"]:
                    row[1] += " hb=%d" % r["heartbeat_lines"]
            if a.join_times and n in sizes:
                row[1] += joins(res["dptp_run"][-1])
            if tr and n in tsizes:
                r = run_round(["torchrun"] * n, exes, a.timeout, False, tmp, a.join_times)
                res["torchrun"].append(r)
                row[2] = "%.2f%s%s" % (r["seconds"], " FAIL" if r["failed_agents"] or r["timed_out"] else "", joins(r))
            print("%6s  %12s  %12s" % tuple(row), flush=True)
            if a.stats and n in sizes:
                print("        stats: " + json.dumps(res["dptp_run"][-1].get("stats", {})), flush=True)
                print("        per agent: " + json.dumps(res["dptp_run"][-1].get("per_agent", {})), flush=True)
        if a.mixed and tr:
            n = a.mixed
            rounds = [("all dptp-run", ["dptp"] * n),
                      ("dptp-run host + %d dptp-run + 1 torchrun" % (n - 2), ["dptp"] * (n - 1) + ["torchrun"]),
                      ("torchrun host + %d dptp-run" % (n - 1), ["torchrun"] + ["dptp"] * (n - 1))]
            if a.mixed_torchrun_heavy:
                rounds.append(("dptp-run host + %d torchrun" % (n - 1), ["dptp"] + ["torchrun"] * (n - 1)))
                rounds.append(("all torchrun", ["torchrun"] * n))
            for name, kinds in rounds:
                r = run_round(kinds, exes, a.timeout, a.stats, tmp, a.join_times)
                r["name"] = name
                res["mixed"].append(r)
                print("mixed %-32s %8.2f s%s%s" % (name, r["seconds"],
                                                    " FAIL" if r["failed_agents"] or r["timed_out"] else "",
                                                    joins(r)), flush=True)
                if a.join_times and "by_kind" in r:
                    print("      by launcher: " + json.dumps(r["by_kind"]), flush=True)
                if a.stats:
                    print("      stats: " + json.dumps(r.get("stats", {})), flush=True)
        for n in [int(x) for x in a.static.split(",") if x]:
            for k in ("dptp", "torchrun"):
                if not exes[k] or (k == "torchrun" and n not in tsizes):
                    continue
                r = run_round([k] * n, exes, a.timeout, a.stats and k == "dptp", tmp, a.join_times, static=True)
                r["launcher"] = k
                res["static"].append(r)
                print("static %5d nodes  %-8s %8.2f s%s%s" % (n, k, r["seconds"],
                                                         " FAIL" if r["failed_agents"] or r["timed_out"] else "",
                                                         " hb=%d" % r["heartbeat_lines"] if r["heartbeat_lines"] else ""),
                      flush=True)
                if a.stats and k == "dptp":
                    print("        per agent: " + json.dumps(r.get("per_agent", {})), flush=True)
        for npr in [int(x) for x in a.nproc.split(",") if x]:
            for k in ("dptp", "torchrun"):
                if not exes[k]:
                    continue
                r = run_nproc(k, exes[k], npr, a.timeout)
                r["launcher"] = k
                res["nproc"].append(r)
                print("--nproc-per-node %d /bin/true  %-8s %6.2f s rc=%s" % (npr, k, r["seconds"], r["rc"]), flush=True)
    finally:
        if not a.logs:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
