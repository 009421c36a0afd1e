#!/usr/bin/env python3
"""dptp-check on real engines: Slurm (srun --mpi=pmix, sbatch) on a private
single-host cluster (tests/engines/slurm.sh), and Open MPI's mpirun at 16
oversubscribed ranks. Every (replica, check) verdict is checked against
tests/e2e/matrix.py's mechanism-derived outcomes, and the report must name
the engine it ran under.

usage: engines.py MODE --check PATH [--probe PATH] [--layouts L,...] [--faults all|none|F,...]
modes:
  slurm-probe   srun a PMIx probe: every key lib/bootstrap/bootstrap_pmix.c reads is there
  slurm-srun    matrix under `srun --mpi=pmix -n N`
  slurm-sbatch  the same through `sbatch tests/engines/dptp-check.sbatch`
  mpirun        matrix under mpirun (16 ranks: dp8tp2, dp4tp4)
Exit 0 pass, 1 fail, 77 skip (no slurm / not root / the cluster cannot start).
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import matrix  # noqa: E402  (run, expected, verify, status, LAYOUTS, FAULTS, CHECKS)

SKIP = 77
USERS = "users.lock"  # shared-locked by every test using the cluster
TESTS_OWNER = "started-by-tests"  # present while a cluster started by a test is up
SLURM_SH = os.path.join(HERE, "slurm.sh")
SBATCH_SCRIPT = os.path.join(HERE, "dptp-check.sbatch")
matrix.LAYOUTS.setdefault("dp8tp2", (16, 8, 1, 2))
matrix.LAYOUTS.setdefault("dp4tp4", (16, 4, 1, 4))


class Slurm:
    """Use the private cluster for the duration of a test. Several test runs
    (other checkouts have their own cluster; the same checkout shares one) may
    overlap: each holds a shared lock on USERS while it runs, and the last one
    to leave stops the cluster, but only if a test started it (TESTS_OWNER);
    a cluster started by hand with `slurm.sh start` is reused and left alone."""

    def __init__(self):
        self.users = None

    def _lock(self, name, mode):
        f = open(os.path.join(self.dir, name), "a+")
        fcntl.flock(f, mode)
        return f

    def __enter__(self):
        if shutil.which("srun") is None or shutil.which("slurmctld") is None:
            print("SKIP: slurm is not installed (scripts/setup.sh installs slurmctld slurmd slurm-client munge)")
            sys.exit(SKIP)
        if os.geteuid() != 0:
            print("SKIP: the private slurm cluster needs root")
            sys.exit(SKIP)
        env_line = subprocess.run(["bash", SLURM_SH, "env"], capture_output=True, text=True).stdout
        os.environ["SLURM_CONF"] = env_line.strip().split("=", 1)[1]
        self.dir = os.path.dirname(os.environ["SLURM_CONF"])
        os.makedirs(self.dir, exist_ok=True)
        for k in [k for k in os.environ if k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF"]:
            del os.environ[k]  # an outer allocation must not leak into our jobs
        ctl = self._lock("ctl.lock", fcntl.LOCK_EX)
        try:
            if subprocess.run(["bash", SLURM_SH, "status"]).returncode == 0:
                print("slurm: reusing the running cluster (%s)" % self.dir)
            else:
                t0 = time.monotonic()
                p = subprocess.run(["bash", SLURM_SH, "start"], capture_output=True, text=True, timeout=120)
                if p.returncode != 0:
                    print(p.stderr)
                    print("SKIP: the slurm cluster did not start (slurm.sh start exit %d)" % p.returncode)
                    sys.exit(SKIP)
                open(os.path.join(self.dir, TESTS_OWNER), "w").write("%d\n" % os.getpid())
                print("slurm: started in %.2fs: %s" % (time.monotonic() - t0, p.stderr.strip()))
            self.users = self._lock(USERS, fcntl.LOCK_SH)
        finally:
            ctl.close()
        return self

    def __exit__(self, *exc):
        ctl = self._lock("ctl.lock", fcntl.LOCK_EX)
        try:
            self.users.close()
            try:
                last = self._lock(USERS, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print("slurm: other tests still use the cluster; leaving it up")
                return False
            last.close()
            if not os.path.exists(os.path.join(self.dir, TESTS_OWNER)):
                print("slurm: leaving the cluster up (not started by the tests)")
                return False
            t0 = time.monotonic()
            subprocess.run(["bash", SLURM_SH, "stop"], timeout=120)
            print("slurm: stopped in %.2fs" % (time.monotonic() - t0))
            if subprocess.run(["bash", SLURM_SH, "status"], capture_output=True).returncode == 0:
                print("FAIL: slurm.sh stop left the cluster running")
                sys.exit(1)
        finally:
            ctl.close()
        return False


def check_report(name, p_rc, rep, dp, pp, tp, fault, engine, failures):
    if rep is None:
        failures.append("%s: no report (exit %s)" % (name, p_rc))
        return
    matrix.verify(name, rep, matrix.expected(dp, pp, tp, fault), failures)
    anyfail = any(matrix.status(rep, d, c)[0] == "fail" for d in range(dp) for c in matrix.CHECKS)
    want_rc = 1 if anyfail else 0
    if p_rc != want_rc:
        failures.append("%s: exit %s, want %d" % (name, p_rc, want_rc))
    if rep.get("engine") != engine:
        failures.append("%s: report says engine %r, want %r" % (name, rep.get("engine"), engine))
    if rep["layout"] != {"world": dp * pp * tp, "dp": dp, "pp": pp, "tp": tp}:
        failures.append("%s: layout %r" % (name, rep["layout"]))
    if rep["inject"] != ([fault] if fault else []):
        failures.append("%s: inject %r" % (name, rep["inject"]))


def faults_of(spec):
    if spec == "all":
        return [None] + matrix.FAULTS
    if spec == "none":
        return [None]
    return [None if f == "none" else f for f in spec.split(",")]


def run_matrix(args, launcher, engine):
    margs = argparse.Namespace(check=args.check, launcher=launcher, run=None)
    failures, n = [], 0
    for lname in args.layouts.split(","):
        np_, dp, pp, tp = matrix.LAYOUTS[lname]
        for fault in faults_of(args.faults):
            name = "%s %s %s" % (launcher, lname, fault or "no-fault")
            before = len(failures)
            p, rep, dt = matrix.run(margs, np_, dp, tp, pp, fault)
            check_report(name, p.returncode, rep, dp, pp, tp, fault, engine, failures)
            if rep is None:
                failures[-1] += ": " + p.stderr[-600:]
            n += 1
            print("%-36s %s %.2fs" % (name, "ok" if len(failures) == before else "FAILED", dt), flush=True)
    return n, failures


def scontrol_job(jid):
    p = subprocess.run(["scontrol", "-o", "show", "job", str(jid)], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", p.stdout))


def run_sbatch(args):
    failures, n = [], 0
    for lname in args.layouts.split(","):
        np_, dp, pp, tp = matrix.LAYOUTS[lname]
        for fault in faults_of(args.faults):
            name = "sbatch %s %s" % (lname, fault or "no-fault")
            before = len(failures)
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "r.json")
                cmd = ["sbatch", "--parsable", "-n", str(np_), "-o", os.path.join(d, "job-%j.log"),
                       "--chdir", d, SBATCH_SCRIPT, os.path.abspath(args.check),
                       "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
                       "--format", "json", "--output", out] + matrix.SMALL
                if fault:
                    cmd += ["--inject", fault]
                t0 = time.monotonic()
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                if p.returncode != 0:
                    failures.append("%s: sbatch failed: %s" % (name, p.stderr.strip()))
                    continue
                jid = p.stdout.strip().split(";")[0]
                state, job = "", {}
                while time.monotonic() - t0 < args.job_timeout:
                    job = scontrol_job(jid)
                    state = job.get("JobState", "")
                    if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                        break
                    time.sleep(0.1)
                else:
                    subprocess.run(["scancel", jid])
                    failures.append("%s: job %s still %s after %ds; cancelled" % (name, jid, state, args.job_timeout))
                    continue
                dt = time.monotonic() - t0
                rc = int(job.get("ExitCode", "-1:0").split(":")[0])
                rep = None
                if os.path.exists(out):
                    with open(out) as f:
                        rep = json.load(f)
                if state not in ("COMPLETED", "FAILED"):
                    failures.append("%s: job %s ended %s" % (name, jid, state))
                check_report(name, rc, rep, dp, pp, tp, fault, "srun", failures)
                if len(failures) > before:
                    log = os.path.join(d, "job-%s.log" % jid)
                    if os.path.exists(log):
                        failures[-1] += "\n--- job log\n" + open(log).read()[-1500:]
            n += 1
            print("%-36s %s %.2fs (job %s %s)" % (name, "ok" if len(failures) == before else "FAILED",
                                                 dt, jid, state), flush=True)
    return n, failures


def run_probe(args):
    p = subprocess.run(["srun", "--mpi=pmix", "-n", "4", "--overcommit", args.probe],
                       capture_output=True, text=True, timeout=60)
    print(p.stdout, p.stderr, sep="")
    failures = []
    lines = sorted(l for l in p.stdout.splitlines() if l.startswith("rank "))
    if p.returncode != 0 or len(lines) != 4:
        failures.append("probe: exit %d, %d rank lines" % (p.returncode, len(lines)))
    for i, l in enumerate(lines):
        kv = dict(re.findall(r"(\w+)=(\S+)", l))
        want = {"JOB_SIZE": "4", "LOCAL_SIZE": "4", "LOCAL_RANK": str(i), "NODEID": "0",
                "NUM_NODES": "1", "exchange": "ok"}
        for k, v in want.items():
            if kv.get(k) != v:
                failures.append("probe rank %d: %s=%s, want %s" % (i, k, kv.get(k), v))
    # and dptp-check itself: engine, local ranks from PMIx (device-map checks them), no RANK in env
    margs = argparse.Namespace(check=args.check, launcher="srun", run=None)
    pr, rep, dt = matrix.run(margs, 4, 2, 2, 1, None)
    check_report("srun dp2tp2 engine", pr.returncode, rep, 2, 1, 2, None, "srun", failures)
    if rep is not None:
        print("dptp-check under srun: bootstrap %s, engine %s, %.2fs" % (rep.get("bootstrap"), rep.get("engine"), dt))
        if rep.get("bootstrap") != "pmix":
            failures.append("dptp-check under srun: bootstrap %r, want pmix" % rep.get("bootstrap"))
    return 1 + 1, failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["slurm-probe", "slurm-srun", "slurm-sbatch", "mpirun"])
    ap.add_argument("--check", required=True)
    ap.add_argument("--probe")
    ap.add_argument("--layouts", default="dp2tp2")
    ap.add_argument("--faults", default="all")
    ap.add_argument("--job-timeout", type=int, default=120)
    args = ap.parse_args()
    t0 = time.monotonic()
    if args.mode == "mpirun":
        if shutil.which("mpirun") is None:
            print("SKIP: mpirun not installed")
            return SKIP
        n, failures = run_matrix(args, "mpirun", "mpirun")
    else:
        with Slurm():
            if args.mode == "slurm-probe":
                n, failures = run_probe(args)
            elif args.mode == "slurm-srun":
                n, failures = run_matrix(args, "srun", "srun")
            else:
                n, failures = run_sbatch(args)
    for f in failures:
        print("FAIL:", f)
    print("%s: %d runs, %d problems, %.1fs" % (args.mode, n, len(failures), time.monotonic() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
