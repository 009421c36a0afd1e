# The Python recorder against a stand-in torch.distributed.distributed_c10d
# (no torch needed): collectives decorated as torch 2.x decorates them
# (functools.wraps) are wrapped too, a call is recorded with its group, root,
# size and site, and the original still runs.
# usage: recorder_unit.py RECORDER_DIR OUT_DIR
import functools
import json
import os
import sys
import types

sys.path.insert(0, sys.argv[1])
import dptp_audit_rec as rec  # noqa: E402

out = sys.argv[2]
os.environ.update(DPTP_AUDIT_DIR=out, DPTP_AUDIT_PPID=str(os.getppid()), RANK="1", WORLD_SIZE="2")
rec.start(sys.argv[1])


def logged(f):  # torch 2.x's _exception_logger, in effect
    @functools.wraps(f)
    def w(*a, **k):
        return f(*a, **k)
    return w


class Tensor:
    dtype, device = "torch.float32", types.SimpleNamespace(type="cpu", index=None)

    def numel(self):
        return 8


calls = []
mod = types.ModuleType("torch.distributed.distributed_c10d")
WORLD = object()
mod.GroupMember = types.SimpleNamespace(WORLD=None, NON_GROUP_MEMBER=object())
mod.is_initialized = lambda: True
mod._get_default_group = lambda: WORLD
mod.get_process_group_ranks = lambda pg: [0, 1]


@logged
def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    calls.append(src)
    return "done"


mod.broadcast = broadcast
rec._patch_c10d(mod)
assert getattr(mod.broadcast, "_dptp_audit", False), "a decorated collective was left unwrapped"
assert mod.broadcast(Tensor(), 0) == "done" and calls == [0]
rec._patch_c10d(mod)  # twice: wrapped once
mod.broadcast(Tensor(), src=0)
ops = [json.loads(l) for l in open(os.path.join(out, "r1.a0.py.jsonl")) if '"op"' in l]
assert [(o["op"], o["g"], o["seq"], o["src"], o["n"], o["dt"]) for o in ops] == \
    [("broadcast", [0, 1], 1, 0, 8, "float32"), ("broadcast", [0, 1], 2, 0, 8, "float32")], ops
assert all(o["site"].endswith("recorder_unit.py:%d" % n) for o, n in zip(ops, (
    next(i for i, l in enumerate(open(__file__), 1) if "mod.broadcast(Tensor(), 0)" in l),
    next(i for i, l in enumerate(open(__file__), 1) if "mod.broadcast(Tensor(), src=0)" in l)))), ops
print("ok")
