#!/usr/bin/env python3
"""End-to-end: a report on every exit path that --output was given
(issue 24 item 5), in each of the three formats:

- a peer that dies at start-up: the launcher ends rank 0 with SIGTERM, and
  rank 0 still writes every (replica, check) as `error` naming the signal;
- SIGTERM to rank 0 during the checks: rank 0's finished results are
  kept, the running check and those after it are `error`; with --layouts
  in the --layouts form;
- --bench that fails before any row (no device);
- a bootstrap that cannot start (RANK invalid, PMIx_Init failing): a
  single-process report, none when the environment names another rank;
- a layout that does not fit the world: a report saying so, exit 2.

Each one wrote no report before. usage: reports.py --check PATH
[--launcher mpirun|dptp-run] [--run PATH]
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matrix import launch_cmd, launcher_parser  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--tokens", "8", "--hidden", "64"]
NCHECKS = 8


def load(path, fmt):
    """The report's (replica, check) -> (status, detail), whatever the
    format; raises when the file is not valid."""
    text = open(path).read()
    if fmt == "json":
        return load_dict(json.loads(text))
    return load_xml_or_text(text, fmt)


def load_dict(rep):
    """A JSON report's (replica, check) -> (status, detail), checked
    against DESIGN.md's keys and its summary."""
    for key in ("tool", "version", "layout", "backend", "bootstrap", "seed", "inject", "replicas", "summary"):
        if key not in rep:
            raise ValueError("JSON without %r" % key)
    got = {}
    for r in rep["replicas"]:
        for k in ("dp", "ranks", "status", "checks"):
            if k not in r:
                raise ValueError("replica without %r" % k)
        for c in r["checks"]:
            if c["status"] not in ("pass", "fail", "skip", "error", "timeout"):
                raise ValueError("status %r" % c["status"])
            got[(r["dp"], c["name"])] = (c["status"], c["detail"])
    s = rep["summary"]
    if sum(s.values()) != len(got) or s["error"] != sum(v[0] == "error" for v in got.values()):
        raise ValueError("summary %r does not count the checks" % s)
    return got


def load_xml_or_text(text, fmt):
    if fmt == "junit":
        got = {}
        for case in ET.fromstring(text).iter("testcase"):
            dp, name = case.get("name").split("/", 1)
            kids = [e for e in case if e.tag in ("failure", "error", "skipped")]
            if not kids:
                got[(int(dp[2:]), name)] = ("pass", "")
            else:
                e = kids[0]
                st = e.get("type") or ("skip" if e.tag == "skipped" else "fail")
                got[(int(dp[2:]), name)] = (st, e.text or e.get("message") or "")
        return got
    got = {}
    dp = None
    for line in text.splitlines():
        if line.startswith("DP replica "):
            dp = int(line.split()[2])
        elif dp is not None and line.startswith("  ") and len(line.split()) >= 3:
            w = line.split(None, 3)
            got[(dp, w[0])] = (w[1].lower(), w[3] if len(w) > 3 else "")
    return got


def sigterm_in_check(args, env, layout, problems):
    """Rank 3 stops itself before dispatch, rank 0 gets SIGTERM: its report
    keeps rank 0's finished checks, the running one and those after it
    are errors naming the signal."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        token = str(random.SystemRandom().randrange(2, 1 << 62))
        e = dict(env, DPTP_TEST_STALL_RANK="3", DPTP_TEST_STALL_CHECK="dispatch")
        cmd = launch_cmd(args, 4)
        if args.launcher == "mpirun":
            cmd += ["-x", "DPTP_TEST_STALL_RANK", "-x", "DPTP_TEST_STALL_CHECK"]
        cmd += [args.check] + layout + ["--timeout", "60", "--seed", token, "--format", "json",
                                        "--output", out] + SMALL
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                             start_new_session=True)
        exe = os.path.realpath(args.check)
        stopped = rank0 = None
        for _ in range(600):  # this job's ranks: dptp-check with its --seed
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if os.path.realpath("/proc/%s/exe" % pid) != exe:
                        continue
                    st = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[0]
                    cl = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
                    en = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
                except OSError:
                    continue
                if token.encode() not in cl:
                    continue
                if st == "T":
                    stopped = pid
                if b"RANK=0" in en or b"OMPI_COMM_WORLD_RANK=0" in en:
                    rank0 = pid
            if (stopped and rank0) or p.poll() is not None:
                break
            time.sleep(0.1)
        if stopped and rank0:
            os.kill(int(rank0), signal.SIGTERM)
        try:
            so, se = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate()
            problems.append("SIGTERM in a check: still running 60 s later")
        what = "SIGTERM during a check (%s)" % " ".join(layout)
        if not stopped or not rank0:
            problems.append("%s: rank 3 never stopped, or no rank 0: %s" % (what, se[-400:]))
        elif not os.path.exists(out):
            problems.append("%s: no report: %s" % (what, se[-600:]))
        else:
            rep = json.load(open(out))
            if "--layouts" in layout:
                # one report per layout and the matrix, as without a signal
                if [x["layout"] for x in rep.get("matrix", [])] != ["2x1x2", "4x1x1"]:
                    problems.append("%s: not the --layouts form: %r" % (what, list(rep)))
                    return
                later = load_dict(rep["layouts"][1])
                if len(later) != 4 * NCHECKS or any(v[0] != "error" or "(layout 2x1x2)" not in v[1]
                                                    for v in later.values()):
                    problems.append("%s: the later layout: %r" % (what, list(later.items())[:1]))
                rep = rep["layouts"][0]
            got = load_dict(rep)
            b0, d0, d1, l1 = (got[(0, "broadcast")], got[(0, "dispatch")], got[(1, "dispatch")],
                              got[(1, "lockstep")])
            if "rank 0: pass" not in b0[1] or "not gathered" not in b0[1]:
                problems.append("%s: rank 0's finished check lost: %r" % (what, b0))
            if got[(1, "broadcast")][0] != "error" or "not gathered" not in got[(1, "broadcast")][1]:
                problems.append("%s: another replica's finished check: %r" % (what, got[(1, "broadcast")]))
            if any(x[0] != "error" or "during this check" not in x[1] for x in (d0, d1)):
                problems.append("%s: the running check: %r %r" % (what, d0, d1))
            if l1[0] != "error" or "not run: terminated by signal 15 (SIGTERM) during check dispatch" not in l1[1]:
                problems.append("%s: a later check: %r" % (what, l1))
        print("%s: exit %s" % (what, p.returncode))


def main():
    args = launcher_parser().parse_args()
    problems = []
    env = dict(os.environ, NO_COLOR="1")
    env.pop("MALLOC_PERTURB_", None)  # robust.py says why (an Open MPI bug)
    torchrun_like = args.launcher == "dptp-run"

    # 1. a peer dies at start-up (rank 0 waits for it, the launcher ends
    # the job with SIGTERM): before, rank 0 died without a report
    for fmt in ("json", "junit", "text"):
        with tempfile.TemporaryDirectory() as d:
            out, ready = os.path.join(d, "r." + fmt), os.path.join(d, "ready")
            e = dict(env, DPTP_TEST_READY_FILE=ready)
            cmd = launch_cmd(args, 4)
            if args.launcher == "mpirun":
                cmd += ["-x", "DPTP_TEST_READY_FILE"]
            cmd += [os.path.join(HERE, "crashwrap.sh"), "2", ready, args.check, "--dp", "2", "--tp", "2",
                    "--timeout", "60", "--format", fmt, "--output", out] + SMALL
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)
            dt = time.monotonic() - t0
            what = "peer dies at start-up (%s)" % fmt
            if p.returncode == 0:
                problems.append("%s: exit 0" % what)
            if not os.path.exists(out):
                problems.append("%s: no report: %s" % (what, p.stderr[-600:]))
                continue
            try:
                got = load(out, fmt)
            except Exception as ex:  # noqa: BLE001
                problems.append("%s: invalid report: %s" % (what, ex))
                continue
            # dptp-run lets go of the workers' PMIx connections before it
            # signals them, so rank 0 first sees its fence fail: its own
            # words come first, then the signal that ended its wait for the
            # others' (or, had that wait ended first, no signal at all)
            bad = {k: v for k, v in got.items() if v[0] != "error" or not (
                "signal 15 (SIGTERM)" in v[1] or (torchrun_like and "start-up failed" in v[1]))}
            if len(got) != 2 * NCHECKS or bad:
                problems.append("%s: %d entries, not errors naming SIGTERM: %r" % (what, len(got), list(bad.items())[:2]))
            # mpirun's PMIx server still answers: rank 0 asks who had arrived
            # (rank 2 never did; on a loaded machine another rank may not
            # have either when the launcher signalled it)
            named = [re.search(r"(\d) of 4 ranks never arrived: ([\d, ]+)", v[1]) for v in got.values()]
            if not torchrun_like and not all(m and "2" in m.group(2).split(", ") for m in named):
                problems.append("%s: rank 2 not named: %r" % (what, list(got.values())[:1]))
            # 60 s is the start-up's own timeout: ended well before it,
            # the signal did it
            if dt > 30:
                problems.append("%s: took %.1f s" % (what, dt))
            print("%s: exit %d in %.2f s, %d entries" % (what, p.returncode, dt, len(got)))

    # 2. SIGTERM to rank 0 (as a launcher sends it) while rank 3 is stopped
    # in a check and the others wait for it; one layout, then --layouts
    # (whose report has its own form: one report per layout, the matrix)
    for layout in (["--dp", "2", "--tp", "2"], ["--layouts", "2x1x2,4x1x1"]):
        sigterm_in_check(args, env, layout, problems)

    # 3. --bench that fails before any row: no device (CUDA_VISIBLE_DEVICES
    # empty), with and without --backend cuda
    cuda_build = "cuda" in subprocess.run([args.check, "--version"], capture_output=True, text=True).stdout
    for backend in (["--backend", "cuda"], []):
        if backend and not cuda_build:
            continue
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "b.json")
            e = dict(env, CUDA_VISIBLE_DEVICES="")
            cmd = launch_cmd(args, 2)
            if args.launcher == "mpirun":
                cmd += ["-x", "CUDA_VISIBLE_DEVICES"]
            cmd += [args.check, "--bench", "--timeout", "20", "--format", "json", "--output", out] + backend
            p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)
            what = "bench without a device %s" % (" ".join(backend) or "(auto)")
            want = 1 if torchrun_like else 3
            if p.returncode != want:
                problems.append("%s: exit %d, want %d: %s" % (what, p.returncode, want, p.stderr[-400:]))
            if not os.path.exists(out):
                problems.append("%s: no report: %s" % (what, p.stderr[-400:]))
            else:
                got = load(out, "json")
                if not got or any(k[1] != "bench" or v[0] != "error" or not v[1] for k, v in got.items()):
                    problems.append("%s: %r" % (what, got))
            print("%s: exit %d" % (what, p.returncode))

    # 4. no bootstrap: the rank is unknown, the report is a single
    # process's; none when the environment names another rank
    base = {k: v for k, v in env.items() if not k.startswith(("PMIX_", "OMPI_", "SLURM_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cases = [
        ("RANK invalid", dict(base, RANK="x", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"), "json",
         True, "invalid RANK"),
        ("WORLD_SIZE invalid", dict(base, RANK="0", WORLD_SIZE="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
         "junit", True, "WORLD_SIZE"),
        ("PMIx_Init failing", dict(base, PMIX_NAMESPACE="no-such-job", PMIX_RANK="0"), "text", True, "PMIx_Init"),
        ("rank 1, WORLD_SIZE invalid", dict(base, RANK="1", WORLD_SIZE="0", MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT="1"), "json", False, ""),
    ]
    for what, e, fmt, want_report, words in cases:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r." + fmt)
            p = subprocess.run([args.check, "--format", fmt, "--output", out], capture_output=True, text=True,
                               env=e, timeout=60)
            if p.returncode != 3:
                problems.append("%s: exit %d, want 3: %s" % (what, p.returncode, p.stderr[-300:]))
            if os.path.exists(out) != want_report:
                problems.append("%s: report written: %s" % (what, os.path.exists(out)))
            elif want_report:
                got = load(out, fmt)
                bad = {k: v for k, v in got.items() if k[0] != 0 or v[0] != "error" or words not in v[1]
                       or "start-up" not in v[1]}
                if len(got) != NCHECKS or bad:
                    problems.append("%s: %d entries: %r" % (what, len(got), list(bad.items())[:2]))
            print("%s: exit %d, report %s" % (what, p.returncode, os.path.exists(out)))

    # 5. a layout that does not fit the world: exit 2 and a report saying so
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.xml")
        p = subprocess.run(launch_cmd(args, 4) + [args.check, "--dp", "3", "--tp", "2", "--format", "junit",
                                                  "--output", out], capture_output=True, text=True, env=env,
                           timeout=60)
        want = 1 if torchrun_like else 2
        what = "layout mismatch"
        if p.returncode != want:
            problems.append("%s: exit %d, want %d" % (what, p.returncode, want))
        if not os.path.exists(out):
            problems.append("%s: no report" % what)
        else:
            got = load(out, "junit")
            if len(got) != NCHECKS or any(v[0] != "error" or "usage: " not in v[1] or "3*1*2 = 6" not in v[1]
                                          for v in got.values()):
                problems.append("%s: %r" % (what, list(got.items())[:2]))
        print("%s: exit %d" % (what, p.returncode))

    for pr in problems:
        print("FAIL:", pr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
