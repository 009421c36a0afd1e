#!/usr/bin/env python3
"""dptp-run --audit records every Python process of the job, whoever starts
it: workers_e2e.py DPTP_RUN TORCH_PYTHON CASE (real torch on gloo; skipped
with 77 where TORCH_PYTHON is '').

Cases: spawn (torch.multiprocessing.spawn, DP2TP2, R bug), fork
(multiprocessing fork, G bug), subproc (subprocess workers with their own
RANK/WORLD_SIZE/MASTER_*, healthy), fds (closerange + open, 30 destroyed
groups), exec (sh -c, exec of another Python, os._exit), pth (a .pth that
imports torch.distributed first), isolated (python -I: incomplete), fc
(torch 2.x's functional collectives; skipped on torch without them), hygiene (sys.modules, tracebacks, exit
status as alone), view (tracebacks the program formats, warnings' file:line, as alone). The checks read the record files (a<att>.p<pid>.py.jsonl)
and the audit's report (findings by world and replica, no gaps)."""
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RUN, TORCH_PY, CASE = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
RECDIR = os.path.join(os.path.dirname(RUN), "audit")
TMP = tempfile.mkdtemp(prefix="dptp_workers_e2e_")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(nproc, args, audit=True, env_extra=None, timeout=200):
    """Runs dptp-run; returns (rc, stdout, stderr, {pid: [records]}, the
    audit's JSON report or None)."""
    logs = tempfile.mkdtemp(dir=TMP)
    env = dict(os.environ, PYTHON_EXEC=TORCH_PY, AUDIT_PORT=str(free_port()))
    env.pop("LD_PRELOAD", None)
    env.update(env_extra or {})
    cmd = [RUN, "--master-port", str(free_port()), "--nproc-per-node", str(nproc), "--log-dir", logs]
    if audit:
        cmd += ["--audit", "--audit-output", os.path.join(logs, "report.json")]
    p = subprocess.run(cmd + args, cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    recs = {}
    for f in glob.glob(os.path.join(logs, "**", "a*.p*.py.jsonl"), recursive=True):
        m = re.match(r"a(\d+)\.p(\d+)\.py\.jsonl$", os.path.basename(f))
        if not m:
            fail("a record file named %s" % f)
        try:
            recs[int(m.group(2))] = [json.loads(l) for l in open(f)]
        except ValueError as e:
            fail("%s: not JSON lines (%s)" % (f, e))
    rep = None
    if audit:
        try:
            rep = json.load(open(os.path.join(logs, "report.json")))
        except (OSError, ValueError) as e:
            fail("no JSON report (%s); rc %d\n%s" % (e, p.returncode, p.stderr[-3000:]))
    return p.returncode, p.stdout, p.stderr, recs, rep


def verdict(rep, what, status, findings, worlds_ids):
    """The report: its status, no gaps, its worlds, and its findings as
    (mechanism, world, replicas, line of the site)."""
    got = sorted((f["mechanism"], f["world"], tuple(f["replicas"]), int(f["site"].rsplit(":", 1)[1]))
                 for f in rep["findings"])
    gaps = rep["gaps"] + [g for w in rep["worlds"] for g in w["gaps"]]
    if rep["status"] != status or got != sorted(findings) or gaps or \
            sorted(w["id"] for w in rep["worlds"] if w["id"]) != sorted(worlds_ids):
        fail("%s: report %s, findings %s (expected %s %s), gaps %s, worlds %s" % (
            what, rep["status"], got, status, findings, gaps, [w["id"] for w in rep["worlds"]]))


def need_torch():
    if not TORCH_PY:
        print("no python with torch: skipped")
        sys.exit(77)


def check_files(recs, what):
    """Each file: a hello first, each image's end counts its records."""
    for pid, rs in recs.items():
        if not rs or rs[0]["k"] != "hello":
            fail("%s: pid %d's file does not start with a hello: %s" % (what, pid, rs[:2]))
        for r in rs:
            if r["k"] == "hello" and (r["pid"] != pid or r["rec"] != "py" or "flags" not in r or "pre" not in r
                                      or "ppid" not in r or "worker" not in r):
                fail("%s: hello %s in pid %d's file" % (what, r, pid))
        start = 0
        for i, r in enumerate(rs):
            if r["k"] == "hello":
                start = i
            if r["k"] == "end" and (r["records"] != i - start or r["lost"] != 0):
                fail("%s: pid %d: end %s after %d records" % (what, pid, r, i - start))


def worlds(recs):
    """pid -> its world record, for the processes that joined one."""
    out = {}
    for pid, rs in recs.items():
        w = [r for r in rs if r["k"] == "world"]
        if len(w) > 1:
            fail("pid %d joined %d worlds: %s" % (pid, len(w), w))
        if w:
            out[pid] = w[0]
    return out


def check_world_of_four(recs, what, port):
    """Four processes, none a worker, joined one world of four, each with
    its own rank; each ended; every recorded call returned."""
    check_files(recs, what)
    ws = worlds(recs)
    want_id = "127.0.0.1:%s" % port
    if sorted(w["rank"] for w in ws.values()) != [0, 1, 2, 3] or \
            any((w["id"], w["size"], w["backend"], w["timeout"]) != (want_id, 4, "gloo", 1800) for w in ws.values()):
        fail("%s: world records %s, expected ranks 0..3 of %s" % (what, sorted(ws.values(), key=str), want_id))
    for pid in ws:
        rs = recs[pid]
        if rs[0]["worker"] or rs[-1]["k"] != "end":
            fail("%s: pid %d: hello %s, last record %s" % (what, pid, rs[0], rs[-1]))
        ops = [(r["g"], r["gn"], r["seq"]) for r in rs if r["k"] == "op"]
        done = [(r["g"], r["gn"], r["seq"]) for r in rs if r["k"] == "done"]
        if not ops or ops != done:
            fail("%s: pid %d: ops %s, done %s" % (what, pid, ops, done))
    workers = [pid for pid, rs in recs.items() if rs[0]["worker"]]
    if len(workers) != 1 or workers[0] in ws:
        fail("%s: the dptp-run worker's file: %s" % (what, workers))
    return ws


def case_spawn():
    need_torch()
    port = str(free_port())
    rc, so, se, recs, rep = job(1, ["py_spawn.py"], env_extra={"AUDIT_PORT": port})
    if rc != 1:  # the finding's status; the job itself exits 0
        fail("spawn: rc %d\n%s" % (rc, se[-3000:]))
    ws = check_world_of_four(recs, "spawn", port)
    wid = "127.0.0.1:" + port
    verdict(rep, "spawn", "fail", [("R", wid, (1,), line_of("py_spawn.py", "broadcast_object_list("))], [wid])
    # replica 1 (ranks 2, 3) passed the group-local root 0 as the global src
    for pid, w in ws.items():
        bol = [r for r in recs[pid] if r["k"] == "op" and r["op"] == "broadcast_object_list"]
        tp = [w["rank"] // 2 * 2, w["rank"] // 2 * 2 + 1]
        if len(bol) != 1 or bol[0]["g"] != tp or bol[0].get("src") != 0 or \
                not bol[0]["site"].endswith("py_spawn.py:%d" % line_of("py_spawn.py", "broadcast_object_list(")):
            fail("spawn: rank %d: %s" % (w["rank"], bol))
        err = [r for r in recs[pid] if r["k"] == "done" and r.get("err")]
        if (w["rank"] >= 2) != bool(err):
            fail("spawn: rank %d of %s: done with err %s" % (w["rank"], port, err))


def case_fork():
    need_torch()
    port = str(free_port())
    rc, so, se, recs, rep = job(1, ["py_fork.py"], env_extra={"AUDIT_PORT": port})
    if rc != 1:
        fail("fork: rc %d\n%s" % (rc, se[-3000:]))
    ws = check_world_of_four(recs, "fork", port)
    wid = "127.0.0.1:" + port
    verdict(rep, "fork", "fail", [("G", wid, (1,), line_of("py_fork.py", "dist.broadcast(buf[idx]"))], [wid])
    for pid, w in ws.items():
        rs = recs[pid]
        # the children inherit the worker's RANK=0: their identity is the world's
        if rs[0]["rank"] != 0 or rs[-1]["how"] != "_exit" or rs[-1]["code"] != 0:
            fail("fork: pid %d: hello %s, end %s" % (pid, rs[0], rs[-1]))
        bc = [(r["g"], r["gn"], r["src"]) for r in rs if r["k"] == "op" and r["op"] == "broadcast"]
        if bc != [([0, 1, 2, 3], 1, 0), ([0, 1, 2, 3], 1, 1)]:
            fail("fork: rank %d broadcasts %s" % (w["rank"], bc))


def case_subproc():
    need_torch()
    port = str(free_port())
    rc, so, se, recs, rep = job(1, ["py_subproc.py"], env_extra={"AUDIT_PORT": port})
    if rc != 0:
        fail("subproc: rc %d\n%s" % (rc, se[-3000:]))
    ws = check_world_of_four(recs, "subproc", port)
    verdict(rep, "subproc", "pass", [], ["127.0.0.1:" + port])
    for pid, w in ws.items():
        if recs[pid][0]["rank"] != w["rank"] or recs[pid][-1]["how"] != "atexit":
            fail("subproc: pid %d: %s, %s" % (pid, recs[pid][0], w))


def line_of(script, needle):
    for i, l in enumerate(open(os.path.join(HERE, script)), 1):
        if needle in l:
            return i
    fail("no %r in %s" % (needle, script))


def counts(so):
    # the two ranks' lines may come interleaved on one line
    out = sorted((json.loads(m) for m in re.findall(r"COUNTS (\{[^}]*\})", so)), key=lambda c: c["rank"])
    if len(out) != 2:
        fail("fds: counts %s\n%s" % (out, so))
    return out


def case_fds():
    need_torch()
    alone = os.path.join(TMP, "alone")
    os.mkdir(alone)
    rc, so, se, _, _ = job(2, ["py_fds.py", alone], audit=False)
    if rc != 0:
        fail("fds alone: rc %d\n%s" % (rc, se[-3000:]))
    c_alone = counts(so)
    audited = os.path.join(TMP, "audited")
    os.mkdir(audited)
    rc, so, se, recs, rep = job(2, ["py_fds.py", audited])
    if rc != 0:
        fail("fds audited: rc %d\n%s" % (rc, se[-3000:]))
    verdict(rep, "fds", "pass", [], [next(iter(worlds(recs).values()))["id"]])
    c_audit = counts(so)
    for a, b in zip(c_alone, c_audit):
        # one record descriptor per recorder (Python, C), one more of slack
        # (30 groups kept alive made 95 threads and 74 fds of 5 and 14)
        if b["threads"] > a["threads"] + 1 or b["fds"] > a["fds"] + 3 or \
                b["world_freed"] != a["world_freed"]:
            fail("fds: alone %s, audited %s" % (c_alone, c_audit))
    for r in range(2):
        own = open(os.path.join(audited, "own%d.txt" % r)).read()
        if own != "the program's own line\n":  # no record of either recorder
            fail("fds: rank %d's own file holds %r" % (r, own))
    check_files(recs, "fds")
    ws = worlds(recs)
    for pid, w in ws.items():
        ops = [r for r in recs[pid] if r["k"] == "op" and r["op"] == "all_reduce"]
        if len(ops) != 31 or recs[pid][-1]["k"] != "end":
            fail("fds: rank %d: %d all_reduce recorded, last %s" % (w["rank"], len(ops), recs[pid][-1]))
    if sorted(w["rank"] for w in ws.values()) != [0, 1]:
        fail("fds: worlds %s" % ws)


def case_exec():
    need_torch()
    rc, so, se, recs, rep = job(2, ["--no-python", "sh", "-c", "%s py_exec.py; true" % TORCH_PY])
    if rc != 0:
        fail("exec: rc %d\n%s" % (rc, se[-3000:]))
    verdict(rep, "exec", "pass", [], [next(iter(worlds(recs).values()))["id"]])
    check_files(recs, "exec")
    ws = worlds(recs)
    if sorted(w["rank"] for w in ws.values()) != [0, 1] or len(recs) != 2:
        fail("exec: files %s, worlds %s" % (sorted(recs), ws))
    for pid, w in ws.items():
        rs = recs[pid]
        kinds = [r["k"] for r in rs]
        # the first image execs (no end), the second joins the world
        if kinds.count("hello") != 2 or kinds.index("world") < kinds.index("hello", 1) or \
                any(r["worker"] for r in rs if r["k"] == "hello"):
            fail("exec: pid %d: %s" % (pid, kinds))
        how = "_exit" if w["rank"] == 1 else "atexit"
        if rs[-1]["k"] != "end" or rs[-1]["how"] != how or kinds.count("end") != 1:
            fail("exec: rank %d ended %s, expected %s" % (w["rank"], rs[-1], how))


def case_pth():
    need_torch()
    base = os.path.join(TMP, "userbase")
    if subprocess.run([TORCH_PY, "-c", "import site, sys; sys.exit(site.ENABLE_USER_SITE is not True)"],
                      env=dict(os.environ, PYTHONUSERBASE=base)).returncode:
        print("no user site-packages in this Python (a virtualenv): no .pth to put there: skipped")
        sys.exit(77)
    site = subprocess.run([TORCH_PY, "-c", "import site, sys; sys.stdout.write(site.getusersitepackages())"],
                          env=dict(os.environ, PYTHONUSERBASE=base), capture_output=True, text=True).stdout
    tdir = subprocess.run([TORCH_PY, "-c", "import os, sys, torch; sys.stdout.write(os.path.dirname("
                           "os.path.dirname(torch.__file__)))"], capture_output=True, text=True).stdout
    os.makedirs(site)
    with open(os.path.join(site, "dptp_test_pre.pth"), "w") as f:  # as if beside torch
        f.write("import sys; sys.path.append(%r); import torch.distributed\n" % tdir)
    rc, so, se, recs, rep = job(2, ["py_pth.py"], env_extra={"PYTHONUSERBASE": base})
    if rc != 0:
        fail("pth: rc %d\n%s" % (rc, se[-3000:]))
    verdict(rep, "pth", "pass", [], [next(iter(worlds(recs).values()))["id"]])
    check_files(recs, "pth")
    if len(recs) != 2:
        fail("pth: files %s" % recs)
    for pid, rs in recs.items():
        ops = [(r["op"], r["seq"]) for r in rs if r["k"] == "op"]
        if not rs[0]["pre"] or ops != [("all_reduce", 1), ("broadcast", 2), ("barrier", 3)]:
            fail("pth: pid %d: hello %s, ops %s" % (pid, rs[0], ops))


def case_fc():
    """Functional collectives (torch 2.x; skipped where torch has none)."""
    need_torch()
    if subprocess.run([TORCH_PY, "-c", "import torch.distributed._functional_collectives, "
                       "torch.distributed.device_mesh"], capture_output=True).returncode:
        print("torch without functional collectives: skipped")
        sys.exit(77)
    rc, so, se, recs, rep = job(2, ["py_fc.py"])
    if rc != 0:
        fail("fc: rc %d\n%s" % (rc, se[-3000:]))
    check_files(recs, "fc")
    ws = worlds(recs)
    verdict(rep, "fc", "pass", [], [next(iter(ws.values()))["id"]])
    want = [("all_reduce", line_of("py_fc.py", "a = funcol")), ("all_reduce", line_of("py_fc.py", "b = funcol")),
            ("all_gather_into_tensor", line_of("py_fc.py", "c = funcol")),
            ("broadcast", line_of("py_fc.py", "d = funcol"))]
    for pid in ws:
        fcs = [r for r in recs[pid] if r["k"] == "op" and r.get("fc")]
        if [(r["op"], int(r["site"].rsplit(":", 1)[1])) for r in fcs] != want or \
                any(r["g"] != [0, 1] for r in fcs) or [r.get("src") for r in fcs][3] != 0:
            fail("fc: pid %d: %s" % (pid, fcs))
        done = [(r["g"], r["gn"], r["seq"]) for r in recs[pid] if r["k"] == "done"]
        if any((r["g"], r["gn"], r["seq"]) not in done for r in fcs):
            fail("fc: pid %d: ops without done: %s %s" % (pid, fcs, done))


def case_isolated():
    """python -I: no recorder can load into it; the job is incomplete, not a pass."""
    need_torch()
    rc, so, se, recs, rep = job(2, ["--no-python", TORCH_PY, "-I", "py_pth.py"])
    gaps = rep["gaps"] + [g for w in rep["worlds"] for g in w["gaps"]]
    if rc != 5 or recs or rep["status"] != "incomplete" or rep["findings"] or \
            sorted(g["rank"] for g in gaps) != [0, 1] or not all(g["pid"] > 0 for g in gaps):
        fail("isolated: rc %d, Python records %s, report %s, gaps %s\n%s" % (
            rc, sorted(recs), rep["status"], gaps, se[-2000:]))


def case_hygiene():
    need_torch()
    adir = os.path.join(TMP, "rec")
    os.mkdir(adir)
    base = dict(os.environ)
    for v in ("DPTP_AUDIT_DIR", "DPTP_AUDIT_PPID", "LD_PRELOAD"):
        base.pop(v, None)
    rec = dict(base, DPTP_AUDIT_DIR=adir, DPTP_AUDIT_PPID=str(os.getpid()),
               PYTHONPATH=RECDIR + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else ""))
    prog = [TORCH_PY, os.path.join(HERE, "py_hygiene.py")]
    a = subprocess.run(prog, env=base, capture_output=True, text=True, timeout=120)
    b = subprocess.run(prog, env=rec, capture_output=True, text=True, timeout=120)
    mods_a = set(eval(a.stdout.splitlines()[0]))
    mods_b = set(eval(b.stdout.splitlines()[0]))
    if mods_b - mods_a != {"dptp_audit_rec"} or mods_a - mods_b:
        fail("hygiene: sys.modules gains %s, loses %s" % (sorted(mods_b - mods_a), sorted(mods_a - mods_b)))
    if a.returncode != b.returncode or a.returncode == 0 or a.stderr != b.stderr:
        fail("hygiene: alone rc %d:\n%s\nrecorded rc %d:\n%s" % (a.returncode, a.stderr, b.returncode, b.stderr))
    for code in ("import sys; print(sorted(sys.modules))", "import os; print('x', flush=True); os._exit(7)"):
        a = subprocess.run([TORCH_PY, "-c", code], env=base, capture_output=True, text=True, timeout=60)
        b = subprocess.run([TORCH_PY, "-c", code], env=rec, capture_output=True, text=True, timeout=60)
        out_b = b.stdout.replace(", 'dptp_audit_rec'", "")
        if (a.returncode, a.stdout, a.stderr) != (b.returncode, out_b, b.stderr):
            fail("hygiene: %r alone %s, recorded %s" % (code, (a.returncode, a.stdout, a.stderr), (b.returncode, b.stdout, b.stderr)))
    ends = sorted(((r["how"], r["code"]) for f in glob.glob(os.path.join(adir, "a0.p*.py.jsonl"))
                   for r in map(json.loads, open(f)) if r["k"] == "end"), key=str)
    if ends != [("_exit", 7), ("atexit", 1), ("atexit", None)]:
        fail("hygiene: end records %s" % ends)


def case_view():
    """Nothing of the recorder in the program's view (issue 30 item 2): the
    tracebacks a program formats itself of errors raised inside wrapped calls
    and the file:line of warnings torch-style code raises for its caller
    (stacklevel) read as alone."""
    need_torch()
    rc, alone, se, _, _ = job(1, ["py_view.py"], audit=False)
    line = next(i for i, l in enumerate(open(os.path.join(HERE, "py_view.py")), 1) if "[Noisy()]" in l)
    if rc != 0 or "py_view.py:%d pickled" % line not in alone or alone.count("Traceback") != 4:
        fail("view alone: rc %d\n%s\n%s" % (rc, alone, se[-3000:]))
    rc, audited, se, recs, rep = job(1, ["py_view.py"])
    if rc != 0:
        fail("view audited: rc %d\n%s" % (rc, se[-3000:]))
    if audited != alone:
        fail("view: alone\n%s\naudited\n%s" % (alone, audited))
    verdict(rep, "view", "pass", [], [w["id"] for w in worlds(recs).values()])
    ops = [r["op"] for rs in recs.values() for r in rs if r["k"] == "op"]
    if ops != ["all_reduce", "broadcast_object_list", "barrier"]:
        fail("view: the recorder did not record the calls: %s" % ops)


try:
    {"view": case_view, "spawn": case_spawn, "fork": case_fork, "subproc": case_subproc, "fds": case_fds, "exec": case_exec,
     "pth": case_pth, "isolated": case_isolated, "fc": case_fc, "hygiene": case_hygiene}[CASE]()
    print("ok")
finally:
    shutil.rmtree(TMP, ignore_errors=True)
