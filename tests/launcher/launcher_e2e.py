#!/usr/bin/env python3
"""End-to-end tests of dptp-run against torchrun 2.11's captured behaviour.

usage: launcher_e2e.py DPTP_RUN PMIX_CLIENT CASE
The expected data (copied from the torchrun 2.11 captures) lives next to
this file: torchrun_2.11_*.txt."""
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from e2e_util import check, clean_env, fail, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.abspath(sys.argv[1])
PMIX_CLIENT = os.path.abspath(sys.argv[2])
GLOG = r"[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ dptp-run\] "

# the image variables present in the capture, passed through by torchrun
IMAGE_ENV = {
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_plm": "isolated",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "TORCH_CUDA_ARCH_LIST": "9.0a",
}
# the capture's variable selection
SELECT = re.compile(r"^(GROUP_|LOCAL_|MASTER_|OMP|PYTHON|RANK=|ROLE_|TORCH|WORLD_SIZE=)")


# dptp-run hosts the agent store at --master-port (29500 by default, as
# torchrun): every test takes its own port so that tests run in parallel
PORT = free_port()


def base_env(**extra):
    return clean_env(**dict({"PET_MASTER_PORT": str(PORT)}, **extra))


def run(args, env=None, timeout=60, **kw):
    p = subprocess.run([RUN] + args, env=env if env is not None else base_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, **kw)
    return p.returncode, p.stdout, p.stderr


def read(name):
    with open(os.path.join(HERE, name)) as f:
        return f.read()


def env_lines(text):
    """{(worker, key): value} from '[defaultN]:K=V' lines."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\[default(\d+)\]:([A-Za-z0-9_]+)=(.*)$", line)
        if m:
            out[(int(m.group(1)), m.group(2))] = m.group(3)
    return out


def expected_env(nproc):
    """The capture (2 workers) generalised to nproc workers: only the values
    that depend on the rank or the size change."""
    cap = env_lines(read("torchrun_2.11_env.txt"))
    exp = {}
    for w in range(nproc):
        for (cw, key), val in cap.items():
            if cw != min(w, 1):
                continue
            if key in ("RANK", "LOCAL_RANK", "ROLE_RANK"):
                val = str(w)
            elif key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"):
                val = str(nproc)
            elif key == "MASTER_PORT":
                val = str(PORT)  # the capture's 29500: this test's own port
            elif key == "TORCHELASTIC_ERROR_FILE":
                val = re.sub(r"/attempt_0/\d+/", "/attempt_0/%d/" % w, val)
            exp[(w, key)] = val
    return exp


ERRFILE = re.compile(r"^(.*)/torchelastic_[a-z0-9_]{8}/none_[a-z0-9_]{8}/attempt_0/(\d+)/error\.json$")


def compare_env(nproc):
    worker = "env | grep -E '%s' | LC_ALL=C sort" % SELECT.pattern
    rc, out, err = run(["--nproc-per-node=%d" % nproc, "--tee", "3", "--no-python", "sh", "-c", worker],
                       env=base_env(**IMAGE_ENV))
    check(rc == 0, "rc %d: %s" % (rc, err))
    got = env_lines(out)
    # dptp-run's own additions for Open MPI direct launch (man page: MPI
    # PROGRAMS), not torchrun's: present with their documented values
    cores = len(os.sched_getaffinity(0))  # no SMT on the test machines; at most this many slots
    for w in range(nproc):
        check(got.pop((w, "OMPI_MCA_schizo"), None) == "^orte" and got.pop((w, "OMPI_MCA_ess"), None) == "^singleton",
              "worker %d lacks OMPI_MCA_schizo=^orte / OMPI_MCA_ess=^singleton" % w)
        # and mpirun's own variables (one node: local = global)
        for key, want in (("OMPI_COMM_WORLD_SIZE", str(nproc)), ("OMPI_COMM_WORLD_RANK", str(w)),
                          ("OMPI_COMM_WORLD_LOCAL_RANK", str(w)), ("OMPI_COMM_WORLD_LOCAL_SIZE", str(nproc)),
                          ("OMPI_COMM_WORLD_NODE_RANK", str(w))):
            check(got.pop((w, key), None) == want, "worker %d: %s is not %s" % (w, key, want))
        univ = int(got.pop((w, "OMPI_UNIVERSE_SIZE"), "0"))
        check(1 <= univ <= cores, "worker %d: OMPI_UNIVERSE_SIZE %d, %d cores" % (w, univ, cores))
        check(got.pop((w, "OMPI_MCA_mpi_oversubscribe"), None) == ("1" if nproc > univ else "0"),
              "worker %d: OMPI_MCA_mpi_oversubscribe with %d ranks on %d slots" % (w, nproc, univ))
        tmpdir = got.pop((w, "OMPI_MCA_orte_tmpdir_base"), "")
        shmdir = got.pop((w, "OMPI_MCA_btl_vader_backing_directory"), "")
        check(os.path.basename(tmpdir).startswith("dptp-run.") and shmdir.startswith("/dev/shm/dptp-run."),
              "worker %d: session/shared-memory folders %r %r" % (w, tmpdir, shmdir))
        check(not os.path.exists(tmpdir) and not os.path.exists(shmdir), "%s or %s left behind" % (tmpdir, shmdir))
    exp = expected_env(nproc)
    check(set(got) == set(exp), "variables differ: missing %s, extra %s" %
          (sorted(set(exp) - set(got)), sorted(set(got) - set(exp))))
    for k, v in sorted(exp.items()):
        g = got[k]
        if k[1] == "TORCHELASTIC_ERROR_FILE":
            # masked: the random directory names; the layout must match
            m, me = ERRFILE.match(g), ERRFILE.match(v)
            check(m and me and m.group(2) == me.group(2) == str(k[0]), "%s: %s vs %s" % (k, g, v))
            check(os.path.isdir(os.path.dirname(g)), "%s: directory missing" % g)
            continue
        check(g == v, "%s: got %r, torchrun 2.11 gave %r" % (k, g, v))
    # the OMP_NUM_THREADS warning, line for line after the glog prefix
    want = [l.split("] ", 1)[1] for l in read("torchrun_2.11_omp_warning.txt").splitlines()]
    gotw = [l for l in err.splitlines() if re.match(GLOG, l)]
    gotw = [re.sub("^" + GLOG, "", l) for l in gotw][:4]
    check(gotw == want, "OMP warning differs: %r" % gotw)
    # lines are [defaultN]: prefixed, nothing else on stdout
    for line in out.splitlines():
        check(re.match(r"^\[default\d\]:", line), "unprefixed line %r" % line)


def mask_report(text):
    text = re.sub(r"time      : \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", "time      : T", text)
    text = re.sub(r"host      : .*", "host      : H", text)
    text = re.sub(r"\(pid: \d+\)", "(pid: P)", text)
    text = re.sub(r"by PID \d+", "by PID P", text)
    text = re.sub(r"/tmp/torchelastic_[a-z0-9_]{8}/none_[a-z0-9_]{8}/", "LOGDIR/", text)
    text = re.sub(r"/\S*/torchelastic_[a-z0-9_]{8}/none_[a-z0-9_]{8}/", "LOGDIR/", text)
    return text


def report_of(err):
    m = re.search(r"^(=+\n.*?\n=+)$", err, re.S | re.M)
    check(m, "no failure report in:\n" + err)
    return m.group(1)


def case_env_2():
    compare_env(2)


def case_env_4():
    compare_env(4)


def case_fail_exit3():
    script = 'if [ "$LOCAL_RANK" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30'
    t0 = time.time()
    rc, out, err = run(["--nproc-per-node=2", "--no-python", "sh", "-c", script])
    check(rc == 1, "rc %d" % rc)
    check(time.time() - t0 < 10, "siblings were not stopped promptly")
    check(re.search("^" + GLOG + r"Sending process \d+ closing signal SIGTERM$", err, re.M), err)
    check(re.search("^" + GLOG + r"failed \(exitcode: 3\) local_rank: 1 \(pid: \d+\) of binary: sh$", err, re.M), err)
    got = mask_report(report_of(err))
    want = mask_report(read("torchrun_2.11_fail_report.txt").rstrip("\n"))
    check(got == want, "report differs:\n%s\n--- torchrun 2.11:\n%s" % (got, want))


def signal_case(sig, num, name):
    script = 'if [ "$LOCAL_RANK" = 0 ]; then sleep 0.2; kill -%s $$$$; fi; exec sleep 30' % name
    rc, out, err = run(["--nproc-per-node=2", "--no-python", "sh", "-c", script])
    check(rc == 1, "rc %d" % rc)
    rep = report_of(err)
    root = rep.split("Root Cause (first observed failure):")[1]
    check(re.search(r"rank      : 0 \(local_rank: 0\)", root), rep)
    check(re.search(r"exitcode  : -%d \(pid: \d+\)" % num, root), rep)
    check(re.search(r"traceback : Signal %d \(SIG%s\) received by PID \d+" % (num, name), root), rep)
    # torchrun's width: the longest line, at most 60
    width = min(60, max(len(l) for l in rep.splitlines()[1:-1] if not re.match(r"^[-=]+$", l)))
    check(rep.startswith("=" * width + "\nsh FAILED\n" + "-" * width + "\nFailures:\n[1]:\n"), rep)
    check(rep.endswith("\n" + "=" * width), rep)


def case_fail_segv():
    signal_case(signal.SIGSEGV, 11, "SEGV")


def case_fail_sigkill():
    signal_case(signal.SIGKILL, 9, "KILL")


def case_error_file():
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "f.py")
        with open(script, "w") as f:
            f.write("import json, os, time\n"
                    "tb = 'Traceback (most recent call last):\\n  File \"/tmp/f.py\", line 4, in m\\n"
                    "    raise ValueError(\"boom\")\\nValueError: boom\\n'\n"
                    "json.dump({'message': {'message': 'ValueError: boom', 'extraInfo': {'py_callstack': tb,"
                    " 'timestamp': str(int(time.time()))}}}, open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w'))\n"
                    "raise SystemExit(1)\n")
        parent = os.path.join(d, "parent.json")
        rc, out, err = run(["--nproc-per-node=1", script], env=base_env(TORCHELASTIC_ERROR_FILE=parent))
        check(rc == 1, "rc %d %s" % (rc, err))
        # the launcher's own error file: the root cause's, with errorCode
        with open(parent) as f:
            dumped = json.load(f)
        check(dumped["message"]["errorCode"] == 1 and dumped["message"]["message"] == "ValueError: boom"
              and "ValueError: boom" in dumped["message"]["extraInfo"]["py_callstack"], dumped)
        got = mask_report(report_of(err)).replace(script, "/tmp/f.py")
        want = mask_report(read("torchrun_2.11_pyfail_report.txt").rstrip("\n"))
        # torchrun's own wrapper frame is not in a plain script's traceback
        want = re.sub(r"    File \"<venv>.*?\n.*?\n.*?\n", "", want, count=1, flags=0)
        check(got == want, "report differs:\n%s\n--- expected:\n%s" % (got, want))


def case_error_file_shapes():
    # every shape torchrun's ProcessFailure accepts, and two it cannot read:
    # (file text, what torchrun's report shows after "traceback : ")
    shapes = [
        ('{"message": {"message": "RuntimeError: a\\nb", "extraInfo": {"timestamp": "7"}}}',
         "RuntimeError: a\n  b"),
        ('{"message": {"message": "only"}}', "only"),
        ('{"message": {"extraInfo": {"py_callstack": "T\\nU", "timestamp": 7}}}', "T\n  U"),
        ('{"message": {"extraInfo": {"timestamp": 7}}}', "<N/A>"),
        ('{"message": "plain", "timestamp": 7}', "plain"),
        ('{"message": "plain, no timestamp"}', "plain, no timestamp"),
        ('{"message": {"message": "M", "extraInfo": {"py_callstack": "", "timestamp": 7}}}', ""),
        ('{"message": ""}', "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
        ("", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
        ("not json", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
    ]
    with tempfile.TemporaryDirectory() as d:
        for i, (text, shown) in enumerate(shapes):
            body = os.path.join(d, "body%d" % i)
            with open(body, "w") as f:
                f.write(text)
            script = 'cat "%s" > "$TORCHELASTIC_ERROR_FILE"; exit 3' % body
            rc, out, err = run(["--nproc-per-node=1", "--no-python", "sh", "-c", script])
            check(rc == 1, "shape %r: rc %d %s" % (text, rc, err))
            rep = report_of(err)
            check("  traceback : " + shown + "\n" in rep + "\n", "shape %r:\n%s" % (text, rep))
            # a file it could read is named, else <N/A>
            named = "error_file: <N/A>" not in rep
            check(named == (i < 8), "shape %r error_file line:\n%s" % (text, rep))


def case_master_addr_v6():
    # --master-addr [::1] as torchrun takes it: the brackets go (MASTER_ADDR=::1)
    # and the agent store listens there
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError:
        print("SKIP: no IPv6 loopback")
        sys.exit(77)
    probe = ("import os, socket; a, p = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']); "
             "socket.create_connection((a, p), timeout=5).close(); print('MA=' + a)")
    rc, out, err = run(["--master-addr=[::1]", "--master-port=%d" % port, "--nproc-per-node=1",
                        "--no-python", sys.executable, "-c", probe])
    check(rc == 0 and out.strip() == "MA=::1", "rc %d out %r err %s" % (rc, out, err))


def case_run_path():
    # --run-path: the script runs under torchrun's @record-style handler, so
    # the report shows its traceback (entry point run_script_path, as torchrun)
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "rp.py")
        with open(script, "w") as f:
            f.write("import sys\ndef m():\n    raise ValueError('boom ' + sys.argv[1])\nm()\n")
        rc, out, err = run(["--run-path", "--nproc-per-node=1", script, "X"])
        check(rc == 1, "rc %d %s" % (rc, err))
        rep = report_of(err)
        check("\nrun_script_path FAILED\n" in rep, rep)
        check("error_file: <N/A>" not in rep, rep)
        check(re.search(r"traceback : Traceback \(most recent call last\):\n(  .*\n)*"
                        r"    File \"%s\", line 3, in m\n(  .*\n)*  ValueError: boom X\n" % re.escape(script), rep + "\n"),
              rep)
        # --run-path wins over -m and --no-python, as torch's config_from_args
        with open(os.path.join(d, "x.py"), "w") as f:
            f.write("print('ran the path')\n")
        for extra in (["-m"], ["--no-python", "-m"]):
            rc, out, err = run(["--run-path"] + extra + [os.path.join(d, "x.py")])
            check(rc == 0 and out == "ran the path\n", "%s: rc %d %s %s" % (extra, rc, out, err))


def case_restart():
    script = 'echo RC=$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_ERROR_FILE; exit 2'
    rc, out, err = run(["--max-restarts=1", "--no-python", "sh", "-c", script])
    check(rc == 1, "rc %d" % rc)
    lines = out.splitlines()
    check(len(lines) == 2, out)
    check(re.match(r"^RC=0 \S+/none_[a-z0-9_]{8}/attempt_0/0/error\.json$", lines[0]), out)
    check(re.match(r"^RC=1 \S+/none_[a-z0-9_]{8}/attempt_1/0/error\.json$", lines[1]), out)
    check(len(re.findall(r"failed \(exitcode: 2\) local_rank: 0", err)) == 2, err)
    got = mask_report(report_of(err))
    want = mask_report(read("torchrun_2.11_restart_report.txt").rstrip("\n"))
    check(got == want, "report differs:\n%s\n--- torchrun 2.11:\n%s" % (got, want))


def forward_case(sig):
    with tempfile.TemporaryDirectory() as d:
        script = ('trap "echo got > %s/sig.$LOCAL_RANK; exit 0" %d; echo $$$$ > %s/pid.$LOCAL_RANK; '
                  'while :; do sleep 0.05; done' % (d, sig, d))
        p = subprocess.Popen([RUN, "--nproc-per-node=2", "--no-python", "sh", "-c", script], env=base_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 10
        while time.time() < deadline and not all(os.path.exists("%s/pid.%d" % (d, r)) for r in range(2)):
            time.sleep(0.02)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        check(p.returncode == 1, "rc %d" % p.returncode)
        check(re.search("^" + GLOG + r"Received %d death signal, shutting down workers$" % sig, err, re.M), err)
        check(re.search(r"^SignalException: Process %d got signal: %d$" % (p.pid, sig), err, re.M), err)
        for r in range(2):
            check(os.path.exists("%s/sig.%d" % (d, r)), "worker %d did not get signal %d" % (r, sig))


def case_signal_forward():
    forward_case(signal.SIGINT)
    forward_case(signal.SIGTERM)
    forward_case(signal.SIGHUP)


def case_no_orphans():
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as tmpdir:
        # the worker also starts a child of its own in its process group
        script = 'sleep 60 & echo $$$$ $! > %s/pid.$LOCAL_RANK; wait' % d
        p = subprocess.Popen([RUN, "--nproc-per-node=2", "--no-python", "sh", "-c", script], env=base_env(TMPDIR=tmpdir),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline and not all(os.path.exists("%s/pid.%d" % (d, r)) for r in range(2)):
            time.sleep(0.02)
        time.sleep(0.1)
        pids = []
        for r in range(2):
            with open("%s/pid.%d" % (d, r)) as f:
                pids += [int(x) for x in f.read().split()]
        workers, children = pids[0::2], pids[1::2]
        t0 = time.time()
        p.kill()  # SIGKILL: no cleanup code runs in the launcher
        p.wait()

        def alive(pid):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    return f.read().split(") ")[1][0] != "Z"
            except FileNotFoundError:
                return False
        deadline = time.time() + 5
        while time.time() < deadline and any(alive(x) for x in pids):
            time.sleep(0.002)
        check(not any(alive(x) for x in workers), "workers outlived a SIGKILLed launcher")
        # the workers' own children too (the worker guard kills each group)
        check(not any(alive(x) for x in children), "a worker's child outlived a SIGKILLed launcher")
        print("all %d processes gone %.1f ms after SIGKILL" % (len(pids), (time.time() - t0) * 1e3))
        # and the launcher's private PMIx tmpdir (the guard removes it; the
        # torchelastic_* log dir stays, as torchrun leaves it)
        def pmix_dirs():
            return [x for x in os.listdir(tmpdir) if x.startswith("dptp-run.")]
        deadline = time.time() + 5
        while time.time() < deadline and pmix_dirs():
            time.sleep(0.01)
        check(not pmix_dirs(), "a SIGKILLed launcher left %s" % pmix_dirs())
        # a normal exit takes the worker's own children down too
    with tempfile.TemporaryDirectory() as d:
        script = '(sleep 60 & echo $! > %s/child.$LOCAL_RANK); exit 0' % d
        rc, out, err = run(["--nproc-per-node=1", "--no-python", "sh", "-c", script])
        check(rc == 0, err)
        with open("%s/child.0" % d) as f:
            child = int(f.read())
        time.sleep(0.2)
        try:
            os.kill(child, 0)
            st = open("/proc/%d/stat" % child).read().split(") ")[1][0]
            check(st == "Z", "a worker's child survived the job")
        except (ProcessLookupError, FileNotFoundError):
            pass


def case_killed_in_start():
    # a launcher SIGKILLed while its PMIx server starts leaves neither its
    # private tmpdir nor its /dev/shm folder (they used to reach the guard
    # only after PMIx_server_init: empty dptp-run.* folders stayed). The
    # launcher is held there by hwloc, which reads the topology from a FIFO
    # that nobody writes; the FIFO opens for writing once it is read.
    with tempfile.TemporaryDirectory() as tmpdir:
        fifo = os.path.join(tmpdir, "topology.xml")
        os.mkfifo(fifo)
        p = subprocess.Popen([RUN, "--nproc-per-node=1", "--no-python", "true"],
                             env=base_env(TMPDIR=tmpdir, HWLOC_COMPONENTS="xml", HWLOC_XMLFILE=fifo),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fd = -1
        deadline = time.time() + 60
        while fd < 0 and p.poll() is None and time.time() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: not opened for reading yet
                time.sleep(0.005)
        if fd < 0:
            p.kill()
            p.wait()
            print("SKIP: the PMIx server did not read its topology from HWLOC_XMLFILE")
            sys.exit(77)
        dirs = [x for x in os.listdir(tmpdir) if x.startswith("dptp-run.")]
        shm = os.path.join("/dev/shm", dirs[0]) if len(dirs) == 1 else None
        made = shm is not None and (os.path.isdir(shm) or not os.path.isdir("/dev/shm"))
        p.kill()  # inside PMIx_server_init
        p.wait()
        os.close(fd)
        check(len(dirs) == 1, "expected one private tmpdir, found %s" % dirs)
        check(made, "no /dev/shm folder named as the tmpdir (%s)" % shm)
        tmp = os.path.join(tmpdir, dirs[0])
        deadline = time.time() + 10
        while time.time() < deadline and (os.path.exists(tmp) or os.path.exists(shm)):
            time.sleep(0.01)
        left = [x for x in (tmp, shm) if os.path.exists(x)]
        for x in left:  # not left behind by the test either
            shutil.rmtree(x, ignore_errors=True)
        check(not left, "a launcher SIGKILLed in its PMIx start left %s" % left)


def proc_stat(pid):
    """(comm, state, ppid) of a process, None when there is none."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return None
    rest = st[st.rindex(")") + 2:].split()
    return st[st.index("(") + 1:st.rindex(")")], rest[0], int(rest[1])


def running(pid):
    s = proc_stat(pid)
    return s is not None and s[1] not in "ZX"


def guard_of(launcher):
    """The launcher's worker guard: its child named dptp-run-guard."""
    for d in os.listdir("/proc"):
        s = proc_stat(int(d)) if d.isdigit() else None
        if s and s[0] == "dptp-run-guard" and s[2] == launcher:
            return int(d)
    return None


def case_guard_stopped():
    # someone SIGSTOPs the worker guard while the job runs: the job still
    # ends as it would have (its exit status), dptp-run kills the guard that
    # does not exit at the job's end, saying so in one line, and leaves no
    # process and no folder behind. dptp-run used to wait for the stopped
    # guard without a bound. The failing job restarts once while the guard
    # is stopped (its records wait in the pipe). DPTP_RUN_TIMING's phase
    # lines show the order of the launcher's end.
    for code, args, want in ((0, [], 0), (3, ["--max-restarts=1"], 1)):
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as tmpdir:
            script = ('echo $$$$ > %s/pid.$LOCAL_RANK; sleep 60 & echo $! > %s/child.$LOCAL_RANK; '
                      'echo "$OMPI_MCA_btl_vader_backing_directory" > %s/shm.$LOCAL_RANK; '
                      'while [ ! -e %s/go ]; do sleep 0.02; done; exit %d' % (d, d, d, d, code))
            p = subprocess.Popen([RUN, "--nproc-per-node=2"] + args + ["--no-python", "sh", "-c", script],
                                 env=base_env(TMPDIR=tmpdir, DPTP_RUN_TIMING="1"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE,
                                 text=True)
            guard, pids, err, left = None, set(), "", None

            def written(name):
                return [x for x in (os.path.join(d, "%s.%d" % (name, r)) for r in range(2))
                        if os.path.exists(x) and os.path.getsize(x) > 0]

            def note_pids():  # each attempt's workers and their children
                for x in written("pid") + written("child"):
                    with open(x) as f:
                        pids.update(int(v) for v in f.read().split())
            try:
                deadline = time.time() + 60
                while time.time() < deadline and p.poll() is None and not (guard and len(written("shm")) == 2):
                    guard = guard or guard_of(p.pid)
                    time.sleep(0.02)
                check(p.poll() is None and guard and len(written("shm")) == 2,
                      "the job did not start with a guard (rc %s)" % p.poll())
                note_pids()
                with open(os.path.join(d, "shm.0")) as f:
                    shm = f.read().strip()
                os.kill(guard, signal.SIGSTOP)
                deadline = time.time() + 10
                while time.time() < deadline and (proc_stat(guard) or "??")[1] != "T":
                    time.sleep(0.01)
                check((proc_stat(guard) or "??")[1] == "T", "the guard %d did not stop" % guard)
                made = [x for x in os.listdir(tmpdir) if x.startswith("dptp-run.")]
                check(len(made) == 1 and shm == "/dev/shm/" + made[0] and os.path.isdir(shm),
                      "expected one private tmpdir and its /dev/shm folder, found %s and %r" % (made, shm))
                open(os.path.join(d, "go"), "w").close()
                try:
                    _, err = p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    fail("dptp-run still runs 60 s after its job ended with its guard %d stopped" % guard)
                note_pids()
                left = [x for x in sorted(pids) + [guard] if running(x)]
                left_dirs = [x for x in os.listdir(tmpdir) if x.startswith("dptp-run.")] + (
                    [shm] if os.path.exists(shm) else [])
            finally:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
                note_pids()
                # not one of the test's own is left either (only when the
                # test fails: a pid that is gone may be someone else's now);
                # a guard still stopped cleans up after the killed dptp-run
                if left is None and guard and running(guard):
                    os.kill(guard, signal.SIGCONT)
                    deadline = time.time() + 5
                    while time.time() < deadline and running(guard):
                        time.sleep(0.01)
                for x in [x for x in sorted(pids) + ([guard] if guard else []) if running(x)] if left is None else left:
                    try:
                        os.kill(x, signal.SIGKILL)
                    except OSError:
                        pass
            check(p.returncode == want, "rc %d, not %d: %s" % (p.returncode, want, err))
            line = "dptp-run: warning: the guard (pid %d) did not exit within 2 s of the job's end; killed it" % guard
            lines = err.splitlines()
            check(lines.count(line) == 1, "no line %r in: %s" % (line, err))
            # its own folders were gone before it waited on the guard: a
            # dptp-run killed while it waits leaves none (the guard, once
            # it has 'q', removes nothing)
            done = [k for k, x in enumerate(lines) if x.endswith(" ms pmix server finalized")]
            check(len(done) == 1 and done[0] < lines.index(line), "the guard was waited for before the PMIx "
                  "server's folders were removed: %s" % err)
            check(code == 0 or "exitcode  : 3" in err, "no failure report: %s" % err)
            shutil.rmtree(shm, ignore_errors=True)
            check(not left, "processes left: %s" % left)
            check(not left_dirs, "folders left: %s" % left_dirs)


def case_session():
    # workers run in sessions of their own (torchrun's start_new_session)
    script = 'echo $$$$ $(ps -o sid= -p $$$$)'
    rc, out, err = run(["--nproc-per-node=2", "--no-python", "sh", "-c", script])
    check(rc == 0, err)
    for line in out.splitlines():
        pid, sid = line.split()
        check(pid == sid, "worker %s is not a session leader (sid %s)" % (pid, sid))
    # a worker reading the terminal is not stopped by SIGTTIN: dptp-run in
    # the foreground of a pseudo-terminal, the worker reads a line from it
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(RUN, [RUN, "--no-python", "sh", "-c", "read x; echo got:$x"], base_env())
    os.write(fd, b"hello\n")  # waits in the terminal until the worker reads
    buf, deadline = b"", time.time() + 20
    while time.time() < deadline and b"got:hello" not in buf:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                buf += os.read(fd, 4096)
            except OSError:
                break
    done = b"got:hello" in buf
    if not done:
        os.kill(pid, signal.SIGKILL)
    _, st = os.waitpid(pid, 0)
    os.close(fd)
    check(done, "a worker reading the terminal hung: %r" % buf)
    check(os.waitstatus_to_exitcode(st) == 0, "rc %r: %r" % (st, buf))


def case_stop_timeout():
    # a worker that ignores SIGTERM is killed after the grace period:
    # TORCH_ELASTIC_SHUTDOWN_TIMEOUT (newer torchrun) sets it, an empty
    # DPTP_RUN_STOP_TIMEOUT counts as unset
    with tempfile.TemporaryDirectory() as d:
        script = 'trap "" TERM; echo $$$$ > %s/pid; while :; do sleep 0.05; done' % d
        env = base_env(DPTP_RUN_STOP_TIMEOUT="", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1")
        p = subprocess.Popen([RUN, "--no-python", "sh", "-c", script], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 10
        while time.time() < deadline and not os.path.exists(d + "/pid"):
            time.sleep(0.02)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=25)
        took = time.time() - t0
        check(p.returncode == 1, "rc %d %s" % (p.returncode, err))
        # the default would be 30 s; 1 s plus scheduling must stay far below
        check(took < 15, "the worker outlived TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1 by %.1f s" % took)
    for var, val in (("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"), ("DPTP_RUN_STOP_TIMEOUT", "-1")):
        rc, out, err = run(["--no-python", "true"], env=base_env(**{"DPTP_RUN_STOP_TIMEOUT": "", var: val}))
        check(rc == 2 and err.strip() == "dptp-run: error: invalid %s '%s'" % (var, val), "%s=%s: %d %r" % (var, val, rc, err))


def case_logs():
    with tempfile.TemporaryDirectory() as d:
        script = 'echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2'
        rc, out, err = run(["--nproc-per-node=2", "--log-dir", d, "-r", "1", "-t", "2", "--no-python", "sh", "-c", script])
        check(rc == 0, err)
        runs = os.listdir(d)
        check(len(runs) == 1 and re.match(r"^none_[a-z0-9_]{8}$", runs[0]), runs)
        att = os.path.join(d, runs[0])
        check(os.listdir(att) == ["attempt_0"], os.listdir(att))
        for r in range(2):
            rd = os.path.join(att, "attempt_0", str(r))
            check(sorted(os.listdir(rd)) == ["stderr.log", "stdout.log"], os.listdir(rd))
            check(open(os.path.join(rd, "stdout.log")).read() == "out%d\n" % r, rd)
            check(open(os.path.join(rd, "stderr.log")).read() == "err%d\n" % r, rd)
        check(out == "", "redirected stdout reached the console: %r" % out)
        check(sorted(l for l in err.splitlines() if l.startswith("[")) == ["[default0]:err0", "[default1]:err1"], err)
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(["--nproc-per-node=3", "--log-dir", d, "--tee", "3", "--local-ranks-filter", "0,2",
                            "--role", "trainer", "--no-python", "sh", "-c", "echo hi$LOCAL_RANK"])
        check(rc == 0, err)
        check(sorted(out.splitlines()) == ["[trainer0]:hi0", "[trainer2]:hi2"], out)
        run_dir = os.path.join(d, os.listdir(d)[0], "attempt_0")
        check(open(os.path.join(run_dir, "1", "stdout.log")).read() == "hi1\n", "filtered rank's file")
    rc, out, err = run(["--nproc-per-node=2", "--tee", "1", "--no-python", "sh", "-c", "echo hi$RANK"],
                       env=base_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="${role_name}-${rank}-$local_rank| $$x "))
    check(rc == 0, err)
    check(sorted(out.splitlines()) == ["default-0-0| $x hi0", "default-1-1| $x hi1"], out)
    # without -r/-t workers write straight to the console, unprefixed
    rc, out, err = run(["--nproc-per-node=2", "--no-python", "sh", "-c", "echo hi $LOCAL_RANK"])
    check(sorted(out.splitlines()) == ["hi 0", "hi 1"], out)
    # whole lines only, even when 4 workers write long lines at once
    script = ("python3 -c \"import sys,os\nr=os.environ['LOCAL_RANK']\n"
              "for i in range(3000): sys.stdout.write(r*50+'%05d'%i+r*3000+'\\n')\"")
    rc, out, err = run(["--nproc-per-node=4", "--tee", "3", "--log-dir", "/dev/null", "--no-python", "sh", "-c", script])
    check(rc == 0, err)
    lines = out.splitlines()
    check(len(lines) == 12000, "%d lines" % len(lines))
    for l in lines:
        m = re.match(r"^\[default(\d)\]:(\d)+\d{5}(\d+)$", l)
        check(m and set(l.split(":", 1)[1][:50]) == {m.group(1)} and set(m.group(3)) == {m.group(1)},
              "interleaved line %r" % l[:120])


VALIDATION = [
    ([], "the following arguments are required: training_script, training_script_args"),
    (["--nproc-per-node"], "argument --nproc-per-node/--nproc_per_node: expected one argument"),
    (["--nproc-per-node=x", "t"], "Unsupported nproc_per_node value: x"),
    (["--nproc-per-node=0x8", "t"], "Unsupported nproc_per_node value: 0x8"),
    (["--max-restarts=0x1", "t"], "argument --max-restarts/--max_restarts: invalid int value: '0x1'"),
    (["--monitor-interval=0x1p3", "t"], "argument --monitor-interval/--monitor_interval: invalid float value: '0x1p3'"),
    (["--nnodes=a:b", "t"], 'nnodes=a:b is not in "MIN:MAX" format'),
    (["--nnodes=1:2", "t"], "elastic --nnodes=1:2 needs --rdzv-backend=c10d"),
    (["--nnodes=2", "--rdzv-backend=etcd", "t"], "--rdzv-backend=etcd with --nnodes=2 is not supported; use --rdzv-backend=c10d"),
    (["--nnodes=2", "--standalone", "t"], "--standalone is one node; --nnodes=2 asks for more"),
    (["--no-python", "-m", "t"], "Don't use both the '--no-python' flag and the '--module' flag at the same time."),
    (["--start-method=x", "t"], "argument --start-method/--start_method: invalid choice: 'x' (choose from 'spawn', 'fork', 'forkserver')"),
    (["--max-restarts=x", "t"], "argument --max-restarts/--max_restarts: invalid int value: 'x'"),
    (["--monitor-interval=x", "t"], "argument --monitor-interval/--monitor_interval: invalid float value: 'x'"),
    (["-r", "4", "t"], "4 does not match: <^[0-3]$> or <^(\\d:[0123],)*(\\d:[0123])$>"),
    (["--tee=0:1,10:2", "t"], "0:1,10:2 does not match"),
    (["--rdzv-conf=a", "t"], "The rendezvous configuration option 'a' must have a value specified."),
    (["--rdzv-conf==1", "t"], "The rendezvous configuration string must be in format <key1>=<value1>,...,<keyN>=<valueN>."),
    (["--local-ranks-filter=a", "t"], "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=1,2"),
    (["--standalone=1", "t"], "argument --standalone: ignored explicit argument '1'"),
    (["--n=1", "t"], "ambiguous option: --n could match --nnodes, --nproc-per-node, --nproc_per_node, --no-python, --no_python, --node-rank, --node_rank"),
    (["--bogus", "t"], "unrecognized arguments: --bogus"),
    (["--rdzv-backend=zk", "t"], "The rendezvous backend 'zk' is not registered"),
    (["--signals-to-handle=SIGFOO", "t"], "unknown or unhandleable signal in --signals-to-handle: 'SIGFOO'"),
]


def case_validation():
    for args, msg in VALIDATION:
        rc, out, err = run(args)
        check(rc == 2, "%s: rc %d" % (args, rc))
        check(err.startswith("usage: dptp-run [-h]"), "%s: no usage: %r" % (args, err))
        check("dptp-run: error: " + msg in err, "%s: %r" % (args, err))
    rc, out, err = run(["--nproc-per-node=2", "t"], env=base_env(PET_STANDALONE="x"))
    check(rc == 2 and "PET_STANDALONE" in err, err)
    # spellings, abbreviations, PET_* defaults, --opt v / --opt=v, REMAINDER
    for args in (["--nproc_per_node", "3"], ["--nproc-per-node=3"], ["--nproc-p", "3"], ["--nproc_per=3"],
                 ["--nproc-per-node=03"]):  # decimal, as torch's int(): 010 is ten
        rc, out, err = run(args + ["--no-python", "sh", "-c", "echo $WORLD_SIZE", "--nnodes=9"])
        check(rc == 0 and out.split() == ["3"] * 3, "%s: %r %r" % (args, out, err))
    # argparse counts spellings: a prefix of both spellings of one option is
    # ambiguous ("--nproc could match --nproc-per-node, --nproc_per_node")
    rc, out, err = run(["--nproc", "3", "--no-python", "true"])
    check(rc == 2 and "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node" in err, err)
    rc, out, err = run(["--no-python", "sh", "-c", "echo $WORLD_SIZE"], env=base_env(PET_NPROC_PER_NODE="2"))
    check(out.split() == ["2", "2"], out)
    rc, out, err = run(["--nproc-per-node=1", "--no-python", "sh", "-c", "echo $WORLD_SIZE"],
                       env=base_env(PET_NPROC_PER_NODE="2"))
    check(out.split() == ["1"], "CLI must win over PET_: %r" % out)
    rc, out, err = run(["-r3", "--no-python", "echo", "--nproc-per-node=5", "${local_rank}x"], env=base_env(PET_LOG_DIR="/dev/null"))
    check(rc == 0 and out == "", out)
    rc, out, err = run(["--no-python", "echo", "--nproc-per-node=5", "${local_rank}x", "$${local_rank}"])
    check(out == "--nproc-per-node=5 0x ${local_rank}\n", out)
    rc, out, err = run(["--no-python", "/nonexistent/prog"])
    check(rc == 1 and "cannot execute '/nonexistent/prog': No such file or directory (errno 2)" in err, err)
    rc, out, err = run(["--help"])
    check(rc == 0 and out.startswith("usage: dptp-run") and "--virtual_local_rank" in out, out)


def case_python_worker():
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "w.py")
        with open(script, "w") as f:
            # one write per line: with -u, print() writes piece by piece
            f.write("import os, sys\n"
                    "sys.stdout.write(' '.join(map(str, (os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
                    " os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], int(sys.orig_argv[1] == '-u'), *sys.argv[1:]))) + '\\n')\n")
        with open(os.path.join(d, "mod.py"), "w") as f:
            f.write("import os, sys\nsys.stdout.write(' '.join(('mod', os.environ['RANK'], __name__, *sys.argv[1:])) + '\\n')\n")
        p2 = free_port()
        rc, out, err = run(["--nproc-per-node=2", "--master-port=%d" % p2, script, "--x=${local_rank}"])
        check(rc == 0, err)
        check(sorted(out.splitlines()) == ["0 0 2 127.0.0.1 %d 1 --x=0" % p2, "1 1 2 127.0.0.1 %d 1 --x=1" % p2], out)
        rc, out, err = run(["--nproc-per-node=2", "-m", "mod", "a"], env=base_env(PYTHONPATH=d))
        check(rc == 0 and sorted(out.splitlines()) == ["mod 0 __main__ a", "mod 1 __main__ a"], out + err)
        # argparse's "--" after the module is not the module's
        rc, out, err = run(["-m", "mod", "--", "--depth=20", "--", "b"], env=base_env(PYTHONPATH=d))
        check(rc == 0 and out.splitlines() == ["mod 0 __main__ --depth=20 -- b"], out + err)
        # only the one right after the script (torchrun: "a -- b")
        rc, out, err = run(["--no-python", "echo", "a", "--", "b"])
        check(rc == 0 and out == "a -- b\n", out + err)
        # the interpreter: PYTHON_EXEC, else the active virtual environment's
        venv = os.path.join(d, "venv")
        os.makedirs(venv + "/bin")
        with open(venv + "/bin/python3", "w") as f:
            f.write("#!/bin/sh\necho venv-python \"$@\"\n")
        os.chmod(venv + "/bin/python3", 0o755)
        rc, out, err = run([script, "a"], env=base_env(VIRTUAL_ENV=venv))
        check(rc == 0 and out == "venv-python -u %s a\n" % script, out + err)
        rc, out, err = run([script, "a"], env=base_env(VIRTUAL_ENV=venv, PYTHON_EXEC=sys.executable))
        check(rc == 0 and out.startswith("0 0 1 "), out + err)
        rc, out, err = run(["--standalone", "--nproc-per-node=2", script])
        lines = out.split("\n")[0].split()
        check(rc == 0 and lines[4] != "29500", out)
        rc, out, err = run(["--standalone", "--no-python", "sh", "-c", "echo $TORCHELASTIC_RUN_ID"])
        check(re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", out.strip()), out)


def case_pmix():
    rc, out, err = run(["--nproc-per-node=4", "--no-python", PMIX_CLIENT])
    check(rc == 0, "rc %d: %s" % (rc, err))
    check(sorted(out.splitlines()) == ["pmix ok rank %d of 4" % r for r in range(4)], out + err)
    rc, out, err = run(["--nproc-per-node=2", "--max-restarts=1", "--no-python", "sh", "-c",
                        '%s && [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || exit 5' % PMIX_CLIENT])
    check(rc == 0, "restart with pmix: %s" % err)
    check(out.count("pmix ok") >= 2, out)
    rc, out, err = run(["--nproc-per-node=4", "--no-python", PMIX_CLIENT, "abort"], timeout=30)
    check(rc == 1, "abort rc %d" % rc)
    check("PMIx_Abort(7) called by PID" in err and "test abort" in err, err)
    # the private tmpdir: mode 0700 while the job runs, gone after it
    rc, out, err = run(["--no-python", "sh", "-c", 'stat -c "%a $PMIX_SERVER_TMPDIR" "$PMIX_SERVER_TMPDIR"'])
    check(rc == 0, err)
    mode, tmpdir = out.split()
    check(mode == "700" and "dptp-run." in tmpdir, out)
    check(not os.path.exists(tmpdir), "tmpdir %s left behind" % tmpdir)


def case_help_man():
    man = os.path.join(HERE, "..", "..", "man", "dptp-run.1.scd")
    rc, out, err = run(["--help"])
    opts = lambda t: set(re.findall(r"(?<![\w-])(--[a-z][a-z_-]*[a-z]|-[hmrt](?![\w-]))", t))
    h = opts(out.split("\noptions:\n", 1)[1])
    with open(man) as f:
        m = opts(f.read().split("# OPTIONS", 1)[1].split("# ENVIRONMENT", 1)[0])
    check(h == m, "--help and the man page differ: only in help %s, only in man %s" % (sorted(h - m), sorted(m - h)))


PROBE = os.path.join(HERE, "store_probe.py")


def case_agent_store():
    # PyTorch-style env:// clients reach the agent store; no TCPStore of a
    # failed attempt survives into the next one
    rc, out, err = run(["--nproc-per-node=3", "--no-python", sys.executable, PROBE, "check"])
    check(rc == 0, "rc %d: %s" % (rc, err))
    check(sorted(out.splitlines()) == ["store ok rank %d of 3" % r for r in range(3)], out + err)
    for extra in ([], ["--standalone"]):
        rc, out, err = run(extra + ["--nproc-per-node=2", "--max-restarts=1", "--no-python", sys.executable, PROBE,
                                    "stale-then-fail"])
        check(rc == 0, "%s rc %d: %s %s" % (extra, rc, out, err))
        check(sorted(out.splitlines()) == ["fresh store rank %d attempt 1" % r for r in range(2)], out + err)
    # the store binds --master-addr's address at --master-port
    with socket.socket() as s:
        s.bind(("127.0.0.1", PORT))
        s.listen()
        rc, out, err = run(["--nproc-per-node=1", "--no-python", "true"])
    check(rc == 1 and "cannot host the agent store at 127.0.0.1 port %d" % PORT in err, err)


def two_nodes(args0, args1, nproc=2, env=None, timeout=90, port=None, node1_port=None):
    """Runs node 0 and node 1 of a static 2-node job on loopback."""
    port = port or free_port()
    common = ["--nnodes=2", "--master-addr=127.0.0.1", "--rdzv-conf=timeout=60", "--nproc-per-node=%d" % nproc]
    e = base_env(**(env or {}))
    ps = []
    for k, (a, pt) in enumerate(((args0, port), (args1, node1_port or port))):
        ps.append(subprocess.Popen([RUN] + common + ["--node-rank=%d" % k, "--master-port=%d" % pt] + a, env=e,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    res = []
    t0 = time.monotonic()
    for p in ps:
        try:
            out, err = p.communicate(timeout=max(1, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in ps:
                q.kill()
            fail("2-node job did not finish within %d s" % timeout)
        res.append((p.returncode, out, err))
    return res


CHECK_EXE = os.environ.get("DPTP_CHECK")


def case_twonode_env():
    # ranks, sizes and the agent store across two launchers
    w = "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE $ROLE_RANK $TORCHELASTIC_USE_AGENT_STORE"
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--no-python", "sh", "-c", w], ["--no-python", "sh", "-c", w])
    check(rc0 == 0 and rc1 == 0, "rc %d/%d: %s %s" % (rc0, rc1, e0, e1))
    check(sorted(o0.splitlines()) == ["0 0 4 2 0 2 0 True", "1 1 4 2 0 2 1 True"], o0)
    check(sorted(o1.splitlines()) == ["2 0 4 2 1 2 2 True", "3 1 4 2 1 2 3 True"], o1)
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--no-python", sys.executable, PROBE, "check"],
                                             ["--no-python", sys.executable, PROBE, "check"])
    check(rc0 == 0 and rc1 == 0, "rc %d/%d: %s %s" % (rc0, rc1, e0, e1))
    check(sorted((o0 + o1).splitlines()) == ["store ok rank %d of 4" % r for r in range(4)], o0 + o1)
    # PMIx over both nodes: the test client fences over the whole job
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--no-python", PMIX_CLIENT], ["--no-python", PMIX_CLIENT])
    check(rc0 == 0 and rc1 == 0, "pmix rc %d/%d: %s %s" % (rc0, rc1, e0, e1))
    check(sorted((o0 + o1).splitlines()) == ["pmix ok rank %d of 4" % r for r in range(4)], o0 + o1)


def case_twonode_exit_barrier():
    # node 0's worker is done long before node 1 (a torchrun agent, played
    # here with the bytes of the static_2node capture, that never reaches the
    # barrier): the barrier times out with one warning naming it once
    sys.path.insert(0, HERE)
    from store_probe import Store
    port = free_port()
    node0 = subprocess.Popen([RUN, "--nnodes=2", "--node-rank=0", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                              "--master-port=%d" % port, "--rdzv-conf=timeout=30", "--no-python", "true"],
                             env=base_env(DPTP_RUN_EXIT_BARRIER_TIMEOUT="1"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    agent = Store("127.0.0.1", port)
    agent.set("none/torchelastic/role_info/1", '{"role": "default", "rank": 1, "local_world_size": 1}')
    check(agent.get("none/torchelastic/assigned_ranks/1") == b"[1, 2, 1, 2]", "assigned ranks")
    import threading
    hang_up = threading.Timer(2.5, agent.s.close)  # after node 0's barrier, so that it need not wait 5 s more
    hang_up.start()
    try:
        out, err = node0.communicate(timeout=30)
    finally:
        hang_up.cancel()
        agent.s.close()
    check(node0.returncode == 0, "node 0 rc %d: %s" % (node0.returncode, err))
    check(re.search(r"^W.* exit barrier: not every node finished within 1 s$", err, re.M), err)
    check("exit barrier: exit barrier" not in err, err)
    rc, out, err = run(["--no-python", "true"], env=base_env(DPTP_RUN_EXIT_BARRIER_TIMEOUT="soon"))
    check(rc == 2 and "invalid DPTP_RUN_EXIT_BARRIER_TIMEOUT 'soon'" in err, err)


def case_own_error_file():
    # as torchrun's @record on its main: the launcher's own failures (not
    # only its workers') land in its TORCHELASTIC_ERROR_FILE
    with tempfile.TemporaryDirectory() as d:
        ef = os.path.join(d, "launcher_error.json")

        def recorded():
            with open(ef) as f:
                msg = json.load(f)["message"]
            os.unlink(ef)
            check(msg["extraInfo"]["py_callstack"] == msg["message"] + "\n" and
                  int(msg["extraInfo"]["timestamp"]) > 0, msg)
            return msg["message"]

        # a rendezvous that times out
        rc, out, err = run(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % free_port(),
                            "--rdzv-conf=join_timeout=1", "--no-python", "true"],
                           env=base_env(TORCHELASTIC_ERROR_FILE=ef))
        check(rc == 1, "rc %d %s" % (rc, err))
        check(recorded() == "RendezvousTimeoutError: joining of the rendezvous 'none' timed out", err)
        # a signal while the workers run
        p = subprocess.Popen([RUN, "--no-python", "sh", "-c", "echo up; exec sleep 30"],
                             env=base_env(TORCHELASTIC_ERROR_FILE=ef), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        check(p.stdout.readline() == "up\n", "worker did not start")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        check(p.returncode == 1, "rc %d %s" % (p.returncode, err))
        check(recorded() == "SignalException: Process %d got signal: 15" % p.pid, err)
        # --logs-specs: torch raises ValueError for a name that is no entry point
        rc, out, err = run(["--logs-specs", "nosuch", "--no-python", "true"], env=base_env(TORCHELASTIC_ERROR_FILE=ef))
        want = "ValueError: Could not find entrypoint under 'torchrun.logs_specs[nosuch]' key"
        check(rc == 1 and err.strip().splitlines()[-1] == want, "rc %d %s" % (rc, err))
        check(recorded() == want, err)
        # one that is: dptp-run cannot load it, says so and runs
        dist = os.path.join(d, "site", "myspecs-1.0.dist-info")
        os.makedirs(dist)
        with open(os.path.join(dist, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: myspecs\nVersion: 1.0\n")
        with open(os.path.join(dist, "entry_points.txt"), "w") as f:
            f.write("[torchrun.logs_specs]\nmine = myspecs:Specs\n")
        rc, out, err = run(["--logs-specs", "mine", "--no-python", "echo", "ran"],
                           env=base_env(PYTHONPATH=os.path.join(d, "site"), TORCHELASTIC_ERROR_FILE=ef))
        check(rc == 0 and out == "ran\n" and "--logs-specs=mine is a Python entry point and is not loaded" in err,
              "rc %d %s %s" % (rc, out, err))
        check(not os.path.exists(ef), "an error file after a run that succeeded")


def case_host_names():
    # one FQDN, Python's socket.getfqdn(), for the report's host line and
    # --standalone's MASTER_ADDR; --local-addr overrides the latter
    fqdn = subprocess.run([sys.executable, "-c", "import socket; print(socket.getfqdn())"], capture_output=True,
                          text=True).stdout.strip()
    check(fqdn, "no FQDN from Python")
    rc, out, err = run(["--standalone", "--no-python", "sh", "-c", "echo $MASTER_ADDR"])
    check(rc == 0 and out == fqdn + "\n", "%r vs %r: %s" % (out, fqdn, err))
    rc, out, err = run(["--standalone", "--local-addr=127.0.0.1", "--no-python", "sh", "-c",
                        "echo $MASTER_ADDR; exec %s %s check" % (sys.executable, PROBE)])
    check(rc == 0 and out.splitlines() == ["127.0.0.1", "store ok rank 0 of 1"], "%s %s" % (out, err))
    rc, out, err = run(["--no-python", "sh", "-c", "exit 3"])
    check(rc == 1 and "  host      : %s\n" % fqdn in report_of(err), err)


def case_twonode_fail():
    # a worker failing on node 1 ends node 0's workers too, promptly
    t0 = time.monotonic()
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--no-python", "sleep", "30"],
                                             ["--no-python", "sh", "-c", "[ $LOCAL_RANK = 1 ] && exit 3; sleep 30"])
    dt = time.monotonic() - t0
    check(rc0 == 1 and rc1 == 1, "rc %d/%d" % (rc0, rc1))
    check(dt < 15, "took %.1f s" % dt)
    check("another node reported a failed attempt 0" in e0, e0)
    check("exitcode  : 3" in e1, e1)
    # restarts: both nodes restart together, the store has no worker key
    # of the failed attempt
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--max-restarts=1", "--no-python", sys.executable, PROBE, "stale-then-fail"],
                                             ["--max-restarts=1", "--no-python", sys.executable, PROBE, "stale-then-fail"])
    check(rc0 == 0 and rc1 == 0, "restart rc %d/%d: %s %s %s %s" % (rc0, rc1, o0, e0, o1, e1))
    check(sorted((o0 + o1).splitlines()) == ["fresh store rank %d attempt 1" % r for r in range(4)], o0 + o1)


def case_twonode_check():
    check(CHECK_EXE, "DPTP_CHECK is not set")
    env = {"DPTP_GPU_SHARING": "1"}  # both "nodes" share this machine's devices
    for inject, want_rc in ((None, 0), ("opid-seeded", 1), ("bcast-global-src", 1)):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            cmd = ["--no-python", CHECK_EXE, "--dp", "2", "--tp", "2", "--format", "json", "--output", out,
                   "--tokens", "8", "--hidden", "64", "--timeout", "20"] + (["--inject", inject] if inject else [])
            (rc0, o0, e0), (rc1, o1, e1) = two_nodes(cmd, cmd, env=env)
            check(rc0 == want_rc and rc1 == want_rc, "%s: rc %d/%d: %s %s" % (inject, rc0, rc1, e0[-800:], e1[-800:]))
            with open(out) as f:
                rep = json.load(f)
            check(rep["bootstrap"] == "pmix" and rep["layout"]["world"] == 4, rep)
            st = {(r["dp"], c["name"]): c["status"] for r in rep["replicas"] for c in r["checks"]}
            if inject is None:
                check(all(v == "pass" for v in st.values()), st)
            elif inject == "opid-seeded":
                check(st[(0, "opid")] == st[(1, "opid")] == "fail" and st[(0, "broadcast")] == "pass", st)
            else:
                check(st[(0, "broadcast")] == "pass" and st[(1, "broadcast")] == "fail", st)


def capture_streams(path):
    """{(conn, dir): bytes} from a torchrun-captures/*_trace_*.txt hex trace."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^(\d+)([<>]) ([0-9a-f]+)$", line.strip())
            if m:
                k = (int(m.group(1)), m.group(2))
                out[k] = out.get(k, b"") + bytes.fromhex(m.group(3))
    return out


def case_twonode_wire():
    # node 1's agent connection, recorded by a proxy in front of node 0's
    # store, must carry torchrun 2.11's bytes (static_2node capture, c1)
    import threading
    trace = os.path.join(HERE, "..", "data", "tcpstore", "static_2node_trace_2.11.txt")
    cap = capture_streams(trace)
    port, pport = free_port(), free_port()
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", pport))
    lsock.listen(16)
    conns = []

    def pump(src, dst, buf):
        while True:
            try:
                b = src.recv(65536)
            except OSError:
                b = b""
            if not b:
                for s_ in (src, dst):
                    try:
                        s_.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            buf.extend(b)
            try:
                dst.sendall(b)
            except OSError:
                return

    def accept():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            # node 0 may not listen yet: retry as a store client would,
            # rather than close node 1's connection under it
            u = None
            for _ in range(200):
                try:
                    u = socket.create_connection(("127.0.0.1", port))
                    break
                except OSError:
                    time.sleep(0.05)
            if u is None:
                c.close()
                continue
            rec = {">": bytearray(), "<": bytearray()}
            conns.append(rec)
            threading.Thread(target=pump, args=(c, u, rec[">"]), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, rec["<"]), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    # node 1 finishes last, as in the capture (it gets num_members 2)
    (rc0, o0, e0), (rc1, o1, e1) = two_nodes(["--no-python", "true"], ["--no-python", "sleep", "1"], nproc=1,
                                             port=port, node1_port=pport)
    lsock.close()
    check(rc0 == 0 and rc1 == 0, "rc %d/%d: %s %s" % (rc0, rc1, e0, e1))
    # the one that SETs node 1's role_info (dptp-run's own connection reads
    # every role_info too, to check the assignment)
    agent = [c for c in conns if b'"local_world_size"' in c[">"]]
    check(len(agent) == 1, "%d agent connections" % len(agent))
    got, want = bytes(agent[0][">"]), cap[(1, ">")]
    # the PING nonce is the agent's pid
    got = got[:6] + want[6:10] + got[10:]
    # Everything up to the terminal_state ADD must be byte-identical. What
    # follows depends on which node arrives last at the exit barrier, a
    # race in torchrun too: the last one SETs last_member (the capture), the
    # other WAITs on it.
    cut = want.index(b"num_members") + len(b"num_members") + 8
    check(got[:cut] == want[:cut], "node 1's agent bytes differ from torchrun 2.11's:\n got  %s\n want %s" % (got.hex(), want.hex()))
    tail = got[cut:]
    check(tail == want[cut:] or (tail[:1] == b"\x06" and b"last_member" in tail),
          "exit barrier: neither SET nor WAIT on last_member: %s" % tail.hex())
    gotr, wantr = bytes(agent[0]["<"]), cap[(1, "<")]
    gotr = wantr[:4] + gotr[4:]
    # the replies have the same shape either way; only the num_members ADD's
    # value (the arrival order: 1 or 2) may differ from the capture's
    same = (len(gotr) == len(wantr) and gotr[:-9] == wantr[:-9] and gotr[-1:] == wantr[-1:]
            and struct.unpack("<q", gotr[-9:-1])[0] in (1, 2))
    check(same, "replies differ:\n got  %s\n want %s" % (gotr.hex(), wantr.hex()))
    # dptp-run's own connection never counts as a node (no ADD init/)
    others = [c for c in conns if c is not agent[0]]
    check(all(b"init/" not in c[">"] for c in others), "an extra connection sent ADD init/")

def cpulist(cpus):
    """The kernel's list form of a set of CPUs ("0-3,8")."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(out)


def cpus_of(text):
    s = set()
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            s.update(range(int(a), int(b or a) + 1))
    return s


# the worker's own status (the shell opens it; "$$" is the launcher's escape)
OWN_CPUS = "while read l; do case $l in Cpus_allowed_list*) echo $l;; esac; done </proc/self/status"


def bound_cpus(args, env):
    """{local rank: Cpus_allowed_list} of each worker (the worker's own
    /proc status, not a child's)."""
    rc, out, err = run(args + ["--tee", "1", "--log-dir", "/dev/null", "--no-python", "sh", "-c", OWN_CPUS],
                       env=env)
    check(rc == 0, "rc %d: %s" % (rc, err))
    got = {}
    for line in out.splitlines():
        m = re.match(r"^\[default(\d+)\]:Cpus_allowed_list:\s*(\S+)$", line)
        if m:
            got[int(m.group(1))] = m.group(2)
    return got


def case_numa_binding():
    allowed = sorted(os.sched_getaffinity(0))
    half = max(1, len(allowed) // 2)
    n0, n1 = allowed[:half], allowed[half:] or allowed[:half]
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        # two NUMA nodes over this machine's CPUs; GPU 0 on node 1, GPU 1
        # says -1 (one-node machines do): node 0
        put("devices/system/node/possible", "0-1\n")
        put("devices/system/node/node0/cpulist", cpulist(n0) + "\n")
        put("devices/system/node/node1/cpulist", cpulist(n1) + "\n")
        put("bus/pci/devices/0000:81:00.0/numa_node", "1\n")
        put("bus/pci/devices/0000:01:00.0/numa_node", "-1\n")
        for c in allowed:
            put("devices/system/cpu/cpu%d/topology/physical_package_id" % c, "0\n")
        env = base_env(DPTP_RUN_TEST_SYSFS=root, DPTP_RUN_TEST_GPU_BUS_IDS="0000:81:00.0,0000:01:00.0")
        got = bound_cpus(["--numa-binding", "node", "--nproc-per-node", "2"], env)
        check(got == {0: cpulist(n1), 1: cpulist(n0)}, "node: %r (nodes %r %r)" % (got, n0, n1))
        got = bound_cpus(["--numa_binding=socket", "--nproc-per-node", "2"], env)
        check(got == {0: cpulist(allowed), 1: cpulist(allowed)}, "socket: %r" % got)
        # within the launcher's own affinity: under taskset, node 1 is n1's last CPU
        p = subprocess.run(["taskset", "-c", str(n1[-1]), RUN, "--numa-binding", "node", "--tee", "1",
                            "--log-dir", "/dev/null", "--no-python", "sh", "-c", OWN_CPUS],
                           env=env, capture_output=True, text=True, timeout=60)
        rc, out, err = p.returncode, p.stdout, p.stderr
        check(rc == 0 and out.split()[-1] == str(n1[-1]), "taskset: %r %r" % (out, err))
        # a local rank without a GPU: one line, exit 1, no worker started
        rc, out, err = run(["--numa-binding", "node", "--nproc-per-node", "3", "--no-python", "echo", "ran"], env=env)
        check(rc == 1 and out == "" and
              "dptp-run: error: --numa-binding=node: local rank 2 has no GPU: 2 CUDA devices are visible\n" in err,
              "rc %d %r %r" % (rc, out, err))
        env["DPTP_RUN_TEST_GPU_BUS_IDS"] = "0000:99:00.0"
        rc, out, err = run(["--numa-binding", "node", "--no-python", "echo", "ran"], env=env)
        check(rc == 1 and out == "" and "--numa-binding=node: local rank 0 (GPU 0000:99:00.0): cannot read " in err,
              "rc %d %r %r" % (rc, out, err))
    # the real sysfs, with any PCI device standing in for the GPU
    devs = sorted(d for d in os.listdir("/sys/bus/pci/devices")
                  if os.path.exists("/sys/bus/pci/devices/%s/numa_node" % d)) if os.path.isdir("/sys/bus/pci/devices") else []
    if devs and os.path.isdir("/sys/devices/system/node"):
        node = max(int(open("/sys/bus/pci/devices/%s/numa_node" % devs[0]).read()), 0)
        want = cpus_of(open("/sys/devices/system/node/node%d/cpulist" % node).read()) & set(allowed)
        got = bound_cpus(["--numa-binding", "node"], base_env(DPTP_RUN_TEST_GPU_BUS_IDS=devs[0]))
        check(got == {0: cpulist(want)}, "real sysfs (%s, node %d): %r, want %s" % (devs[0], node, got, cpulist(want)))
    else:
        print("no NUMA information in /sys: real-sysfs check skipped")
    # CUDA itself: bound where there is a GPU, else one error line
    rc, out, err = run(["--numa-binding", "node", "--no-python", "sh", "-c", OWN_CPUS])
    check(rc == 0 or (rc == 1 and re.search(r"^dptp-run: error: --numa-binding=node: (no CUDA driver to map GPUs to NUMA "
                                            r"nodes|no CUDA GPUs are available)", err, re.M)), "rc %d: %r" % (rc, err))


def attempt_files(d):
    """{path below the run folder: content} of every file a run left."""
    out = {}
    run_dir = os.path.join(d, os.listdir(d)[0])
    for top, _, files in os.walk(run_dir):
        for f in files:
            p = os.path.join(top, f)
            out[os.path.relpath(p, run_dir)] = open(p).read()
    return out


def case_duplicate_filters():
    # torchrun 2.11 on the GPU box, same worker output: filtered_std*.log in
    # the attempt folder, prefixed lines of the tee'd streams that contain a
    # needle; the files are made (empty) without tee too
    script = "echo apple from $RANK; echo banana; echo an orange; echo 'apple,x'; echo warn: err >&2; echo quiet >&2"
    dup = ["--duplicate-stdout-filters", "apple,orange", "--duplicate_stderr_filters", "warn"]
    sort = lambda t: sorted(t.splitlines())

    def go(args, env=None, nproc=2):
        with tempfile.TemporaryDirectory() as d:
            rc, out, err = run(["--nproc-per-node", str(nproc), "--log-dir", d] + args + ["--no-python", "sh", "-c", script],
                               env=env)
            check(rc == 0, "%s: rc %d %s" % (args, rc, err))
            return attempt_files(d)

    f = go(["--tee", "3"] + dup)
    check(sort(f["attempt_0/filtered_stdout.log"]) == ["[default0]:an orange", "[default0]:apple from 0", "[default0]:apple,x",
                                                       "[default1]:an orange", "[default1]:apple from 1", "[default1]:apple,x"],
          f["attempt_0/filtered_stdout.log"])
    check(sort(f["attempt_0/filtered_stderr.log"]) == ["[default0]:warn: err", "[default1]:warn: err"], f)
    # each worker's lines keep their order
    lines0 = [l for l in f["attempt_0/filtered_stdout.log"].splitlines() if l.startswith("[default0]")]
    check(lines0 == ["[default0]:apple from 0", "[default0]:an orange", "[default0]:apple,x"], lines0)
    check(f["attempt_0/0/stdout.log"].startswith("apple from 0\nbanana\n"), f)
    for args in (["--redirects", "3"], []):
        f = go(args + dup)
        check(f.get("attempt_0/filtered_stdout.log") == "" and f.get("attempt_0/filtered_stderr.log") == "",
              "%s: %r" % (args, f))
    f = go(["--tee", "1"] + dup)
    check(len(f["attempt_0/filtered_stdout.log"].splitlines()) == 6 and f["attempt_0/filtered_stderr.log"] == "", f)
    # ",," is a literal comma; an empty needle matches every line
    f = go(["--tee", "3", "--duplicate-stdout-filters", "apple,,x"], nproc=1)
    check(f["attempt_0/filtered_stdout.log"] == "[default0]:apple,x\n" and "attempt_0/filtered_stderr.log" not in f, f)
    f = go(["--tee", "3", "--duplicate-stderr-filters", ""], nproc=1)
    check(f["attempt_0/filtered_stderr.log"] == "[default0]:warn: err\n[default0]:quiet\n" and
          "attempt_0/filtered_stdout.log" not in f, f)
    # not given: no file; PET_ default; ranks outside --local-ranks-filter are not copied
    f = go(["--tee", "3"])
    check(not any("filtered" in k for k in f), f)
    f = go(["--tee", "3", "--local-ranks-filter", "1"], env=base_env(PET_DUPLICATE_STDOUT_FILTERS="orange"))
    check(f["attempt_0/filtered_stdout.log"] == "[default1]:an orange\n", f)
    # a prefix template applies to the copies too; every attempt has its file
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(["--max-restarts", "1", "--tee", "1", "--log-dir", d, "--duplicate-stdout-filters", "try",
                            "--no-python", "sh", "-c", "echo try $TORCHELASTIC_RESTART_COUNT; exit $((1 - $TORCHELASTIC_RESTART_COUNT))"],
                           env=base_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${rank}> "))
        check(rc == 0, err)
        f = attempt_files(d)
        check(f["attempt_0/filtered_stdout.log"] == "<0> try 0\n" and f["attempt_1/filtered_stdout.log"] == "<0> try 1\n", f)


def captured_events():
    """{case: [event dict]} from torchrun 2.11's console handler."""
    out, cur = {}, None
    for line in read("torchrun_2.11_events.txt").splitlines():
        if line.startswith("== "):
            cur = out.setdefault(line[3:], [])
        elif line.startswith("{"):
            cur.append(json.loads(line))
    return out


def events_of(err):
    """The event lines of a run's stderr; each must be exactly what
    Python's json.dumps writes for its own content."""
    evs = []
    for line in err.splitlines():
        if line.startswith('{"name": "torchelastic.'):
            ev = json.loads(line)
            check(json.dumps(ev) == line, "not json.dumps' form:\n %s\n %s" % (line, json.dumps(ev)))
            check(json.dumps(json.loads(ev["metadata"]["metadata"])) == ev["metadata"]["metadata"], line)
            evs.append(ev)
    return evs


def same_events(got, want, what):
    """Event by event: the same names, sources, keys in the same order and
    values, except what differs between machines and runs."""
    check(len(got) == len(want), "%s: %d events, torchrun %d:\n%s" % (what, len(got), len(want),
                                                                    "\n".join(e["name"] for e in got)))
    for g, w in zip(got, want):
        check(list(g) == list(w) and list(g["metadata"]) == list(w["metadata"]), "%s: keys %r" % (what, g))
        for k in ("name", "source", "timestamp"):
            check(g[k] == w[k], "%s: %s %r != %r" % (what, k, g[k], w[k]))
        gm, wm = g["metadata"], w["metadata"]
        for k in wm:
            if k in ("hostname", "worker_id", "metadata"):
                continue
            if k == "duration_ms":
                check((gm[k] is None) == (wm[k] is None) and (gm[k] is None or isinstance(gm[k], float)), "%s: %r" % (what, g))
            else:
                check(gm[k] == wm[k], "%s: %s: %r, torchrun %r" % (what, k, gm[k], wm[k]))
        check(gm["hostname"] == socket.getfqdn(socket.gethostname()), gm["hostname"])
        check((gm["worker_id"] is None) == (wm["worker_id"] is None), "%s: worker_id %r" % (what, gm))
        gi, wi = json.loads(gm["metadata"]), json.loads(wm["metadata"])
        check(list(gi) == list(wi), "%s: inner keys %r" % (what, gi))
        for k in wi:
            if k == "entry_point":
                check(gi[k] == "sh", gi)
            elif k == "worker_pid":
                check((gi[k] == [None]) == (wi[k] == [None]), gi)
            else:
                check(gi[k] == wi[k], "%s: %s: %r, torchrun %r" % (what, k, gi[k], wi[k]))


def case_events():
    cap = captured_events()
    ev = ["--event-log-handler", "console"]
    rc, out, err = run(ev + ["--nproc-per-node=2", "--no-python", "sh", "-c", "true"])
    check(rc == 0, err)
    got = events_of(err)
    # torchrun's START and end events come in local rank order
    same_events(got, cap["ok_2"], "ok_2")
    check([e["metadata"]["worker_id"] for e in got[2:4]] == [e["metadata"]["worker_id"] for e in got[4:6]], got)
    rc, out, err = run(ev + ["--max-restarts", "1", "--nproc-per-node=2", "--no-python", "sh", "-c",
                             "exit $((3 - 3 * $TORCHELASTIC_RESTART_COUNT))"])
    check(rc == 0, err)
    same_events(events_of(err), cap["restart_2"], "restart_2")
    rc, out, err = run(ev + ["--no-python", "sh", "-c", "exit 3"])
    check(rc == 1, err)
    got = events_of(err)
    same_events(got, cap["fail_1"], "fail_1")
    check(got[3]["metadata"]["worker_id"] == str(json.loads(got[3]["metadata"]["metadata"])["worker_pid"][0]), got[3])
    # the events come before the failure report, as torchrun's
    check(err.index('"source": "AGENT"') < err.index("ChildFailedError"), err)
    # a sibling stopped after the failure is FAILED by SIGTERM, and the shared
    # <NONE> data carries errorTraits (torch mutates one dict); the raw_error
    # of an error file is json.dumps of its content, errorTraits added to an
    # empty message
    text = '{"errorTraits": 1, "message": "", "x": [1.5e-7, -0, 1E400, "\\u00e9\u00e9\\n\\ud800", 1e16, 0.1, 100.0, 2.5e-5, true, null], "y": {}}'
    worker = ("import os, sys, time\nif os.environ['LOCAL_RANK'] == '1':\n    time.sleep(30)\n"
              "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write(%r)\nsys.exit(2)\n" % text)
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(ev + ["--nproc-per-node=2", "--log-dir", d, "--no-python", "python3", "-c", worker])
    check(rc == 1, err)
    ends = [e for e in events_of(err) if e["source"] == "WORKER" and e["name"].endswith("FAILED")]
    check(len(ends) == 2, err)
    want = json.loads(text)
    want["errorTraits"] = {"category": "system_terminated_error", "retryability": "False"}
    check(ends[0]["metadata"]["raw_error"] == json.dumps(want), "%s\n%s" % (ends[0]["metadata"]["raw_error"], json.dumps(want)))
    inner = json.loads(ends[1]["metadata"]["metadata"])
    check(inner["exit_code"] == [-15] and ends[1]["metadata"]["raw_error"] == '{"message": "<NONE>"}', str(ends[1]))
    # without an error file, exit 3: torch adds errorTraits to its one shared
    # <NONE> dict, so the SIGTERMed sibling shows them too
    rc, out, err = run(ev + ["--nproc-per-node=2", "--no-python", "sh", "-c", "[ $LOCAL_RANK = 1 ] && exit 3; sleep 20"])
    check(rc == 1, err)
    same_events(events_of(err), cap["fail_2"], "fail_2")
    ends = [e for e in events_of(err) if e["source"] == "WORKER" and e["name"].endswith("FAILED")]
    traits = json.dumps({"message": "<NONE>", "errorTraits": want["errorTraits"]})
    check(len(ends) == 2 and all(e["metadata"]["raw_error"] == traits for e in ends), err)
    # silent: null, dynamic_rendezvous, LOGLEVEL above INFO; unknown: exit 1
    for args, env in ((["--event-log-handler", "null"], None), (["--event_log_handler=dynamic_rendezvous"], None),
                      (ev, base_env(LOGLEVEL="WARNING")), ([], base_env(PET_EVENT_LOG_HANDLER="null"))):
        rc, out, err = run(args + ["--no-python", "true"], env=env)
        check(rc == 0 and "torchelastic." not in err and "warning" not in err, "%s: %r" % (args, err))
    rc, out, err = run(["--no-python", "true"], env=base_env(PET_EVENT_LOG_HANDLER="console"))
    check(rc == 0 and len(events_of(err)) == 5, err)
    rc, out, err = run(["--event-log-handler", "syslog", "--no-python", "echo", "ran"])
    check(rc == 1 and out == "" and err == "dptp-run: error: --event-log-handler=syslog: there is no such handler "
          "(console, dynamic_rendezvous, null)\n", "rc %d %r" % (rc, err))
    # two static nodes: node 1's group, its workers' global ranks, the
    # role's world size (as torch's _assign_worker_ranks gives them)
    res = two_nodes(ev + ["--no-python", "true"], ev + ["--no-python", "true"])
    check(all(r[0] == 0 for r in res), res)
    got = events_of(res[1][2])
    check([e["name"].rsplit(".", 1)[1] for e in got] ==
          ["RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START", "START", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"], res[1][2])
    inner = [json.loads(e["metadata"]["metadata"]) for e in got]
    check([e["metadata"]["group_rank"] for e in got] == [None, None, 1, 1, 1, 1, 1], got)
    check([i["group_world_size"] for i in inner] == [None, None, 2, 2, 2, 2, 2], inner)
    check([e["metadata"]["global_rank"] for e in got[2:6]] == [2, 3, 2, 3], got)
    check([i["role_rank"] + i["role_world_size"] for i in inner[2:6]] == [[2, 4], [3, 4], [2, 4], [3, 4]], inner)
    # a run that ends by a signal: the agent's FAILED
    p = subprocess.Popen([RUN] + ev + ["--no-python", "sleep", "30"], env=base_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    got = events_of(err)
    check([e["name"].rsplit(".", 1)[1] for e in got] == ["RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START", "FAILED"], err)
    check(got[-1]["source"] == "AGENT" and
          got[-1]["metadata"]["raw_error"] == "SignalException: Process %d got signal: 15" % p.pid, got[-1])


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}

if __name__ == "__main__":
    CASES[sys.argv[3]]()
    print("ok " + sys.argv[3])
