#!/usr/bin/env python3
"""The C recorder (libdptp-audit.so) run directly under LD_PRELOAD, without
dptp-run: every process with DPTP_AUDIT_DIR records into its own file, the
record descriptor stays out of the program's way, every image ends with an
`end`, the cap and write errors are counted, and GPU memory exchange is
recorded with the same hash on both ends (stand-in CUDA libraries).

usage: crec_e2e.py LIBDPTP_AUDIT_SO CASE [AUDIT_C_GPU LIBCGPUUSER LIBCNEXT]"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PRE, CASE = os.path.abspath(sys.argv[1]), sys.argv[2]
TMP = tempfile.mkdtemp(prefix="dptp-crec-")
ADIR = os.path.join(TMP, "audit")
os.mkdir(ADIR)
PY = sys.executable
SITE = re.compile(r"^[^+/]+\+0x[0-9a-f]+$")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def env(**extra):
    e = dict(os.environ, LD_PRELOAD=PRE, DPTP_AUDIT_DIR=ADIR, DPTP_AUDIT_PPID=str(os.getpid()))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DPTP_AUDIT_IMG", "DPTP_AUDIT_MAX_RECORDS"):
        e.pop(k, None)
    e.update(extra)
    return e


def run(args, timeout=60, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    return p


def prog(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def files():
    """pid -> (records, unparseable lines) of the C recorder's files"""
    out = {}
    for n in sorted(os.listdir(ADIR)):
        m = re.fullmatch(r"a0\.p(\d+)\.c\.jsonl", n)
        if not m:
            fail("unexpected file %s in %s" % (n, sorted(os.listdir(ADIR))))
        recs, bad = [], 0
        with open(os.path.join(ADIR, n), "rb") as f:
            for line in f.read().split(b"\n")[:-1]:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    bad += 1
        out[int(m.group(1))] = (recs, bad)
    return out


def images(recs):
    """the records split at each hello"""
    out = []
    for r in recs:
        if r["k"] == "hello":
            out.append([])
        if not out:
            fail("records before the first hello: %s" % recs)
        out[-1].append(r)
    return out


def case_fds():
    """The record descriptor is high and checked: a program that closes
    its descriptors and reuses their numbers never receives a record."""
    data = os.path.join(TMP, "data.txt")
    p = prog("fds.py", f"""
import os, socket
def bind(name):
    s = socket.socket(socket.AF_UNIX); s.bind("\\0dptp-crec-%d-%s" % (os.getpid(), name)); s.close()
def audit_fds():
    out = []
    for n in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + n).startswith({ADIR!r}):
                out.append(int(n))
        except OSError:
            pass
    return out
fds = audit_fds()
print("audit fds", fds, flush=True)
os.closerange(3, 256)
f = os.open({data!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
bind("a")
for fd in audit_fds():  # the recorder's own: the program takes its number
    os.dup2(f, fd)
bind("b")
os.write(f, b"mine\\n")
os.closerange(3, 1 << 16)
f = os.open({data!r}, os.O_WRONLY | os.O_APPEND)
bind("c")
os.close(f)
""")
    p1 = run([PY, p], env=env())
    if p1.returncode:
        fail("rc %d: %s %s" % (p1.returncode, p1.stdout, p1.stderr))
    fds = eval(p1.stdout.split("audit fds", 1)[1].splitlines()[0])
    if len(fds) != 1 or fds[0] < 1000:
        fail("the record descriptor is not >= 1000: %s" % fds)
    with open(data) as f:
        if f.read() != "mine\n":
            fail("the program's file got records")
    recs = files()
    binds = [r["addr"][-1] for r in recs[max(recs)][0] if r["k"] == "sock"]
    if binds != ["a", "b", "c"]:
        fail("binds recorded: %s" % binds)
    # a low RLIMIT_NOFILE: the descriptor sits below it
    shutil.rmtree(ADIR)
    os.mkdir(ADIR)
    p2 = run(["sh", "-c", "ulimit -n 64 && exec \"$0\" \"$1\"", PY, p], env=env())
    if p2.returncode:
        fail("ulimit 64: rc %d: %s %s" % (p2.returncode, p2.stdout, p2.stderr))
    fds = eval(p2.stdout.split("audit fds", 1)[1].splitlines()[0])
    if len(fds) != 1 or not 32 <= fds[0] < 64:
        fail("with ulimit -n 64 the record descriptor is %s" % fds)


def case_procs():
    """Every process records, into its own file: sh and the Python it
    starts, a forked child, a subprocess, an exec'd Python."""
    p = prog("procs.py", """
import os, socket, subprocess, sys
def bind(name):
    s = socket.socket(socket.AF_UNIX); s.bind("\\0dptp-crec-%d-%s" % (os.getpid(), name)); s.close()
bind("A")
pid = os.fork()
if pid == 0:
    bind("B")
    os._exit(3)
os.waitpid(pid, 0)
code = "import os, socket; s = socket.socket(socket.AF_UNIX); s.bind('\\\\0dptp-crec-%d-S' % os.getpid())"
subprocess.run([sys.executable, "-c", code], check=True)
subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
if len(sys.argv) > 1:
    os.execv(sys.executable, [sys.executable, "-c", code + "; import sys; sys.exit(4)"])
""")
    # sh runs Python (dash may exec it in its own pid or fork first),
    # which forks, runs two subprocesses and execs another Python
    p1 = run(["/bin/sh", "-c", "\"$0\" \"$1\" exec", PY, p], env=env())
    if p1.returncode != 4:
        fail("sh -c: rc %d: %s" % (p1.returncode, p1.stderr))
    recs = {pid: images(v[0]) for pid, v in files().items()}

    def with_addr(end):
        return [(pid, n) for pid, imgs in recs.items() for n, i in enumerate(imgs)
                if any(r.get("addr", "").endswith(end) for r in i)]

    (ppid, n), = with_addr("-A")
    imgs = recs[ppid]
    if not imgs[n][0]["py"] or imgs[n][0]["img"] != n or len(imgs) != n + 2:
        fail("the Python's images: %s" % imgs)
    last = imgs[n + 1]
    if (last[0]["img"], last[0]["py"]) != (n + 1, True) or [r.get("addr", "")[-1:] for r in last if r["k"] == "sock"] != ["S"] \
            or last[-1]["k"] != "end" or last[-1]["code"] != 4:
        fail("the exec'd image: %s" % last)
    sh = imgs[0][0] if n else recs[imgs[0][0]["ppid"]][0][0]
    if sh["py"] or n not in (0, 1) or not re.search(r"(da)?sh$", sh["exe"]):
        fail("sh's hello: %s (images of the Python's pid: %s)" % (sh, imgs))
    (fpid, _), = with_addr("-B")
    f = recs[fpid]
    if len(f) != 1 or f[0][0]["ppid"] != ppid or f[0][0]["img"] != 0 or f[0][-1]["k"] != "end" \
            or (f[0][-1]["how"], f[0][-1]["code"]) != ("_exit", 3):
        fail("the forked child: %s" % f)
    subs = [recs[pid] for pid, _ in with_addr("-S") if pid != ppid]
    if len(subs) != 2:
        fail("subprocesses: %s" % recs)
    for s in subs:
        if s[-1][0]["ppid"] != ppid or s[-1][-1]["k"] != "end" or s[-1][-1]["code"] != 0 or not s[-1][0]["py"]:
            fail("a subprocess: %s" % s)
        if [i[0]["img"] for i in s] != list(range(len(s))):
            fail("image numbers of a subprocess: %s" % s)
    # a shell that forks: two files, sh (py false) and Python (py true)
    shutil.rmtree(ADIR)
    os.mkdir(ADIR)
    p2 = run(["/bin/sh", "-c", "\"$0\" -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"\")'; true", PY],
             env=env())
    if p2.returncode:
        fail("sh -c ...; true: rc %d: %s" % (p2.returncode, p2.stderr))
    recs = files()
    if len(recs) != 2:
        fail("sh -c '...; true': files %s" % recs)
    sh, pyf = recs[min(recs)][0], recs[max(recs)][0]
    if sh[0]["py"] or not pyf[0]["py"] or pyf[0]["ppid"] != sh[0]["pid"] or pyf[-1]["k"] != "end":
        fail("sh -c '...; true': %s" % recs)


def case_ends():
    """end: main's return, sys.exit, os._exit; the hello's keys; sites."""
    for code, how, exp in (("pass", "exit", 0), ("import sys; sys.exit(5)", "exit", 5), ("import os; os._exit(6)", "_exit", 6)):
        shutil.rmtree(ADIR)
        os.mkdir(ADIR)
        p = run([PY, "-c", "import socket; socket.socket(socket.AF_UNIX).bind('\\0dptp-crec-e%d' % __import__('os').getpid()); " + code],
                env=env(RANK="2", WORLD_SIZE="4", LOCAL_RANK="0"))
        if p.returncode != exp:
            fail("%s: rc %d %s" % (code, p.returncode, p.stderr))
        (recs, bad), = files().values()
        h, e = recs[0], recs[-1]
        if bad or h["k"] != "hello" or (h["rank"], h["world"], h["local_rank"], h["img"]) != (2, 4, 0, 0):
            fail("hello: %s" % recs)
        if h["pid"] != p.args and False:
            pass
        if not h["py"] or h["worker"] is not True or h["ppid"] != os.getpid() or not h["exe"]:
            fail("hello: %s" % h)
        if e["k"] != "end" or e["how"] != how or e["code"] != exp or e["records"] != len(recs) - 1 or e["lost"]:
            fail("%s: end %s" % (code, recs))
        sock = [r for r in recs if r["k"] == "sock"]
        if len(sock) != 1 or not SITE.match(sock[0].get("site", "")):
            fail("no site: %s" % sock)


def case_cap():
    """DPTP_AUDIT_MAX_RECORDS: a cap record, then counted lost."""
    p = run([PY, "-c", "import socket\nfor i in range(10): socket.socket(socket.AF_UNIX).bind('\\0dptp-crec-c%d-%d' % (__import__('os').getpid(), i))"],
            env=env(DPTP_AUDIT_MAX_RECORDS="5"))
    if p.returncode:
        fail("rc %d %s" % (p.returncode, p.stderr))
    (recs, bad), = files().values()
    kinds = [r["k"] for r in recs]
    if bad or kinds != ["hello"] + ["sock"] * 5 + ["cap", "end"] or recs[6]["max"] != 5:
        fail("records: %s" % kinds)
    if (recs[-1]["records"], recs[-1]["lost"], recs[-1].get("dropped")) != (7, 5, 5):
        fail("end: %s" % recs[-1])


def case_full():
    """A file that cannot grow (RLIMIT_FSIZE, as a full disk): the records
    not written are counted lost, a torn line is ended, the end parses."""
    p = run([PY, "-c", """
import os, resource, signal, socket
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, hard))
for i in range(100):
    try:
        socket.socket(socket.AF_UNIX).bind('\\0dptp-crec-full-%d-%s' % (os.getpid(), 'x' * 40))
    except OSError:
        pass
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
"""], env=env())
    if p.returncode:
        fail("rc %d %s" % (p.returncode, p.stderr))
    (recs, bad), = files().values()
    e = recs[-1]
    socks = [r for r in recs if r["k"] == "sock"]
    if e["k"] != "end" or bad > 1 or e["lost"] < 1 or e.get("dropped") != 0 or e["records"] != len(recs) - 1 or len(socks) + e["lost"] != 100:
        fail("records %d, bad %d, end %s" % (len(recs), bad, e))
    if os.path.getsize(os.path.join(ADIR, os.listdir(ADIR)[0])) < 2900:
        fail("the file did not fill")


def case_gpu():
    """CUDA IPC and VMM handles, runtime and driver API, from a library
    loaded with RTLD_LOCAL and through cuGetProcAddress,
    cudaGetDriverEntryPoint and a libcuda handle of the library's own
    (cuda-python's way): exporter and importer records carry equal h; the
    runtime's own driver calls are not recorded twice."""
    exe, lib = sys.argv[3], sys.argv[4]
    # with a second interposer after the recorder: its getpid() takes the
    # next one with dlsym(RTLD_NEXT), which stays relative to it although
    # the recorder interposes dlsym (else the pids below are -1)
    p = run([exe, lib], env=env(FAKE_CUDA_DEV="3", LD_PRELOAD=PRE + ":" + os.path.abspath(sys.argv[5])))
    if p.returncode != 0 or "returned 0" not in p.stdout:
        fail("rc %d: %s %s" % (p.returncode, p.stdout, p.stderr))
    recs = files()
    if len(recs) != 2:
        fail("files: %s" % recs)
    parent, child = recs[min(recs)][0], recs[max(recs)][0]
    if [parent[0]["pid"], child[0]["pid"], child[0]["ppid"]] != [min(recs), max(recs), min(recs)]:
        fail("pids: %s %s" % (parent[0], child[0]))
    exp = [(r["call"], r["api"], r["ht"], r["h"]) for r in parent if r["k"] == "gpu"]
    imp = [(r["call"], r["api"], r["ht"], r["h"]) for r in child if r["k"] == "gpu"]
    want_exp = [("ipc_get", "runtime", "ipc")] + [("ipc_get", "driver", "ipc")] * 3 + \
        [("vmm_export", "driver", "fd"), ("vmm_export", "driver", "fabric")]
    if [e[:3] for e in exp] != want_exp or [i[:3] for i in imp] != [("ipc_open",) + w[1:] if w[0] == "ipc_get" else ("vmm_import",) + w[1:] for w in want_exp]:
        fail("gpu records:\n%s\n%s" % (exp, imp))
    if [e[3] for e in exp] != [i[3] for i in imp] or len(set(e[3] for e in exp)) != 6 or "0" * 16 in [e[3] for e in exp]:
        fail("hashes differ or repeat:\n%s\n%s" % (exp, imp))
    for r in parent + child:
        if r["k"] == "gpu" and (r["rc"] != 0 or r["dev"] != 3 or not r.get("site", "").startswith("libcgpuuser.so+0x")):
            fail("gpu record: %s" % r)
    # a descriptor names its exporter (the open file description's owner)
    xpids = [r.get("xpid") for r in parent + child if r["k"] == "gpu" and r["ht"] == "fd"]
    if xpids != [parent[0]["pid"]] * 2:
        fail("exporter pids of the fd handle: %s" % xpids)


def case_nccl():
    """NCCL calls past the cap: a count record per communicator with its
    calls, collectives and the sum of the terms of those not recorded."""
    exe = sys.argv[3]
    # the Python recorder beside the C one (checked against the same vectors
    # in recorder_unit.py): its term, written once more in another language
    sys.path.insert(0, os.path.dirname(PRE))
    import dptp_audit_rec
    M64, ref_term = 2**64 - 1, dptp_audit_rec._term
    vec = [("all_reduce|4|float32|", 0, "7a47326087b79594", "aac1b457afeb267c"),
           ("all_reduce|4|float32|", 1, "7a47326087b79594", "8e2fa50c80192a79"),
           ("broadcast|8|float32|src=1", 3, "b971f08fe4c43863", "5ba63920bf89ce99"),
           ("barrier|-1||", 2, "146f9915e792c06e", "7f21225753343a58")]
    p = run([exe, "vectors"] + [x for v in vec for x in (v[0], str(v[1]))], env=dict(os.environ))
    if p.returncode or p.stdout.split("\n")[:-1] != ["%s %s" % v[2:] for v in vec]:
        fail("the contract's test vectors: %r %s" % (p.stdout, p.stderr))
    # cap 8: hello is not counted; 2 inits + 6 all_reduce are recorded
    p = run([exe, "calls"], env=env(DPTP_AUDIT_MAX_RECORDS="8"))
    if p.returncode:
        fail("rc %d %s" % (p.returncode, p.stderr))
    (recs, bad), = files().values()
    kinds = [r["k"] for r in recs]
    if bad or kinds != ["hello"] + ["nccl"] * 8 + ["cap", "count", "count", "end"]:
        fail("records: %s" % kinds)
    ids = [r["id"] for r in recs if r.get("call") == "init"]
    ops = [r for r in recs if r.get("call") == "op"]
    if len(set(ids)) != 2 or [(o["op"], o["id"], o["n"], o["dt"]) for o in ops] != [("all_reduce", ids[0], 4, 7)] * 6:
        fail("nccl records: %s" % recs)
    c1, c2 = recs[-3], recs[-2]
    # the first: all_reduce at places 6-9, the send (no place), broadcasts at 10, 11
    hs1 = sum(ref_term("all_reduce|4|nccl7|", k) for k in range(6, 10)) + \
        sum(ref_term("broadcast|4|nccl7|root=1", k) for k in (10, 11))
    hs2 = sum(ref_term("all_reduce|8|nccl7|", k) for k in range(3))
    if (c1["id"], c1["seq"], c1["nc"], c1["hs"]) != (ids[0], 13, 12, "%016x" % (hs1 & M64)) or \
            (c2["id"], c2["seq"], c2["nc"], c2["hs"]) != (ids[1], 3, 3, "%016x" % (hs2 & M64)):
        fail("count records: %s %s" % (c1, c2))
    if (recs[-1]["records"], recs[-1]["lost"], recs[-1].get("dropped")) != (len(recs) - 1, 10, 10):
        fail("end: %s" % recs[-1])


try:
    {"nccl": case_nccl, "fds": case_fds, "procs": case_procs, "ends": case_ends, "cap": case_cap, "full": case_full,
     "gpu": case_gpu}[CASE]()
    print("ok")
finally:
    shutil.rmtree(TMP, ignore_errors=True)
