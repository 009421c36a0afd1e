#!/usr/bin/env bash
# The kernel session on one GPU: dptp-kernel-selftest (correctness, the
# fused kernels' timings, the TP 1 residual + RMSNorm kernel's variants
# against the device-to-device copy) and the PyTorch peers (bench/peers.py),
# in one table. Run from the repo root on a GPU machine, with the self-test
# built (or copied) at $SELFTEST. Under $OUT: NAME.out (the step's stdout:
# JSON from the self-test, the table from peers.py), NAME.log (stderr).
#   bench/kernels.sh        --norm-bench, peers, then the full self-test
#   bench/kernels.sh norm   --norm-bench and peers only
set -u
ST=${SELFTEST:-build/kernels/dptp-kernel-selftest}
OUT=${OUT:-/tmp/dptp-kernels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
step() { # name, timeout, command...
	local name=$1 limit=$2; shift 2
	echo "== $name: $*"
	local t0=$SECONDS
	timeout "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.log"
	echo "rc=$? in $((SECONDS - t0)) s"
}
step norm 150 "$ST" --norm-bench
grep -E "^ *(residual|[0-9]+x|shape|FAIL|selftest|correctness)" "$OUT/norm.log"
if python3 -c "import torch" 2>/dev/null; then
	step peers 200 python3 bench/peers.py --dptp "$OUT/norm.out" --json "$OUT/peers.json"
	tail -20 "$OUT/peers.log"
	cat "$OUT/peers.out"
else
	echo "no torch here: no peers"
fi
if [[ ${1:-full} != norm ]]; then
	step selftest 230 "$ST"
	grep -vE "^correctness" "$OUT/selftest.log" | tail -60
fi
