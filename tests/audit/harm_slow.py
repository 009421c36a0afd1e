# A healthy job with a slow rank (issue 30 item 1): a training loop where
# rank 0 "writes a checkpoint" (sleeps SLOW seconds, outside any
# collective) after a step while rank 1 already waits in the next step's
# barrier(). Not a hang: the job must end 0. With "hang" as the second
# argument a real hang follows: rank 1 skips one all_reduce on a group of
# its own and waits at the final barrier, rank 0 waits in that all_reduce.
import os
import sys
import time

import torch
import torch.distributed as dist

slow = float(sys.argv[1])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(2):
    dist.barrier()
    dist.all_reduce(t)
    if rank == 0 and step == 0:
        time.sleep(slow)  # the checkpoint: no collective, no record
if len(sys.argv) > 2 and sys.argv[2] == "hang":
    g = dist.new_group([0, 1])
    for step in range(3):
        if not (step == 2 and rank == 1):
            dist.all_reduce(t, group=g)  # HANG-LINE: rank 1 skips the third
    dist.barrier()
# one write(2): the ranks share dptp-run's stdout, and print() writes
# "done", " ", the rank and the newline separately
os.write(1, b"done %d\n" % rank)
