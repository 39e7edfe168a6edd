#!/usr/bin/env bash
# Runs the probes under `remat run --device sim`, then replays the trace the
# runtime probe left. Usage:
#   run_probes.sh REMAT RUNTIME_PROBE DRIVER_PROBE WORKDIR PTSZ_PROBE [SANITIZED_PROBE...]
# (PTSZ_PROBE: the runtime probe built with the per-thread default stream;
# SANITIZED_PROBE: built with ASan or TSan.)
set -euo pipefail
remat=$1 runtime_probe=$2 driver_probe=$3 work=$4 ptsz_probe=$5
shift 5
sanitized_probes=("$@")
mkdir -p "$work"
budget=$((64 * 1024 * 1024))

"$remat" run --device sim --budget "$budget" --trace "$work/probe.csv" --stats -- \
  "$runtime_probe" "$budget"
"$remat" run --device sim --budget "$budget" -- "$driver_probe" "$budget"
"$remat" run --device sim --budget "$budget" -- "$ptsz_probe" "$budget"

# Sanitized programs: remat run puts the sanitizer's runtime first in
# LD_PRELOAD, and the shim starts before the sanitizer's interceptors work.
# Any sanitizer report fails the run (the fork test's child inherits a
# finished thread: not a leak of the program under test).
for probe in "${sanitized_probes[@]}"; do
  ASAN_OPTIONS=halt_on_error=1 TSAN_OPTIONS="halt_on_error=1 report_thread_leaks=0" \
    "$remat" run --device sim --budget "$budget" -- "$probe" "$budget"
done
# The shim preloaded by hand after a sanitizer runtime, in an uninstrumented program.
shim="$(dirname "$remat")/../lib/libremat_preload.so"
for probe in "${sanitized_probes[@]}"; do
  runtime=$(ldd "$probe" | awk '/lib(a|t)san\.so/ {print $3; exit}')
  [[ -n "$runtime" ]] || continue
  LD_PRELOAD="$runtime:$shim" /bin/true || { echo "the shim after $runtime crashed /bin/true"; exit 1; }
done

# The trace replays through the allocator; its allocation failures are in it.
"$remat" replay "$work/probe.csv" --budget "$budget" --json > "$work/replay.json"
grep -q '"alloc_failures_in_log":[1-9]' "$work/replay.json" || {
  echo "the replayed trace lost its allocation failures:"; cat "$work/replay.json"; exit 1; }

# Programs a shell starts each write their own trace (FILE.<pid>), never over each other.
rm -f "$work"/shell.csv*
"$remat" run --device sim --budget "$budget" --trace "$work/shell.csv" -- \
  sh -c "'$driver_probe' $budget >/dev/null 2>&1; '$driver_probe' $budget >/dev/null 2>&1"
traces=$(ls "$work"/shell.csv.* 2>/dev/null | wc -l)
[[ $traces -eq 2 ]] || { echo "expected two per-process traces, found $traces"; ls "$work"; exit 1; }

# The program's exit status comes through, and signals as 128+N.
set +e
"$remat" run --device sim -- sh -c 'exit 7'; [[ $? -eq 7 ]] || { echo "exit status lost"; exit 1; }
"$remat" run --device sim -- sh -c 'kill -TERM $$'; [[ $? -eq 143 ]] || { echo "signal lost"; exit 1; }
"$remat" run --device sim -- /nonexistent/program 2>/dev/null; [[ $? -eq 127 ]] || {
  echo "a missing program should exit 127"; exit 1; }
set -e
echo "preload probes: all passed"
