#!/usr/bin/env python3
"""Real PyTorch workers for torch_e2e.py (gloo, CPU): whatever torch the
interpreter has, 1.13 to 2.11.

usage: torch_worker.py ddp            5 SGD steps of a DDP model; prints each step's loss
       torch_worker.py groups         broadcast_object_list, new_group subgroups, all_gather_object
       torch_worker.py store          torch's TCPStore client against the launcher's store and
                                      against a store torch hosts itself: same results
"""
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

T = datetime.timedelta


def rank_world():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo", timeout=T(seconds=60))
    r, w = rank_world()
    assert dist.get_rank() == r and dist.get_world_size() == w
    torch.manual_seed(0)  # one model everywhere
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1000 + r)  # each rank's own data
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # the parameters agree across ranks after the all-reduced steps
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    same = bool(torch.equal(flat, ref))
    print("rank %d of %d losses %s params_equal %s" % (r, w, " ".join(repr(v) for v in losses), same), flush=True)
    dist.destroy_process_group()
    return 0 if same else 1


def groups():
    dist.init_process_group("gloo", timeout=T(seconds=60))
    r, w = rank_world()
    objs = [{"from": 0, "world": w, "list": [1, 2, 3]}, "text"] if r == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"from": 0, "world": w, "list": [1, 2, 3]}, "text"], objs
    # every rank creates every group, in the same order
    halves = [dist.new_group(list(range(0, w // 2))), dist.new_group(list(range(w // 2, w)))]
    mine = halves[0] if r < w // 2 else halves[1]
    members = list(range(0, w // 2)) if r < w // 2 else list(range(w // 2, w))
    t = torch.tensor([float(r)])
    dist.all_reduce(t, group=mine)
    assert t.item() == sum(members), (t.item(), members)
    odd = dist.new_group([k for k in range(w) if k % 2])
    if r % 2:
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=odd)
        assert t.item() == w // 2
    got = [None] * w
    dist.all_gather_object(got, ("rank", r))
    assert got == [("rank", k) for k in range(w)], got
    dist.barrier()
    print("rank %d groups ok: half %s sum %d, objects %s" % (r, members, sum(members), objs[1]), flush=True)
    dist.destroy_process_group()
    return 0


def exercise(st, other):
    """Every query torch's client has, in this torch; returns what came back.
    other: a second client of the same store, for a wait that another
    connection ends."""
    out = []
    n0 = st.num_keys()
    st.set("a", "1")
    out.append(("get", st.get("a")))
    out.append(("add", st.add("cnt", 5), st.add("cnt", -7), st.get("cnt")))
    out.append(("compare_set", st.compare_set("a", "1", "2"), st.compare_set("a", "x", "3"),
                st.compare_set("fresh", "", "f"), st.compare_set("none", "e", "d")))
    out.append(("num_keys", st.num_keys() - n0))
    out.append(("delete_key", st.delete_key("a"), st.delete_key("a"), st.num_keys() - n0))
    timer = threading.Timer(0.3, lambda: other.set("late", "v"))
    timer.start()
    t0 = time.monotonic()
    st.wait(["late"])
    timer.join()
    out.append(("wait", st.get("late"), time.monotonic() - t0 >= 0.25))
    t0 = time.monotonic()
    try:
        st.wait(["never"], T(milliseconds=300))
        out.append(("wait timeout", "no timeout"))
    except RuntimeError as e:
        out.append(("wait timeout", "imeout" in str(e), time.monotonic() - t0 >= 0.25))
    out.append(("after timeout", st.get("fresh")))
    st.set_timeout(T(seconds=30))
    # what newer torch has; a PrefixStore may refuse some of it itself, the
    # same way in front of either store
    def opt(name, fn):
        try:
            out.append((name,) + tuple(fn()))
        except (RuntimeError, NotImplementedError) as e:
            out.append((name, "refused", type(e).__name__))

    if hasattr(st, "check"):
        opt("check", lambda: (st.check(["late"]), st.check(["late", "never"])))
    if hasattr(st, "append"):
        opt("append", lambda: (st.append("ap", "x"), st.append("ap", "yz"), st.get("ap")))
    if hasattr(st, "multi_set"):
        opt("multi_get", lambda: (st.multi_set(["m1", "m2"], ["v1", "v2"]), st.multi_get(["m1", "m2", "late"])))
    if hasattr(st, "queue_push"):
        opt("queue", lambda: (st.queue_push("q", "one"), st.queue_push("q", "two"), st.queue_len("q"),
                              st.queue_pop("q"), st.queue_pop("q", False), st.queue_len("q")))
    if hasattr(st, "list_keys"):
        opt("list_keys", lambda: (sorted(k for k in st.list_keys() if k in ("fresh", "late", "ap", "m1", "m2")),))
    return out


def store():
    r, _ = rank_world()
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    def client(h, p, prefix):
        kw = dict(world_size=None, is_master=False, timeout=T(seconds=30), wait_for_workers=False)
        if "use_libuv" in dist.TCPStore.__init__.__doc__:
            kw["use_libuv"] = False  # a client either way; older torch has no such argument
        return dist.PrefixStore(prefix, dist.TCPStore(h, p, **kw))

    # the launcher's store, each rank under its own prefix and in turn (num_keys
    # counts every rank's keys)
    turns = client(host, port, "turns")
    if r > 0:
        turns.wait(["done%d" % (r - 1)])
    agent = exercise(client(host, port, "r%d" % r), client(host, port, "r%d" % r))
    turns.set("done%d" % r, "1")
    # the same against a store torch hosts
    own = dist.TCPStore("127.0.0.1", 0, None, True, T(seconds=30), wait_for_workers=False)
    ref = exercise(client("127.0.0.1", own.port, "r%d" % r), client("127.0.0.1", own.port, "r%d" % r))
    for a, b in zip(agent, ref):
        print("rank %d %-12s agent %r torch %r %s" % (r, a[0], a[1:], b[1:], "same" if a == b else "DIFFERENT"),
              flush=True)
    ok = agent == ref and len(agent) == len(ref)
    print("rank %d store %s: %d queries, torch %s" % (r, "ok" if ok else "BAD", len(agent), torch.__version__),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit({"ddp": ddp, "groups": groups, "store": store}[sys.argv[1]]())
