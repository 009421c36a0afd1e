#!/usr/bin/env bash
# Quick start 1: build, then 4 workers run dptp-check --dp 2 --tp 2 and print
# the per-replica table (host backend without GPUs). Extra arguments go to
# dptp-check, e.g. scripts/demo.sh --inject dispatch-ep-group
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ -x build/launcher/dptp-run ]]; then
	exec build/launcher/dptp-run --standalone --nproc-per-node=4 --no-python build/cli/dptp-check --dp 2 --tp 2 "$@"
fi
exec mpirun --allow-run-as-root --oversubscribe -np 4 build/cli/dptp-check --dp 2 --tp 2 "$@"
