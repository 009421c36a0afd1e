# Healthy (issue 30 item 1): one rank computes much longer than the others
# between collectives (a slow step, a straggler), outside any collective:
# the others wait in the next one. Not a hang. Run with a short --audit-hang.
import os
import time

import torch
import torch.distributed as dist

from family_common import init

rank, world = init()
slow = float(os.environ.get("AUDIT_SLOW", "6"))
for step in range(3):
    t = torch.ones(4) * rank
    dist.all_reduce(t)
    if rank == world - 1 and step == 1:
        time.sleep(slow)  # the straggler's long step
dist.barrier()
