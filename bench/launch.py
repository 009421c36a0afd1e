#!/usr/bin/env python3
"""Launch latency: N workers of /bin/true, from start to exit, median of
repeated runs, for dptp-run, mpirun and a bare fork/exec of N processes.

usage: bench/launch.py [--build BUILD_DIR] [--repeat R] [--workers 4,16]
Every figure includes the same cost of starting the launcher from Python."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def median_ms(cmd, repeat, env):
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append((time.perf_counter() - t0) * 1e3)
        if p.returncode:
            sys.exit("%s failed with %d" % (" ".join(cmd), p.returncode))
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--workers", default="4,16")
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    tmp = tempfile.mkdtemp()
    fe = os.path.join(tmp, "forkexec")
    subprocess.run(["cc", "-O2", "-o", fe, os.path.join(HERE, "forkexec.c")], check=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    mpirun = shutil.which("mpirun")
    print("%-8s %-44s %12s %10s" % ("workers", "launcher", "median ms", "min ms"))
    for n in [int(x) for x in a.workers.split(",")]:
        rows = [
            ("fork/exec floor", [fe, str(n), "/bin/true"], env),
            ("dptp-run", [run, "--nproc-per-node=%d" % n, "--no-python", "/bin/true"], env),
            ("dptp-run (full hwloc topology)", [run, "--nproc-per-node=%d" % n, "--no-python", "/bin/true"],
             dict(env, DPTP_RUN_FULL_TOPOLOGY="1")),
        ]
        if mpirun:
            rows.append(("mpirun", [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), "/bin/true"], env))
        for name, cmd, e in rows:
            med, lo = median_ms(cmd, a.repeat, e)
            print("%-8d %-44s %12.2f %10.2f" % (n, name, med, lo), flush=True)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
