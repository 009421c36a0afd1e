# Restarts (issue 30 item 7): attempt 0 has an R bug (a broadcast whose src
# is not in its group raises on rank 1, the attempt fails); attempt 1 is
# correct and ends 0. The report covers both attempts: the R finding of
# attempt 0 is not hidden by the clean attempt 1.
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
att = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
own = [dist.new_group([0]), dist.new_group([1])][rank]
t = torch.ones(4)
root = 0 if att == 0 else rank
dist.broadcast(t, src=root, group=own)  # BCAST-LINE
dist.barrier()
