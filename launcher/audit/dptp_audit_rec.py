# dptp-run --audit: the Python recorder, loaded into every Python process of
# the job by the sitecustomize beside it (the workers, and whatever they
# start: fork, spawn, forkserver, subprocess, exec). It writes the records of
# lib/base/audit_rec.h and /work/contract.md: torch.distributed's groups and
# calls (entry "op", return "done"), the world each init_process_group joins,
# the device each process selects, and the file:line of the sockets and
# shared memory it names. Each process writes its own file,
# a<restart>.p<pid>.py.jsonl. torch is never imported from here: modules are
# patched when the program imports them (or at start when a .pth imported
# them first). Works with torch 1.13 to 2.11; a call whose arguments it does
# not understand is recorded with what it could read, never refused.
#
# Out of the program's way: only os, sys, _thread, _weakref, time and
# atexit/fcntl (taken out of sys.modules again when the program had not
# imported them) are used, so sys.modules differs by this module alone; the
# record descriptor is moved high, close-on-exec, and checked (fstat) before
# the next write whenever the program called os.close, os.closerange or
# os.dup2 (reopened by path when the number is no longer ours); groups are
# held weakly; a write error is counted, never raised; tracebacks show no
# frame of this file (a wrapper takes its own entry out of the error's
# traceback before it re-raises; sys.excepthook drops any left), and
# warnings torch raises for its caller name the caller (the wrappers' code
# is named so that warnings and logging step over their frames).
import os
import sys
import _thread
import _weakref


def _quiet_import(name):
    """A module the program did not import, kept out of its sys.modules."""
    had = name in sys.modules
    mod = __import__(name)
    if not had:
        sys.modules.pop(name, None)
    return mod


_now = _quiet_import("time").monotonic
_fcntl = None

_fd = -1
_path = None
_ino = None       # (st_dev, st_ino) of the record file
_pending = None   # a forked child: (time of the fork) until its first record
_torn = False     # the last write was short: start the next one on a new line
_dirty = False    # the program closed or replaced a descriptor: check ours
_close = os.close
_records = 0
_lost = 0
_dropped = 0      # of _lost: dropped by the cap, not a write that failed
_max = 200000
_capped = False
_how = None       # "atexit" / "_exit" once the end record is written
_code = None
_here = ""


class _Local(_thread._local):
    inside = False    # inside a recorded call (torch's calls of its own are not)
    finding = False


_tls = _Local()
_lock = _thread.allocate_lock()
_groups = {}      # id(pg) -> (ranks tuple, gn, weak ref, JSON '"g":[..],"gn":N')
_ngroups = {}     # ranks tuple -> groups created with that member list
_seq = {}         # (ranks, gn) -> [calls, collectives, sum of their terms past the cap]
_sigh = {}        # signature -> its FNV-1a 64 (the sum's cache)
_sigk = {}        # (op, numel, dtype, roots) -> the same, without the string
_listed = set()   # member lists a functional collective named, not a group
_world_e = None   # the default group's entry, once a call used it
_sites = {}       # code object, line -> JSON-quoted "file:line"
_skip_dirs = ()
_stdlib = "\0"    # the standard library's folder: skipped, but for its *-packages
_ESC = dict((i, "\\u%04x" % i) for i in range(32))
_ESC[34] = '\\"'
_ESC[92] = "\\\\"


def _q(s):
    s = str(s)
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    return '"' + s.translate(_ESC) + '"'


def _move_high(fd):
    """fd moved to >= 1000 (or the top of RLIMIT_NOFILE when lower), close-on-exec."""
    global _fcntl
    try:
        if _fcntl is None:
            _fcntl = _quiet_import("fcntl")
        lim = os.sysconf("SC_OPEN_MAX")
        lo = 1000 if lim <= 0 else min(1000, lim - 1)
        for _ in range(64):
            try:
                hi = _fcntl.fcntl(fd, _fcntl.F_DUPFD_CLOEXEC, lo)
            except OSError:
                if lo <= 3:
                    break
                lo -= 1
                continue
            _close(fd)
            return hi
    except Exception:
        pass
    return fd


def _open():
    """Opens (or reopens) this process's record file; True when open."""
    global _fd, _ino
    try:
        fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError:
        _fd = -1
        return False
    fd = _move_high(fd)
    st = os.fstat(fd)
    _fd, _ino = fd, (st.st_dev, st.st_ino)
    return True


def _write(line):
    """One record, one write(2); counted in _records or _lost. Never raises."""
    global _records, _lost, _torn, _dirty
    try:
        data = (line + "\n").encode() if not _torn else ("\n" + line + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate in a path
        data = (("\n" if _torn else "") + line + "\n").encode("utf-8", "replace")
    if _dirty:  # the program closed or replaced descriptors since the last check
        _dirty = False
        try:
            st = os.fstat(_fd)
            if (st.st_dev, st.st_ino) != _ino:  # ours closed and the number reused
                raise OSError
        except OSError:
            if not _open():
                _lost += 1
                return
    try:
        n = os.write(_fd, data)
    except OSError:
        _lost += 1
        return
    if n == len(data):
        _torn = False
        _records += 1
    else:
        _torn = True
        _lost += 1


def _emit(line):
    """A record the cap leaves (hello, group, world, exc)."""
    if _fd < 0 and not _wake():
        return
    _write(line)


def _emit_call(line):
    """An op, done, site or dev record: subject to the cap. False when the
    cap dropped it."""
    global _capped
    if _fd < 0 and not _wake():
        return True
    if _records >= _max:
        if not _capped:
            _capped = True
            _write('{"k":"cap","max":%d,"t":%.6f}' % (_max, _now()))
        _over()
        return False
    _write(line)
    return True


def _over():
    """A record dropped by the cap: counted in lost, and in dropped."""
    global _lost, _dropped
    _lost += 1
    _dropped += 1


def _wake():
    """A forked child's file, opened at its first record."""
    global _pending
    if _pending is None or _path is None:
        return False
    t, _pending = _pending, None
    if not _open():
        return False
    _hello(t)
    return _fd >= 0


def _site():
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_skip_dirs) and (not fn.startswith(_stdlib) or "-packages" in fn):
            key = (f.f_code, f.f_lineno)
            s = _sites.get(key)
            if s is None:
                s = _sites[key] = _q("%s:%d" % (fn, f.f_lineno))
            return s
        f = f.f_back
    return '"?"'


def _outer():
    """The user's outermost frame: the main script's line, or the entry
    function's of a spawned worker."""
    f, s = sys._getframe(2), '"?"'
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_skip_dirs) and not fn.startswith("<") and \
                (not fn.startswith(_stdlib) or "-packages" in fn):
            s = _q("%s:%d" % (fn, f.f_lineno))
        f = f.f_back
    return s


def _ints(v):
    return "[" + ",".join(str(int(x)) for x in v) + "]"


def _group_ranks(dist, pg):
    try:
        return tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:
        pass
    try:
        m = dist.distributed_c10d._pg_group_ranks[pg]
        return tuple(sorted(m, key=lambda g: m[g]))
    except Exception:
        return None


def _group_key(dist, group):
    """The _groups entry of a call's group; None for a rank outside it."""
    global _world_e
    if group is None:
        e = _world_e
        if e is not None:
            return e
    c10d = dist.distributed_c10d
    if group is None or group is getattr(c10d.GroupMember, "WORLD", None):
        group = c10d._get_default_group() if dist.is_initialized() else None
        if group is None:
            return None
        hit = _groups.get(id(group))
        if hit is None or hit[2]() is not group:
            ranks = _group_ranks(dist, group)
            if ranks is None:
                return None
            hit = _register(ranks, group, None)
        _world_e = hit  # until destroy_process_group() or init_process_group()
        return hit
    if group is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
        return None
    hit = _groups.get(id(group))
    if hit is not None and hit[2]() is group:
        return hit
    ranks = _group_ranks(dist, group)
    if ranks is None:
        return None
    return _register(ranks, group, None)


def _drop(ident):
    def gone(_ref):
        e = _groups.get(ident)
        if e is not None and e[2] is _ref:
            _groups.pop(ident, None)
    return gone


def _nothing():
    return None


def _register(ranks, pg, site, backend=None):
    with _lock:
        gn = _ngroups.get(ranks, 0)
        _ngroups[ranks] = gn + 1
        ref = _nothing
        if pg is not None:
            try:
                ref = _weakref.ref(pg, _drop(id(pg)))
            except TypeError:  # not weakly referable: held until destroyed
                ref = (lambda p: lambda: p)(pg)
        e = (ranks, gn, ref, '"g":%s,"gn":%d' % (_ints(ranks), gn), _seq.setdefault((ranks, gn), [0, 0, 0]))
        if pg is not None:
            _groups[id(pg)] = e
    _emit('{"k":"group",%s,"site":%s%s,"t":%.6f}' % (
        e[3], site or '"?"', (',"backend":' + _q(backend)) if backend else "", _now()))
    return e


_dtypes = {}      # torch dtype -> its name


def _dtype(d):
    s = _dtypes.get(d)
    if s is None:
        s = _dtypes[d] = str(d).replace("torch.", "")
    return s


def _tensor_info(t):
    """(numel, dtype, device) of a tensor or a list of them."""
    try:
        if isinstance(t, (list, tuple)):
            if not t:
                return 0, None, None
            n = 0
            for x in t:
                n += x.numel()
            t0 = t[0]
            return n, _dtype(t0.dtype), t0.device
        return t.numel(), _dtype(t.dtype), t.device
    except Exception:
        return -1, None, None


# op -> (parameter holding the local input, the root parameters, the size
# is the same on every member)
_OPS = {
    "broadcast": ("tensor", ("src", "group_src"), True),
    "all_reduce": ("tensor", (), True),
    "reduce": ("tensor", ("dst", "group_dst"), True),
    "all_gather": ("tensor", (), True),
    "all_gather_into_tensor": ("input_tensor", (), True),
    "_all_gather_base": ("input_tensor", (), True),
    "all_gather_coalesced": ("input_tensor_list", (), True),
    "all_reduce_coalesced": ("tensors", (), True),
    "reduce_scatter": ("output", (), True),
    "reduce_scatter_tensor": ("output", (), True),
    "_reduce_scatter_base": ("output", (), True),
    "all_to_all": ("input_tensor_list", (), False),
    "all_to_all_single": ("input", (), False),
    "gather": ("tensor", ("dst", "group_dst"), True),
    "scatter": ("tensor", ("src", "group_src"), True),
    "barrier": (None, (), True),
    "monitored_barrier": (None, (), True),
    "send": ("tensor", ("dst", "group_dst"), False),
    "recv": ("tensor", ("src", "group_src"), False),
    "isend": ("tensor", ("dst", "group_dst"), False),
    "irecv": ("tensor", ("src", "group_src"), False),
    "broadcast_object_list": ("object_list", ("src", "group_src"), False),
    "all_gather_object": (None, (), False),
    "gather_object": (None, ("dst", "group_dst"), False),
    "scatter_object_list": (None, ("src", "group_src"), False),
    "send_object_list": ("object_list", ("dst", "group_dst"), False),
    "recv_object_list": ("object_list", ("src", "group_src"), False),
}
_ROOT_KEY = {"src": "src", "dst": "dst", "group_src": "gsrc", "group_dst": "gdst"}
# point-to-point calls: no place among a group's collectives, not summed
_P2P = frozenset(("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list"))

# torch.distributed._functional_collectives (torch 2.x): name -> (the op it
# is recorded as, the input parameter, the root parameters)
_FC = {
    "all_reduce": ("all_reduce", "self", ()),
    "all_reduce_coalesced": ("all_reduce_coalesced", "self", ()),
    "all_gather_tensor": ("all_gather_into_tensor", "self", ()),
    "all_gather_tensor_autograd": ("all_gather_into_tensor", "self", ()),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "self", ()),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "self", ()),
    "reduce_scatter_tensor_autograd": ("reduce_scatter_tensor", "self", ()),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "inputs", ()),
    "all_to_all_single": ("all_to_all_single", "self", ()),
    "all_to_all_single_autograd": ("all_to_all_single", "self", ()),
    "broadcast": ("broadcast", "self", ("src",)),
}


def _roots(roots, bound):
    """[(record key, value)] of the roots passed, in the order of roots."""
    out = []
    for p in roots:
        v = bound.get(p)
        if v is not None:
            try:
                out.append((_ROOT_KEY[p], int(v)))
            except (TypeError, ValueError):
                pass
    return out


def _size(name, spec_in, bound):
    """(n, dtype name or None, device) as the op record carries them."""
    n, dt, dev = -1, None, None
    if spec_in == "object_list":
        try:
            n = len(bound.get("object_list"))
        except TypeError:
            pass
    elif spec_in is not None:
        n, dt, dev = _tensor_info(bound.get(spec_in))
    if name == "all_to_all_single" and (bound.get("input_split_sizes") or bound.get("output_split_sizes")):
        n = -1
    return n, dt, dev


_M64 = 0xFFFFFFFFFFFFFFFF


def _sig_h(sig):
    """FNV-1a 64 of a call's signature, cached (signatures repeat)."""
    h = _sigh.get(sig)
    if h is None:
        h = 0xcbf29ce484222325
        for x in sig.encode("utf-8", "replace"):
            h = ((h ^ x) * 0x100000001b3) & _M64
        if len(_sigh) < 4096:
            _sigh[sig] = h
    return h


def _term(sig, pos):
    """A collective's term of the count record's hs: splitmix64's finalizer
    of its signature's hash plus its place among the group's collectives
    (/work/contract.md, 08:25)."""
    z = (_sig_h(sig) + pos * 0x9E3779B97F4A7C15) & _M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _call(name, e, spec_in, roots, bound, extra):
    """The op record of a call on e's group (or, past the cap, its term in
    the group's sum); returns (e, seq) for its done record."""
    c = e[4]  # calls on one group from two threads at once are the program's race
    c[0] += 1
    seq = c[0]
    pos = -1
    if name not in _P2P:
        pos = c[1]
        c[1] = pos + 1
    if _capped:
        _over()
    elif _emit_call(_op_line(name, e, seq, spec_in, roots, bound, extra)):
        return e, seq
    if pos < 0:
        return e, seq
    # the signature's hash, cached by what it is made of when the input is
    # a tensor (numel and dtype read directly: this runs on every call past
    # the cap); else by the signature's string
    r = tuple(_roots(roots, bound)) if roots else ()
    key = h = None
    if spec_in is not None and name != "all_to_all_single":
        try:
            x = bound.get(spec_in)
            key = name, x.numel(), x.dtype, r
            h = _sigk.get(key)
        except Exception:
            key = None
    if h is None:
        n, dt, _ = _size(name, spec_in, bound)
        h = _sig_h("%s|%d|%s|%s" % (name, n, dt or "", ",".join("%s=%d" % kv for kv in r)))
        if key is not None and len(_sigk) < 4096:
            _sigk[key] = h
    z = (h + pos * 0x9E3779B97F4A7C15) & _M64  # _term(), inline
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    c[2] = (c[2] + (z ^ (z >> 31))) & _M64
    return e, seq


def _op_line(name, e, seq, spec_in, roots, bound, extra):
    for kv in _roots(roots, bound):
        extra += ',"%s":%d' % kv
    n, dt, dev = _size(name, spec_in, bound)
    if dt:
        extra += ',"dt":"%s"' % dt
    if dev is not None and dev.type != "cpu":
        extra += ',"dev":"%s"' % dev
        if dev.index is not None:
            _device(dev.index, "tensor", site=None)
    if bound.get("async_op"):
        extra += ',"async":true'
    return '{"k":"op","op":"%s",%s,"seq":%d,"n":%d%s,"site":%s,"t":%.6f}' % (
        name, e[3], seq, n, extra, _site2(), _now())


def _site2():
    f = sys._getframe(3)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_skip_dirs) and (not fn.startswith(_stdlib) or "-packages" in fn):
            key = (f.f_code, f.f_lineno)
            s = _sites.get(key)
            if s is None:
                s = _sites[key] = _q("%s:%d" % (fn, f.f_lineno))
            return s
        f = f.f_back
    return '"?"'


def _bind(params, args, kwargs):
    """A call's arguments by parameter name."""
    bound = dict(zip(params, args))
    if kwargs:
        bound.update(kwargs)
    return bound


def _record_op(dist, name, params, args, kwargs):
    """The op record of a call; returns (entry, seq) for its done record."""
    spec = _OPS[name]
    bound = _bind(params, args, kwargs)
    e = _group_key(dist, bound.get("group"))
    if e is None:
        return None
    return _call(name, e, spec[0], spec[1], bound, "")


def _done(rec, err):
    e, seq = rec
    if _capped:
        _over()
        return
    _emit_call('{"k":"done",%s,"seq":%d%s,"t":%.6f}' % (e[3], seq, ',"err":true' if err else "", _now()))


_last_dev = [None]


def _device(index, how, site):
    if index == _last_dev[0] and how == "tensor":
        return
    _last_dev[0] = index
    _emit_call('{"k":"dev","dev":%d,"how":"%s","site":%s,"t":%.6f}' % (
        index, how, site or _site(), _now()))


def _params(fn):
    """The parameter names a call binds positionally (inspect unused)."""
    f = fn
    for _ in range(16):
        w = getattr(f, "__wrapped__", None)
        if w is None:
            break
        f = w
    c = getattr(f, "__code__", None)
    if c is None:
        return ()
    return c.co_varnames[:c.co_argcount]


# The file name the wrappers' code carries: the warnings module (stacklevel)
# and logging (findCaller, stacklevel) step over frames whose file name holds
# both "importlib" and "_bootstrap" (CPython's is_internal_frame(), Python
# 3.8-3.13: meant for the import system's frames), so a warning torch raises
# for its caller names the program's line, not the wrapper's, as alone.
_INTERNAL = os.path.join(os.path.dirname(os.path.realpath(__file__)),
                         "dptp_audit_rec.py (a wrapper: skipped as importlib._bootstrap)")


def _strip(e):
    """In a wrapper's except, before its bare raise: the wrapper's entry (the
    first) out of e's traceback, so that the program's tracebacks show no
    frame of the recorder. A bare raise re-raises e with e.__traceback__ and
    adds no entry (Python 3.11+; before 3.11 it takes the traceback of
    sys.exc_info(), and the entry stays)."""
    try:
        tb = e.__traceback__
        if tb is not None and tb.tb_frame.f_code.co_filename == _INTERNAL:
            e.__traceback__ = tb.tb_next
    except Exception:
        pass


def _dress(wrapper, fn, name):
    try:  # its frame skipped by warnings' stacklevel and logging's caller
        wrapper.__code__ = wrapper.__code__.replace(co_filename=_INTERNAL)
    except (AttributeError, TypeError, ValueError):
        pass
    wrapper.__wrapped__ = fn
    wrapper._dptp_audit = True
    for a in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, a, getattr(fn, a))
        except (AttributeError, TypeError):
            pass
    return wrapper


def _recorded(fn, name, record, skip=None):
    """The wrapper of a recorded call: record(args, kwargs) -> (entry, seq)
    of its op record (or None) at entry, its done record at return; not
    inside another recorded call, nor while skip() (torch.compile tracing)."""
    def wrapper(*args, **kwargs):
        if skip is not None and skip():  # first, and nothing else: torch.compile traces this code
            return fn(*args, **kwargs)
        t, rec = _tls, None
        outer = not t.inside and (_fd >= 0 or _pending is not None)
        if outer:
            try:
                rec = record(args, kwargs)
            except Exception:
                rec = None
            t.inside = True
        try:
            r = fn(*args, **kwargs)
        except BaseException as e:
            if outer:
                t.inside = False
                if rec is not None:
                    _done(rec, True)
            _strip(e)
            raise
        if outer:
            t.inside = False
            if rec is not None:
                _done(rec, False)
        return r
    return _dress(wrapper, fn, name)


def _wrap_op(dist, name, fn):
    params = _params(fn)
    return _recorded(fn, name, lambda args, kwargs: _record_op(dist, name, params, args, kwargs))


def _wrap_batch(dist, fn):
    def wrapper(p2p_op_list, *args, **kwargs):
        recs = []
        outer = not _tls.inside
        if outer:
            for p in p2p_op_list:
                try:
                    name = getattr(p.op, "__name__", "isend")
                    if name not in ("isend", "irecv"):
                        name = "irecv" if "recv" in name else "isend"
                    peer = getattr(p, "peer", None)
                    params = ("tensor", "dst" if name == "isend" else "src", "group")
                    r = _record_op(dist, name, params, (p.tensor, peer, p.group), {})
                    if r is not None:
                        recs.append(r)
                except Exception:
                    pass
        _tls.inside = True
        err = True
        try:
            r = fn(p2p_op_list, *args, **kwargs)
            err = False
            return r
        except BaseException as e:
            _strip(e)
            raise
        finally:
            if outer:
                _tls.inside = False
                for r in recs:
                    _done(r, err)
    return _dress(wrapper, fn, "batch_isend_irecv")


def _fc_key(dist, group):
    """The _groups entry of a functional collective's group: a process group,
    a group name, a list of global ranks (or of lists: the one holding this
    rank), a DeviceMesh or (DeviceMesh, dim)."""
    c10d = dist.distributed_c10d
    if isinstance(group, str):
        res = getattr(c10d, "_resolve_process_group", None)
        if res is None:
            return None
        group = res(group)
    elif isinstance(group, tuple) and len(group) == 2 and hasattr(group[0], "get_group"):
        group = group[0].get_group(group[1])
    elif hasattr(group, "get_group") and hasattr(group, "mesh"):
        group = group.get_group()
    elif isinstance(group, list):
        ranks = group
        if ranks and isinstance(ranks[0], list):
            me = dist.get_rank()
            ranks = next((r for r in ranks if me in r), None)
            if ranks is None:
                return None
        # torch uses the first group with these members (gn 0), or makes it
        ranks = tuple(int(r) for r in ranks)
        with _lock:
            new = ranks not in _ngroups and ranks not in _listed
            _listed.add(ranks)
            e = (ranks, 0, _nothing, '"g":%s,"gn":0' % _ints(ranks), _seq.setdefault((ranks, 0), [0, 0, 0]))
        if new:
            _emit('{"k":"group",%s,"site":%s,"t":%.6f}' % (e[3], _site(), _now()))
        return e
    return _group_key(dist, group)


def _wrap_fc(dist, name, fn, compiling):
    op, inp, roots = _FC[name]
    params = _params(fn)

    def record(args, kwargs):
        bound = _bind(params, args, kwargs)
        e = _fc_key(dist, bound.get("group"))
        if e is None:
            return None
        bound["input"] = bound.get(inp)
        return _call(op, e, "input", roots, bound, ',"fc":true')
    return _recorded(fn, name, record, compiling)


def _never():
    return False


def _wrap_group_maker(dist, name, fn):
    def wrapper(*args, **kwargs):
        global _world_e
        site = _site()
        outer = not _tls.inside
        if name == "init_process_group":
            _world_e = None
        _tls.inside = True
        try:
            pg = fn(*args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
        finally:
            if outer:
                _tls.inside = False
        if outer and (_fd >= 0 or _pending is not None):
            try:
                if name == "init_process_group":
                    _world(dist, args, kwargs)
                _note_group(dist, name, pg, site, kwargs.get("backend"))
            except Exception:
                pass
        return pg
    return _dress(wrapper, fn, name)


def _wrap_destroy(dist, fn):
    def wrapper(group=None, *args, **kwargs):
        try:
            r = fn(group, *args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
        try:
            c10d = dist.distributed_c10d
            if group is None or group is getattr(c10d.GroupMember, "WORLD", None):
                global _world_e
                if _capped:  # this world's counts, before they start over
                    _counts()
                with _lock:  # the world is gone: a new init starts over
                    _world_e = None
                    _groups.clear()
                    _ngroups.clear()
                    _seq.clear()
                    _listed.clear()
            else:
                _groups.pop(id(group), None)
        except Exception:
            pass
        return r
    return _dress(wrapper, fn, "destroy_process_group")


def _store_id(store):
    for _ in range(8):
        u = getattr(store, "underlying_store", None)
        if u is None:
            break
        store = u
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is not None and port is not None:
        return "%s:%d" % (host, int(port))
    path = getattr(store, "path", None)
    if path:
        return "file:" + str(path)
    return None


def _world(dist, args, kwargs):
    """The world record: what names the world this process joined."""
    c10d = dist.distributed_c10d
    names = ("backend", "init_method", "timeout", "world_size", "rank", "store")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    wid = None
    im = bound.get("init_method")
    if isinstance(im, str) and im.startswith("file://"):
        wid = "file:" + im[7:].split("?", 1)[0]
    if wid is None and bound.get("store") is not None:
        wid = _store_id(bound["store"]) or "store:%d:%d" % (os.getpid(), id(bound["store"]))
    if wid is None:
        try:
            wid = _store_id(c10d._get_default_store())
        except Exception:
            wid = None
    if wid is None and isinstance(im, str) and im.startswith("tcp://"):
        wid = im[6:].split("?", 1)[0].split("/", 1)[0]
    if wid is None:
        wid = "%s:%s" % (os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?"))
    backend = str(dist.get_backend())
    to = bound.get("timeout")
    if to is None:
        to = getattr(c10d, "default_pg_nccl_timeout", None) if backend == "nccl" else None
        if to is None:
            to = getattr(c10d, "default_pg_timeout", None)
    try:
        secs = to.total_seconds()
    except AttributeError:
        secs = -1
    _emit('{"k":"world","id":%s,"size":%d,"rank":%d,"backend":%s,"timeout":%g,"t":%.6f}' % (
        _q(wid), dist.get_world_size(), dist.get_rank(), _q(backend), secs, _now()))


def _note_group(dist, name, pg, site, backend):
    c10d = dist.distributed_c10d
    if name == "init_process_group":
        pg = c10d._get_default_group()
    if name == "new_subgroups" or name == "new_subgroups_by_enumeration":
        pg = pg[0] if isinstance(pg, tuple) else pg
    if pg is None or pg is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
        return
    ranks = _group_ranks(dist, pg)
    if ranks is not None and id(pg) not in _groups:
        _register(ranks, pg, site, str(backend) if backend else None)


def _dist_view(mod):
    class _D:  # what the wrappers need, looked up late
        distributed_c10d = mod

        @staticmethod
        def get_process_group_ranks(pg):
            return mod.get_process_group_ranks(pg)

        @staticmethod
        def is_initialized():
            return mod.is_initialized()

        @staticmethod
        def get_rank():
            return mod.get_rank()

        @staticmethod
        def get_world_size():
            return mod.get_world_size()

        @staticmethod
        def get_backend():
            return mod.get_backend()
    return _D


def _set(mod, name, wrap):
    fn = getattr(mod, name, None)
    # torch 2.x decorates them (functools.wraps: __wrapped__ is set)
    if callable(fn) and not getattr(fn, "_dptp_audit", False):
        setattr(mod, name, wrap(fn))


def _patch_c10d(mod):
    d = _dist_view(mod)
    for name in _OPS:
        _set(mod, name, lambda fn, name=name: _wrap_op(d, name, fn))
    _set(mod, "batch_isend_irecv", lambda fn: _wrap_batch(d, fn))
    for name in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"):
        _set(mod, name, lambda fn, name=name: _wrap_group_maker(d, name, fn))
    _set(mod, "destroy_process_group", lambda fn: _wrap_destroy(d, fn))


def _patch_fc(mod):
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return
    d = _dist_view(c10d)
    # torch.compiler.is_compiling: constant True while dynamo traces
    compiling = getattr(sys.modules.get("torch.compiler"), "is_compiling", None) or _never
    for name in _FC:
        _set(mod, name, lambda fn, name=name: _wrap_fc(d, name, fn, compiling))


def _patch_cuda(mod):
    fn = getattr(mod, "set_device", None)
    if not callable(fn) or getattr(fn, "_dptp_audit", False):
        return

    def set_device(device):
        try:
            idx = device if isinstance(device, int) else getattr(device, "index", None)
            if idx is None and isinstance(device, str):
                idx = int(device.split(":")[1]) if ":" in device else None
            if idx is not None:
                _device(int(idx), "set_device", _site())
        except Exception:
            pass
        try:
            return fn(device)
        except BaseException as e:
            _strip(e)
            raise
    mod.set_device = _dress(set_device, fn, "set_device")


def _site_record(call, key):
    _emit_call('{"k":"site","call":"%s","key":%s,"site":%s,"outer":%s,"t":%.6f}' % (
        call, _q(key), _site2(), _outer(), _now()))


def _addr_key(address):
    """The key of a socket address, as the C recorder names it: a unix path,
    "@name" for an abstract one, "port N" for inet."""
    if isinstance(address, (str, bytes)):
        a = address.decode("latin-1") if isinstance(address, bytes) else address
        if a:
            return "@" + a[1:] if a[0] == "\0" else a
    elif isinstance(address, tuple) and len(address) >= 2 and int(address[1]) > 0:
        return "port %d" % int(address[1])
    return None


def _patch_socket(mod):
    cls = getattr(mod, "socket", None)
    if cls is None or getattr(cls.bind, "_dptp_audit", False):
        return

    def wrap(call, orig):
        def method(self, address):
            try:
                k = _addr_key(address)
                if k is not None:
                    _site_record(call, k)
            except Exception:
                pass
            try:
                return orig(self, address)
            except BaseException as e:
                _strip(e)
                raise
        return _dress(method, orig, call)
    cls.bind = wrap("bind", cls.bind)
    cls.connect = wrap("connect", cls.connect)
    cls.connect_ex = wrap("connect", cls.connect_ex)


def _patch_shm(mod):
    orig = getattr(mod, "shm_open", None)
    if orig is None or getattr(orig, "_dptp_audit", False):
        return

    def shm_open(path, *args, **kwargs):
        try:
            _site_record("shm_open", path if path.startswith("/") else "/" + path)
        except Exception:
            pass
        try:
            return orig(path, *args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
    mod.shm_open = _dress(shm_open, orig, "shm_open")


def _fnv(b):
    """FNV-1a 64 of a CUDA IPC handle's bytes, as the C recorder's gpu "h".
    torch 2.x wraps the 64 bytes of cudaIpcMemHandle_t in a versioned
    shareable handle (a version byte, the type 'c' for a cudaMalloc block,
    then the handle, c10's CUDACachingAllocator): the hash is the 64 bytes'
    either way. An expandable segment's ('e') carries file descriptors, which
    the C recorder names by their exporter: its hash matches nothing here."""
    b = bytes(b)
    if len(b) == 66 and b[1:2] == b"c":
        b = b[2:]
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def _patch_reductions(mod):
    """CUDA IPC from torch.multiprocessing: the C recorder sees the CUDA
    calls (gpu records, h = the handle's hash), this names their file:line
    (site records cuda_ipc_get / cuda_ipc_open, key = the same h)."""
    orig_reduce = getattr(mod, "reduce_tensor", None)
    orig_rebuild = getattr(mod, "rebuild_cuda_tensor", None)
    if orig_reduce is None or orig_rebuild is None or getattr(orig_reduce, "_dptp_audit", False):
        return

    def reduce_tensor(*args, **kwargs):
        try:
            r = orig_reduce(*args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
        try:
            if r[0] is mod.rebuild_cuda_tensor and r[1][7]:
                _site_record("cuda_ipc_get", _fnv(r[1][7]))
        except Exception:
            pass
        return r

    def rebuild_cuda_tensor(*args, **kwargs):
        try:
            h = args[7] if len(args) > 7 else kwargs.get("storage_handle")
            if h:
                _site_record("cuda_ipc_open", _fnv(h))
        except Exception:
            pass
        try:
            return orig_rebuild(*args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
    mod.reduce_tensor = _dress(reduce_tensor, orig_reduce, "reduce_tensor")
    mod.rebuild_cuda_tensor = _dress(rebuild_cuda_tensor, orig_rebuild, "rebuild_cuda_tensor")


_PATCHES = {
    "torch.distributed.distributed_c10d": _patch_c10d,
    "torch.distributed._functional_collectives": _patch_fc,
    "torch.cuda": _patch_cuda,
    "torch.multiprocessing.reductions": _patch_reductions,
    "socket": _patch_socket,
    "_posixshmem": _patch_shm,
}


class _Loader:
    def __init__(self, name, real):
        self.name, self.real = name, real

    def create_module(self, spec):
        try:
            return self.real.create_module(spec)
        except BaseException as e:
            _strip(e)
            raise

    def exec_module(self, module):
        real = self.real
        try:
            module.__spec__.loader = real
            module.__loader__ = real
        except AttributeError:
            pass
        try:  # an error of the module's code: the import system's traceback, as alone
            real.exec_module(module)
        except BaseException as e:
            _strip(e)
            raise
        try:
            _PATCHES[self.name](module)
        except Exception as e:  # the program runs on unrecorded
            sys.stderr.write("dptp-run --audit: cannot patch %s: %s\n" % (self.name, e))


class _Finder:
    """Patches a module of _PATCHES once its own code has run, before its
    importer (torch.distributed's `from .distributed_c10d import *`) sees it."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES or _tls.finding:
            return None
        _tls.finding = True
        try:
            for f in sys.meta_path:
                fs = getattr(f, "find_spec", None)
                if f is self or fs is None:
                    continue
                spec = fs(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        except BaseException as e:
            _strip(e)
            raise
        finally:
            _tls.finding = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(name, spec.loader)
        return spec


# the import system's frames: a warning a module raises for its importer
# (stacklevel) names the import line, as alone
for _f in (_Loader.create_module, _Loader.exec_module, _Finder.find_spec):
    _f.__code__ = _f.__code__.replace(co_filename=_INTERNAL)


def _patch_loaded():
    """Modules imported before the recorder (a .pth): patched now, and the
    names other modules took from them (torch.distributed's re-exports)."""
    for name in _PATCHES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        old = dict(vars(mod))
        try:
            _PATCHES[name](mod)
        except Exception as e:
            sys.stderr.write("dptp-run --audit: cannot patch %s: %s\n" % (name, e))
            continue
        new = dict((k, v) for k, v in vars(mod).items() if old.get(k) is not v and k in old)
        if not new or name in ("socket", "_posixshmem"):
            continue
        for other in list(sys.modules.values()):
            d = getattr(other, "__dict__", None)
            if other is mod or not isinstance(d, dict):
                continue
            for k, v in new.items():
                if d.get(k) is old[k]:
                    d[k] = v


def _end(how, code):
    global _how
    if _how is not None:
        return
    _how = how
    try:
        if _fd < 0 and not _wake():
            return
        if _capped:
            _counts()
        _write('{"k":"end","how":"%s","code":%s,"records":%d,"lost":%d,"dropped":%d,"t":%.6f}' % (
            how, "null" if code is None else int(code), _records, _lost, _dropped, _now()))
    except Exception:
        pass


def _counts():
    """The count records of the groups with calls (past the cap): calls (seq),
    collectives (nc) and the sum of the terms of those not written (hs)."""
    t = _now()
    for (ranks, gn), s in list(_seq.items()):
        if s[0]:
            _write('{"k":"count","g":%s,"gn":%d,"seq":%d,"nc":%d,"hs":"%016x","t":%.6f}' % (
                _ints(ranks), gn, s[0], s[1], s[2], t))


def _atexit():
    _end("atexit", _code)


def _wrap_closer(name, orig):
    """os.close, os.closerange, os.dup2: the next record checks its descriptor."""
    def fn(*args, **kwargs):
        global _dirty
        _dirty = True
        try:
            return orig(*args, **kwargs)
        except BaseException as e:
            _strip(e)
            raise
    return _dress(fn, orig, name)


def _wrap_exit(orig):
    def _exit(n):
        try:
            _end("_exit", n)
        except Exception:
            pass
        try:
            orig(n)
        except BaseException as e:
            _strip(e)
            raise
    return _dress(_exit, orig, "_exit")


def _own(tb):
    """A traceback without the recorder's frames."""
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    ours = (__file__, _INTERNAL)
    if not any(t.tb_frame.f_code.co_filename in ours for t in chain):
        return chain[0] if chain else None
    out = None
    for t in reversed(chain):
        if t.tb_frame.f_code.co_filename not in ours:
            out = type(t)(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _excepthook_of(prev):
    def hook(tp, value, tb):
        global _code
        try:
            _code = 1
            site = '"?"'
            t = tb
            while t is not None:
                fn = t.tb_frame.f_code.co_filename
                if not fn.startswith(_skip_dirs):
                    site = _q("%s:%d" % (fn, t.tb_lineno))
                t = t.tb_next
            _emit('{"k":"exc","type":%s,"msg":%s,"site":%s,"t":%.6f}' % (
                _q(tp.__name__), _q(str(value)[:300]), site, _now()))
            tb = _own(tb)
            if value is not None:
                value.__traceback__ = tb
        except Exception:
            pass
        prev(tp, value, tb)
    return hook


def _flags():
    f = sys.flags
    return ("I" if f.isolated else "") + ("E" if f.ignore_environment else "") + ("S" if f.no_site else "")


def _hello(t, pre=False):
    env = os.environ

    def num(v):
        try:
            return int(env.get(v, "-1"))
        except ValueError:
            return -1
    try:
        worker = os.getppid() == int(env.get("DPTP_AUDIT_PPID", "-1"))
    except ValueError:
        worker = False
    _write('{"k":"hello","rec":"py","rank":%d,"world":%d,"local_rank":%d,"pid":%d,"ppid":%d,"worker":%s,'
           '"host":%s,"att":%d,"flags":"%s","pre":%s,"t":%.6f}' % (
               num("RANK"), num("WORLD_SIZE"), num("LOCAL_RANK"), os.getpid(), os.getppid(),
               "true" if worker else "false", _q(os.uname().nodename), _att(), _flags(),
               "true" if pre else "false", t))


def _att():
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _name():
    return os.path.join(os.environ.get("DPTP_AUDIT_DIR", ""), "a%d.p%d.py.jsonl" % (_att(), os.getpid()))


def _forked():
    """A forked child (multiprocessing, a DataLoader worker): its own file,
    opened at its first record, with its own hello; nothing of the parent's."""
    global _fd, _path, _pending, _records, _lost, _dropped, _capped, _how, _code, _lock, _torn, _dirty, _world_e
    if _fd >= 0:
        try:
            st = os.fstat(_fd)
            if (st.st_dev, st.st_ino) == _ino:
                _close(_fd)
        except OSError:
            pass
    _dirty = False
    _fd, _pending, _path = -1, _now(), _name()
    _records = _lost = _dropped = 0
    _capped, _how, _code, _torn = False, None, None, False
    _lock = _thread.allocate_lock()
    _groups.clear()
    _ngroups.clear()
    _seq.clear()
    _listed.clear()
    _world_e = None
    _last_dev[0] = None
    _tls.inside = False


def start(here):
    global _path, _skip_dirs, _stdlib, _max, _here
    if not os.environ.get("DPTP_AUDIT_DIR"):
        return
    _here = here = os.path.realpath(here)
    try:
        _max = int(os.environ.get("DPTP_AUDIT_MAX_RECORDS", "200000"))
    except ValueError:
        _max = 200000
    if _max <= 0:
        _max = 200000
    torch_dir = ""
    for p in sys.path:
        cand = os.path.join(p, "torch")
        if p and os.path.isdir(cand):
            torch_dir = cand + os.sep
            break
    _skip_dirs = tuple(d for d in (torch_dir, here + os.sep) if d)
    _stdlib = os.path.dirname(os.__file__) + os.sep
    _path = _name()
    if not _open():
        sys.stderr.write("dptp-run --audit: no records for this process: cannot open %s\n" % _path)
        return
    t = _now()
    pre = any(n.startswith("torch.distributed") for n in sys.modules)
    _hello(t, pre)
    _quiet_import("atexit").register(_atexit)
    sys.excepthook = _excepthook_of(sys.excepthook)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked)
    os._exit = _wrap_exit(os._exit)
    for name in ("close", "closerange", "dup2"):
        setattr(os, name, _wrap_closer(name, getattr(os, name)))
    sys.meta_path.insert(0, _Finder())
    _patch_loaded()
