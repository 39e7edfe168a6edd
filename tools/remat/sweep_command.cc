// remat sweep: every policy at every budget ratio over one op trace (a file,
// or a model generated on the fly), in parallel; a table, a CSV and a plot.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/units.h"
#include "gen/model_gen.h"
#include "sim/sweep.h"
#include "simdjson.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"
#include "trace/op_trace.h"

namespace remat::tools {
namespace {

struct SweepFlags {
  std::string trace_path;
  std::string model;
  std::string ratios = "0.2:0.9:0.1";
  std::string policies = "lru,dtr,dtr-eq,msps,window,hybrid";
  std::string accounting = "reserved";
  bool no_swap = false;
  bool no_offload_guard = false;
  bool retry_anywhere = false;
  bool retry_in_one_place = false;
  bool release_regenerated = false;
  bool inputs_held = false;
  bool no_copy_ahead = false;
  bool no_recompute = false;
  std::string future = "known";
  LinkFlags link;
  double thrash_limit = 1.0;
  std::size_t max_split = 0;  // OpReplayOptions::max_split_size
  std::string alloc_conf;
  int jobs = 0;
  std::string out_dir;
  bool no_plot = false;
  bool bound = false;
  double bound_time_limit = 60;
};

std::vector<std::string> SplitPolicies(const std::string& text) {
  // Specs hold commas of their own ("dtr:a=1,b=2"): a new spec starts at a
  // piece without '=' (a policy name), the rest continue the previous one.
  std::vector<std::string> specs;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string piece = text.substr(start, comma == std::string::npos ? std::string::npos
                                                                            : comma - start);
    // "k=v" continues a spec with parameters; "name" or "name:k=v" starts one.
    const std::size_t eq = piece.find('='), colon = piece.find(':');
    const bool continues = eq != std::string::npos && (colon == std::string::npos || eq < colon);
    if (!specs.empty() && continues && specs.back().find(':') != std::string::npos) {
      specs.back() += "," + piece;
    } else {
      specs.push_back(piece);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return specs;
}

// Draws DIR/overhead.png with the script it leaves beside it; false if no
// plotting library is there (the CSV and the table are the results).
// (Paths come from the command line; single quotes in them break the command.)
std::string ShellQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What a replayed plan's pressure falls back on.
const policies::PolicySpec kPlanFallback("dtr");

// The table cell for one JSON report of remat.optimal (see Bounds).
std::string BoundCell(const std::string& text) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  std::string_view status;
  if (parser.parse(text).get(doc) != simdjson::SUCCESS ||
      doc["status"].get(status) != simdjson::SUCCESS) {
    return "error";
  }
  if (status == "ok") {
    double value = 0;
    bool exact = false;
    if (doc["overhead_bound"].get(value) != simdjson::SUCCESS) return "error";
    if (doc["exact"].get(exact) != simdjson::SUCCESS) exact = false;
    return absl::StrFormat("%s%.3f", exact ? "" : "~", value);
  }
  if (status == "infeasible") return "infeasible";
  if (status == "too_large") return "too large";
  return "error";
}

// remat.optimal's lower bound at each ratio's budget, as table cells:
// "1.133" (the program's optimum), "~1.221" (the solver's proven bound at its
// time limit), "infeasible" (no run fits), "too large" (the program is not
// built) or "error" (why: --out's bound_errors.txt). With `link`, the bound
// of runs that may also offload over it; without, of drop-only runs.
// Each ratio's plan is written to PlanPath(out_dir, ratio), and its path
// put in `plans` where the solver gave one.
std::string PlanPath(const std::string& out_dir, double ratio) {
  return absl::StrFormat("%s/plan_%.9g.jsonl", out_dir, ratio);
}

std::map<double, std::string> Bounds(const std::string& trace_path, const SweepResult& result,
                                     const LinkFlags* link, double time_limit,
                                     const std::string& out_dir,
                                     std::map<double, std::string>* plans) {
  // REMAT_PYTHON, else the source tree's .venv (where the README installs
  // scipy), else python3.
  std::string python = std::getenv("REMAT_PYTHON") != nullptr ? std::getenv("REMAT_PYTHON") : "";
  if (python.empty()) {
    const std::string venv = std::string(REMAT_PYTHON_DIR) + "/../.venv/bin/python";
    std::error_code exists_ec;
    python = std::filesystem::exists(venv, exists_ec) ? venv : "python3";
  }
  const char* path = std::getenv("PYTHONPATH");
  // The package in this source tree first, then whatever the user has.
  const std::string python_path =
      std::string(REMAT_PYTHON_DIR) + (path != nullptr && *path ? std::string(":") + path : "");
  const std::string errors = out_dir + "/bound_errors.txt";
  const std::string offload =
      link == nullptr ? ""
                      : absl::StrFormat(" --offload --link-gbps %.17g --link-latency-ns %d",
                                        link->gbps, link->latency_ns());
  std::map<double, std::string> cells;
  for (const SweepRow& row : result.rows) {
    if (cells.contains(row.ratio)) continue;
    // The sweep's own output from an earlier run (never the trace: checked).
    const std::string plan = PlanPath(out_dir, row.ratio);
    std::error_code removed_ec;
    std::filesystem::remove(plan, removed_ec);
    const std::string command = absl::StrFormat(
        "PYTHONPATH=%s %s -m remat.optimal %s --budget %d --time-limit %g%s --plan-out %s "
        "--json 2>>%s",
        ShellQuoted(python_path), ShellQuoted(python), ShellQuoted(trace_path), row.budget,
        time_limit, offload, ShellQuoted(plan), ShellQuoted(errors));
    std::string text;
    if (FILE* pipe = popen(command.c_str(), "r"); pipe != nullptr) {
      char buf[4096];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
      pclose(pipe);
    }
    cells[row.ratio] = BoundCell(text);
    std::error_code exists_ec;
    if (std::filesystem::exists(plan, exists_ec)) (*plans)[row.ratio] = plan;
  }
  std::error_code ec;
  if (std::filesystem::exists(errors, ec) && std::filesystem::file_size(errors, ec) == 0) {
    std::filesystem::remove(errors, ec);
  }
  return cells;
}

// --out, created with the parents it lacks; unless Keep() is called, the
// directories it made are removed again (deepest first, each only while
// empty), so a sweep that fails leaves no trace of itself, and a directory
// that was there before is never touched.
class OutDirectory {
 public:
  absl::Status Create(const std::string& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p, ec) || p == p.parent_path()) break;
      created_.push_back(p);  // deepest first
    }
    fs::create_directories(dir, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
    return absl::OkStatus();
  }
  void Keep() { created_.clear(); }
  ~OutDirectory() {
    for (const std::filesystem::path& p : created_) {
      std::error_code ec;
      if (!std::filesystem::is_empty(p, ec) || ec) break;
      std::filesystem::remove(p, ec);
    }
  }

 private:
  std::vector<std::filesystem::path> created_;
};

bool Plot(const std::string& dir) {
  const std::string script = dir + "/plot_overhead.py";
  if (!WriteFile(script, SweepPlotScript(dir + "/results.csv", dir + "/overhead.png", script))
           .ok()) {
    return false;
  }
  // The python3 on PATH first; then the system's, where Debian's
  // python3-matplotlib lives when PATH has another Python (pyenv, venv).
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    const std::string command =
        std::string(python) + " '" + script + "' 2>'" + dir + "/plot_errors.txt'";
    if (std::system(command.c_str()) == 0) {
      std::filesystem::remove(dir + "/plot_errors.txt");
      return true;
    }
  }
  return false;
}

int RunSweepCommand(const SweepFlags& f) {
  if (f.trace_path.empty() == f.model.empty()) {
    std::cerr << "remat sweep: give exactly one of TRACE and --model SPEC\n";
    return kExitUsage;
  }
  absl::StatusOr<std::vector<double>> ratios = ParseRatios(f.ratios);
  if (!ratios.ok()) return ReportError("sweep", ratios.status());
  if (f.bound && f.accounting != "live") {
    // A bound for runs under a live budget: one the allocator's segments
    // constrain is not bounded by it.
    std::cerr << "remat sweep: --bound is a lower bound for runs under a live budget: "
                 "use it with --accounting live\n";
    return kExitUsage;
  }
  absl::StatusOr<OpTrace> trace;
  std::string generated_text;
  if (!f.model.empty()) {
    absl::StatusOr<GeneratedTrace> generated = GenerateModelTrace(f.model);
    if (!generated.ok()) return ReportError("sweep", generated.status());
    trace = ParseOpTrace(generated->text, generated->spec);
    generated_text = std::move(generated->text);
  } else {
    trace = ReadOpTrace(f.trace_path);
  }
  if (!trace.ok()) return ReportError("sweep", trace.status());
  std::error_code ec;
  OutDirectory out_dir;
  if (absl::Status s = out_dir.Create(f.out_dir); !s.ok()) return ReportError("sweep", s);
  // The trace may sit in the output directory: it is never overwritten.
  std::vector<NamedPath> outputs = {{"--out's results.csv", f.out_dir + "/results.csv"}};
  if (!f.no_plot) {
    outputs.push_back({"--out's overhead.png", f.out_dir + "/overhead.png"});
    outputs.push_back({"--out's plot_overhead.py", f.out_dir + "/plot_overhead.py"});
    outputs.push_back({"--out's plot_errors.txt", f.out_dir + "/plot_errors.txt"});
  }
  if (f.bound) {
    outputs.push_back({"--out's bound_errors.txt", f.out_dir + "/bound_errors.txt"});
    if (!f.model.empty()) outputs.push_back({"--out's model.jsonl", f.out_dir + "/model.jsonl"});
    for (double ratio : *ratios) {
      outputs.emplace_back("--out's plan at " + absl::StrFormat("%g", ratio),
                           PlanPath(f.out_dir, ratio));
    }
  }
  if (absl::Status s = CheckOutputPaths({{"the trace", f.trace_path}}, outputs); !s.ok()) {
    return ReportError("sweep", s);
  }

  SweepOptions o;
  o.ratios = *ratios;
  // Each parsed and checked once, here (RunSweep refuses a bad one before running).
  for (const std::string& text : SplitPolicies(f.policies)) o.policies.emplace_back(text);
  o.live = f.accounting == "live";
  o.enable_offload = !f.no_swap;
  o.offload_guard = !f.no_offload_guard;
  o.retry_in_one_place = f.retry_in_one_place;
  o.in_one_place_after_failure = !f.retry_anywhere;
  o.keep_regenerated = !f.release_regenerated;
  o.outputs_first_after_oom = !f.inputs_held;
  o.copy_ahead = !f.no_copy_ahead;
  absl::StatusOr<Future> future = ParseFuture(f.future);
  if (!future.ok()) return ReportError("sweep", future.status());
  o.future = *future;
  o.enable_drop = !f.no_recompute;
  o.link_gbps = f.link.gbps;
  o.link_latency_ns = f.link.latency_ns();
  o.host_memory = f.link.host_memory;
  o.thrash_limit = f.thrash_limit;
  o.max_split_size = f.max_split;
  o.alloc_conf = f.alloc_conf;
  o.jobs = f.jobs > 0 ? f.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool tty = isatty(STDERR_FILENO) != 0;
  o.progress = [tty](std::size_t done, std::size_t total, const SweepRow& row) {
    if (tty) {
      const int width = 30;
      const int filled = static_cast<int>(width * done / total);
      std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done, total);
      if (done == total) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "sweep: %zu/%zu %s at %g: %s\n", done, total, row.policy.c_str(),
                   row.ratio, row.report.status.c_str());
    }
  };
  absl::StatusOr<SweepResult> result = RunSweep(*trace, o);
  if (!result.ok()) return ReportError("sweep", result.status());
  if (absl::Status s = WriteFile(f.out_dir + "/results.csv", SweepCsv(*result)); !s.ok()) {
    return ReportError("sweep", s);
  }
  out_dir.Keep();
  std::map<double, std::string> bounds;
  std::map<double, std::string> plans;
  if (f.bound) {
    std::string bound_trace = f.trace_path;
    if (!f.model.empty()) {  // remat.optimal reads a file: the generated trace goes in --out
      bound_trace = f.out_dir + "/model.jsonl";
      if (absl::Status s = WriteFile(bound_trace, generated_text); !s.ok()) {
        return ReportError("sweep", s);
      }
    }
    std::map<double, std::string> plan_paths;
    bounds = Bounds(bound_trace, *result, f.no_swap ? nullptr : &f.link, f.bound_time_limit,
                    f.out_dir, &plan_paths);
    for (const auto& [ratio, path] : plan_paths) {
      // A plan that cannot be read or replayed is a cell that says so (and
      // why, on standard error), not the end of the table.
      absl::StatusOr<OpTrace> planned = ReadOpTrace(path);
      std::uint64_t budget = 0;
      for (const SweepRow& row : result->rows) {
        if (row.ratio == ratio) budget = row.budget;
      }
      absl::StatusOr<OpReplayReport> run =
          planned.ok() ? ReplayPlan(*planned, o, budget, kPlanFallback)
                       : absl::StatusOr<OpReplayReport>(planned.status());
      if (!run.ok()) {
        std::cerr << "remat sweep: the plan at " << ratio << ": " << run.status().message()
                  << "\n";
        plans[ratio] = "error";
        continue;
      }
      plans[ratio] = run->status != "ok"
                         ? run->status
                         : absl::StrFormat("%.3f", static_cast<double>(run->time_ns) /
                                                       static_cast<double>(result->baseline.time_ns));
    }
  }
  std::cout << SweepTable(*result, f.bound ? &bounds : nullptr, f.bound ? &plans : nullptr);
  if (f.bound) {
    std::cout << "plan: the solver's plan (" << f.out_dir
              << "/plan_RATIO.jsonl), replayed with policy " << kPlanFallback.given()
              << " where it did not foresee the pressure, and a thrash limit of at least "
              << kPlanThrashLimit
              << " (a plan may recompute ahead of the calls that pay for it): a real run, so "
                 "the optimum lies between it and the bound (-: no plan)\n";
    std::cout << "bound: no " << (f.no_swap ? "drop-only run" : "run, dropping or offloading,")
              << " can take less (python -m remat.optimal" << (f.no_swap ? "" : " --offload")
              << "; ~: the solver's proven bound at its time limit)";
    if (std::filesystem::exists(f.out_dir + "/bound_errors.txt", ec)) {
      std::cout << "; errors in " << f.out_dir << "/bound_errors.txt";
    }
    std::cout << "\n";
  }
  if (trace->least_budget_record != kNoOpIndex) {
    const OpRecord& r = trace->records[trace->least_budget_record];
    std::cout << absl::StrFormat(
        "least budget: %s live, set by call '%s' at line %d (its inputs and outputs, with the "
        "constants live then): %.3f of the unlimited peak live bytes\n",
        FormatBytes(trace->least_budget_bytes),
        r.name == kNoOpIndex ? std::string() : trace->names[r.name], r.line,
        trace->peak_live_bytes == 0 ? 0.0
                                    : static_cast<double>(trace->least_budget_bytes) /
                                          static_cast<double>(trace->peak_live_bytes));
  }
  std::cout << SweepConclusion(*result);
  std::cout << "wrote " << f.out_dir << "/results.csv\n";
  if (!f.no_plot) {
    if (Plot(f.out_dir)) {
      std::cout << "drew " << f.out_dir << "/overhead.png (" << f.out_dir
                << "/plot_overhead.py redraws it)\n";
    } else {
      std::cout << "no plot: python3 with matplotlib is needed (Debian: python3-matplotlib); see "
                << f.out_dir << "/plot_errors.txt\n";
    }
  }
  return kExitOk;
}

}  // namespace

Subcommand AddSweepCommand(CLI::App& remat) {
  auto flags = std::make_shared<SweepFlags>();
  CLI::App* cmd = remat.add_subcommand(
      "sweep", "Run every policy at every budget ratio; a table, results.csv and overhead.png");
  cmd->add_option("TRACE", flags->trace_path, "Op trace (JSON Lines)")->type_name("FILE");
  cmd->add_option("--model", flags->model,
                  "Generate the trace instead (a `remat gen` SPEC, e.g. gpt2:layers=12)");
  cmd->add_option("--ratios", flags->ratios, "FROM:TO:STEP or a list (0.3,0.5)")
      ->capture_default_str();
  cmd->add_option("--policies", flags->policies, "Comma-separated policy specs")
      ->capture_default_str();
  cmd->add_option("--accounting", flags->accounting, "What the budget counts")
      ->capture_default_str()
      ->check(CLI::IsMember({"reserved", "live"}));
  cmd->add_flag("--no-swap", flags->no_swap, "Never offload to host memory");
  cmd->add_flag("--no-offload-guard", flags->no_offload_guard,
                "Keep each policy's mixed plan as it is (by default each run is also made "
                "with drops only and the cheaper is kept)");
  cmd->add_flag("--no-recompute", flags->no_recompute, "Never drop for recompute");
  cmd->add_flag("--no-copy-ahead", flags->no_copy_ahead,
                "Start each copy out only when pressure offloads the tensor (as remat sim "
                "--no-copy-ahead)");
  CLI::Option* one_place =
      cmd->add_flag("--retry-in-one-place", flags->retry_in_one_place,
                    "Meet a request the policy's plan would scatter in one place (as remat sim "
                    "--retry-in-one-place)");
  cmd->add_flag("--retry-anywhere", flags->retry_anywhere,
                "Carry out each policy's plan even where it scatters a request's bytes, and do "
                "not run a run that did not finish again, in one place or with a lower split "
                "limit (as remat sim "
                "--retry-anywhere)")
      ->excludes(one_place);
  cmd->add_flag("--inputs-held", flags->inputs_held,
                "Never let go of a call's inputs to make its outputs (as remat sim "
                "--inputs-held)");
  cmd->add_flag("--release-regenerated", flags->release_regenerated,
                "Drop a released tensor as soon as the regeneration that brought it back ends "
                "(as remat sim --release-regenerated)");
  cmd->add_option("--future", flags->future,
                  "What policies that read next uses are told (as remat sim --future)")
      ->capture_default_str()
      ->check(CLI::IsMember({"known", "learned", "none"}));
  AddLinkOptions(*cmd, &flags->link);
  AddMaxSplitOption(*cmd, &flags->max_split);
  AddAllocConfOption(*cmd, &flags->alloc_conf);
  cmd->add_option("--thrash-limit", flags->thrash_limit,
                  "Stop a run when recompute exceeds this x the trace's compute")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--jobs", flags->jobs, "Runs at once (default: one per core)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--out", flags->out_dir, "Directory for results.csv and overhead.png")
      ->required()
      ->type_name("DIR");
  cmd->add_flag("--no-plot", flags->no_plot, "Skip the plot");
  cmd->add_flag("--bound", flags->bound,
                "Add two columns: the solver's plan replayed (written to --out's "
                "plan_RATIO.jsonl, replacing an earlier sweep's) and the least time any run "
                "could take at each budget, drop-only with --no-swap, else dropping or "
                "offloading over the link (python -m remat.optimal, needs scipy; with "
                "--accounting live)");
  cmd->add_option("--bound-time-limit", flags->bound_time_limit,
                  "Seconds the solver may take per ratio (then its proven bound is shown)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  cmd->footer(
      "Example: remat sweep --model gpt2:layers=4,seq=512 --ratios 0.3:0.9:0.1 --out sweep/\n"
      "Budgets are ratios of an unlimited replay's peak, as in `remat sim`.");
  return Subcommand{cmd, [flags] { return RunSweepCommand(*flags); }};
}

}  // namespace remat::tools
