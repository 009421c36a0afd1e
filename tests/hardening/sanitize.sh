#!/usr/bin/env bash
# ASan + UBSan run of the unit, end-to-end and launcher tests in a second
# build dir (build-asan). Leak checking is on (LeakSanitizer) with
# suppressions for third-party libraries only (tests/hardening/lsan.supp).
# Any sanitizer report fails the run: ASan/UBSan abort the process, and the
# tests' own exit codes carry that to meson.
#   SANITIZE_BUILD=build-asan   build dir
#   SANITIZE_SUITES="unit e2e launcher"
set -euo pipefail
cd "$(dirname "$0")/../.."
bdir=${SANITIZE_BUILD:-build-asan}
suites=${SANITIZE_SUITES:-unit e2e launcher}
supp=$PWD/tests/hardening/lsan.supp

if [[ ! -f $bdir/build.ninja ]]; then
	meson setup "$bdir" -Dwerror="$([[ ${DPTP_CI:-} == 1 ]] && echo true || echo false)" -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled \
		-Dman-pages=disabled -Dtests=true >"${TMPDIR:-/tmp}/dptp-$(basename "$bdir").setup.log" 2>&1 ||
		{ cat "${TMPDIR:-/tmp}/dptp-$(basename "$bdir").setup.log" >&2; exit 1; }
fi
ninja -C "$bdir" >/dev/null

# detect_leaks works only when the process is not ptraced and has its own
# address space layout; both hold here. abort_on_error makes a report a
# signal the tests see; exitcode=23 marks a leak-only exit.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:exitcode=23:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:${SANITIZE_ASAN_EXTRA:-}"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
# Open MPI's own memory hooks conflict with ASan's allocator
export OMPI_MCA_memory=^patcher
# give each sanitized process more time than a plain build
args=()
for s in $suites; do args+=(--suite "$s"); done
# --no-rebuild: built above; --num-processes 1 keeps two cores for the ranks
log="$bdir/meson-logs/testlog.txt"
if meson test -C "$bdir" --no-rebuild --print-errorlogs --num-processes 1 \
	--timeout-multiplier 2 "${args[@]}"; then
	status=0
else
	status=1
fi
# a sanitizer report in any process (some tests only look at exit codes of
# their workers) fails the run too
if grep -lE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$log" >/dev/null 2>&1; then
	echo "sanitize: a sanitizer report is in $log:" >&2
	grep -nE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$log" | head -20 >&2
	status=1
fi
exit $status
