# dptp-run --audit puts this folder first on the workers' PYTHONPATH: the
# recorder starts (dptp_audit_rec.py), then the sitecustomize this one
# hides (Debian's, a virtualenv's) runs as it would have.
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.realpath(__file__))
try:
    _sys.path.insert(0, _here)
    import dptp_audit_rec as _rec
    _rec.start(_here)
except Exception as _e:
    _sys.stderr.write("dptp-run --audit: recorder not started: %s\n" % _e)
finally:
    _sys.path[:] = [p for p in _sys.path if not p or _os.path.realpath(p) != _here]


def _chain():
    import importlib.util
    del _sys.modules["sitecustomize"]
    try:
        spec = importlib.util.find_spec("sitecustomize")
    except Exception:
        spec = None
    if spec is not None and spec.origin and _os.path.dirname(_os.path.realpath(spec.origin)) != _here:
        mod = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)


_chain()
