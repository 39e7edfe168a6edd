// The subcommands of `remat`. Each lives in its own file and adds itself to
// the top-level CLI11 app; main() runs the one that was parsed.
//
// To add one: write foo_command.cc defining AddFooCommand, declare it here,
// list it in main.cc and tools/CMakeLists.txt.
#ifndef REMAT_TOOLS_REMAT_COMMANDS_H_
#define REMAT_TOOLS_REMAT_COMMANDS_H_

#include <functional>

#include "CLI/CLI.hpp"

namespace remat::tools {

struct Subcommand {
  CLI::App* app;             // owned by the parent app; its flags bind to state `run` holds
  std::function<int()> run;  // does the work; returns the exit status
};

// remat replay LOG [--capacity BYTES] [--budget BYTES] [--json]
Subcommand AddReplayCommand(CLI::App& remat);

// remat sim TRACE (--budget-ratio R | --budget BYTES) [--policy SPEC] ...
Subcommand AddSimCommand(CLI::App& remat);

// remat run [--budget B] [--trace FILE] [--device cuda|sim] [--stats] -- CMD ARGS...
Subcommand AddRunCommand(CLI::App& remat);

// remat gen SPEC -o FILE [--tflops T] [--hbm-gbps B] [--launch-ns N]
Subcommand AddGenCommand(CLI::App& remat);

// remat chain --steps N --slots C [--policy revolve|SPEC] [--state-bytes B] [--json] [--schedule]
Subcommand AddChainCommand(CLI::App& remat);

// remat sweep (TRACE | --model SPEC) --ratios R --policies P --out DIR ...
Subcommand AddSweepCommand(CLI::App& remat);

}  // namespace remat::tools

#endif  // REMAT_TOOLS_REMAT_COMMANDS_H_
