"""Healthy: a long loop of all_reduce calls. Under a small
DPTP_AUDIT_MAX_RECORDS its calls past the record cap are compared by their
count and the sum of their signatures (contract amendment 08:25), so it
still passes. AUDIT_CAP_BAD=1 makes it a P bug gloo does not notice: from
call 800 on, rank 1 passes int32 tensors where rank 0 passes float32 ones
of the same size in bytes."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
bad = os.environ.get("AUDIT_CAP_BAD") == "1"
for i in range(1200):
    t = torch.ones(4, dtype=torch.int32 if bad and rank == 1 and i >= 800 else torch.float32)
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
