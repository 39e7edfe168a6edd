// Next uses in the runtime: prefetches ahead of use (hinted or planned), and
// next uses learned from the step before (RuntimeOptions::learn_next_use).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {
namespace {

TEST_F(RuntimeTest, PrefetchBringsATensorBackAheadOfUse) {
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId b = Produce(6 * kMiB, {}, false, false);
  ASSERT_NE(StateOf(a), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Prefetch(a).ok());
  EXPECT_EQ(StateOf(a), TensorState::kPrefetching);
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  Check(a);
  EXPECT_EQ(StateOf(a), TensorState::kResident);
}

TEST_F(RuntimeTest, APrefetchedTensorCanBeEvictedAgainBeforeItsUse) {
  // Otherwise prefetches pile up unevictable and a budget fills with them.
  Make(8 * kMiB, {.policy = "lru"});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId b = Produce(6 * kMiB, {}, false, false);
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Prefetch(a).ok());
  ASSERT_EQ(StateOf(a), TensorState::kPrefetching);
  TensorId c = Produce(6 * kMiB, {}, false, false);  // no room unless a goes again
  EXPECT_NE(StateOf(a), TensorState::kPrefetching);
  EXPECT_NE(StateOf(a), TensorState::kResident);
  ASSERT_TRUE(runtime_->Free(c).ok());
  Check(a);  // the bytes survived the round trips
}

// Plans one action for every candidate.
class ActionPolicy : public policies::EvictionPolicy {
 public:
  policies::Plan Choose(const policies::PressureContext& ctx) override {
    policies::Plan plan;
    for (const policies::Candidate& c : ctx.candidates) plan.push_back({c.id, action});
    return plan;
  }
  policies::EvictAction action = policies::EvictAction::kOffload;

 protected:
  std::string OwnSpec() const override { return "action"; }
};

TEST_F(RuntimeTest, AFailedEvictionOfAPrefetchingTensorKeepsItsCopyToWaitFor) {
  auto policy = std::make_shared<ActionPolicy>();
  Make(8 * kMiB, {.custom_policy = policy});
  TensorId a = Produce(4 * kMiB, {}, /*drop=*/false, /*offload=*/true);
  TensorId b = Produce(6 * kMiB, {}, false, false);  // a goes to the host
  ASSERT_TRUE(runtime_->Free(b).ok());
  ASSERT_TRUE(runtime_->Prefetch(a).ok());
  ASSERT_EQ(StateOf(a), TensorState::kPrefetching);
  // The policy now asks to drop a, which a does not allow: nothing is evicted,
  // and a must still be waited for, not taken for resident with its copy in
  // still running.
  policy->action = policies::EvictAction::kDrop;
  EXPECT_FALSE(runtime_->Create(6 * kMiB, TensorOptions{}).ok());
  EXPECT_EQ(StateOf(a), TensorState::kPrefetching);
  ASSERT_TRUE(runtime_->CheckInvariants().ok()) << runtime_->CheckInvariants();
  Check(a);
}

TEST_F(RuntimeTest, WithAPrefetchWindowTheRuntimePrefetchesWhatItsHintsSayComesSoon) {
  // No Prefetch call anywhere: the runtime plans from the hints itself.
  Make(8 * kMiB, {.policy = "hybrid:prefetch_us=100", .enable_drop = false});
  TensorId soon = Produce(3 * kMiB, {}, false, true);
  TensorId later = Produce(3 * kMiB, {}, false, true);
  ASSERT_TRUE(runtime_->HintNextUse(soon, runtime_->NowNs() + 50'000).ok());
  ASSERT_TRUE(runtime_->HintNextUse(later, runtime_->NowNs() + 10'000'000'000).ok());
  TensorId big = Produce(6 * kMiB, {}, false, false);  // both go to the host
  for (TensorId t : {soon, later}) {
    ASSERT_TRUE(StateOf(t) == TensorState::kOffloading || StateOf(t) == TensorState::kOnHost);
  }
  EXPECT_EQ(runtime_->stats().prefetches, 0u);  // due, but no room while `big` lives
  ASSERT_TRUE(runtime_->Free(big).ok());
  // The next look (a Create, an Acquire or a hint) brings back what is due, and only that.
  Produce(kMiB, {}, false, false);
  EXPECT_EQ(StateOf(soon), TensorState::kPrefetching);
  EXPECT_TRUE(StateOf(later) == TensorState::kOffloading || StateOf(later) == TensorState::kOnHost);
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  Check(soon);
  Check(later);  // brought back on access, with its bytes
  ASSERT_TRUE(runtime_->CheckInvariants().ok()) << runtime_->CheckInvariants();
}

TEST_F(RuntimeTest, APlannedPrefetchStartsItsCopysTimeBeforeTheUseNotAWholeWindowBefore) {
  // Started a whole window early, a prefetch only holds memory the budget
  // is short of. Within the window it starts twice its copy's time (3 MiB
  // at 25 GB/s: about 0.13 ms) before the use.
  Make(8 * kMiB, {.policy = "hybrid:prefetch_us=10000,slack=2", .enable_drop = false});
  TensorId t = Produce(3 * kMiB, {}, false, true);
  ASSERT_TRUE(runtime_->HintNextUse(t, runtime_->NowNs() + 5'000'000).ok());
  TensorId big = Produce(6 * kMiB, {}, false, false);  // t goes to the host
  ASSERT_TRUE(StateOf(t) == TensorState::kOffloading || StateOf(t) == TensorState::kOnHost);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Work(1000);  // room now, and the use within the window, but not yet due
  Work(1000);
  EXPECT_EQ(runtime_->stats().prefetches, 0u);
  Work(4'600'000);  // about 0.4 ms before the use
  Work(1000);
  EXPECT_EQ(runtime_->stats().prefetches, 0u);
  Work(300'000);  // about 0.1 ms before: due
  Work(1000);
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  EXPECT_EQ(StateOf(t), TensorState::kPrefetching);
  Check(t);
  ASSERT_TRUE(runtime_->CheckInvariants().ok()) << runtime_->CheckInvariants();
}

TEST_F(RuntimeTest, APrefetchEvictedBeforeItsUseIsNotPlannedAgainUntilTheUse) {
  // Planned again, it would take room from what then evicts it once more.
  // One hint throughout: the offload that evicts the prefetch must not plan
  // it again for the same use.
  Make(8 * kMiB, {.policy = "hybrid:prefetch_us=1000", .enable_drop = false});
  TensorId t = Produce(3 * kMiB, {}, false, true);
  ASSERT_TRUE(runtime_->HintNextUse(t, runtime_->NowNs() + 200'000).ok());
  TensorId big = Produce(6 * kMiB, {}, false, false);  // t goes to the host
  ASSERT_TRUE(runtime_->Free(big).ok());
  Work();  // due, and room
  ASSERT_EQ(StateOf(t), TensorState::kPrefetching);
  big = Produce(6 * kMiB, {}, false, true);  // no room unless t goes again
  ASSERT_TRUE(StateOf(t) == TensorState::kOffloading || StateOf(t) == TensorState::kOnHost);
  ASSERT_TRUE(runtime_->Free(big).ok());
  Work();  // still due, and room again: not planned
  Work();
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  EXPECT_NE(StateOf(t), TensorState::kPrefetching);
  ASSERT_TRUE(runtime_->HintNextUse(t, runtime_->NowNs() + 50'000).ok());  // nor hinted again
  Work();
  EXPECT_EQ(runtime_->stats().prefetches, 1u);
  Check(t);  // back on access, with its bytes; then planned again as before
  big = Produce(6 * kMiB, {}, false, false);
  ASSERT_TRUE(runtime_->Free(big).ok());
  ASSERT_TRUE(runtime_->HintNextUse(t, runtime_->NowNs() + 50'000).ok());
  Work();
  EXPECT_EQ(runtime_->stats().prefetches, 2u);
  Check(t);
  ASSERT_TRUE(runtime_->CheckInvariants().ok()) << runtime_->CheckInvariants();
}

TEST_F(RuntimeTest, CopiesInQueuedStartAPrefetchEarlierButNeverBeforeItsWindow) {
  // a's 100 MiB prefetch holds the link in for about 4.2 ms (25 GB/s).
  // Behind it, b's copy lands that much later: b is due at once where its
  // use is 3 ms off. With a 1 ms window, a use 1.9 ms off waits all the same.
  auto run = [&](const char* policy, bool queue_a, std::int64_t b_use_ns) {
    Make(512 * kMiB, {.policy = policy, .enable_drop = false});
    TensorId a = Produce(100 * kMiB, {}, false, true);
    TensorId b = Produce(3 * kMiB, {}, false, true);
    EXPECT_TRUE(*runtime_->Evict(a, policies::EvictAction::kOffload));
    EXPECT_TRUE(*runtime_->Evict(b, policies::EvictAction::kOffload));
    Work(/*cost_ns=*/5'000'000);  // the copies out done
    if (queue_a) EXPECT_TRUE(runtime_->HintNextUse(a, runtime_->NowNs() + 50'000).ok());
    const std::uint64_t before = runtime_->stats().prefetches;
    EXPECT_TRUE(runtime_->HintNextUse(b, runtime_->NowNs() + b_use_ns).ok());
    return runtime_->stats().prefetches - before;
  };
  EXPECT_EQ(run("hybrid:prefetch_us=10000", /*queue_a=*/false, 3'000'000), 0u);
  EXPECT_EQ(run("hybrid:prefetch_us=10000", /*queue_a=*/true, 3'000'000), 1u);
  EXPECT_EQ(run("hybrid:prefetch_us=1000,slack=1000", /*queue_a=*/true, 1'900'000), 0u);
  EXPECT_EQ(run("hybrid:prefetch_us=1000,slack=1000", /*queue_a=*/true, 900'000), 1u);
}

// A step that repeats, as a training loop's do: six 4 MiB tensors made, then
// each used once in the order they were made, with work between the uses.
// Returns the recomputes (or, offloading, the restores that found nothing
// prefetched) the step took.
struct StepFigures {
  std::uint64_t recomputes = 0;
  std::uint64_t prefetches = 0;
};

class LearnedStepTest : public RuntimeTest {
 protected:
  StepFigures Step(bool drop) {
    const RuntimeStats before = runtime_->stats();
    std::vector<TensorId> ids;
    for (int i = 0; i < 6; ++i) ids.push_back(Produce(4 * kMiB, {}, drop, !drop));
    for (TensorId id : ids) {
      Check(id);
      Work(/*cost_ns=*/200'000);
    }
    for (TensorId id : ids) EXPECT_TRUE(runtime_->Free(id).ok());
    EXPECT_TRUE(runtime_->EndStep().ok());
    const RuntimeStats after = runtime_->stats();
    return {after.recomputes - before.recomputes, after.prefetches - before.prefetches};
  }
};

TEST_F(LearnedStepTest, BeladyGoesByTheStepBeforeOnceOneHasEnded) {
  Make(0, {.policy = "belady",
           .enable_offload = false,
           .live_budget = 13 * kMiB,
           .learn_next_use = true});
  const StepFigures first = Step(/*drop=*/true);
  EXPECT_EQ(runtime_->stats().learned_next_uses, 0u);  // nothing to go by yet
  const StepFigures second = Step(/*drop=*/true);
  const StepFigures third = Step(/*drop=*/true);
  EXPECT_GT(runtime_->stats().learned_next_uses, 0u);
  EXPECT_EQ(runtime_->stats().steps_ended, 3u);
  // Without a future every tensor looks never used again; with the step
  // before's, belady keeps what comes next.
  EXPECT_GT(first.recomputes, 0u);
  EXPECT_LT(second.recomputes, first.recomputes);
  EXPECT_EQ(third.recomputes, second.recomputes);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(LearnedStepTest, HybridPrefetchesWhatTheStepBeforeSaysComesNext) {
  Make(0, {.policy = "hybrid:prefetch_us=300",
           .enable_drop = false,
           .live_budget = 13 * kMiB,
           .learn_next_use = true});
  const StepFigures first = Step(/*drop=*/false);
  const StepFigures second = Step(/*drop=*/false);
  EXPECT_EQ(first.prefetches, 0u);  // no hint, no plan
  EXPECT_GT(second.prefetches, 0u);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(LearnedStepTest, EndStepNeedsTheOptionAndOldTensorsAreNotEstimated) {
  Make(0, {.policy = "belady", .live_budget = 64 * kMiB});
  EXPECT_EQ(runtime_->EndStep().code(), absl::StatusCode::kFailedPrecondition);
  Make(0, {.policy = "belady", .live_budget = 64 * kMiB, .learn_next_use = true});
  TensorId kept = Produce(kMiB, {}, true, false);  // made in step 1, outlives it
  Check(kept);
  ASSERT_TRUE(runtime_->EndStep().ok());
  const std::uint64_t learned = runtime_->stats().learned_next_uses;
  Check(kept);  // index 0 of a step that has ended: no estimate
  EXPECT_EQ(runtime_->stats().learned_next_uses, learned);
  TensorId fresh = Produce(kMiB, {}, true, false);  // index 0 of step 2: estimated
  EXPECT_EQ(runtime_->stats().learned_next_uses, learned + 1);
  Check(fresh);
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

TEST_F(LearnedStepTest, WhatAClosureDoesIsNotTheProgramsUse) {
  // A closure's acquires depend on what the policy dropped: counted as uses,
  // they would shift every later tensor's place from step to step.
  Make(0, {.policy = "lru",
           .enable_offload = false,
           .live_budget = 12 * kMiB,
           .learn_next_use = true});
  Runtime* rt = runtime_.get();
  std::uint64_t learned_by_acquire = 0;
  for (int step = 0; step < 2; ++step) {
    TensorId side = Produce(kMiB, {}, false, false);
    TensorOptions options;
    options.allow_drop = true;
    options.recompute = [rt, side](const RecomputeArgs&) -> absl::Status {
      absl::StatusOr<Guard> g = rt->Acquire(side);  // back into the runtime
      if (!g.ok()) return g.status();
      absl::StatusOr<Guard> tmp = rt->Create(64 * kKiB, TensorOptions{});
      if (!tmp.ok()) return tmp.status();
      const TensorId id = tmp->id();
      tmp->Release();
      return rt->Free(id);
    };
    auto a = runtime_->Create(4 * kMiB, std::move(options));
    ASSERT_TRUE(a.ok()) << a.status();
    const TensorId a_id = a->id();
    a->Release();
    TensorId big = Produce(8 * kMiB, {}, false, false);  // a goes
    ASSERT_EQ(StateOf(a_id), TensorState::kDropped);
    ASSERT_TRUE(runtime_->Free(big).ok());
    const std::uint64_t before = runtime_->stats().learned_next_uses;
    ASSERT_TRUE(runtime_->Acquire(a_id).ok());  // recomputed: the closure acquires `side`
    learned_by_acquire = runtime_->stats().learned_next_uses - before;
    ASSERT_TRUE(runtime_->Free(a_id).ok());
    ASSERT_TRUE(runtime_->Free(side).ok());
    ASSERT_TRUE(runtime_->EndStep().ok());
  }
  EXPECT_EQ(learned_by_acquire, 1u);  // the program's acquire, not the closure's
  ASSERT_NO_FATAL_FAILURE(CheckInvariants());
}

}  // namespace
}  // namespace remat
