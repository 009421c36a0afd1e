#!/usr/bin/env bash
# Quick start 2: build and run the whole test suite; non-zero on any failure.
# GPU tests (suite "gpu") skip themselves cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
meson test -C build --print-errorlogs "$@"
