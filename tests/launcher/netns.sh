#!/usr/bin/env bash
# Several hosts on one machine (issue 7 item 2): two network namespaces
# joined by a veth pair, each with its own UTS namespace (host name), run one
# dptp-run node each; the two form one job through node 0's store.
#   1. DP2TP2, 2 x 2 workers: one TP group per host -> everything passes.
#   2. DP1TP4, 2 x 2 workers: the TP group spans the hosts -> opid and
#      fused-allreduce must say so (skip or pass, with a detail naming the
#      span), never fail or hang.
# usage: netns.sh DPTP_RUN DPTP_CHECK      (root; exit 77 = skipped)
set -u
RUN=${1:?dptp-run}
CHECK=${2:-}
[[ -n "$CHECK" && -x "$CHECK" ]] || { echo "SKIP: no dptp-check"; exit 77; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root"; exit 77; }
command -v ip >/dev/null && command -v unshare >/dev/null || { echo "SKIP: needs iproute2 and unshare"; exit 77; }
RUN=$(readlink -f "$RUN"); CHECK=$(readlink -f "$CHECK")

A=dptpA$$ B=dptpB$$ VA=dva$$ VB=dvb$$
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	ip netns del "$A" 2>/dev/null
	ip netns del "$B" 2>/dev/null
	ip link del "$VA" 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

ip netns add "$A" 2>/dev/null || { echo "SKIP: ip netns add failed (no privilege for network namespaces?)"; exit 77; }
ip netns add "$B" || exit 1
ip link add "$VA" type veth peer name "$VB" || { echo "SKIP: cannot create a veth pair"; exit 77; }
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || exit 1
ip -n "$A" addr add 10.77.0.1/24 dev "$VA" && ip -n "$B" addr add 10.77.0.2/24 dev "$VB" || exit 1
for n in "$A" "$B"; do ip -n "$n" link set lo up || exit 1; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || exit 1

fails=0
# node NS HOST RANK -- dptp-run arguments...
node() {
	local ns=$1 host=$2 rank=$3; shift 3
	ip netns exec "$ns" unshare --uts bash -c 'hostname "$0"; exec "$@"' "$host" \
		timeout 120 "$RUN" --nnodes=2 --node-rank="$rank" --master-addr=10.77.0.1 --master-port=29577 \
		--rdzv-conf=timeout=60 "$@"
}

# case NAME DP TP PYTHON-EXPECTATION
run_case() {
	local name=$1 dp=$2 tp=$3 expect=$4 t0 t1
	local args=(--nproc-per-node=2 --no-python "$CHECK" --dp "$dp" --tp "$tp" --format json
		--output "$TMP/$name.json" --tokens 8 --hidden 64 --timeout 20)
	t0=$(date +%s.%N)
	node "$A" nodeA 0 "${args[@]}" >"$TMP/$name.0.out" 2>"$TMP/$name.0.err" & PIDS+=($!); local p0=$!
	node "$B" nodeB 1 "${args[@]}" >"$TMP/$name.1.out" 2>"$TMP/$name.1.err" & PIDS+=($!); local p1=$!
	wait "$p0"; local rc0=$?
	wait "$p1"; local rc1=$?
	t1=$(date +%s.%N)
	if [[ ! -s "$TMP/$name.json" ]]; then
		echo "FAIL $name: no report (rc $rc0/$rc1)"; tail -5 "$TMP/$name.0.err" "$TMP/$name.1.err"
		fails=$((fails + 1)); return
	fi
	if python3 - "$TMP/$name.json" "$expect" "$rc0" "$rc1" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
st = {(r["dp"], c["name"]): (c["status"], c["detail"]) for r in rep["replicas"] for c in r["checks"]}
for (d, c), (s, det) in sorted(st.items()):
    print("  dp%d/%-16s %-7s %s" % (d, c, s, det[:150]))
ok = eval(sys.argv[2], {"st": st, "rc": (int(sys.argv[3]), int(sys.argv[4]))})
sys.exit(0 if ok else 1)
PY
	then echo "ok   $name ($(echo "$t1 - $t0" | bc) s)"
	else echo "FAIL $name: expectation not met: $expect (rc $rc0/$rc1)"; fails=$((fails + 1)); fi
}

# one TP group per host: everything passes
run_case dp2tp2_local 2 2 'rc == (0, 0) and all(s == "pass" for s, _ in st.values())'
# the TP group spans the hosts: no failure, and the host-bound checks say so
run_case dp1tp4_span 1 4 'rc == (0, 0) and all(s in ("pass", "skip") for s, _ in st.values()) and all("host" in st[(0, c)][1] for c in ("opid", "fused-allreduce"))'
exit $((fails > 0))
