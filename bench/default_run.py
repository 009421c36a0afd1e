#!/usr/bin/env python3
"""The default DP2TP2 run, launch included, against mpirun starting 4 x
/bin/true on the same machine, in the same benchmark run (issue 17's goal:
at most 1.5x). Each pair runs the two back to back (in alternating order);
the ratio is the median of the pairs' ratios. Also prints the medians, the
checks the default run ran and their seconds (slowest replica), and the CPU
time of the whole job.

usage: bench/default_run.py [--build DIR] [--pairs N] [--launcher dptp-run|mpirun] [--backend B]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd, env):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit("%s: exit %d" % (" ".join(cmd), p.returncode))
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--launcher", default="dptp-run", choices=["dptp-run", "mpirun"])
    ap.add_argument("--backend", choices=["auto", "host", "cuda"],
                    help="dptp-check's --backend (default: its own, auto; on a GPU box "
                         "4 ranks on one GPU need --backend host or DPTP_GPU_SHARING=1)")
    a = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("default_run.py: no mpirun here: it is the yardstick")
    check = os.path.join(a.build, "cli", "dptp-check")
    mpi = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4"]
    if a.launcher == "dptp-run":
        launch = [os.path.join(a.build, "launcher", "dptp-run"), "--nproc-per-node=4", "--no-python"]
    else:
        launch = mpi
    env = dict(os.environ, NO_COLOR="1", OMP_NUM_THREADS="1")
    run = launch + [check, "--dp", "2", "--tp", "2"] + (["--backend", a.backend] if a.backend else [])
    yard = mpi + ["/bin/true"]
    # one report, for which checks the default run runs and where the time goes
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        subprocess.run(run + ["--format", "json", "--output", out], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        with open(out) as f:
            rep = json.load(f)
    secs = {}
    for r in rep["replicas"]:
        for c in r["checks"]:
            secs[c["name"]] = max(secs.get(c["name"], 0), c["seconds"])
    timed(yard, env)  # warm both
    timed(run, env)
    ratios, walls, yards, cpus = [], [], [], []
    for i in range(a.pairs):
        if i % 2:
            w, cpu = timed(run, env)
            y, _ = timed(yard, env)
        else:
            y, _ = timed(yard, env)
            w, cpu = timed(run, env)
        ratios.append(w / y)
        walls.append(w)
        yards.append(y)
        cpus.append(cpu)
    print("default run: %s (backend %s, %s)" % (" ".join(run[len(launch):]), rep["backend"],
                                               ", ".join("%s %.3f s" % kv for kv in secs.items())))
    print("| what | median wall (s) | min | max |")
    print("|---|---|---|---|")
    print("| %s + dptp-check --dp 2 --tp 2 | %.3f | %.3f | %.3f |" % (a.launcher, statistics.median(walls),
                                                                   min(walls), max(walls)))
    print("| mpirun -np 4 /bin/true | %.3f | %.3f | %.3f |" % (statistics.median(yards), min(yards), max(yards)))
    print("CPU of the whole run (user + sys, all processes): median %.3f s" % statistics.median(cpus))
    print("ratio (median of %d paired runs): %.2f (goal: at most 1.5)" % (a.pairs, statistics.median(ratios)))


if __name__ == "__main__":
    main()
