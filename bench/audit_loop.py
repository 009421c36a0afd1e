# The many-calls program bench/audit.py --loop times (issue 30: the audit's
# cost on a 200k-call loop): CALLS all_reduce of one float on WORLD (gloo),
# nothing else; each call is a record (two with the `done` record) under
# --audit.
import sys

import torch
import torch.distributed as dist

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(CALLS):
    dist.all_reduce(t)
dist.barrier()
