# Healthy: evaluation on rank 0 only (no collective inside), the others wait
# for it at a barrier; then training goes on together.
import os
import time

import torch
import torch.distributed as dist

from family_common import init


def wait_for_eval():
    dist.barrier()


rank, world = init()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
for step in range(2):
    loss = model(torch.randn(8, 16)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if rank == 0 and step == 0:
        deadline = time.time() + float(os.environ.get("AUDIT_SLOW", "6"))
        with torch.no_grad():
            while time.time() < deadline:  # a long evaluation, rank 0 alone
                model(torch.randn(256, 16))
    wait_for_eval()
