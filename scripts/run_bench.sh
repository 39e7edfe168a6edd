#!/usr/bin/env bash
# Builds allocator_bench in Release (in build-release/) and runs it, writing
# the figures to bench/results/:
#
#   allocator_bench_<date>.md           machine, ratio table, floors
#   allocator_bench_<date>.json         Google Benchmark's raw JSON (every repetition)
#   allocator_bench_<date>_ratios.json  the ratio table as JSON (with the context)
#   allocator_bench_<date>_ratios.csv   the ratio table as CSV
#
# Arguments are passed to allocator_bench, e.g.
#   ./scripts/run_bench.sh --benchmark_filter=churn
# Environment: REMAT_BENCH_JOBS (build parallelism, default 2),
# REMAT_BENCH_REPETITIONS (default 5), REMAT_BENCH_BUILD_DIR, REMAT_BENCH_OUT_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${REMAT_BENCH_BUILD_DIR:-$root/build-release}
out=${REMAT_BENCH_OUT_DIR:-$root/bench/results}
jobs=${REMAT_BENCH_JOBS:-2}
reps=${REMAT_BENCH_REPETITIONS:-5}

generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
# No tests; the command-line tool stays on because demo.sh shares this build
# directory (an option set OFF here would stick in its cache).
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DREMAT_BUILD_BENCH=ON -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_TOOLS=ON >/dev/null
cmake --build "$build" --target allocator_bench -j "$jobs"

date=$(date -u +%Y-%m-%d)
stem=$out/allocator_bench_$date
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Repetitions back to back, in the registered order, not randomly interleaved:
# the host allocators' state carries over from one benchmark to the next (a
# heap that `random` grew lets glibc serve 64 MiB without mmap), so a fixed
# order keeps each figure's history, and so the figure, the same from run to run.
status=0
"$build/bin/allocator_bench" \
  --benchmark_repetitions="$reps" \
  --benchmark_out="$stem.json" --benchmark_out_format=json \
  --remat_out="$tmp" "$@" || status=$?

compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
lscpu_field() { lscpu | sed -n "s/^$1:[[:space:]]*//p" | head -1; }
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
# Which sources differ from the commit (the figures belong to the tree as built).
modified=$(git -C "$root" status --porcelain 2>/dev/null | awk '{print $NF}' | grep -v '^bench/results/' | tr '\n' ' ' || true)
if [[ -n $modified ]]; then commit="$commit + uncommitted changes to: $modified"; fi

if [[ -f $tmp/ratios.md ]]; then
  {
    echo "# allocator_bench, $date"
    echo
    echo "## Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| CPU | $(lscpu_field 'Model name') (family $(lscpu_field 'CPU family'), model $(lscpu_field 'Model'), $(lscpu_field 'Vendor ID')) |"
    echo "| CPUs online | $(nproc) ($(lscpu_field 'Core(s) per socket') cores per socket, $(lscpu_field 'Thread(s) per core') thread(s) per core, $(lscpu_field 'Socket(s)') socket(s)) |"
    echo "| hypervisor | $(lscpu_field 'Hypervisor vendor' || true) |"
    echo "| memory | $(free -h | awk '/^Mem:/ {print $2}') |"
    echo "| kernel | $(uname -sr) |"
    echo "| compiler | $("$compiler" --version | head -1) |"
    echo "| build type | $build_type ($build) |"
    echo "| commit | $commit |"
    echo "| command | allocator_bench --benchmark_repetitions=$reps $* |"
    echo
    cat "$tmp/ratios.md"
  } >"$stem.md"
  cp "$tmp/ratios.json" "${stem}_ratios.json"
  cp "$tmp/ratios.csv" "${stem}_ratios.csv"
  echo "wrote $stem.md, $stem.json, ${stem}_ratios.{json,csv}"
fi
exit "$status"
