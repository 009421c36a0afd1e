# Workers started by torch.multiprocessing.spawn (one process per GPU, as
# many training scripts do): a DP2TP2 world of four spawned processes, under
# one dptp-run worker, with the R bug (the group-local root passed as torch's
# global src: replica 1's broadcast fails, the error caught as vLLM did).
import os

import torch.multiprocessing as mp


def worker(i, port):
    import torch.distributed as dist

    from family_common import groups
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # a world of their own, not dptp-run's
    dist.init_process_group("gloo", rank=i, world_size=4)
    g = groups(i, 4)
    box = ["workspace"]
    try:
        dist.broadcast_object_list(box, src=0, group=g["tp_group"])
    except (RuntimeError, ValueError):
        pass
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(os.environ["AUDIT_PORT"],), nprocs=4)
