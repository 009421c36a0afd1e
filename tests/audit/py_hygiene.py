# Run alone and with the recorder: what it prints (sys.modules, the
# traceback of an error raised inside torch.distributed) and its exit status
# must not differ, but for the recorder's own module name.
import sys

import torch
import torch.distributed as dist

print(sorted(sys.modules))
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.broadcast(torch.ones(2), src=3)
