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
  return StepPlanner(std::move(made), std::move(trial));
}

StepPlanner::StepPlanner(std::vector<Plan> plans, std::vector<TrialStep> trial)
    : plans_(std::move(plans)), trial_(std::move(trial)) {
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
  if (plan.blind) {
    step.fresh_runtime = true;
    plan.runtime_steps = 0;
  }
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
      if (step.in_trial) {
        if (step.timed) plan.times_ns.push_back(elapsed_ns);
        ++next_trial_;
        if (next_trial_ == trial_.size()) Decide();
      }
      ++plan.runtime_steps;
      break;
    case StepOutcome::kTooSmall:
      if (step.in_trial && Unrefused() > 1) {
        Refuse(step.plan, message);
      } else if (plan.runtime_steps > 0) {
        // It fit before, on a runtime that had not yet learned from a step.
        plan.blind = true;
      }
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
  return absl::OkStatus();
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
