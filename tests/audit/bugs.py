# The DP x TP family re-created the way the public bugs did it, each at a
# line of its own, on DP2TP2 (4 ranks, gloo on CPU). The exceptions the real
# code caught are caught here too: the audit must find them all the same.
import os
import random
import socket
from multiprocessing import shared_memory

import torch
import torch.distributed as dist

from family_common import groups, init

rank, world = init()
g = groups(rank, world)
ep_group = dist.new_group(list(range(world)))


# R, BUGS.md 2 (flashinfer's TorchDistBackend): the group-local root passed as
# torch's global src; vLLM caught the error and left the workspace empty
def backend_bcast(obj, root, group):
    box = [obj]
    dist.broadcast_object_list(box, src=root, group=group)
    return box[0]


try:
    backend_bcast("workspace", 0, g["tp_group"])
except (RuntimeError, ValueError):
    pass

# I, BUGS.md 4 (flashinfer PR 3102): the opId drawn from an identically
# seeded RNG names the IPC socket; every TP group binds the same names
random.seed(0)
op_id = [random.getrandbits(64) if g["tp_rank"] == 0 else None]
dist.broadcast_object_list(op_id, src=g["tp_ranks"][0], group=g["tp_group"])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    sock.bind("\0/tmp/mcastmem-socket-%d-%x" % (g["tp_rank"], op_id[0]))
except OSError:
    pass
dist.barrier()
sock.close()

# C, SGLang PR 29211: a port offset by a DP rank forced to 0
dp_rank_seen = 0
if g["tp_rank"] == 0:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        srv.bind(("127.0.0.1", int(os.environ["AUDIT_PORT"]) + dp_rank_seen))
    except OSError:
        pass
dist.barrier()
if g["tp_rank"] == 0:
    srv.close()

# I, TensorRT-LLM PR 7377: a fixed shared-memory name on every instance
seg = None
if g["tp_rank"] == 0:
    try:
        seg = shared_memory.SharedMemory(name="dptp_audit_moe_shared_l0_lr0_all", create=True, size=4096)
    except FileExistsError:
        pass
dist.barrier()
if seg is not None:
    seg.close()
    seg.unlink()

# D, BUGS.md 3: the device taken from the TP rank (no GPU here: the choice
# is recorded, the call fails)
try:
    torch.cuda.set_device(g["tp_rank"])
except (AssertionError, AttributeError, RuntimeError):
    pass

# G, BUGS.md 5 (vLLM's naive all2all): the per-replica multicast loop
# broadcast on the EP group, so "root idx" is EP rank idx
buf = torch.zeros(g["dp"], 4)
buf[g["dp_rank"]] = rank
for idx in range(g["dp"]):
    dist.broadcast(buf[idx], src=idx, group=ep_group)

dist.barrier()
dist.destroy_process_group()
