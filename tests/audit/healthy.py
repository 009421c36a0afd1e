# dptp-run --audit must find nothing here: the family's code paths, done
# right, on DP2TP2 (4 ranks, gloo on CPU).
import os
import socket
from multiprocessing import shared_memory

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from family_common import groups, init

rank, world = init()
g = groups(rank, world)

# a config broadcast from rank 0 on WORLD
cfg = [{"lr": 0.1, "steps": 3} if rank == 0 else None]
dist.broadcast_object_list(cfg, src=0)

# a DDP training loop over the DP group
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 4), process_group=g["dp_group"])
opt = torch.optim.SGD(model.parameters(), lr=cfg[0]["lr"])
for step in range(cfg[0]["steps"]):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()

# the naive dispatch on the DP group: one slice per replica, each from its own
buf = torch.zeros(g["dp"], 4)
buf[g["dp_rank"]] = rank
for idx in range(g["dp"]):
    dist.broadcast(buf[idx], src=g["dp_ranks"][idx], group=g["dp_group"])

# the fused-allreduce workspace, exchanged inside the TP group: an opId from
# OS entropy on the TP root, broadcast from its global rank; per-rank
# abstract sockets and one shared-memory segment per group, named by it
op_id = [int.from_bytes(os.urandom(8), "little") if g["tp_rank"] == 0 else None]
dist.broadcast_object_list(op_id, src=g["tp_ranks"][0], group=g["tp_group"])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind("\0/tmp/mcastmem-socket-%d-%x" % (g["tp_rank"], op_id[0]))
name = "dptp_audit_ws_%x" % op_id[0]
if g["tp_rank"] == 0:
    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
dist.barrier(group=g["tp_group"])
if g["tp_rank"] != 0:
    seg = shared_memory.SharedMemory(name=name)
dist.barrier(group=g["tp_group"])
seg.close()
if g["tp_rank"] == 0:
    seg.unlink()
sock.close()

# the TP peer by its global rank
x = torch.full((4,), float(rank))
if g["tp_rank"] == 0:
    dist.send(x, dst=g["tp_ranks"][1])
else:
    dist.recv(x, src=g["tp_ranks"][0])

# an idle replica (no tokens) still joins the DP-wide sync
tokens = 0 if g["dp_rank"] == 1 else 8
t = torch.tensor([tokens])
dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g["dp_group"])
dist.all_gather_object([None] * world, {"rank": rank})
dist.barrier()
dist.destroy_process_group()
