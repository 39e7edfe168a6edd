#!/usr/bin/env bash
# Builds Release and runs the main job: a sweep of the eviction policies over
# budgets on a generated GPT-2 training step (table, results.csv, overhead.png).
# Before it, the smaller pieces: a shipped allocation trace of a training step
# through the caching allocator, without and with a budget, and a transformer
# step's op trace through the runtime on 60% of its memory, bytes verified.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_TOOLS=ON > /dev/null
cmake --build build-release -j"${REMAT_JOBS:-2}" --target remat
trace=examples/traces/training_step.csv
echo "== remat replay $trace"
./build-release/bin/remat replay "$trace"
echo
echo "== the same step on a GPU capped at 3 GiB, with the allocator alone"
# Exit 3: the step does not fit. The allocator alone can only refuse; the
# runtime (next) evicts instead.
./build-release/bin/remat replay "$trace" --budget 3GiB || [ $? -eq 3 ]
echo "(expected: the allocator alone can only refuse what does not fit; the runtime, next, evicts"
echo " tensors instead, and the sweep at the end shows what that costs in time)"

echo
echo "== a small transformer step through the runtime on 60% of its memory (dtr, bytes verified)"
./build-release/bin/remat sim examples/traces/transformer_small.jsonl --budget-ratio 0.6 \
  --accounting live --policy dtr --verify --scale 256
echo "(--verify is a correctness check: every tensor the runtime dropped or offloaded came back"
echo " with the same bytes. Sizes are scaled down 256x to fit real host memory and costs are not,"
echo " so its overhead and speed are not the model's; the sweep below measures those)"

out=${REMAT_DEMO_OUT:-demo-out}
mkdir -p "$out"
echo
echo "== the main job: every policy at every budget on GPT-2 small (batch 8, seq 1024)"
./build-release/bin/remat gen gpt2:layers=12,hidden=768,heads=12,seq=1024,batch=8 -o "$out/gpt2.jsonl"
./build-release/bin/remat sweep "$out/gpt2.jsonl" --ratios 0.3:0.9:0.1 \
  --policies lru,dtr,dtr-eq,msps,megengine,window,hybrid,belady --out "$out/sweep"
echo "(open $out/sweep/overhead.png; one row per run in $out/sweep/results.csv)"
echo
echo "next: look inside one run with"
echo "  ./build-release/bin/remat sim $out/gpt2.jsonl --budget-ratio 0.5 --policy dtr-eq --timeline run.json"
echo "and open run.json in https://ui.perfetto.dev; or train a PyTorch model under a budget"
echo "(README, Python quick start: remat.torch.budget)."
