# Nothing of the recorder in the program's view (issue 30 item 2): what this
# prints must be the same alone and under dptp-run --audit: tracebacks the
# program formats itself (traceback module) of errors raised inside wrapped
# calls (a collective, torch.cuda.set_device, a socket's bind, os.close),
# and the file:line of warnings raised for the caller from inside a
# collective (stacklevel, as torch does).
import os
import socket
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

TORCH = os.path.dirname(torch.__file__) + os.sep


def show(what, fn):
    try:
        fn()
    except Exception:
        print(what, "".join(traceback.format_exc()).replace("\n", " | "), flush=True)
    else:
        print(what, "no error", flush=True)


class Noisy:
    """Warns its pickler's caller, one level up from torch's own frames."""

    def __reduce__(self):
        f, level = sys._getframe(1), 2
        while f is not None and f.f_code.co_filename.startswith(TORCH):
            f, level = f.f_back, level + 1
        warnings.warn("pickled", stacklevel=level)
        return (int, (1,))


dist.init_process_group("gloo")
show("collective", lambda: dist.all_reduce([1, 2]))
show("set_device", lambda: torch.cuda.set_device(0))
show("bind", lambda: socket.socket().bind(("127.0.0.1", -5)))
show("close", lambda: os.close(987654))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dist.broadcast_object_list([Noisy()], src=0)
print("warnings", ["%s:%d %s" % (w.filename, w.lineno, w.message) for w in caught], flush=True)
dist.barrier()
dist.destroy_process_group()
