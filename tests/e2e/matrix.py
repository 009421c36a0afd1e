#!/usr/bin/env python3
"""End-to-end: dptp-check under a real launcher, every fault, replica by
replica, against outcomes derived from each bug's mechanism.

usage: matrix.py --check PATH --launcher mpirun|dptp-run|srun [--run PATH] [--only NAME]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

CHECKS = ["broadcast", "opid", "device-map", "fused-allreduce", "dispatch", "resources", "reduce-span",
          "lockstep"]
FAULTS = ["bcast-global-src", "opid-seeded", "device-tp-rank", "world-workspace", "dispatch-ep-group",
          "dp-rank-reset", "shm-name-no-group", "subgroup-reduce", "world-reduce", "root-by-local-rank",
          "idle-skip", "local-shape"]
# A seed of this run's own: under opid-seeded every TP group's opId comes
# from the seed, and two test jobs at once (the suites run in parallel)
# with the same seed would squat each other's socket names.
SMALL = ["--tokens", "8", "--hidden", "64", "--timeout", "20", "--seed", str(random.SystemRandom().randrange(2, 1 << 62))]


def launcher_parser():
    """The options every e2e script takes: --check, --launcher, --run."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    ap.add_argument("--launcher", default="mpirun")
    ap.add_argument("--run")
    return ap


def launch_cmd(args, np):
    if args.launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np)]
    if args.launcher == "dptp-run":
        # --standalone: a free port for the agent store, so jobs can overlap
        return [args.run, "--standalone", "--nproc-per-node=%d" % np, "--no-python"]
    if args.launcher == "env":
        return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "envlaunch.py"), str(np)]
    if args.launcher == "srun":
        return ["srun", "--mpi=pmix", "-n", str(np), "--overcommit"]
    raise SystemExit("unknown launcher " + args.launcher)


def run(args, np, dp, tp, pp=1, inject=None, extra=(), env=None):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = launch_cmd(args, np) + [args.check, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
                                      "--format", "json", "--output", out] + SMALL + list(extra)
        if inject:
            cmd += ["--inject", inject]
        e = dict(os.environ, NO_COLOR="1")
        if env:
            e.update(env)
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)
        dt = time.monotonic() - t0
        rep = None
        if os.path.exists(out):
            with open(out) as f:
                rep = json.load(f)
        return p, rep, dt


def status(rep, d, check):
    for r in rep["replicas"]:
        if r["dp"] == d:
            for c in r["checks"]:
                if c["name"] == check:
                    return c["status"], c["detail"]
    raise KeyError((d, check))


def expected(dp, pp, tp, fault, hosts=1, ranks_per_host=None):
    """Outcome per (replica, check): 'pass', 'fail', 'skip', or None (may fail);
    and ("failing", check) -> the exact number of failing replicas where only
    that is known (which ones depends on timing).
    Derived from the mechanisms in reference/BUGS.md and FAMILY.md, for one host."""
    world = dp * pp * tp
    exp = {}
    for d in range(dp):
        for c in CHECKS:
            exp[(d, c)] = "pass"
        if tp == 1 and pp == 1:
            exp[(d, "broadcast")] = "skip"
        if tp == 1:
            exp[(d, "opid")] = "skip"
        if tp == 1 and dp == 1:
            exp[(d, "lockstep")] = "skip"
    if fault == "subgroup-reduce":
        # the TP sum over a strict subgroup misses the other members: every
        # replica with tp >= 2 fails, whatever dp and pp
        for d in range(dp):
            exp[(d, "reduce-span")] = "fail" if tp > 1 else "pass"
        return exp
    if fault in ("idle-skip", "local-shape"):
        # mechanism P acts on the DP group only: with dp >= 2, the idle
        # replica skips (every DP peer then waits for it), or every
        # replica's own token count sizes the DP-wide collective (they all
        # differ): every replica fails; with dp = 1 nothing changes
        if dp > 1:
            for d in range(dp):
                exp[(d, "lockstep")] = "fail"
        return exp
    single_tp_group = dp == 1 and pp == 1
    if fault is None or single_tp_group:
        return exp

    def tp_groups_of(d):
        base = d * pp * tp
        return [list(range(base + s * tp, base + (s + 1) * tp)) for s in range(pp)]

    def pp_groups_of(d):
        base = d * pp * tp
        return [[base + s * tp + t for s in range(pp)] for t in range(tp)]

    if fault in ("bcast-global-src", "root-by-local-rank"):
        # bcast-global-src: a group fails when some local root index is not
        # one of its members; root-by-local-rank (the mirror image): when
        # some member's global rank differs from its group rank. For a group
        # of ascending ranks both mean "the group is not [0 .. n-1]".
        for d in range(dp):
            groups = (tp_groups_of(d) if tp > 1 else []) + (pp_groups_of(d) if pp > 1 else [])
            bad = any(any(i not in g for i in range(len(g))) for g in groups)
            tp_bad = tp > 1 and any(any(i not in g for i in range(len(g))) for g in tp_groups_of(d))
            if bad:
                exp[(d, "broadcast")] = "fail"
            if tp_bad:
                exp[(d, "opid")] = "fail"
                exp[(d, "fused-allreduce")] = "fail"
    elif fault == "opid-seeded":
        if tp > 1 and world // tp > 1:  # several TP groups share the host
            for d in range(dp):
                exp[(d, "opid")] = "fail"
                exp[(d, "fused-allreduce")] = None
    elif fault == "device-tp-rank":
        # device = tp_rank; right only where tp_rank == local_rank
        for d in range(dp):
            wrong = any((r % tp) != r for r in range(d * pp * tp, (d + 1) * pp * tp))
            if wrong:
                exp[(d, "device-map")] = "fail"
    elif fault == "world-workspace":
        if tp > 1:
            for d in range(dp):
                exp[(d, "fused-allreduce")] = None
            exp[(dp - 1, "fused-allreduce")] = "fail" if dp > 1 else None
            if pp > 1 and dp == 1:
                exp[(0, "fused-allreduce")] = None
    elif fault == "dispatch-ep-group":
        if tp > 1 and dp > 1:
            for d in range(1, dp):
                exp[(d, "dispatch")] = "fail"
            # replica 0's slice comes from EP rank 0 = its own first rank
    elif fault == "world-reduce":
        # the TP sum over WORLD holds the other TP groups' contributions
        for d in range(dp):
            exp[(d, "reduce-span")] = "fail"
    elif fault == "dp-rank-reset":
        # every replica derives DP rank 0: replica 0's port, name and payload
        # are its own; every other replica's port is taken, its payload is
        # replica 0's
        for d in range(1, dp):
            exp[(d, "resources")] = "fail"
    elif fault == "shm-name-no-group":
        # the dp*pp TP groups of the host all name their segment after group
        # rank 0: one creates it, every other group fails (EEXIST, and its
        # members find the winner's segment). With pp == 1 a replica holds
        # one group: exactly one replica passes; with pp > 1 every replica
        # holds a losing group.
        for d in range(dp):
            exp[(d, "resources")] = None
        exp[("failing", "resources")] = dp - 1 if pp == 1 else dp
    return exp


MECH = {"broadcast": "R", "opid": "I", "device-map": "D", "fused-allreduce": "G", "dispatch": "G",
        "resources": "C,I", "reduce-span": "G", "lockstep": "P"}


def verify(name, rep, exp, failures):
    for r in rep["replicas"]:
        for c in r["checks"]:
            want = MECH.get(c["name"]) if c["status"] == "fail" else None
            if c.get("mechanism") != want:
                failures.append("%s: dp%d/%s (%s) names mechanism %r, want %r" %
                                (name, r["dp"], c["name"], c["status"], c.get("mechanism"), want))
    for (d, c), want in sorted(exp.items(), key=str):
        if d == "failing":
            n = sum(1 for r in rep["replicas"] for k in r["checks"] if k["name"] == c and k["status"] == "fail")
            if n != want:
                failures.append("%s: %d replicas fail %s, want exactly %d" % (name, n, c, want))
            continue
        got, detail = status(rep, d, c)
        if want is None:
            if got not in ("pass", "fail"):
                failures.append("%s: dp%d/%s is %s (%s), want pass or fail" % (name, d, c, got, detail))
            continue
        if got != want:
            failures.append("%s: dp%d/%s is %s, want %s: %s" % (name, d, c, got, want, detail[:300]))


LAYOUTS = {
    "dp2tp2": (4, 2, 1, 2),
    "dp4tp2": (8, 4, 1, 2),
    "dp2tp4": (8, 2, 1, 4),
    "dp2pp2tp2": (8, 2, 2, 2),
    "dp1tp4": (4, 1, 1, 4),
    "dp4tp1": (4, 4, 1, 1),
    "dp1pp2tp2": (4, 1, 2, 2),
}


def finish(failures, n, what):
    for f in failures:
        print("FAIL:", f)
    print("%d %s, %d problems" % (n, what, len(failures)))
    return 1 if failures else 0


def visible_of(rows):
    """The "where visible" sentence from the matrix alone, derived here
    independently: rows = [(dp, pp, tp, [replica has a failing check])].
    A condition "X > 1" is named when every layout that shows a failure has
    it; "replica 0 always healthy" when replica 0 never fails."""
    shown = [(d, p, t) for (d, p, t, f) in rows if any(f)]
    if not shown:
        return "no check failed in any of the %d layouts" % len(rows)
    if len(shown) == len(rows):
        s = "visible in every layout (%d)" % len(rows)
    else:
        conds = [name for k, name in enumerate(("dp", "pp", "tp")) if all(l[k] > 1 for l in shown)]
        s = "visible %sin %d of %d layouts (%s)" % (
            "only with %s " % " and ".join(c + " > 1" for c in conds) if conds else "",
            len(shown), len(rows), ", ".join("%dx%dx%d" % l for l in shown))
    if not any(f[0] for (_, _, _, f) in rows):
        s += "; replica 0 always healthy"
    return s


def sweep(args):
    """--layouts all on world 4 and 8, each fault alone: every layout's report
    matches the derivation, the matrix matches the reports, and the
    sentence matches the matrix."""
    failures = []
    n = 0
    for world in (4, 8):
        for fault in [None] + FAULTS:
            name = "sweep world %d %s" % (world, fault or "no-fault")
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "r.json")
                cmd = launch_cmd(args, world) + [args.check, "--layouts", "all", "--format", "json",
                                                 "--output", out] + SMALL
                if fault:
                    cmd += ["--inject", fault]
                t0 = time.monotonic()
                p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"),
                                   timeout=300)
                dt = time.monotonic() - t0
                n += 1
                if not os.path.exists(out):
                    failures.append("%s: no report (rc %d): %s" % (name, p.returncode, p.stderr[-500:]))
                    continue
                with open(out) as f:
                    sw = json.load(f)
            before = len(failures)
            want_n = sum(1 for a in range(1, world + 1) for b in range(1, world + 1)
                         if world % a == 0 and (world // a) % b == 0)
            if len(sw["layouts"]) != want_n or len(sw["matrix"]) != want_n:
                failures.append("%s: %d layouts, want %d" % (name, len(sw["layouts"]), want_n))
            anyfail = False
            rows = []
            for rep, row in zip(sw["layouts"], sw["matrix"]):
                dp, pp, tp = rep["layout"]["dp"], rep["layout"]["pp"], rep["layout"]["tp"]
                lname = "%s layout %dx%dx%d" % (name, dp, pp, tp)
                if (row["dp"], row["pp"], row["tp"]) != (dp, pp, tp):
                    failures.append("%s: matrix row %r" % (lname, row))
                verify(lname, rep, expected(dp, pp, tp, fault), failures)
                fails = []
                for r, cell in zip(rep["replicas"], row["replicas"]):
                    bad = [c["name"] for c in r["checks"] if c["status"] in ("fail", "error", "timeout")]
                    anyfail |= any(c["status"] == "fail" for c in r["checks"])
                    fails.append(bool(bad))
                    if bad != cell["failing"]:
                        failures.append("%s: matrix dp%d lists %r, the report %r" % (lname, r["dp"], cell["failing"], bad))
                rows.append((dp, pp, tp, fails))
            if p.returncode != (1 if anyfail else 0):
                failures.append("%s: exit %d" % (name, p.returncode))
            if fault is None and sw["visible"] != "no check failed in any of the %d layouts" % want_n:
                failures.append("%s: visible says %r" % (name, sw["visible"]))
            if sw["visible"] != visible_of(rows):
                failures.append("%s: visible says %r, the matrix %r" % (name, sw["visible"], visible_of(rows)))
            print("%-40s %s %.2fs" % (name, "ok" if len(failures) == before else "FAILED", dt), flush=True)
    return finish(failures, n, "sweeps")


def main():
    ap = launcher_parser()
    ap.add_argument("--layouts", default="dp2tp2,dp4tp2,dp2tp4,dp2pp2tp2,dp1tp4,dp4tp1")
    ap.add_argument("--faults", help="comma-separated subset of the faults (default: all, and no fault)")
    ap.add_argument("--sweep", action="store_true", help="--layouts all on worlds 4 and 8 instead")
    args = ap.parse_args()
    if args.sweep:
        return sweep(args)
    failures = []
    n = 0
    for lname in args.layouts.split(","):
        np_, dp, pp, tp = LAYOUTS[lname]
        faults = [None] + FAULTS
        if args.faults:
            faults = [None if f == "none" else f for f in args.faults.split(",")]
        for fault in faults:
            name = "%s %s" % (lname, fault or "no-fault")
            p, rep, dt = run(args, np_, dp, tp, pp, fault)
            n += 1
            if rep is None:
                failures.append("%s: no report (rc %d): %s" % (name, p.returncode, p.stderr[-500:]))
                continue
            exp = expected(dp, pp, tp, fault)
            before = len(failures)
            verify(name, rep, exp, failures)
            anyfail = any(s == "fail" for s in [status(rep, d, c)[0] for d in range(dp) for c in CHECKS])
            want_rc = 1 if anyfail else 0
            if p.returncode != want_rc:
                failures.append("%s: exit %d, want %d" % (name, p.returncode, want_rc))
            if rep["inject"] != ([fault] if fault else []):
                failures.append("%s: inject %r" % (name, rep["inject"]))
            engine = {"mpirun": "mpirun", "dptp-run": "dptp-run", "srun": "srun"}.get(args.launcher)
            if engine and rep.get("engine") != engine:
                failures.append("%s: engine %r, want %r" % (name, rep.get("engine"), engine))
            print("%-28s %s %.2fs" % (name, "ok" if len(failures) == before else "FAILED", dt), flush=True)
    return finish(failures, n, "runs")


if __name__ == "__main__":
    sys.exit(main())
