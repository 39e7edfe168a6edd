#!/usr/bin/env bash
# Instructions per allocate+free pair on remat's CachingAllocator, counted by
# callgrind (deterministic, unlike time on a shared machine). Runs
# alloc_pairs with N and 2N pairs and prints (Ir(2N) - Ir(N)) / N, so set-up
# and tear-down cancel out.
#
#   scripts/alloc_instructions.sh [BUILD_DIR] [SIZE] [N]
#   (defaults: build-release, 4096, 100000)
set -euo pipefail
build=${1:-build-release}
size=${2:-4096}
n=${3:-100000}
bin="$build/bin/alloc_pairs"
if [[ ! -x "$bin" ]]; then
  echo "alloc_instructions: $bin is missing (cmake --build $build --target alloc_pairs)" >&2
  exit 2
fi
command -v valgrind > /dev/null || { echo "alloc_instructions: valgrind is not installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count() {
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$bin" "$1" "$size" \
    2> "$tmp/log.$1" || { cat "$tmp/log.$1" >&2; exit 1; }
  sed -n 's/^summary: *//p' "$tmp/cg.$1"
}
one=$(count "$n")
two=$(count $((2 * n)))
awk -v a="$one" -v b="$two" -v n="$n" -v s="$size" \
  'BEGIN { printf "%.1f instructions per allocate+free pair of %d B (callgrind, %d pairs)\n", (b - a) / n, s, n }'
