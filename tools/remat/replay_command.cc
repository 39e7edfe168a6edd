// remat replay: an RMM allocation log through the caching allocator.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/snapshot_pickle.h"
#include "allocator/snapshot_timeline.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "sim/alloc_replay.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"
#include "trace/rmm_log.h"

namespace remat::tools {
namespace {

// Events kept for --snapshot and --timeline unless --history-events says
// otherwise: enough for a million-record log, and a ring of at most 192 MiB
// (48 B an event, allocated up front, never more than the log can produce).
constexpr std::uint64_t kDefaultHistoryEvents = std::uint64_t{1} << 22;

struct ReplayFlags {
  std::string log_path;
  std::uint64_t capacity = 80 * kGiB;
  std::uint64_t budget = 0;  // 0: none
  std::string alloc_conf;
  bool json = false;
  std::string snapshot_path;  // "": none
  std::string timeline_path;  // "": none
  std::uint64_t history_events = kDefaultHistoryEvents;
  int steps = 1;

  bool wants_snapshot() const { return !snapshot_path.empty() || !timeline_path.empty(); }
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
an OOM and the replay goes on; its later free is skipped. A replay with any OOM
exits with status 3 (the log did not fit), after its full report.

The report: events; peak requested (the log's own sizes, live at once), peak
allocated (sizes rounded to 512 B), peak reserved (device segments);
fragmentation = 1 - peak active / peak reserved; segments; retries (slow-path
rounds that emptied the cache); OOMs; and the replay loop's speed.

--steps N replays the log N times as the steps of a training loop: after each,
what it left live is freed and the cache emptied. With expandable segments the
allocator learns from each step which allocations (by their place in the
step's sequence and their size) were not live at its peak of allocated bytes,
and places those small blocks on pages of their own in the next: their pages
come free before the peak, and the blocks live at the peak share as few pages
as their sizes allow. The report's peaks are the last step's; the first's
peak reserved bytes and fragmentation are printed beside them.

--snapshot writes the allocator at the end of the replay (segments, their
blocks, and the event history) as a PyTorch memory snapshot pickle: open it at
https://pytorch.org/memory_viz. --timeline writes allocated and reserved bytes
over the log's time as a Chrome trace (JSON) for https://ui.perfetto.dev. Both
keep the newest --history-events events (default 4194304); while they record,
the simulated clock follows the log's, so events carry the log's times.
tools/torch_snapshot_to_trace.py turns a PyTorch snapshot back into a log.

Examples:
  remat replay examples/traces/training_step.csv
  remat replay run.csv --budget 40GiB --json
  remat replay run.csv --snapshot run.pickle --timeline run.json)";

// Refuses, before the replay runs, output paths that cannot be written or
// that name the log or each other.
absl::Status CheckOutputs(const ReplayFlags& flags) {
  return CheckOutputPaths({{"the log", flags.log_path}},
                          {{"--snapshot", flags.snapshot_path}, {"--timeline", flags.timeline_path}});
}

absl::Status WriteOutputs(const ReplayFlags& flags, const Snapshot& snapshot) {
  if (!flags.snapshot_path.empty()) {
    REMAT_RETURN_IF_ERROR(WriteSnapshotPickle(snapshot, flags.snapshot_path));
  }
  if (!flags.timeline_path.empty()) {
    REMAT_RETURN_IF_ERROR(WriteSnapshotTimeline(snapshot, flags.timeline_path));
  }
  return absl::OkStatus();
}

// Rows under the text report saying what was written.
void PrintOutputs(const ReplayFlags& flags, const Snapshot& snapshot) {
  if (!flags.snapshot_path.empty()) {
    std::cout << absl::StrFormat("  %-18s %s (%d segments, %d events)\n", "snapshot",
                                 flags.snapshot_path, snapshot.segments.size(),
                                 snapshot.events.size());
  }
  if (!flags.timeline_path.empty()) {
    std::cout << absl::StrFormat("  %-18s %s\n", "timeline", flags.timeline_path);
  }
}

int RunReplay(const ReplayFlags& flags) {
  if (absl::Status outputs = CheckOutputs(flags); !outputs.ok()) {
    return ReportError("replay", outputs);
  }
  absl::StatusOr<AllocLog> log = ReadRmmLog(flags.log_path);
  if (!log.ok()) return ReportError("replay", log.status());
  ReplayOptions options;
  options.capacity = flags.capacity;
  options.budget = flags.budget;
  options.steps = flags.steps;
  options.alloc_conf = flags.alloc_conf;
  options.snapshot = flags.wants_snapshot();
  options.history_events = options.snapshot ? flags.history_events : 0;
  absl::StatusOr<ReplayReport> report = ReplayAllocLog(*log, options);
  if (!report.ok()) return ReportError("replay", report.status());
  if (options.snapshot) {
    if (absl::Status written = WriteOutputs(flags, *report->snapshot); !written.ok()) {
      return ReportError("replay", written);
    }
    if (report->history_truncated) {
      std::cerr << absl::StrFormat(
          "remat replay: the history kept only the newest %d events; raise --history-events "
          "for all of them\n",
          report->snapshot->events.size());
    }
  }
  if (flags.json) {
    std::cout << ReplayReportToJson(*report) << "\n";
  } else {
    std::cout << ReplayReportToText(*report);
    if (options.snapshot) PrintOutputs(flags, *report->snapshot);
  }
  return report->ooms > 0 ? kExitUnfinished : kExitOk;
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
  AddAllocConfOption(*cmd, &flags->alloc_conf);
  cmd->add_flag("--json", flags->json, "Print the report as one JSON object");
  cmd->add_option("--snapshot", flags->snapshot_path,
                  "Write the allocator at the end, with its event history, as a PyTorch memory "
                  "snapshot pickle")
      ->type_name("FILE");
  cmd->add_option("--timeline", flags->timeline_path,
                  "Write allocated and reserved bytes over time as a Chrome/Perfetto trace (JSON)")
      ->type_name("FILE");
  cmd->add_option(
         "--history-events", flags->history_events,
         "Events kept for --snapshot and --timeline: the newest, when there are more (0: none)")
      ->type_name("N")
      ->default_str(std::to_string(kDefaultHistoryEvents))
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{kMaxEventRingCapacity}));
  cmd->add_option("--steps", flags->steps,
                  "Replay the log this many times, as a training loop's steps: with expandable "
                  "segments each step places its small blocks by what the one before learned "
                  "(blocks not live at its peak on pages of their own); the report is the last "
                  "step's, beside the first's")
      ->type_name("N")
      ->default_val(1)
      ->check(CLI::Range(1, 1000));
  cmd->footer(kFooter);
  return Subcommand{cmd, [flags] { return RunReplay(*flags); }};
}

}  // namespace remat::tools
