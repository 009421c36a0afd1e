# The healthy 4-rank gloo program bench/audit.py times: DP2TP2 groups, a
# config broadcast on WORLD, then STEPS training steps of a DDP model over
# the DP group with a TP-group all-reduce of its activations and a DP-wide
# token count (Python-level collectives: each one a record under --audit).
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tp = 2
tp_groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(world // tp)]
dp_groups = [dist.new_group(list(range(t, world, tp))) for t in range(tp)]
tpg, dpg = tp_groups[rank // tp], dp_groups[rank % tp]
cfg = [{"lr": 0.01} if rank == 0 else None]
dist.broadcast_object_list(cfg, src=0)
torch.manual_seed(rank)
model = DDP(torch.nn.Linear(64, 64), process_group=dpg)
opt = torch.optim.SGD(model.parameters(), lr=cfg[0]["lr"])
for step in range(STEPS):
    tokens = torch.tensor([16])
    dist.all_reduce(tokens, group=dpg)
    x = torch.randn(16, 64)
    dist.all_reduce(x, group=tpg)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
