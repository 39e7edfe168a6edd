// A homogeneous chain reversed through the real Runtime, in Revolve's
// conventions (see gen/revolve.h): every step costs the same and every state
// has the same size. The reference for online eviction policies on chains.
//
// States x_0..x_{N-1} are runtime tensors of `state_bytes`; x_N is never
// stored. Step i runs on the compute stream for `step_ns`, reading x_{i-1}
// and writing a new tensor; its reverse, after the step is run again from
// x_{i-1} and recorded (its output written and then freed), for
// `reverse_ns`. The adjoint is one tensor, updated in place, that never
// leaves the device.
//
// The budget, in resident tensor bytes ("live" accounting), is C + 3 states
// (C clamped to N): the C slots (x0's included), the working state, the
// output of the step being computed, and the adjoint. Revolve advances the
// working state in place; a tensor runtime holds a step's input and output at
// once. Every step, advanced or recorded, needs that room, so it never serves
// as one more slot: an online policy has exactly the planner's memory.
//
//   policy "revolve": the schedule of revolve::Plan, carried out by hand: the
//     states are created unevictable and freed once no slot and no working
//     state holds them. The runtime's count must agree with the planner's.
//   any other spec: an online eviction policy of the registry. The forward
//     sweep creates x_1..x_{N-1} (each droppable, recomputed from its
//     predecessor); the reverse acquires x_{N-1}, ..., x_0 in turn and the
//     runtime recomputes whatever was dropped. x0 is the input: never dropped.
//     Offloading is off: only recompute counts.
//
// Advances = forward steps computed (sweep, recomputes, and the steps run to
// be recorded) minus the recorded ones (N when the run completes).
#ifndef REMAT_SIM_CHAIN_RUN_H_
#define REMAT_SIM_CHAIN_RUN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/units.h"
#include "gen/revolve.h"

namespace remat {

// 10^7 forward steps: about 10 s and 0.8 GB on a simulated device (time and
// memory grow with them: 2 x 10^7 took 20 s and 1.6 GB).
inline constexpr std::uint64_t kMaxChainForwardSteps = 10'000'000;

struct ChainRunOptions {
  std::int64_t steps = 0;          // N >= 1
  std::int64_t slots = 0;          // C >= 1, x0's slot included
  std::string policy = "revolve";  // "revolve" or a policies::Create spec
  std::size_t state_bytes = kMiB;  // the size of every state (and of the adjoint)
  std::int64_t step_ns = 1000;     // one forward step
  std::int64_t reverse_ns = 2000;  // one reverse step
  // Keep the revolve schedule in the report (for printing).
  bool keep_schedule = false;
  // The most forward steps a run may compute: a run's time and memory grow
  // with them, and t(N, C) + N of them is the least any run takes (with one
  // slot, N^2 / 2). A chain that needs more is refused before it runs; an
  // online policy that computes more is stopped with an error.
  std::uint64_t max_forward_steps = kMaxChainForwardSteps;
};

struct ChainRunReport {
  std::string status;   // "ok", or "oom" when the budget cannot hold the run
  std::string message;  // why, when not ok
  std::string policy;   // "revolve", or the policy's full spec
  std::int64_t steps = 0;
  std::int64_t slots = 0;
  std::uint64_t advances = 0;          // forward steps computed minus those recorded
  std::uint64_t optimal_advances = 0;  // t(N, C), the closed form
  double ratio = 1;                    // advances / optimal (1 when both are 0)
  // Advances beyond the first sweep from x0 to x_{N-1}: 0 when every state is stored.
  std::uint64_t repeated_advances = 0;
  std::uint64_t forward_steps = 0;   // every forward step computed
  std::uint64_t reversed_steps = 0;  // N when the run completes
  std::uint64_t recomputes = 0;      // the runtime's recomputes of dropped states
  std::uint64_t evictions = 0;
  std::uint64_t state_bytes = 0;
  std::int64_t budget_states = 0;  // min(C, N) + 3: slots, working state, step output, adjoint
  std::uint64_t budget_bytes = 0;
  std::uint64_t peak_resident_bytes = 0;
  std::uint64_t schedule_actions = 0;     // revolve: the schedule's length
  std::vector<revolve::Action> schedule;  // revolve with keep_schedule
  std::int64_t time_ns = 0;               // simulated device time
  double wall_seconds = 0;
};

// InvalidArgument for a bad chain (N or C below 1), a bad state size or
// cost, an unknown policy, belady (it needs next uses the chain does not
// give), or a chain whose least work passes max_forward_steps (the message
// names the slots that keep it under); OutOfRange for an online run stopped
// at max_forward_steps. A run the budget cannot hold is a report with
// status "oom", not an error.
absl::StatusOr<ChainRunReport> RunChain(const ChainRunOptions& options);

// The report as one JSON object.
std::string ChainReportToJson(const ChainRunReport& report);

}  // namespace remat

#endif  // REMAT_SIM_CHAIN_RUN_H_
