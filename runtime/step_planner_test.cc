#include "runtime/step_planner.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace remat {
namespace {

std::vector<PlanSpec> MixedAndDropFirst() {
  return {PlanSpec{"mixed", "dtr", true, true, false},
          PlanSpec{"drop-first", "dtr", true, true, true}};
}

// Runs one step: Begin, then End with `outcome` and `ns`; returns the step.
StepPlanner::Step RunStep(StepPlanner& p, StepOutcome outcome, std::int64_t ns,
                      std::string_view message = "") {
  absl::StatusOr<StepPlanner::Step> s = p.Begin();
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(p.End(outcome, ns, message).ok());
  return *s;
}

TEST(StepPlannerTest, OnePlanNeedsNoTrial) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create({PlanSpec{"drop-only", "dtr-eq"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->in_trial());
  EXPECT_FALSE(p->trial_done());
  StepPlanner::Step s = RunStep(*p, StepOutcome::kFit, 5);
  EXPECT_EQ(s.plan, 0u);
  EXPECT_FALSE(s.timed);
  EXPECT_FALSE(s.in_trial);
  EXPECT_TRUE(p->times_ns(0).empty());
  EXPECT_EQ(p->runtime_steps(0), 1u);
}

TEST(StepPlannerTest, TrialLearnsThenTimesEachPlanAndKeepsTheQuickest) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(MixedAndDropFirst());
  ASSERT_TRUE(p.ok()) << p.status();
  // mixed: learn, 300, 200; drop-first: learn, 250, 150.
  const std::int64_t times[] = {999, 300, 200, 999, 250, 150};
  const std::size_t plans[] = {0, 0, 0, 1, 1, 1};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(p->in_trial());
    StepPlanner::Step s = RunStep(*p, StepOutcome::kFit, times[i]);
    EXPECT_EQ(s.plan, plans[i]) << i;
    EXPECT_EQ(s.timed, i % 3 != 0) << i;
    EXPECT_TRUE(s.in_trial);
  }
  ASSERT_FALSE(p->in_trial());
  EXPECT_TRUE(p->trial_done());
  EXPECT_EQ(p->kept(), 1u);
  EXPECT_EQ(std::vector<std::int64_t>(p->times_ns(0).begin(), p->times_ns(0).end()),
            (std::vector<std::int64_t>{300, 200}));
  EXPECT_FALSE(p->live(0));
  EXPECT_TRUE(p->live(1));
  StepPlanner::Step after = RunStep(*p, StepOutcome::kFit, 1);
  EXPECT_EQ(after.plan, 1u);
  EXPECT_FALSE(after.timed);
  EXPECT_FALSE(after.in_trial);
}

TEST(StepPlannerTest, ATieKeepsThePlanListedFirst) {
  absl::StatusOr<StepPlanner> p =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1});
  ASSERT_TRUE(p.ok());
  RunStep(*p, StepOutcome::kFit, 100);
  RunStep(*p, StepOutcome::kFit, 100);
  EXPECT_EQ(p->kept(), 0u);
}

TEST(StepPlannerTest, AStepThatRaisedIsRunAgainAndNotTimed) {
  absl::StatusOr<StepPlanner> p =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1});
  ASSERT_TRUE(p.ok());
  StepPlanner::Step a = RunStep(*p, StepOutcome::kAbandoned, 1);
  StepPlanner::Step b = RunStep(*p, StepOutcome::kFit, 500);
  EXPECT_EQ(a.plan, 0u);
  EXPECT_EQ(b.plan, 0u);
  EXPECT_EQ(p->times_ns(0).size(), 1u);
  EXPECT_EQ(p->steps_ended(), 2u);
}

TEST(StepPlannerTest, APlanThatDidNotFitLeavesTheTrialWhileAnotherIsLeft) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(MixedAndDropFirst());
  ASSERT_TRUE(p.ok());
  RunStep(*p, StepOutcome::kTooSmall, 0, "too small for mixed");
  EXPECT_TRUE(p->refused(0));
  EXPECT_EQ(p->refusal(0), "too small for mixed");
  EXPECT_FALSE(p->live(0));
  // drop-first's three steps, then it is kept.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(RunStep(*p, StepOutcome::kFit, 10 + i).plan, 1u);
  EXPECT_EQ(p->kept(), 1u);
  EXPECT_TRUE(p->trial_done());
}

TEST(StepPlannerTest, TheLastPlanLeftStaysAndItsStepsRunAgain) {
  absl::StatusOr<StepPlanner> p =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1});
  ASSERT_TRUE(p.ok());
  RunStep(*p, StepOutcome::kTooSmall, 0, "mixed");
  EXPECT_EQ(RunStep(*p, StepOutcome::kTooSmall, 0, "drop-first").plan, 1u);
  EXPECT_FALSE(p->refused(1));
  EXPECT_TRUE(p->in_trial());
  StepPlanner::Step again = RunStep(*p, StepOutcome::kFit, 7);
  EXPECT_EQ(again.plan, 1u);
  EXPECT_EQ(p->kept(), 1u);
}

TEST(StepPlannerTest, AStepThatDidNotFitAfterLearningMakesThePlanBlind) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create({PlanSpec{"drop-only", "belady"}});
  ASSERT_TRUE(p.ok());
  // The first step fails on a fresh runtime: nothing learned misled it.
  RunStep(*p, StepOutcome::kTooSmall, 0);
  EXPECT_FALSE(p->blind(0));
  RunStep(*p, StepOutcome::kFit, 1);
  EXPECT_FALSE(p->learns_fits(0) && p->runtime_steps(0) == 0);
  EXPECT_TRUE(p->learns_fits(0));
  RunStep(*p, StepOutcome::kTooSmall, 0);
  EXPECT_TRUE(p->blind(0));
  absl::StatusOr<StepPlanner::Step> s = p->Begin();
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->fresh_runtime);
  EXPECT_EQ(p->runtime_steps(0), 0u);
  EXPECT_TRUE(p->learns_fits(0));  // every step blind: what it sees fit holds for the next
  EXPECT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
}

TEST(StepPlannerTest, ARestartedRuntimeHasLearnedNothing) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create({PlanSpec{"drop-only", "dtr"}});
  ASSERT_TRUE(p.ok());
  RunStep(*p, StepOutcome::kFit, 1);
  ASSERT_TRUE(p->RuntimeRestarted(0).ok());
  EXPECT_FALSE(p->learns_fits(0));
  RunStep(*p, StepOutcome::kTooSmall, 0);
  EXPECT_FALSE(p->blind(0));
  EXPECT_FALSE(p->RuntimeRestarted(1).ok());
}

TEST(StepPlannerTest, BadPlansAndMisuseAreRefused) {
  EXPECT_FALSE(StepPlanner::Create({}).ok());
  EXPECT_FALSE(StepPlanner::Create({PlanSpec{"", "dtr"}}).ok());
  EXPECT_FALSE(StepPlanner::Create({PlanSpec{"a", "no-such-policy"}}).ok());
  EXPECT_FALSE(StepPlanner::Create({PlanSpec{"a", "dtr:no_such_key=1"}}).ok());
  EXPECT_FALSE(StepPlanner::Create({PlanSpec{"a", "dtr"}, PlanSpec{"a", "lru"}}).ok());
  EXPECT_FALSE(StepPlanner::Create({PlanSpec{"a", "dtr", false, false}}).ok());
  EXPECT_FALSE(StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{1, 0}).ok());
  EXPECT_FALSE(StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{1, 1u << 30}).ok());
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(MixedAndDropFirst());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->End(StepOutcome::kFit, 1, "").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_EQ(p->Begin().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->End(StepOutcome::kFit, -1, "").code(), absl::StatusCode::kInvalidArgument);
  // The refused end changed nothing: the step is still open.
  EXPECT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  EXPECT_EQ(p->steps_ended(), 1u);
}

}  // namespace
}  // namespace remat
