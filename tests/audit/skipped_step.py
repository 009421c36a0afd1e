# P, issue 31: replica 1 skips the DP all-reduce of one loop step (`if n ==
# 0: continue`); its DP peers' all-reduces match one step off, and the job
# hangs at the final barrier. The replica behind on the DP group is replica
# 1, every run.
import torch
import torch.distributed as dist

from family_common import groups, init

rank, world = init()
g = groups(rank, world)
for n in range(3):
    t = torch.ones(2)
    dist.all_reduce(t, group=g["tp_group"])
    if g["dp_rank"] == 1 and n == 0:
        continue
    dist.all_reduce(t, group=g["dp_group"])
dist.barrier()
