# A rank that crashes (SIGSEGV) after a collective: the report names it.
import os
import signal

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSEGV)
dist.barrier()
