"""A PyTorch worker for dptp-run's agent store: init_process_group("env://")
with gloo (and nccl when asked and a GPU per rank exists), one allreduce,
prints what it saw. usage: dptp-run --nproc-per-node=N bench/torch_pg.py [gloo|nccl]"""
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
dev = "cuda:%s" % os.environ["LOCAL_RANK"] if backend == "nccl" else "cpu"
t = torch.ones(4, device=dev) * (rank + 1)
dist.all_reduce(t)
want = world * (world + 1) / 2
print("rank %d/%d %s allreduce %s (want %g) agent_store=%s" % (rank, world, backend, t.tolist()[0], want,
      os.environ.get("TORCHELASTIC_USE_AGENT_STORE")), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if t.tolist()[0] == want else 1)
