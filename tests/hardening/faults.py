#!/usr/bin/env python3
"""Fault tests, end to end with real processes (issue 9 item 3).

usage: faults.py --run DPTP_RUN --check DPTP_CHECK [--preload exit_on_usr1.so]
                 [--only CASE[,CASE]] [--json OUT]

Cases (4 workers of dptp-check --dp 2 --tp 2 under dptp-run unless noted):
  kill, segv, exit3   rank 1 stops itself before `fused-allreduce`
                      (DPTP_TEST_STALL_RANK/CHECK) while the others enter the
                      check's collectives; the test then SIGKILLs it, SIGSEGVs
                      it, or makes it exit 3 (SIGUSR1 through the preload).
                      The others must be gone < 100 ms after the victim died,
                      dptp-run's failure report must name rank 1, and no
                      process of the job may be left (/proc).
  stop                rank 1 stays SIGSTOPped: a `timeout` verdict in the
                      report, written within --timeout + 1 s of the stop.
  launcher_kill       dptp-run SIGKILLed mid-run: no worker survives it.
  output_unwritable   --output /proc/nope/x.json: clear error, non-zero exit.
  disk_full           --output on a full 4 KiB tmpfs (root only).
  malformed_check     60+ malformed dptp-check command lines: exit 2, one
                      line on stderr, no signal, no hang.
  malformed_run       60+ malformed dptp-run command lines: exit 2, one
                      "dptp-run: error:" line (after argparse's usage).
Prints one line per case with its measurements; exit 1 on any failure.
Worker processes are found through a unique tag in their environment.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ARGS = None
RESULTS = {}
FAILURES = []


def fail(case, msg):
    FAILURES.append("%s: %s" % (case, msg))
    print("FAIL %s: %s" % (case, msg), flush=True)


def proc_state(pid):
    """'R', 'S', 'T', 'Z', ... or None when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        return s[s.rindex(")") + 2]
    except (OSError, ValueError):
        return None


def alive(pid):
    st = proc_state(pid)
    return st is not None and st not in ("Z", "X")


def tagged(tag):
    """{pid: environ dict} of every live process carrying tag."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if ("DPTP_FAULTS_TAG=" + tag).encode() not in raw:
            continue
        env = {}
        for kv in raw.split(b"\0"):
            if b"=" in kv:
                k, v = kv.split(b"=", 1)
                env[k.decode(errors="replace")] = v.decode(errors="replace")
        if alive(int(d)):
            out[int(d)] = env
    return out


def workers(tag, launcher_pid):
    return {p: e for p, e in tagged(tag).items() if p != launcher_pid and "RANK" in e}


def start_job(tag, tmp, timeout=10, stall=None, extra_env=None, checks=None):
    out = os.path.join(tmp, "report.json")
    cmd = [ARGS.run, "--nproc-per-node=4", "--no-python", ARGS.check, "--dp", "2", "--tp", "2",
           "--tokens", "8", "--hidden", "64", "--timeout", str(timeout), "--format", "json",
           "--output", out]
    if checks:
        cmd += ["--checks", checks]
    env = dict(os.environ, DPTP_FAULTS_TAG=tag, NO_COLOR="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if stall is not None:
        env["DPTP_TEST_STALL_RANK"] = str(stall[0])
        env["DPTP_TEST_STALL_CHECK"] = stall[1]
    if extra_env:
        env.update(extra_env)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                         cwd=tmp)
    return p, out


def wait_stopped(tag, p, rank, limit=20.0):
    """pid of `rank` once it has stopped itself (state T), or None."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        for pid, e in workers(tag, p.pid).items():
            if e.get("RANK") == str(rank) and proc_state(pid) == "T":
                return pid
        if p.poll() is not None:
            return None
        time.sleep(0.005)
    return None


def leftovers(tag, launcher_pid=None):
    return sorted(p for p in tagged(tag) if p != launcher_pid)


def describe(tag, launcher_pid):
    """The job's processes: pid, rank, state, wchan; and the launcher's."""
    out = []
    for pid, e in sorted(tagged(tag).items()):
        try:
            wchan = open("/proc/%d/wchan" % pid).read()
        except OSError:
            wchan = "?"
        who = "dptp-run" if pid == launcher_pid else "rank %s" % e.get("RANK", "?")
        out.append("%d (%s) state %s wchan %s" % (pid, who, proc_state(pid), wchan))
        if pid == launcher_pid and os.path.exists("/usr/bin/gdb"):
            bt = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                capture_output=True, text=True, timeout=60).stdout
            out.append("backtrace:\n" + "\n".join(ln for ln in bt.splitlines() if ln.startswith(("#", "Thread"))))
    return "; ".join(out) or "no process of the job left"


def cleanup(tag, p):
    for pid in leftovers(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if p.poll() is None:
        p.kill()
    try:
        p.communicate(timeout=10)
    except Exception:
        pass


def case_worker_dies(case):
    nfail = len(FAILURES)
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"LD_PRELOAD": ARGS.preload} if case == "exit3" else None
        if case == "exit3" and not ARGS.preload:
            print("SKIP exit3: no --preload")
            return
        p, _ = start_job(tag, tmp, timeout=30, stall=(1, "fused-allreduce"), extra_env=extra)
        try:
            victim = wait_stopped(tag, p, 1)
            if victim is None:
                fail(case, "rank 1 never stopped before fused-allreduce")
                return
            time.sleep(0.3)  # the other ranks are now blocked in the check's collectives
            others = [q for q in workers(tag, p.pid) if q != victim]
            if len(others) != 3:
                fail(case, "expected 3 other workers, found %d" % len(others))
            sig = {"kill": signal.SIGKILL, "segv": signal.SIGSEGV, "exit3": signal.SIGUSR1}[case]
            t_sent = time.monotonic()
            os.kill(victim, sig)
            if sig != signal.SIGKILL:
                os.kill(victim, signal.SIGCONT)
            t_dead = None
            t_gone = None
            end = t_sent + 40
            while time.monotonic() < end:
                now = time.monotonic()
                if t_dead is None and not alive(victim):
                    t_dead = now
                if t_dead is not None and not any(alive(q) for q in others):
                    t_gone = now
                    break
                time.sleep(0.0005)
            try:
                _, err = p.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                fail(case, "dptp-run did not exit 40 s after the worker died; %s" % describe(tag, p.pid))
                return
            t_exit = time.monotonic()
            if t_gone is None:
                fail(case, "the other workers were still alive 40 s later")
                return
            dt = (t_gone - t_dead) * 1000
            RESULTS[case] = {"others_gone_ms": round(dt, 1), "launcher_exit_ms": round((t_exit - t_dead) * 1000, 1),
                             "rc": p.returncode}
            want_code = {"kill": "exitcode  : -9", "segv": "exitcode  : -11", "exit3": "exitcode  : 3"}[case]
            ok_rank = "rank      : 1 (local_rank: 1)" in err
            msg = "%s: others gone %.1f ms after rank 1 died, dptp-run exit %d after %.0f ms" % (
                case, dt, p.returncode, (t_exit - t_dead) * 1000)
            if dt > 100:
                fail(case, "others gone only %.1f ms after the victim died (limit 100 ms)" % dt)
            if not ok_rank or want_code not in err:
                fail(case, "failure report does not name rank 1 with '%s':\n%s" % (want_code, err[-1500:]))
            if p.returncode == 0:
                fail(case, "dptp-run exited 0")
            if p.returncode < 0:
                fail(case, "dptp-run itself died of signal %d after the worker failed" % -p.returncode)
            left = leftovers(tag)
            if left:
                fail(case, "processes left: %s" % left)
            print(("ok " if len(FAILURES) == nfail else "measured ") + msg, flush=True)
        finally:
            cleanup(tag, p)


def case_stop():
    tag = uuid.uuid4().hex
    timeout = 3.0
    with tempfile.TemporaryDirectory() as tmp:
        p, out = start_job(tag, tmp, timeout=timeout, stall=(1, "fused-allreduce"))
        try:
            victim = wait_stopped(tag, p, 1)
            t_stop = time.monotonic()
            if victim is None:
                fail("stop", "rank 1 never stopped")
                return
            t_report = None
            end = t_stop + timeout + 30
            while time.monotonic() < end and t_report is None:
                if os.path.exists(out):
                    t_report = time.monotonic()
                    break
                if p.poll() is not None and not os.path.exists(out):
                    break
                time.sleep(0.002)
            try:
                _, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                fail("stop", "dptp-run still running 60 s after the stop")
                return
            t_exit = time.monotonic()
            if t_report is None:
                fail("stop", "no report (dptp-run rc %d): %s" % (p.returncode, err[-800:]))
                return
            rep = json.load(open(out))
            st = [(r["dp"], c["name"], c["status"]) for r in rep["replicas"] for c in r["checks"]]
            timeouts = [s for s in st if s[2] == "timeout"]
            dt = t_report - t_stop
            RESULTS["stop"] = {"timeout_s": timeout, "report_after_s": round(dt, 3),
                               "launcher_exit_after_s": round(t_exit - t_stop, 3), "rc": p.returncode,
                               "timeouts": timeouts}
            if not timeouts:
                fail("stop", "no timeout verdict: %s" % st)
            if dt > timeout + 1.0:
                fail("stop", "report %.2f s after the stop (limit --timeout %.0f + 1 s)" % (dt, timeout))
            if rep["summary"]["timeout"] < 1:
                fail("stop", "summary has no timeout: %s" % rep["summary"])
            if p.returncode < 0:
                fail("stop", "dptp-run itself died of signal %d after the stop" % -p.returncode)
            left = leftovers(tag)
            if left:
                fail("stop", "processes left: %s" % left)
            print("ok stop: report %.2f s after rank 1 stopped (--timeout %.0f), dptp-run exit %d after %.2f s, %s" % (
                dt, timeout, p.returncode, t_exit - t_stop, timeouts), flush=True)
        finally:
            cleanup(tag, p)


def case_launcher_kill():
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        # rank 1 stopped, the others blocked in a collective: the hardest
        # state to clean up (a stopped process ignores SIGTERM)
        p, _ = start_job(tag, tmp, timeout=60, stall=(1, "fused-allreduce"))
        try:
            if wait_stopped(tag, p, 1) is None:
                fail("launcher_kill", "rank 1 never stopped")
                return
            time.sleep(0.2)
            ws = list(workers(tag, p.pid))
            t0 = time.monotonic()
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            t_gone = None
            while time.monotonic() < t0 + 10:
                if not any(alive(w) for w in ws) and not leftovers(tag):
                    t_gone = time.monotonic()
                    break
                time.sleep(0.001)
            if t_gone is None:
                fail("launcher_kill", "workers survived dptp-run's SIGKILL: %s" % leftovers(tag))
                return
            RESULTS["launcher_kill"] = {"workers": len(ws), "all_gone_ms": round((t_gone - t0) * 1000, 1)}
            print("ok launcher_kill: %d workers gone %.1f ms after dptp-run was SIGKILLed" % (
                len(ws), (t_gone - t0) * 1000), flush=True)
        finally:
            cleanup(tag, p)


def run_short(cmd, timeout=20, env=None, cwd=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=cwd, errors="replace")
    except subprocess.TimeoutExpired:
        return None


def check_report_error(case, cmd, path_hint):
    p = run_short(cmd)
    if p is None:
        fail(case, "hung: %s" % cmd)
        return
    err = p.stderr.strip()
    RESULTS[case] = {"rc": p.returncode, "stderr": err[-300:]}
    if p.returncode <= 0:
        fail(case, "exit %d (want a positive code): %s" % (p.returncode, err))
    elif path_hint not in err:
        fail(case, "message does not name the path %r: %r" % (path_hint, err))
    else:
        print("ok %s: exit %d, %r" % (case, p.returncode, err.splitlines()[-1] if err else ""), flush=True)


def case_output_unwritable():
    base = [ARGS.check, "--tokens", "8", "--hidden", "64", "--format", "json"]
    check_report_error("output_unwritable", base + ["--output", "/proc/nope/x.json"], "/proc/nope/x.json")
    check_report_error("output_unwritable_dir", base + ["--output", "/"], "/")


def case_disk_full():
    if os.geteuid() != 0:
        print("SKIP disk_full: not root")
        return
    mnt = tempfile.mkdtemp(prefix="dptp-full-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        print("SKIP disk_full: mount failed: %s" % r.stderr.strip())
        os.rmdir(mnt)
        return
    try:
        # fill it up
        fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * 512)
        except OSError:
            pass
        os.close(fd)
        path = os.path.join(mnt, "r.json")
        check_report_error("disk_full", [ARGS.check, "--tokens", "8", "--hidden", "64", "--format", "json",
                                         "--output", path], path)
        stray = [n for n in os.listdir(mnt) if n != "filler"]
        if stray:
            fail("disk_full", "files left in the full filesystem: %s" % stray)
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)


MALFORMED_CHECK = [
    ["--dp"], ["--dp", "x"], ["--dp", "0"], ["--dp", "-1"], ["--dp", "1.5"], ["--dp", ""],
    ["--dp", "99999999999999999999"], ["--dp", "4097"], ["--tp", "0"], ["--tp", "abc"], ["--pp", "0x"],
    ["--pp", "-0"], ["--tp", "2K2"], ["--tokens", "0"], ["--tokens", "-5"], ["--tokens", "1e3"],
    ["--tokens", "18446744073709551616"], ["--hidden", "63"], ["--hidden", "0"], ["--hidden", "8T"],
    ["--hidden", " 64"], ["--hidden", "64 "], ["--seed", "-1"], ["--seed", "0x"], ["--seed", "1x"],
    ["--timeout", "0"], ["--timeout", "-1"], ["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "1e999"],
    ["--timeout", "abc"], ["--format", "yaml"], ["--format", ""], ["--format", "JSON"], ["--dtype", "fp64"],
    ["--dtype", ""], ["--backend", "gpu"], ["--backend", ""], ["--checks", "bogus"], ["--checks", ""],
    ["--checks", "broadcast,broadcast"], ["--checks", "broadcast,,opid"], ["--checks", ","],
    ["--inject", "bogus"], ["--inject", "bcast-global-src,bogus"], ["--inject", "opid-seeded,opid-seeded"],
    ["--inject", ",,"], ["--bogus"], ["-x"], ["-"], ["extra"], ["--", "extra"], ["--dp=2", "x"],
    ["--output"], ["--output="], ["--help=1"], ["--list=yes"], ["--version=2"], ["-v3"], ["--eps", "0"],
    ["--dp", "2\n--tp"], ["--format", "json\x1b[31m"], ["--checks", "a" * 5000], ["--" + "x" * 5000],
    ["--dp", "\xff\xfe"], ["--tokens", "\t8"],
]

MALFORMED_RUN = [
    [], ["--bogus", "x.py"], ["--nproc-per-node=x", "x.py"], ["--nproc-per-node", "-1", "x.py"],
    ["--nproc-per-node=0", "x.py"], ["--nproc-per-node="], ["--nproc-per-node"], ["--nnodes", "0", "x.py"],
    ["--nnodes", "2:1", "x.py"], ["--nnodes", "a:b", "x.py"], ["--nnodes", "1:2:3", "x.py"], ["--nnodes", "", "x.py"],
    ["--node-rank", "-1", "x.py"], ["--node-rank", "x", "x.py"], ["--master-port", "99999", "x.py"],
    ["--master-port", "-1", "x.py"], ["--master-port", "port", "x.py"], ["--max-restarts", "-1", "x.py"],
    ["--max-restarts", "x", "x.py"], ["--max-restarts", "1e3", "x.py"], ["--monitor-interval", "x", "x.py"],
    ["--monitor-interval", "nanx", "x.py"], ["--start-method", "thread", "x.py"], ["--start-method", "", "x.py"],
    ["--numa-binding", "bogus", "x.py"], ["-r", "9", "x.py"], ["-r", "x", "x.py"], ["-r", "0:5", "x.py"],
    ["-r", "0:1,0", "x.py"], ["--tee", "4", "x.py"], ["--tee", "0:", "x.py"], ["--tee", ":1", "x.py"],
    ["--redirects", "10:1", "x.py"], ["--local-ranks-filter", "a", "x.py"], ["--local-ranks-filter", "0,,1", "x.py"],
    ["--signals-to-handle", "SIGBOGUS", "x.py"],
    ["--signals-to-handle", "SIGKILL", "x.py"], ["--rdzv-timeout", "x", "x.py"], ["--rdzv-timeout", "-5", "x.py"], ["--standalone=1", "x.py"],
    ["--no-python=1", "x.py"], ["--no-python"], ["-m"], ["--module", "--no-python", "x"],
    ["--nproc", "x", "x.py"], ["--n", "2", "x.py"], ["--ma", "x.py"],
    ["--max", "2", "x.py"], ["--log-dir"], ["--role"], ["--rdzv-backend"], ["--rdzv-endpoint"], ["--rdzv-id"],
    ["--rdzv-conf"], ["--master-addr"], ["--local-addr"], ["--logs-specs"], ["-h=1"], ["--help=x"],
    ["--nproc-per-node", "\xff", "x.py"], ["--" + "y" * 5000, "x.py"], ["--nnodes", "1:" + "9" * 40, "x.py"],
    ["--max-restarts", "99999999999999999999", "x.py"], ["--tee", "0:1,1:2,2:3,3:4", "x.py"],
]


def case_malformed(case, prog, lines, want_line):
    bad = 0
    hist = {}
    for argv in lines:
        cmd = [prog] + argv
        p = run_short(cmd, timeout=10, env=dict(os.environ, NO_COLOR="1"))
        if p is None:
            fail(case, "hang (10 s) on %r" % argv)
            bad += 1
            continue
        hist[p.returncode] = hist.get(p.returncode, 0) + 1
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        msgs = [ln for ln in err if want_line(ln)]
        if p.returncode < 0:
            fail(case, "signal %d on %r" % (-p.returncode, argv))
            bad += 1
        elif p.returncode != 2:
            fail(case, "exit %d (want 2) on %r: %s" % (p.returncode, argv, p.stderr[-300:]))
            bad += 1
        elif len(msgs) != 1 or (prog == ARGS.check and len(err) != 1):
            fail(case, "want one message line on %r, got %r" % (argv, err[-4:]))
            bad += 1
    RESULTS[case] = {"tried": len(lines), "bad": bad, "exit_codes": hist}
    print("%s %s: %d command lines, %d problems, exit codes %s" % (
        "ok" if not bad else "FAIL", case, len(lines), bad, hist), flush=True)


CASES = {
    "kill": lambda: case_worker_dies("kill"),
    "segv": lambda: case_worker_dies("segv"),
    "exit3": lambda: case_worker_dies("exit3"),
    "stop": case_stop,
    "launcher_kill": case_launcher_kill,
    "output_unwritable": case_output_unwritable,
    "disk_full": case_disk_full,
    "malformed_check": lambda: case_malformed("malformed_check", ARGS.check, MALFORMED_CHECK,
                                              lambda ln: ln.startswith("dptp-check: ")),
    "malformed_run": lambda: case_malformed("malformed_run", ARGS.run, MALFORMED_RUN,
                                            lambda ln: ln.startswith("dptp-run: error: ")),
}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--check", required=True)
    ap.add_argument("--preload")
    ap.add_argument("--only")
    ap.add_argument("--json")
    ARGS = ap.parse_args()
    ARGS.run = os.path.abspath(ARGS.run)
    ARGS.check = os.path.abspath(ARGS.check)
    if ARGS.preload:
        ARGS.preload = os.path.abspath(ARGS.preload)
    names = ARGS.only.split(",") if ARGS.only else list(CASES)
    for n in names:
        CASES[n]()
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(RESULTS, f, indent=1)
    for f in FAILURES:
        print("FAIL:", f.splitlines()[0])
    print("%d cases, %d failures" % (len(names), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
