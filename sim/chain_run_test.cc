#include "sim/chain_run.h"

#include <algorithm>
#include <string>

#include "gen/revolve.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

ChainRunReport RunOk(std::int64_t steps, std::int64_t slots, const std::string& policy) {
  absl::StatusOr<ChainRunReport> r = RunChain({.steps = steps, .slots = slots, .policy = policy});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ChainRunReport{};
}

// The planner's schedule, carried out by the runtime within C + 3 states,
// takes exactly the optimal number of advances, and the runtime neither drops
// nor recomputes anything on its own.
TEST(ChainRunTest, RevolveThroughTheRuntimeIsOptimal) {
  for (std::int64_t n = 1; n <= 40; ++n) {
    for (std::int64_t c = 1; c <= 6; ++c) {
      SCOPED_TRACE(testing::Message() << "N=" << n << " C=" << c);
      const ChainRunReport r = RunOk(n, c, "revolve");
      EXPECT_EQ(r.status, "ok") << r.message;
      EXPECT_EQ(r.advances, *revolve::OptimalAdvances(n, c));
      EXPECT_EQ(r.advances, r.optimal_advances);
      EXPECT_EQ(r.ratio, 1.0);
      EXPECT_EQ(r.reversed_steps, static_cast<std::uint64_t>(n));
      EXPECT_EQ(r.forward_steps, r.advances + static_cast<std::uint64_t>(n));
      EXPECT_EQ(r.recomputes, 0u);
      EXPECT_EQ(r.evictions, 0u);
      EXPECT_LE(r.peak_resident_bytes, r.budget_bytes);
      EXPECT_EQ(r.budget_states, std::min(c, n) + 3);
    }
  }
  const ChainRunReport big = RunOk(1000, 7, "revolve");
  EXPECT_EQ(big.status, "ok");
  EXPECT_EQ(big.advances, *revolve::OptimalAdvances(1000, 7));
}

TEST(ChainRunTest, StoringEverythingTakesOnlyTheFirstSweep) {
  for (const std::string policy : {"revolve", "dtr", "lru", "largest"}) {
    SCOPED_TRACE(policy);
    const ChainRunReport r = RunOk(30, 30, policy);
    EXPECT_EQ(r.status, "ok") << r.message;
    EXPECT_EQ(r.advances, 29u);
    EXPECT_EQ(r.optimal_advances, 29u);
    EXPECT_EQ(r.repeated_advances, 0u);
    EXPECT_EQ(r.recomputes, 0u);
  }
  const ChainRunReport one = RunOk(1, 3, "dtr");
  EXPECT_EQ(one.advances, 0u);
  EXPECT_EQ(one.optimal_advances, 0u);
  EXPECT_EQ(one.ratio, 1.0);
}

// Online policies see the same memory as the planner (C slots' worth of
// states besides the working state, the step's output and the adjoint), so
// none can beat it; the runtime's recomputes are their repeated advances.
TEST(ChainRunTest, OnlinePoliciesNeverBeatTheOptimum) {
  for (const std::string policy : {"dtr", "lru", "largest"}) {
    for (std::int64_t n : {2, 9, 37, 100}) {
      for (std::int64_t c : {1, 2, 5}) {
        SCOPED_TRACE(testing::Message() << policy << " N=" << n << " C=" << c);
        const ChainRunReport r = RunOk(n, c, policy);
        EXPECT_EQ(r.status, "ok") << r.message;
        EXPECT_GE(r.advances, r.optimal_advances);
        EXPECT_GE(r.ratio, 1.0);
        EXPECT_EQ(r.reversed_steps, static_cast<std::uint64_t>(n));
        EXPECT_EQ(r.forward_steps, r.advances + static_cast<std::uint64_t>(n));
        EXPECT_EQ(r.recomputes, r.repeated_advances);
        EXPECT_LE(r.peak_resident_bytes, r.budget_bytes);
      }
    }
  }
}

TEST(ChainRunTest, Deterministic) {
  const ChainRunReport a = RunOk(100, 5, "dtr");
  const ChainRunReport b = RunOk(100, 5, "dtr");
  EXPECT_EQ(a.advances, b.advances);
  EXPECT_EQ(a.time_ns, b.time_ns);
  EXPECT_EQ(a.policy, b.policy);
}

TEST(ChainRunTest, BadInputIsAClearError) {
  auto message = [](ChainRunOptions o) {
    absl::StatusOr<ChainRunReport> r = RunChain(o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message({.steps = 0, .slots = 3}), HasSubstr("at least 1 step"));
  EXPECT_THAT(message({.steps = 10, .slots = 0}), HasSubstr("at least 1 slot"));
  EXPECT_THAT(message({.steps = 10, .slots = 2, .policy = "nope"}),
              HasSubstr("unknown policy 'nope'"));
  EXPECT_THAT(message({.steps = 10, .slots = 2, .policy = "nope"}), HasSubstr("revolve"));
  EXPECT_THAT(message({.steps = 10, .slots = 2, .state_bytes = 0}), HasSubstr("state size"));
}

TEST(ChainRunTest, WorkPastTheLimitIsRefusedBeforeTheRunWithTheSlotsThatFit) {
  // One slot: t(1000, 1) + 1000 = 500,500 forward steps.
  absl::StatusOr<ChainRunReport> r =
      RunChain({.steps = 1000, .slots = 1, .max_forward_steps = 100'000});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  const std::string message(r.status().message());
  EXPECT_THAT(message, HasSubstr("takes at least 500500 forward steps"));
  EXPECT_THAT(message, HasSubstr("more than the 100000 a run may take"));
  EXPECT_THAT(message, HasSubstr("at most 446 steps with 1 slot"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("1 slots")));
  // The slots it names fit; one fewer does not.
  const std::size_t at = message.find("--slots ");
  ASSERT_NE(at, std::string::npos) << message;
  const std::int64_t slots = std::stoll(message.substr(at + 8));
  EXPECT_TRUE(RunChain({.steps = 1000, .slots = slots, .max_forward_steps = 100'000}).ok());
  EXPECT_FALSE(RunChain({.steps = 1000, .slots = slots - 1, .max_forward_steps = 100'000}).ok());
  EXPECT_TRUE(RunChain({.steps = 446, .slots = 1, .max_forward_steps = 100'000}).ok());
  // The default limit keeps ordinary chains.
  EXPECT_TRUE(RunChain({.steps = 2000, .slots = 1}).ok());
  EXPECT_EQ(RunChain({.steps = 20'000, .slots = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChainRunTest, AnOnlinePolicyIsStoppedAtTheLimit) {
  // Its least work fits; what lru recomputes with 2 slots does not.
  absl::StatusOr<ChainRunReport> r =
      RunChain({.steps = 200, .slots = 2, .policy = "lru", .max_forward_steps = 3'000});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("stopped after 3000 forward steps"));
}

TEST(ChainRunTest, BeladyIsRefusedForItHasNoFuture) {
  absl::StatusOr<ChainRunReport> r = RunChain({.steps = 10, .slots = 2, .policy = "belady"});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("next use"));
}

TEST(ChainRunTest, TheScheduleIsPartOfTheJson) {
  absl::StatusOr<ChainRunReport> r =
      RunChain({.steps = 3, .slots = 1, .policy = "revolve", .keep_schedule = true});
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string json = ChainReportToJson(*r);
  EXPECT_THAT(json, HasSubstr("\"schedule\":[{\"action\":\"takeshot\",\"position\":0,"
                              "\"slot\":0},{\"action\":\"advance\",\"position\":0,\"steps\":2}"));
  EXPECT_THAT(json, HasSubstr("{\"action\":\"firsturn\",\"position\":2}"));
}

TEST(ChainRunTest, JsonCarriesTheFigures) {
  absl::StatusOr<ChainRunReport> r = RunChain({.steps = 10, .slots = 2, .policy = "revolve"});
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string json = ChainReportToJson(*r);
  for (const char* key :
       {"\"steps\":10", "\"slots\":2", "\"policy\":\"revolve\"", "\"status\":\"ok\"",
        "\"advances\":", "\"optimal_advances\":", "\"ratio\":1", "\"wall_seconds\":"}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
}

}  // namespace
}  // namespace remat
