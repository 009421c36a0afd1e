# P, vLLM issue 43547: after healthy steps a DP replica with no tokens skips
# the DP coordination all-reduce and goes on to the step's end: the job hangs.
import torch
import torch.distributed as dist

from family_common import groups, init

rank, world = init()
g = groups(rank, world)
for step in range(3):
    tokens = 0 if (step == 2 and g["dp_rank"] == 1) else 8
    if tokens > 0:
        t = torch.tensor([tokens])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g["dp_group"])
    dist.barrier()
