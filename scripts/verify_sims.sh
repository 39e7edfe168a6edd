#!/usr/bin/env bash
# Replays the shipped op traces with --verify under every policy at budget
# ratios 0.3 to 0.9 (live accounting) and fails on any byte mismatch or error.
# A run that ends in oom or thrash is a result, not a failure; it is listed.
#   ./scripts/verify_sims.sh [path/to/remat]
set -euo pipefail
cd "$(dirname "$0")/.."
remat=${1:-build/bin/remat}
traces=("examples/traces/chain_100.jsonl:64" "examples/traces/transformer_small.jsonl:256"
        "examples/traces/gpt_tiny_l1_d32_s16_b2_v64.jsonl:1"
        "examples/traces/lstm_tiny_h64_s8_b8_v64.jsonl:1")
failures=0
for entry in "${traces[@]}"; do
  trace=${entry%%:*}
  scale=${entry##*:}
  for policy in lru largest dtr dtr-eq dtr-local msps megengine window hybrid belady; do
    for ratio in 0.3 0.4 0.5 0.6 0.7 0.8 0.9; do
      # Exit 3: the run did not fit (oom or thrash), a result like any other.
      rc=0
      out=$("$remat" sim "$trace" --budget-ratio "$ratio" --accounting live --policy "$policy" \
          --verify --scale "$scale" --thrash-limit 100 --json) || rc=$?
      if ((rc != 0 && rc != 3)); then
        echo "FAIL $trace $policy $ratio (exit $rc): $out"
        failures=$((failures + 1))
        continue
      fi
      python3 - "$trace" "$policy" "$ratio" "$out" <<'PY'
import json, sys
trace, policy, ratio, text = sys.argv[1:]
r = json.loads(text)
overhead = "-" if r["overhead"] is None else f"{r['overhead']:.3f}"
print(f"{trace.split('/')[-1]:26} {policy:8} {ratio:4} {r['status']:7} overhead {overhead:>5} "
      f"verified {r['verified_accesses']:6} mismatches {r['mismatches']}")
sys.exit(1 if r["mismatches"] else 0)
PY
    done
  done
done
if ((failures > 0)); then
  echo "verify_sims: $failures failures"
  exit 1
fi
