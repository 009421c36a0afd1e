#!/usr/bin/env python3
"""Writes python_states.txt: rendezvous states pickled by Python's own pickle
(protocol 4) from stand-ins of torch 2.11's classes (same module, names and
attributes), for the decoder's refusals and for encoder cases the torch
captures (c10d_*_states_2.11.txt, the real bytes) do not cover. Each entry:
"== NAME" then the hex. Run: python3 gen_states.py > python_states.txt"""
import datetime as dt
import os
import pickle
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from standins import _NodeDesc, _RendezvousState  # noqa: E402

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 12, 4, 3, 14, 25, 288718, tzinfo=UTC)


def out(name, obj):
    print("== " + name)
    print(pickle.dumps(obj, protocol=4).hex())


# good: three participants, ranks assigned, one waiting, a deadline
s = _RendezvousState()
a, b, c, w = (_NodeDesc("node-a.example", 4_000_000, 0), _NodeDesc("node-b", 70000, 1),
              _NodeDesc("node-c", 12, 300), _NodeDesc("late", 99, 0))
s.round = 7
s.participants = {a: 0, b: 1, c: 2}
s.wait_list = {w}
s.deadline = T0 + dt.timedelta(seconds=30)
s.last_heartbeats = {a: T0, b: T0 + dt.timedelta(microseconds=1), c: T0 + dt.timedelta(days=400),
                     w: T0 + dt.timedelta(0)}  # torch never shares a datetime object
out("good_three_and_waiting", s)

s = _RendezvousState()
s.closed = True
s.complete = True
s.redundancy_list = {a}
s.last_heartbeats = {a: T0}
out("good_closed_redundant", s)

# bad ones
class Evil:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned",))


s = _RendezvousState()
s.participants = {a: Evil()}
out("bad_global", s)

s = _RendezvousState()
s.participants = [a]
out("bad_list", s)

s = _RendezvousState()
s.last_heartbeats = {a: dt.datetime(2026, 1, 1)}
out("bad_naive_datetime", s)

s = _RendezvousState()
s.last_heartbeats = {a: dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))}
out("bad_not_utc", s)

s = _RendezvousState()
s.extra = 1
out("bad_unknown_attribute", s)

s = _RendezvousState()
del s.wait_list
out("bad_missing_attribute", s)

out("bad_not_a_state", {"round": 0})


# Where a hand-rolled decoder and Python's pickle can part ways (issue 24):
# each case is checked against pickle.loads here, with the stand-ins.
def unframed(obj):
    """pickle.dumps without the FRAME opcode (optional when loading), so
    that bytes can be spliced in."""
    p = pickle.dumps(obj, protocol=4)
    assert p[2] == 0x95
    return p[:2] + p[11:]


def must_refuse(name, data, exc):
    try:
        pickle.loads(data)
    except exc:
        pass
    else:
        raise SystemExit(name + ": Python's pickle loaded it")
    print("== " + name)
    print(data.hex())


# a UTC offset of 2**53 days: Python refuses the timedelta (OverflowError);
# in 64 bits its microseconds wrap to 0, which reads as timezone.utc
s = _RendezvousState()
s.last_heartbeats = {a: dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(seconds=12345)))}
p = unframed(s)
args = b"K\x00M90K\x00\x87"  # (0, 12345, 0)
assert p.count(args) == 1
must_refuse("bad_huge_utc_offset", p.replace(args, b"\x8a\x08" + (2**53).to_bytes(8, "little") + b"K\x00K\x00\x87"),
            OverflowError)

# an address that is not UTF-8 (pickle reads str with surrogatepass)
s = _RendezvousState()
s.last_heartbeats = {_NodeDesc("node-Z", 1, 0): T0}
p = unframed(s)
assert p.count(b"node-Z") == 1
must_refuse("bad_addr_not_utf8", p.replace(b"node-Z", b"node-\xff"), UnicodeDecodeError)
must_refuse("bad_addr_overlong", p.replace(b"\x8c\x06node-Z", b"\x8c\x07node-\xc1\x81"), UnicodeDecodeError)

# a lone surrogate in an address: surrogatepass lets it through both ways
s = _RendezvousState()
s.last_heartbeats = {_NodeDesc("node-\ud800", 1, 0): T0}
assert pickle.loads(pickle.dumps(s, protocol=4)).last_heartbeats
out("good_surrogate_addr", s)

# an attribute written twice: the object gets the last value (round 9)
s = _RendezvousState()
s.round = 7
p = unframed(s)
assert p.endswith(b"ub.")
p = p[:-3] + b"\x8c\x05roundK\x09" + p[-3:]
assert pickle.loads(p).round == 9
print("== dup_attribute_round_9")
print(p.hex())

# two equal nodes as two keys or members (torch never writes this): a dict
# keeps the first key with the last value, a set keeps one
s = _RendezvousState()
twin = _NodeDesc(a.addr, a.pid, a.local_id)
eq, hsh = _NodeDesc.__eq__, _NodeDesc.__hash__
_NodeDesc.__eq__, _NodeDesc.__hash__ = object.__eq__, object.__hash__
try:
    s.participants = {a: 0, b: 1, twin: 5}
    s.wait_list = {w, _NodeDesc(w.addr, w.pid, w.local_id)}
    s.last_heartbeats = {a: T0, twin: T0 + dt.timedelta(seconds=1)}
    p = pickle.dumps(s, protocol=4)
finally:
    _NodeDesc.__eq__, _NodeDesc.__hash__ = eq, hsh
r = pickle.loads(p)
assert list(r.participants.values()) == [5, 1] and len(r.wait_list) == 1 and len(r.last_heartbeats) == 1
print("== dup_nodes_ranks_5_1")
print(p.hex())
