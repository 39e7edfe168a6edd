#!/usr/bin/env bash
# Every policy at every live-peak ratio from 0.1 to 0.9 (reserved budget, the sweep's
# defaults otherwise) on the project's traces: the shipped op traces and three generated
# models. Writes OUT/cells.csv (trace,policy,ratio,status,overhead) and each sweep's
# results under OUT/TRACE/. Extra arguments go to every `remat sweep`.
#
#   ./scripts/policy_grid.sh [-b BUILD_DIR] OUT [SWEEP FLAGS...]
#   POLICIES=lru,dtr ./scripts/policy_grid.sh sweep-grid/ --retry-in-one-place
#
# Steps whose live peak is under the allocator's 2 MiB segment (gpt_tiny, lstm_tiny)
# cannot keep a reserved budget below it and are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
if [[ "${1:-}" == "-b" ]]; then build=$2; shift 2; fi
out=${1:?usage: policy_grid.sh [-b BUILD_DIR] OUT [SWEEP FLAGS...]}
shift
remat="$build/bin/remat"
policies=${POLICIES:-lru,largest,dtr,dtr-eq,dtr-local,msps,megengine,window,hybrid,belady}
[[ -e "$out" ]] && { echo "policy_grid.sh: $out exists; name a new directory" >&2; exit 2; }
mkdir -p "$out"
runs=()
for t in examples/traces/*.jsonl; do
  case "$t" in *gpt_tiny*|*lstm_tiny*) continue ;; esac
  runs+=("$(basename "$t" .jsonl)|$t")
done
for spec in gpt2:layers=4 unet resnet; do runs+=("gen_${spec%%:*}|--model=$spec"); done
for r in "${runs[@]}"; do
  name=${r%%|*}
  "$remat" sweep "${r#*|}" --ratios 0.1:0.9:0.1 --policies "$policies" --out "$out/$name" \
    --no-plot "$@" >"$out/$name.log" 2>&1 || { echo "policy_grid.sh: $name failed (see $out/$name.log)" >&2; exit 1; }
done
python3 - "$out" <<'PY'
import csv, os, sys
out = sys.argv[1]
with open(os.path.join(out, "cells.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["trace", "policy", "ratio", "status", "overhead"])
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name, "results.csv")
        if not os.path.isfile(path):
            continue
        for row in csv.DictReader(open(path)):
            w.writerow([name, row["policy"], row["ratio"], row["status"], row["overhead"]])
print("wrote", os.path.join(out, "cells.csv"))
PY
