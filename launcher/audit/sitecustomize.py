# dptp-run --audit puts this folder first on PYTHONPATH: every Python process
# of the job (the workers and whatever they start) runs the recorder
# (dptp_audit_rec.py), then the sitecustomize this one hides (Debian's, a
# virtualenv's) as it would have. Only modules already loaded at startup are
# used here (no importlib.util): the program's sys.modules gains the
# recorder's own name and nothing else.
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
    import _frozen_importlib as _bs
    import _frozen_importlib_external as _bse
    del _sys.modules["sitecustomize"]
    try:
        spec = _bse.PathFinder.find_spec("sitecustomize", _sys.path)
    except Exception:
        spec = None
    if spec is not None and spec.origin and _os.path.dirname(_os.path.realpath(spec.origin)) != _here:
        mod = _bs.module_from_spec(spec)
        _sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)


_chain()
