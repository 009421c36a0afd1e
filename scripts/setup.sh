#!/usr/bin/env bash
# Installs what dptp needs to build and test, only what is missing, then
# configures ./build. Idempotent. Debian 12 / Ubuntu 24.04, as root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc meson ninja-build pkg-config libpmix-dev libcmocka-dev openmpi-bin libopenmpi-dev python3-mpi4py scdoc python3 iproute2 procps slurmctld slurmd slurm-client munge clang libclang-rt-14-dev valgrind python3-torch)
pkgs+=("$@")
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	sudo=""
	[[ $(id -u) -eq 0 ]] || sudo="sudo"
	echo "dptp: installing ${missing[*]}" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# DPTP_CI=1 (CI): every warning is an error
werror=()
[[ ${DPTP_CI:-} == 1 ]] && werror=(-Dwerror=true)
if [[ ! -f build/build.ninja ]]; then
	meson setup build "${werror[@]}" >/dev/null
elif ((${#werror[@]})); then
	meson configure build "${werror[@]}" >/dev/null
fi
ninja -C build >/dev/null
