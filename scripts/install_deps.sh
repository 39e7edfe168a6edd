#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages remat builds with that this
# machine lacks, plus any packages named as arguments (CI adds clang for the
# fuzzers). Installed packages are left alone; nothing is installed by hand.
set -euo pipefail

packages=(
  cmake g++ make pkg-config python3
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libjemalloc-dev libmimalloc-dev libcli11-dev libsimdjson-dev
  python3-matplotlib  # remat sweep's plot
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
