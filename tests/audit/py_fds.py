# A worker that closes the descriptors it inherited (daemon hygiene) and
# opens a file of its own, then makes and destroys 30 groups: the recorders'
# lines never land in its file, init_process_group works, and the threads and
# descriptors it ends with are those it has alone; its destroyed world is
# freed. Prints them as JSON.
import gc
import json
import os
import sys
import weakref

os.closerange(3, 256)
own = open(os.path.join(sys.argv[1], "own%s.txt" % os.environ["RANK"]), "w")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
for _ in range(30):
    g = dist.new_group([0, 1])
    dist.all_reduce(t, group=g)
    dist.destroy_process_group(g)
    del g
own.write("the program's own line\n")
own.close()
dist.barrier()
counts = {"rank": dist.get_rank(), "threads": len(os.listdir("/proc/self/task")),
          "fds": len(os.listdir("/proc/self/fd"))}
world = weakref.ref(dist.distributed_c10d._get_default_group())
dist.destroy_process_group()
gc.collect()
counts["world_freed"] = world() is None
# one write(2) of the whole line: the two ranks share dptp-run's stdout, and
# print() may write "COUNTS", the JSON and the newline separately (unbuffered)
sys.stdout.flush()
os.write(1, ("COUNTS %s\n" % json.dumps(counts)).encode())
