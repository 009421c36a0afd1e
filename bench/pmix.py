#!/usr/bin/env python3
"""PMIx put/fence/get-all under dptp-run and under mpirun, in one run.

usage: bench/pmix.py [--build BUILD_DIR] [--ranks 4,8,16] [--rounds 20] [--repeat 11]
Each job runs bench/pmix_pfg.c: ROUNDS rounds of Put (one 64-byte key),
Commit, a collecting Fence, then a Get of every rank's key; rank 0's phase
totals (seconds) are kept. The phases start after a first fence, so they
leave out start-up; the last column, the job's wall time (the launcher
started to its exit, seen from here), has it. Per rank count the jobs run
interleaved (dptp-run, dptp-run with PMIX_MCA_gds=hash, mpirun, again),
REPEAT of each; printed: the median, in brackets the lowest and highest,
and the ratio of the medians dptp-run / mpirun (below 1: dptp-run faster)."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("put", "fence", "get", "total")
COLS = PHASES + ("wall",)


def one(cmd, env):
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    wall = time.monotonic() - t
    line = [l for l in p.stdout.splitlines() if l.startswith("pfg ")]
    if p.returncode or not line:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    f = line[0].split()
    return dict({k: float(f[f.index(k) + 1]) for k in PHASES}, wall=wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", default="4,8,16")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=11)
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    if not shutil.which("mpirun"):
        sys.exit("mpirun not found (openmpi-bin)")
    tmp = tempfile.mkdtemp()
    try:
        exe = os.path.join(tmp, "pmix_pfg")
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], stdout=subprocess.PIPE, text=True,
                               check=True).stdout.split()
        subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "pmix_pfg.c")] + flags, check=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        print("| ranks | launcher | put | fence | get-all | round total | job wall |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for n in [int(x) for x in a.ranks.split(",")]:
            dptp = [run, "--master-port=0", "--nproc-per-node=%d" % n, "--no-python", exe, str(a.rounds)]
            jobs = (("dptp-run", dptp, env), ("dptp-run, PMIX_MCA_gds=hash", dptp, dict(env, PMIX_MCA_gds="hash")),
                    ("mpirun", ["mpirun", "--oversubscribe", "-np", str(n), exe, str(a.rounds)], env))
            runs = {name: [] for name, _, _ in jobs}
            for _ in range(a.repeat):
                for name, cmd, e in jobs:
                    runs[name].append(one(cmd, e))
            med = {name: {k: statistics.median(r[k] for r in rs) for k in COLS} for name, rs in runs.items()}
            for name, rs in runs.items():
                print("| %d | %s | %s |" % (n, name, " | ".join(
                    "%.3f s (%.3f-%.3f)" % (med[name][k], min(r[k] for r in rs), max(r[k] for r in rs)) for k in COLS)))
            d, m = med["dptp-run"], med["mpirun"]
            print("| %d | ratio | %s |" % (n, " | ".join("%.2f" % (d[k] / m[k]) if m[k] else "-" for k in COLS)))
            sys.stdout.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
