// remat chain: a homogeneous chain reversed through the runtime, by the
// optimal binomial schedule (revolve) or by an online eviction policy.
#include <charconv>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "gen/revolve.h"
#include "sim/chain_run.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"

namespace remat::tools {
namespace {

struct ChainFlags {
  std::int64_t steps = 0;
  std::int64_t slots = 0;
  std::string policy = "revolve";
  std::uint64_t state_bytes = kMiB;
  bool json = false;
  bool schedule = false;
};

constexpr char kFooter[] =
    R"(Revolve's conventions (Griewank & Walther): step i computes x_i from x_{i-1};
reversing step i needs x_{i-1}, from which the step is run again, recorded,
and reversed. The C slots include the one holding x0; the working state and
the adjoint are not counted against them. Advances are the forward steps
computed beyond the N recorded ones; the first sweep from x0 to x_{N-1} is
counted, so storing every state still takes N-1 (repeated advances: 0).
Optimal: t(N,C) = r*N - binom(C+r, C+1), r the least integer with
binom(C+r, C) >= N. Ratio = advances / optimal (1 when both are 0).

--policy revolve carries out the binomial schedule (every state unevictable,
freed by hand); any other spec (lru, largest, dtr, ...) is an online eviction
policy: the runtime drops states under the budget and recomputes them when
the reverse needs them. Either way the runtime's live budget is C+3 states:
the C checkpoint slots, the working state, the adjoint, and the output of the
step being computed (Revolve overwrites the working state in place; a tensor
runtime holds a step's input and output at once, for advances and recorded
steps alike, so that room never serves as a slot). Status: ok, or oom when
the budget cannot hold the run.

A run may compute at most 10^7 forward steps (its time and memory grow
with them; about 10 s). Any run takes at least t(N,C) + N, N(N+1)/2 with one
slot: a chain past that is refused, naming the slots that keep it under;
an online policy that recomputes past it is stopped. belady is refused:
the chain does not tell the runtime next uses (remat sim replays a trace
with them).

Examples:
  remat chain --steps 100 --slots 5 --policy revolve
  remat chain --steps 100 --slots 5 --policy dtr --json
  remat chain --steps 10 --slots 3 --policy revolve --schedule)";

void PrintText(const ChainRunReport& r) {
  std::cout << absl::StrFormat("chain of %d steps, %d slots (x0's included)\n", r.steps, r.slots);
  std::cout << absl::StrFormat("  policy           %s\n", r.policy);
  std::cout << absl::StrFormat("  status           %s%s\n", r.status,
                               r.message.empty() ? "" : " (" + r.message + ")");
  std::cout << absl::StrFormat("  advances         %d (optimal %d, ratio %.4f)\n", r.advances,
                               r.optimal_advances, r.ratio);
  std::cout << absl::StrFormat("  repeated         %d beyond the first sweep of %d\n",
                               r.repeated_advances, r.steps - 1);
  std::cout << absl::StrFormat("  forward steps    %d (%d recorded and reversed)\n",
                               r.forward_steps, r.reversed_steps);
  std::cout << absl::StrFormat("  runtime          %d recomputes, %d evictions\n", r.recomputes,
                               r.evictions);
  std::cout << absl::StrFormat("  budget           %d states of %s = %s, peak resident %s\n",
                               r.budget_states, FormatBytes(r.state_bytes),
                               FormatBytes(r.budget_bytes), FormatBytes(r.peak_resident_bytes));
  if (r.schedule_actions > 0) {
    std::cout << absl::StrFormat("  schedule         %d actions\n", r.schedule_actions);
  }
  std::cout << absl::StrFormat("  time             %.3f ms simulated, %.3f s wall\n",
                               static_cast<double>(r.time_ns) / 1e6, r.wall_seconds);
}

int RunChainCommand(const ChainFlags& f) {
  if (f.schedule && f.policy != "revolve") {
    return ReportError(
        "chain",
        absl::InvalidArgumentError("--schedule prints the revolve schedule: use --policy revolve"));
  }
  ChainRunOptions options;
  options.steps = f.steps;
  options.slots = f.slots;
  options.policy = f.policy;
  options.state_bytes = f.state_bytes;
  options.keep_schedule = f.schedule;
  absl::StatusOr<ChainRunReport> report = RunChain(options);
  if (!report.ok()) return ReportError("chain", report.status());
  if (f.schedule && !f.json) {  // (with --json, the report's "schedule" holds it)
    for (const revolve::Action& a : report->schedule) std::cout << revolve::ToString(a) << "\n";
  }
  if (f.json) {
    std::cout << ChainReportToJson(*report) << "\n";
  } else {
    PrintText(*report);
  }
  return report->status == "ok" ? kExitOk : kExitFailure;
}

}  // namespace

Subcommand AddChainCommand(CLI::App& remat) {
  auto flags = std::make_shared<ChainFlags>();
  CLI::App* cmd = remat.add_subcommand(
      "chain",
      "Reverse a homogeneous chain through the runtime: the optimal binomial schedule (revolve) "
      "or an online eviction policy, against the optimum");
  cmd->add_option("--steps", flags->steps, "Steps of the chain, N >= 1")
      ->required()
      ->check([](const std::string& text) -> std::string {
        // Before CLI11 converts it: a number past int64 would arrive clamped.
        std::int64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc::result_out_of_range && !text.empty() && text[0] == '-') {
          return "at least 1 step, not " + text;
        }
        if (ec == std::errc::result_out_of_range) {
          return text + " is more than the " + std::to_string(revolve::kMaxSteps) +
                 " steps a chain may have";
        }
        if (ec != std::errc() || end != text.data() + text.size()) {
          return "a whole number of steps, not '" + text + "'";
        }
        return "";
      });
  cmd->add_option("--slots", flags->slots,
                  "Checkpoint slots, C >= 1, the one holding x0 included (the runtime's budget "
                  "is C+3 states: C slots + the working state + the adjoint + a step's output)")
      ->required();
  cmd->add_option("--policy", flags->policy,
                  "revolve (the offline optimum) or an eviction policy spec (lru, largest, "
                  "dtr:...)")
      ->capture_default_str();
  AddByteSizeOption(*cmd, "--state-bytes", &flags->state_bytes,
                    "Size of every state and of the adjoint", "1MiB");
  cmd->add_flag("--json", flags->json, "Print one JSON object (with --schedule, its \"schedule\")");
  cmd->add_flag("--schedule", flags->schedule,
                "Print the revolve schedule, one action a line, before the report (with --json, "
                "as the report's \"schedule\": an object an action)");
  cmd->footer(kFooter);
  return Subcommand{cmd, [flags] { return RunChainCommand(*flags); }};
}

}  // namespace remat::tools
