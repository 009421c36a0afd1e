#!/bin/bash
# dptp-run --audit on a GPU machine (torch 2.11 there): the CPU suite's
# programs under torch 2.11, D with ranks sharing one GPU (NCCL), NCCL
# records with one rank per GPU. Writes $OUT.
# usage: tests/audit/gpu.sh   (from the repository root or a copy of it)
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
export NCCL_NVLS_ENABLE=0
( meson setup -Dtests=false b >/dev/null && ninja -C b >/dev/null ) > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
RUN=$PWD/b/launcher/dptp-run
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee $O/summary.txt
for c in healthy bugs hang subproc; do
  echo "== e2e $c: $(timeout 200 python3 tests/audit/audit_e2e.py $RUN python3 $c 2>&1 | tail -3)" | tee -a $O/summary.txt
done
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
job() { # name nproc script
  local d=$O/$1; mkdir -p $d
  ( cd tests/audit && timeout 200 $RUN --nproc-per-node $2 --audit --audit-output $d/audit.json --log-dir $d/logs $3 \
      > $d/out.txt 2> $d/err.txt ); echo "== $1: rc=$?" | tee -a $O/summary.txt
  grep -v "^W1" $d/err.txt | grep -E "^  [PRICGD] |findings?;|Duplicate|NCCL" | cut -c1-400 | tee -a $O/summary.txt
  cat $d/out.txt | sort | head -8 | tee -a $O/summary.txt
  cat $d/logs/*/audit/*.c.jsonl 2>/dev/null | grep -E '"nccl"|"dev"' | head -12 | cut -c1-300 | tee -a $O/summary.txt
}
job device 4 gpu_device.py
job nccl $ngpu gpu_nccl.py
# GPU memory exchange (issue 31 item 3): CUDA IPC on WORLD vs the TP group,
# four ranks on one GPU; the records go to $O/samples
echo "== gpu_ipc: $(timeout 500 python3 tests/audit/gpu_ipc.py b/launcher/audit/libdptp-audit.so python3 all $O/samples \
  > $O/gpu_ipc.txt 2>&1; echo rc=$?)" | tee -a $O/summary.txt
