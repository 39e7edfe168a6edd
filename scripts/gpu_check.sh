#!/usr/bin/env bash
# The checks that need a real GPU, in one run: the gpu-labelled tests, the
# preload shim under real CUDA programs (our probes and PyTorch), the PyTorch
# integrations (remat.torch.budget's tests and benchmark among them), cuda_bench,
# and a PyTorch GPT-2 memory reference.
#
#   ./scripts/gpu_check.sh [BUILD_DIR [OUT_DIR]]
#
# BUILD_DIR (default build) must hold a Release or RelWithDebInfo build with
# tests: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build
# Logs, JSON and a summary go to OUT_DIR (default gpu-out). Every step runs
# under a time limit and the script goes on past a failure; its exit status is
# the number of failed steps (and of steps GPU_CHECK_SECONDS left no time for).
# Needs python3 with torch (and transformers for the GPT-2 steps); without them
# those steps are reported as skipped.
# GPU_CHECK_ONLY="step step..." runs only those steps. GPU_CHECK_SECONDS caps
# the whole run: each step gets what is left of it (a step with under 10 s left
# is skipped, and says so), so a short lease still gets the script's summary
# and logs back.
# GPU_CHECK_TAR=FILE packs OUT_DIR's logs and tables into FILE (.tar.gz) at the
# end (snapshot pickles left out), for a machine that hands back few files.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
out=$(realpath -m "${2:-gpu-out}")
mkdir -p "$out"
# Shared libraries carried beside a build made on another machine (optional).
if [[ -d .devlibs ]]; then export LD_LIBRARY_PATH=$PWD/.devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
summary=$out/summary.txt
: >"$summary"
failed=0
out_of_time=0
if [[ ! ${GPU_CHECK_SECONDS:-1000000} =~ ^[0-9]+$ ]]; then
  echo "GPU_CHECK_SECONDS must be a whole number of seconds, not '$GPU_CHECK_SECONDS'" >&2
  exit 2
fi
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-1000000}))

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  # GPU_CHECK_ONLY="a b": run only the steps named (a rerun of what failed).
  if [[ -n ${GPU_CHECK_ONLY:-} && " $GPU_CHECK_ONLY " != *" $name "* ]]; then return; fi
  local left=$((deadline - SECONDS))
  if ((left < 10)); then
    printf '%-22s %-12s\n' "$name" "skip: GPU_CHECK_SECONDS spent" | tee -a "$summary"
    out_of_time=$((out_of_time + 1))
    return
  fi
  ((limit > left - 5)) && limit=$((left - 5))
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  local verdict=pass
  if ((rc == 77)); then
    verdict=skip
  elif ((rc != 0)) || grep -q "ERROR OCCURRED" "$out/$name.log"; then
    verdict="FAIL rc=$rc"
    failed=$((failed + 1))
  elif grep -q "^\[  SKIPPED \]" "$out/$name.log"; then
    verdict="pass, skips"  # a test skipped (no device, or one it needs): read the log
  fi
  printf '%-22s %-12s %4ss\n' "$name" "$verdict" "$took" | tee -a "$summary"
  if [[ $verdict == FAIL* ]]; then tail -n 25 "$out/$name.log"; fi
}

have_torch() { python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; }
torch_or_skip() { have_torch || { echo "no torch with CUDA"; exit 77; }; }
export -f have_torch torch_or_skip

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
} | tee "$out/machine.txt"

step cuda_device_test 90 "$build/bin/cuda_device_test" --gtest_brief=1
step runtime_cuda_test 120 "$build/bin/runtime_cuda_test" --gtest_brief=1 --gtest_repeat=3
grep -h "SKIPPED\|Skipped" "$out"/cuda_device_test.log "$out"/runtime_cuda_test.log 2>/dev/null | head -5

# The preload shim under real CUDA: the runtime API probe and the driver API
# probe, each with a budget the shim must enforce.
probe_budget=$((256 * 1024 * 1024))
step preload_runtime_probe 45 "$build/bin/remat" run --device cuda --budget "$probe_budget" \
  --trace "$out/probe.csv" --stats -- "$build/bin/preload_runtime_probe" "$probe_budget"
step preload_driver_probe 45 "$build/bin/remat" run --device cuda --budget "$probe_budget" \
  -- "$build/bin/preload_driver_probe" "$probe_budget"

# An unmodified PyTorch program under the shim: its caching allocator's
# cudaMalloc calls go through remat, capped by the budget.
cat >"$out/torch_mlp.py" <<'EOF'
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096)).cuda()
opt = torch.optim.AdamW(m.parameters())
for _ in range(10):
    loss = m(torch.randn(2048, 4096, device="cuda")).square().mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"loss {loss.item():.6f} peak {torch.cuda.max_memory_reserved() / 2**20:.0f} MiB; "
      f"mem_get_info total {total / 2**30:.2f} GiB")
EOF
step torch_preload 90 bash -c "torch_or_skip; '$build/bin/remat' run --device cuda --budget 4GiB \
  --stats --trace '$out/torch_mlp.csv' -- python3 '$out/torch_mlp.py' && \
  '$build/bin/remat' replay '$out/torch_mlp.csv' --json"

export REMAT_TORCH_LIB=$build/lib/libremat_torch.so REMAT_LIB=$build/lib/libremat.so
step torch_pluggable 60 bash -c "torch_or_skip; REMAT_STATS=1 python3 examples/torch_pluggable.py --mode process"
step torch_mempool 60 bash -c "torch_or_skip; python3 examples/torch_pluggable.py --mode mempool"
step torch_offload_hooks 60 bash -c "torch_or_skip; python3 examples/torch_offload_hooks.py --device cuda"
step torch_offload_hooks_64 60 bash -c "torch_or_skip; python3 examples/torch_offload_hooks.py --device cuda --budget-mib 64"

# remat.torch.budget on the GPU: its tests (gradients equal to plain CUDA steps, with
# drops, offloads and both; offloads copied by the Python recorder, the default with a
# GPU, and by the native step, native=True), then the side-by-side benchmark (the three
# figures).
export REMAT_LIBRARY="$build/lib/libremat.so"
step torch_budget_tests 240 bash -c "torch_or_skip; python3 -c 'import pytest' || { echo no pytest; exit 77; }; PYTHONPATH=python python3 -m pytest -q -rs -s \
  python/tests/test_budget_cuda.py python/tests/test_budget_allocator.py python/tests/test_budget.py \
  -k 'cuda or mlp or gpt or allocator'"
# The same drop-mode gradients on the Python recorder (drop-only budgets record
# natively by default: the C++ extension, built here against this torch on first use).
step torch_budget_python_cuda 300 bash -c "torch_or_skip; python3 -c 'import pytest' || { echo no pytest; exit 77; }; \
  REMAT_TORCH_NATIVE=0 PYTHONPATH=python python3 -m pytest -q -rs -s python/tests/test_budget_cuda.py -k drop"
# The zoo (remat.torch.testing.zoo: cuDNN's RNNs, SDPA's fused kernels, norms, autocast, ...)
# over budgets of 0.1-1.0 of its saved bytes in each mode, seven steps a cell (the
# offload guard's trial): every cell that runs must give the plain step's gradients.
step torch_zoo 180 bash -c "torch_or_skip; PYTHONPATH=python python3 bench/torch_zoo.py \
  --device cuda --step-ratio 0.1 --steps 7 | tee '$out/torch_zoo_cuda.txt'; exit \${PIPESTATUS[0]}"
# The three figures on the GPU: with remat's allocator as PyTorch's, budgets
# of what the GPU holds; then saved-bytes budgets beside checkpoint,
# save_on_cpu and torch.compile (its activation_memory_budget).
# BENCH_MODELS, BENCH_RATIOS and BENCH_METHODS (the bench's --methods; the
# compile rows go to the compile benchmark only) narrow them for a short lease
# (COMPILE_MODELS and COMPILE_METHODS the compile benchmark alone);
# BENCH_SIZE=small runs the CPU's small models (default large: kernels, not
# Python, set the step time).
# The allocator bench's GPT rows up to remat-drop with every live tensor's
# memory checked (still mapped?) at each step's end and after each pressure
# callback; the first that is not is named with remat's allocator's last
# events at its address. (It found the illegal memory access of
# bench/results/gpu_h200_2026-12-04.md: an out-of-memory's NULL made a tensor
# without memory, in the "fits" trial at x4; remat_malloc now raises.)
step torch_allocator_probe 150 bash -c "torch_or_skip; REMAT_SNAPSHOT='$out/probe_snapshot.pickle' \
  PYTHONPATH=python python3 scripts/torch_allocator_probe.py"
alloc_methods=$(tr , '\n' <<<"${BENCH_METHODS:-}" | grep -v '^compile' | paste -sd, -)
[[ -n ${BENCH_METHODS:-} && -z $alloc_methods ]] && alloc_methods=plain  # compile rows alone
step torch_budget_bench_allocator 240 bash -c "torch_or_skip; PYTHONPATH=python python3 -m remat.torch.bench \
  --device cuda --size \${BENCH_SIZE:-large} --remat-allocator --models \${BENCH_MODELS:-gpt,resnet,lstm} --ratios \${BENCH_RATIOS:-0.3,0.5,0.7} --repeat 3 \
  ${alloc_methods:+--methods $alloc_methods} --markdown '$out/torch_budget_cuda_allocator.md'"
compile_methods=${COMPILE_METHODS:-${BENCH_METHODS:-}}
step torch_budget_bench 300 bash -c "torch_or_skip; PYTHONPATH=python python3 -m remat.torch.bench \
  --device cuda --size \${BENCH_SIZE:-large} --models \${COMPILE_MODELS:-\${BENCH_MODELS:-gpt,resnet,lstm}} \
  --ratios \${BENCH_RATIOS:-0.3,0.5,0.7} --repeat 3 --compile \
  ${compile_methods:+--methods $compile_methods} \
  --markdown '$out/torch_budget_cuda.md'"
# The seeds' table at real size: GPT-2 small (12 layers, 768, sequence 1024),
# ResNet-50 and ViT-B/16 at 224, batch 64, each beside checkpoint, selective
# checkpointing and remat (half the saved bytes, and checkpoint's peak), with
# the longest GPT-2 sequence each fits under the plain step's peak. CI runs
# this same step on the CPU at a tiny size (SEEDS_DEVICE=cpu SEEDS_SIZE=tiny),
# so that it cannot rot.
seeds_guard() {
  if [[ ${SEEDS_DEVICE:-cuda} == cuda ]]; then torch_or_skip; else
    python3 -c 'import torch, torchvision, transformers' || { echo "no torch, torchvision or transformers"; exit 77; }
  fi
}
export -f seeds_guard
step torch_seeds 300 bash -c "seeds_guard; PYTHONPATH=python python3 bench/torch_seeds.py \
  --device \${SEEDS_DEVICE:-cuda} --size \${SEEDS_SIZE:-real} --repeat 3 --longest \
  --longest-step \${SEEDS_LONGEST_STEP:-0} --markdown '$out/torch_seeds.md'"
step cuda_bench 120 "$build/bin/cuda_bench" --benchmark_min_time=0.2 \
  --benchmark_out="$out/cuda_bench.json" --benchmark_out_format=json
step gpt2_memory 90 bash -c "torch_or_skip; python3 bench/torch_gpt2_memory.py"

# An op trace captured from PyTorch on the GPU (costs timed with CUDA events),
# replayed by remat sim: a small MLP, then GPT-2 small at the size remat gen models.
step capture_mlp 90 bash -c "torch_or_skip; python3 tools/capture_torch_trace.py --model mlp \
  --device cuda -o '$out/mlp_torch.jsonl' && '$build/bin/remat' sim '$out/mlp_torch.jsonl' \
  --budget-ratio 0.5 --policy dtr --json"
step capture_gpt2 240 bash -c "torch_or_skip; python3 tools/capture_torch_trace.py --model gpt2 \
  --layers 12 --hidden 768 --heads 12 --seq 1024 --batch 8 --device cuda --dtype bf16 \
  -o '$out/gpt2_torch.jsonl' && '$build/bin/remat' sim '$out/gpt2_torch.jsonl' --budget-ratio 0.5 \
  --policy msps && for r in 0.3 0.5 0.7; do for p in msps dtr hybrid; do \
  '$build/bin/remat' sim '$out/gpt2_torch.jsonl' --budget-ratio \$r --policy \$p --json; done; done"

echo "failed steps: $failed; steps not run for lack of time: $out_of_time" | tee -a "$summary"
if [[ -n ${GPU_CHECK_TAR:-} ]]; then
  tar czf "$GPU_CHECK_TAR" --exclude='*.pickle' -C "$(dirname "$out")" "$(basename "$out")" &&
    echo "packed into $GPU_CHECK_TAR"
fi
exit $((failed + out_of_time))
