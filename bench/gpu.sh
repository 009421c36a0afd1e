#!/usr/bin/env bash
# The GPU session: dptp-check on the cuda backend under mpirun and torchrun,
# every fault, and --bench. Run on a GPU machine from the repo root, with
# dptp-check built (or copied) at $CHECK. Writes logs and JSON under $OUT.
# One GPU: ranks share it (DPTP_GPU_SHARING=1), the data plane is host-staged
# and NCCL runs with one rank; several GPUs: one rank per GPU and NCCL.
set -u
CHECK=${CHECK:-build/cli/dptp-check}
OUT=${OUT:-/tmp/dptp-gpu}
mkdir -p "$OUT"
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi -L
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
export NO_COLOR=1 NCCL_NVLS_ENABLE=0
run() { # name, command...
	local name=$1; shift
	echo "== $name: $*"
	timeout 300 "$@" >"$OUT/$name.log" 2>&1
	echo "rc=$?"
	grep -E "^  [a-z-]+ +(PASS|FAIL|SKIP|ERROR|TIMEOUT)|summary|dptp-check:" "$OUT/$name.log" | cut -c1-400
}
if [[ $ngpu -ge 4 ]]; then share=0; np=4; else share=1; np=4; fi
export DPTP_GPU_SHARING=$share
run host-dp2tp2 $MPI -np 4 "$CHECK" --dp 2 --tp 2 --backend host
run cuda-1rank "$CHECK" --backend cuda --format json --output "$OUT/cuda-1rank.json"
run cuda-dp2tp2 $MPI -x DPTP_GPU_SHARING -np $np "$CHECK" --dp 2 --tp 2 --backend cuda --format json --output "$OUT/cuda-dp2tp2.json"
for f in bcast-global-src opid-seeded device-tp-rank world-workspace dispatch-ep-group; do
	run "cuda-$f" $MPI -x DPTP_GPU_SHARING -np $np "$CHECK" --dp 2 --tp 2 --backend cuda --inject $f
done
run cuda-dp1tp4-fp32 $MPI -x DPTP_GPU_SHARING -np 4 "$CHECK" --dp 1 --tp 4 --backend cuda --dtype fp32 --tokens 512
run cuda-dp2tp2-fp16-2shot $MPI -x DPTP_GPU_SHARING -np 4 "$CHECK" --dp 2 --tp 2 --backend cuda --dtype fp16 --tokens 2048 --hidden 8192
if [[ $share == 1 ]]; then
	run cuda-noshare env DPTP_GPU_SHARING=0 $MPI -x DPTP_GPU_SHARING -np 2 "$CHECK" --tp 2 --backend cuda
fi
RUN=${RUN:-build/launcher/dptp-run}
if [[ -x $RUN ]]; then
	run dptp-run-cuda "$RUN" --standalone --nproc-per-node=4 --no-python "$CHECK" --dp 2 --tp 2 --backend cuda --format json --output "$OUT/dptp-run-cuda.json"
	run dptp-run-torch-gloo "$RUN" --standalone --nproc-per-node=4 bench/torch_pg.py gloo
	grep -h "allreduce" "$OUT/dptp-run-torch-gloo.log"
	run dptp-run-torch-nccl1 "$RUN" --standalone --nproc-per-node=1 bench/torch_pg.py nccl
	grep -h "allreduce" "$OUT/dptp-run-torch-nccl1.log"
fi
if command -v torchrun >/dev/null; then
	run torchrun-host torchrun --nproc-per-node=4 --no-python "$CHECK" --dp 2 --tp 2 --backend host --format json --output "$OUT/torchrun-host.json"
	run torchrun-cuda torchrun --nproc-per-node=4 --no-python "$CHECK" --dp 2 --tp 2 --backend cuda --inject dispatch-ep-group
fi
export DPTP_BENCH_ITERS=${DPTP_BENCH_ITERS:-30}
run bench-tp1 "$CHECK" --backend cuda --bench --format json --output "$OUT/bench-tp1.json"
run bench-tp2 $MPI -x DPTP_GPU_SHARING -x DPTP_BENCH_ITERS -np 2 "$CHECK" --tp 2 --backend cuda --bench --format json --output "$OUT/bench-tp2.json"
cat "$OUT"/bench-*.log | grep -v "^==" | head -80
