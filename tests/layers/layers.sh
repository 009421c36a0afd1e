#!/bin/sh
# The layer rule of lib/ (README "How it works"): a folder includes only
# folders below it, kernels/ uses lib/base at most, and lib/ never prints to
# the terminal nor exits (writers write to the FILE their caller passes).
# launcher/ keeps layers too (launcher/meson.build): its headers are named
# from launcher/ ("folder/file.h"), a folder includes only folders below it
# and lib/, and lib/ never includes launcher/.
# usage: layers.sh SOURCE_ROOT            check the tree, exit 1 on a breach
#        layers.sh --self-test SOURCE_ROOT prove that a breach is caught
set -u
LAYERS="base wire bootstrap plane ipc report checks"
LAUNCHER_LAYERS="log output audit cli rdzv pmix agent"

rank_of() { # layer name -> index, or empty
	i=0
	for l in $LAYERS; do
		[ "$l" = "$1" ] && { echo $i; return; }
		i=$((i + 1))
	done
}

launcher_rank_of() { # launcher layer name -> index, or empty
	i=0
	for l in $LAUNCHER_LAYERS; do
		[ "$l" = "$1" ] && { echo $i; return; }
		i=$((i + 1))
	done
}

# launcher/: each folder's files, then main.c (above every folder)
check_launcher() {
	root=$1
	top=$(echo $LAUNCHER_LAYERS | wc -w)
	for l in $LAUNCHER_LAYERS; do
		# a folder named like a lib layer would make "x/y.h" ambiguous
		[ -n "$(rank_of "$l")" ] && echo "layers: launcher/$l has the name of a lib/ layer"
		[ -d "$root/launcher/$l" ] || echo "layers: launcher/$l is missing"
	done
	for f in "$root"/launcher/*.[ch] "$root"/launcher/*/*.[ch]; do
		[ -e "$f" ] || continue
		rel=${f#"$root"/}
		dir=${rel#launcher/}
		case $dir in
		main.c) me=$top dir=. ;;
		*/*) dir=${dir%%/*} me=$(launcher_rank_of "$dir") ;;
		*) echo "$rel: launcher/ holds main.c only; a file belongs in a layer folder"; continue ;;
		esac
		[ -n "$me" ] || { echo "$rel: launcher/$dir is not a layer (launcher/meson.build, LAUNCHER_LAYERS)"; continue; }
		grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
		sed 's/^\([0-9]*\):.*"\(.*\)".*/\1 \2/' | while read -r line inc; do
			[ "$inc" = dptp-config.h ] && continue
			t=${inc%%/*}
			them=$(launcher_rank_of "$t")
			if [ "$t" = "$inc" ] || { [ -z "$them" ] && [ -z "$(rank_of "$t")" ]; }; then
				echo "$rel:$line: includes \"$inc\": name launcher headers from launcher/ (\"folder/file.h\"), lib headers from lib/"
			elif [ -n "$them" ] && [ "$them" -gt "$me" ]; then
				echo "$rel:$line: launcher/$dir includes \"$inc\" of launcher/$t, a higher layer"
			fi
		done
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
	check_launcher "$root" >"$tmp/launcher"
	cat "$tmp/kern" "$tmp/print" "$tmp/launcher"
	[ -s "$tmp/breaches" ] || [ -s "$tmp/kern" ] || [ -s "$tmp/print" ] || [ -s "$tmp/launcher" ] && bad=1
	return $bad
}

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
: >"$tmp/kern"

if [ "${1:-}" = "--self-test" ]; then
	src=$2
	fail=0
	# each breach, made in a copy of the tree, must be caught
	for breach in 'lib/base/util.c:#include "checks/check.h"' 'lib/plane/group.h:#include "report/report.h"' \
		      'lib/wire/tcpstore_proto.c:#include "util.h"' 'lib/ipc/ipcsock.c:int f(void) { printf("x"); return 0; }' \
		      'lib/report/report.c:static void g(void) { exit(1); }' \
		      'lib/checks/check.c:static void h(void) { fputs("/dev/stdout", stderr); }' \
		      'lib/base/util.c:#include "rdzv/rendezvous.h"' \
		      'launcher/log/glog.c:#include "agent/env.h"' 'launcher/output/logs.h:#include "pmix/xnode.h"' \
		      'launcher/rdzv/rdzv_common.c:#include "rendezvous.h"' 'launcher/cli/run_opts.c:#include "../agent/env.h"' \
		      'launcher/stray.c:#include "log/glog.h"'; do
		file=${breach%%:*}
		text=${breach#*:}
		rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/lib" "$src/kernels" "$src/launcher" "$tmp/tree/"
		printf '%s\n' "$text" >>"$tmp/tree/$file"
		: >"$tmp/kern"
		if (check "$tmp/tree" >/dev/null); then
			echo "not caught: '$text' in $file"
			fail=1
		else
			echo "caught: '$text' in $file"
		fi
	done
	rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/lib" "$src/kernels" "$src/launcher" "$tmp/tree/"
	printf '#include "plane/group.h"\n' >>"$tmp/tree/kernels/plan.h"
	: >"$tmp/kern"
	if (check "$tmp/tree" >/dev/null); then echo "not caught: kernels/ including lib/plane"; fail=1
	else echo "caught: kernels/ including lib/plane"; fi
	exit $fail
fi

check "${1:?usage: layers.sh SOURCE_ROOT}" &&
	echo "layers: lib/ keeps its layers ($LAYERS), launcher/ its own ($LAUNCHER_LAYERS)"
