#!/usr/bin/env bash
# Fragmentation (1 - peak active / peak reserved) of allocation logs replayed
# with fixed segments and with expandable segments, as a Markdown table: the
# shipped logs, and op traces (shipped and generated) written as logs by
# scripts/op_trace_to_alloc_log.py. "Page floor" is the least fragmentation
# any allocator mapping 2 MiB pages can reach on the log: its peak active bytes
# rounded up to whole pages, 1 - A / (ceil(A / 2 MiB) * 2 MiB). "3 steps" replays
# the log three times as a training loop's steps (`remat replay --steps 3`): the
# last step's figures, placed by what the steps before it learned.
#
#   ./scripts/expandable_table.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
remat="${1:-build}/bin/remat"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
logs=(examples/traces/*.csv)
for t in examples/traces/*.jsonl; do
  name=$(basename "$t" .jsonl)
  python3 scripts/op_trace_to_alloc_log.py "$t" -o "$work/$name.csv" 2>/dev/null
  logs+=("$work/$name.csv")
done
for spec in "gpt2:layers=12,seq=1024,batch=8" "resnet:depth=50,batch=64" "unet:batch=16" "vit:batch=64"; do
  name=${spec%%:*}
  "$remat" gen "$spec" -o "$work/$name.jsonl" >/dev/null
  python3 scripts/op_trace_to_alloc_log.py "$work/$name.jsonl" -o "$work/gen_$name.csv" 2>/dev/null
  logs+=("$work/gen_$name.csv")
done
echo "| log | peak active | fixed: reserved | fixed: fragmentation | expandable: reserved | expandable: fragmentation | expandable, 3 steps: reserved | expandable, 3 steps: fragmentation | page floor | replay k events/s (fixed / expandable) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for log in "${logs[@]}"; do
  fixed=$("$remat" replay "$log" --json)
  expandable=$("$remat" replay "$log" --json --alloc-conf expandable_segments:True)
  steps=$("$remat" replay "$log" --json --alloc-conf expandable_segments:True --steps 3)
  python3 - "$log" "$fixed" "$expandable" "$steps" <<'PY'
import json, os, sys
name = os.path.basename(sys.argv[1])
a, b, c = json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
mib = lambda n: "%.0f MiB" % (n / 2**20)
page = 2 * 2**20
active = b["peak_active_bytes"]
floor = 1 - active / (-(-active // page) * page) if active else 0.0
print("| %s | %s | %s | %.4f | %s | %.4f | %s | %.4f | %.4f | %.0f / %.0f |" % (
    name, mib(active), mib(a["peak_reserved_bytes"]), a["fragmentation"],
    mib(b["peak_reserved_bytes"]), b["fragmentation"],
    mib(c["peak_reserved_bytes"]), c["fragmentation"], floor,
    a["events_per_second"] / 1e3, b["events_per_second"] / 1e3))
PY
done
