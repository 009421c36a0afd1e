# Workers started with subprocess, each with its own RANK, WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT (as many launch scripts do): a healthy DP2TP2
# world of four Python processes under one dptp-run worker.
import os
import subprocess
import sys

import torch
import torch.distributed as dist

if len(sys.argv) > 1:  # a worker of this script's own world
    from family_common import groups
    dist.init_process_group("gloo")  # env://: the variables this script's parent set
    rank = dist.get_rank()
    g = groups(rank, 4)
    t = torch.ones(4)
    dist.all_reduce(t, group=g["tp_group"])
    dist.all_reduce(t, group=g["dp_group"])
    box = [rank]
    dist.broadcast_object_list(box, src=g["tp_ranks"][0], group=g["tp_group"])
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)

env = dict(os.environ, WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["AUDIT_PORT"])
env.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # a world of their own, not dptp-run's
procs = [subprocess.Popen([sys.executable, __file__, "worker"], env=dict(env, RANK=str(i), LOCAL_RANK=str(i)))
         for i in range(4)]
sys.exit(max(p.wait() for p in procs))
