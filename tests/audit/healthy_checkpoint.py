# Healthy: rank 0 writes a checkpoint (slowly) while the others wait in the
# barrier after it. Not a hang, no finding.
import os
import tempfile
import time

import torch
import torch.distributed as dist

from family_common import init


def sync():
    dist.barrier()  # every rank waits here for rank 0's checkpoint


rank, world = init()
model = torch.nn.Linear(64, 64)
t = torch.ones(1)
dist.all_reduce(t)
if rank == 0:
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "ckpt.pt"))
        time.sleep(float(os.environ.get("AUDIT_SLOW", "6")))  # a big checkpoint on a slow disk
sync()
