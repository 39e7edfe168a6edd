#!/usr/bin/env bash
# Builds Release and runs the main job: replays a shipped allocation trace of a
# training step through the caching allocator, without and with a budget.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_TESTS=OFF > /dev/null
cmake --build build-release -j"${REMAT_JOBS:-2}" --target remat
trace=examples/traces/training_step.csv
echo "== remat replay $trace"
./build-release/bin/remat replay "$trace"
echo
echo "== the same step on a GPU capped at 3 GiB"
./build-release/bin/remat replay "$trace" --budget 3GiB
