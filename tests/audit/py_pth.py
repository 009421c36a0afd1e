# Run with a .pth file that imports torch.distributed before sitecustomize
# (the recorder) runs: the calls are recorded all the same, through
# torch.distributed's names and through a name taken from it.
import torch
import torch.distributed as dist
from torch.distributed import broadcast

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
broadcast(t, src=0)
dist.barrier()
dist.destroy_process_group()
