#!/usr/bin/env python3
"""The worker guard race (issue 24 item 3), at random: dptp-run SIGKILLed a
random time after its start while its worker's subshell runs a fork loop;
counts the trials after which any process of the worker's group is alive.

usage: bench/guard_race.py [--build BUILD_DIR] [--trials 200] [--from-ms 3] [--to-ms 30]
                           [--nproc 2] [--seed S]

Where the kill lands depends on how fast dptp-run reaches its workers on
this machine (DPTP_RUN_TIMING=1 shows it): pick a window that covers
"workers started". tests/hardening/leftovers.py (guard_race) holds the
window open with ptrace instead, for a test that cannot pass by luck."""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "hardening"))
from leftovers import job_env, kill_all, tagged  # noqa: E402

# the worker's subshell forks up to 400 sleeps: it outlives the worker when
# only the worker itself is killed (PR_SET_PDEATHSIG)
LOOP = ": > \"$D/started.$LOCAL_RANK\"; (i=0; while [ $i -lt 400 ]; do sleep 60 & i=$((i+1)); done; wait) & wait"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--from-ms", type=float, default=3)
    ap.add_argument("--to-ms", type=float, default=30)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    run = os.path.join(a.build, "launcher", "dptp-run")
    rng = random.Random(a.seed)
    bad, most, started = 0, 0, 0
    t_begin = time.monotonic()
    for t in range(a.trials):
        tag = uuid.uuid4().hex
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(job_env(tag, tmp), D=tmp)
            p = subprocess.Popen([run, "--nproc-per-node=%d" % a.nproc, "--no-python", "sh", "-c", LOOP], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(a.from_ms, a.to_ms) / 1e3)
            p.kill()
            p.wait()
            # the guard needs a moment; a survivor keeps forking meanwhile
            end = time.monotonic() + 2
            left = tagged(tag)
            while left and time.monotonic() < end:
                time.sleep(0.01)
                left = tagged(tag)
            if any(n.startswith("started.") for n in os.listdir(tmp)):
                started += 1
            if left:
                bad += 1
                most = max(most, len(left))
                time.sleep(0.2)  # as many as the loop makes, then all go
                for _ in range(3):
                    kill_all(tagged(tag))
                    time.sleep(0.05)
    print("%s: %d trials, SIGKILL %.0f-%.0f ms after start, %d workers each: %d with survivors (at most %d "
          "processes), %d with a worker started, %.0f s" % (run, a.trials, a.from_ms, a.to_ms, a.nproc, bad, most,
                                                           started, time.monotonic() - t_begin))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
