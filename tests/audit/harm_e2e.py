#!/usr/bin/env python3
"""dptp-run --audit never harms the job and never passes what it did not
see (issue 30), end to end: harm_e2e.py DPTP_RUN TORCH_PYTHON CASE [STATIC_EXE].

Cases without torch: options, records, static. With real torch (gloo, 2
ranks; skipped with 77 where TORCH_PYTHON is ''): slow, slowhang, hangoff,
exit, crash, restart, worlds, boundhang and boundslow (no --audit-hang: the
bound is the process group's timeout)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from xml.etree import ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.abspath(sys.argv[1])
TORCH_PY, CASE = sys.argv[2:4]
TMP = tempfile.mkdtemp(prefix="dptp_harm_e2e_")


def fail(msg):
    sys.exit("FAIL: " + msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, env_extra=None, timeout=180, nproc=2):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["TMPDIR"] = TMP  # the records' temporary folders land here
    env.update(env_extra or {})
    cmd = [RUN, "--master-port", str(free_port()), "--nproc-per-node", str(nproc)] + args
    p = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def line_of(script, needle):
    for i, l in enumerate(open(os.path.join(HERE, script)), 1):
        if needle in l:
            return i
    fail("no %r in %s" % (needle, script))


def torch_job(script, args=(), extra=(), nproc=2):
    if not TORCH_PY:
        print("no python with torch: skipped")
        sys.exit(77)
    out = os.path.join(TMP, "audit.json")
    if os.path.exists(out):
        os.unlink(out)
    rc, so, se = run(["--audit", "--log-dir", os.path.join(TMP, "logs"), "--audit-output", out] + list(extra) +
                     [script] + list(args), {"PYTHON_EXEC": TORCH_PY}, nproc=nproc)
    return rc, so, se, report_of(out, rc, se)


def report_of(path, rc, se):
    body = open(path).read() if os.path.exists(path) else ""
    try:
        return json.loads(body)
    except ValueError:
        return fail("no JSON report in %s (rc %d)\n%s" % (path, rc, se[-3000:]))


def site_line(f):
    return int(f["site"].rsplit(":", 1)[1]) if f["site"] else 0


def found(rep):
    return sorted((f["mechanism"], tuple(f["ranks"]), site_line(f)) for f in rep["findings"])


def case_options():
    marker = os.path.join(TMP, "started")
    job = ["--no-python", "touch", marker]
    sub = os.path.join(TMP, "sub")
    os.mkdir(sub)
    cases = [
        (["--audit-output", os.path.join(TMP, "no", "such", "r.json")], "'%s'" % os.path.join(TMP, "no", "such", "r.json")),
        (["--audit-output", sub], "--audit-output '%s': is a folder" % sub),
        (["--audit-output", sub + "/"], "--audit-output '%s/'" % sub),
        (["--audit-output", "/proc/version"], "--audit-output '/proc/version'"),
        (["--audit-output", "/dev/full"], "--audit-output '/dev/full': is a character device"),
        (["--audit-output", ""], "--audit-output ''"),
        (["--audit-layout", "4294967298x1x1"], "--audit-layout '4294967298x1x1'"),
        (["--audit-layout", "2x+1x1"], "--audit-layout '2x+1x1'"),
        (["--audit-layout", "2x 1x1"], "--audit-layout '2x 1x1'"),
        (["--audit-layout", "02x1x1x"], "--audit-layout '02x1x1x'"),
        # the static rendezvous fixes the world: 2 ranks, not 4
        (["--audit-layout", "2x1x2"], "--audit-layout '2x1x2' is 4 ranks; the job's world is 2"),
        (["--audit-hang", "-1"], "--audit-hang '-1'"),
        (["--audit-hang", "0.01"], "--audit-hang '0.01'"),
        (["--audit-format", "xml"], "--audit-format 'xml'"),
    ]
    for args, msg in cases:
        rc, so, se = run(["--audit"] + args + job)
        lines = [l for l in se.splitlines() if l.strip()]
        if rc != 2 or len(lines) != 1 or msg not in lines[0]:
            fail("%s: rc %d, stderr %r (expected one line with %r, exit 2)" % (args, rc, se, msg))
        if os.path.exists(marker):
            fail("%s: the job ran before the option was refused" % args)
        if sorted(os.listdir(TMP)) != ["sub"] or os.listdir(sub) or os.path.exists(os.path.join(TMP, "no")):
            fail("%s: left behind: %s %s" % (args, os.listdir(TMP), os.listdir(sub)))
    for opt in (["--audit-keep"], ["--audit-hang", "0"], ["--audit-format", "text"]):
        rc, so, se = run(opt + job)
        if rc != 2 or "%s needs --audit" % opt[0] not in se or os.path.exists(marker):
            fail("%s without --audit: rc %d %r" % (opt, rc, se))
    # a creatable file is not created before the job (the check leaves
    # nothing); the report is written after it
    out = os.path.join(sub, "r.json")
    rc, so, se = run(["--audit", "--audit-output", out, "--audit-hang", "0", "--no-python", "sh", "-c",
                      'test ! -e "$0" && ls -A "$1"', out, sub])
    if rc not in (0, 5) or so.strip() or not os.path.exists(out):
        fail("creatable output: rc %d, stdout %r (the folder during the job), %s\n%s" % (rc, so, os.listdir(sub), se))
    json.load(open(out))
    if sorted(os.listdir(sub)) != ["r.json"]:
        fail("left in the output's folder: %s" % os.listdir(sub))


def case_records():
    """launcher.jsonl: each worker's start and exit as dptp-run saw them;
    where the records live and when they go."""
    # --log-dir DIR: the run's audit folder, kept; a worker killed by a signal
    logs = os.path.join(TMP, "logs")
    rc, so, se = run(["--audit", "--log-dir", logs, "--audit-hang", "0", "--no-python", "sh", "-c",
                      'if [ "$RANK" = 1 ]; then kill -SEGV $$$$; fi; exec sleep 30'])
    adir = re.search(r"records in (\S+)", se)
    if rc != 1 or not adir or not adir.group(1).startswith(logs + "/"):
        fail("--log-dir: rc %d\n%s" % (rc, se))
    recs = [json.loads(l) for l in open(os.path.join(adir.group(1), "launcher.jsonl"))]
    starts = sorted((r["rank"], r["local_rank"], r["att"]) for r in recs if r["k"] == "wstart")
    exits = {r["rank"]: r for r in recs if r["k"] == "wexit"}
    if starts != [(0, 0, 0), (1, 1, 0)] or sorted(exits) != [0, 1]:
        fail("launcher.jsonl: %s" % recs)
    pids = {r["rank"]: r["pid"] for r in recs if r["k"] == "wstart"}
    # rank 0 is stopped by the launcher after rank 1's crash
    e0, e1 = exits[0], exits[1]
    if e1["sig"] != 11 or e1["code"] is not None or e1["pid"] != pids[1] or e0["pid"] != pids[0]:
        fail("wexit: %s" % recs)
    if e0["sig"] not in (15, 9) or any(not isinstance(r["t"], float) for r in recs):
        fail("wexit of rank 0: %s" % recs)
    # no --log-dir: a temporary folder, removed after the report
    rc, so, se = run(["--audit", "--audit-hang", "0", "--no-python", "true"])
    m = re.search(r"records were in (\S+) \(removed", se)
    if not m or os.path.exists(m.group(1)) or [n for n in os.listdir(TMP) if n.startswith("dptp_audit_")]:
        fail("no --log-dir: rc %d, %s\n%s" % (rc, os.listdir(TMP), se))
    shutil.rmtree(os.path.join(TMP, logs), ignore_errors=True)
    left = [n for n in os.listdir(TMP) if n.startswith("torchelastic_")]
    for n in left:
        shutil.rmtree(os.path.join(TMP, n), ignore_errors=True)
    # --audit-keep: it stays, and says where; --audit-format alone: the report on stdout
    rc, so, se = run(["--audit", "--audit-keep", "--audit-hang", "0", "--audit-format", "json", "--no-python", "true"])
    m = re.search(r"records in (\S+)", se)
    if not m or not os.path.exists(os.path.join(m.group(1), "launcher.jsonl")):
        fail("--audit-keep: rc %d\n%s" % (rc, se))
    rep = json.loads(so)
    if rep["records_dir"] != m.group(1):
        fail("--audit-format json on stdout: %s" % so)
    shutil.rmtree(m.group(1))
    # --audit-output -: the report on stdout too
    rc, so, se = run(["--audit", "--audit-hang", "0", "--audit-output", "-", "--audit-format", "junit", "--no-python",
                      "true"])
    if not so.startswith("<?xml") or "<testsuites" not in so:
        fail("--audit-output -: rc %d, stdout %r" % (rc, so))
    # a death signal while the launcher waits for its rendezvous (no report
    # follows): the temporary folder goes all the same
    env = dict(os.environ, TMPDIR=TMP)
    p = subprocess.Popen([RUN, "--audit", "--nnodes", "2", "--node-rank", "0", "--master-port", str(free_port()),
                          "--no-python", "true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if [n for n in os.listdir(TMP) if n.startswith("dptp_audit_")] or p.poll() is not None:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    left = [n for n in os.listdir(TMP) if n.startswith("dptp_audit_")]
    if left:
        fail("SIGTERM during the rendezvous left %s" % left)


def case_static():
    """A static binary: no recorder loads; the audit says incomplete (exit 5),
    never pass, in every format."""
    exe = os.path.abspath(sys.argv[4])
    for fmt in ("json", "text", "junit"):
        out = os.path.join(TMP, "r." + fmt)
        rc, so, se = run(["--audit", "--log-dir", os.path.join(TMP, "logs"), "--audit-output", out,
                          "--audit-format", fmt, "--no-python", exe])
        body = open(out).read() if os.path.exists(out) else ""
        if rc != 5 or "INCOMPLETE" not in se or "static worker" not in so:
            fail("%s: rc %d (expected 5)\n%s\n%s" % (fmt, rc, so, se))
        if fmt == "json":
            rep = json.loads(body)
            gaps = rep.get("gaps", []) + [g for w in rep.get("worlds", []) for g in w.get("gaps", [])]
            if rep["status"] != "incomplete" or sorted({g["rank"] for g in gaps}) != [0, 1] or \
                    '"pass"' in json.dumps(rep.get("status")):
                fail("json: %s" % body)
        elif fmt == "text":
            if "INCOMPLETE" not in body or re.search(r"\bpass\b", body.split("\n", 1)[0]):
                fail("text:\n" + body)
        else:
            errors = [e for e in ElementTree.fromstring(body).iter("error")]
            if not errors or "<failure" in body or "nothing was recorded" not in body and "rank 0" not in body:
                fail("junit:\n" + body)


def case_slow():
    rc, so, se, rep = torch_job("harm_slow.py", ["6"], ["--audit-hang", "3"])
    if rc != 0 or "no rank progressed" in se or rep["hung"] or rep["findings"]:
        fail("a slow rank outside any collective was taken for a hang: rc %d\n%s" % (rc, se[-3000:]))
    if sorted(l for l in so.splitlines() if l.startswith("done")) != ["done 0", "done 1"]:
        fail("the job did not finish:\n" + so)


def case_slowhang():
    rc, so, se, rep = torch_job("harm_slow.py", ["6", "hang"], ["--audit-hang", "3"])
    line = line_of("harm_slow.py", "HANG-LINE")
    if rc == 0 or not rep["hung"] or "no rank progressed for 3 s" not in se:
        fail("the hang was not ended: rc %d\n%s" % (rc, se[-3000:]))
    ps = [f for f in rep["findings"] if f["mechanism"] == "P"]
    if not ps or not all(f["site"].endswith(":%d" % line) for f in ps) or 1 not in ps[0]["ranks"]:
        fail("findings %s, expected P naming rank 1 at line %d" % (found(rep), line))
    if "done" in so:
        fail("the checkpoint was ended as a hang:\n" + so)


def hang_records():
    """the launcher's hang records of the last job"""
    out = []
    for root, _, names in os.walk(os.path.join(TMP, "logs")):
        if "launcher.jsonl" in names:
            out += [r for r in map(json.loads, open(os.path.join(root, "launcher.jsonl"))) if r["k"] == "hang"]
    return out


def case_boundhang():
    """No --audit-hang: the bound is the process group's timeout (6 s in
    init_process_group), not a default of the watch: a hang on groups with a
    longer timeout of their own is ended by the watch with that bound."""
    shutil.rmtree(os.path.join(TMP, "logs"), ignore_errors=True)
    rc, so, se, rep = torch_job("harm_bound.py", ["hang"])
    line = line_of("harm_bound.py", "HANG-LINE")
    hangs = hang_records()
    if rc == 0 or not rep["hung"] or "no rank progressed for 6 s" not in se or [h["bound"] for h in hangs] != [6]:
        fail("the hang was not ended with the process group's 6 s: rc %d, hang records %s\n%s" % (rc, hangs, se[-3000:]))
    ps = [f for f in rep["findings"] if f["mechanism"] == "P"]
    if not ps or not all(site_line(f) == line for f in ps) or 1 not in ps[0]["ranks"]:
        fail("findings %s, expected P naming rank 1 at line %d" % (found(rep), line))
    if "done" in so:
        fail("a rank finished:\n" + so)


def case_boundslow():
    """No --audit-hang, the process group's 6 s bound: a rank computing
    outside any collective for longer than it is not a hang."""
    shutil.rmtree(os.path.join(TMP, "logs"), ignore_errors=True)
    rc, so, se, rep = torch_job("harm_bound.py", ["slow"])
    if rc != 0 or "no rank progressed" in se or rep["hung"] or rep["findings"] or hang_records():
        fail("a slow rank outside any collective was taken for a hang: rc %d\n%s" % (rc, se[-3000:]))
    if sorted(l for l in so.splitlines() if l.startswith("done")) != ["done 0", "done 1"]:
        fail("the job did not finish:\n" + so)


def case_hangoff():
    rc, so, se, rep = torch_job("harm_slow.py", ["4"], ["--audit-hang", "0"])
    if rc != 0 or "no rank progressed" in se or rep["hung"]:
        fail("--audit-hang 0: rc %d\n%s" % (rc, se[-3000:]))


def case_exit():
    rc, so, se, rep = torch_job("harm_exit.py", [], ["--audit-hang", "5"])
    line = line_of("harm_exit.py", "BARRIER-LINE")
    ps = [f for f in rep["findings"] if f["mechanism"] == "P" and f["site"].endswith(":%d" % line)]
    if not ps or rc == 0:
        fail("os._exit before a barrier: rc %d, findings %s (expected P at line %d)\n%s" %
             (rc, found(rep), line, se[-3000:]))


def case_crash():
    rc, so, se, rep = torch_job("harm_crash.py", [], ["--audit-hang", "5"])
    crashed = [e for e in rep.get("exits", []) if e["rank"] == 1 and e["sig"] == 11]
    if rc != 1 or not crashed or not re.search(r"rank 1 .*SIGSEGV", se):
        fail("the crashed rank is not named: rc %d, exits %s\n%s" % (rc, rep.get("exits"), se[-3000:]))


def case_restart():
    rc, so, se, rep = torch_job("harm_restart.py", [], ["--max-restarts", "1"])
    line = line_of("harm_restart.py", "BCAST-LINE")
    if rep["job_status"] != 0 or rc != 1:
        fail("rc %d, job_status %s (the job succeeds on its restart; the finding makes it 1)\n%s" %
             (rc, rep["job_status"], se[-3000:]))
    if rep.get("attempts") != 2 or ("R", (1,), line) not in found(rep):
        fail("the report does not cover attempt 0: attempts %s, findings %s" % (rep.get("attempts"), found(rep)))


def case_worlds():
    """Two worlds the one worker starts itself: reported world by world, the
    finding names its world."""
    a, b = free_port(), free_port()
    rc, so, se, rep = torch_job("harm_worlds.py", [str(a), str(b)], ["--audit-hang", "10"], nproc=1)
    line = line_of("harm_worlds.py", "BUG-LINE")
    ids = {w["id"]: w["status"] for w in rep["worlds"]}
    wa, wb = "127.0.0.1:%d" % a, "127.0.0.1:%d" % b
    if ids.get(wa) != "pass" or ids.get(wb) != "fail":
        fail("worlds %s, expected %s pass and %s fail\n%s" % (ids, wa, wb, se[-3000:]))
    got = [(f["mechanism"], f["world"], f["ranks"], site_line(f)) for f in rep["findings"]]
    if got != [("R", wb, [1], line)] or rc != 1:
        fail("rc %d, findings %s, expected R in world %s at line %d" % (rc, got, wb, line))
    if "world %s" % wa not in se or "world %s" % wb not in se:
        fail("the text does not name both worlds:\n" + se[-3000:])


try:
    {"options": case_options, "records": case_records, "static": case_static, "slow": case_slow,
     "slowhang": case_slowhang, "hangoff": case_hangoff, "exit": case_exit, "crash": case_crash,
     "restart": case_restart, "worlds": case_worlds, "boundhang": case_boundhang, "boundslow": case_boundslow}[CASE]()
    print("ok")
finally:
    shutil.rmtree(TMP, ignore_errors=True)
