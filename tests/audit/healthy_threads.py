# Healthy: two threads of each rank drive separate groups (the TP group and
# the DP group of DP2TP2), each in its own order; no finding.
import threading

import torch
import torch.distributed as dist

from family_common import groups, init

rank, world = init()
g = groups(rank, world)


def loop(group, n):
    for i in range(n):
        t = torch.ones(8) * i
        dist.all_reduce(t, group=group)


a = threading.Thread(target=loop, args=(g["tp_group"], 20))
b = threading.Thread(target=loop, args=(g["dp_group"], 20))
a.start()
b.start()
a.join()
b.join()
dist.barrier()
