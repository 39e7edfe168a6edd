// remat: the command-line door to the allocator and the simulator.
//
// main() only wires subcommands (one file each, see commands.h) into CLI11 and
// turns parse errors into exit statuses; the subcommands do the work.
#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>
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

  // A flag takes no value: CLI11 would read "--json=5" (or "--json=0") as a
  // value for it, so any "--flag=..." is refused here, up to a "--".
  const CLI::App* current = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (current == &app) {
      const auto named = [arg](const remat::tools::Subcommand& sub) {
        return sub.app->get_name() == arg;
      };
      if (auto sub = std::find_if(subcommands.begin(), subcommands.end(), named);
          sub != subcommands.end()) {
        current = sub->app;
        continue;
      }
    }
    const std::size_t eq = arg.find('=');
    if (!arg.starts_with("--") || eq == std::string_view::npos) continue;
    const CLI::Option* option = current->get_option_no_throw(std::string(arg.substr(0, eq)));
    if (option != nullptr && option->get_items_expected_max() == 0) {
      std::cerr << (current == &app ? "remat: " : "remat " + current->get_name() + ": ")
                << arg.substr(0, eq) << " is a flag and takes no value (got " << arg << ")\n";
      return kExitUsage;
    }
  }

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
