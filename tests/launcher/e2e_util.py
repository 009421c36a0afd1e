"""What the launcher test scripts share: verdicts, a free port, a clean
environment for dptp-run."""
import os
import socket
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    """PATH, HOME, TMPDIR, LC_ALL=C, a 5 s stop timeout, a sanitizer build's
    settings (tests/hardening/sanitize.sh), then extra."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "LC_ALL": "C", "DPTP_RUN_STOP_TIMEOUT": "5"}
    for k in ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra)
    return env
