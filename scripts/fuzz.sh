#!/usr/bin/env bash
# Runs every libFuzzer target for a while, one after another, with clang's
# fully instrumented build (build-fuzz): the RMM log and op-trace parsers, the
# text parsers (sizes, policy specs), the allocator's public surface and the
# C ABI runtime.
#
#   ./scripts/fuzz.sh [MINUTES_EACH]     default 60 (one CPU hour each)
#
# Crashes are written under fuzz-out/<target>/ with the corpus it grew; the
# summary at the end says, per target, the runs made and the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-60}
if ! [[ $minutes =~ ^[0-9]+$ ]] || ((minutes == 0)); then
  echo "usage: $0 [MINUTES_EACH]  (a whole number of minutes, at least 1)" >&2
  exit 2
fi
./scripts/install_deps.sh clang libclang-rt-14-dev
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_FUZZ=ON \
  -DREMAT_BUILD_BENCH=OFF -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_TOOLS=OFF -DREMAT_CUDA=OFF >/dev/null
targets=(rmm_log_fuzzer op_trace_fuzzer text_parsers_fuzzer allocator_fuzzer c_api_fuzzer)
cmake --build build-fuzz -j"${REMAT_JOBS:-2}" --target "${targets[@]}"
summary=()
for t in "${targets[@]}"; do
  dir=fuzz-out/$t
  mkdir -p "$dir/corpus"
  case $t in
    rmm_log_fuzzer) cp -n tests/fuzz/corpus/rmm_log/* "$dir/corpus/" ;;
    op_trace_fuzzer)
      for f in examples/traces/*.jsonl; do head -n 40 "$f" >"$dir/corpus/$(basename "$f")"; done
      cp -n tests/fuzz/corpus/op_trace/* "$dir/corpus/" ;;
  esac
  echo "== $t for $minutes min"
  if "./build-fuzz/bin/$t" -max_total_time=$((minutes * 60)) -rss_limit_mb=4096 \
      -artifact_prefix="$dir/" "$dir/corpus" >"$dir/log.txt" 2>&1; then
    outcome="no crash"
  else
    outcome="FAILED (see $dir/log.txt and the crash-* file beside it)"
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$dir/log.txt" | tail -1 || true)
  summary+=("$t: ${runs:-?}, $outcome")
done
printf '%s\n' "${summary[@]}"
