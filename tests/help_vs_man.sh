#!/bin/sh
# The long options in `dptp-check --help` and in the OPTIONS section of
# man/dptp-check.1.scd must be the same set.
# usage: help_vs_man.sh DPTP_CHECK_BINARY MAN_PAGE_SCD
set -eu

if [ $# -ne 2 ]; then
	echo "usage: $0 DPTP_CHECK_BINARY MAN_PAGE_SCD" >&2
	exit 2
fi
bin=$1
scd=$2
[ -x "$bin" ] || { echo "help_vs_man: '$bin' is not an executable" >&2; exit 1; }
[ -r "$scd" ] || { echo "help_vs_man: cannot read '$scd'" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$bin" --help >"$tmp/help" 2>"$tmp/help.err"; then
	echo "help_vs_man: '$bin --help' failed:" >&2
	cat "$tmp/help.err" >&2
	exit 1
fi

# Option lines of --help start with blanks, then "-x, --name" or "--name".
sed -n 's/^[[:space:]]\{1,\}\(-[[:alnum:]], \)\{0,1\}\(--[[:alnum:]][[:alnum:]-]*\).*/\2/p' \
	"$tmp/help" | sort -u >"$tmp/help.opts"

# Option items in the man page's OPTIONS section start a line with
# "*-x*, *--name*" or "*--name*".
awk '/^# /{ in_opts = ($0 == "# OPTIONS") } in_opts' "$scd" |
	sed -n 's/^\*\(-[[:alnum:]]\*, \*\)\{0,1\}\(--[[:alnum:]][[:alnum:]-]*\).*/\2/p' |
	sort -u >"$tmp/man.opts"

if [ ! -s "$tmp/help.opts" ]; then
	echo "help_vs_man: no options found in '$bin --help'" >&2
	exit 1
fi
if [ ! -s "$tmp/man.opts" ]; then
	echo "help_vs_man: no options found in the OPTIONS section of '$scd'" >&2
	exit 1
fi

if ! cmp -s "$tmp/help.opts" "$tmp/man.opts"; then
	echo "help_vs_man: --help and $scd list different options" >&2
	comm -23 "$tmp/help.opts" "$tmp/man.opts" | sed 's/^/  only in --help: /' >&2
	comm -13 "$tmp/help.opts" "$tmp/man.opts" | sed 's/^/  only in the man page: /' >&2
	exit 1
fi
echo "help_vs_man: $(wc -l <"$tmp/help.opts") options, same set"
