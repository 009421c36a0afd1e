#!/usr/bin/env python3
"""Scaling of dptp-check's checks with world size (host backend, one host,
oversubscribed): per check wall time (the JSON's `seconds`, worst replica),
total wall time of the launch, and the bootstrap traffic (PMIx fences, puts
and bytes), for world 4, 8, 16, 32 at DP = world / TP.

usage: bench/scaling.py [--build build] [--worlds 4,8,16,32] [--tp 2]
                        [--repeat 3] [--repeat-default 1] [--launcher auto|dptp-run|mpirun]
                        [--out-dir build/bench] [--no-counts] [--no-plot] [--from-json FILE]

Two input sizes: "small" (--tokens 16 --hidden 256) and dptp-check's
defaults. Times are medians over --repeat runs. The launcher is dptp-run
(`dptp-run --nproc-per-node=N --no-python dptp-check ...`); where a dptp-run
launch fails, that world falls back to mpirun and the table says so.

Bootstrap traffic: dptp-check does not report lib/bootstrap's `nfences` and
`put_bytes` yet, so this script measures them from outside: it builds a small
LD_PRELOAD library that counts PMIx_Fence[_nb], PMIx_Put (bytes of the byte
objects put) and PMIx_Get (bytes of the byte objects got) in every
dptp-check process. Per check, from runs of one check each (--checks NAME):
the fixed part (bootstrap start, layout, report gathering) is
(sum of single-check runs - all-checks run) / (checks - 1), and a check's own
traffic is its single run minus that. Counts are deterministic; they come
from the small input.

Writes OUT/scaling.md (markdown tables), OUT/scaling.json, OUT/scaling.png
(gnuplot, installed with apt-get when missing and running as root).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECKS = ["broadcast", "opid", "device-map", "fused-allreduce", "dispatch"]
SIZES = {"small": ["--tokens", "16", "--hidden", "256"], "default": []}

COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned long nfence, nput, put_bytes, nget, get_bytes;
static int written;
static __thread int in_fence;

static int counting(void)
{
	return strcmp(program_invocation_short_name, "dptp-check") == 0;
}

static void dump(void)
{
	const char *dir = getenv("DPTP_BENCH_COUNTS");
	if (written || !dir || !counting())
		return;
	written = 1;
	char path[4096];
	snprintf(path, sizeof path, "%s/%d.txt", dir, (int)getpid());
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "%lu %lu %lu %lu %lu\n", nfence, nput, put_bytes, nget, get_bytes);
	fclose(f);
}

__attribute__((destructor)) static void at_exit(void) { dump(); }

#define REAL(name) static __typeof__(name) *real; if (!real) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

pmix_status_t PMIx_Put(pmix_scope_t scope, const pmix_key_t key, pmix_value_t *val)
{
	REAL(PMIx_Put);
	nput++;
	if (val && val->type == PMIX_BYTE_OBJECT)
		put_bytes += val->data.bo.size;
	return real(scope, key, val);
}

pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo)
{
	REAL(PMIx_Fence);
	nfence++;
	in_fence = 1;
	pmix_status_t rc = real(procs, nprocs, info, ninfo);
	in_fence = 0;
	return rc;
}

pmix_status_t PMIx_Fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
			    pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	REAL(PMIx_Fence_nb);
	if (!in_fence)
		nfence++;
	return real(procs, nprocs, info, ninfo, cbfunc, cbdata);
}

pmix_status_t PMIx_Get(const pmix_proc_t *proc, const pmix_key_t key, const pmix_info_t info[], size_t ninfo,
		       pmix_value_t **val)
{
	REAL(PMIx_Get);
	pmix_status_t rc = real(proc, key, info, ninfo, val);
	nget++;
	if (rc == PMIX_SUCCESS && val && *val && (*val)->type == PMIX_BYTE_OBJECT)
		get_bytes += (*val)->data.bo.size;
	return rc;
}

pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo)
{
	REAL(PMIx_Finalize);
	dump();
	return real(info, ninfo);
}
"""


def build_counter(tmp):
    src = os.path.join(tmp, "pmixcount.c")
    so = os.path.join(tmp, "pmixcount.so")
    with open(src, "w") as f:
        f.write(COUNTER_C)
    cflags = subprocess.run(["pkg-config", "--cflags", "pmix"], capture_output=True, text=True).stdout.split()
    p = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, src] + cflags + ["-ldl"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("bench: cannot build the PMIx counter (%s); no fence/byte counts" % p.stderr.strip()[:300],
              file=sys.stderr)
        return None
    return so


def launch_cmd(launcher, build, world):
    check = os.path.join(build, "cli", "dptp-check")
    if launcher == "dptp-run":
        return [os.path.join(build, "launcher", "dptp-run"), "--nproc-per-node=%d" % world, "--no-python", check]
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(world), check]


def run_once(launcher, args, world, extra, counter=None, timeout=600):
    """One launch. Returns (report or None, wall seconds, counts or None, stderr tail)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cdir = os.path.join(d, "counts")
        os.mkdir(cdir)
        cmd = launch_cmd(launcher, args.build, world) + [
            "--tp", str(args.tp), "--dp", str(world // args.tp), "--backend", "host",
            "--format", "json", "--output", out, "--timeout", "120"] + extra
        env = dict(os.environ, NO_COLOR="1")
        if counter:
            env["LD_PRELOAD"] = counter + ((" " + env["LD_PRELOAD"]) if env.get("LD_PRELOAD") else "")
            env["DPTP_BENCH_COUNTS"] = cdir
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            err, rc = p.stderr, p.returncode
        except subprocess.TimeoutExpired:
            err, rc = "timed out after %ds" % timeout, -1
        wall = time.monotonic() - t0
        rep = None
        if rc == 0 and os.path.exists(out):
            with open(out) as f:
                rep = json.load(f)
        counts = None
        if counter:
            rows = []
            for name in os.listdir(cdir):
                with open(os.path.join(cdir, name)) as f:
                    rows.append([int(x) for x in f.read().split()])
            if len(rows) == world:
                counts = {k: sum(r[i] for r in rows) for i, k in
                          enumerate(["fences", "puts", "put_bytes", "gets", "get_bytes"])}
        return rep, wall, counts, err[-6000:]


def check_seconds(rep):
    """Per check: the worst replica's seconds (the job waits for all of them)."""
    out = {}
    for r in rep["replicas"]:
        for c in r["checks"]:
            out[c["name"]] = max(out.get(c["name"], 0.0), float(c["seconds"]))
    return out


def pick_launcher(args, world):
    if args.launcher != "auto":
        return args.launcher
    rep, _, _, err = run_once("dptp-run", args, world, SIZES["small"])
    if rep is not None:
        return "dptp-run"
    print("bench: dptp-run failed at world %d, falling back to mpirun: %s" %
          (world, " / ".join(l for l in err.splitlines() if "dptp-check:" in l)[:300]), file=sys.stderr)
    if shutil.which("mpirun") is None:
        raise SystemExit("bench: no mpirun to fall back to")
    return "mpirun"


def measure(args, counter):
    res = {"worlds": [], "tp": args.tp, "host": os.uname().nodename, "cpus": os.cpu_count()}
    for world in args.worlds:
        launcher = pick_launcher(args, world)
        w = {"world": world, "dp": world // args.tp, "tp": args.tp, "launcher": launcher, "sizes": {}}
        for size, extra in SIZES.items():
            reps = args.repeat if size == "small" else args.repeat_default
            if reps <= 0:
                continue
            secs, walls = {c: [] for c in CHECKS}, []
            for _ in range(reps):
                rep, wall, _, err = run_once(launcher, args, world, extra)
                if rep is None:
                    raise SystemExit("bench: world %d (%s, %s) failed: %s" % (world, launcher, size, err))
                if rep["summary"]["fail"] or rep["summary"]["error"] or rep["summary"]["timeout"]:
                    raise SystemExit("bench: world %d: checks did not pass: %r" % (world, rep["summary"]))
                for c, s in check_seconds(rep).items():
                    secs[c].append(s)
                walls.append(wall)
            w["sizes"][size] = {"check_seconds": {c: statistics.median(v) for c, v in secs.items() if v},
                                "wall": statistics.median(walls), "runs": reps}
            print("bench: world %2d %-8s %-8s wall %.2fs  %s" % (
                world, launcher, size, w["sizes"][size]["wall"],
                " ".join("%s=%.3f" % (c, s) for c, s in w["sizes"][size]["check_seconds"].items())),
                file=sys.stderr, flush=True)
        if counter:
            _, _, allc, err = run_once(launcher, args, world, SIZES["small"], counter)
            single = {}
            for c in CHECKS:
                _, _, single[c], err = run_once(launcher, args, world, SIZES["small"] + ["--checks", c], counter)
            if allc and all(single.values()):
                keys = list(allc)
                fixed = {k: (sum(single[c][k] for c in CHECKS) - allc[k]) / (len(CHECKS) - 1) for k in keys}
                w["counts"] = {"all": allc, "fixed": fixed,
                               "per_check": {c: {k: single[c][k] - fixed[k] for k in keys} for c in CHECKS}}
            else:
                print("bench: world %d: no counts (%s)" % (world, err[-300:]), file=sys.stderr)
        res["worlds"].append(w)
    return res


def fmt_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024


def markdown(res):
    L = []
    W = res["worlds"]
    L.append("Host backend, one host with %d CPUs (oversubscribed), DP = world / TP, TP = %d. "
             "Seconds per check: the worst replica's `seconds` in the JSON report, median of the runs; "
             "wall: the whole launch, from the launcher's start to its exit." % (res["cpus"], res["tp"]))
    for size in SIZES:
        if not all(size in w["sizes"] for w in W):
            continue
        L.append("")
        L.append("**%s** (%s):" % (size, " ".join(SIZES[size]) or "dptp-check's defaults, --tokens 128"))
        L.append("")
        L.append("| world | launcher | " + " | ".join(CHECKS) + " | sum of checks | wall |")
        L.append("|---:|---|" + "---:|" * (len(CHECKS) + 2))
        for w in W:
            s = w["sizes"][size]
            cs = s["check_seconds"]
            L.append("| %d (dp%dtp%d) | %s | " % (w["world"], w["dp"], w["tp"], w["launcher"]) +
                     " | ".join("%.4f" % cs[c] for c in CHECKS) +
                     " | %.3f | %.2f |" % (sum(cs.values()), s["wall"]))
    if all("counts" in w for w in W):
        L.append("")
        L.append("Bootstrap traffic (small input), counted with an LD_PRELOAD PMIx interposer: fences per rank "
                 "(every fence is world-wide), bytes put by all ranks, bytes got by all ranks. "
                 "\"fixed\" is start-up, layout and report gathering.")
        L.append("")
        L.append("| world | " + " | ".join(CHECKS + ["fixed", "whole run"]) + " |")
        L.append("|---:|" + "---|" * (len(CHECKS) + 2))
        for w in W:
            cnt = w["counts"]
            cols = [cnt["per_check"][c] for c in CHECKS] + [cnt["fixed"], cnt["all"]]
            L.append("| %d | " % w["world"] + " | ".join(
                "%g f, %s put, %s got" % (x["fences"] / w["world"], fmt_bytes(x["put_bytes"]),
                                          fmt_bytes(x["get_bytes"])) for x in cols) + " |")
    # growth from the smallest to the largest world
    if len(W) >= 2:
        a, b = W[0], W[-1]
        k = b["world"] / a["world"]
        L.append("")
        size = "small"
        if size in a["sizes"] and size in b["sizes"]:
            growth = ", ".join("%s x%.1f" % (c, b["sizes"][size]["check_seconds"][c] /
                                             max(a["sizes"][size]["check_seconds"][c], 1e-9)) for c in CHECKS)
            L.append("Growth from world %d to %d (x%g ranks), small input, seconds: %s; wall x%.1f." % (
                a["world"], b["world"], k, growth, b["sizes"][size]["wall"] / a["sizes"][size]["wall"]))
        if "counts" in a and "counts" in b:
            ga = a["counts"]["all"]
            gb = b["counts"]["all"]
            L.append("Bootstrap: fences per rank %g -> %g, bytes put (all ranks) x%.1f, bytes got (all ranks) x%.1f." % (
                ga["fences"] / a["world"], gb["fences"] / b["world"],
                gb["put_bytes"] / max(ga["put_bytes"], 1), gb["get_bytes"] / max(ga["get_bytes"], 1)))
    return "\n".join(L) + "\n"


def ensure_gnuplot():
    if shutil.which("gnuplot"):
        return True
    if os.geteuid() != 0:
        print("bench: gnuplot missing (apt-get install gnuplot-nox); no plot", file=sys.stderr)
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "gnuplot-nox"], env=env,
                   stdout=subprocess.DEVNULL)
    return shutil.which("gnuplot") is not None


def plot(res, path, tmp):
    if not ensure_gnuplot():
        return False
    W = res["worlds"]
    have_counts = all("counts" in w for w in W)
    dat = os.path.join(tmp, "scaling.dat")
    with open(dat, "w") as f:
        for size in SIZES:
            if not all(size in w["sizes"] for w in W):
                continue
            f.write("# %s\n" % size)
            for w in W:
                s = w["sizes"][size]
                f.write("%d %s %.6f\n" % (w["world"], " ".join("%.6f" % s["check_seconds"][c] for c in CHECKS),
                                           s["wall"]))
            f.write("\n\n")
    blocks = [s for s in SIZES if all(s in w["sizes"] for w in W)]
    cnt = os.path.join(tmp, "counts.dat")
    if have_counts:
        with open(cnt, "w") as f:
            for w in W:
                a = w["counts"]["all"]
                f.write("%d %g %g %g\n" % (w["world"], a["fences"] / w["world"], a["put_bytes"] / 1024.0,
                                           a["get_bytes"] / 1024.0))
    panels = len(blocks) + (1 if have_counts else 0)
    g = ["set terminal pngcairo size %d,480 font 'sans,10'" % (520 * panels),
         "set output '%s'" % path,
         "set multiplot layout 1,%d title 'dptp-check scaling, host backend, %d CPUs, TP=%d (oversubscribed)'" % (
             panels, res["cpus"], res["tp"]),
         "set logscale xy 2", "set logscale y 10", "set xtics (%s)" % ", ".join(str(w["world"]) for w in W),
         "set xrange [%g:%g]" % (W[0]["world"] / 1.25, W[-1]["world"] * 1.25),
         "set xlabel 'world size (ranks)'", "set key top left font ',8'", "set grid",
         "set format y '%g'"]
    for i, size in enumerate(blocks):
        g.append("set ylabel 'seconds'")
        g.append("set title '%s input%s'" % (size, " (" + " ".join(SIZES[size]) + ")" if SIZES[size] else " (defaults)"))
        parts = ["'%s' index %d using 1:%d with linespoints title '%s'" % (dat, i, j + 2, c)
                 for j, c in enumerate(CHECKS)]
        parts.append("'%s' index %d using 1:%d with linespoints lw 2 dt 2 title 'wall (launch)'" % (
            dat, i, len(CHECKS) + 2))
        g.append("plot " + ", ".join(parts))
    if have_counts:
        g.append("set title 'bootstrap traffic, whole run (small input)'")
        g.append("set ylabel 'fences per rank / KiB (all ranks)'")
        g.append("plot '%s' using 1:2 with linespoints title 'fences per rank', "
                 "'%s' using 1:3 with linespoints title 'KiB put', "
                 "'%s' using 1:4 with linespoints title 'KiB got'" % (cnt, cnt, cnt))
    g.append("unset multiplot")
    gp = os.path.join(tmp, "scaling.gp")
    with open(gp, "w") as f:
        f.write("\n".join(g) + "\n")
    p = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if p.returncode != 0:
        print("bench: gnuplot failed: %s" % p.stderr[-500:], file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--worlds", default="4,8,16,32")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs per world, small input")
    ap.add_argument("--repeat-default", type=int, default=1, help="runs per world, default input (0: skip)")
    ap.add_argument("--launcher", default="auto", choices=["auto", "dptp-run", "mpirun"])
    ap.add_argument("--out-dir")
    ap.add_argument("--no-counts", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--from-json", help="redo the tables and the plot from an earlier scaling.json")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.worlds = [int(x) for x in args.worlds.split(",")]
    out = os.path.abspath(args.out_dir or os.path.join(args.build, "bench"))
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        if args.from_json:
            with open(args.from_json) as f:
                res = json.load(f)
        else:
            counter = None if args.no_counts else build_counter(tmp)
            res = measure(args, counter)
            res["bench_seconds"] = time.monotonic() - t0
        md = markdown(res)
        with open(os.path.join(out, "scaling.md"), "w") as f:
            f.write(md)
        with open(os.path.join(out, "scaling.json"), "w") as f:
            json.dump(res, f, indent=1)
        sys.stdout.write(md)
        if not args.no_plot:
            png = os.path.join(out, "scaling.png")
            if plot(res, png, tmp):
                print("\nplot: %s" % png)
    print("tables: %s, data: %s (%.0fs)" % (os.path.join(out, "scaling.md"), os.path.join(out, "scaling.json"),
                                            time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
