# The Python recorder against a stand-in torch.distributed (no torch needed):
# collectives decorated as torch 2.x decorates them (functools.wraps) are
# wrapped too; a call is recorded at entry (op: group, root, size, site) and
# at return (done, err when it raised), and the original still runs; torch
# 2.x's functional collectives with each form of their group argument; CUDA
# IPC sites keyed by the handle's hash; the
# record cap and its per-group counts; a record descriptor the program closed
# and reused, and a full disk; a forked child's own file; groups held weakly.
# usage: recorder_unit.py RECORDER_DIR OUT_DIR
import functools
import gc
import json
import os
import sys
import traceback
import types
import warnings
import weakref

sys.path.insert(0, sys.argv[1])
import dptp_audit_rec as rec  # noqa: E402

out = sys.argv[2]
os.environ.update(DPTP_AUDIT_DIR=out, DPTP_AUDIT_PPID=str(os.getppid()), RANK="1", WORLD_SIZE="2")
os.environ.pop("TORCHELASTIC_RESTART_COUNT", None)
os.environ.pop("DPTP_AUDIT_MAX_RECORDS", None)
rec.start(sys.argv[1])
MINE = os.path.join(out, "a0.p%d.py.jsonl" % os.getpid())


def records(path=MINE, kind=None):
    rs = [json.loads(l) for l in open(path)]
    return [r for r in rs if kind is None or r["k"] == kind]


def line(needle):
    return next(i for i, l in enumerate(open(__file__), 1) if needle in l and "line(" not in l)


def logged(f):  # torch 2.x's _exception_logger, in effect
    @functools.wraps(f)
    def w(*a, **k):
        return f(*a, **k)
    return w


class Tensor:
    dtype, device = "torch.float32", types.SimpleNamespace(type="cpu", index=None)

    def numel(self):
        return 8


class PG:  # a process group: weakly referable, as torch's are
    def __init__(self, ranks):
        self.ranks = ranks


hello = records()[0]
assert hello["k"] == "hello" and hello["pid"] == os.getpid() and hello["rank"] == 1 and hello["flags"] == "" \
    and hello["pre"] is False and hello["worker"] is True and hello["ppid"] == os.getppid(), hello
assert rec._fd >= 1000 or rec._fd >= os.sysconf("SC_OPEN_MAX") - 64, rec._fd

calls = []
mod = types.ModuleType("torch.distributed.distributed_c10d")
WORLD = PG([0, 1])
mod.GroupMember = types.SimpleNamespace(WORLD=None, NON_GROUP_MEMBER=object())
mod.is_initialized = lambda: True
mod._get_default_group = lambda: WORLD
mod.get_process_group_ranks = lambda pg: pg.ranks
mod.get_rank = lambda: 1


@logged
def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    calls.append(src)
    if src == 7:
        raise RuntimeError("invalid root")
    return "done"


def new_group(ranks=None, timeout=None, backend=None):
    return PG(list(ranks))


def destroy_process_group(group=None):
    pass


mod.broadcast, mod.new_group, mod.destroy_process_group = broadcast, new_group, destroy_process_group
rec._patch_c10d(mod)
assert getattr(mod.broadcast, "_dptp_audit", False), "a decorated collective was left unwrapped"
assert mod.broadcast.__name__ == "broadcast" and mod.broadcast.__wrapped__ is broadcast
assert mod.broadcast(Tensor(), 0) == "done" and calls == [0]
rec._patch_c10d(mod)  # twice: wrapped once
mod.broadcast(Tensor(), src=0)
try:
    mod.broadcast(Tensor(), src=7)
except RuntimeError:
    pass
else:
    raise AssertionError("the error was not raised")
ops = records(kind="op")
assert [(o["op"], o["g"], o["seq"], o["src"], o["n"], o["dt"]) for o in ops] == \
    [("broadcast", [0, 1], s, src, 8, "float32") for s, src in ((1, 0), (2, 0), (3, 7))], ops
assert [o["site"].rsplit(":", 1)[1] for o in ops] == [
    str(line("mod.broadcast(Tensor(), 0)")), str(line("mod.broadcast(Tensor(), src=0)")),
    str(line("mod.broadcast(Tensor(), src=7)"))], ops
assert all(o["site"].startswith(os.path.abspath(__file__)) for o in ops), ops
done = records(kind="done")
assert [(d["g"], d["gn"], d["seq"], d.get("err", False)) for d in done] == \
    [([0, 1], 0, 1, False), ([0, 1], 0, 2, False), ([0, 1], 0, 3, True)], done
kinds = [r["k"] for r in records()]
assert kinds == ["hello", "group", "op", "done", "op", "done", "op", "done"], kinds

# groups are held weakly: a group the program dropped is freed
g = mod.new_group([0, 1])
mod.broadcast(Tensor(), src=1, group=g)
assert [(r["g"], r["gn"]) for r in records(kind="group")][-1] == ([0, 1], 1)
ref = weakref.ref(g)
del g
gc.collect()
assert ref() is None, "the recorder keeps a dropped group alive: %s" % gc.get_referrers(ref())
assert len(rec._groups) == 1, rec._groups

# torch 2.x's functional collectives: the group as a group, a list of ranks,
# a list of lists, a (DeviceMesh, dim), a 1-D DeviceMesh, a group name
fc = types.ModuleType("torch.distributed._functional_collectives")
fcalls = []


def f_all_reduce(self, reduceOp, group, tag=""):
    fcalls.append(("all_reduce", group))
    return self


def f_all_gather_tensor(self, gather_dim, group, tag=""):
    fcalls.append(("all_gather_tensor", group))
    return self


def f_broadcast(self, src, group, tag=""):
    fcalls.append(("broadcast", group))
    return self


for n, f in (("all_reduce", f_all_reduce), ("all_gather_tensor", f_all_gather_tensor), ("broadcast", f_broadcast)):
    f.__name__ = n
    setattr(fc, n, f)


class Mesh:
    mesh = [[0, 1], [2, 3]]

    def get_group(self, mesh_dim=None):
        return WORLD if mesh_dim in (None, 0) else TP


sys.modules["torch.distributed.distributed_c10d"] = mod
TP = PG([1, 3])
mod._resolve_process_group = lambda name: {"tp": TP}[name]
COMPILING = [False]
sys.modules["torch.compiler"] = types.SimpleNamespace(is_compiling=lambda: COMPILING[0])
rec._patch_fc(fc)
t = Tensor()
fc.all_reduce(t, "sum", WORLD)
fc.all_reduce(t, "sum", [0, 1])
fc.all_gather_tensor(t, 0, [[0, 2], [1, 3]])
fc.broadcast(t, 1, (Mesh(), 1))
fc.all_reduce(t, "sum", Mesh())
fc.all_reduce(t, reduceOp="sum", group="tp")
assert [c[0] for c in fcalls] == ["all_reduce", "all_reduce", "all_gather_tensor", "broadcast", "all_reduce",
                                  "all_reduce"], fcalls
fops = [o for o in records(kind="op") if o.get("fc")]
assert [(o["op"], o["g"], o["gn"], o.get("src"), o["n"]) for o in fops] == [
    ("all_reduce", [0, 1], 0, None, 8), ("all_reduce", [0, 1], 0, None, 8),
    ("all_gather_into_tensor", [1, 3], 0, None, 8), ("broadcast", [1, 3], 0, 1, 8),
    ("all_reduce", [0, 1], 0, None, 8), ("all_reduce", [1, 3], 0, None, 8)], fops
assert [o["seq"] for o in fops] == [4, 5, 1, 2, 6, 3], fops
assert all(o["site"].endswith(":%d" % line("fc.all_gather_tensor(t, 0, [[0, 2]")) for o in fops[2:3]), fops
assert len([d for d in records(kind="done") if d["g"] == [1, 3]]) == 3
COMPILING[0] = True  # torch.compile tracing: left to the graph, not recorded
n_ops = len(records(kind="op"))
fc.all_reduce(t, "sum", WORLD)
assert len(records(kind="op")) == n_ops and len(fcalls) == 7

# a site record names the user's frame and the outermost one
def lib_open(m):
    return m.shm_open("psm_x", 0)


sm = types.SimpleNamespace(shm_open=lambda path, *a: 5)
rec._patch_shm(sm)
assert lib_open(sm) == 5
site = records(kind="site")[-1]
assert (site["call"], site["key"]) == ("shm_open", "/psm_x") and \
    site["site"].endswith(":%d" % line('return m.shm_open("psm_x"')) and \
    site["outer"].endswith(":%d" % line("assert lib_open(sm) == 5")), site

# sockets: bind and connect name their site, keyed as the C recorder names the address
class Sock:
    def bind(self, address):
        return "bound"

    def connect(self, address):
        return "connected"

    def connect_ex(self, address):
        return 0


rec._patch_socket(types.SimpleNamespace(socket=Sock))
sk = Sock()
assert sk.bind(("127.0.0.1", 5557)) == "bound" and sk.bind("\0/tmp/x") == "bound" and sk.bind(("", 0)) == "bound"
assert sk.connect("/tmp/s.sock") == "connected" and sk.connect_ex(("127.0.0.1", 29500)) == 0
socks = [(r["call"], r["key"]) for r in records(kind="site")[-4:]]
assert socks == [("bind", "port 5557"), ("bind", "@/tmp/x"), ("connect", "/tmp/s.sock"), ("connect", "port 29500")], socks

# CUDA IPC through torch.multiprocessing's reductions: sites keyed by the
# handle's FNV-1a 64, the C recorder's gpu "h"
red = types.ModuleType("torch.multiprocessing.reductions")
HANDLE = bytes(range(64))


def rebuild_cuda_tensor(*args):
    return "tensor"


def reduce_tensor(t):
    if t == "cuda":
        return (red.rebuild_cuda_tensor, ("cls", (2,), (1,), 0, "scls", "f32", 0, HANDLE, 8, 0, False))
    return ("rebuild_tensor", ())


red.rebuild_cuda_tensor, red.reduce_tensor = rebuild_cuda_tensor, reduce_tensor
rec._patch_reductions(red)
fn, args = red.reduce_tensor("cuda")
assert fn is red.rebuild_cuda_tensor and fn.__qualname__ == "rebuild_cuda_tensor"  # pickled by name
red.reduce_tensor("cpu")
assert fn(*args) == "tensor"
h = 0xcbf29ce484222325
for x in HANDLE:
    h = ((h ^ x) * 0x100000001b3) % 2**64
ipc = [(r["call"], r["key"], r["site"].rsplit(":", 1)[1]) for r in records(kind="site") if "cuda" in r["call"]]
assert ipc == [("cuda_ipc_get", "%016x" % h, str(line('fn, args = red.reduce_tensor("cuda")'))),
               ("cuda_ipc_open", "%016x" % h, str(line("assert fn(*args) ==")))], ipc

# nothing of the recorder in the program's view: a traceback of an error
# raised inside a wrapped call, and a warning raised for the caller
# (stacklevel=2, as torch does), name the program's frames as alone
def all_gather(tensor_list, tensor, group=None, async_op=False):
    warnings.warn("for the caller", stacklevel=2)
    if tensor_list is None:
        raise ValueError("no list")


mod.all_gather = all_gather
rec._patch_c10d(mod)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mod.all_gather([], Tensor())
assert [(w.filename, w.lineno) for w in caught] == [(__file__, line("mod.all_gather([], Tensor())"))], \
    [(w.filename, w.lineno) for w in caught]
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod.all_gather(None, Tensor())
except ValueError:
    frames = [(f.filename, f.name) for f in traceback.extract_tb(sys.exc_info()[2])]
    # before 3.11 a bare raise re-raises sys.exc_info()'s traceback: the wrapper's entry stays
    assert frames == [(__file__, "<module>"), (__file__, "all_gather")] or sys.version_info < (3, 11), frames
else:
    raise AssertionError("the error was not raised")

# the same for a module the recorder patches at import: a warning its code
# raises for its importer names the import line; its error's traceback
# holds the import line and the module's, as alone
mods = os.path.join(out, "mods")
os.mkdir(mods)
with open(os.path.join(mods, "dptp_unit_warns.py"), "w") as f:
    f.write("import warnings\nwarnings.warn('at import', stacklevel=2)\n")
with open(os.path.join(mods, "dptp_unit_raises.py"), "w") as f:
    f.write("raise ValueError('at import')\n")
sys.path.insert(0, mods)
rec._PATCHES["dptp_unit_warns"] = rec._PATCHES["dptp_unit_raises"] = lambda m: None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import dptp_unit_warns  # noqa: E402,F401
assert [(w.filename, w.lineno) for w in caught] == [(__file__, line("import dptp_unit_warns"))], \
    [(w.filename, w.lineno) for w in caught]
try:
    import dptp_unit_raises  # noqa: E402,F401
except ValueError:
    frames = [(os.path.basename(f.filename), f.name) for f in traceback.extract_tb(sys.exc_info()[2])]
    assert frames == [(os.path.basename(__file__), "<module>"), ("dptp_unit_raises.py", "<module>")] or \
        sys.version_info < (3, 11), frames
else:
    raise AssertionError("the error was not raised")

# the program closes the record descriptor and reuses its number: its file
# never gets a record, the recorder reopens its own by path
n_before = len(records())
fd = rec._fd
os.close(fd)
theirs = os.path.join(out, "theirs.txt")
tfd = os.open(theirs, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(tfd, fd)
os.close(tfd)
mod.broadcast(Tensor(), src=0)
os.close(fd)
assert os.path.getsize(theirs) == 0, open(theirs).read()
assert len(records()) == n_before + 2 and rec._fd != fd, (records()[n_before:], rec._fd, fd)

# a full disk: records lost and counted, the program unharmed
path, rec._path = rec._path, "/dev/full"
os.close(rec._fd)
assert mod.broadcast(Tensor(), src=0) == "done"
assert rec._lost == 2 and rec._dropped == 0, (rec._lost, rec._dropped)
rec._path = path
os.close(rec._fd)

# a forked child: its own file and hello, nothing of the parent's, an end at os._exit
pid = os.fork()
if pid == 0:
    try:
        mod.broadcast(Tensor(), src=0, group=WORLD)
    finally:
        os._exit(3)
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 3
child = records(os.path.join(out, "a0.p%d.py.jsonl" % pid))
assert [r["k"] for r in child] == ["hello", "group", "op", "done", "end"], child
assert child[0]["pid"] == pid and child[0]["ppid"] == os.getpid() and not child[0]["worker"], child[0]
assert (child[2]["seq"], child[4]["how"], child[4]["code"], child[4]["records"], child[4]["lost"]) == \
    (1, "_exit", 3, 4, 0), child
assert not [r for r in records() if r.get("pid") == pid]

# the cap: op/done records stop at DPTP_AUDIT_MAX_RECORDS, counted as lost;
# per-group counts and the end record come at the end, with hs: the sum of
# the terms of the collectives not written (/work/contract.md, 08:25 UTC)
M64 = 2**64 - 1


def ref_term(sig, pos):  # the amendment's definition, written out again
    h = 0xcbf29ce484222325
    for x in sig.encode():
        h = ((h ^ x) * 0x100000001b3) & M64
    z = (h + pos * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


# the amendment's test vectors
for sig, pos, sig_h, term in (("all_reduce|4|float32|", 0, "7a47326087b79594", "aac1b457afeb267c"),
                              ("all_reduce|4|float32|", 1, "7a47326087b79594", "8e2fa50c80192a79"),
                              ("broadcast|8|float32|src=1", 3, "b971f08fe4c43863", "5ba63920bf89ce99"),
                              ("barrier|-1||", 2, "146f9915e792c06e", "7f21225753343a58")):
    assert "%016x" % rec._sig_h(sig) == sig_h and "%016x" % rec._term(sig, pos) == term, (sig, pos)
    assert "%016x" % ref_term(sig, pos) == term, (sig, pos)


def barrier(group=None, async_op=False, device_ids=None):
    return None


def send(tensor, dst=None, group=None, tag=0):
    return None


mod.barrier, mod.send = barrier, send
rec._patch_c10d(mod)
pid = os.fork()
if pid == 0:
    rec._max = 6
    for _ in range(10):
        mod.broadcast(Tensor(), src=0)
    mod.barrier()
    mod.send(Tensor(), 0)  # point-to-point: counted in seq, not summed
    mod.barrier()
    COMPILING[0] = False
    fc.all_reduce(t, "sum", WORLD)
    mod.broadcast(Tensor(), src=1, group=TP)
    rec._end("atexit", None)
    os._exit(0)
os.waitpid(pid, 0)
child = records(os.path.join(out, "a0.p%d.py.jsonl" % pid))
tail = [(r["k"], r.get("seq")) for r in child[-5:]]
assert [r["k"] for r in child].count("op") == 2 and tail == [
    ("cap", None), ("group", None), ("count", 14), ("count", 1), ("end", None)], child
assert (child[-1]["records"], child[-1]["lost"], child[-1]["dropped"], child[-3]["g"], child[-5]["max"]) == \
    (len(child) - 1, 26, 26, [0, 1], 6), child
# broadcasts 3-10 past the cap (places 2-9), the barriers (10, 12), the
# functional all_reduce (13); the send has no place
hs = sum(ref_term("broadcast|8|float32|src=0", p) for p in range(2, 10)) + ref_term("barrier|-1||", 10) + \
    ref_term("barrier|-1||", 11) + ref_term("all_reduce|8|float32|", 12)
assert (child[-3]["nc"], child[-3]["hs"]) == (13, "%016x" % (hs & M64)), child[-3]
assert (child[-2]["g"], child[-2]["nc"], child[-2]["hs"]) == \
    ([1, 3], 1, "%016x" % ref_term("broadcast|8|float32|src=1", 0)), child[-2]

# destroy_process_group() of the world, then a new one: a call on the default
# group names the new world's group, numbered from the start again
mod.destroy_process_group()
WORLD2 = PG([0, 1, 2])
mod._get_default_group = lambda: WORLD2
mod.broadcast(Tensor(), src=0)
last = records(kind="op")[-1]
assert (last["g"], last["gn"], last["seq"]) == ([0, 1, 2], 0, 1), last
# a CUDA IPC handle as torch 2.x shares it (version byte, 'c', the 64 bytes
# of cudaIpcMemHandle_t) hashes as the C recorder hashes the raw 64 bytes
raw = bytes(range(64))
assert rec._fnv(b"\x02c" + raw) == rec._fnv(b"\x03c" + raw) == rec._fnv(raw) != rec._fnv(b"\x02e" + raw[:63] + b"\0")
print("ok")
