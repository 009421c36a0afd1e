# Shared by the audit's torch programs: the process group (gloo, CPU) and
# vLLM's DP x TP groups, made the way vLLM makes them (every rank creates
# every group, in the same order).
import os

import torch.distributed as dist


def init():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env://: dptp-run's agent store
    return rank, world


def groups(rank, world, tp=2):
    dp = world // tp
    tp_groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(dp)]
    dp_groups = [dist.new_group(list(range(t, world, tp))) for t in range(tp)]
    return {
        "tp": tp, "dp": dp, "tp_rank": rank % tp, "dp_rank": rank // tp,
        "tp_ranks": list(range((rank // tp) * tp, (rank // tp + 1) * tp)),
        "dp_ranks": list(range(rank % tp, world, tp)),
        "tp_group": tp_groups[rank // tp], "dp_group": dp_groups[rank % tp],
    }
