# dptp-run --audit: the Python recorder, loaded into every worker by the
# sitecustomize beside it. It writes the records of lib/base/audit_rec.h
# (the format is defined there): torch.distributed's groups and calls, with
# their groups' global ranks, roots as passed, sizes, per-group sequence
# numbers and the caller's file:line, and the device each rank selects.
# torch is never imported from here: the module is patched when the program
# imports it. Works with torch 1.13 to 2.11; a call whose arguments it does
# not understand is recorded with what it could read, never refused.
import os
import sys
import threading

_fd = -1
_rank = -1
_tls = threading.local()
_groups = {}      # id(pg) -> (ranks tuple, gn, pg)
_ngroups = {}     # ranks tuple -> groups created with that member list
_seq = {}         # (ranks, gn) -> calls so far
_sites = {}       # code object, line -> JSON-quoted "file:line"
_skip_dirs = ()
_stdlib = "\0"   # the standard library's folder: skipped, but for its *-packages
_lock = threading.Lock()


def _q(s):
    s = str(s)
    if s.isascii() and s.isprintable() and '"' not in s and '\\' not in s:
        return '"' + s + '"'
    import json
    return json.dumps(s)


def _emit(line):
    if _fd < 0:
        return
    try:
        os.write(_fd, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


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


def _now():
    import time
    return time.monotonic()


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
    """(ranks, gn) of a call's group; None for a rank outside it."""
    c10d = dist.distributed_c10d
    if group is None or group is getattr(c10d.GroupMember, "WORLD", None):
        group = c10d._get_default_group() if dist.is_initialized() else None
        if group is None:
            return None
    if group is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
        return None
    hit = _groups.get(id(group))
    if hit is not None and hit[2] is group:
        return hit[0], hit[1]
    ranks = _group_ranks(dist, group)
    if ranks is None:
        return None
    return _register(ranks, group, None)


def _register(ranks, pg, site, backend=None):
    with _lock:
        gn = _ngroups.get(ranks, 0)
        _ngroups[ranks] = gn + 1
        _groups[id(pg)] = (ranks, gn, pg)
    _emit('{"k":"group","g":%s,"gn":%d,"site":%s%s,"t":%.6f}' % (
        _ints(ranks), gn, site or '"?"',
        (',"backend":' + _q(backend)) if backend else "", _now()))
    return ranks, gn


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
            return n, str(t0.dtype).replace("torch.", ""), t0.device
        return t.numel(), str(t.dtype).replace("torch.", ""), t.device
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


def _record_op(dist, name, params, args, kwargs):
    spec = _OPS[name]
    bound = dict(zip(params, args))
    bound.update(kwargs)
    key = _group_key(dist, bound.get("group"))
    if key is None:
        return
    with _lock:
        seq = _seq.get(key, 0) + 1
        _seq[key] = seq
    extra = ""
    for p in spec[1]:
        v = bound.get(p)
        if v is not None:
            try:
                extra += ',"%s":%d' % (_ROOT_KEY[p], int(v))
            except (TypeError, ValueError):
                pass
    n, dt, dev = -1, None, None
    if spec[0] == "object_list":
        try:
            n = len(bound.get("object_list"))
        except TypeError:
            pass
    elif spec[0] is not None:
        n, dt, dev = _tensor_info(bound.get(spec[0]))
    if name == "all_to_all_single" and (bound.get("input_split_sizes") or bound.get("output_split_sizes")):
        n = -1
    if dt:
        extra += ',"dt":"%s"' % dt
    if dev is not None and getattr(dev, "type", "cpu") != "cpu":
        extra += ',"dev":"%s"' % dev
        if dev.index is not None:
            _device(dev.index, "tensor", site=None)
    if bound.get("async_op"):
        extra += ',"async":true'
    _emit('{"k":"op","op":"%s","g":%s,"gn":%d,"seq":%d,"n":%d%s,"site":%s,"t":%.6f}' % (
        name, _ints(key[0]), key[1], seq, n, extra, _site(), _now()))


_last_dev = [None]


def _device(index, how, site):
    if index == _last_dev[0] and how == "tensor":
        return
    _last_dev[0] = index
    _emit('{"k":"dev","dev":%d,"how":"%s","site":%s,"t":%.6f}' % (
        index, how, site or _site(), _now()))


def _params(fn):
    import inspect
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _wrap_op(dist, name, fn):
    params = _params(fn)

    def wrapper(*args, **kwargs):
        if getattr(_tls, "inside", False):
            return fn(*args, **kwargs)
        _tls.inside = True
        try:
            try:
                _record_op(dist, name, params, args, kwargs)
            except Exception:
                pass
            return fn(*args, **kwargs)
        finally:
            _tls.inside = False
    wrapper.__wrapped__ = fn
    wrapper._dptp_audit = True
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__qualname__ = getattr(fn, "__qualname__", name)
    wrapper.__module__ = getattr(fn, "__module__", None)
    return wrapper


def _wrap_batch(dist, fn):
    def wrapper(p2p_op_list, *args, **kwargs):
        if not getattr(_tls, "inside", False):
            for p in p2p_op_list:
                try:
                    name = getattr(p.op, "__name__", "isend")
                    if name not in ("isend", "irecv"):
                        name = "irecv" if "recv" in name else "isend"
                    peer = getattr(p, "peer", None)
                    params = ("tensor", "dst" if name == "isend" else "src", "group")
                    _record_op(dist, name, params, (p.tensor, peer, p.group), {})
                except Exception:
                    pass
        _tls.inside = True
        try:
            return fn(p2p_op_list, *args, **kwargs)
        finally:
            _tls.inside = False
    wrapper.__wrapped__ = fn
    return wrapper


def _wrap_group_maker(dist, name, fn):
    def wrapper(*args, **kwargs):
        site = _site()
        outer = not getattr(_tls, "inside", False)
        _tls.inside = True
        try:
            pg = fn(*args, **kwargs)
        finally:
            if outer:
                _tls.inside = False
        if outer:
            try:
                _note_group(dist, name, pg, site, kwargs.get("backend"))
            except Exception:
                pass
        return pg
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


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


def _patch_c10d(mod):
    class _D:  # what the wrappers need, looked up late
        distributed_c10d = mod

        @staticmethod
        def get_process_group_ranks(pg):
            return mod.get_process_group_ranks(pg)

        @staticmethod
        def is_initialized():
            return mod.is_initialized()
    for name in _OPS:
        fn = getattr(mod, name, None)
        # torch 2.x decorates them (functools.wraps: __wrapped__ is set)
        if callable(fn) and not getattr(fn, "_dptp_audit", False):
            setattr(mod, name, _wrap_op(_D, name, fn))
    fn = getattr(mod, "batch_isend_irecv", None)
    if callable(fn):
        mod.batch_isend_irecv = _wrap_batch(_D, fn)
    for name in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"):
        fn = getattr(mod, name, None)
        if callable(fn):
            setattr(mod, name, _wrap_group_maker(_D, name, fn))


def _patch_cuda(mod):
    fn = getattr(mod, "set_device", None)
    if not callable(fn):
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
        return fn(device)
    set_device.__wrapped__ = fn
    set_device.__doc__ = fn.__doc__
    mod.set_device = set_device


_PATCHES = {"torch.distributed.distributed_c10d": _patch_c10d, "torch.cuda": _patch_cuda}


class _Finder:
    """Patches a module of _PATCHES once its own code has run, before the
    importer (torch.distributed's `from .distributed_c10d import *`) sees it."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES or getattr(_tls, "finding", False):
            return None
        import importlib.util
        _tls.finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _tls.finding = False
        if spec is None or spec.loader is None:
            return None
        real = spec.loader

        class _Loader:
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                real.exec_module(module)
                try:
                    _PATCHES[name](module)
                except Exception as e:  # the program runs on unrecorded
                    sys.stderr.write("dptp-run --audit: cannot patch %s: %s\n" % (name, e))
        spec.loader = _Loader()
        return spec


def _strip_env(here):
    """The user's own subprocesses start without the recorders."""
    for var in ("DPTP_AUDIT_DIR", "DPTP_AUDIT_PPID"):
        os.environ.pop(var, None)
    pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != here]
    if pp:
        os.environ["PYTHONPATH"] = os.pathsep.join(pp)
    else:
        os.environ.pop("PYTHONPATH", None)
    lib = os.environ.pop("DPTP_AUDIT_PRELOAD", None)
    if lib:
        pre = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p != lib]
        if pre:
            os.environ["LD_PRELOAD"] = " ".join(pre)
        else:
            os.environ.pop("LD_PRELOAD", None)


def _site_record(call, key):
    _emit('{"k":"site","call":"%s","key":%s,"site":%s}' % (call, _q(key), _site()))


def _patch_names():
    """Where the program binds a socket or opens a segment: the C recorder
    sees the call, this names its file:line."""
    import socket
    orig_bind = socket.socket.bind

    def bind(self, address):
        try:
            if isinstance(address, (str, bytes)):
                a = address.decode("latin-1") if isinstance(address, bytes) else address
                if a:
                    _site_record("bind", "@" + a[1:] if a[0] == "\0" else a)
            elif isinstance(address, tuple) and len(address) >= 2 and int(address[1]) > 0:
                _site_record("bind", "port %d" % int(address[1]))
        except Exception:
            pass
        return orig_bind(self, address)
    bind.__wrapped__ = orig_bind
    socket.socket.bind = bind
    try:
        import _posixshmem
    except ImportError:
        return
    orig_open = _posixshmem.shm_open

    def shm_open(path, *args, **kwargs):
        try:
            _site_record("shm_open", path if path.startswith("/") else "/" + path)
        except Exception:
            pass
        return orig_open(path, *args, **kwargs)
    _posixshmem.shm_open = shm_open


def _exit():
    _emit('{"k":"exit","t":%.6f}' % _now())


def _excepthook_of(prev):
    def hook(tp, value, tb):
        try:
            site = '"?"'
            while tb is not None:
                fn = tb.tb_frame.f_code.co_filename
                if not fn.startswith(_skip_dirs):
                    site = _q("%s:%d" % (fn, tb.tb_lineno))
                tb = tb.tb_next
            _emit('{"k":"exc","type":%s,"msg":%s,"site":%s,"t":%.6f}' % (
                _q(tp.__name__), _q(str(value)[:300]), site, _now()))
        except Exception:
            pass
        prev(tp, value, tb)
    return hook


def start(here):
    global _fd, _rank, _skip_dirs, _stdlib
    adir = os.environ.get("DPTP_AUDIT_DIR")
    ppid = os.environ.get("DPTP_AUDIT_PPID")
    _strip_env(here)
    if not adir or ppid != str(os.getppid()):
        return
    try:
        _rank = int(os.environ.get("RANK", "-1"))
        att = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        _fd = os.open(os.path.join(adir, "r%d.a%d.py.jsonl" % (_rank, att)),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except (OSError, ValueError) as e:
        sys.stderr.write("dptp-run --audit: no records for this worker: %s\n" % e)
        return
    import atexit
    import socket
    atexit.register(_exit)
    sys.excepthook = _excepthook_of(sys.excepthook)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget)
    torch_dir = ""
    for p in sys.path:
        cand = os.path.join(p, "torch")
        if p and os.path.isdir(cand):
            torch_dir = cand + os.sep
            break
    _skip_dirs = tuple(d for d in (torch_dir, here + os.sep) if d)
    _stdlib = os.path.dirname(os.__file__) + os.sep
    _emit('{"k":"hello","rec":"py","rank":%d,"world":%d,"local_rank":%d,"pid":%d,"host":%s,"att":%d,"t":%.6f}' % (
        _rank, int(os.environ.get("WORLD_SIZE", "-1")), int(os.environ.get("LOCAL_RANK", "-1")),
        os.getpid(), _q(socket.gethostname()), att, _now()))
    sys.meta_path.insert(0, _Finder())
    _patch_names()


def _forget():
    """A forked child (multiprocessing, a DataLoader worker) is not the rank."""
    global _fd
    _fd = -1
