#!/bin/sh
# Runs PROG as if on host "fakehost<rank / RANKS_PER_HOST>" (DPTP_HOSTNAME),
# so one machine can stand in for several hosts in the data-plane tests.
# usage: hostwrap.sh RANKS_PER_HOST prog args...
per=$1; shift
r=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
DPTP_HOSTNAME=fakehost$((r / per)) exec "$@"
