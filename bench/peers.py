#!/usr/bin/env python3
"""PyTorch peers of dptp's TP 1 residual + RMSNorm kernel, on one GPU, in one
table with dptp's own figures and the device-to-device copy as the limit.

  residual_out = bf16(x + residual)            (added in fp32, rounded)
  norm_out     = bf16(residual_out * rsqrt(mean(residual_out^2) + eps) * gamma)

Peers, all on the same bf16 inputs (exact multiples of 1/8, not zeros):
  torch eager          the formula above, op by op (what vLLM's
                       forward_native of fused_add_rms_norm does)
  torch eager, F.rms_norm  x + residual, then torch's own rms_norm kernel
  torch.compile        the formula above through inductor (one fused kernel)
  all_reduce + compile the unfused path: torch.distributed all_reduce of x
                       (NCCL), then the compiled norm; one GPU, so 1 rank

Timing as dptp-kernel-selftest's bench: CUDA events; "single" is the median
of 30 calls each timed alone (launch included), "b2b" the median of 10
samples of 20 calls back to back (launches overlap, as in a model); three
input/output sets rotate where one set fits in L2. GB/s counts the bytes the
op must move: x and residual read, residual_out and norm_out written.

usage: bench/peers.py [--dptp SELFTEST.json] [--json OUT.json]
       (--dptp: dptp-kernel-selftest's JSON, for dptp's figures and its copy)
"""
import argparse
import json
import os
import socket
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

SHAPES = [(2048, 8192), (16384, 8192)]
EPS = 1e-6
WARMUP, ITERS, B2B_CALLS, B2B_REPS = 5, 30, 20, 10


def native(x, res, w):
    h = (x.float() + res.float()).to(x.dtype)
    hf = h.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
    return h, (hf * rstd * w.float()).to(x.dtype)


def eager_rms_norm(x, res, w):
    h = x + res
    return h, F.rms_norm(h, (h.shape[-1],), w, EPS)


def inputs(t, h, dev):
    """dptp's self-test inputs in kind: multiples of 1/8, x in [-1, 1],
    residual in [-2, 2], gamma in [0.5, 1.5]."""
    g = torch.Generator(device=dev).manual_seed(t * 131 + h)
    x = (torch.randint(-8, 9, (t, h), device=dev, generator=g) / 8).to(torch.bfloat16)
    r = (torch.randint(-16, 17, (t, h), device=dev, generator=g) / 8).to(torch.bfloat16)
    w = (torch.randint(4, 13, (h,), device=dev, generator=g) / 8).to(torch.bfloat16)
    return x, r, w


def time_fn(fn, sets):
    n = len(sets)
    for i in range(WARMUP):
        fn(*sets[i % n])
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    single = []
    for i in range(ITERS):
        a.record()
        fn(*sets[i % n])
        b.record()
        b.synchronize()
        single.append(a.elapsed_time(b) * 1e3)
    b2b = []
    for _ in range(B2B_REPS):
        a.record()
        for c in range(B2B_CALLS):
            fn(*sets[c % n])
        b.record()
        b.synchronize()
        b2b.append(a.elapsed_time(b) * 1e3 / B2B_CALLS)
    return statistics.median(single), statistics.median(b2b)


def copy_gbps(dev):
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    single, _ = time_fn(lambda s, d: d.copy_(s), [(src, dst)])
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * n / (single * 1e-6) / 1e9


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dptp", help="dptp-kernel-selftest JSON (its bench.norm rows)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device")
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    compiled = torch.compile(native, dynamic=False)

    def unfused(x, res, w):
        dist.all_reduce(x)  # one rank: the sum is x itself, so x stays valid
        return compiled(x, res, w)

    peers = [
        ("torch eager (op by op)", native),
        ("torch eager, add + F.rms_norm", eager_rms_norm),
        ("torch.compile", compiled),
        ("torch.distributed all_reduce (NCCL, 1 rank) + torch.compile", unfused),
    ]
    dptp = None
    if a.dptp:
        with open(a.dptp) as f:
            dptp = json.load(f)
    copy = copy_gbps(dev)
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "copy_gbps_torch": round(copy, 1), "rows": []}
    dptp_copy = None
    if dptp:
        n = dptp["bench"]["norm"]
        dptp_copy = max(n["copy_gbps"], n.get("copy_gbps_after", 0))
    limit = dptp_copy or copy
    for t, h in SHAPES:
        x, r, w = inputs(t, h, dev)
        nbytes = 4 * t * h * x.element_size()
        nsets = 3 if nbytes // 2 <= (128 << 20) else 1
        sets = [(x.clone(), r.clone(), w) for _ in range(nsets)]
        ref_h, ref_n = native(x, r, w)
        for name, fn in peers:
            got_h, got_n = fn(*sets[0])
            torch.cuda.synchronize()
            exact_res = bool(torch.equal(got_h, ref_h))
            norm_diff = (got_n.float() - ref_n.float()).abs().max().item()
            single, b2b = time_fn(fn, sets)
            out["rows"].append({"tokens": t, "hidden": h, "impl": name, "single_us": round(single, 2),
                                "b2b_us": round(b2b, 2), "b2b_gbps": round(nbytes / (b2b * 1e-6) / 1e9, 1),
                                "residual_out_equal_eager": exact_res,
                                "norm_out_max_abs_diff_vs_eager": norm_diff})
            print("%5dx%-5d %-62s %9.1f %9.1f" % (t, h, name, single, b2b), file=sys.stderr, flush=True)
        del sets, x, r, ref_h, ref_n
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)

    print("\nresidual + RMSNorm, bf16, one %s; limit: device-to-device copy of 1 GiB, %.0f GB/s%s"
          % (out["device"], limit, " (dptp's cudaMemcpy, the larger of before and after its rows; "
             "torch copy_ %.0f GB/s)" % copy if dptp_copy else ""))
    print("| tokens x hidden | implementation | single µs | back-to-back µs | GB/s (b2b) | % of copy |")
    print("|---|---|---:|---:|---:|---:|")
    for t, h in SHAPES:
        nbytes = 4 * t * h * 2
        print("| %d x %d | limit: 1 GiB copy's bandwidth over these bytes | | %.1f | %.0f | 100%% |"
              % (t, h, nbytes / limit / 1e3, limit))
        rows = []
        if dptp:
            for d in dptp["bench"]["norm"]["rows"]:
                if d["tokens"] != t or d["hidden"] != h:
                    continue
                if d["variant"] == "copy":
                    rows.append(("cudaMemcpy of the same bytes", None, d["b2b_us"]))
                elif d.get("default"):
                    rows.append(("dptp residual+RMSNorm kernel (%s, %d threads)"
                                 % (d["variant"].replace("default: ", ""), d["threads"]),
                                 d["single_us"], d["b2b_us"]))
        rows += [(p["impl"], p["single_us"], p["b2b_us"]) for p in out["rows"] if p["tokens"] == t and p["hidden"] == h]
        for name, single, b2b in rows:
            gbs = nbytes / (b2b * 1e-6) / 1e9
            print("| %d x %d | %s | %s | %.1f | %.0f | %.1f%% |"
                  % (t, h, name, "" if single is None else "%.1f" % single, b2b, gbs, 100 * gbs / limit))


if __name__ == "__main__":
    main()
