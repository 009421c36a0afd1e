# NCCL records with one rank per GPU: set_device(LOCAL_RANK), collectives on
# WORLD and on a subgroup; the C recorder sees the communicators and calls.
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
w = dist.get_world_size()
sub = dist.new_group(list(range(w)))
t = torch.ones(1024, device="cuda")
dist.all_reduce(t)
dist.broadcast(t, src=0, group=sub)
dist.all_gather_into_tensor(torch.empty(1024 * w, device="cuda"), t)
torch.cuda.synchronize()
print("rank", dist.get_rank(), "sum", t[0].item(), flush=True)
dist.destroy_process_group()
