#!/bin/sh
# The layer rule of lib/ (README "How it works"): a folder includes only
# folders below it, kernels/ uses lib/base at most, and lib/ never prints to
# the terminal nor exits (writers write to the FILE their caller passes).
# usage: layers.sh SOURCE_ROOT            check the tree, exit 1 on a breach
#        layers.sh --self-test SOURCE_ROOT prove that a breach is caught
set -u
LAYERS="base wire bootstrap plane ipc report checks"

rank_of() { # layer name -> index, or empty
	i=0
	for l in $LAYERS; do
		[ "$l" = "$1" ] && { echo $i; return; }
		i=$((i + 1))
	done
}

check() {
	root=$1
	bad=0
	for dir in $LAYERS; do
		[ -d "$root/lib/$dir" ] || { echo "layers: lib/$dir is missing"; bad=1; continue; }
		me=$(rank_of "$dir")
		for f in "$root/lib/$dir"/*.[ch]; do
			[ -e "$f" ] || continue
			rel=${f#"$root"/}
			# quoted includes: "layer/file.h", "dptp-config.h" or a kernels header
			grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
			sed 's/^\([0-9]*\):.*"\(.*\)".*/\1 \2/' | while read -r line inc; do
				case $inc in
				dptp-config.h) continue ;;
				kernels.h|plan.h|cuda_util.h)
					# kernels/ sits just above lib/base
					if [ "$me" -lt "$(rank_of plane)" ]; then
						echo "$rel:$line: includes \"$inc\" (kernels/): only lib/plane and above may"
						echo x >&3
					fi
					continue ;;
				esac
				top=${inc%%/*}
				them=$(rank_of "$top")
				if [ "$top" = "$inc" ] || [ -z "$them" ]; then
					echo "$rel:$line: includes \"$inc\": name lib headers from lib/ (\"layer/file.h\")"
					echo x >&3
				elif [ "$them" -gt "$me" ]; then
					echo "$rel:$line: lib/$dir includes \"$inc\" of lib/$top, a higher layer"
					echo x >&3
				fi
			done
		done
	done 3>"$tmp/breaches"
	# kernels/ depends on lib/base at most
	for f in "$root"/kernels/*.c "$root"/kernels/*.h "$root"/kernels/*.cu; do
		[ -e "$f" ] || continue
		grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z]*/' "$f" | grep -v '"base/' |
		sed "s|^|${f#"$root"/}:|; s/\$/  (kernels\/ may include lib\/base only)/" >>"$tmp/kern"
	done
	# nothing in lib/ prints to the terminal or ends the process
	# (string literals blanked first: a path like "/dev/stdout" is data)
	: >"$tmp/print"
	for f in $(find "$root/lib" -name '*.[ch]' | sort); do
		sed 's/"\([^"\\]\|\\.\)*"/""/g' "$f" |
		grep -nE '(^|[^_[:alnum:]])(printf|puts|putchar|perror|exit|_exit|abort|vprintf)[[:space:]]*\(|(^|[^_[:alnum:]])(stdout|stderr)([^_[:alnum:]]|$)' |
		grep -vE '^[0-9]+:[[:space:]]*(/?\*|//)' |
		sed "s|^|${f#"$root"/}:|; s/\$/  (lib\/ never prints nor exits)/" >>"$tmp/print"
	done
	cat "$tmp/kern" "$tmp/print"
	[ -s "$tmp/breaches" ] || [ -s "$tmp/kern" ] || [ -s "$tmp/print" ] && bad=1
	return $bad
}

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
: >"$tmp/kern"

if [ "${1:-}" = "--self-test" ]; then
	src=$2
	fail=0
	# each breach, made in a copy of the tree, must be caught
	for breach in 'base/util.c:#include "checks/check.h"' 'plane/group.h:#include "report/report.h"' \
		      'wire/tcpstore_proto.c:#include "util.h"' 'ipc/ipcsock.c:int f(void) { printf("x"); return 0; }' \
		      'report/report.c:static void g(void) { exit(1); }' \
		      'checks/check.c:static void h(void) { fputs("/dev/stdout", stderr); }'; do
		file=${breach%%:*}
		text=${breach#*:}
		rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/lib" "$src/kernels" "$tmp/tree/"
		printf '%s\n' "$text" >>"$tmp/tree/lib/$file"
		: >"$tmp/kern"
		if (check "$tmp/tree" >/dev/null); then
			echo "not caught: '$text' in lib/$file"
			fail=1
		else
			echo "caught: '$text' in lib/$file"
		fi
	done
	rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/lib" "$src/kernels" "$tmp/tree/"
	printf '#include "plane/group.h"\n' >>"$tmp/tree/kernels/plan.h"
	: >"$tmp/kern"
	if (check "$tmp/tree" >/dev/null); then echo "not caught: kernels/ including lib/plane"; fail=1
	else echo "caught: kernels/ including lib/plane"; fi
	exit $fail
fi

check "${1:?usage: layers.sh SOURCE_ROOT}" && echo "layers: lib/ keeps its layers ($LAYERS)"
