#!/usr/bin/env python3
"""dptp-run --audit end to end: audit_e2e.py DPTP_RUN TORCH_PYTHON CASE.

Cases: healthy, bugs, hang (4 ranks, real torch on gloo: skip with 77
where TORCH_PYTHON is ''), nonpython, subproc, options (no torch)."""
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
TMP = tempfile.mkdtemp(prefix="dptp_audit_e2e_")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, env_extra=None, timeout=180):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(env_extra or {})
    if args and args[0].startswith("--nproc"):  # tests run side by side: a free store port each
        args = ["--master-port", str(free_port())] + args
    p = subprocess.run([RUN] + args, cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_job(script, extra=()):
    if not TORCH_PY:
        print("no python with torch: skipped")
        sys.exit(77)
    out = os.path.join(TMP, "audit.json")
    rc, so, se = run(["--nproc-per-node", "4", "--audit", "--log-dir", os.path.join(TMP, "logs"),
                      "--audit-output", out] + list(extra) + [script],
                     {"PYTHON_EXEC": TORCH_PY,
                      "AUDIT_PORT": str(free_port())})
    try:
        rep = json.load(open(out))
    except (OSError, ValueError) as e:
        fail("no JSON report (%s); rc %d\n%s" % (e, rc, se[-3000:]))
    return rc, so, se, rep


def found(rep):
    """(mechanism, replicas, line of the site) of every finding."""
    return sorted((f["mechanism"], tuple(f["replicas"]), int(f["site"].rsplit(":", 1)[1]) if f["site"] else 0)
                  for f in rep["findings"])


def line_of(script, needle):
    for i, l in enumerate(open(os.path.join(HERE, script)), 1):
        if needle in l:
            return i
    fail("no %r in %s" % (needle, script))


def check_layout(rep):
    l = rep["layout"]
    if (l["world"], l["dp"], l["pp"], l["tp"], l["known"]) != (4, 2, 1, 2, True):
        fail("layout %s, expected DP2TP2 inferred" % l)


def no_shm_left(prefix):
    left = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    if left:
        fail("left in /dev/shm: %s" % left)


def case_healthy():
    rc, so, se, rep = torch_job("healthy.py")
    check_layout(rep)
    if rep["findings"] or rc != 0:
        fail("healthy program: rc %d, findings %s\n%s" % (rc, rep["findings"], se[-3000:]))
    if rep["ranks_recorded"] != 4 or "DP replica 1 (ranks 2,3): pass" not in se:
        fail("report: %s\n%s" % (rep, se[-2000:]))
    no_shm_left("dptp_audit_")


def case_bugs():
    rc, so, se, rep = torch_job("bugs.py")
    check_layout(rep)
    want = sorted([
        ("R", (1,), line_of("bugs.py", "dist.broadcast_object_list(box, src=root")),
        ("I", (0, 1), line_of("bugs.py", 'sock.bind("\\0/tmp/mcastmem')),  # TP rank 0's seeded name
        ("I", (0, 1), line_of("bugs.py", 'sock.bind("\\0/tmp/mcastmem')),  # TP rank 1's
        ("C", (0, 1), line_of("bugs.py", "srv.bind(")),
        ("I", (0, 1), line_of("bugs.py", 'shared_memory.SharedMemory(name="dptp_audit_moe')),
        ("D", (1,), line_of("bugs.py", "torch.cuda.set_device(")),
        ("G", (1,), line_of("bugs.py", "src=idx, group=ep_group")),
    ])
    if found(rep) != want:
        fail("findings %s, expected %s\n%s" % (found(rep), want, json.dumps(rep["findings"], indent=1)))
    if rc != 1:
        fail("exit status %d with findings, expected 1" % rc)
    details = " ".join(f["detail"] for f in rep["findings"])
    for needle in ("Global rank 0 is not part of group", "Address already in use", "File exists",
                   "Duplicate GPU detected", "mcastmem-socket-0-"):
        if needle not in details:
            fail("no %r in the details: %s" % (needle, details))
    no_shm_left("dptp_audit_")


def case_hang():
    # a restart hangs again: it is ended too, and the report is its own
    rc, so, se, rep = torch_job("hang.py", ["--audit-hang", "3", "--max-restarts", "1"])
    check_layout(rep)
    if rep["attempt"] != 1 or se.count("no rank progressed for 3 s") != 2:
        fail("attempt %s, stderr:\n%s" % (rep["attempt"], se[-3000:]))
    line = line_of("hang.py", "dist.all_reduce(")
    want = [("P", (1,), line), ("P", (1,), line)]
    if found(rep) != want or not rep["hung"]:
        fail("findings %s hung %s, expected %s\n%s" % (found(rep), rep["hung"], want, se[-3000:]))
    if sorted(r for f in rep["findings"] for r in f["ranks"]) != [2, 3]:
        fail("ranks: %s" % rep["findings"])
    if rep.get("hangs") != 2 or se.count(", ended as hung") != 2:  # both attempts' worlds say so
        fail("hangs %s:\n%s" % (rep.get("hangs"), se[-3000:]))
    if rc == 0 or not re.search(r"no rank progressed for 3 s: .*\brank 2\b.*all_reduce", se):
        fail("rc %d, stderr:\n%s" % (rc, se[-3000:]))


def case_nonpython():
    rc, so, se = run(["--nproc-per-node", "2", "--audit", "--log-dir", os.path.join(TMP, "logs"),
                      "--audit-output", os.path.join(TMP, "a.xml"), "--audit-format", "junit",
                      "--no-python", "sh", "-c", "echo hi $RANK"])
    if rc != 0 or "0 findings" not in se:
        fail("rc %d\n%s" % (rc, se))
    xml = open(os.path.join(TMP, "a.xml")).read()
    if xml.count("<testcase") != 12 or 'name="dp1/D"' not in xml or "<failure" in xml:
        fail("junit:\n" + xml)
    # the audit folder holds the C recorder's records of both ranks
    adir = re.search(r"records in (\S+)", se).group(1)
    names = os.listdir(adir)
    if len([n for n in names if n.endswith(".c.jsonl")]) != 2 or "launcher.jsonl" not in names:
        fail("records: %s" % os.listdir(adir))
    # a failing job keeps its own status
    rc, so, se = run(["--nproc-per-node", "2", "--audit", "--log-dir", os.path.join(TMP, "logs"),
                      "--audit-format", "text", "--audit-output", os.path.join(TMP, "a.txt"),
                      "--no-python", "sh", "-c", "exit 3"])
    if rc != 1 or "0 findings" not in open(os.path.join(TMP, "a.txt")).read():
        fail("failed job: rc %d\n%s" % (rc, se))
    # --log-dir /dev/null: the records' temporary folder goes after the report
    rc, so, se = run(["--nproc-per-node", "2", "--audit", "--log-dir", "/dev/null", "--no-python", "true"])
    m = re.search(r"records were in (\S+) \(removed", se)
    if rc != 0 or not m or os.path.exists(m.group(1)):
        fail("--log-dir /dev/null: rc %d\n%s" % (rc, se))


def case_subproc():
    """A worker's own Python subprocess is recorded too (issue 31): it
    inherits the recorders' variables, and they are the only change."""
    rc, so, se = run(["--nproc-per-node", "2", "--audit", "--log-dir", os.path.join(TMP, "logs"), "subproc.py"],
                     {"PYTHONPATH": "/nonexistent/user/path", "LD_PRELOAD": ""})
    if rc != 0:
        fail("rc %d\n%s" % (rc, se))
    rd = os.path.join(os.path.dirname(RUN), "audit")
    lines = [l for l in so.splitlines() if "CHILD-ENV" in l]
    for line in lines:
        env = json.loads(line.split("CHILD-ENV ", 1)[1].split(" CHILD-REC", 1)[0])
        if env["PYTHONPATH"] != rd + ":/nonexistent/user/path" or env["LD_PRELOAD"] != rd + "/libdptp-audit.so" or \
                not env["DPTP_AUDIT_DIR"] or not env["DPTP_AUDIT_PPID"] or not line.endswith("true"):
            fail("the subprocess did not get the recorders (or got more): " + line)
    if len(lines) != 2:
        fail("CHILD-ENV lines:\n" + so)
    adir = re.search(r"records in (\S+)", se).group(1)
    files = sorted(os.listdir(adir))
    if len([n for n in files if n.endswith(".py.jsonl")]) != 4 or "launcher.jsonl" not in files:
        fail("records (2 workers and their 2 subprocesses): %s" % files)


def case_options():
    cases = [
        (["--audit-layout", "2x1x2", "x.py"], "--audit-layout needs --audit"),
        (["--audit", "--audit-layout", "2x2", "x.py"], "--audit-layout '2x2': expected DPxPPxTP"),
        (["--audit", "--audit-layout", "0x1x2", "x.py"], "--audit-layout '0x1x2'"),
        (["--audit", "--audit-format", "xml", "x.py"], "--audit-format 'xml': expected text, json or junit"),
        (["--audit", "--audit-hang", "-1", "x.py"], "--audit-hang '-1'"),
        (["--audit", "--audit-hang", "soon", "x.py"], "--audit-hang 'soon'"),
    ]
    for args, msg in cases:
        rc, so, se = run(args)
        if rc != 2 or msg not in se:
            fail("%s: rc %d, stderr %r (expected %r)" % (args, rc, se, msg))
    # a layout that does not fit the job's fixed world is refused before it starts
    rc, so, se = run(["--nproc-per-node", "2", "--audit", "--audit-layout", "2x1x2", "--log-dir",
                      os.path.join(TMP, "logs"), "--no-python", "true"])
    if rc != 2 or "--audit-layout '2x1x2' is 4 ranks; the job's world is 2" not in se:
        fail("mismatched layout: rc %d\n%s" % (rc, se))


def case_preload_local():
    """NCCL calls from a library loaded with RTLD_LOCAL reach libnccl."""
    exe, lib = sys.argv[4], sys.argv[5]
    pre = os.path.join(os.path.dirname(RUN), "audit", "libdptp-audit.so")
    env = dict(os.environ, LD_PRELOAD=pre, DPTP_AUDIT_DIR=TMP, DPTP_AUDIT_PPID=str(os.getpid()), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", FAKE_NCCL_BIND_PORT="28028")
    p = subprocess.run([exe, lib], env=env, capture_output=True, text=True, timeout=30)
    if p.returncode != 0 or "returned 0" not in p.stdout:
        fail("rc %d: %s %s" % (p.returncode, p.stdout, p.stderr))
    cfiles = [n for n in os.listdir(TMP) if n.endswith(".c.jsonl")]
    if len(cfiles) != 1:
        fail("C records: %s" % os.listdir(TMP))
    recs = [json.loads(l) for l in open(os.path.join(TMP, cfiles[0]))]
    recs = [r for r in recs if r["k"] != "end"]  # the recorder's own end record
    kinds = [(r["k"], r.get("call"), r.get("op")) for r in recs]
    if kinds != [("hello", None, None), ("sock", "bind", None), ("nccl", "init", None), ("nccl", "op", "all_reduce")]:
        fail("records: %s" % recs)
    # a port libnccl binds itself (NCCL's RAS port) is marked as NCCL's
    if recs[1].get("by") != "nccl" or recs[1].get("port") != 28028:
        fail("NCCL's own bind not marked: %s" % recs[1])
    if recs[3]["id"] != recs[2]["id"] or recs[3]["n"] != 16 or recs[2]["rc"] != 0:
        fail("records: %s" % recs)


def case_recorder():
    """The Python recorder on a stand-in torch (torch 2.x's decorated collectives)."""
    rd = os.path.join(os.path.dirname(RUN), "audit")
    p = subprocess.run([sys.executable, os.path.join(HERE, "recorder_unit.py"), rd, TMP], capture_output=True,
                       text=True, timeout=60)
    if p.returncode or p.stdout.strip() != "ok":
        fail("rc %d: %s %s" % (p.returncode, p.stdout, p.stderr))


try:
    {"healthy": case_healthy, "recorder": case_recorder, "preload_local": case_preload_local, "bugs": case_bugs, "hang": case_hang, "nonpython": case_nonpython,
     "subproc": case_subproc, "options": case_options}[CASE]()
    print("ok")
finally:
    shutil.rmtree(TMP, ignore_errors=True)
