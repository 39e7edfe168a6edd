// Op-trace replay: a training step's ops driven through the real Runtime and
// CachingAllocator on a SimDevice, under a budget and an eviction policy.
//
// Each call runs its cost_ns of work on the compute stream; its outputs are
// runtime tensors whose recompute closure re-runs the call on its inputs.
// Copies cost bytes / link bandwidth + latency; restores on access run on
// the compute stream (the wait is stall time), offloads on the runtime's copy
// stream and overlap with compute. Time is the device's virtual clock, so a
// run is deterministic.
//
// With `verify`, the device keeps real bytes (sizes divided by `scale`): every
// call writes bytes computed from its inputs' bytes and its own identity, and
// every later read checks them against a checksum taken when the tensor was
// first produced.
//
// With `timeline`, the run is also recorded as a Chrome trace of the
// simulated time (sim/sim_timeline.h). Without it nothing is recorded: the
// recording hooks live in a separate instantiation of the replayer, so a
// plain run pays nothing for them.
#ifndef REMAT_SIM_OP_REPLAY_H_
#define REMAT_SIM_OP_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/units.h"
#include "policies/registry.h"
#include "trace/op_trace.h"

namespace remat {

class SimTimeline;

// Under a reserved budget the replay's allocator splits no block above this
// by default. Splitting a huge free block (a 768 MiB logits buffer) for small
// tensors that then outlive it leaves holes that no large request fits, and
// under a budget every such hole costs evictions; PyTorch users set
// max_split_size_mb for the same reason. GPT-2 small at half its peak:
// 1.20x overhead without the limit, 1.12x with it (bench/results).
inline constexpr std::size_t kBudgetedMaxSplit = 64 * kMiB;
// A run that did not finish, placed anywhere or in one place, runs again
// with the split limit halved, up to this many times (64, then 32, then 16
// MiB): a small tensor regenerated into a large tensor's old block can leave
// the next large request no room (bench/results/split_limit_fallback_2026-12-07.md).
inline constexpr std::size_t kBudgetedSplitHalvings = 2;

// Every replay ends: its runtime takes at most MaxSteps(records, thrash
// limit) steps (pressure events plus recomputes) before the run stops as
// thrash, whatever the policy does. A replay that stays within the thrash
// limit needs far fewer: a few pressure events and recomputes per record.
inline constexpr double kStepsPerRecord = 64;
std::uint64_t MaxSteps(std::uint64_t records, double thrash_limit);

// What a policy that reads next uses (belady, hybrid) is told of the future:
// kKnown, the trace's own next uses (a replay knows them); kLearned, what
// the runtime estimated from the step before (RuntimeOptions::learn_next_use):
// the trace is replayed twice in one runtime, a first step that learns
// and the step reported (every figure is the second step's, except the
// verify counts, which cover both, and the runtime's step bound, which the
// two share); kNone, nothing (an online run's first step).
enum class Future : std::uint8_t { kKnown, kLearned, kNone };
// The learning step's thrash limit, as a multiple of the reported step's.
inline constexpr double kLearningThrashFactor = 100;
// "known", "learned" or "none"; anything else is InvalidArgument.
absl::StatusOr<Future> ParseFuture(std::string_view text);
const char* FutureName(Future future);

struct OpReplayOptions {
  std::size_t budget = 0;       // cap on reserved bytes (0: none)
  std::size_t live_budget = 0;  // cap on resident tensor bytes (0: none)
  // Blocks above this are never split. 0: kBudgetedMaxSplit when `budget` is
  // set, else no limit; SIZE_MAX: no limit.
  std::size_t max_split_size = 0;
  // Allocator settings with PyTorch's keys (allocator/alloc_conf.h), applied
  // after max_split_size (its max_split_size_mb wins).
  std::string alloc_conf;
  policies::PolicySpec policy;  // "dtr" unless set; a bad spec is the replay's error
  // The host link: one copy engine each way, each at link_gbps, with
  // link_latency_ns per copy (SimCostModel); host_memory is the pinned host
  // memory offloads may hold, a budget of its own.
  double link_gbps = 25.0;
  std::int64_t link_latency_ns = 2000;
  std::uint64_t host_memory = 64 * kGiB;
  bool enable_drop = true;
  bool enable_offload = true;
  // With drops and offloads both allowed under a budget: the step is also
  // replayed with drops only, and the report is the cheaper of the two runs
  // (a finished run before one that did not, then the shorter time), so that
  // allowing offload never makes a run worse than the same policy without
  // it. OpReplayReport::plan says which was kept. A framework gets the same
  // by running one training iteration each way (the steps repeat).
  bool offload_guard = true;
  // RuntimeOptions::retry_in_one_place: a request the policy's plan would
  // not make room for is met in one place.
  bool retry_in_one_place = false;
  // Under a reserved budget, a run that did not finish (oom or thrash)
  // runs again meeting each request in one place (the step planner's
  // in_one_place_after_failure); OpReplayReport::in_one_place says so.
  // Still not finishing, it runs again with the split limit halved, up to
  // kBudgetedSplitHalvings times, where max_split_size and alloc_conf are
  // left unset (OpReplayReport::max_split_bytes says which limit ran).
  bool in_one_place_after_failure = true;
  // Under a reserved budget, a call whose outputs find no room beside its
  // inputs (which it holds while it runs) is made again the other way round:
  // its inputs let go, its outputs made, its inputs brought back. Inputs
  // spread over pages or segments can leave none of them free to give,
  // though inputs and outputs together fit the budget: an LSTM's 128 hidden
  // states, 64 KiB each and a few to every small-pool segment, left its
  // `stack` no 8 MiB however much else was evicted. A framework that makes
  // a call's outputs before it runs the call can do the same (not the
  // PyTorch door: a kernel makes its outputs itself). The first try's work
  // (inputs brought back, evictions) is charged, and each input brought back
  // again counts as a use (learned next uses see it twice).
  // OpReplayReport::outputs_first counts the calls made so, finished or not;
  // where the second way fails too, the error is the first's, then the
  // second's.
  bool outputs_first_after_oom = true;
  // RuntimeOptions::keep_regenerated: a released tensor a regeneration
  // brought back stays while a dropped consumer the program holds needs it.
  bool keep_regenerated = true;
  // RuntimeOptions::copy_ahead: copies out started before the pressure that
  // offloads them (a trace's tensors are read_only). With offload allowed it
  // helps where the link has time to spare
  // (bench/results/copy_ahead_2026-12-03.md).
  bool copy_ahead = true;
  double thrash_limit = 1.0;  // stop when recompute exceeds this x the trace's compute
  // Stop, with status "beaten", once the reported step has run this long in
  // simulated time (0: never): such a run cannot be the cheapest of several.
  // ReplayOpTrace sets it for a policy's trials: the best finished time of
  // the run's kind (mixed or drop-only) so far.
  std::int64_t beaten_after_ns = 0;
  bool verify = false;
  // After every record, the allocator's and the runtime's CheckInvariants():
  // a broken one is the replay's error (kInternal, "a broken invariant after
  // this record: ..."), naming the line (for fuzzers and tests; linear in the
  // blocks and tensors per record).
  bool check_invariants = false;
  // In verify mode the checks are host work queued on the simulated streams,
  // run only when the host waits. When this many are queued the host waits
  // for the device (Synchronize), which bounds memory (each queued check
  // holds a few hundred bytes) and shifts the simulated time as any wait
  // does: verify mode's times are not the model's.
  std::size_t verify_queue_limit = std::size_t{1} << 16;
  // For tests that the checks catch a bad byte: in verify mode, the first
  // this many copies back to the device arrive with a byte flipped.
  int corrupt_copies_in = 0;
  std::uint64_t scale = 1;  // divide every size by this (rounded up)
  // When set: cleared, then filled with the run's timeline (not with
  // Future::kLearned).
  SimTimeline* timeline = nullptr;
  Future future = Future::kKnown;
};

// What a budget counts: the allocator's reserved bytes (segments, cache and
// fragmentation included: what the device gives), or the runtime's live
// bytes (resident tensors only: the DTR simulator's accounting).
enum class Accounting : std::uint8_t { kReserved, kLive };

// "reserved" or "live"; anything else is InvalidArgument.
absl::StatusOr<Accounting> ParseAccounting(std::string_view text);
const char* AccountingName(Accounting accounting);

struct OpReplayReport;

// A replay's memory budget, one way for every tool (sim, sweep, tests).
struct MemoryBudget {
  std::uint64_t bytes = 0;
  Accounting accounting = Accounting::kReserved;

  // `ratio` of the unlimited run's peak in the same accounting (peak live
  // or peak reserved bytes), rounded down.
  static MemoryBudget FromRatio(double ratio, const OpReplayReport& unlimited,
                                Accounting accounting);
  // InvalidArgument where the replay could not honour it: a reserved budget
  // below the allocator's smallest segment (2 MiB), which ApplyTo would raise.
  absl::Status Check() const;
  // Sets the options' budget: `live_budget` (at least 1 byte), or the
  // allocator's `budget` (at least its smallest segment, 2 MiB: see Check).
  void ApplyTo(OpReplayOptions& options) const;
};

// The split limit the replay's allocator gets from `options` (SIZE_MAX: none).
std::size_t EffectiveMaxSplit(const OpReplayOptions& options);

struct OpReplayReport {
  // "ok", "oom" (nothing left to evict), "thrash", or "beaten" (stopped at
  // OpReplayOptions::beaten_after_ns: of a trial not kept, in other_plan_status)
  std::string status;
  std::string message;  // why, when not ok
  std::string policy;
  std::uint64_t budget_bytes = 0;
  std::uint64_t max_split_bytes = 0;  // the allocator's split limit (0: none)
  std::string alloc_conf;             // the allocator settings string, as given
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_live_bytes = 0;
  std::int64_t compute_ns = 0;  // the trace's own compute (sum of cost_ns)
  std::int64_t time_ns = 0;     // simulated time of the whole step
  std::uint64_t records = 0;    // trace records replayed
  std::uint64_t recomputed_ops = 0;
  std::int64_t recompute_ns = 0;
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t restored_bytes = 0;
  std::int64_t stall_ns = 0;  // time the compute stream spent neither computing nor recomputing
  std::uint64_t evictions = 0;
  // Of those, asked for by the trace's evict records; and the evict records
  // skipped (the storage was not on the device, or the run does not allow
  // the action).
  std::uint64_t directed_evictions = 0;
  std::uint64_t skipped_evicts = 0;
  std::uint64_t pressure_events = 0;  // times the runtime asked the policy for a plan
  std::uint64_t covering_runs = 0;    // of those, met by a covering run (retry_in_one_place)
  std::uint64_t outputs_first = 0;    // calls tried outputs first (outputs_first_after_oom)
  // copy_ahead: copies out made ahead, the offloads that used one, and their bytes.
  std::uint64_t copies_ahead = 0;
  std::uint64_t ahead_offloads = 0;
  std::uint64_t copied_ahead_bytes = 0;
  std::uint64_t candidates_shown = 0;  // candidates handed to the policy, over all events
  std::int64_t choose_wall_ns = 0;     // host time building candidates and choosing
  std::uint64_t verified_accesses = 0;
  std::uint64_t verify_waits = 0;  // times the host waited to run queued checks
  std::uint64_t mismatches = 0;
  // With more than one run (the offload guard, or a policy's trials): the
  // kind of run kept, "mixed" (drops and offloads, as the policy chose) or
  // "drop-only" (empty when offload was not allowed); the best run of the
  // other kind's status and time; how many runs were made; and, with trials,
  // the spec of the run kept where it is not the policy asked for (hybrid
  // over window's ranking: "hybrid:...,rank=window,..." or "window" for its
  // drop-only run). Every other field is the kept run's, except
  // wall_seconds (all runs) and, in verify mode, the verified accesses, the
  // verify waits and the mismatches (all runs: a mismatch in any counts).
  std::string plan;
  std::size_t trials = 1;
  // The run met each request in one place: asked (retry_in_one_place), or
  // under a reserved budget after the same run, placed anywhere, did not
  // finish.
  bool in_one_place = false;
  // Under a reserved budget, how many times the run's split limit was halved
  // after runs with the higher limits did not finish
  // (OpReplayOptions::in_one_place_after_failure); max_split_bytes is the
  // limit it ran with.
  std::size_t split_halvings = 0;
  std::string kept_policy;
  std::string future;  // FutureName(options.future)
  std::string other_plan_status;
  std::int64_t other_plan_time_ns = 0;
  double wall_seconds = 0;    // the whole run, set-up included
  double replay_seconds = 0;  // the record loop alone (what records per second divides by)
};

absl::StatusOr<OpReplayReport> ReplayOpTrace(const OpTrace& trace, const OpReplayOptions& options);

}  // namespace remat

#endif  // REMAT_SIM_OP_REPLAY_H_
