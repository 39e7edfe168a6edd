#include "gen/revolve.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"

namespace remat::revolve {
namespace {

constexpr std::uint64_t kSaturated = std::numeric_limits<std::uint64_t>::max();

// value * num / den where the result is known to be an integer (a binomial
// coefficient's multiplicative step), or kSaturated when it does not fit.
std::uint64_t MulDiv(std::uint64_t value, std::uint64_t num, std::uint64_t den) {
  if (value == kSaturated) return kSaturated;
  // den divides value * num; with g = gcd(value, den), den / g divides num.
  const std::uint64_t g = std::gcd(value, den);
  const std::uint64_t a = value / g;
  const std::uint64_t b = num / (den / g);
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return kSaturated;
  return out;
}

// Steps to advance from the start of a sub-chain of n >= 2 steps, reversed
// with c >= 1 slots (the one holding its start included), before the next
// takeshot: the first k steps are reversed last with all c slots, after the
// other n - k with c - 1. With r the repetition number of (n, c), taking
//   beta(c, r-2) <= k <= beta(c, r-1)   and   beta(c-1, r-1) <= n - k <= beta(c-1, r)
// (beta(c, r) = binom(c + r, c)) puts both parts on the linear pieces of t
// whose sum is t(n, c), by Pascal's rule; the two ranges always meet, and the
// largest such k is taken.
std::int64_t Split(std::int64_t n, std::int64_t c) {
  if (c == 1) return n - 1;  // no slot to spare: walk to the last step
  std::int64_t r = 0;
  std::uint64_t beta = 1;  // binom(c + r, c)
  std::uint64_t previous = 0;
  while (beta < static_cast<std::uint64_t>(n)) {
    previous = beta;
    ++r;
    beta = MulDiv(beta, static_cast<std::uint64_t>(c + r), static_cast<std::uint64_t>(r));
  }
  // r >= 1 since n >= 2; previous = beta(c, r-1) < n.
  const std::uint64_t rest = Binomial(c - 1 + r - 1, c - 1);  // beta(c-1, r-1) < n
  return static_cast<std::int64_t>(std::min(previous, static_cast<std::uint64_t>(n) - rest));
}

}  // namespace

const char* ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kTakeshot:
      return "takeshot";
    case ActionKind::kRestore:
      return "restore";
    case ActionKind::kAdvance:
      return "advance";
    case ActionKind::kFirstTurn:
      return "firsturn";
    case ActionKind::kYouTurn:
      return "youturn";
  }
  return "?";
}

std::string ToString(const Action& a) {
  switch (a.kind) {
    case ActionKind::kTakeshot:
      return absl::StrFormat("takeshot x%d -> slot %d", a.position, a.slot);
    case ActionKind::kRestore:
      return absl::StrFormat("restore slot %d (x%d)", a.slot, a.position);
    case ActionKind::kAdvance:
      return absl::StrFormat("advance x%d -> x%d", a.position, a.position + a.steps);
    case ActionKind::kFirstTurn:
    case ActionKind::kYouTurn:
      return absl::StrFormat("%s step %d (from x%d)", ActionKindName(a.kind), a.position + 1,
                             a.position);
  }
  return "?";
}

absl::Status CheckChain(std::int64_t steps, std::int64_t slots) {
  if (steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a chain needs at least 1 step (got %d)", steps));
  }
  if (steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chains of more than %d steps are not supported (got %d)", kMaxSteps, steps));
  }
  if (slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a chain needs at least 1 slot, the one holding x0 (got %d)", slots));
  }
  return absl::OkStatus();
}

std::uint64_t Binomial(std::int64_t n, std::int64_t k) {
  if (n < 0 || k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  std::uint64_t b = 1;  // binom(n - k + j, j) after step j
  for (std::int64_t j = 1; j <= k && b != kSaturated; ++j) {
    b = MulDiv(b, static_cast<std::uint64_t>(n - k + j), static_cast<std::uint64_t>(j));
  }
  return b;
}

absl::StatusOr<std::int64_t> RepetitionNumber(std::int64_t steps, std::int64_t slots) {
  if (absl::Status s = CheckChain(steps, slots); !s.ok()) return s;
  // Slots beyond the steps change nothing (and binom(c + r, c) grows with c).
  const std::int64_t c = std::min(slots, steps);
  if (c == 1) return steps - 1;  // binom(1 + r, 1) = r + 1
  std::int64_t r = 0;
  std::uint64_t beta = 1;
  while (beta < static_cast<std::uint64_t>(steps)) {
    ++r;
    beta = MulDiv(beta, static_cast<std::uint64_t>(c + r), static_cast<std::uint64_t>(r));
  }
  return r;
}

absl::StatusOr<std::uint64_t> OptimalAdvances(std::int64_t steps, std::int64_t slots) {
  absl::StatusOr<std::int64_t> r = RepetitionNumber(steps, slots);
  if (!r.ok()) return r.status();
  const std::int64_t c = std::min(slots, steps);
  std::uint64_t total = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(*r), static_cast<std::uint64_t>(steps),
                             &total)) {
    return absl::OutOfRangeError("the advance count does not fit in 64 bits");
  }
  // binom(c + r, c + 1) <= r * steps (t is never negative), so it fits too.
  return total - Binomial(c + *r, c + 1);
}

absl::StatusOr<std::vector<Action>> Plan(std::int64_t steps, std::int64_t slots) {
  if (absl::Status s = CheckChain(steps, slots); !s.ok()) return s;
  const std::int64_t capacity = std::min(slots, steps);
  struct Snapshot {
    std::int64_t position;
    std::int64_t slot;
  };
  // The stored states, in slot order; a later one is always further along
  // the chain, so the one to restore is always the last one still before
  // the next step to reverse.
  std::vector<Snapshot> stored = {{0, 0}};
  std::vector<Action> out = {{.kind = ActionKind::kTakeshot, .position = 0, .slot = 0}};
  std::int64_t current = 0;
  std::int64_t remaining = steps;  // steps 1..remaining are not reversed yet
  for (bool first = true;; first = false) {
    // Forward from the working state to the start of the next step to reverse.
    while (remaining - current > 1) {
      const std::int64_t free_slots = capacity - static_cast<std::int64_t>(stored.size());
      const std::int64_t k = Split(remaining - current, free_slots + 1);
      out.push_back({.kind = ActionKind::kAdvance, .position = current, .steps = k});
      current += k;
      if (remaining - current > 1) {  // a state the turn starts from needs no slot
        const std::int64_t slot = static_cast<std::int64_t>(stored.size());
        stored.push_back({current, slot});
        out.push_back({.kind = ActionKind::kTakeshot, .position = current, .slot = slot});
      }
    }
    out.push_back(
        {.kind = first ? ActionKind::kFirstTurn : ActionKind::kYouTurn, .position = current});
    if (--remaining == 0) break;
    // States at or past the start of the step just reversed are of no more use;
    // x0 always stays (remaining >= 1).
    while (stored.back().position >= remaining) stored.pop_back();
    current = stored.back().position;
    out.push_back({.kind = ActionKind::kRestore, .position = current, .slot = stored.back().slot});
  }
  return out;
}

absl::StatusOr<Execution> Execute(absl::Span<const Action> schedule, std::int64_t steps,
                                  std::int64_t slots) {
  if (absl::Status s = CheckChain(steps, slots); !s.ok()) return s;
  Execution e;
  e.reversed.reserve(static_cast<std::size_t>(steps));
  absl::flat_hash_map<std::int64_t, std::int64_t> held;  // slot -> state
  std::int64_t current = 0;  // the working state; -1 once spent by a turn
  std::int64_t remaining = steps;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const Action& a = schedule[i];
    auto fail = [&](const std::string& why) {
      return absl::FailedPreconditionError(
          absl::StrFormat("action %d (%s): %s", i, ToString(a), why));
    };
    if (remaining == 0) return fail("every step is reversed already");
    const bool needs_state = a.kind != ActionKind::kRestore;
    if (needs_state && current < 0) return fail("no working state (spent by the last turn)");
    if (needs_state && a.position != current) {
      return fail(absl::StrFormat("the working state is x%d", current));
    }
    switch (a.kind) {
      case ActionKind::kTakeshot:
        if (a.slot < 0 || a.slot >= slots) {
          return fail(absl::StrFormat("no slot %d (slots 0..%d)", a.slot, slots - 1));
        }
        held[a.slot] = current;
        e.slots_used = static_cast<std::int64_t>(held.size());
        break;
      case ActionKind::kRestore: {
        auto it = held.find(a.slot);
        if (it == held.end()) return fail(absl::StrFormat("slot %d is empty", a.slot));
        if (it->second != a.position) {
          return fail(absl::StrFormat("slot %d holds x%d", a.slot, it->second));
        }
        current = it->second;
        break;
      }
      case ActionKind::kAdvance:
        if (a.steps < 1) return fail("an advance needs at least one step");
        if (a.steps > remaining - 1 - current) {
          return fail(absl::StrFormat("goes past x%d, the start of step %d, the next to reverse",
                                      remaining - 1, remaining));
        }
        current += a.steps;
        e.advances += static_cast<std::uint64_t>(a.steps);
        break;
      case ActionKind::kFirstTurn:
      case ActionKind::kYouTurn: {
        const bool first = remaining == steps;
        if (first != (a.kind == ActionKind::kFirstTurn)) {
          return fail(first ? "the first turn must be a firsturn"
                            : "only the first turn is a firsturn");
        }
        if (current != remaining - 1) {
          return fail(absl::StrFormat("step %d, the next to reverse, starts at x%d", remaining,
                                      remaining - 1));
        }
        e.reversed.push_back(remaining);
        --remaining;
        current = -1;
        break;
      }
    }
  }
  if (remaining != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the schedule ends with steps 1..%d not reversed", remaining));
  }
  return e;
}

}  // namespace remat::revolve
