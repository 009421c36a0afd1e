# The hang watch's default bound is torch's own process-group timeout (issue
# 30 item 1): init_process_group(timeout=6 s) and no --audit-hang. The waits
# are on groups made with a long timeout of their own (120 s), so that gloo
# does not end them first and the outcome is the watch's alone:
# "hang": rank 1 skips the third all_reduce on g and waits on g2; rank 0
#   waits in that all_reduce: a hang, ended about 6 s after the last record.
# "slow": rank 0 computes outside any collective for 10 s (longer than the
#   bound) while rank 1 waits in a barrier on g2: not a hang, the job ends 0.
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=120))
g2 = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=120))
t = torch.ones(4)
dist.all_reduce(t)
if mode == "hang":
    for step in range(3):
        if not (step == 2 and rank == 1):
            dist.all_reduce(t, group=g)  # HANG-LINE: rank 1 skips the third
elif rank == 0:
    time.sleep(10)  # outside any collective, longer than the bound
dist.barrier(group=g2)
# one write(2): the ranks share dptp-run's stdout
os.write(1, b"done %d\n" % rank)
