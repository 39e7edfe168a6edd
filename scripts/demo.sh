#!/usr/bin/env bash
# Builds Release and runs the main job: replays a shipped allocation trace of a
# training step through the caching allocator, without and with a budget; then
# a transformer step's op trace through the runtime on 60% of its memory.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_TOOLS=ON > /dev/null
cmake --build build-release -j"${REMAT_JOBS:-2}" --target remat
trace=examples/traces/training_step.csv
echo "== remat replay $trace"
./build-release/bin/remat replay "$trace"
echo
echo "== the same step on a GPU capped at 3 GiB"
./build-release/bin/remat replay "$trace" --budget 3GiB

echo
echo "== a small transformer step through the runtime on 60% of its memory (dtr, bytes verified)"
./build-release/bin/remat sim examples/traces/transformer_small.jsonl --budget-ratio 0.6 \
  --accounting live --policy dtr --verify --scale 256
