#!/usr/bin/env python3
"""MPI_Barrier latency under dptp-run and under mpirun, in one run.

usage: bench/mpi_barrier.py [--build BUILD_DIR] [--ranks 4] [--iters 2000] [--repeat 5]
Each job runs bench/mpi_barrier.c (100 untimed barriers, then ITERS timed
ones); rank 0's mean microseconds per barrier, per job, are printed with
the median of REPEAT jobs per launcher and the ratio dptp-run / mpirun.
With more ranks than cores this measures whether Open MPI yields
(mpirun sets OMPI_MCA_mpi_oversubscribe=1 then; so does dptp-run)."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def one(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    line = [l for l in p.stdout.splitlines() if l.startswith("barrier_us ")]
    if p.returncode or not line:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return float(line[0].split()[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    if not shutil.which("mpicc") or not shutil.which("mpirun"):
        sys.exit("mpicc/mpirun not found (libopenmpi-dev, openmpi-bin)")
    tmp = tempfile.mkdtemp()
    try:
        exe = os.path.join(tmp, "mpi_barrier")
        subprocess.run(["mpicc", "-O2", "-o", exe, os.path.join(HERE, "mpi_barrier.c")], check=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none")
        cmds = {"dptp-run": [run, "--master-port=0", "--nproc-per-node=%d" % a.ranks, "--no-python", exe,
                             str(a.iters)],
                "mpirun": ["mpirun", "-np", str(a.ranks), "--oversubscribe", exe, str(a.iters)]}
        res = {k: [] for k in cmds}
        for _ in range(a.repeat):  # interleaved: both see the same machine load
            for k, c in cmds.items():
                res[k].append(one(c, env))
        print("%d ranks on %d CPUs, %d barriers per job" % (a.ranks, len(os.sched_getaffinity(0)), a.iters))
        print("| launcher | us per barrier, each job | median |")
        print("|---|---|---:|")
        for k, v in res.items():
            print("| %s | %s | %.1f |" % (k, " ".join("%.1f" % x for x in v), statistics.median(v)))
        print("ratio dptp-run / mpirun: %.2f" % (statistics.median(res["dptp-run"]) / statistics.median(res["mpirun"])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
