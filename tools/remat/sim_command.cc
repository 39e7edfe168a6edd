// remat sim: an op trace through the runtime under a budget and a policy.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/json_writer.h"
#include "base/units.h"
#include "sim/op_replay.h"
#include "sim/sim_timeline.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"
#include "trace/op_trace.h"

namespace remat::tools {
namespace {

struct SimFlags {
  std::string trace_path;
  double budget_ratio = 0;
  std::uint64_t budget = 0;
  std::string policy = "auto";
  LinkFlags link;
  bool no_swap = false;
  bool no_offload_guard = false;
  bool retry_anywhere = false;
  bool retry_in_one_place = false;
  bool release_regenerated = false;
  bool inputs_held = false;
  bool no_copy_ahead = false;
  bool no_recompute = false;
  std::string accounting = "reserved";
  double thrash_limit = 1.0;
  std::size_t max_split = 0;  // OpReplayOptions::max_split_size
  std::string alloc_conf;
  bool json = false;
  bool verify = false;
  std::uint64_t scale = 1;
  std::string timeline_path;  // "": none
  std::string future = "known";
};

constexpr char kFooter[] = R"(The budget is either absolute (--budget) or a fraction of the peak of an
unlimited replay of the same trace, measured first in the same run
(--budget-ratio), in the chosen accounting: `reserved` counts the allocator's
reserved bytes (what a GPU really holds); `live` counts resident tensor bytes
only, as the DTR simulator did.

Status: ok; oom (nothing left to evict); thrash (recompute exceeded
--thrash-limit x the trace's compute so far). Overhead = time / baseline time,
for a run that finished only (none for oom or thrash: the part that ran says
nothing about the whole). Exit status 3 when the run did not finish, so a
script can ask "does it fit?". A reserved budget below the allocator's
smallest segment (2 MiB) is refused: use --accounting live for tiny traces.
With --verify the device keeps real bytes (sizes divided by --scale) and every
read is checked against the checksum taken when the tensor was produced; any
mismatch makes the exit status 1.

--timeline FILE.json writes the budgeted run as a Chrome trace of the
simulated device's time (open it at https://ui.perfetto.dev or
chrome://tracing): counters for reserved, live and host (offloaded) bytes;
slices for each call, each recompute and each copy (restores on the compute
stream, offloads on the copy stream, prefetches on the prefetch stream); instants for every drop
and offload, and for an oom or thrash where the run stopped. Without it
nothing is recorded.

Examples:
  remat sim examples/traces/chain_100.jsonl --budget-ratio 0.5 --policy dtr
  remat sim examples/traces/transformer_small.jsonl --budget-ratio 0.4 --policy lru --no-swap --json
  remat sim examples/traces/chain_100.jsonl --budget-ratio 0.3 --verify --scale 64
  remat sim examples/traces/transformer_small.jsonl --budget-ratio 0.5 --timeline run.json)";

// The record loop's speed (parsing excluded); 0 for a run too short to time.
double RecordsPerSecond(const OpReplayReport& r) {
  return r.replay_seconds > 0 ? static_cast<double>(r.records) / r.replay_seconds : 0.0;
}

// The least live budget the trace could run in (see OpTrace), in the
// replay's units (--scale divides sizes), and the call that sets it.
struct LeastBudget {
  std::uint64_t bytes = 0;
  std::string op;
  std::uint32_t line = 0;
};

LeastBudget LeastBudgetOf(const OpTrace& trace, std::uint64_t scale) {
  LeastBudget least;
  const std::uint64_t s = scale == 0 ? 1 : scale;
  least.bytes = trace.least_budget_bytes / s + (trace.least_budget_bytes % s != 0 ? 1 : 0);
  if (trace.least_budget_record != kNoOpIndex) {
    const OpRecord& record = trace.records[trace.least_budget_record];
    least.line = record.line;
    if (record.name != kNoOpIndex) least.op = trace.names[record.name];
  }
  return least;
}

std::string DescribeLeast(const LeastBudget& least) {
  return absl::StrFormat("%s (call '%s' at line %d: its inputs and outputs, with the constants "
                         "live then)",
                         FormatBytes(least.bytes), least.op, least.line);
}

void PrintText(const OpReplayReport& r, const OpReplayReport& base, const SimFlags& f,
               const LeastBudget& least) {
  const std::string overhead =
      r.status != "ok" ? std::string("none: the run did not finish")
      : base.time_ns > 0
          ? absl::StrFormat("%.3f", static_cast<double>(r.time_ns) / static_cast<double>(base.time_ns))
          : std::string("none");
  std::cout << absl::StrFormat("sim of %s\n", f.trace_path);
  std::cout << absl::StrFormat("  status           %s%s\n", r.status,
                               r.message.empty() ? "" : " (" + r.message + ")");
  std::cout << absl::StrFormat("  policy           %s%s%s\n", r.policy,
                               f.no_swap ? ", no swap" : "", f.no_recompute ? ", no recompute" : "");
  std::cout << absl::StrFormat("  budget           %s (%s accounting)\n",
                               FormatBytes(r.budget_bytes), f.accounting);
  if (r.future != "known") {
    std::cout << absl::StrFormat("  future           %s\n",
                                 r.future == "learned"
                                     ? "learned (the second of two steps, its next uses "
                                       "estimated from the first)"
                                     : "none (no next uses told)");
  }
  if (!f.no_swap) {
    std::cout << absl::StrFormat(
        "  host link        %g GB/s each way (one copy engine per direction), %g us per copy; "
        "host memory %s\n",
        f.link.gbps, f.link.latency_us, FormatBytes(f.link.host_memory));
  }
  std::cout << absl::StrFormat("  least budget     %s\n", DescribeLeast(least));
  std::cout << absl::StrFormat(
      "  split limit      %s%s\n",
      r.max_split_bytes == 0 ? std::string("none") : FormatBytes(r.max_split_bytes),
      r.split_halvings == 0
          ? std::string()
          : absl::StrFormat(" (halved %s: run again so, as with each higher limit the "
                            "run did not finish)",
                            r.split_halvings == 1   ? std::string("once")
                            : r.split_halvings == 2 ? std::string("twice")
                                                    : absl::StrFormat("%d times", r.split_halvings)));
  if (!r.alloc_conf.empty()) std::cout << absl::StrFormat("  alloc conf       %s\n", r.alloc_conf);
  std::cout << absl::StrFormat("  peak reserved    %s (unlimited: %s)\n",
                               FormatBytes(r.peak_reserved_bytes),
                               FormatBytes(base.peak_reserved_bytes));
  std::cout << absl::StrFormat("  peak live        %s (unlimited: %s)\n",
                               FormatBytes(r.peak_live_bytes), FormatBytes(base.peak_live_bytes));
  std::cout << absl::StrFormat("  time             %.3f ms (baseline %.3f ms, overhead %s)\n",
                               static_cast<double>(r.time_ns) / 1e6,
                               static_cast<double>(base.time_ns) / 1e6, overhead);
  std::cout << absl::StrFormat("  recomputed       %d ops, %.3f ms\n", r.recomputed_ops,
                               static_cast<double>(r.recompute_ns) / 1e6);
  std::cout << absl::StrFormat("  offloaded        %s, restored %s, stall %.3f ms\n",
                               FormatBytes(r.offloaded_bytes), FormatBytes(r.restored_bytes),
                               static_cast<double>(r.stall_ns) / 1e6);
  if (r.copies_ahead > 0) {
    std::cout << absl::StrFormat("  copied ahead     %d copies, %s; %d offloads used one\n",
                                 r.copies_ahead, FormatBytes(r.copied_ahead_bytes),
                                 r.ahead_offloads);
  }
  if (!r.kept_policy.empty()) {
    std::cout << absl::StrFormat("  trials           %d runs; kept %s\n", r.trials, r.kept_policy);
  }
  if (r.in_one_place) {
    std::cout << "  placement        each request met in one place"
              << (f.retry_in_one_place ? "\n"
                                       : " (run again so: placed anywhere, it did not finish)\n");
  }
  if (r.outputs_first > 0) {
    std::cout << absl::StrFormat(
        "  outputs first    %d %s: no room beside the inputs, so inputs let go, outputs made, "
        "inputs brought back\n",
        r.outputs_first, r.outputs_first == 1 ? "call" : "calls");
  }
  if (!r.plan.empty()) {
    const std::string other = r.plan == "mixed" ? "drop-only" : "mixed";
    std::cout << absl::StrFormat(
        "  offload guard    kept the %s plan; the best %s plan: %s\n", r.plan, other,
        r.other_plan_status != "ok"
            ? r.other_plan_status
            : base.time_ns > 0 ? absl::StrFormat("%.3f", static_cast<double>(r.other_plan_time_ns) /
                                                             static_cast<double>(base.time_ns))
                               : std::string("ok"));
  }
  std::cout << absl::StrFormat("  evictions        %d\n", r.evictions);
  if (r.directed_evictions > 0 || r.skipped_evicts > 0) {
    std::cout << absl::StrFormat(
        "  trace's evicts   %d carried out, %d skipped (not on the device, or not allowed)\n",
        r.directed_evictions, r.skipped_evicts);
  }
  if (r.pressure_events > 0) {
    std::cout << absl::StrFormat(
        "  decisions        %d, %.0f candidates and %.2f us each on average\n", r.pressure_events,
        static_cast<double>(r.candidates_shown) / static_cast<double>(r.pressure_events),
        static_cast<double>(r.choose_wall_ns) / 1e3 / static_cast<double>(r.pressure_events));
  }
  if (f.verify) {
    std::cout << absl::StrFormat(
        "  verified         %d accesses, %d mismatches (the host waited %d times to run queued "
        "checks: verify mode checks bytes, its times are not the model's)\n",
        r.verified_accesses, r.mismatches, r.verify_waits);
  }
  std::cout << absl::StrFormat(
      "  replay speed     %.2f M records/s (%.3f ms for the record loop, %.3f s in all; "
      "unlimited run %.2f M records/s)\n",
      RecordsPerSecond(r) / 1e6, r.replay_seconds * 1e3, r.wall_seconds,
      RecordsPerSecond(base) / 1e6);
  if (!f.timeline_path.empty()) {
    std::cout << absl::StrFormat("  timeline         %s\n", f.timeline_path);
  }
}

std::string ToJson(const OpReplayReport& r, const OpReplayReport& base, const SimFlags& f,
                   const LeastBudget& least) {
  JsonWriter w;
  w.BeginObject();
  w.Key("trace").String(f.trace_path);
  w.Key("status").String(r.status);
  if (!r.message.empty()) w.Key("message").String(r.message);
  w.Key("least_budget_bytes").Uint(least.bytes);
  w.Key("least_budget_op").String(least.op);
  w.Key("least_budget_line").Uint(least.line);
  w.Key("policy").String(r.policy);
  w.Key("accounting").String(f.accounting);
  w.Key("budget_bytes").Uint(r.budget_bytes);
  w.Key("future").String(r.future);
  w.Key("max_split_bytes").Uint(r.max_split_bytes);
  w.Key("alloc_conf").String(r.alloc_conf);
  if (f.budget_ratio > 0) w.Key("budget_ratio").Double(f.budget_ratio);
  w.Key("swap").Bool(!f.no_swap);
  w.Key("link_gbps").Double(f.link.gbps);
  w.Key("link_latency_ns").Int(f.link.latency_ns());
  w.Key("host_memory_bytes").Uint(f.link.host_memory);
  w.Key("recompute").Bool(!f.no_recompute);
  w.Key("peak_reserved_bytes").Uint(r.peak_reserved_bytes);
  w.Key("peak_live_bytes").Uint(r.peak_live_bytes);
  w.Key("baseline_peak_reserved_bytes").Uint(base.peak_reserved_bytes);
  w.Key("baseline_peak_live_bytes").Uint(base.peak_live_bytes);
  w.Key("baseline_ns").Int(base.time_ns);
  w.Key("time_ns").Int(r.time_ns);
  // None where the run did not finish: the part that ran is no answer.
  if (r.status == "ok" && base.time_ns > 0) {
    w.Key("overhead").Double(static_cast<double>(r.time_ns) / static_cast<double>(base.time_ns));
  } else {
    w.Key("overhead").Null();
  }
  w.Key("trials").Int(r.trials);
  w.Key("kept_policy").String(r.kept_policy);
  w.Key("in_one_place").Bool(r.in_one_place);
  w.Key("split_halvings").Uint(r.split_halvings);
  if (!r.plan.empty()) {
    w.Key("plan").String(r.plan);
    w.Key("other_plan_status").String(r.other_plan_status);
    if (r.other_plan_status == "ok" && base.time_ns > 0) {
      w.Key("other_plan_overhead")
          .Double(static_cast<double>(r.other_plan_time_ns) / static_cast<double>(base.time_ns));
    } else {
      w.Key("other_plan_overhead").Null();
    }
  }
  w.Key("recomputed_ops").Uint(r.recomputed_ops);
  w.Key("recompute_ns").Int(r.recompute_ns);
  w.Key("offloaded_bytes").Uint(r.offloaded_bytes);
  w.Key("restored_bytes").Uint(r.restored_bytes);
  w.Key("stall_ns").Int(r.stall_ns);
  w.Key("evictions").Uint(r.evictions);
  w.Key("directed_evictions").Uint(r.directed_evictions);
  w.Key("skipped_evicts").Uint(r.skipped_evicts);
  w.Key("pressure_events").Uint(r.pressure_events);
  w.Key("covering_runs").Uint(r.covering_runs);
  w.Key("outputs_first").Uint(r.outputs_first);
  w.Key("copies_ahead").Uint(r.copies_ahead);
  w.Key("ahead_offloads").Uint(r.ahead_offloads);
  w.Key("copied_ahead_bytes").Uint(r.copied_ahead_bytes);
  w.Key("candidates_per_event")
      .Double(r.pressure_events > 0
                  ? static_cast<double>(r.candidates_shown) / static_cast<double>(r.pressure_events)
                  : 0.0);
  w.Key("choose_ns_per_event")
      .Double(r.pressure_events > 0
                  ? static_cast<double>(r.choose_wall_ns) / static_cast<double>(r.pressure_events)
                  : 0.0);
  w.Key("records").Uint(r.records);
  w.Key("wall_seconds").Double(r.wall_seconds);
  w.Key("replay_seconds").Double(r.replay_seconds);
  w.Key("records_per_second").Double(RecordsPerSecond(r));
  // The unlimited run's, in the same process: against it, what eviction
  // costs within this build (sim/README.md).
  w.Key("baseline_records_per_second").Double(RecordsPerSecond(base));
  if (f.verify) {
    w.Key("verified_accesses").Uint(r.verified_accesses);
    w.Key("verify_waits").Uint(r.verify_waits);
    w.Key("mismatches").Uint(r.mismatches);
  }
  if (!f.timeline_path.empty()) w.Key("timeline").String(f.timeline_path);
  w.EndObject();
  return w.Take();
}

int RunSim(const SimFlags& f) {
  if (std::isnan(f.budget_ratio)) {
    return ReportError("sim", absl::InvalidArgumentError(
                                  "--budget-ratio must be a number, a fraction of the peak"));
  }
  if ((f.budget_ratio > 0) == (f.budget > 0)) {
    return ReportError(
        "sim", absl::InvalidArgumentError("give exactly one of --budget-ratio and --budget"));
  }
  // A timeline that cannot be written, or would overwrite the trace, is
  // refused before anything runs.
  if (absl::Status outputs =
          CheckOutputPaths({{"the trace", f.trace_path}}, {{"--timeline", f.timeline_path}});
      !outputs.ok()) {
    return ReportError("sim", outputs);
  }
  absl::StatusOr<OpTrace> trace = ReadOpTrace(f.trace_path);
  if (!trace.ok()) return ReportError("sim", trace.status());
  OpReplayOptions options;
  options.policy = f.policy;
  options.link_gbps = f.link.gbps;
  options.link_latency_ns = f.link.latency_ns();
  options.host_memory = f.link.host_memory;
  options.enable_offload = !f.no_swap;
  options.enable_drop = !f.no_recompute;
  options.offload_guard = !f.no_offload_guard;
  options.retry_in_one_place = f.retry_in_one_place;
  options.in_one_place_after_failure = !f.retry_anywhere;
  options.keep_regenerated = !f.release_regenerated;
  options.outputs_first_after_oom = !f.inputs_held;
  options.copy_ahead = !f.no_copy_ahead;
  options.thrash_limit = f.thrash_limit;
  options.max_split_size = f.max_split;
  options.alloc_conf = f.alloc_conf;
  options.scale = f.scale;
  absl::StatusOr<Future> future = ParseFuture(f.future);
  if (!future.ok()) return ReportError("sim", future.status());
  options.future = *future;
  // The unlimited run: the baseline time and the peak the ratio refers to.
  OpReplayOptions unlimited = options;
  // PyTorch's default allocator, whatever the budgeted run uses: the peak a
  // ratio refers to does not move with --max-split.
  unlimited.max_split_size = std::numeric_limits<std::size_t>::max();
  unlimited.alloc_conf.clear();
  absl::StatusOr<OpReplayReport> base = ReplayOpTrace(*trace, unlimited);
  if (!base.ok()) return ReportError("sim", base.status());
  absl::StatusOr<Accounting> accounting = ParseAccounting(f.accounting);
  if (!accounting.ok()) return ReportError("sim", accounting.status());
  const MemoryBudget budget = f.budget_ratio > 0
                                  ? MemoryBudget::FromRatio(f.budget_ratio, *base, *accounting)
                                  : MemoryBudget{f.budget, *accounting};
  if (absl::Status honoured = budget.Check(); !honoured.ok()) return ReportError("sim", honoured);
  budget.ApplyTo(options);
  options.verify = f.verify;
  SimTimeline timeline;
  if (!f.timeline_path.empty()) options.timeline = &timeline;
  absl::StatusOr<OpReplayReport> report = ReplayOpTrace(*trace, options);
  if (!report.ok()) return ReportError("sim", report.status());
  report->budget_bytes = budget.bytes;
  const LeastBudget least = LeastBudgetOf(*trace, f.scale);
  if (report->status == "oom" && budget.bytes < least.bytes) {
    report->message += absl::StrFormat("; no budget under %s can run this trace: call '%s' at "
                                       "line %d needs its inputs and outputs at once",
                                       FormatBytes(least.bytes), least.op, least.line);
  }
  if (!f.timeline_path.empty()) {
    if (absl::Status written = timeline.Write(*trace, f.timeline_path); !written.ok()) {
      return ReportError("sim", written);
    }
  }
  if (f.json) {
    std::cout << ToJson(*report, *base, f, least) << "\n";
  } else {
    PrintText(*report, *base, f, least);
  }
  if (report->mismatches != 0) return kExitFailure;
  return report->status == "ok" ? kExitOk : kExitUnfinished;
}

}  // namespace

Subcommand AddSimCommand(CLI::App& remat) {
  auto flags = std::make_shared<SimFlags>();
  CLI::App* cmd = remat.add_subcommand(
      "sim", "Replay an op trace through the runtime under a budget and an eviction policy");
  cmd->add_option("TRACE", flags->trace_path, "Op trace (JSON Lines)")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--budget-ratio", flags->budget_ratio,
                  "Budget as a fraction of the unlimited run's peak")
      ->check(CLI::Range(1e-6, 1e6));
  AddByteSizeOption(*cmd, "--budget", &flags->budget, "Budget in bytes (e.g. 2GiB)");
  cmd->add_option("--policy", flags->policy,
                  "Eviction policy spec: auto (the step replayed under dtr and every other "
                  "policy, the quickest kept, as a training loop's first steps would try them), "
                  "or one policy (lru, largest, dtr, dtr-eq, dtr-local, msps, megengine, window, "
                  "hybrid, belady, dtr:staleness_exp=2, ...)")
      ->capture_default_str();
  AddLinkOptions(*cmd, &flags->link);
  cmd->add_flag("--no-swap", flags->no_swap, "Never offload to host memory");
  cmd->add_flag("--no-recompute", flags->no_recompute, "Never drop for recompute");
  cmd->add_flag("--no-offload-guard", flags->no_offload_guard,
                "With drops and offloads allowed, report the policy's mixed plan as it is "
                "(by default the step is also run with drops only and the cheaper is kept)");
  cmd->add_flag("--no-copy-ahead", flags->no_copy_ahead,
                "Start each copy out only when pressure offloads the tensor (by default, once "
                "the budget has bound and whenever the link has time, the next tensor the "
                "policy would offload is copied out ahead and stays resident until evicted, "
                "which then frees its block with no copy to wait for)");
  CLI::Option* one_place = cmd->add_flag(
      "--retry-in-one-place", flags->retry_in_one_place,
      "Where the policy's plan for a request would free its bytes in scattered places, meet "
      "it in one place instead: a covering run of blocks, or as much of the policy's ranking "
      "as makes room, whichever costs less (by default the plan is carried out and the "
      "allocator asks again, and under a reserved budget a run that did not finish so runs "
      "again in one place, then with the split limit halved; one place is often faster, and "
      "makes some runs fail that finish by default)");
  cmd->add_flag("--retry-anywhere", flags->retry_anywhere,
                "Carry out the policy's plan even where it scatters a request's bytes, and do not "
                "run a run that did not finish again (in one place, or with a lower split "
                "limit)")
      ->excludes(one_place);
  cmd->add_flag("--inputs-held", flags->inputs_held,
                "Never let go of a call's inputs to make its outputs (by default, under a "
                "reserved budget, a call whose outputs find no room beside its inputs is made "
                "the other way round: inputs let go, outputs made, inputs brought back)");
  cmd->add_flag("--release-regenerated", flags->release_regenerated,
                "Drop a tensor the program has released as soon as the regeneration that "
                "brought it back ends (by default it stays, evictable, while a consumer of it "
                "is still dropped and would bring it back again)");
  cmd->add_option("--accounting", flags->accounting, "What the budget counts")
      ->capture_default_str()
      ->check(CLI::IsMember({"reserved", "live"}));
  cmd->add_option("--future", flags->future,
                  "What policies that read next uses (belady, hybrid) are told: known (the "
                  "trace's), learned (the trace replayed twice, the second step reported, its "
                  "next uses estimated from the first), none")
      ->capture_default_str()
      ->check(CLI::IsMember({"known", "learned", "none"}));
  AddMaxSplitOption(*cmd, &flags->max_split);
  AddAllocConfOption(*cmd, &flags->alloc_conf);
  cmd->add_option("--thrash-limit", flags->thrash_limit,
                  "Stop when recompute exceeds this x the trace's compute")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->add_flag("--verify", flags->verify, "Keep real bytes and check every read");
  cmd->add_option("--scale", flags->scale, "Divide every size by this (with --verify)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30));
  cmd->add_option("--timeline", flags->timeline_path,
                  "Write the budgeted run as a Chrome trace of simulated time (Perfetto)")
      ->type_name("FILE.json");
  cmd->footer(kFooter);
  return Subcommand{cmd, [flags] { return RunSim(*flags); }};
}

}  // namespace remat::tools
