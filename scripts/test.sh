#!/usr/bin/env bash
# Quick start 2: build and run the whole test suite; non-zero on any failure.
# GPU tests (suite "gpu") skip themselves cleanly without a GPU.
# DPTP_CI=1 (what CI runs, .ci/run): every warning is an error, and the
# other configurations are compiled too -- release with GCC, debugoptimized
# and release with clang, in build-ci-*; the suite runs once, on build/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ ${DPTP_CI:-} == 1 ]]; then
	for cfg in gcc:release clang:debugoptimized clang:release; do
		cc=${cfg%%:*} bt=${cfg#*:} dir=build-ci-${cfg/:/-}
		if [[ ! -f $dir/build.ninja ]]; then
			log=${TMPDIR:-/tmp}/dptp-$dir.setup.log
			CC=$cc meson setup "$dir" --buildtype="$bt" -Dwerror=true -Dman-pages=disabled >"$log" 2>&1 ||
				{ cat "$log" >&2; exit 1; }
		fi
		echo "dptp: compiling $cc $bt ($dir)" >&2
		ninja -C "$dir" --quiet
	done
fi
meson test -C build --print-errorlogs "$@"
