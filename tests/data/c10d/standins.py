"""Stand-ins of torch 2.11's rendezvous classes (dynamic_rendezvous.py): the
same module, names and fields, so that Python's pickle writes and reads
exactly the bytes a torch agent does, without torch."""
import dataclasses
import sys
import types

MOD = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_parts = MOD.split(".")
for _i in range(1, len(_parts) + 1):
    sys.modules.setdefault(".".join(_parts[:_i]), types.ModuleType(".".join(_parts[:_i])))


@dataclasses.dataclass(eq=True, order=True, frozen=True)
class _NodeDesc:
    addr: str
    pid: int
    local_id: int


class _RendezvousState:
    def __init__(self):
        self.round = 0
        self.complete = False
        self.deadline = None
        self.closed = False
        self.participants = {}
        self.wait_list = set()
        self.redundancy_list = set()
        self.last_heartbeats = {}


for _c in (_NodeDesc, _RendezvousState):
    _c.__module__ = MOD
    setattr(sys.modules[MOD], _c.__name__, _c)
