# A worker started through a shell (sh -c "python3 py_exec.py; true") that
# execs another Python in the same process before it joins the world; rank
# 1 leaves with os._exit(0) after the last barrier.
import os
import sys

if len(sys.argv) < 2:
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "after-exec"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
dist.barrier()
if dist.get_rank() == 1:
    os._exit(0)
dist.destroy_process_group()
