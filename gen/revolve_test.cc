#include "gen/revolve.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat::revolve {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kMaxN = 120;
constexpr std::int64_t kMaxC = 8;

// The classic recursion, in Revolve's conventions. T(n, c): fewest advances to
// reverse n steps from a start state held in one of c slots.
//   T(1, c) = 0                        turn at once
//   T(n, 1) = (n - 1) + T(n - 1, 1)    walk to the last step, turn, start over
//   T(n, c) = min over 1 <= k < n of   k + T(n - k, c - 1) + T(k, c)
// for c >= 2: advance k, store x_k in a second slot, reverse the last n - k
// steps from it with the c - 1 slots left, free it, restore the start and
// reverse the first k steps with all c. (Not storing at all is k = n - 1.)
std::vector<std::vector<std::uint64_t>> DynamicProgram(std::int64_t max_n, std::int64_t max_c) {
  std::vector<std::vector<std::uint64_t>> t(static_cast<std::size_t>(max_n + 1),
                                            std::vector<std::uint64_t>(max_c + 1, 0));
  for (std::int64_t c = 1; c <= max_c; ++c) {
    for (std::int64_t n = 2; n <= max_n; ++n) {
      if (c == 1) {
        t[n][1] = static_cast<std::uint64_t>(n - 1) + t[n - 1][1];
        continue;
      }
      std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
      for (std::int64_t k = 1; k < n; ++k) {
        best = std::min(best, static_cast<std::uint64_t>(k) + t[n - k][c - 1] + t[k][c]);
      }
      t[n][c] = best;
    }
  }
  return t;
}

// Fewest advances over every strategy, found by a shortest-path search over
// (stored states, working state, next step to reverse): stores, frees and
// restores in any order, any number of states up to `slots`, advances of one
// step. Only for small chains.
std::uint64_t BruteForce(int steps, int slots) {
  const int states = steps;  // x0..x_{steps-1}; xN is never needed
  const std::size_t masks = std::size_t{1} << states;
  // index = ((remaining * (states + 1)) + working + 1) * masks + mask
  auto index = [&](int remaining, int working, std::uint32_t mask) {
    return (static_cast<std::size_t>(remaining) * (states + 1) + (working + 1)) * masks + mask;
  };
  const std::size_t total = index(steps + 1, -1, 0);
  std::vector<std::uint64_t> dist(total, std::numeric_limits<std::uint64_t>::max());
  std::deque<std::size_t> queue;
  auto relax = [&](std::size_t from, int remaining, int working, std::uint32_t mask,
                   std::uint64_t cost) {
    const std::size_t to = index(remaining, working, mask);
    if (dist[from] + cost < dist[to]) {
      dist[to] = dist[from] + cost;
      if (cost == 0) {
        queue.push_front(to);
      } else {
        queue.push_back(to);
      }
    }
  };
  const std::size_t start = index(steps, 0, 0);
  dist[start] = 0;
  queue.push_back(start);
  while (!queue.empty()) {
    const std::size_t at = queue.front();
    queue.pop_front();
    const auto mask = static_cast<std::uint32_t>(at % masks);
    const int working = static_cast<int>((at / masks) % (states + 1)) - 1;
    const int remaining = static_cast<int>(at / masks / (states + 1));
    if (remaining == 0) return dist[at];  // 0-1 BFS: the first goal popped is the nearest
    if (working >= 0 && working + 1 <= remaining - 1) {
      relax(at, remaining, working + 1, mask, 1);  // advance
    }
    if (working >= 0 && (mask >> working & 1) == 0 && std::popcount(mask) < slots) {
      relax(at, remaining, working, mask | (1u << working), 0);  // takeshot
    }
    for (int q = 0; q < states; ++q) {
      if ((mask >> q & 1) == 0) continue;
      relax(at, remaining, q, mask, 0);                     // restore
      relax(at, remaining, working, mask & ~(1u << q), 0);  // free the slot
    }
    if (working == remaining - 1) relax(at, remaining - 1, -1, mask, 0);  // turn
  }
  return std::numeric_limits<std::uint64_t>::max();
}

std::vector<std::int64_t> Descending(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = n; i >= 1; --i) v.push_back(i);
  return v;
}

TEST(RevolveTest, ClosedFormKnownValues) {
  EXPECT_EQ(*OptimalAdvances(1, 1), 0u);
  EXPECT_EQ(*OptimalAdvances(1, 5), 0u);
  EXPECT_EQ(*OptimalAdvances(2, 1), 1u);
  EXPECT_EQ(*OptimalAdvances(10, 1), 45u);    // n(n-1)/2 with x0's slot alone
  EXPECT_EQ(*OptimalAdvances(100, 5), 316u);  // r = 4: 400 - binom(9, 6)
  EXPECT_EQ(*RepetitionNumber(100, 5), 4);
  EXPECT_EQ(*OptimalAdvances(100, 100), 99u);  // storing everything: the first sweep only
  EXPECT_EQ(*OptimalAdvances(100, 99), 99u);
  EXPECT_EQ(*OptimalAdvances(100, 1000000), 99u);
  EXPECT_EQ(*OptimalAdvances(100, 98), 100u);  // one slot short: step 98 is advanced twice
  // Big chains: exact in 64 bits.
  EXPECT_EQ(*OptimalAdvances(kMaxSteps, 1),
            static_cast<std::uint64_t>(kMaxSteps) * (kMaxSteps - 1) / 2);
}

TEST(RevolveTest, BinomialSaturates) {
  EXPECT_EQ(Binomial(10, 3), 120u);
  EXPECT_EQ(Binomial(10, 7), 120u);
  EXPECT_EQ(Binomial(5, 6), 0u);
  EXPECT_EQ(Binomial(66, 33), 7219428434016265740u);
  EXPECT_EQ(Binomial(200, 100), std::numeric_limits<std::uint64_t>::max());
}

TEST(RevolveTest, DynamicProgramMatchesBruteForce) {
  const auto dp = DynamicProgram(10, 6);
  for (int n = 1; n <= 10; ++n) {
    for (int c = 1; c <= std::min(6, n + 1); ++c) {
      EXPECT_EQ(BruteForce(n, c), dp[n][c]) << "N=" << n << " C=" << c;
    }
  }
}

// The planner's schedule, executed, takes exactly the closed form's advances,
// which are exactly the dynamic program's, for every N <= 120 and C <= 8.
TEST(RevolveTest, PlannerMatchesClosedFormAndDynamicProgram) {
  const auto dp = DynamicProgram(kMaxN, kMaxC);
  for (std::int64_t n = 1; n <= kMaxN; ++n) {
    for (std::int64_t c = 1; c <= kMaxC; ++c) {
      SCOPED_TRACE(testing::Message() << "N=" << n << " C=" << c);
      absl::StatusOr<std::uint64_t> closed = OptimalAdvances(n, c);
      ASSERT_TRUE(closed.ok()) << closed.status();
      EXPECT_EQ(*closed, dp[n][c]);
      absl::StatusOr<std::vector<Action>> plan = Plan(n, c);
      ASSERT_TRUE(plan.ok()) << plan.status();
      absl::StatusOr<Execution> run = Execute(*plan, n, c);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->advances, *closed);
      EXPECT_LE(run->slots_used, std::min(c, n));
      EXPECT_EQ(run->reversed, Descending(n));
    }
  }
}

TEST(RevolveTest, ScheduleShape) {
  for (std::int64_t n : {1, 2, 7, 50, 120}) {
    for (std::int64_t c : {1, 2, 3, 8}) {
      SCOPED_TRACE(testing::Message() << "N=" << n << " C=" << c);
      const std::vector<Action> plan = *Plan(n, c);
      ASSERT_FALSE(plan.empty());
      EXPECT_EQ(plan.front(), (Action{.kind = ActionKind::kTakeshot, .position = 0, .slot = 0}));
      EXPECT_EQ(plan.back().kind, n == 1 ? ActionKind::kFirstTurn : ActionKind::kYouTurn);
      EXPECT_EQ(plan.back().position, 0);
      std::int64_t turns = 0, first_turns = 0;
      for (const Action& a : plan) {
        if (a.kind == ActionKind::kFirstTurn) ++first_turns;
        if (a.kind == ActionKind::kFirstTurn || a.kind == ActionKind::kYouTurn) ++turns;
        if (a.kind == ActionKind::kTakeshot || a.kind == ActionKind::kRestore) {
          EXPECT_GE(a.slot, 0);
          EXPECT_LT(a.slot, c);
        }
      }
      EXPECT_EQ(turns, n);
      EXPECT_EQ(first_turns, 1);
    }
  }
}

TEST(RevolveTest, SmallScheduleSpelledOut) {
  // 4 steps, 2 slots: t = 4 (r = 2: 8 - binom(4, 3)).
  const std::vector<Action> plan = *Plan(4, 2);
  std::vector<std::string> text;
  for (const Action& a : plan) text.push_back(ToString(a));
  EXPECT_THAT(text, testing::ElementsAre("takeshot x0 -> slot 0", "advance x0 -> x2",
                                         "takeshot x2 -> slot 1", "advance x2 -> x3",
                                         "firsturn step 4 (from x3)", "restore slot 1 (x2)",
                                         "youturn step 3 (from x2)", "restore slot 0 (x0)",
                                         "advance x0 -> x1", "youturn step 2 (from x1)",
                                         "restore slot 0 (x0)", "youturn step 1 (from x0)"));
  EXPECT_EQ(Execute(plan, 4, 2)->advances, 4u);
  EXPECT_EQ(*OptimalAdvances(4, 2), 4u);
}

TEST(RevolveTest, LongChains) {
  for (std::int64_t n : {1000, 54321, 100000}) {
    for (std::int64_t c : {1, 3, 10, 40}) {
      SCOPED_TRACE(testing::Message() << "N=" << n << " C=" << c);
      absl::StatusOr<std::vector<Action>> plan = Plan(n, c);
      ASSERT_TRUE(plan.ok()) << plan.status();
      absl::StatusOr<Execution> run = Execute(*plan, n, c);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->advances, *OptimalAdvances(n, c));
      EXPECT_LE(run->slots_used, c);
      EXPECT_EQ(run->reversed.size(), static_cast<std::size_t>(n));
    }
  }
}

TEST(RevolveTest, BadChainsAreRefused) {
  EXPECT_THAT(Plan(0, 3).status().message(), HasSubstr("at least 1 step"));
  EXPECT_THAT(Plan(5, 0).status().message(), HasSubstr("at least 1 slot"));
  EXPECT_EQ(Plan(-3, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Plan(kMaxSteps + 1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OptimalAdvances(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OptimalAdvances(4, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Execute({}, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RevolveTest, ExecuteRejectsInvalidSchedules) {
  using K = ActionKind;
  auto error = [](std::vector<Action> s, std::int64_t n, std::int64_t c) {
    absl::StatusOr<Execution> e = Execute(s, n, c);
    EXPECT_FALSE(e.ok());
    return std::string(e.status().message());
  };
  const Action shot0{.kind = K::kTakeshot, .position = 0, .slot = 0};
  // Restoring a slot nothing was stored in.
  EXPECT_THAT(error({shot0,
                     {.kind = K::kAdvance, .position = 0, .steps = 1},
                     {.kind = K::kFirstTurn, .position = 1},
                     {.kind = K::kRestore, .position = 0, .slot = 1}},
                    2, 2),
              HasSubstr("slot 1 is empty"));
  EXPECT_THAT(error({shot0,
                     {.kind = K::kAdvance, .position = 0, .steps = 1},
                     {.kind = K::kFirstTurn, .position = 1},
                     {.kind = K::kRestore, .position = 1, .slot = 0}},
                    2, 2),
              HasSubstr("slot 0 holds x0"));
  // More slots than there are.
  EXPECT_THAT(error({{.kind = K::kTakeshot, .position = 0, .slot = 2}}, 3, 2),
              HasSubstr("no slot 2"));
  // Advancing past the start of the next step to reverse.
  EXPECT_THAT(error({shot0, {.kind = K::kAdvance, .position = 0, .steps = 3}}, 3, 2),
              HasSubstr("goes past x2"));
  // Turning where the next step does not start.
  EXPECT_THAT(error({shot0, {.kind = K::kFirstTurn, .position = 0}}, 3, 2),
              HasSubstr("step 3, the next to reverse, starts at x2"));
  // A youturn first; a second firsturn.
  EXPECT_THAT(error({{.kind = K::kYouTurn, .position = 0}}, 1, 1), HasSubstr("firsturn"));
  EXPECT_THAT(error({shot0,
                     {.kind = K::kAdvance, .position = 0, .steps = 1},
                     {.kind = K::kFirstTurn, .position = 1},
                     {.kind = K::kRestore, .position = 0, .slot = 0},
                     {.kind = K::kFirstTurn, .position = 0}},
                    2, 1),
              HasSubstr("only the first turn"));
  // Using the working state a turn spent.
  EXPECT_THAT(error({shot0,
                     {.kind = K::kAdvance, .position = 0, .steps = 1},
                     {.kind = K::kFirstTurn, .position = 1},
                     {.kind = K::kYouTurn, .position = 0}},
                    2, 1),
              HasSubstr("spent"));
  // Stopping early; going on after the end.
  EXPECT_THAT(error({shot0,
                     {.kind = K::kAdvance, .position = 0, .steps = 1},
                     {.kind = K::kFirstTurn, .position = 1}},
                    2, 1),
              HasSubstr("steps 1..1 not reversed"));
  EXPECT_THAT(error({{.kind = K::kFirstTurn, .position = 0}, shot0}, 1, 1),
              HasSubstr("reversed already"));
}

}  // namespace
}  // namespace remat::revolve
