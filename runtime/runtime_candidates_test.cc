// What policies see: the candidates, their evicted neighbourhood, DTR's
// classes, hints and history, backlogs, and sampling.
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/eviction_policy.h"
#include "runtime/runtime_test_fixture.h"

namespace remat {

ScriptedChain RuntimeTest::ProduceScriptedChain(std::shared_ptr<policies::EvictionPolicy> policy) {
  // The script's plans as they are (not met in one place instead).
  Make(22 * kMiB, {.custom_policy = std::move(policy), .retry_in_one_place = false});
  ScriptedChain t;
  t.x = Produce(kMiB, {}, false, false);
  t.a = Produce(2 * kMiB, {t.x}, true, false, 10'000);
  t.b = Produce(3 * kMiB, {t.a}, true, false, 20'000);
  t.c = Produce(4 * kMiB, {t.b}, true, false, 30'000);
  t.d = Produce(5 * kMiB, {t.c}, true, false, 40'000);
  t.e = Produce(8 * kMiB, {}, false, false);
  return t;
}

namespace {

// Evicts the candidates of the sizes it is told, event by event, and keeps
// what it was shown: candidates are known by their sizes.
class ScriptedPolicy : public policies::EvictionPolicy {
 public:
  explicit ScriptedPolicy(std::vector<std::vector<std::size_t>> script)
      : script_(std::move(script)) {}
  policies::Plan Choose(const policies::PressureContext& ctx) override {
    shown.emplace_back(ctx.candidates.begin(), ctx.candidates.end());
    const std::size_t event = shown.size() - 1;
    policies::Plan plan;
    if (event >= script_.size()) return plan;
    for (std::size_t bytes : script_[event]) {
      for (const policies::Candidate& c : ctx.candidates) {
        if (c.bytes == bytes) plan.push_back({c.id, policies::EvictAction::kDrop});
      }
    }
    return plan;
  }
  std::vector<std::vector<policies::Candidate>> shown;
  const std::vector<std::vector<std::size_t>>& script() const { return script_; }

 protected:
  std::string OwnSpec() const override { return "scripted"; }

 private:
  std::vector<std::vector<std::size_t>> script_;
};

const policies::Candidate* BySize(const std::vector<policies::Candidate>& cs, std::size_t bytes) {
  for (const policies::Candidate& c : cs) {
    if (c.bytes == bytes) return &c;
  }
  return nullptr;
}

std::vector<std::vector<std::size_t>> ChainScript() { return {{3 * kMiB, 4 * kMiB}, {5 * kMiB}}; }

TEST_F(RuntimeTest, CandidatesCarryTheirEvictedNeighbourhood) {
  // b and c get dropped, then a's dropped consumer (b) and d's dropped
  // ancestors (c, b) show in their costs.
  auto policy = std::make_shared<ScriptedPolicy>(ChainScript());
  const auto [x, a, b, c, d, e] = ProduceScriptedChain(policy);
  ASSERT_GE(policy->shown.size(), 2u);
  EXPECT_EQ(StateOf(b), TensorState::kDropped);
  EXPECT_EQ(StateOf(c), TensorState::kDropped);
  EXPECT_EQ(StateOf(d), TensorState::kDropped);
  const std::vector<policies::Candidate>& second = policy->shown[1];
  ASSERT_EQ(second.size(), 2u);  // a and d: x may not go, b and c are gone
  ASSERT_NE(BySize(second, 2 * kMiB), nullptr);
  ASSERT_NE(BySize(second, 5 * kMiB), nullptr);
  EXPECT_EQ(BySize(second, 2 * kMiB)->neighbourhood_ns, 20'000);  // b waits on a
  EXPECT_EQ(BySize(second, 5 * kMiB)->neighbourhood_ns, 50'000);  // d needs c and b first
  EXPECT_EQ(BySize(second, 5 * kMiB)->compute_ns, 40'000);
  // Recomputing d brings c and b back, in the room e leaves.
  ASSERT_TRUE(runtime_->Free(e).ok());
  Check(d);
  EXPECT_EQ(StateOf(c), TensorState::kResident);
  EXPECT_EQ(runtime_->stats().recomputes, 3u);
  Check(a);
}

TEST_F(RuntimeTest, ANeighbourhoodLeftOutIsFilledInOnRequest) {
  // As above, for a policy that does not score by the neighbourhood: the
  // candidates leave their ancestors out, and Complete fills them in.
  struct Lazy : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.neighbourhood = false}; }
    policies::Plan Choose(const policies::PressureContext& ctx) override {
      completed.clear();
      for (policies::Candidate c : ctx.candidates) {
        ctx.Complete(c);
        completed.push_back(c);
      }
      return ScriptedPolicy::Choose(ctx);
    }
    std::vector<policies::Candidate> completed;
  };
  auto policy = std::make_shared<Lazy>(ChainScript());
  ProduceScriptedChain(policy);
  ASSERT_GE(policy->shown.size(), 2u);
  const policies::Candidate* shown = BySize(policy->shown[1], 5 * kMiB);
  const policies::Candidate* full = BySize(policy->completed, 5 * kMiB);
  ASSERT_NE(shown, nullptr);
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(shown->ancestors_ns, 0);  // left out
  EXPECT_EQ(full->ancestors_ns, 50'000);  // c and b, filled in
  EXPECT_EQ(full->neighbourhood_ns, 50'000);
  const policies::Candidate* a_full = BySize(policy->completed, 2 * kMiB);
  ASSERT_NE(a_full, nullptr);
  EXPECT_EQ(a_full->consumers_ns, 20'000);  // always there
}

TEST_F(RuntimeTest, CandidatesCarryClassesFreeNeighboursHintsAndHistory) {
  // x -> a -> b -> c; b and c dropped (one class, 50 us). Then a's classes,
  // its free neighbours, its next-use hint and its recompute count show.
  auto policy = std::make_shared<ScriptedPolicy>(
      std::vector<std::vector<std::size_t>>{{3 * kMiB, 4 * kMiB}, {}});
  struct Needing : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.classes = true, .adjacent_free = true}; }
  };
  auto needing = std::make_shared<Needing>(policy->script());
  Make(22 * kMiB, {.custom_policy = needing, .retry_in_one_place = false});
  TensorId x = Produce(kMiB, {}, false, false);
  TensorId a = Produce(2 * kMiB, {x}, true, false, 10'000);
  TensorId b = Produce(3 * kMiB, {a}, true, false, 20'000);
  Produce(4 * kMiB, {b}, true, false, 30'000);
  ASSERT_TRUE(runtime_->HintNextUse(a, device_->NowNs() + 5'000'000).ok());
  EXPECT_FALSE(runtime_->HintNextUse(a, -1).ok());
  EXPECT_FALSE(runtime_->HintNextUse(999, 0).ok());
  // 19 MiB cannot fit even once b and c are gone: a second event shows a
  // among its freed neighbours; then nothing more goes, and it fails.
  EXPECT_TRUE(absl::IsResourceExhausted(runtime_->Create(19 * kMiB, TensorOptions{}).status()));
  ASSERT_GE(needing->shown.size(), 2u);
  const policies::Candidate* ca = BySize(needing->shown[1], 2 * kMiB);
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(ca->classes_ns, 50'000);              // b and c: one class
  EXPECT_EQ(ca->consumers_ns, 20'000);            // b reads a
  EXPECT_EQ(ca->adjacent_free_bytes, 18 * kMiB);  // b's, c's and the rest, coalesced
  EXPECT_GT(ca->next_use_ns, 4'000'000);
  EXPECT_LE(ca->next_use_ns, 5'000'000);
  EXPECT_EQ(ca->accesses, 2u);  // created, then read to produce b
  EXPECT_EQ(ca->recomputes, 0u);
}

TEST_F(RuntimeTest, AHintedUseIsPushedBackByTheRecomputesRunSinceTheHint) {
  // a's use is hinted 5 ms ahead of the program's time. A 2 ms recompute
  // runs before the program gets there: the use comes 2 ms later than the
  // clock alone says (without this, under a tight budget hinted uses lie in
  // the past, read as due now).
  auto policy = std::make_shared<ScriptedPolicy>(std::vector<std::vector<std::size_t>>{});
  struct Hinted : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.next_use = true}; }
  };
  auto hinted = std::make_shared<Hinted>(policy->script());
  Make(16 * kMiB, {.custom_policy = hinted});
  TensorId x = Produce(kMiB, {}, false, false);
  TensorId a = Produce(2 * kMiB, {x}, true, false, 10'000);
  TensorId d = Produce(3 * kMiB, {x}, true, false, 2'000'000);
  Check(d);
  const std::int64_t hint = runtime_->NowNs() + 5'000'000;
  ASSERT_TRUE(runtime_->HintNextUse(a, hint).ok());
  ASSERT_TRUE(*runtime_->Evict(d, policies::EvictAction::kDrop));
  Check(d);  // regenerated: 2 ms of recompute
  EXPECT_EQ(runtime_->stats().recompute_ns, 2'000'000);
  const std::int64_t now = runtime_->NowNs();
  ASSERT_LT(now, hint);
  ASSERT_TRUE(runtime_->EvictBytes(kMiB).ok());  // a pressure event: what the policy is shown
  ASSERT_EQ(hinted->shown.size(), 1u);
  const policies::Candidate* ca = BySize(hinted->shown[0], 2 * kMiB);
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(ca->next_use_ns, hint + 2'000'000 - now);
  // A hint given after the recompute is not pushed back by it.
  ASSERT_TRUE(runtime_->HintNextUse(a, now + 1'000'000).ok());
  ASSERT_TRUE(runtime_->EvictBytes(kMiB).ok());
  ASSERT_EQ(hinted->shown.size(), 2u);
  ca = BySize(hinted->shown[1], 2 * kMiB);
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(ca->next_use_ns, 1'000'000);
}

TEST_F(RuntimeTest, ALearnedUseIsPushedBackOnlyByTheRecomputesRunSinceItWasLearned) {
  // The same for a next use learned from the step before. Two steps of the
  // same program; in the second, y is dropped and regenerated (2 ms) before
  // a is made and its next use learned. a is then shown exactly as far from
  // its use as without that recompute: a recompute before the learning is
  // in the learned time already, not a delay to add.
  struct Hinted : ScriptedPolicy {
    using ScriptedPolicy::ScriptedPolicy;
    policies::Needs needs() const override { return {.next_use = true}; }
  };
  auto shown_next_use = [&](bool recompute_first) -> std::int64_t {
    auto hinted = std::make_shared<Hinted>(std::vector<std::vector<std::size_t>>{});
    Make(16 * kMiB, {.custom_policy = hinted, .learn_next_use = true});
    std::int64_t next_use = -1;
    for (int step = 0; step < 2; ++step) {
      TensorId x = Produce(kMiB, {}, false, false);
      TensorId y = Produce(3 * kMiB, {x}, true, false, 2'000'000);
      if (step == 1 && recompute_first) {
        EXPECT_TRUE(*runtime_->Evict(y, policies::EvictAction::kDrop));
      }
      Check(y);
      TensorId a = Produce(2 * kMiB, {x}, true, false, 10'000);
      if (step == 1) {
        EXPECT_TRUE(runtime_->EvictBytes(kMiB).ok());  // what the policy is shown
        const policies::Candidate* ca = BySize(hinted->shown.back(), 2 * kMiB);
        if (ca != nullptr) next_use = ca->next_use_ns;
      }
      Work(/*cost_ns=*/5'000'000);
      Check(a);
      for (TensorId t : {a, y, x}) EXPECT_TRUE(runtime_->Free(t).ok());
      EXPECT_TRUE(runtime_->EndStep().ok());
    }
    EXPECT_EQ(runtime_->stats().recompute_ns, recompute_first ? 2'000'000 : 0);
    return next_use;
  };
  const std::int64_t plain = shown_next_use(false);
  ASSERT_GT(plain, 0);  // learned, and not yet due
  EXPECT_EQ(shown_next_use(true), plain);
}

TEST_F(RuntimeTest, PoliciesSeeTheRestoresOwedForWhatIsOffloaded) {
  // Offloads every candidate it may; records what the link owes at each event.
  struct Offloading : policies::EvictionPolicy {
    policies::Plan Choose(const policies::PressureContext& ctx) override {
      restore_backlog.push_back(ctx.restore_backlog_ns);
      policies::Plan plan;
      for (const policies::Candidate& c : ctx.candidates) {
        if (c.can_offload) plan.push_back({c.id, policies::EvictAction::kOffload});
      }
      return plan;
    }
    std::string OwnSpec() const override { return "offloading"; }
    std::vector<std::int64_t> restore_backlog;
  };
  auto policy = std::make_shared<Offloading>();
  Make(8 * kMiB, {.custom_policy = policy, .link_gbps = 25.0, .retry_in_one_place = false});
  TensorId a = Produce(4 * kMiB, {}, false, true);
  TensorId big = Produce(6 * kMiB, {}, false, false);  // a goes to the host
  EXPECT_NE(StateOf(a), TensorState::kResident);
  // At the next event the policy sees a's restore owed.
  TensorId c = Produce(kMiB, {}, false, true);
  Produce(2 * kMiB, {}, false, false);
  EXPECT_NE(StateOf(c), TensorState::kResident);
  ASSERT_EQ(policy->restore_backlog.size(), 2u);
  EXPECT_EQ(policy->restore_backlog[0], 0);
  EXPECT_EQ(policy->restore_backlog[1], static_cast<std::int64_t>(4 * kMiB / 25.0));
  ASSERT_TRUE(runtime_->Free(big).ok());
  Check(a);  // both come back byte for byte
  Check(c);
}

TEST_F(RuntimeTest, APolicyThatSamplesSeesOnlyItsSample) {
  // Ten droppable 1 MiB tensors fill the budget; each new one needs one out.
  for (const char* spec : {"lru", "lru:sample=1"}) {
    SCOPED_TRACE(spec);
    Make(12 * kMiB, {.policy = spec});
    TensorId x = Produce(kMiB, {}, false, false);
    for (int i = 0; i < 40; ++i) Produce(kMiB, {x}, true, false);
    const RuntimeStats st = runtime_->stats();
    ASSERT_GT(st.pressure_events, 0u);
    if (std::string(spec) == "lru") {
      // Every unpinned droppable tensor is a candidate of every event.
      EXPECT_GE(st.candidates_shown, st.pressure_events * 5);
    } else {
      EXPECT_EQ(st.candidates_shown, st.pressure_events);
    }
    EXPECT_GT(st.choose_wall_ns, 0);
  }
}

TEST_F(RuntimeTest, ARequestThePolicysChoicesWouldScatterIsMetInOnePlace) {
  // Ten 2 MiB tensors fill the budget's one 20 MiB segment, and every other
  // one was just used: lru's choices for a 4 MiB request, the stale ones,
  // lie apart and free no 4 MiB hole. By default the runtime then evicts the
  // cheapest pair of neighbours instead: two drops, one pressure event.
  // Asked to retry anywhere, it follows lru until two neighbours happen to
  // be gone: three pressure events, six drops.
  for (const int mode : {0, 1, 2}) {  // in one place: asked, set later (a step planner), not
    const bool one_place = mode != 2;
    SCOPED_TRACE(mode == 0 ? "in one place" : mode == 1 ? "set in one place" : "anywhere");
    Make(20 * kMiB, {.policy = "lru", .enable_offload = false, .retry_in_one_place = mode == 0});
    if (mode == 1) runtime_->SetRetryInOnePlace(true);
    std::vector<TensorId> ts;
    for (int i = 0; i < 10; ++i) ts.push_back(Produce(2 * kMiB, {}, true, false));
    for (int i = 0; i < 10; i += 2) Check(ts[i]);
    const TensorId big = Produce(4 * kMiB, {}, true, false);
    ASSERT_NE(big, 0u);
    const RuntimeStats st = runtime_->stats();
    EXPECT_EQ(st.drops, one_place ? 2u : 6u);
    EXPECT_EQ(st.pressure_events, one_place ? 1u : 3u);
    EXPECT_EQ(st.covering_runs, one_place ? 1u : 0u);
    EXPECT_EQ(alloc_->GetStats().reserved_bytes.all().peak, 20 * static_cast<std::int64_t>(kMiB));
    CheckInvariants();
    // Whatever went comes back with its bytes.
    for (TensorId t : ts) Check(t, /*allow_oom=*/false);
    CheckInvariants();
  }
}

}  // namespace
}  // namespace remat
