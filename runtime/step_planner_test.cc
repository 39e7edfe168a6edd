#include "runtime/step_planner.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

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

// Under a budget of places, a step that did not fit runs again, its plan
// meeting each request in one place, before the plan leaves the trial; so
// does a trial step stopped for being slow.
TEST(StepPlannerTest, AStepThatDidNotFitRunsAgainInOnePlaceFirst) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(
      MixedAndDropFirst(), StepPlannerOptions{0, 1, /*in_one_place_after_failure=*/true});
  ASSERT_TRUE(p.ok());
  StepPlanner::Step a = RunStep(*p, StepOutcome::kTooSmall, 0);
  EXPECT_EQ(a.plan, 0u);
  EXPECT_FALSE(a.in_one_place);
  EXPECT_TRUE(p->in_one_place(0));
  EXPECT_FALSE(p->refused(0));
  StepPlanner::Step b = RunStep(*p, StepOutcome::kTooSmall, 0, "no room");  // again: refused
  EXPECT_EQ(b.plan, 0u);
  EXPECT_TRUE(b.in_one_place);
  EXPECT_TRUE(p->refused(0));
  EXPECT_EQ(p->refusal(0), "no room");
  StepPlanner::Step c = RunStep(*p, StepOutcome::kTooSmall, 0);  // the last plan left
  StepPlanner::Step d = RunStep(*p, StepOutcome::kFit, 70);
  EXPECT_EQ(c.plan, 1u);
  EXPECT_FALSE(c.in_one_place);
  EXPECT_EQ(d.plan, 1u);
  EXPECT_TRUE(d.in_one_place);
  EXPECT_EQ(p->kept(), 1u);
  EXPECT_TRUE(RunStep(*p, StepOutcome::kFit, 1).in_one_place);  // it stays so

  // Stopped past the quickest step so far: once more in one place (where
  // it may be quicker), then out of the trial.
  absl::StatusOr<StepPlanner> q = StepPlanner::Create(
      MixedAndDropFirst(), StepPlannerOptions{0, 1, /*in_one_place_after_failure=*/true});
  ASSERT_TRUE(q.ok());
  RunStep(*q, StepOutcome::kFit, 10);
  EXPECT_FALSE(RunStep(*q, StepOutcome::kTooSlow, 0, "beaten").in_one_place);
  EXPECT_TRUE(q->in_one_place(1));
  EXPECT_FALSE(q->refused(1));
  EXPECT_TRUE(RunStep(*q, StepOutcome::kTooSlow, 0, "beaten").in_one_place);
  EXPECT_TRUE(q->refused(1));
  EXPECT_EQ(q->kept(), 0u);
  // (Without the option, out at once.)
  absl::StatusOr<StepPlanner> q2 =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1});
  ASSERT_TRUE(q2.ok());
  RunStep(*q2, StepOutcome::kFit, 10);
  RunStep(*q2, StepOutcome::kTooSlow, 0, "beaten");
  EXPECT_TRUE(q2->refused(1));

  // Without the option a step that did not fit leaves the trial at once.
  absl::StatusOr<StepPlanner> r =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(RunStep(*r, StepOutcome::kTooSmall, 0).in_one_place);
  EXPECT_TRUE(r->refused(0));
  EXPECT_FALSE(r->in_one_place(0));
}

// After the trial, the kept plan's step that did not fit makes its later
// steps meet requests in one place (it is not made blind for that step).
TEST(StepPlannerTest, AKeptPlansStepThatDidNotFitMakesItsNextStepsMeetRequestsInOnePlace) {
  absl::StatusOr<StepPlanner> p =
      StepPlanner::Create({PlanSpec{"drop-only", "dtr"}},
                          StepPlannerOptions{1, 2, /*in_one_place_after_failure=*/true});
  ASSERT_TRUE(p.ok());
  RunStep(*p, StepOutcome::kFit, 5);
  EXPECT_FALSE(RunStep(*p, StepOutcome::kTooSmall, 0).in_one_place);
  EXPECT_FALSE(p->blind(0));
  EXPECT_TRUE(RunStep(*p, StepOutcome::kTooSmall, 0).in_one_place);
  EXPECT_TRUE(p->blind(0));  // in one place too: as before, blind
  StepPlanner::Step s = RunStep(*p, StepOutcome::kFit, 5);
  EXPECT_TRUE(s.in_one_place);
  EXPECT_TRUE(s.fresh_runtime);
}

// A step that did not fit in one place halves its plan's split limit for
// the next step, up to the option's count; so does a trial step stopped as
// too slow (a lower limit may be quicker); the kept plan's steps stay so.
TEST(StepPlannerTest, AStepThatDidNotFitInOnePlaceHalvesItsPlansSplitLimitUpToTheCount) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(
      MixedAndDropFirst(), StepPlannerOptions{0, 1, /*in_one_place_after_failure=*/true,
                                              /*split_limit_halvings_after_failure=*/2});
  ASSERT_TRUE(p.ok());
  std::vector<std::pair<bool, std::size_t>> tried;
  for (int i = 0; i < 4; ++i) {
    StepPlanner::Step s = RunStep(*p, StepOutcome::kTooSmall, 0, "no room");
    EXPECT_EQ(s.plan, 0u);
    tried.emplace_back(s.in_one_place, s.split_limit_halvings);
    EXPECT_EQ(p->refused(0), i == 3);
  }
  EXPECT_THAT(tried, ElementsAre(Pair(false, 0u), Pair(true, 0u), Pair(true, 1u), Pair(true, 2u)));
  EXPECT_EQ(p->split_limit_halvings(1), 0u);  // the other plan's own
  RunStep(*p, StepOutcome::kTooSmall, 0);     // the last plan left, placed anywhere
  RunStep(*p, StepOutcome::kTooSmall, 0);     // in one place
  StepPlanner::Step fit = RunStep(*p, StepOutcome::kFit, 70);
  EXPECT_EQ(fit.split_limit_halvings, 1u);
  EXPECT_EQ(p->kept(), 1u);
  EXPECT_EQ(RunStep(*p, StepOutcome::kFit, 1).split_limit_halvings, 1u);  // it stays so

  // Too slow in the trial: in one place, then at the lower limits, then out.
  absl::StatusOr<StepPlanner> q = StepPlanner::Create(
      MixedAndDropFirst(), StepPlannerOptions{0, 1, true, 2});
  ASSERT_TRUE(q.ok());
  RunStep(*q, StepOutcome::kFit, 10);
  for (std::size_t halvings : {0u, 0u, 1u, 2u}) {
    EXPECT_FALSE(q->refused(1));
    EXPECT_EQ(RunStep(*q, StepOutcome::kTooSlow, 0, "beaten").split_limit_halvings, halvings);
  }
  EXPECT_TRUE(q->refused(1));
  EXPECT_EQ(q->kept(), 0u);

  // Without the option, none; past the most a limit can be halved, refused.
  absl::StatusOr<StepPlanner> r =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1, true});
  ASSERT_TRUE(r.ok());
  RunStep(*r, StepOutcome::kTooSmall, 0);
  RunStep(*r, StepOutcome::kTooSmall, 0);
  EXPECT_TRUE(r->refused(0));
  EXPECT_EQ(r->split_limit_halvings(0), 0u);
  absl::StatusOr<StepPlanner> bad =
      StepPlanner::Create(MixedAndDropFirst(), StepPlannerOptions{0, 1, true, 7});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
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

TEST(StepPlannerTest, ReplaysLearnedByKindFromTheSecondStepOfARuntime) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create({PlanSpec{"mixed", "dtr", true, true}});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->Lookup(7, 100).ok());  // no step open
  EXPECT_FALSE(p->SawReplay(7, 100, true).ok());
  // The runtime's first step: its fits teach nothing.
  ASSERT_TRUE(p->Begin().ok());
  ASSERT_TRUE(p->SawReplay(7, 100, true).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_FALSE(p->Lookup(7, 100)->seen_to_fit);
  ASSERT_TRUE(p->SawReplay(7, 100, true).ok());
  ASSERT_TRUE(p->SawReplay(7, 60, true).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_TRUE(p->Lookup(7, 100)->seen_to_fit);
  EXPECT_TRUE(p->Lookup(7, 50)->seen_to_fit);
  EXPECT_FALSE(p->Lookup(7, 101)->seen_to_fit);
  EXPECT_FALSE(p->Lookup(8, 1)->seen_to_fit);
  // A failure: that size and larger fail from now on, and every fit is forgotten.
  ASSERT_TRUE(p->SawReplay(9, 300, false).ok());
  ASSERT_TRUE(p->SawReplay(9, 200, false).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_FALSE(p->Lookup(7, 100)->seen_to_fit);
  EXPECT_TRUE(p->Lookup(9, 200)->seen_to_fail);
  EXPECT_FALSE(p->Lookup(9, 199)->seen_to_fail);
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  // A restarted runtime has learned nothing.
  ASSERT_TRUE(p->RuntimeRestarted(0).ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_FALSE(p->Lookup(9, 200)->seen_to_fail);
  ASSERT_TRUE(p->End(StepOutcome::kAbandoned, 0, "").ok());
}

TEST(StepPlannerTest, AStepThatDidNotFitTeachesItsFailuresAndAbandonedOnesNothing) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create({PlanSpec{"mixed", "dtr", true, true}});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->Begin().ok());
  ASSERT_TRUE(p->SawReplay(1, 10, false).ok());
  ASSERT_TRUE(p->SawPinned(1, 10, 5).ok());
  ASSERT_TRUE(p->End(StepOutcome::kAbandoned, 0, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_FALSE(p->Lookup(1, 10)->seen_to_fail);
  ASSERT_TRUE(p->SawReplay(1, 10, false).ok());
  ASSERT_TRUE(p->SawPinned(1, 10, 5).ok());
  ASSERT_TRUE(p->End(StepOutcome::kTooSmall, 0, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_TRUE(p->Lookup(1, 10)->seen_to_fail);
  EXPECT_EQ(p->Lookup(1, 10)->pinned_beside, 0u);  // only steps that fit teach pins
  ASSERT_TRUE(p->End(StepOutcome::kFit, 0, "").ok());
}

TEST(StepPlannerTest, PinnedBesideAKindScalesOnlyUpToLargerTensors) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(MixedAndDropFirst());
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->Begin().ok());
  ASSERT_TRUE(p->SawPinned(3, 100, 40).ok());
  ASSERT_TRUE(p->SawPinned(3, 50, 70).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
  // Shared by the plans: the next plan's step reads it too.
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_EQ(p->Lookup(3, 100)->pinned_beside, 70u);  // the most seen
  EXPECT_EQ(p->Lookup(3, 10)->pinned_beside, 70u);
  EXPECT_EQ(p->Lookup(3, 1000)->pinned_beside, 400u);  // 40 beside the largest, x10
  EXPECT_EQ(p->Lookup(3, 120)->pinned_beside, 70u);    // never less than the most
  EXPECT_EQ(p->Lookup(4, 100)->pinned_beside, 0u);
  // 40 x 2^62 does not fit 64 bits; the figure does.
  EXPECT_EQ(p->Lookup(3, std::uint64_t{1} << 62)->pinned_beside,
            (std::uint64_t{1} << 62) / 100 * 40 + (std::uint64_t{1} << 62) % 100 * 40 / 100);
  ASSERT_TRUE(p->End(StepOutcome::kFit, 1, "").ok());
}

TEST(StepPlannerTest, ADropIsAdmittedWhereItsReplayCanFit) {
  absl::StatusOr<StepPlanner> p = StepPlanner::Create(MixedAndDropFirst());
  ASSERT_TRUE(p.ok());
  auto replay = [](std::uint64_t first, std::uint64_t deepest) {
    ReplayEstimate e;
    e.fill(deepest);
    e[0] = first;
    return e;
  };
  using V = StepPlanner::DropVerdict;
  EXPECT_FALSE(p->AdmitDrop(1, 10, replay(10, 10), 100).ok());  // no step open
  ASSERT_TRUE(p->Begin().ok());  // mixed: half the room
  EXPECT_EQ(p->AdmitDrop(1, 10, replay(50, 50), 100)->verdict, V::kDrop);
  EXPECT_TRUE(p->AdmitDrop(1, 10, replay(50, 50), 100)->copy_first);  // none seen to fit yet
  EXPECT_EQ(p->AdmitDrop(1, 10, replay(51, 51), 100)->verdict, V::kOffloadOverShare);
  EXPECT_EQ(p->AdmitDrop(1, 10, replay(20, 101), 100)->verdict, V::kOffloadBesidePinned);
  ASSERT_TRUE(p->SawPinned(1, 10, 60).ok());
  ASSERT_TRUE(p->SawReplay(2, 10, false).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 0, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  // 41 beside the 60 pinned as its kind was read: over 100.
  EXPECT_EQ(p->AdmitDrop(1, 10, replay(20, 41), 100)->verdict, V::kOffloadBesidePinned);
  EXPECT_EQ(p->AdmitDrop(1, 10, replay(20, 40), 100)->verdict, V::kDrop);
  EXPECT_EQ(p->AdmitDrop(2, 10, replay(20, 20), 100)->verdict, V::kOffloadSeenToFail);
  EXPECT_EQ(p->AdmitDrop(3, 1, replay(1, UINT64_MAX), UINT64_MAX - 1)->verdict,
            V::kOffloadBesidePinned);
  ASSERT_TRUE(p->End(StepOutcome::kFit, 0, "").ok());
  ASSERT_TRUE(p->Begin().ok());
  ASSERT_TRUE(p->SawReplay(1, 10, true).ok());
  ASSERT_TRUE(p->End(StepOutcome::kFit, 0, "").ok());
  // drop-first: the whole room; and a replay of its kind seen to fit.
  ASSERT_TRUE(p->Begin().ok());
  EXPECT_EQ(p->AdmitDrop(4, 10, replay(99, 99), 100)->verdict, V::kDrop);
  EXPECT_EQ(p->AdmitDrop(4, 10, replay(101, 101), 100)->verdict, V::kOffloadOverShare);
  ASSERT_TRUE(p->End(StepOutcome::kFit, 0, "").ok());
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
