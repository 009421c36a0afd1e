#!/usr/bin/env python3
"""MPI programs under dptp-run, with mpirun as the control.

usage: mpi_e2e.py DPTP_RUN PMIX_CASES CASE
Compiles mpi_prog.c with mpicc (Debian's libopenmpi-dev) into a temporary
directory; the MPI cases exit 77 (skipped) without mpicc or mpirun. Cases:
  programs    hello, ring, allreduce, split: one job of 4 ranks, the same
              sorted output as under mpirun
  mpi4py      mpi4py_prog.py with /usr/bin/python3, as under mpirun
  abort       MPI_Abort(7) on rank 3 ends the job; the report names rank
              and code; nothing left in /dev/shm
  abort_restart  the same with --max-restarts=1: two attempts, none leaks
  nofinalize  rank 3 returns 0 without MPI_Finalize: an abnormal end, not
              a hang; nothing left in /dev/shm
  spawn       MPI_Comm_spawn is refused with a message naming the rank and
              the job ends at once with it as the root cause, under
              MPI_ERRORS_ARE_FATAL and MPI_ERRORS_RETURN alike
  twonode_static, twonode_c10d
              two dptp-run nodes on loopback (2 ranks each, DPTP_HOSTNAME
              node0/node1), static or c10d rendezvous: hello, alltoall,
              allreduce, split and MPI-IO print what one mpirun job of 4
              ranks prints (hello and alltoall twice); the Open MPI
              variables, universe size and session directory as mpirun's
  c10d_regroup  c10d 1:2: node 0 alone runs 2 MPI ranks; node 1 joins,
              the next round is one MPI job of 4 over both nodes
  mixed       static, node 1 a torchrun agent (a stand-in): node 0's MPI
              workers fail in MPI_Init (no singletons), node 0 exits 1
  nodeloss    two static nodes; SIGKILL of node 1's launcher, then of node
              0's (the store host), SIGTERM of node 1's, with MPI ranks
              blocked in a receive and with plain workers: the other node
              ends its workers and exits 1 within the heartbeat bound,
              naming the lost node
  sigusr      SIGUSR1, SIGUSR2 to dptp-run: forwarded to the workers, which
              die of it: exit 1, the signal in the report, /dev/shm clean
  pmix-MODE   pmix_cases MODE (our own PMIx clients: hello, client, dmodex,
              nodeinfo, jctrl, log, query, dynamic, event) under dptp-run;
              pmix-gds: PMIX_MCA_gds settings; pmix-twonode_event: an event
              across two dptp-run nodes; pmix-twonode_query: the whole job's
              process table on each of two nodes"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.abspath(sys.argv[1])
PMIX_CASES = os.path.abspath(sys.argv[2])
CASE = sys.argv[3]
NP = 4
SKIP = 77


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def base_env():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "LC_ALL": "C",
           "DPTP_RUN_STOP_TIMEOUT": "5",
           # one node: the agent store takes any free port
           "PET_MASTER_PORT": "0",
           # the machine has fewer cores than ranks; no network beyond loopback
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           # containers often forbid the cross-process reads (CMA) vader tries
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    for k in ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def dptp_run(cmd, timeout=90, **env):
    p = subprocess.run([RUN, "--nproc-per-node=%d" % NP, "--no-python"] + cmd, env=dict(base_env(), **env),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def mpirun(cmd, timeout=90):
    env = base_env()
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun", "-np", str(NP), "--oversubscribe"] + cmd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def lines(out):
    return sorted(l for l in out.splitlines() if l.strip())


def shm_left(out):
    """The /dev/shm files the workers reported mapping ("shm PATH") that
    are still there."""
    paths = sorted(set(l.split(" ", 1)[1] for l in out.splitlines() if l.startswith("shm /dev/shm/")))
    check(paths, "the workers reported no shared-memory file: the check would prove nothing")
    return [p for p in paths if os.path.exists(p)]


def build(tmp):
    exe = os.path.join(tmp, "mpi_prog")
    p = subprocess.run(["mpicc", "-O1", "-o", exe, os.path.join(HERE, "mpi_prog.c")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode == 0, "mpicc failed:\n" + p.stdout)
    return exe


def case_programs(exe):
    # the Open MPI selection variables: added, but a user's own setting wins
    rc, out, err = dptp_run(["sh", "-c", 'echo "$OMPI_MCA_schizo $OMPI_MCA_ess"'], OMPI_MCA_ess="pmi")
    check(rc == 0 and lines(out) == ["^orte pmi"] * NP, "OMPI_MCA_* in the workers: %r %s" % (out, err[-500:]))
    for mode in ("hello", "ring", "allreduce", "split"):
        rc, out, err = dptp_run([exe, mode])
        check(rc == 0, "%s under dptp-run: exit %d\n%s" % (mode, rc, err[-3000:]))
        mrc, mout, merr = mpirun([exe, mode])
        check(mrc == 0, "%s under mpirun: exit %d\n%s" % (mode, mrc, merr[-3000:]))
        check(len(lines(out)) == NP, "%s: %d lines under dptp-run, want %d:\n%s" % (mode, len(lines(out)), NP, out))
        check(lines(out) == lines(mout), "%s: dptp-run and mpirun differ:\n%s---\n%s" % (mode, out, mout))
        print("ok %s: %s" % (mode, lines(out)[-1]))


def case_mpi4py(exe):
    py = "/usr/bin/python3"
    probe = subprocess.run([py, "-c", "import mpi4py"], stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        print("SKIP: /usr/bin/python3 has no mpi4py (python3-mpi4py)")
        sys.exit(SKIP)
    script = os.path.join(HERE, "mpi4py_prog.py")
    rc, out, err = dptp_run([py, script])
    check(rc == 0, "mpi4py under dptp-run: exit %d\n%s" % (rc, err[-3000:]))
    mrc, mout, merr = mpirun([py, script])
    check(mrc == 0, "mpi4py under mpirun: exit %d\n%s" % (mrc, merr[-3000:]))
    check(lines(out) == lines(mout), "dptp-run and mpirun differ:\n%s---\n%s" % (out, mout))
    check(len(lines(out)) == NP and "rank 3/4" in out, "not one job of %d ranks:\n%s" % (NP, out))
    print("ok mpi4py: %s" % lines(out)[-1])


def abnormal(exe, mode, want, restarts=0):
    t0 = time.time()
    rc, out, err = dptp_run(["--max-restarts=%d" % restarts, exe, mode], timeout=60)
    took = time.time() - t0
    check(rc != 0, "%s: dptp-run exited 0\n%s" % (mode, err[-3000:]))
    for w in want:
        check(w in err, "%s: no '%s' in the report:\n%s" % (mode, w, err[-3000:]))
    left = shm_left(out)
    check(not left, "%s: left in /dev/shm: %s" % (mode, left))
    print("ok %s: exit %d in %.1f s, /dev/shm clean" % (mode, rc, took))


def case_abort(exe):
    abnormal(exe, "abort", ["rank 3 called PMIx_Abort(7)", "rank      : 3 (local_rank: 3)", "exitcode  : 7"])


def case_abort_restart(exe):
    """both attempts abort: neither leaves its segments"""
    abnormal(exe, "abort", ["rank 3 called PMIx_Abort(7)", "exitcode  : 7"], restarts=1)


def case_nofinalize(exe):
    abnormal(exe, "nofinalize", ["rank 3 (pid", "without calling PMIx_Finalize", "rank      : 3 (local_rank: 3)"])


def case_spawn(exe):
    # the refusal ends the job at once, as its root cause, whatever the
    # error handler (with MPI_ERRORS_RETURN the other ranks wait inside
    # Open MPI for the root: a hang until the job is ended)
    for mode in ("spawn", "spawn_return"):
        abnormal(exe, mode, ["dptp-run: error: rank 0 asked to spawn '/bin/true'", "rank      : 0 (local_rank: 0)",
                             "error_file: <N/A>\n  traceback : rank 0 asked to spawn '/bin/true'"])


def wait_lines(ps, want, timeout=60):
    """Reads the jobs' stdout until `want` lines say "waiting"; returns it."""
    import selectors
    bufs = [""] * len(ps)
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    for k, p in enumerate(ps):
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, k)
    while sum(b.count("waiting") for b in bufs) < want and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            chunk = key.fileobj.read()
            if chunk:
                bufs[key.data] += chunk
    sel.close()
    if sum(b.count("waiting") for b in bufs) < want:
        for p in ps:
            p.kill()
        check(False, "the job did not start: %s %s" % (bufs, [p.communicate()[1][-2000:] for p in ps]))
    return bufs


def case_sigusr(exe):
    """SIGUSR1 and SIGUSR2 to dptp-run reach the workers, as mpirun forwards
    them: ranks that die of it end the job (exit 1, the signal in the
    report) and their shared memory is gone"""
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        p = subprocess.Popen([RUN, "--nproc-per-node=%d" % NP, "--no-python", exe, "wait"], env=base_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = wait_lines([p], NP)[0]
        t0 = time.monotonic()
        p.send_signal(sig)
        try:
            rest, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            check(False, "%s: the job did not end" % sig.name)
        out += rest
        check(p.returncode == 1, "%s: dptp-run exited %d\n%s" % (sig.name, p.returncode, err[-3000:]))
        check("Signal %d (%s) received by PID" % (sig, sig.name) in err, "%s: not in the report:\n%s" % (sig.name, err[-3000:]))
        left = shm_left(out)
        check(not left, "%s: left in /dev/shm: %s" % (sig.name, left))
        print("ok %s: exit 1 in %.1f s, /dev/shm clean" % (sig.name, time.monotonic() - t0))


def pmix_gds():
    """PMIX_MCA_gds without hash is refused (exit 2, a message), not a hang
    or a crash; with hash, each shared-memory store serves the job"""
    for gds in ("ds21", "ds12"):
        rc, out, err = dptp_run([PMIX_CASES, "client"], timeout=30, PMIX_MCA_gds=gds)
        check(rc == 2 and "PMIX_MCA_gds='%s' leaves out 'hash'" % gds in err, "gds %s: exit %d\n%s" % (gds, rc, err))
    for gds in ("ds21,hash", "ds12,hash", "hash"):
        rc, out, err = dptp_run([PMIX_CASES, "client"], timeout=60, PMIX_MCA_gds=gds)
        check(rc == 0 and out.count("client ok rank") == NP, "gds %s: exit %d\n%s%s" % (gds, rc, out, err))
    print("ok pmix gds")


def free_port():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pmix_twonode(mode):
    """two dptp-runs on loopback (nodes 0 and 1, 2 ranks each, DPTP_HOSTNAME
    node0/node1): event: rank 0's job-wide event reaches the ranks of node 1
    too; query: every rank's process table lists the whole job (pids from
    both nodes, each rank's node by name)"""
    for attempt in range(3):  # the port picked here may be taken meanwhile
        port = free_port()
        common = [RUN, "--nnodes=2", "--master-addr=127.0.0.1", "--master-port=%d" % port, "--nproc-per-node=2",
                  "--rdzv-conf=timeout=60"]
        env = dict(base_env(), PET_MASTER_PORT=str(port))
        ps = [subprocess.Popen(common + ["--node-rank=%d" % k, "--no-python", PMIX_CASES, mode],
                               env=dict(env, DPTP_HOSTNAME="node%d" % k),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
        res = []
        for p in ps:
            try:
                res.append(p.communicate(timeout=90) + (p.returncode,))
            except subprocess.TimeoutExpired:
                for q in ps:
                    q.kill()
                check(False, "2-node event job did not finish within 90 s")
        if any("Address already in use" in e for _, e, _ in res):
            continue
        out = "".join(o for o, _, _ in res)
        want = ["%s ok rank %d" % (mode, r) for r in range(4)]
        if mode == "query":
            want += ["query hosts rank %d: node0 node0 node1 node1" % r for r in range(4)]
        check(all(rc == 0 for _, _, rc in res) and sorted(lines(out)) == sorted(want),
              "2-node %s: %s\n%s" % (mode, [rc for _, _, rc in res], "".join(o + e[-2000:] for o, e, _ in res)))
        print("ok pmix twonode_" + mode)
        return
    check(False, "no free port for the 2-node job")


TWO_ENV = {"OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
           "OMPI_MCA_oob_tcp_if_include": "lo"}
# heartbeats every second, a node silent for 3 s is lost
HB_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3"


def start_two(backend, cmd, conf="timeout=60", **extra):
    """Starts nodes 0 and 1 (2 ranks each) of one job on loopback; returns
    the Popen objects (their own sessions: a kill reaches the launcher)."""
    port = free_port()
    env = dict(base_env(), **TWO_ENV, **extra)
    ps = []
    for k in (0, 1):
        if backend == "c10d":
            rdzv = ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % port, "--rdzv-id=two%d" % port,
                    "--rdzv-conf=" + conf + ",is_host=%d" % (k == 0)]
        else:
            rdzv = ["--node-rank=%d" % k, "--master-addr=127.0.0.1", "--master-port=%d" % port, "--rdzv-conf=" + conf]
        ps.append(subprocess.Popen([RUN, "--nnodes=2", "--nproc-per-node=2", "--no-python"] + rdzv + cmd,
                                   env=dict(env, DPTP_HOSTNAME="node%d" % k, PET_MASTER_PORT=str(port)),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return ps


def finish(ps, timeout=90):
    res = []
    deadline = time.monotonic() + timeout
    for p in ps:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            res.append((p.returncode, out, err))
        except subprocess.TimeoutExpired:
            for q in ps:
                q.kill()
            for q in ps:
                q.communicate()
            check(False, "two-node job did not finish within %d s" % timeout)
    return res


def two_nodes(backend, cmd):
    for attempt in range(3):  # the port picked here may be taken meanwhile
        res = finish(start_two(backend, cmd))
        if any("Address already in use" in e for _, e, _ in res):
            continue
        check(all(rc == 0 for rc, _, _ in res), "%s %s: exits %s\n%s" % (backend, cmd, [rc for rc, _, _ in res],
              "".join(e[-2500:] for _, _, e in res)))
        return "".join(o for _, o, _ in res), "".join(e for _, _, e in res)
    check(False, "no free port for the two-node job")


def sessions_left(before, settle=5.0):
    """Open MPI session directories in /tmp that were not there before and
    hold something no live process owns. The other mpi tests run beside this
    one, and their mpirun controls keep /tmp/ompi.<host>.<uid>/pid.<their pid>
    while they run: those are theirs, not left by this test's jobs."""
    def held(top):
        try:
            names = os.listdir(os.path.join("/tmp", top))
        except FileNotFoundError:
            return True  # gone: its last mpirun removed it
        if not names:
            return False  # left empty, unless a running mpirun removes it soon
        for n in names:
            pid = n[4:] if n.startswith("pid.") else ""
            if not (pid.isdigit() and os.path.exists("/proc/" + pid)):
                return False
        return True
    end = time.monotonic() + settle
    while True:
        left = [d for d in set(os.listdir("/tmp")) - before if d.startswith("ompi.") and not held(d)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def twonode(exe, backend):
    tmp = tempfile.mkdtemp(prefix="dptp-two.")
    sessions = set(os.listdir("/tmp"))
    try:
        probe = os.path.join(tmp, "probe.sh")
        with open(probe, "w") as f:
            f.write('echo "env $OMPI_COMM_WORLD_RANK $OMPI_COMM_WORLD_LOCAL_RANK $OMPI_COMM_WORLD_LOCAL_SIZE '
                    '$OMPI_COMM_WORLD_NODE_RANK $OMPI_COMM_WORLD_SIZE"\n')
        out, _ = two_nodes(backend, ["sh", probe])
        check(lines(out) == ["env %d %d 2 %d 4" % (r, r % 2, r % 2) for r in range(NP)], "OMPI_COMM_WORLD_*:\n" + out)
        runs = [["hello"], ["hello"], ["alltoall"], ["alltoall"], ["allreduce"], ["split"], ["io"]]
        for mode in runs:
            args = [exe] + mode
            if mode == ["io"]:
                path = os.path.join(tmp, "io.%s" % backend)
                args.append(path)
            out, err = two_nodes(backend, args)
            if mode == ["io"]:
                os.unlink(path)
            mrc, mout, merr = mpirun(args)
            check(mrc == 0, "%s under mpirun: exit %d\n%s" % (mode, mrc, merr[-3000:]))
            check(lines(out) == lines(mout), "%s %s: dptp-run and mpirun differ:\n%s---\n%s\n%s" %
                  (backend, mode, out, mout, err[-3000:]))
            check("vader" not in err and "unlink" not in err, "%s %s: Open MPI complained:\n%s" % (backend, mode, err))
            print("ok %s %s: %s" % (backend, mode[0], lines(out)[-1]))
        left = sessions_left(sessions)
        check(not left, "Open MPI session directories left: %s" % left)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_twonode_static(exe):
    twonode(exe, "static")


def case_twonode_c10d(exe):
    twonode(exe, "c10d")


def case_c10d_regroup(exe):
    """c10d --nnodes 1:2: node 0 alone runs an MPI job of 2 ranks (blocked
    in a receive); node 1 joins, node 0 stops its workers for the next
    round, and the round of both nodes is one MPI job of 4 (a new PMIx
    namespace, registered on both): hello 0/4..3/4"""
    port = free_port()
    conf = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"
    worker = 'if [ "$GROUP_WORLD_SIZE" = 1 ]; then exec "$0" wait; else exec "$0" hello; fi'
    env = dict(base_env(), **TWO_ENV)
    ps = []
    for k in (0, 1):
        ps.append(subprocess.Popen([RUN, "--nnodes=1:2", "--nproc-per-node=2", "--no-python", "--rdzv-backend=c10d",
                                    "--rdzv-endpoint=127.0.0.1:%d" % port, "--rdzv-id=rg%d" % port,
                                    "--rdzv-conf=" + conf + ",is_host=%d" % (k == 0), "sh", "-c", worker, exe],
                                   env=dict(env, DPTP_HOSTNAME="node%d" % k), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))
        if k == 0:
            first = wait_lines(ps, 2)[0]  # node 0's world of 2 is up
    res = finish(ps)
    out = first + "".join(o for _, o, _ in res)
    check(all(rc == 0 for rc, _, _ in res), "exits %s\n%s" % ([rc for rc, _, _ in res],
          "".join(e[-2500:] for _, _, e in res)))
    hello = sorted(l for l in out.splitlines() if l.startswith("hello"))
    check(hello == ["hello %d/4" % r for r in range(4)], "the second round is not one job of 4:\n" + out)
    print("ok c10d_regroup: %s" % hello)


def case_mixed(exe):
    """static --nnodes 2 where node 1 is a torchrun agent (a stand-in that
    sends torchrun's rendezvous bytes): node 0's workers get no PMIx
    server, and MPI_Init fails there instead of running two singletons that
    succeed: node 0 warns and exits 1"""
    sys.path.insert(0, os.path.join(HERE, "..", "launcher"))
    from store_probe import Store
    port = free_port()
    p = subprocess.Popen([RUN, "--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1", "--master-port=%d" % port,
                          "--nproc-per-node=2", "--rdzv-conf=timeout=60", "--no-python", exe, "hello"],
                         env=dict(base_env(), PET_MASTER_PORT=str(port)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        st = Store("127.0.0.1", port, timeout=30)  # torchrun's agent: ADD init/, role_info, its assignment
        st.set("none/torchelastic/role_info/1", '{"role": "default", "rank": 1, "local_world_size": 2}')
        ranks = st.get("none/torchelastic/assigned_ranks/1")
        st.s.close()
        out, err = p.communicate(timeout=60)
    except Exception:
        p.kill()
        p.communicate()
        raise
    check(ranks == b"[2, 4, 2, 4]", "node 1's assignment: %r" % ranks)
    check(p.returncode == 1, "node 0 exited %d\n%s%s" % (p.returncode, out, err[-3000:]))
    check("not every node runs dptp-run" in err and "MPI_Init fails" in err, "no warning:\n" + err[-3000:])
    check("hello" not in out, "the workers ran as singletons:\n" + out)
    print("ok mixed: exit 1, MPI_Init refused")


def case_nodeloss(exe):
    bound = 20  # 3 s of silence, the closing grace period, slack for a loaded machine
    for victim, sig, cmd in ((1, signal.SIGKILL, [exe, "wait"]), (0, signal.SIGKILL, [exe, "wait"]),
                             (1, signal.SIGTERM, [exe, "wait"]),
                             (1, signal.SIGKILL, ["sh", "-c", "echo waiting; exec sleep 60"])):
        ps = start_two("static", cmd, conf="timeout=60," + HB_CONF)
        wait_lines(ps, NP)  # every rank runs (each prints "waiting" once its world is up)
        t0 = time.monotonic()
        ps[victim].send_signal(sig)
        other = ps[1 - victim]
        rc, out, err = finish([other], bound + 30)[0]
        took = time.monotonic() - t0
        finish([ps[victim]], 30)
        what = "%s of node %d (%s)" % (sig.name, victim, cmd[-1])
        check(rc == 1, "%s: node %d exited %d\n%s" % (what, 1 - victim, rc, err[-3000:]))
        check(took < bound, "%s: node %d took %.1f s to notice" % (what, 1 - victim, took))
        if sig == signal.SIGKILL and victim == 0:  # node 0 hosts the store
            check("(node 0: node0, launcher pid %d, ranks 0-1) is gone (" % ps[0].pid in err,
                  "%s: no report naming the store and node 0:\n%s" % (what, err[-3000:]))
        elif sig == signal.SIGKILL:
            check("node %d (node%d, launcher pid %d, ranks %d-%d) was lost" % (victim, victim, ps[victim].pid,
                  2 * victim, 2 * victim + 1) in err, "%s: no report naming the lost node:\n%s" % (what, err[-3000:]))
        else:
            check("another node reported a failed attempt" in err, "%s: no failure report:\n%s" % (what, err[-3000:]))
        print("ok nodeloss %s: node %d exit %d after %.1f s" % (what, 1 - victim, rc, took))


def pmix_case(mode):
    if mode == "gds":
        return pmix_gds()
    if mode.startswith("twonode_"):
        return pmix_twonode(mode[len("twonode_"):])
    extra = []
    tmp = None
    if mode == "jctrl":
        tmp = tempfile.mkdtemp(prefix="dptp-jctrl.")
        extra = [tmp]
    try:
        rc, out, err = dptp_run([PMIX_CASES, mode] + extra, timeout=60)
        check(rc == 0, "pmix %s: exit %d\n%s%s" % (mode, rc, out, err[-3000:]))
        want = "hello from rank" if mode == "hello" else mode + " ok rank"
        got = [l for l in lines(out) if l.startswith(want)]
        check(len(got) == NP, "pmix %s: %d of %d ranks reported ok:\n%s" % (mode, len(got), NP, out))
        if mode == "jctrl":
            left = os.listdir(tmp)
            check(not left, "jctrl: registered files still there after the job: %s" % left)
        if mode == "log":
            for r in range(NP):
                for what in ("log line", "second line"):  # each line of a multi-line entry prefixed
                    check("[rank %d] stderr: %s from rank %d\n" % (r, what, r) in err,
                          "log: rank %d's %s missing:\n%s" % (r, what, err))
        if mode == "dynamic":
            check(out.count("fence over an unknown namespace refused") == NP, "dynamic: unknown-namespace fence:\n" + out)
        print("ok pmix %s" % mode)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    if CASE.startswith("pmix-"):
        pmix_case(CASE[5:])
        print("PASS " + CASE)
        return
    if not shutil.which("mpicc") or not shutil.which("mpirun"):
        print("SKIP: no mpicc/mpirun (libopenmpi-dev, openmpi-bin)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        globals()["case_" + CASE](exe)
    print("PASS " + CASE)


main()
