// StepPlanner: which plan each training step runs under a budget, and which
// plan the budget keeps.
//
// A budget may be met more than one way: a policy's mixed plan (drops and
// offloads as it chooses), drops first (offload only what cannot be
// dropped), or several policies. Which is quickest depends on the model, the
// budget and the link, so the first steps are a trial: each plan in turn
// runs `learning_steps` steps (untimed: its runtime learns the step's next
// uses) and then `timed_steps` timed ones, and the budget keeps the plan
// whose quickest timed step was quickest (a tie keeps the plan listed
// first). A trial step that did not fit the budget takes its plan out of the
// trial while another plan is left; the last plan left stays, and its steps
// say the budget is too small.
//
// After the trial, a step that does not fit on a runtime that has learned
// from the steps before it (next uses: a policy such as belady reads them)
// makes its plan "blind": each later step starts its runtime afresh, as the
// first step, which did fit, did.
//
// Steps also learn, by tensor kind (the door's key for "the same tensor in
// every step": the op that made it, which of its outputs, how many such the
// step had made before it), what a plan that may both drop and offload needs
// to admit a drop:
//   - replays: per plan, the largest tensor of each kind whose replay came
//     back, and the smallest whose replay could not fit. A step with a
//     failed replay makes the next steps forget what fit (what they drop
//     changes, so what their replays need does); a runtime's first,
//     blind-made step teaches only its failures.
//   - pinned: for all plans, the most bytes a step's backward held pinned
//     beside each kind as it read it, and what was pinned beside the
//     largest such tensor. A larger tensor than any seen is read beside that
//     figure scaled up to its size (never less than the most seen).
// What a step saw (SawReplay, SawPinned) joins the books when it ends: a
// step that fit teaches both; one that did not fit (its plan still in the
// running) teaches its plan its replays; nothing else teaches anything.
//
// Under a budget that counts reserved bytes, a request needs its bytes free
// in one place. A step that did not fit, run as the allocator asks (the
// policy's plan carried out, the allocator asking again while it makes no
// room: RuntimeOptions::retry_in_one_place off), may have failed for where
// its policy's evictions lay rather than for bytes: with
// `in_one_place_after_failure`, its plan's next step (the same trial step
// again, in a trial) meets each request in one place instead, once, before
// the plan is refused or made blind; so does a trial step the door stopped
// for running past the quickest (kTooSlow), as in one place may be quicker.
// Steps that finish placed anywhere are run as they were: in one place is
// often quicker where both finish, but fails many steps that finish anywhere
// (bench/results/in_one_place_fallback_2026-12-06.md).
//
// A step that did not fit in one place either (or placed anywhere, where
// in_one_place_after_failure is off) may have failed for where the
// allocator put small tensors: in a free block that a large request needed
// whole (a regeneration's small input, pinned in the middle of a large
// tensor's old block, leaves the next large request no room). With
// `split_limit_halvings_after_failure`, each such step halves the split
// limit its plan's next steps run with (the allocator splits no free block
// above it for a smaller request), up to that many times, before the plan is
// refused or made blind; so does a trial step stopped as too slow (kTooSlow),
// as a lower limit may be quicker. The door applies it to its allocator
// (CachingAllocator::SetMaxSplitSize); a door whose allocator has no split
// limit (expandable segments) or a limit its user chose leaves it at 0. At
// most 5: the door's limit shifted right by it must stay above 1 MiB.
//
// One implementation for every door: remat.torch's budget and any C or C++
// framework drive it through remat.h (remat_planner_*), and the simulator's
// offload guard runs each of its runs as one trial step. It decides; the
// door runs the steps, times them and owns the runtimes.
//
// Not thread-safe: one step at a time (the C ABI adds a lock).
#ifndef REMAT_RUNTIME_STEP_PLANNER_H_
#define REMAT_RUNTIME_STEP_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/runtime.h"

namespace remat {

struct PlanSpec {
  std::string name;    // shown to users ("mixed", "drop-first", "dtr-eq drop-first"); unique
  std::string policy;  // the eviction-policy spec its runtime runs; checked
  bool allow_drop = true;
  bool allow_offload = false;
  bool drop_first = false;  // with both allowed: drop before offloading
};

// With offload allowed, a tensor whose replay would need more than this share
// of the room resident at once (itself and the saved tensors its replay
// reads) is offloaded rather than dropped: dropped, it could hardly come back
// beside what the backward node reading it pins. (On 72 small PyTorch models
// written the ways people write them, hybrid's smallest budget was above
// offload-only's in 40 without the rule, in 14 of 53 with a share of 1, and in
// 2 with a half.) A drop-first plan, which stands for drops alone in the
// trial, offloads only what could never come back (a share of 1), so that the
// trial still sees what drops alone would do.
inline constexpr double kDropWorkingSetShare = 0.5;
inline constexpr double kDropFirstWorkingSetShare = 1.0;

struct StepPlannerOptions {
  std::size_t learning_steps = 1;  // per plan, first in its turn, untimed
  std::size_t timed_steps = 2;     // per plan, after those (at least 1)
  // A step that did not fit makes its plan's next steps meet each request in
  // one place (the header's comment). For budgets that count reserved
  // bytes; a budget of live bytes counts no places.
  bool in_one_place_after_failure = false;
  // A step that did not fit in one place halves its plan's split limit for
  // the next steps, up to this many times (the header's comment).
  std::size_t split_limit_halvings_after_failure = 0;
};

enum class StepOutcome : std::uint8_t {
  kFit,        // the step ran through under the budget
  kTooSmall,   // the budget could not hold what the step needed
  kAbandoned,  // it raised something else, or was interrupted: nothing learned
  // The door stopped it once it ran past the quickest step that fit: it
  // leaves the trial as a step that did not fit does (with
  // in_one_place_after_failure, after one more try in one place, and with
  // split_limit_halvings_after_failure, tries at the lower limits, where it
  // may be quicker), and teaches nothing.
  kTooSlow,
};

class StepPlanner {
 public:
  // InvalidArgument for no plans, an empty or repeated name, a plan that
  // allows neither drops nor offloads, a policy spec the registry refuses,
  // or no timed steps.
  static absl::StatusOr<StepPlanner> Create(std::vector<PlanSpec> plans,
                                            StepPlannerOptions options = {});

  struct Step {
    std::size_t plan = 0;
    bool timed = false;          // its elapsed time counts in the trial
    bool in_trial = false;       // the trial has not decided yet
    bool fresh_runtime = false;  // start the plan's runtime afresh (blind)
    bool in_one_place = false;   // meet each request in one place (retry_in_one_place)
    // Run with the allocator's split limit halved this many times.
    std::size_t split_limit_halvings = 0;
  };
  // The step about to run. FailedPrecondition while one is open.
  absl::StatusOr<Step> Begin();
  // Ends the step Begin opened: `elapsed_ns` counts for a timed step that
  // fit; `message` is kept as the refusal of a plan it takes out of the
  // trial. FailedPrecondition with no step open; InvalidArgument for a
  // negative time.
  absl::Status End(StepOutcome outcome, std::int64_t elapsed_ns, std::string_view message);
  // The door started `plan`'s runtime afresh for reasons of its own (an
  // interrupted step, a budget of another kind): it has learned nothing.
  absl::Status RuntimeRestarted(std::size_t plan);

  // What the open step saw of a tensor of `kind` and `bytes`: its replay
  // came back (fit) or could not fit; or the backward read it with `pinned`
  // bytes pinned beside it. FailedPrecondition with no step open.
  absl::Status SawReplay(std::uint64_t kind, std::uint64_t bytes, bool fit);
  absl::Status SawPinned(std::uint64_t kind, std::uint64_t bytes, std::uint64_t pinned);
  // What the steps before the open one learned of a tensor of `kind` and
  // `bytes` under the open step's plan. FailedPrecondition with no step open.
  struct Seen {
    bool seen_to_fit = false;         // a replay of its kind, this size or larger, came back
    bool seen_to_fail = false;        // one of its kind, this size or smaller, did not fit
    std::uint64_t pinned_beside = 0;  // what the backward will hold pinned as it reads it
  };
  absl::StatusOr<Seen> Lookup(std::uint64_t kind, std::uint64_t bytes) const;

  // Whether a tensor that may be both dropped and offloaded is dropped, by
  // the open step's plan: `replay` is what its replay would hold resident at
  // once (Runtime::EstimateReplay), `room` what a replay must fit in (the
  // budget, less what the device held as the step began where the budget
  // counts everything). A drop is refused (the tensor is offloaded) where
  //   - its replay with its inputs resident needs more than a share of the
  //     room (kDropWorkingSetShare; kDropFirstWorkingSetShare for a
  //     drop-first plan);
  //   - its replay, dropped inputs followed, beside what earlier steps'
  //     backwards pinned as they read its kind, is more than the room;
  //   - a replay of its kind and size was seen to fail.
  // An admitted drop is copied to host memory first (copy_first) where no
  // replay of its kind and size was seen to fit: should its replay not fit,
  // it comes back from that copy. FailedPrecondition with no step open.
  enum class DropVerdict : std::uint8_t {
    kDrop,
    kOffloadOverShare,
    kOffloadBesidePinned,
    kOffloadSeenToFail,
  };
  struct Admission {
    DropVerdict verdict = DropVerdict::kDrop;
    bool copy_first = false;
  };
  absl::StatusOr<Admission> AdmitDrop(std::uint64_t kind, std::uint64_t bytes,
                                      const ReplayEstimate& replay, std::uint64_t room) const;

  std::size_t num_plans() const { return plans_.size(); }
  const PlanSpec& plan(std::size_t i) const { return plans_[i].spec; }
  bool in_trial() const { return !kept_.has_value(); }
  // The plan kept: once the trial has decided (or from the start, with one plan).
  std::optional<std::size_t> kept() const { return kept_; }
  // The trial has decided after timing its plans (not one plan from the start).
  bool trial_done() const { return kept_.has_value() && plans_.size() > 1; }
  std::uint64_t steps_ended() const { return steps_ended_; }

  // A plan the budget may still run: keep its runtime. False for a plan
  // refused, or not kept once the trial decided.
  bool live(std::size_t plan) const;
  bool refused(std::size_t plan) const { return plans_[plan].refused; }
  const std::string& refusal(std::size_t plan) const { return plans_[plan].refusal; }
  bool blind(std::size_t plan) const { return plans_[plan].blind; }
  bool in_one_place(std::size_t plan) const { return plans_[plan].in_one_place; }
  std::size_t split_limit_halvings(std::size_t plan) const {
    return plans_[plan].split_limit_halvings;
  }
  // Steps that fit on the plan's current runtime.
  std::uint64_t runtime_steps(std::size_t plan) const { return plans_[plan].runtime_steps; }
  absl::Span<const std::int64_t> times_ns(std::size_t plan) const { return plans_[plan].times_ns; }
  // Whether what the step just ended (or the one open) learned of replays
  // counts as seen to fit: not on a runtime's first, blind-made choices
  // (replays seen to fit there say little of the next step's), except where
  // every step is blind.
  bool learns_fits(std::size_t plan) const {
    return plans_[plan].runtime_steps > 0 || plans_[plan].blind;
  }

 private:
  // Replays by kind (the header's comment).
  struct ReplayBook {
    absl::flat_hash_map<std::uint64_t, std::uint64_t> fit;     // largest that came back
    absl::flat_hash_map<std::uint64_t, std::uint64_t> failed;  // smallest that did not fit
    // Joins a newer step's book; `fits`: take its fits too.
    void Merge(const ReplayBook& newer, bool fits);
  };
  // Bytes pinned beside each kind as the backward read it.
  struct PinnedBook {
    struct Figures {
      std::uint64_t most = 0;            // the most pinned beside one of the kind
      std::uint64_t largest = 0;         // the largest tensor of the kind seen
      std::uint64_t beside_largest = 0;  // the most pinned beside that one
    };
    absl::flat_hash_map<std::uint64_t, Figures> by_kind;
    static Figures Join(const Figures& a, const Figures& b);
    void Saw(std::uint64_t kind, std::uint64_t bytes, std::uint64_t pinned);
    void Merge(const PinnedBook& newer);
    std::uint64_t Beside(std::uint64_t kind, std::uint64_t bytes) const;
  };

  struct Plan {
    PlanSpec spec;
    ReplayBook replays;
    bool refused = false;
    std::string refusal;
    bool blind = false;
    bool in_one_place = false;
    std::size_t split_limit_halvings = 0;
    std::uint64_t runtime_steps = 0;
    std::vector<std::int64_t> times_ns;
  };
  struct TrialStep {
    std::size_t plan;
    bool timed;
  };

  StepPlanner(std::vector<Plan> plans, std::vector<TrialStep> trial, StepPlannerOptions options);
  void Refuse(std::size_t plan, std::string_view message);
  void Decide();
  std::size_t Unrefused() const;

  std::vector<Plan> plans_;
  StepPlannerOptions options_;
  std::vector<TrialStep> trial_;  // the trial steps still to run, first first
  std::size_t next_trial_ = 0;    // index into trial_
  std::optional<std::size_t> kept_;
  std::optional<Step> open_;
  std::uint64_t steps_ended_ = 0;
  PinnedBook pinned_;        // what steps that fit saw, any plan
  ReplayBook step_replays_;  // what the open step saw
  PinnedBook step_pinned_;
};

}  // namespace remat

#endif  // REMAT_RUNTIME_STEP_PLANNER_H_
