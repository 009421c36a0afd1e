#!/usr/bin/env python3
"""Wall time of whole dptp-check runs under dptp-run on the host backend,
launch included, median of repeated runs: DP2TP2 with the five original
checks, DP2TP2 with every check (the default), and the world-4 layout
sweep (--layouts all: 6 layouts, every check). Prints a markdown table.

usage: bench/sweep.py [--repeat N] [--build DIR] [--backend B]
"""
import argparse
import os
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--repeat", type=int, default=10)
ap.add_argument("--build", default="build")
ap.add_argument("--backend", choices=["auto", "host", "cuda"],
                help="dptp-check's --backend (default: its own, auto)")
args = ap.parse_args()
check = os.path.join(args.build, "cli", "dptp-check")
run = os.path.join(args.build, "launcher", "dptp-run")
env = dict(os.environ, NO_COLOR="1", OMP_NUM_THREADS="1")
five = "broadcast,opid,device-map,fused-allreduce,dispatch"
cases = [
    ("DP2TP2, five checks", ["--dp", "2", "--tp", "2", "--checks", five]),
    ("DP2TP2, every check (default)", ["--dp", "2", "--tp", "2"]),
    ("world 4, --layouts all (6 layouts)", ["--layouts", "all"]),
]
print("| case | median wall (s) | min | max |")
print("|---|---|---|---|")
for name, a in cases:
    ts = []
    for _ in range(args.repeat):
        t0 = time.monotonic()
        p = subprocess.run([run, "--standalone", "--nproc-per-node=4", "--no-python", check] + a +
                           (["--backend", args.backend] if args.backend else []),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        ts.append(time.monotonic() - t0)
        if p.returncode != 0:
            print("| %s | failed (exit %d) | | |" % (name, p.returncode))
            ts = None
            break
    if ts:
        print("| %s | %.3f | %.3f | %.3f |" % (name, statistics.median(ts), min(ts), max(ts)), flush=True)
