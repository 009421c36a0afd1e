#!/bin/sh
# Stops (SIGSTOP) the process of global rank RANK right after launch, before
# it runs PROG: a peer that never arrives at start-up. The launcher's
# teardown (SIGKILL) ends it.
# usage: stopwrap.sh RANK prog args...
stop=$1; shift
r=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
[ "$r" = "$stop" ] && kill -STOP $$
exec "$@"
