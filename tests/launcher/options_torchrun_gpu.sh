#!/bin/bash
# dptp-run's --numa-binding, --event-log-handler console and
# --duplicate-std{out,err}-filters next to real torchrun 2.11 on a GPU
# machine: each worker's Cpus_allowed_list in every mode and under taskset,
# the errors without a GPU or with more workers than GPUs, the event lines
# of a good and a failed run, the filtered files. Needs torch; writes $OUT.
# usage: tests/launcher/options_torchrun_gpu.sh [DPTP_RUN]
#   (bench/results/torchrun-interop.md: --numa-binding, events and filters)
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/options.txt) 2>&1
command -v torchrun >/dev/null || { echo "no torchrun: skipped"; exit 77; }
if [ $# -ge 1 ]; then R=$(readlink -f "$1"); else
  cd "$(dirname "$0")/../.."
  ( meson setup -Dtests=false b >/dev/null && ninja -C b launcher/dptp-run >/dev/null ) > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
  R=$PWD/b/launcher/dptp-run
fi
python3 -c "import torch; print('torch', torch.__version__)"
echo "RUN=$R"; $R --help >/dev/null && echo runs
OWN='while read l; do case $l in Cpus_allowed_list*) echo $l;; esac; done </proc/self/status'
cd /tmp && mkdir -p w && cd w
for m in node socket exclusive core-complex; do
  echo "=== $m"; echo -n "dptp: "; $R --numa-binding $m --no-python sh -c "$OWN"; echo "rc=$?"
  echo -n "torch: "; torchrun --numa-binding $m --no-python sh -c "$OWN" 2>/dev/null; echo "rc=$?"
done
echo "=== taskset 3-6"; echo -n "dptp: "; taskset -c 3-6 $R --numa-binding node --no-python sh -c "$OWN"; echo -n "torch: "; taskset -c 3-6 torchrun --numa-binding node --no-python sh -c "$OWN" 2>/dev/null
echo "=== no gpu"; CUDA_VISIBLE_DEVICES= $R --numa-binding node --no-python true; echo "rc=$?"
echo "=== 2 workers 1 gpu"; $R --numa-binding node --nproc-per-node 2 --no-python true; echo "rc=$?"
echo "=== CUDA_VISIBLE_DEVICES=0 exclusive"; CUDA_VISIBLE_DEVICES=0 $R --numa-binding exclusive --no-python sh -c "$OWN"; echo "rc=$?"
echo "=== events"; $R --event-log-handler console --nproc-per-node 2 --no-python sh -c true 2>&1 | grep '^{' > $O/ev_dptp.txt; torchrun --event-log-handler console --nproc-per-node 2 --no-python sh -c true 2>&1 | grep '^{' > $O/ev_torch.txt; wc -l $O/ev_*.txt
echo "=== events fail"; $R --event-log-handler console --nproc-per-node 2 --no-python sh -c '[ $LOCAL_RANK = 1 ] && exit 3; sleep 20' 2>&1 | grep '^{' > $O/evf_dptp.txt; torchrun --event-log-handler console --nproc-per-node 2 --no-python sh -c '[ $LOCAL_RANK = 1 ] && exit 3; sleep 20' 2>&1 | grep '^{' > $O/evf_torch.txt; wc -l $O/evf_*.txt
echo "=== dup"; for who in dptp torch; do rm -rf L; if [ $who = dptp ]; then X=$R; else X=torchrun; fi
  $X --nproc-per-node 2 --log-dir L --tee 3 --duplicate-stdout-filters 'a,,b,x' --duplicate-stderr-filters '' --no-python sh -c 'echo a,b; echo x$LOCAL_RANK; echo no; echo e >&2' >/dev/null 2>&1
  for f in $(find L -name 'filtered*' | sort); do echo "$who $(basename $f): $(sort $f | tr '\n' '|')"; done; done
# the event lines side by side: every field equal but pids and durations
python3 - "$O" <<'PY'
import json, sys
for a, b in (("ev_dptp.txt", "ev_torch.txt"), ("evf_dptp.txt", "evf_torch.txt")):
    A = [json.loads(l) for l in open(sys.argv[1] + "/" + a)]
    B = [json.loads(l) for l in open(sys.argv[1] + "/" + b)]
    for x, y in zip(A, B):
        mx, my = dict(x["metadata"]), dict(y["metadata"])
        for m in (mx, my):
            m.pop("worker_id"); m.pop("duration_ms")
            inner = json.loads(m["metadata"]); inner.pop("worker_pid", None); m["metadata"] = inner
        print(a, x["name"].rsplit(".", 1)[1], x["source"], "same" if (x["name"], mx) == (y["name"], my) else "DIFFERS")
    print(a, len(A), "events; torchrun", len(B))
PY
