# Workers forked by multiprocessing (the fork start method, as vLLM's
# executor may): a DP2TP2 world of four forked processes, under one dptp-run
# worker whose RANK they inherit (and must not be known by), with the G bug
# (vLLM's naive all2all: the per-replica loop broadcast on the EP group, so
# "root idx" is EP rank idx).
import multiprocessing
import os
import sys

import torch
import torch.distributed as dist

from family_common import groups


def worker(i, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # a world of their own, not dptp-run's
    dist.init_process_group("gloo", rank=i, world_size=4)
    g = groups(i, 4)
    ep_group = dist.new_group(list(range(4)))
    buf = torch.zeros(g["dp"], 4)
    buf[g["dp_rank"]] = i
    for idx in range(g["dp"]):
        dist.broadcast(buf[idx], src=idx, group=ep_group)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker, args=(i, os.environ["AUDIT_PORT"])) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
