# torch 2.x's functional collectives (what DTensor and compiled tensor
# parallelism call) on 2 ranks, gloo: the group as a process group, a list of
# ranks and a 1-D DeviceMesh. Each call is recorded like torch.distributed's
# own ("fc": true). Needs torch.distributed._functional_collectives.
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
t = torch.ones(4)
a = funcol.all_reduce(t, "sum", dist.group.WORLD)
b = funcol.all_reduce(t, "sum", [0, 1])
c = funcol.all_gather_tensor(t, 0, init_device_mesh("cpu", (2,)))
d = funcol.broadcast(t, 0, [0, 1])
assert float(funcol.wait_tensor(a)[0]) == 2.0 and float(funcol.wait_tensor(b)[0]) == 2.0
assert funcol.wait_tensor(c).numel() == 8 and float(funcol.wait_tensor(d)[0]) == 1.0
dist.barrier()
dist.destroy_process_group()
