# Healthy (issue 30 item 5): the usual free-port loop. Every rank looks for
# a free port from one base, binding until a bind succeeds, and keeps its
# socket: rank 1 meets rank 0's port (EADDRINUSE) and takes the next one.
# dptp-run --audit must find nothing here.
import errno
import os
import socket

import torch
import torch.distributed as dist

from family_common import init

rank, world = init()
base = int(os.environ["AUDIT_PORT"])


def free_port(start):
    for port in range(start, start + 64):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
            return s
        except OSError as e:
            s.close()
            if e.errno != errno.EADDRINUSE:
                raise
    raise RuntimeError("no free port")


for r in range(world):  # one after the other: the collision happens every run
    if r == rank:
        srv = free_port(base)
    dist.barrier()
ports = [None] * world
dist.all_gather_object(ports, srv.getsockname()[1])
assert len(set(ports)) == world, ports
t = torch.ones(1)
dist.all_reduce(t)
srv.close()
dist.barrier()
