#include "runtime/step_planner.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "policies/registry.h"

namespace remat {

absl::StatusOr<StepPlanner> StepPlanner::Create(std::vector<PlanSpec> plans,
                                                StepPlannerOptions options) {
  if (plans.empty()) return absl::InvalidArgumentError("a step planner needs at least one plan");
  if (options.timed_steps == 0) {
    return absl::InvalidArgumentError("a plan's trial needs at least one timed step");
  }
  // Bounded: a trial longer than this is a mistake, not a plan.
  constexpr std::size_t kMostTrialSteps = 1 << 20;
  if (plans.size() > kMostTrialSteps || options.learning_steps > kMostTrialSteps ||
      options.timed_steps > kMostTrialSteps ||
      plans.size() * (options.learning_steps + options.timed_steps) > kMostTrialSteps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d plans of %d + %d trial steps each: more than %d trial steps", plans.size(),
        options.learning_steps, options.timed_steps, kMostTrialSteps));
  }
  // Past this the default 64 MiB limit would reach the small pool's
  // requests (1 MiB), which no limit may be.
  constexpr std::size_t kMostHalvings = 5;
  if (options.split_limit_halvings_after_failure > kMostHalvings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d halvings of the split limit after failure: at most %d",
        options.split_limit_halvings_after_failure, kMostHalvings));
  }
  absl::flat_hash_set<std::string> names;
  std::vector<Plan> made;
  made.reserve(plans.size());
  for (PlanSpec& p : plans) {
    if (p.name.empty()) return absl::InvalidArgumentError("a plan needs a name");
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("two plans are named \"%s\"", p.name));
    }
    if (!p.allow_drop && !p.allow_offload) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan \"%s\" allows neither drops nor offloads: nothing could leave the budget",
          p.name));
    }
    absl::StatusOr<policies::PolicySpec> spec = policies::PolicySpec::Parse(p.policy);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan \"%s\": %s", p.name, spec.status().message()));
    }
    made.push_back(Plan{std::move(p)});
  }
  std::vector<TrialStep> trial;
  if (made.size() > 1) {
    for (std::size_t i = 0; i < made.size(); ++i) {
      for (std::size_t k = 0; k < options.learning_steps; ++k) trial.push_back({i, false});
      for (std::size_t k = 0; k < options.timed_steps; ++k) trial.push_back({i, true});
    }
  }
  return StepPlanner(std::move(made), std::move(trial), options);
}

StepPlanner::StepPlanner(std::vector<Plan> plans, std::vector<TrialStep> trial,
                         StepPlannerOptions options)
    : plans_(std::move(plans)), options_(options), trial_(std::move(trial)) {
  if (plans_.size() == 1) kept_ = 0;
}

absl::StatusOr<StepPlanner::Step> StepPlanner::Begin() {
  if (open_.has_value()) {
    return absl::FailedPreconditionError("a step is open: end it before beginning the next");
  }
  Step step;
  if (kept_.has_value()) {
    step.plan = *kept_;
  } else {
    step.plan = trial_[next_trial_].plan;
    step.timed = trial_[next_trial_].timed;
    step.in_trial = true;
  }
  Plan& plan = plans_[step.plan];
  step.in_one_place = plan.in_one_place;
  step.split_limit_halvings = plan.split_limit_halvings;
  if (plan.blind) {
    // (What its replays did is kept: every step as blind as the last.)
    step.fresh_runtime = true;
    plan.runtime_steps = 0;
  }
  step_replays_ = ReplayBook{};
  step_pinned_ = PinnedBook{};
  open_ = step;
  return step;
}

absl::Status StepPlanner::End(StepOutcome outcome, std::int64_t elapsed_ns,
                              std::string_view message) {
  if (!open_.has_value()) return absl::FailedPreconditionError("no step is open");
  if (elapsed_ns < 0) return absl::InvalidArgumentError("a step's time cannot be negative");
  const Step step = *open_;
  open_.reset();
  ++steps_ended_;
  Plan& plan = plans_[step.plan];
  switch (outcome) {
    case StepOutcome::kFit:
      // A runtime's first step evicts blind; from its second on, by what it
      // learned: replays seen to fit in the first say little of the next
      // (belady's choices change), its failures do.
      plan.replays.Merge(step_replays_, learns_fits(step.plan));
      pinned_.Merge(step_pinned_);
      if (step.in_trial) {
        if (step.timed) plan.times_ns.push_back(elapsed_ns);
        ++next_trial_;
        if (next_trial_ == trial_.size()) Decide();
      }
      ++plan.runtime_steps;
      break;
    case StepOutcome::kTooSmall:
      if (options_.in_one_place_after_failure && !plan.in_one_place) {
        // Perhaps for where its evictions lay: its next step (this trial
        // step again) meets each request in one place. Its replays that did
        // not fit are offloaded from then on, as below.
        plan.in_one_place = true;
        plan.replays.Merge(step_replays_, /*fits=*/false);
        break;
      }
      if (plan.split_limit_halvings < options_.split_limit_halvings_after_failure) {
        // Perhaps for where the allocator put small tensors: its next step
        // splits fewer large blocks.
        ++plan.split_limit_halvings;
        plan.replays.Merge(step_replays_, /*fits=*/false);
        break;
      }
      if (step.in_trial && Unrefused() > 1) {
        Refuse(step.plan, message);
        break;
      }
      // Its replays that did not fit: offloaded from its next step.
      plan.replays.Merge(step_replays_, /*fits=*/false);
      if (plan.runtime_steps > 0) {
        // It fit before, on a runtime that had not yet learned from a step.
        plan.blind = true;
      }
      break;
    case StepOutcome::kTooSlow:
      // Placed otherwise it may be quicker (in one place often is, and so
      // may a lower split limit be): the same trial step again, placed as
      // after a step that did not fit, before it leaves the trial. (So a
      // trial over several policies' plans keeps what each policy's own
      // run, failing and placed again, would reach.)
      if (options_.in_one_place_after_failure && !plan.in_one_place && step.in_trial) {
        plan.in_one_place = true;
        break;
      }
      if (plan.split_limit_halvings < options_.split_limit_halvings_after_failure &&
          step.in_trial) {
        ++plan.split_limit_halvings;
        break;
      }
      if (step.in_trial && Unrefused() > 1) Refuse(step.plan, message);
      break;
    case StepOutcome::kAbandoned:
      break;
  }
  return absl::OkStatus();
}

absl::Status StepPlanner::RuntimeRestarted(std::size_t plan) {
  if (plan >= plans_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("no plan %d: the planner has %d", plan, plans_.size()));
  }
  plans_[plan].runtime_steps = 0;
  plans_[plan].replays = ReplayBook{};
  return absl::OkStatus();
}

absl::Status StepPlanner::SawReplay(std::uint64_t kind, std::uint64_t bytes, bool fit) {
  if (!open_.has_value()) return absl::FailedPreconditionError("no step is open");
  if (fit) {
    std::uint64_t& most = step_replays_.fit[kind];
    most = std::max(most, bytes);
  } else {
    auto [it, added] = step_replays_.failed.try_emplace(kind, bytes);
    if (!added) it->second = std::min(it->second, bytes);
  }
  return absl::OkStatus();
}

absl::Status StepPlanner::SawPinned(std::uint64_t kind, std::uint64_t bytes,
                                    std::uint64_t pinned) {
  if (!open_.has_value()) return absl::FailedPreconditionError("no step is open");
  step_pinned_.Saw(kind, bytes, pinned);
  return absl::OkStatus();
}

absl::StatusOr<StepPlanner::Seen> StepPlanner::Lookup(std::uint64_t kind,
                                                      std::uint64_t bytes) const {
  if (!open_.has_value()) return absl::FailedPreconditionError("no step is open");
  const ReplayBook& book = plans_[open_->plan].replays;
  Seen seen;
  if (auto it = book.fit.find(kind); it != book.fit.end()) seen.seen_to_fit = bytes <= it->second;
  if (auto it = book.failed.find(kind); it != book.failed.end()) {
    seen.seen_to_fail = bytes >= it->second;
  }
  seen.pinned_beside = pinned_.Beside(kind, bytes);
  return seen;
}

absl::StatusOr<StepPlanner::Admission> StepPlanner::AdmitDrop(std::uint64_t kind,
                                                             std::uint64_t bytes,
                                                             const ReplayEstimate& replay,
                                                             std::uint64_t room) const {
  absl::StatusOr<Seen> seen = Lookup(kind, bytes);
  if (!seen.ok()) return seen.status();
  const double share =
      plans_[open_->plan].spec.drop_first ? kDropFirstWorkingSetShare : kDropWorkingSetShare;
  Admission a;
  const std::uint64_t deepest = replay.back();
  if (static_cast<double>(replay.front()) > static_cast<double>(room) * share) {
    a.verdict = DropVerdict::kOffloadOverShare;
  } else if (deepest > room || seen->pinned_beside > room - deepest) {
    a.verdict = DropVerdict::kOffloadBesidePinned;
  } else if (seen->seen_to_fail) {
    a.verdict = DropVerdict::kOffloadSeenToFail;
  } else {
    a.copy_first = !seen->seen_to_fit;
  }
  return a;
}

void StepPlanner::ReplayBook::Merge(const ReplayBook& newer, bool fits) {
  for (const auto& [kind, bytes] : newer.failed) {
    auto [it, added] = failed.try_emplace(kind, bytes);
    if (!added) it->second = std::min(it->second, bytes);
  }
  if (!newer.failed.empty()) {
    // What the next steps drop changes, and so what their replays need:
    // what was seen to fit is forgotten (their drops are copied again).
    fit.clear();
    return;
  }
  if (!fits) return;
  for (const auto& [kind, bytes] : newer.fit) {
    std::uint64_t& most = fit[kind];
    most = std::max(most, bytes);
  }
}

StepPlanner::PinnedBook::Figures StepPlanner::PinnedBook::Join(const Figures& a,
                                                               const Figures& b) {
  Figures joined;
  joined.most = std::max(a.most, b.most);
  if (a.largest != b.largest) {
    const Figures& larger = a.largest > b.largest ? a : b;
    joined.largest = larger.largest;
    joined.beside_largest = larger.beside_largest;
  } else {
    joined.largest = a.largest;
    joined.beside_largest = std::max(a.beside_largest, b.beside_largest);
  }
  return joined;
}

void StepPlanner::PinnedBook::Saw(std::uint64_t kind, std::uint64_t bytes,
                                  std::uint64_t pinned) {
  const Figures mine{pinned, bytes, pinned};
  auto [it, added] = by_kind.try_emplace(kind, mine);
  if (!added) it->second = Join(it->second, mine);
}

void StepPlanner::PinnedBook::Merge(const PinnedBook& newer) {
  // (A step whose backward read nothing leaves what was seen as it was.)
  for (const auto& [kind, figures] : newer.by_kind) {
    auto [it, added] = by_kind.try_emplace(kind, figures);
    if (!added) it->second = Join(it->second, figures);
  }
}

std::uint64_t StepPlanner::PinnedBook::Beside(std::uint64_t kind, std::uint64_t bytes) const {
  auto it = by_kind.find(kind);
  if (it == by_kind.end()) return 0;
  const Figures& f = it->second;
  if (bytes <= f.largest) return f.most;
  // Shapes that change from step to step: a larger tensor than any seen,
  // beside the largest's figure scaled up to its size. (A short step does
  // not scale a long one's: what stays the same size would be scaled too.)
  const unsigned __int128 scaled = static_cast<unsigned __int128>(f.beside_largest) * bytes /
                                   std::max<std::uint64_t>(1, f.largest);
  const std::uint64_t capped = scaled > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(scaled);
  return std::max(f.most, capped);
}

bool StepPlanner::live(std::size_t plan) const {
  if (plans_[plan].refused) return false;
  return !kept_.has_value() || *kept_ == plan;
}

std::size_t StepPlanner::Unrefused() const {
  return static_cast<std::size_t>(
      std::count_if(plans_.begin(), plans_.end(), [](const Plan& p) { return !p.refused; }));
}

void StepPlanner::Refuse(std::size_t plan, std::string_view message) {
  plans_[plan].refused = true;
  plans_[plan].refusal = std::string(message);
  plans_[plan].times_ns.clear();
  // The trial steps still to run, without the plan's.
  std::vector<TrialStep> left;
  for (std::size_t i = next_trial_; i < trial_.size(); ++i) {
    if (trial_[i].plan != plan) left.push_back(trial_[i]);
  }
  trial_ = std::move(left);
  next_trial_ = 0;
  if (trial_.empty()) Decide();
}

void StepPlanner::Decide() {
  // The quickest timed step's plan; a tie keeps the plan listed first.
  std::optional<std::size_t> best;
  std::int64_t best_ns = 0;
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    const Plan& p = plans_[i];
    if (p.refused || p.times_ns.empty()) continue;
    const std::int64_t mine = *std::min_element(p.times_ns.begin(), p.times_ns.end());
    if (!best.has_value() || mine < best_ns) {
      best = i;
      best_ns = mine;
    }
  }
  // (Every trial step of an unrefused plan ran and fit, so one has times.)
  kept_ = best.value_or(0);
}

}  // namespace remat
