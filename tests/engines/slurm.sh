#!/usr/bin/env bash
# A private single-host Slurm cluster for the engines tests (Debian 12's
# Slurm 22.05 + PMIx 4.2; recipe and pitfalls: reference/SLURM.md).
#
# usage: tests/engines/slurm.sh start|stop|status|env
#
#   start   bring the cluster up (idempotent: an already-running instance of
#           this state dir is reused and left alone); prints the state dir.
#           Exit 0 up, 77 slurm/munge not installed or not root, 1 could not
#           start (logs on stderr; whatever this call started is stopped again).
#   stop    stop the daemons whose pid files are in the state dir (and only
#           if /proc/PID/comm still names that daemon); remove the state.
#   status  exit 0 when the node is up and usable, 1 otherwise.
#   env     print `export SLURM_CONF=...` for this instance.
#
# Everything lives in the state dir: slurm.conf (clients find it through
# SLURM_CONF; /etc/slurm is never written), a private munged (own key and
# socket; the system munged, if any, is not touched), pid files, logs, spool.
# Ports are picked per state dir, so two checkouts can run clusters side by side.
#
# Env: DPTP_SLURM_DIR  state dir (default /tmp/dptp-slurm-<hash of this checkout>)
#      DPTP_SLURM_CPUS CPUs declared for the node (default 32; the real count
#                      is lower: SlurmdParameters=config_overrides)
#      DPTP_SLURM_AUTH munge (default) | none (auth/none, Slurm 22.05 only)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)
D=${DPTP_SLURM_DIR:-/tmp/dptp-slurm-$(printf %s "$root" | md5sum | cut -c1-8)}
CPUS=${DPTP_SLURM_CPUS:-32}
AUTH=${DPTP_SLURM_AUTH:-munge}
NODE=$(hostname -s)
CONF=$D/slurm.conf
PMIXLIB=/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so
export SLURM_CONF=$CONF

log() { echo "slurm.sh: $*" >&2; }

alive() { # pid comm: running (not a zombie) and still that program
	local s
	[[ -n $1 ]] || return 1
	s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
	[[ ${s#Z} == "$s" ]] || return 1
	[[ $(cat /proc/"$1"/comm 2>/dev/null) == "$2" ]]
}

pidof_file() { cat "$1" 2>/dev/null || true; }

prereqs() {
	local missing=() c
	for c in slurmctld slurmd srun sbatch sinfo scontrol; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	if [[ $AUTH == munge ]]; then
		for c in munged munge mungekey; do command -v "$c" >/dev/null || missing+=("$c"); done
	fi
	if ((${#missing[@]})); then
		log "not installed: ${missing[*]} (scripts/setup.sh installs slurmctld slurmd slurm-client munge)"
		return 77
	fi
	if [[ ! -e $PMIXLIB ]]; then
		# slurm's mpi_pmix dlopens the unversioned libpmix.so from libpmix-dev
		log "$PMIXLIB missing (install libpmix-dev)"
		return 77
	fi
	if [[ $(id -u) -ne 0 ]]; then
		log "needs root (slurmd runs jobs as their owner)"
		return 77
	fi
}

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1 || true; }

status() {
	[[ -f $CONF ]] || return 1
	alive "$(pidof_file "$D/slurmctld.pid")" slurmctld || return 1
	alive "$(pidof_file "$D/slurmd.pid")" slurmd || return 1
	case "$(node_state)" in
	idle | mixed | allocated | completing) return 0 ;;
	*) return 1 ;;
	esac
}

port_free() { ! ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

pick_ports() { # two consecutive free ports from a per-dir base
	local h base p
	h=$(printf %s "$D" | md5sum | cut -c1-4)
	base=$((20000 + (16#$h % 4000) * 2))
	for ((p = base; p < base + 200; p += 2)); do
		if port_free "$p" && port_free "$((p + 1))"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

write_conf() {
	local port=$1 auth
	if [[ $AUTH == munge ]]; then
		auth="AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock"
	else
		auth="AuthType=auth/none
CredType=cred/none"
	fi
	cat >"$CONF" <<EOF
# written by tests/engines/slurm.sh; private to $D
ClusterName=dptp
SlurmctldHost=${NODE}(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
$auth
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PlugStackConfig=$D/plugstack.conf
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
MinJobAge=600
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
	: >"$D/plugstack.conf"
}

start_munge() {
	local m=$D/munge
	# munged wants a private dir for its key and a world-searchable one for the socket
	install -d -m 700 "$m/priv"
	chmod 755 "$m"
	[[ -s $m/priv/munge.key ]] || mungekey --create --keyfile="$m/priv/munge.key" >/dev/null
	alive "$(pidof_file "$m/priv/munged.pid")" munged && return 0
	munged --socket="$m/munge.sock" --key-file="$m/priv/munge.key" \
		--pid-file="$m/priv/munged.pid" --log-file="$m/priv/munged.log" \
		--seed-file="$m/priv/munged.seed"
	local _
	for _ in $(seq 50); do
		munge -S "$m/munge.sock" -n 2>/dev/null | unmunge -S "$m/munge.sock" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	log "munged did not answer on $m/munge.sock"
	return 1
}

dump_logs() {
	local f
	for f in "$D"/log/slurmctld.log "$D"/log/slurmd.log "$D"/munge/priv/munged.log; do
		[[ -f $f ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
	done
	return 0
}

start() {
	prereqs || return $?
	if status; then
		log "already up ($D, node $NODE $(node_state)); reusing it"
		echo "$D"
		return 0
	fi
	# stale pieces of an earlier instance of this dir: stop them first
	stop_daemons
	rm -f "$D"/started-by-tests
	mkdir -p "$D"
	chmod 755 "$D"
	rm -rf "$D"/state "$D"/spool
	mkdir -p "$D"/state "$D"/spool "$D"/log
	local port
	port=$(pick_ports) || { log "no free port pair"; return 1; }
	write_conf "$port"
	if [[ $AUTH == munge ]]; then
		start_munge || { dump_logs; stop_daemons; return 1; }
	fi
	if ! slurmctld -i -f "$CONF" || ! slurmd -f "$CONF"; then
		log "a daemon failed to start"
		dump_logs
		stop_daemons
		return 1
	fi
	local st="" _
	for _ in $(seq 150); do
		st=$(node_state)
		[[ $st == idle ]] && break
		sleep 0.2
	done
	if [[ $st != idle ]]; then
		log "node $NODE not idle after 30 s (state '$st')"
		dump_logs
		stop_daemons
		return 1
	fi
	log "up: $D, node $NODE idle, cpus $CPUS, auth $AUTH, ports $port-$((port + 1))"
	echo "$D"
}

stop_daemons() {
	local pids=() f p
	for f in "$D/slurmd.pid:slurmd" "$D/slurmctld.pid:slurmctld" "$D/munge/priv/munged.pid:munged"; do
		p=$(pidof_file "${f%%:*}")
		if alive "$p" "${f##*:}"; then pids+=("$p"); fi
	done
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	# slurmctld can take ~3 s to exit; killed daemons may linger as zombies
	for p in "${pids[@]}"; do
		for _ in $(seq 100); do
			s=$(ps -o stat= -p "$p" 2>/dev/null) || break
			[[ ${s#Z} == "$s" ]] || break
			sleep 0.1
		done
	done
	rm -f "$D"/slurmd.pid "$D"/slurmctld.pid "$D"/munge/priv/munged.pid
}

stop() {
	[[ -d $D ]] || return 0
	stop_daemons
	rm -rf "$D"/state "$D"/spool "$D"/munge/munge.sock* "$D"/started-by-tests
}

case "${1:-status}" in
start) start ;;
stop) stop ;;
status) status ;;
env) echo "export SLURM_CONF=$CONF" ;;
*)
	echo "usage: $0 start|stop|status|env" >&2
	exit 2
	;;
esac
