# D on one GPU (vLLM issue 17176's kind): every rank takes
# cuda:(LOCAL_RANK % device_count), so on a 1-GPU box all four share cuda:0
# and NCCL refuses ("Duplicate GPU detected"). The audit names the ranks.
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank % torch.cuda.device_count())
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
try:
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print("rank", dist.get_rank(), "all_reduce", t[0].item(), flush=True)
except Exception as e:  # NCCL's own verdict on the shared device
    print("rank", dist.get_rank(), "NCCL:", str(e).splitlines()[0][:200], flush=True)
dist.destroy_process_group()
