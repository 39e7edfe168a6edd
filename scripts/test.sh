#!/usr/bin/env bash
# Builds into build/ and runs the default (fast) test suite.
#   ./scripts/test.sh              everything labelled fast
#   ./scripts/test.sh -L slow      extra ctest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
jobs=${REMAT_JOBS:-2}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$jobs"
if (($# == 0)); then
  set -- -L fast
fi
ctest --test-dir build --output-on-failure -j"$jobs" "$@"
