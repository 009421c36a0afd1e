#!/usr/bin/env bash
# Builds the libFuzzer harnesses in their own clang build dir (build-fuzz:
# ASan + UBSan, the library instrumented for coverage) and runs each one for
# a bounded time on a copy of its seed corpus. Exit 0 when no harness found a
# crash, 1 otherwise (the reproducer is kept in build-fuzz/fuzz-artifacts/),
# 77 (meson's skip) without clang.
#   FUZZ_TIME=20   seconds per harness
#   FUZZ_ONLY=name run one harness
#   FUZZ_BUILD=build-fuzz
set -euo pipefail
cd "$(dirname "$0")/../.."
time_each=${FUZZ_TIME:-20}
bdir=${FUZZ_BUILD:-build-fuzz}
command -v clang >/dev/null || { echo "fuzz: clang not found, skipping" >&2; exit 77; }

if [[ ! -f $bdir/build.ninja ]]; then
	CC=clang meson setup "$bdir" -Dwerror="$([[ ${DPTP_CI:-} == 1 ]] && echo true || echo false)" -Dfuzz=true -Dcuda=disabled -Dman-pages=disabled \
		-Db_sanitize=address,undefined -Db_lundef=false \
		-Dc_args=-fsanitize=fuzzer-no-link >"${TMPDIR:-/tmp}/dptp-$(basename "$bdir").setup.log" 2>&1 ||
		{ cat "${TMPDIR:-/tmp}/dptp-$(basename "$bdir").setup.log" >&2; exit 1; }
fi
ninja -C "$bdir" >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
art="$bdir/fuzz-artifacts"
mkdir -p "$art"
fail=0
for seeds in tests/fuzz/corpus/*/; do
	name=$(basename "$seeds")
	[[ -n ${FUZZ_ONLY:-} && $name != "$FUZZ_ONLY" ]] && continue
	exe="$bdir/tests/fuzz/fuzz_$name"
	[[ -x $exe ]] || { echo "fuzz: $exe was not built" >&2; fail=1; continue; }
	work=$(mktemp -d)
	cp "$seeds"* "$work/"
	log="$art/$name.log"
	if "$exe" -max_total_time="$time_each" -timeout=10 -rss_limit_mb=1024 -max_len=4096 \
		-print_final_stats=1 -artifact_prefix="$art/$name-" "$work" >"$log" 2>&1; then
		execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
		rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")
		echo "fuzz $name: ok, $execs executions in ${time_each}s, peak RSS ${rss} MB"
	else
		echo "fuzz $name: FAILED (log $log)" >&2
		grep -E "ERROR|SUMMARY|Test unit written|runtime error" "$log" | head -20 >&2
		fail=1
	fi
	rm -rf "$work"
done
exit $fail
