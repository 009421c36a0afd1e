#!/usr/bin/env python3
"""GPU memory exchange under the C recorder (issue 31 item 3), on a GPU:
four ranks share one GPU (as dptp-check's sharing mode does), gloo for the
process group, and each rank's CUDA tensor is shared by torch's CUDA IPC
(torch.multiprocessing.reductions.reduce_tensor, rebuilt by the peers)
gathered on WORLD (ranks map memory of the other replica: the G bug in its
GPU form) or on the TP group only (healthy). The `gpu` records must show
who mapped whose memory: every import's h equals its exporter's.

usage: gpu_ipc.py LIBDPTP_AUDIT_SO PYTHON [MODE [KEEPDIR]]
  GPU_IPC_PYREC=DIR: the Python recorder's folder, put on PYTHONPATH too
  MODE: world | tp | world_vmm (expandable segments: VMM fd handles) |
        worker_env world|tp (one rank, from RANK/WORLD_SIZE/MASTER_ADDR) |
        probe (two cuMemCreate exports, imported by a child through
        inherited fds: do distinct exports get distinct h?) | cudapy (a VMM
        export through cuda-python, when installed) | all (default)
Exits 77 (skipped) without torch or a GPU."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.abspath(__file__)


def worker(mode, rank, world, init):
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import reduce_tensor

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init)
    torch.cuda.set_device(0)  # every rank on one GPU
    tps = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    t = torch.full((1 << 20,), float(rank), device="cuda")
    torch.cuda.synchronize()
    rebuild, args = reduce_tensor(t)
    group = tps[rank // 2] if mode == "tp" else None
    n = dist.get_world_size(group)
    got = [None] * n
    dist.all_gather_object(got, (rank, args), group=group)
    seen = []
    for peer, a in got:
        if peer == rank:
            continue
        x = rebuild(*a)
        seen.append((peer, x[0].item()))
        del x
    torch.cuda.synchronize()
    dist.barrier()
    print("rank", rank, "mapped", seen, flush=True)
    dist.destroy_process_group()


def probe_child(fds):
    import ctypes as C
    cuda, g = drv()
    for fd in fds:
        h = C.c_ulonglong()
        rc = g.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd), 1)
        print("import fd", fd, "rc", rc, "ident", ident(fd), flush=True)


def drv():
    import ctypes as C
    cuda = C.CDLL("libcuda.so.1", mode=C.RTLD_GLOBAL)
    g = C.CDLL(None)  # the global scope: the recorder's wrappers come first
    g.cuMemExportToShareableHandle.argtypes = [C.c_void_p, C.c_ulonglong, C.c_int, C.c_ulonglong]
    g.cuMemImportFromShareableHandle.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
    dev, ctx = C.c_int(), C.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(C.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    return cuda, g


def ident(fd):
    st = os.fstat(fd)
    info = open("/proc/self/fdinfo/%d" % fd).read().replace("\n", " ")
    return "dev %d ino %d link %s fdinfo %s" % (st.st_dev, st.st_ino, os.readlink("/proc/self/fd/%d" % fd), info)


def probe():
    import ctypes as C
    cuda, g = drv()
    prop = (C.c_int * 8)(1, 1, 1, 0, 0, 0, 0, 0)  # pinned, POSIX fd, device 0
    gran = C.c_size_t()
    assert cuda.cuMemGetAllocationGranularity(C.byref(gran), prop, 0) == 0
    fds = []
    for _ in range(2):
        h, fd = C.c_ulonglong(), C.c_int()
        assert cuda.cuMemCreate(C.byref(h), gran, prop, 0) == 0
        rc = g.cuMemExportToShareableHandle(C.byref(fd), h.value, 1, 0)
        print("export rc", rc, "fd", fd.value, "ident", ident(fd.value), flush=True)
        fds.append(os.dup(fd.value))  # the child gets other numbers
    subprocess.run([sys.executable, HERE, "probe_child"] + [str(f) for f in fds], pass_fds=fds, check=True)


def cudapy():
    """a VMM export through cuda-python (flashinfer's way to libcuda: its
    own handle's entry points); prints the result, or that it is absent"""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu
        except ImportError:
            print("export cuda-python: not installed", flush=True)
            return
    assert cu.cuInit(0)[0] == 0
    dev = cu.cuDeviceGet(0)[1]
    ctx = cu.cuDevicePrimaryCtxRetain(dev)[1]
    cu.cuCtxSetCurrent(ctx)
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    fdtype = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.requestedHandleTypes = fdtype
    gran = cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)[1]
    h = cu.cuMemCreate(gran, prop, 0)[1]
    err, fd = cu.cuMemExportToShareableHandle(h, fdtype, 0)
    print("export cuda-python rc", int(err), "fd", fd, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def records(adir):
    """pid -> records of the C recorder's files"""
    out = {}
    for n in os.listdir(adir):
        m = re.fullmatch(r"a\d+\.p(\d+)\.c\.jsonl", n)
        if m:
            with open(os.path.join(adir, n)) as f:
                out[int(m.group(1))] = [json.loads(l) for l in f if l.strip()]
    return out


def mapped(adir):
    """(importer rank, exporter rank) pairs from the gpu records, with the
    records' counts"""
    recs = records(adir)
    rank = {pid: next((r["rank"] for r in rs if r["k"] == "hello"), -1) for pid, rs in recs.items()}
    exp, imps, gpu = {}, [], []
    for pid, rs in recs.items():
        for r in rs:
            if r["k"] != "gpu":
                continue
            gpu.append(dict(r, rank=rank[pid]))
            if r["rc"] == 0 and r["call"] in ("ipc_get", "vmm_export"):
                exp.setdefault(r["h"], set()).add(rank[pid])
            elif r["rc"] == 0:
                imps.append((rank[pid], r["h"]))
    pairs = set()
    unmatched = []
    for r, h in imps:
        if h not in exp:
            unmatched.append((r, h))
        for e in exp.get(h, ()):
            pairs.add((r, e))
    return sorted(pairs), unmatched, gpu


def job(mode, pre, py, keep):
    adir = tempfile.mkdtemp(prefix="dptp-gpu-%s-" % mode)
    env = dict(os.environ, LD_PRELOAD=pre, DPTP_AUDIT_DIR=adir, DPTP_AUDIT_PPID=str(os.getpid()),
               WORLD_SIZE="4", MASTER_ADDR="127.0.0.1")
    if os.environ.get("GPU_IPC_PYREC") and mode not in ("probe", "cudapy"):  # the Python recorder too (its sitecustomize's folder)
        env["PYTHONPATH"] = os.environ["GPU_IPC_PYREC"]
    if mode == "world_vmm":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    port = free_port()
    if mode in ("probe", "cudapy"):
        procs = [subprocess.Popen([py, HERE, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)]
    else:
        procs = [subprocess.Popen([py, HERE, "worker", "world" if mode == "world_vmm" else mode, str(r), str(port)],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(4)]
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
        outs.append((p.returncode, o))
    pairs, unmatched, gpu = mapped(adir)
    if keep:
        shutil.copytree(adir, os.path.join(keep, mode))
    shutil.rmtree(adir, ignore_errors=True)
    return outs, pairs, unmatched, gpu


def main():
    if sys.argv[1] == "worker":
        return worker(sys.argv[2], int(sys.argv[3]), 4, "tcp://127.0.0.1:%s" % sys.argv[4])
    if sys.argv[1] == "worker_env":  # under a launcher (dptp-run --nproc-per-node 4)
        return worker(sys.argv[2], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
    if sys.argv[1] == "probe":
        return probe()
    if sys.argv[1] == "cudapy":
        return cudapy()
    if sys.argv[1] == "probe_child":
        return probe_child([int(a) for a in sys.argv[2:]])
    pre, py = os.path.abspath(sys.argv[1]), sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "all"
    keep = sys.argv[4] if len(sys.argv) > 4 else None
    chk = subprocess.run([py, "-c", "import torch; print(torch.__version__, torch.cuda.device_count())"],
                         capture_output=True, text=True)
    if chk.returncode or chk.stdout.split()[-1] == "0":
        print("skipped: no torch with a GPU (%s)" % (chk.stdout.strip() or chk.stderr.strip()[-200:]))
        sys.exit(77)
    print("torch", chk.stdout.strip())
    world = sorted((i, j) for i in range(4) for j in range(4) if i != j)
    want = {"world": world, "world_vmm": world, "tp": [(0, 1), (1, 0), (2, 3), (3, 2)]}
    bad = 0
    for m in (["world", "tp", "world_vmm", "probe", "cudapy"] if mode == "all" else [mode]):
        outs, pairs, unmatched, gpu = job(m, pre, py, keep)
        print("== %s: exit codes %s" % (m, [rc for rc, _ in outs]))
        for rc, o in outs:
            for line in o.splitlines():
                if line.startswith(("rank", "export", "import")) or rc:
                    print("   ", line[:400])
        print("   gpu records: %d; (importer, exporter) rank pairs: %s; imports without an export: %s"
              % (len(gpu), pairs, unmatched))
        for r in gpu[:12]:
            print("   ", json.dumps(r))
        if m in want and (pairs != want[m] or unmatched or any(rc for rc, _ in outs)):
            print("FAIL: %s: expected pairs %s" % (m, want[m]))
            bad = 1
    sys.exit(bad)


if __name__ == "__main__":
    main()
