#!/usr/bin/env python3
"""A torchrun-style launch without torch: N processes with torchrun's
RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, rank 0 hosting the store
(TORCHELASTIC_USE_AGENT_STORE=False), as `init_process_group("env://")` does.
Exit status: the worst of the workers'.

usage: envlaunch.py N PROGRAM [ARGS...]
"""
import os
import socket
import subprocess
import sys


def main():
    n = int(sys.argv[1])
    prog = sys.argv[2:]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_USE_AGENT_STORE="False", TORCHELASTIC_RUN_ID="envlaunch")
        env.pop("PMIX_NAMESPACE", None)
        procs.append(subprocess.Popen(prog, env=env))
    rcs = [p.wait() for p in procs]
    return max(rcs) if min(rcs) >= 0 else 128 - min(rcs)


if __name__ == "__main__":
    sys.exit(main())
