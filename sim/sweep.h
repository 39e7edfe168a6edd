// A policy sweep: every policy at every budget ratio over one op trace, run
// in parallel, with the table and the CSV that `remat sweep` prints and writes.
//
// Each run is a ReplayOpTrace of its own (its own device, allocator and
// runtime), so runs share nothing but the parsed trace. Budgets are ratios of
// the peak of one unlimited replay, in reserved or live bytes, as in `remat sim`.
#ifndef REMAT_SIM_SWEEP_H_
#define REMAT_SIM_SWEEP_H_

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/registry.h"
#include "sim/op_replay.h"
#include "trace/op_trace.h"

namespace remat {

struct SweepOptions {
  std::vector<double> ratios;
  std::vector<policies::PolicySpec> policies;  // each must be ok
  bool live = false;  // budget on live tensor bytes (else the allocator's reserved bytes)
  bool enable_drop = true;
  bool enable_offload = true;
  bool offload_guard = true;  // as OpReplayOptions::offload_guard
  bool retry_in_one_place = false;  // OpReplayOptions::retry_in_one_place
  bool in_one_place_after_failure = true;  // OpReplayOptions::in_one_place_after_failure
  bool keep_regenerated = true;     // OpReplayOptions::keep_regenerated
  bool outputs_first_after_oom = true;  // OpReplayOptions::outputs_first_after_oom
  bool copy_ahead = true;          // OpReplayOptions::copy_ahead
  Future future = Future::kKnown;  // as OpReplayOptions::future (budgeted runs)
  double link_gbps = 25.0;
  std::int64_t link_latency_ns = 2000;       // as OpReplayOptions
  std::uint64_t host_memory = 64ull << 30;   // as OpReplayOptions
  double thrash_limit = 1.0;
  std::size_t max_split_size = 0;  // as OpReplayOptions::max_split_size
  std::string alloc_conf;          // as OpReplayOptions::alloc_conf (budgeted runs only)
  int jobs = 1;
  // Called (from one thread at a time) after each run.
  std::function<void(std::size_t done, std::size_t total, const struct SweepRow& row)> progress;
};

struct SweepRow {
  std::string policy;  // the spec as given (a column of the table)
  double ratio = 0;
  std::uint64_t budget = 0;
  OpReplayReport report;
};

struct SweepResult {
  std::string trace;
  bool live = false;
  OpReplayReport baseline;  // the unlimited run
  std::vector<SweepRow> rows;  // policy-major, in the order asked for
  double Overhead(const SweepRow& row) const;
};

// "0.2:0.9:0.1" (from:to:step, both ends included) or "0.3,0.5,0.7".
absl::StatusOr<std::vector<double>> ParseRatios(std::string_view text);

// Every policy spec must be ok (a bad one is its error, before anything runs).
absl::StatusOr<SweepResult> RunSweep(const OpTrace& trace, const SweepOptions& options);

// A replayed plan may recompute ahead of the calls that pay for it: its
// thrash limit is at least this (the plan is finite; the limit only stops a
// policy's cascade where the plan did not hold).
inline constexpr double kPlanThrashLimit = 100;

// Replays `planned` (an op trace whose evict and prefetch records carry out a
// plan: python -m remat.optimal --plan-out) under `budget` bytes in the
// sweep's accounting, with the sweep's settings; `fallback` meets any
// pressure the plan did not foresee.
absl::StatusOr<OpReplayReport> ReplayPlan(const OpTrace& planned, const SweepOptions& options,
                                          std::uint64_t budget,
                                          const policies::PolicySpec& fallback);

// One row per run: trace, policy, accounting, ratio, then `remat sim --json`'s fields.
std::string SweepCsv(const SweepResult& result);
// Overhead by ratio (rows) and policy (columns); the best of each row marked
// with *; failed runs show their status. With `plans` (a cell per ratio), a
// column "plan" shows them (the solver's plan, replayed: a real run); with
// `bounds`, a last column "bound" (remat.optimal's lower bound).
std::string SweepTable(const SweepResult& result,
                       const std::map<double, std::string>* bounds = nullptr,
                       const std::map<double, std::string>* plans = nullptr);
// What the sweep shows, in a sentence or two: the smallest budget some policy
// ran in, with the best policy there and its cost in time, and the best at
// about half the memory; or that nothing ran.
std::string SweepConclusion(const SweepResult& result);
// A matplotlib script drawing overhead against budget ratio, one line per
// policy, failures marked, from the CSV; `script_path` is where it will live.
std::string SweepPlotScript(const std::string& csv_path, const std::string& png_path,
                            const std::string& script_path);

}  // namespace remat

#endif  // REMAT_SIM_SWEEP_H_
