#!/bin/sh
# Ends (SIGSEGV) the process of global rank RANK before it runs PROG, once
# FILE exists (rank 0 creates it when it starts waiting for its peers:
# DPTP_TEST_READY_FILE; 5 s at most): a peer that dies at start-up, after
# which the launcher ends the others with SIGTERM.
# usage: crashwrap.sh RANK FILE prog args...
crash=$1 file=$2; shift 2
r=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
if [ "$r" = "$crash" ]; then
	i=0
	while [ ! -e "$file" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	kill -SEGV $$
fi
exec "$@"
