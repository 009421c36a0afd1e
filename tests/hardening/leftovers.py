#!/usr/bin/env python3
"""What a killed dptp-run leaves behind (issue 24 items 3 and 4).

usage: leftovers.py --run DPTP_RUN --check DPTP_CHECK --preload stall_in_setup.so [--only CASE[,CASE]]

Cases:
  guard_race   dptp-run is stopped (ptrace, PTRACE_EVENT_VFORK_DONE) the
               moment its worker has been executed, before it runs another
               instruction; the worker starts 150 processes in its process
               group; dptp-run is SIGKILLed there. Not one of them may
               survive: the worker guard must know the group before the
               worker runs (it learnt it after vfork returned: the window a
               loaded machine opens at random, here held open). Skipped
               (exit 77) where ptrace is not allowed.
  shm_kill     4 ranks of dptp-check --tokens 4096 (64 MiB slots) under
  shm_term     dptp-run; rank 3 stops itself in the host plane's setup
               (--preload stall_in_setup.so) once every rank has named its
               slot in /dev/shm, the others wait for it there; dptp-run is
               SIGKILLed (its guard must remove the slots, 5 s at most) or
               SIGTERMed (gone when it exits). 0 slots of the job left.
  shm_sweep    dptp-check (one rank) removes the /dev/shm names of dead
               jobs (slots and resources segments, sized and unlocked, or
               unsized and older than a minute), never a live job's
               (locked: content, inode and times unchanged), nor one
               unsized and young (its owner may be between creating and
               locking it), nor another user's, nor the lock-less names of
               an older dptp-check (no "lk-") until they are an hour old;
               as root, the same as uid nobody (setpriv) while root's
               names are there.
Prints one line per case; exit 1 on any failure.
"""
import argparse
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attacks import HOLD_SLOT  # noqa: E402
from faults import alive, proc_state  # noqa: E402
from security import free_port  # noqa: E402

ARGS = None
FAILURES = []
SKIPPED = []

PTRACE_TRACEME, PTRACE_CONT, PTRACE_SETOPTIONS, PTRACE_GETEVENTMSG = 0, 7, 0x4200, 0x4201
PTRACE_O_TRACEVFORKDONE, PTRACE_O_EXITKILL = 0x20, 0x100000
PTRACE_EVENT_VFORK_DONE = 5
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ptrace.restype = ctypes.c_long
LIBC.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def fail(case, msg):
    FAILURES.append("%s: %s" % (case, msg))
    print("FAIL %s: %s" % (case, msg), flush=True)


def tagged(tag, exclude=()):
    """Live processes whose environment carries DPTP_LEFTOVERS_TAG=tag."""
    out = []
    needle = ("DPTP_LEFTOVERS_TAG=" + tag).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude:
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle not in f.read():
                    continue
        except OSError:
            continue
        if alive(int(d)):
            out.append(int(d))
    return out


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def job_env(tag, tmp):
    env = dict(os.environ, DPTP_LEFTOVERS_TAG=tag, TMPDIR=tmp, PET_MASTER_PORT=str(free_port()),
               DPTP_RUN_STOP_TIMEOUT="5", NO_COLOR="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def traceme():
    if LIBC.ptrace(PTRACE_TRACEME, 0, None, None) < 0:
        raise OSError(ctypes.get_errno(), "PTRACE_TRACEME")


def stop_at_vfork_done(p, limit=20.0):
    """Runs the traced launcher p until its first vfork is done (the
    child has executed); leaves it stopped there. (the child's pid, None) or (None,
    what happened)."""
    end = time.monotonic() + limit
    first = True
    while time.monotonic() < end:
        pid, st = os.waitpid(p.pid, 0)  # the worker has not started yet: nothing to wait for long
        if not os.WIFSTOPPED(st):
            p.returncode = os.waitstatus_to_exitcode(st)
            return None, "dptp-run ended (%d) before it started its worker" % p.returncode
        sig, event = os.WSTOPSIG(st), st >> 16
        if first:  # the exec's SIGTRAP: the options go on here
            first = False
            if LIBC.ptrace(PTRACE_SETOPTIONS, p.pid, None, PTRACE_O_TRACEVFORKDONE | PTRACE_O_EXITKILL) < 0:
                return None, "PTRACE_SETOPTIONS: %s" % os.strerror(ctypes.get_errno())
            sig = 0
        elif event == PTRACE_EVENT_VFORK_DONE:
            child = ctypes.c_ulong()
            LIBC.ptrace(PTRACE_GETEVENTMSG, p.pid, None, ctypes.byref(child))
            return child.value, None
        elif event:
            sig = 0
        LIBC.ptrace(PTRACE_CONT, p.pid, None, sig)
    return None, "no worker started in %.0f s" % limit


FORK_LOOP = 'i=0; while [ $i -lt 150 ]; do sleep 60 & i=$((i+1)); done; ' \
            'echo > "$D/forked"; wait'


def case_guard_race():
    case = "guard_race"
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        env = job_env(tag, tmp)
        env["D"] = tmp
        try:
            p = subprocess.Popen([ARGS.run, "--nproc-per-node=1", "--no-python", "sh", "-c", FORK_LOOP], env=env,
                                 stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "stderr"), "w"),
                                 preexec_fn=traceme)
        except subprocess.SubprocessError:
            SKIPPED.append(case)
            print("skip %s: ptrace is not allowed here" % case, flush=True)
            return
        survivors = []
        try:
            # dptp-run's only vfork is a worker's (the child's environment
            # is not yet readable there: exec is not done with it)
            worker, why = stop_at_vfork_done(p)
            if worker is None:
                with open(os.path.join(tmp, "stderr")) as f:
                    fail(case, "%s: %s" % (why, f.read()[-400:]))
                return
            end = time.monotonic() + 20
            while time.monotonic() < end and not os.path.exists(os.path.join(tmp, "forked")):
                time.sleep(0.005)
            group = tagged(tag, exclude=(p.pid,))
            t0 = time.monotonic()
            p.kill()  # SIGKILL while stopped between vfork and anything after it
            p.wait()
            end = time.monotonic() + 5
            while time.monotonic() < end and tagged(tag):
                time.sleep(0.005)
            survivors = tagged(tag)
            if survivors:
                fail(case, "%d of the job's %d processes outlived the SIGKILLed dptp-run" % (
                    len(survivors), len(group)))
            else:
                print("ok %s: all %d processes of the job gone %.1f ms after SIGKILL" % (
                    case, len(group), (time.monotonic() - t0) * 1e3), flush=True)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            kill_all(tagged(tag))


def job_prefix(launcher_pid, restart=0):
    """The slots' name prefix of dptp-run's attempt (its PMIx namespace,
    hashed as lib/plane/comm_host.c does)."""
    h = 1469598103934665603
    for ch in ("dptp-run.%d.%d" % (launcher_pid, restart)).encode():
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "dptp-lk-%016x-" % h


def shm_names(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def wait_for(cond, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def shm_killed(case, sig):
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(job_env(tag, tmp), LD_PRELOAD=ARGS.preload, DPTP_TEST_SETUP_STALL_RANK="3",
                   DPTP_RUN_STOP_TIMEOUT="2")
        p = subprocess.Popen([ARGS.run, "--nproc-per-node=4", "--no-python", ARGS.check, "--dp", "2", "--tp", "2",
                              "--tokens", "4096", "--timeout", "60"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        prefix = job_prefix(p.pid)
        try:
            def stalled():
                return len(shm_names(prefix)) == 4 and any(
                    proc_state(w) == "T" for w in tagged(tag, exclude=(p.pid,)))
            if not wait_for(stalled, 60):
                fail(case, "the job never stood in its setup with 4 slots (%s): %s" % (
                    shm_names(prefix), p.stderr.read()[-300:] if p.poll() is not None else "running"))
                return
            held = shm_names(prefix)
            mib = sum(os.stat("/dev/shm/" + n).st_size for n in held) >> 20
            t0 = time.monotonic()
            os.kill(p.pid, sig)
            p.communicate(timeout=60)
            t_exit = time.monotonic()
            # SIGTERM: dptp-run itself, before it exits; SIGKILL: its guard
            wait_for(lambda: not shm_names(prefix), 0 if sig == signal.SIGTERM else 5)
            left = shm_names(prefix)
            if left:
                fail(case, "%d of the %d slots (%d MiB) left after dptp-run's %s: %s" % (
                    len(left), len(held), mib, signal.Signals(sig).name, left))
            else:
                print("ok %s: %d slots (%d MiB) of ranks stopped in setup gone %.0f ms after %s (dptp-run exit %d "
                      "after %.0f ms)" % (case, len(held), mib, (time.monotonic() - t0) * 1e3,
                                          signal.Signals(sig).name, p.returncode, (t_exit - t0) * 1e3), flush=True)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
            kill_all(tagged(tag))
            for n in shm_names(prefix):
                os.unlink("/dev/shm/" + n)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def plant(name, size, as_nobody=False, old=False, age=120):
    path = "/dev/shm/" + name
    code = "import os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600); " \
           "os.ftruncate(fd, int(sys.argv[2]))"
    subprocess.run((AS_NOBODY if as_nobody else []) + [sys.executable, "-c", code, path, str(size)], check=True)
    if old:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


def snapshot(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    with open(path, "rb") as f:
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, f.read(8))


def one_rank(as_nobody=False):
    env = {k: v for k, v in os.environ.items() if k not in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD")}
    return subprocess.run((AS_NOBODY if as_nobody else []) + [ARGS.check, "--tokens", "8", "--hidden", "64",
                                                              "--timeout", "20"],
                          env=env, cwd="/", capture_output=True, text=True, timeout=60)


def case_shm_sweep():
    case = "shm_sweep"
    rnd = lambda: os.urandom(8).hex()  # noqa: E731
    root = os.geteuid() == 0
    paths, problems = [], []
    live = "/dev/shm/dptp-lk-%s-%s-1" % (rnd(), rnd())
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SLOT, live], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            return fail(case, "could not make a live slot %s" % live)
        dead = {"slot": plant("dptp-lk-%s-%s-0" % (rnd(), rnd()), 1 << 20),
                "resources segment": plant("dptp-lk-res-%s-host-tp0-dp0" % rnd(), 4096),
                "unsized old slot": plant("dptp-lk-%s-%s-2" % (rnd(), rnd()), 0, old=True),
                "two hours old slot of an older dptp-check (no lock)": plant(
                    "dptp-%s-%s-0" % (rnd(), rnd()), 4096, old=True, age=7200)}
        kept = {"live slot": live, "unsized young slot": plant("dptp-lk-%s-%s-3" % (rnd(), rnd()), 0),
                # an older dptp-check's names are never locked: in use
                "slot of an older dptp-check running now": plant("dptp-%s-%s-0" % (rnd(), rnd()), 4096),
                "resources segment of an older dptp-check running now": plant(
                    "dptp-res-%s-host-tp0-dp0" % rnd(), 4096)}
        if root:
            kept["uid nobody's dead slot"] = plant("dptp-lk-%s-%s-0" % (rnd(), rnd()), 4096, as_nobody=True)
        paths = list(dead.values()) + list(kept.values())
        before = {k: snapshot(v) for k, v in kept.items()}
        r = one_rank()
        if r.returncode:
            problems.append("dptp-check exits %d: %s" % (r.returncode, r.stderr[-300:]))
        problems += ["the dead job's %s %s is still there" % (k, v) for k, v in dead.items() if os.path.exists(v)]
        problems += ["the %s %s was touched" % (k, v) for k, v in kept.items() if snapshot(v) != before[k]]
        if root:
            # uid nobody's dptp-check: its own dead slot goes, root's stay
            mine = plant("dptp-lk-%s-%s-0" % (rnd(), rnd()), 4096, as_nobody=True)
            roots = plant("dptp-lk-%s-%s-0" % (rnd(), rnd()), 4096)
            paths += [mine, roots]
            before = {k: snapshot(v) for k, v in kept.items() if "nobody" not in k}
            before["root's dead slot"] = snapshot(roots)
            r = one_rank(as_nobody=True)
            if r.returncode:
                problems.append("uid nobody's dptp-check exits %d: %s" % (r.returncode, r.stderr[-300:]))
            if os.path.exists(mine):
                problems.append("uid nobody's dptp-check left its own dead slot %s" % mine)
            after = {k: snapshot(kept[k] if k in kept else roots) for k in before}
            problems += ["uid nobody's dptp-check touched the %s" % k for k in before if after[k] != before[k]]
    finally:
        holder.kill()
        holder.wait()
        for f in paths + [live]:
            if os.path.exists(f):
                os.unlink(f)
    if problems:
        fail(case, "; ".join(problems))
    else:
        print("ok %s: a dead job's slot, resources segment and old unsized slot removed, and an older "
              "dptp-check's 2-hour-old slot; the live, young, older dptp-check's in-use and other user's left as "
              "they were%s" % (case, "; the same as uid nobody" if root else
                                                    " (not root: no other user)"), flush=True)


CASES = {
    "guard_race": case_guard_race,
    "shm_kill": lambda: shm_killed("shm_kill", signal.SIGKILL),
    "shm_term": lambda: shm_killed("shm_term", signal.SIGTERM),
    "shm_sweep": case_shm_sweep,
}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for opt in ("--run", "--check", "--preload"):
        ap.add_argument(opt, required=True, type=os.path.abspath)
    ap.add_argument("--only", default=",".join(CASES))
    ARGS = ap.parse_args()
    names = ARGS.only.split(",")
    for n in names:
        CASES[n]()
    print("%d cases, %d failures, %d skipped" % (len(names), len(FAILURES), len(SKIPPED)))
    if FAILURES:
        return 1
    return 77 if len(SKIPPED) == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
