// remat: the command-line door to the allocator and the simulator.
//
// main() only wires subcommands (one file each, see commands.h) into CLI11 and
// turns parse errors into exit statuses; the subcommands do the work.
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"

int main(int argc, char** argv) {
  using remat::tools::kExitOk;
  using remat::tools::kExitUsage;

  CLI::App app{"remat: a caching GPU allocator with a simulated device, and tools to study it.",
               "remat"};
  app.set_version_flag("--version", REMAT_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Run 'remat SUBCOMMAND --help' for a subcommand's options.\n"
      "Exit status: 0 success, 1 failure, 2 bad usage or bad input, 3 the run did not fit its "
      "budget (remat sim: oom or thrash; remat replay: an allocation out of memory).");

  const std::vector<remat::tools::Subcommand> subcommands = {
      remat::tools::AddReplayCommand(app),
      remat::tools::AddSimCommand(app),
      remat::tools::AddRunCommand(app),
      remat::tools::AddSweepCommand(app),
      remat::tools::AddGenCommand(app),
      remat::tools::AddChainCommand(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as "errors" that exit 0; every real one is
    // a usage error, whatever number CLI11 gives it.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  for (const remat::tools::Subcommand& subcommand : subcommands) {
    if (subcommand.app->parsed()) return subcommand.run();
  }
  return kExitUsage;  // unreachable: require_subcommand(1) made parse() throw
}
