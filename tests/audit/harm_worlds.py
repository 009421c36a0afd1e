# Two worlds in one job (issue 31 item 1, rendered world by world): the
# launcher's one worker spawns two 2-rank worlds of its own (torch
# multiprocessing, spawn), on ports A and B; only world B has an R bug (a
# broadcast whose src is not in its group, raised and caught on rank 1).
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, port, bug):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # its own store, not dptp-run's
    dist.init_process_group("gloo", rank=rank, world_size=2)
    own = [dist.new_group([0]), dist.new_group([1])][rank]
    t = torch.ones(2)
    if bug and rank == 1:
        try:
            dist.broadcast(t, src=0, group=own)  # BUG-LINE
        except (RuntimeError, ValueError):
            pass
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, int(port), bug))
             for port, bug in ((sys.argv[1], False), (sys.argv[2], True)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    sys.exit(max(p.exitcode or 0 for p in procs))
