#!/usr/bin/env python3
"""The cost of dptp-run --audit (issue 23's goal: at most 1.3x the wall time
without it) on a healthy 4-rank gloo program (bench/audit_prog.py, real
torch), or with --loop N on 2 ranks calling all_reduce N times
(bench/audit_loop.py; issue 30: 200000). Each pair runs the job without and
with --audit back to back, in alternating order; the ratio is the median of
the pairs' ratios. Also prints the medians, the job's CPU time, the records
written and the launcher's peak RSS with --audit (the records' folder is
kept with --log-dir to count them).

usage: bench/audit.py [--build DIR] [--pairs N] [--steps N | --loop N] [--python P]
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


def hwm_kib(pid):
    try:
        for l in open("/proc/%d/status" % pid):
            if l.startswith("VmHWM:"):
                return int(l.split()[1])
    except OSError:
        pass
    return 0


def timed(cmd, env):
    """wall s, CPU s of the job, the launcher's own peak RSS in KiB (its
    VmHWM, polled every 20 ms until it exits: the workers are not in it)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    err = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    peak = 0
    while p.poll() is None:
        peak = max(peak, hwm_kib(p.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode and not (p.returncode == 5 and "--audit" in cmd):  # 5: the audit incomplete (a record cap)
        err.seek(0)
        sys.exit("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, err.read()[-2000:]))
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--loop", type=int, default=0, help="2 ranks, this many all_reduce calls")
    ap.add_argument("--python", default=shutil.which("python3"),
                    help="the interpreter with torch (default: python3 on PATH)")
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    tmp = tempfile.mkdtemp(prefix="dptp_bench_audit_")
    env = dict(os.environ, PYTHON_EXEC=a.python)
    nproc = 2 if a.loop else 4
    base = [run, "--standalone", "--nproc-per-node", str(nproc), "--log-dir", tmp]
    prog = ([os.path.join(HERE, "audit_loop.py"), str(a.loop)] if a.loop else
            [os.path.join(HERE, "audit_prog.py"), str(a.steps)])
    walls = {False: [], True: []}
    cpus = {False: [], True: []}
    rss = {False: [], True: []}
    ratios = []
    try:
        for i in range(a.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {}
            for audit in order:
                w, c, m = timed(base + (["--audit"] if audit else []) + prog, env)
                got[audit] = w
                rss[audit].append(m)
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
    what = "2 ranks gloo, %d all_reduce calls" % a.loop if a.loop else "4 ranks gloo, %d steps" % a.steps
    print("audit cost, %s, %d pairs: ratio %.3f (min %.3f, max %.3f)" %
          (what, a.pairs, med(ratios), min(ratios), max(ratios)))
    print("  without --audit: wall %.2f s median, CPU %.2f s, launcher peak RSS %d KiB" %
          (med(walls[False]), med(cpus[False]), max(rss[False])))
    print("  with --audit:    wall %.2f s median, CPU %.2f s, launcher peak RSS %d KiB, %d records a job" %
          (med(walls[True]), med(cpus[True]), max(rss[True]), nrec // a.pairs))


if __name__ == "__main__":
    main()
