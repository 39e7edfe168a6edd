// remat replay: an RMM allocation log through the caching allocator.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "base/units.h"
#include "sim/alloc_replay.h"
#include "sim/rmm_log.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"

namespace remat::tools {
namespace {

struct ReplayFlags {
  std::string log_path;
  std::uint64_t capacity = 80 * kGiB;
  std::uint64_t budget = 0;  // 0: none
  bool json = false;
};

constexpr char kFooter[] =
    R"(The log is RAPIDS RMM's replay CSV (logging_resource_adaptor): a header line
`Thread,Time,Action,Pointer,Size,Stream`, then one line per allocate, free or
allocate failure. It is read and checked in full before anything is replayed;
a malformed line, a free of a pointer that is not live or a size mismatch stops
with the line number and exit status 2.

Each allocation goes through remat's caching allocator on an unbacked simulated
device of --capacity bytes (log stream 0 is the default stream; every other log
stream gets its own). Under --budget, an allocation that does not fit counts as
an OOM and the replay goes on; its later free is skipped.

The report: events; peak requested (the log's own sizes, live at once), peak
allocated (sizes rounded to 512 B), peak reserved (device segments);
fragmentation = 1 - peak active / peak reserved; segments; retries (slow-path
rounds that emptied the cache); OOMs; and the replay loop's speed.

Examples:
  remat replay examples/traces/training_step.csv
  remat replay run.csv --budget 40GiB --json)";

int RunReplay(const ReplayFlags& flags) {
  absl::StatusOr<AllocLog> log = ReadRmmLog(flags.log_path);
  if (!log.ok()) return ReportError("replay", log.status());
  ReplayOptions options;
  options.capacity = flags.capacity;
  options.budget = flags.budget;
  absl::StatusOr<ReplayReport> report = ReplayAllocLog(*log, options);
  if (!report.ok()) return ReportError("replay", report.status());
  if (flags.json) {
    std::cout << ReplayReportToJson(*report) << "\n";
  } else {
    std::cout << ReplayReportToText(*report);
  }
  return kExitOk;
}

}  // namespace

Subcommand AddReplayCommand(CLI::App& remat) {
  // Shared with `run`, which CLI11's callbacks outlive.
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* cmd =
      remat.add_subcommand("replay", "Replay an RMM allocation log through the caching allocator");
  cmd->add_option("LOG", flags->log_path, "RMM replay log (CSV)")->required()->type_name("FILE");
  AddByteSizeOption(*cmd, "--capacity", &flags->capacity,
                    "Memory of the simulated device (e.g. 80GiB, 24GB, 512MiB)", "80GiB");
  AddByteSizeOption(*cmd, "--budget", &flags->budget,
                    "Cap on the bytes the allocator may reserve (default: the capacity)");
  cmd->add_flag("--json", flags->json, "Print the report as one JSON object");
  cmd->footer(kFooter);
  return Subcommand{cmd, [flags] { return RunReplay(*flags); }};
}

}  // namespace remat::tools
