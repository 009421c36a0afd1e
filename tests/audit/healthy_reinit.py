# Healthy: a process group destroyed and made again (a second world on its
# own store, as a job that re-forms its group after a phase does).
import os

import torch
import torch.distributed as dist

from family_common import init

rank, world = init()
t = torch.ones(1)
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
# its own store (tcp:// would join the launcher's agent store under dptp-run)
store = dist.TCPStore("127.0.0.1", int(os.environ["AUDIT_PORT"]), world, rank == 0)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
t = torch.ones(2)
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
