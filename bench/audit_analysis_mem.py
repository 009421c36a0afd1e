#!/usr/bin/env python3
"""The audit analysis's peak memory and time against the number of recorded
collective calls (issue 30 item 6: the launcher's memory must not grow with
the records).

Writes synthetic record folders (the recorders' format, lib/base/audit_rec.h:
4 ranks of one world, each with its C and Python hello, a `world`, its
groups, N x (`op` + `done`) of an all_reduce, alternating between the world
group and the rank's DP pair, and its `end`; the launcher's wstart/wexit),
then runs audit_analyze_job() -- the launcher's own analysis, linked from
the build's static libraries into a small driver compiled here -- once per
folder in a fresh process, and prints its peak RSS (getrusage ru_maxrss)
and the analysis's wall time, with the findings and gaps it reported (0 and
0 expected: the program is healthy); then the same for the hang watch's
look at the folder (audit_analyze_pending(), pending_*), which loads it too.

By default the records are uncapped (as if DPTP_AUDIT_MAX_RECORDS were
raised). --cap N writes what the Python recorder writes at its record cap
N: a `cap` record, no op/done after it, `count` records before its `end`
(the analysis then reports the cap as a gap of each rank).

usage: bench/audit_analysis_mem.py [--build DIR] [--calls 50000,200000,800000]
                                   [--ranks 4] [--repeat N] [--keep DIR] [--cap N]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "audit/audit_analyze.h"

/* VmHWM: this process image's own peak (getrusage's ru_maxrss keeps the
 * peak of the image before the exec: here the Python that wrote the records) */
static long maxrss_kib(void)
{
	char line[256];
	long kib = -1;
	FILE *f = fopen("/proc/self/status", "re");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kib = atol(line + 6);
	if (f)
		fclose(f);
	return kib;
}

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3)
		return 2;
	if (argc == 3) { /* the hang watch's look: audit_analyze_pending() */
		char msg[1024];
		pid_t pids[64];
		size_t npids = 0;
		int att = 0;
		struct timespec a, b;
		long before = maxrss_kib();
		clock_gettime(CLOCK_MONOTONIC, &a);
		int rc = audit_analyze_pending(argv[1], msg, sizeof(msg), pids, &npids, 64, &att);
		clock_gettime(CLOCK_MONOTONIC, &b);
		if (rc < 0) {
			fprintf(stderr, "audit_analyze_pending: %d\n", rc);
			return 1;
		}
		printf("rss_before_kib %ld\nrss_peak_kib %ld\nwall_s %.3f\nhung %d\n", before, maxrss_kib(),
		       (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9, rc);
		return 0;
	}
	struct audit_report rep;
	struct dptp_err err;
	struct timespec a, b;
	memset(&err, 0, sizeof(err));
	long before = maxrss_kib();
	clock_gettime(CLOCK_MONOTONIC, &a);
	int rc = audit_analyze_job(argv[1], NULL, -1, &rep, &err);
	clock_gettime(CLOCK_MONOTONIC, &b);
	if (rc < 0) {
		fprintf(stderr, "audit_analyze_job: %d\n", rc);
		return 1;
	}
	size_t nf = 0, ng = rep.ngaps;
	for (size_t w = 0; w < rep.nw; w++) {
		nf += rep.w[w].nf;
		ng += rep.w[w].ngaps;
	}
	printf("rss_before_kib %ld\nrss_peak_kib %ld\nwall_s %.3f\nrecords %zu\nworlds %zu\nfindings %zu\ngaps %zu\n",
	       before, maxrss_kib(), (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9,
	       (size_t)rep.nrecords, rep.nw, nf, ng);
	audit_report_release(&rep);
	return 0;
}
"""


def build_driver(build, out):
    src = os.path.join(out, "driver.c")
    with open(src, "w") as f:
        f.write(DRIVER)
    exe = os.path.join(out, "driver")
    libs = [os.path.join(build, "launcher", "libdptp_launcher.a"), os.path.join(build, "libdptp.a")]
    for l in libs:
        if not os.path.exists(l):
            sys.exit("%s: not built (ninja -C %s)" % (l, build))
    cmd = [os.environ.get("CC", "cc"), "-O2", "-I", os.path.join(ROOT, "launcher"), "-I", os.path.join(ROOT, "lib"),
           "-I", build, "-I", os.path.join(build, "launcher"), src, "-o", exe] + libs + ["-lm", "-ldl", "-lpthread"]
    subprocess.run(cmd, check=True)
    return exe


def write_records(d, calls, ranks, cap=0):
    """one healthy world: ranks x calls all_reduce, op + done each; cap > 0:
    as the Python recorder with DPTP_AUDIT_MAX_RECORDS=cap (a `cap` record
    when its records reach it, then no op/done, `count` records before the
    end)"""
    os.makedirs(d, exist_ok=True)
    launcher = []
    pairs = [[r // 2 * 2, r // 2 * 2 + 1] for r in range(ranks)]
    world = list(range(ranks))
    for r in range(ranks):
        pid = 1000 + r
        launcher.append('{"k":"wstart","rank":%d,"local_rank":%d,"pid":%d,"att":0,"t":0.01}' % (r, r, pid))
        with open(os.path.join(d, "a0.p%d.c.jsonl" % pid), "w") as f:
            f.write('{"k":"hello","rec":"c","rank":%d,"world":%d,"local_rank":%d,"pid":%d,"ppid":999,"worker":true,'
                    '"py":true,"exe":"/usr/bin/python3","img":0,"host":"h","att":0,"t":0.1}\n' % (r, ranks, r, pid))
            f.write('{"k":"end","how":"exit","code":0,"records":2,"lost":0,"t":%.6f}\n' % (10.0 + calls * 1e-5))
        with open(os.path.join(d, "a0.p%d.py.jsonl" % pid), "w") as f:
            f.write('{"k":"hello","rec":"py","rank":%d,"world":%d,"local_rank":%d,"pid":%d,"ppid":999,"worker":true,'
                    '"flags":"","pre":false,"host":"h","att":0,"t":0.2}\n' % (r, ranks, r, pid))
            f.write('{"k":"world","id":"h:29500","size":%d,"rank":%d,"backend":"gloo","timeout":1800,"t":0.5}\n'
                    % (ranks, r))
            f.write('{"k":"group","g":%s,"gn":0,"site":"loop.py:5","t":0.6}\n' % str(world).replace(" ", ""))
            pg = str(pairs[r]).replace(" ", "")
            f.write('{"k":"group","g":%s,"gn":0,"site":"loop.py:6","t":0.7}\n' % pg)
            wg = str(world).replace(" ", "")
            seq = {0: 0, 1: 0}
            chunk = []
            nrec, lost = 5, 0
            for i in range(calls):
                which = i & 1
                seq[which] += 1
                if cap and nrec + 2 > cap:
                    if not lost:
                        chunk.append('{"k":"cap","max":%d,"t":%.7f}\n' % (cap, 1.0 + i * 1e-5))
                    lost += 2
                    continue
                nrec += 2
                g, line = (wg, 12) if which == 0 else (pg, 13)
                t = 1.0 + i * 1e-5 + r * 1e-7
                chunk.append('{"k":"op","op":"all_reduce","g":%s,"gn":0,"seq":%d,"n":1,"dt":"float32",'
                             '"site":"loop.py:%d","t":%.7f}\n{"k":"done","g":%s,"gn":0,"seq":%d,"t":%.7f}\n'
                             % (g, seq[which], line, t, g, seq[which], t + 5e-6))
                if len(chunk) >= 20000:
                    f.write("".join(chunk))
                    chunk = []
            f.write("".join(chunk))
            if lost:
                nrec += 3
                for g, n in ((wg, seq[0]), (pg, seq[1])):
                    f.write('{"k":"count","g":%s,"gn":0,"seq":%d,"t":%.6f}\n' % (g, n, 9.0 + calls * 1e-5))
            f.write('{"k":"end","how":"atexit","code":null,"records":%d,"lost":%d,"t":%.6f}\n'
                    % (nrec, lost, 9.0 + calls * 1e-5))
        launcher.append('{"k":"wexit","rank":%d,"pid":%d,"att":0,"code":0,"sig":null,"core":false,"t":%.6f}'
                        % (r, pid, 11.0 + calls * 1e-5))
    with open(os.path.join(d, "launcher.jsonl"), "w") as f:
        f.write("\n".join(launcher) + "\n")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))


def run_driver(exe, d, *more):
    p = subprocess.run([exe, d] + list(more), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("%s %s: exit %d\n%s" % (exe, d, p.returncode, p.stderr))
    return {k: float(v) for k, v in (l.split() for l in p.stdout.splitlines())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--calls", default="50000,200000,800000")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="write the record folders here and keep them")
    ap.add_argument("--cap", type=int, default=0,
                    help="write the records as the Python recorder does with DPTP_AUDIT_MAX_RECORDS=CAP (0: uncapped)")
    a = ap.parse_args()
    top = a.keep or tempfile.mkdtemp(prefix="dptp_audit_mem_")
    os.makedirs(top, exist_ok=True)
    try:
        exe = build_driver(os.path.abspath(a.build), top)
        print("%9s %6s %10s %9s %12s %9s %8s %5s %14s %12s" %
              ("calls", "ranks", "records", "files_MB", "peak_RSS_MB", "wall_s", "findings", "gaps",
               "pending_RSS_MB", "pending_s"))
        for calls in [int(x) for x in a.calls.split(",")]:
            d = os.path.join(top, "c%d" % calls)
            size = write_records(d, calls, a.ranks, a.cap)
            rs = [run_driver(exe, d) for _ in range(a.repeat)]
            ps = [run_driver(exe, d, "pending") for _ in range(a.repeat)]
            print("%9d %6d %10d %9.1f %12.1f %9.2f %8d %5d %14.1f %12.2f" %
                  (calls, a.ranks, rs[0]["records"], size / 1e6,
                   statistics.median(r["rss_peak_kib"] for r in rs) / 1024,
                   statistics.median(r["wall_s"] for r in rs), rs[0]["findings"], rs[0]["gaps"],
                   statistics.median(r["rss_peak_kib"] for r in ps) / 1024,
                   statistics.median(r["wall_s"] for r in ps)), flush=True)
            if not a.keep:
                shutil.rmtree(d)
    finally:
        if not a.keep:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
