#!/bin/bash
# c10d jobs mixing dptp-run and real torchrun 2.11 on one GPU machine (loopback):
# both orders with gloo all-reduce workers, dptp-check under a mixed job, and an
# elastic 1:2 job that a torchrun node joins late. Needs torch; writes $OUT.
# usage: tests/launcher/c10d_torchrun_gpu.sh   (bench/results/torchrun-interop.md: c10d with real torchrun)
set -u
cd "$(dirname "$0")/../.."  # the repository root
O=${OUT:-/tmp/out}; mkdir -p $O
( meson setup -Dtests=false b >/dev/null && ninja -C b >/dev/null ) > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
command -v torchrun >/dev/null || { echo "no torchrun: skipped"; exit 77; }
RUN=$PWD/b/launcher/dptp-run; CHECK=$PWD/b/cli/dptp-check
[ -x $CHECK ] || CHECK=$(find $PWD/b -name dptp-check -type f | head -1)
python3 -c "import torch; print('torch', torch.__version__)" | tee $O/versions.txt
cat > $O/w.py <<'PY'
import os, sys, time, torch, torch.distributed as dist
g, gw = int(os.environ["GROUP_RANK"]), int(os.environ["GROUP_WORLD_SIZE"])
want = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if gw < want:
    print("node %d world %d (waiting for more)" % (g, gw), flush=True); time.sleep(120); sys.exit(0)
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(r + 1)]); dist.all_reduce(t)
ok = t.item() == w * (w + 1) / 2
print("rank %d/%d node %d/%d restart %s agent_store %s master %s:%s allreduce %.0f %s" % (r, w, g, gw,
      os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["TORCHELASTIC_USE_AGENT_STORE"],
      os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], t.item(), "OK" if ok else "BAD"), flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
PY
pair() { # name first second port extra-args... : first starts, second 3 s later
  local name=$1 a=$2 b=$3 port=$4; shift 4
  local common="--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port --rdzv-id $name --rdzv-conf last_call_timeout=2"
  local t0=$(date +%s%N)
  timeout 120 $a $common "$@" > $O/$name.1.out 2> $O/$name.1.err & local p1=$!
  sleep 3
  timeout 120 $b $common "$@" > $O/$name.2.out 2> $O/$name.2.err & local p2=$!
  wait $p1; local r1=$?; wait $p2; local r2=$?
  echo "== $name: $(basename $a) rc=$r1, $(basename $b) rc=$r2, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $O/summary.txt
  cat $O/$name.1.out $O/$name.2.out | sort | tee -a $O/summary.txt
}
TR=$(command -v torchrun)
pair dptp_first $RUN $TR 29611 --no-python python3 $O/w.py
pair torchrun_first $TR $RUN 29612 --no-python python3 $O/w.py
for k in 1 2; do [ -f $O/dptp_first.$k.err ] && grep -h "Traceback\|Error" $O/*_first.$k.err | head -5; done
# dptp-check under the same mixed job (torchrun environment bootstrap)
DPTP_GPU_SHARING=1 pair check_mixed $RUN $TR 29613 --no-python $CHECK --dp 2 --tp 2 --format json --output $O/check.json --tokens 8 --hidden 64 --timeout 60
python3 -c "
import json; r=json.load(open('$O/check.json')); print('dptp-check bootstrap', r['bootstrap'], 'world', r['layout']['world'], 'statuses', sorted({c['status'] for x in r['replicas'] for c in x['checks']}))" | tee -a $O/summary.txt
# elastic 1:2: a dptp-run node alone, a torchrun node joins 12 s later
common="--nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29614 --rdzv-id elastic --rdzv-conf last_call_timeout=2"
t0=$(date +%s%N)
LOGLEVEL=INFO timeout 150 $RUN $common --no-python python3 $O/w.py 2 > $O/elastic.1.out 2> $O/elastic.1.err & p1=$!
sleep 12
timeout 150 $TR $common --no-python python3 $O/w.py 2 > $O/elastic.2.out 2> $O/elastic.2.err & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
echo "== elastic: dptp-run rc=$r1, torchrun (12 s late) rc=$r2, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $O/summary.txt
cat $O/elastic.1.out $O/elastic.2.out | tee -a $O/summary.txt
grep -h "Detected\|joined round" $O/elastic.1.err | sed 's/^[IWE][0-9]* [0-9:.]* [0-9]* //' | tee -a $O/summary.txt
