#!/usr/bin/env python3
"""Wall time of whole dptp-check runs on the host backend, launch included:
DP2TP2 on 4 ranks and DP8TP2 on 16 oversubscribed ranks, under dptp-run and
mpirun. Median of repeated runs; prints a markdown table.

usage: bench/check.py [--repeat N] [--build DIR]
"""
import argparse
import os
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--repeat", type=int, default=10)
ap.add_argument("--build", default="build")
args = ap.parse_args()
check = os.path.join(args.build, "cli", "dptp-check")
run = os.path.join(args.build, "launcher", "dptp-run")
env = dict(os.environ, NO_COLOR="1", OMP_NUM_THREADS="1")

cases = [
    ("DP2TP2, 4 ranks, defaults (128 x 4096 bf16)", 4, ["--dp", "2", "--tp", "2"]),
    ("DP2TP2, 4 ranks, 16 x 256", 4, ["--dp", "2", "--tp", "2", "--tokens", "16", "--hidden", "256"]),
    ("DP8TP2, 16 ranks, 16 x 256", 16, ["--dp", "8", "--tp", "2", "--tokens", "16", "--hidden", "256"]),
]
launchers = [
    ("dptp-run", lambda n: [run, "--nproc-per-node=%d" % n, "--no-python"]),
    ("mpirun", lambda n: ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n)]),
]
print("| case | launcher | median wall (s) | min | max |")
print("|---|---|---|---|---|")
for name, n, a in cases:
    for lname, cmd in launchers:
        ts = []
        for _ in range(args.repeat):
            t0 = time.monotonic()
            p = subprocess.run(cmd(n) + [check] + a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            ts.append(time.monotonic() - t0)
            if p.returncode != 0:
                ts = None
                break
        if ts is None:
            print("| %s | %s | failed (exit %d) | | |" % (name, lname, p.returncode))
        else:
            print("| %s | %s | %.3f | %.3f | %.3f |" % (name, lname, statistics.median(ts), min(ts), max(ts)))
