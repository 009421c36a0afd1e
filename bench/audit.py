#!/usr/bin/env python3
"""The cost of dptp-run --audit (issue 23's goal: at most 1.3x the wall time
without it) on a healthy 4-rank gloo program (bench/audit_prog.py, real
torch). Each pair runs the job without and with --audit back to back, in
alternating order; the ratio is the median of the pairs' ratios. Also
prints the medians, the job's CPU time and the records written.

usage: bench/audit.py [--build DIR] [--pairs N] [--steps N] [--python P]
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, env):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--python", default=shutil.which("python3"),
                    help="the interpreter with torch (default: python3 on PATH)")
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    tmp = tempfile.mkdtemp(prefix="dptp_bench_audit_")
    env = dict(os.environ, PYTHON_EXEC=a.python)
    base = [run, "--standalone", "--nproc-per-node", "4", "--log-dir", tmp]
    prog = [os.path.join(HERE, "audit_prog.py"), str(a.steps)]
    walls = {False: [], True: []}
    cpus = {False: [], True: []}
    ratios = []
    try:
        for i in range(a.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {}
            for audit in order:
                w, c = timed(base + (["--audit"] if audit else []) + prog, env)
                got[audit] = w
                walls[audit].append(w)
                cpus[audit].append(c)
            ratios.append(got[True] / got[False])
        nrec = 0
        for root, _, files in os.walk(tmp):
            for f in files:
                if f.endswith(".jsonl"):
                    nrec += sum(1 for _ in open(os.path.join(root, f)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print("audit cost, 4 ranks gloo, %d steps, %d pairs: ratio %.3f (min %.3f, max %.3f)" %
          (a.steps, a.pairs, med(ratios), min(ratios), max(ratios)))
    print("  without --audit: wall %.2f s median, CPU %.2f s" % (med(walls[False]), med(cpus[False])))
    print("  with --audit:    wall %.2f s median, CPU %.2f s, %d records a job" %
          (med(walls[True]), med(cpus[True]), nrec // a.pairs))


if __name__ == "__main__":
    main()
