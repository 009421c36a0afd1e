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
