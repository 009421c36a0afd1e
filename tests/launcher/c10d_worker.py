#!/usr/bin/env python3
"""Workers for the c10d tests (no torch needed; tests/launcher/c10d_e2e.py).

usage: c10d_worker.py env                 print the torchrun environment, use the agent store
       c10d_worker.py failfirst            exit 1 after 3 s in the first attempt, then as env
       c10d_worker.py state HOST PORT ID  rank 0: read the rendezvous state from the c10d
                                          store and unpickle it with Python's own pickle
       c10d_worker.py late TARGET         print the world; stay until the group has TARGET nodes
       c10d_worker.py ticks N             N store-based barriers with every rank (a collective):
                                          a rank that is gone makes the others fail (exit 1)
       c10d_worker.py sleep S             sleep S seconds, exit 0
"""
import base64
import os
import pickle
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from store_probe import Store  # noqa: E402


def stand_in_classes():
    """torch's classes for pickle.loads (tests/data/c10d/standins.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "c10d"))
    import standins  # noqa: F401


def main():
    e = os.environ
    what = sys.argv[1]
    rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
    gw, restart = int(e["GROUP_WORLD_SIZE"]), int(e["TORCHELASTIC_RESTART_COUNT"])
    if what == "failfirst":
        if restart == 0:
            time.sleep(3)
            sys.exit(1)
        what = "env"
    if what == "env":
        st = Store(e["MASTER_ADDR"], int(e["MASTER_PORT"]))
        st.add("init/", 1, raw=True)
        st.set("env/%d" % rank, "x")
        for r in range(world):
            st.get("env/%d" % r)
        print("rank %d local %s world %d group %s/%d restart %d agent_store %s run_id %s" % (
            rank, e["LOCAL_RANK"], world, e["GROUP_RANK"], gw, restart, e["TORCHELASTIC_USE_AGENT_STORE"],
            e["TORCHELASTIC_RUN_ID"]), flush=True)
    elif what == "state":
        if rank != 0:
            return
        stand_in_classes()
        st = Store(sys.argv[2], int(sys.argv[3]))
        s = pickle.loads(base64.b64decode(st.get("torch.rendezvous." + sys.argv[4])))
        parts = sorted((n.addr, n.pid, n.local_id, r) for n, r in s.participants.items())
        beats = all(d.tzinfo is not None for d in s.last_heartbeats.values())
        print("state round %d complete %s closed %s participants %d ranks %s heartbeats %d utc %s" % (
            s.round, s.complete, s.closed, len(parts), [p[3] for p in parts], len(s.last_heartbeats), beats),
            flush=True)
    elif what == "late":
        print("group %s world %d restart %d" % (e["GROUP_RANK"], gw, restart), flush=True)
        if gw < int(sys.argv[2]):
            time.sleep(120)
    elif what == "sleep":
        time.sleep(float(sys.argv[2]))
    elif what == "ticks":
        ppid = os.getppid()
        st = Store(e["MASTER_ADDR"], int(e["MASTER_PORT"]))
        st.add("init/", 1, raw=True)
        for i in range(int(sys.argv[2])):
            key = "tick/%d/%d" % (restart, i)
            st.add(key, 1)
            deadline = time.monotonic() + 4
            while st.add(key, 0) < world:
                if time.monotonic() > deadline or os.getppid() != ppid:
                    print("rank %d: tick %d: a peer is gone (world %d)" % (rank, i, world), flush=True)
                    sys.exit(1)
                time.sleep(0.02)
            time.sleep(0.2)
        print("ticks done rank %d world %d group %s/%d restart %d" % (rank, world, e["GROUP_RANK"], gw, restart),
              flush=True)


if __name__ == "__main__":
    main()
