// Binomial checkpointing for the reversal of a homogeneous chain (Griewank
// and Walther, "Algorithm 799: Revolve", ACM TOMS 26(1), 2000): the offline
// optimum that online eviction policies are measured against.
//
// A chain of N steps takes state x0 to xN; step i computes x_i from x_{i-1}.
// Reversing it runs the adjoint of step N, then N-1, ..., then 1; the adjoint
// of step i needs x_{i-1}, from which the step is run once more while being
// recorded (a "turn") and then reversed. Between turns the only way forward is
// to advance a state one step at a time; a state can be stored in one of C
// slots and restored from it later.
//
// Conventions (Revolve's): the C slots include the one that holds x0; the
// working state and the adjoint are not counted against them; an advance is
// one forward step that is not recorded, so the N recorded steps of the turns
// are not counted. The first sweep from x0 to x_{N-1} is counted: storing
// every state (C >= N - 1) still takes N - 1 advances, and no schedule takes
// fewer.
//
// The minimal number of advances is
//   t(N, C) = r*N - binom(C + r, C + 1),
// r the least integer with binom(C + r, C) >= N (the repetition number: no
// step is advanced more than r times). Plan() produces a schedule that meets
// it; Execute() checks any schedule and counts its advances.
#ifndef REMAT_GEN_REVOLVE_H_
#define REMAT_GEN_REVOLVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace remat::revolve {

// Chains longer than this are refused: a schedule holds O(N) actions and
// executing it costs t(N, C) steps.
inline constexpr std::int64_t kMaxSteps = 10'000'000;

enum class ActionKind : std::uint8_t {
  kTakeshot,   // store the working state x_position in `slot`
  kRestore,    // the working state becomes x_position, read from `slot`
  kAdvance,    // run `steps` unrecorded forward steps: x_position -> x_{position+steps}
  kFirstTurn,  // record step position+1 (= N) from x_position and reverse it
  kYouTurn,    // the same for every later step; the working state is spent after a turn
};
const char* ActionKindName(ActionKind kind);  // "takeshot", "restore", ...

struct Action {
  ActionKind kind = ActionKind::kAdvance;
  std::int64_t position = 0;  // the state the action starts from (or stores / restores)
  std::int64_t steps = 0;     // kAdvance only
  std::int64_t slot = -1;     // kTakeshot and kRestore only
  friend bool operator==(const Action&, const Action&) = default;
};
std::string ToString(const Action& action);  // "advance x3 -> x7", "restore slot 1 (x3)", ...

// InvalidArgument unless 1 <= steps <= kMaxSteps and slots >= 1.
absl::Status CheckChain(std::int64_t steps, std::int64_t slots);

// binom(n, k), or UINT64_MAX when it does not fit in 64 bits.
std::uint64_t Binomial(std::int64_t n, std::int64_t k);

// The least r with binom(slots + r, slots) >= steps.
absl::StatusOr<std::int64_t> RepetitionNumber(std::int64_t steps, std::int64_t slots);

// t(steps, slots), the closed form above.
absl::StatusOr<std::uint64_t> OptimalAdvances(std::int64_t steps, std::int64_t slots);

// An optimal schedule: it starts by storing x0 in slot 0, uses slots
// 0..min(slots, steps)-1 last in first out, and meets t(steps, slots).
absl::StatusOr<std::vector<Action>> Plan(std::int64_t steps, std::int64_t slots);

struct Execution {
  std::uint64_t advances = 0;          // unrecorded forward steps
  std::int64_t slots_used = 0;         // slots that ever held a state
  std::vector<std::int64_t> reversed;  // the steps reversed, in order (N, N-1, ..., 1)
};

// Runs a schedule on positions alone and checks it: slots within [0, slots),
// no restore of an empty slot, no action on a spent working state, advances
// that stop short of the next step to reverse, turns exactly where the next
// step to reverse starts (the first one a kFirstTurn, the rest kYouTurn),
// every step reversed once, nothing after the last turn. FailedPrecondition
// names the first offending action.
absl::StatusOr<Execution> Execute(absl::Span<const Action> schedule, std::int64_t steps,
                                  std::int64_t slots);

}  // namespace remat::revolve

#endif  // REMAT_GEN_REVOLVE_H_
