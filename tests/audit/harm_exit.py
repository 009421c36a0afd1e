# A rank that leaves with os._exit(0) (no atexit, no recorder end) before a
# barrier its peer entered (issue 30 item 4): P, from the exit dptp-run saw.
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    os._exit(0)
dist.barrier()  # BARRIER-LINE
