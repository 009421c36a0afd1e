#!/usr/bin/env python3
"""PMIx put/fence/get-all under dptp-run and under mpirun, in one run.

usage: bench/pmix.py [--build BUILD_DIR] [--ranks 4,16,32] [--rounds 20] [--repeat 3]
Each job runs bench/pmix_pfg.c: ROUNDS rounds of Put (one 64-byte key),
Commit, a collecting Fence, then a Get of every rank's key; rank 0's phase
totals (seconds) are kept, and the median over REPEAT jobs is printed per
launcher with the ratio dptp-run / mpirun (below 1: dptp-run faster), and
dptp-run with the datastore its default does not pick for that size
(ds21,hash below 16 local ranks, hash alone from 16) for comparison."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("put", "fence", "get", "total")


def one(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    line = [l for l in p.stdout.splitlines() if l.startswith("pfg ")]
    if p.returncode or not line:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    f = line[0].split()
    return {k: float(f[f.index(k) + 1]) for k in PHASES}


def median(cmd, env, repeat):
    runs = [one(cmd, env) for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) for k in PHASES}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", default="4,16,32")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
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
        print("| ranks | launcher | put | fence | get-all | round total |")
        print("|---:|---|---:|---:|---:|---:|")
        for n in [int(x) for x in a.ranks.split(",")]:
            d = median([run, "--master-port=0", "--nproc-per-node=%d" % n, "--no-python", exe, str(a.rounds)], env,
                       a.repeat)
            other = "hash" if n >= 16 else "ds21,hash"  # the store the default does not pick
            h = median([run, "--master-port=0", "--nproc-per-node=%d" % n, "--no-python", exe, str(a.rounds)],
                       dict(env, PMIX_MCA_gds=other), a.repeat)
            m = median(["mpirun", "--oversubscribe", "-np", str(n), exe, str(a.rounds)], env, a.repeat)
            for name, r in (("dptp-run", d), ("dptp-run, PMIX_MCA_gds=" + other, h), ("mpirun", m)):
                print("| %d | %s | %s |" % (n, name, " | ".join("%.3f s" % r[k] for k in PHASES)))
            print("| %d | ratio | %s |" % (n, " | ".join("%.2f" % (d[k] / m[k]) if m[k] else "-" for k in PHASES)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
