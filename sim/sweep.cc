#include "sim/sweep.h"

#include <algorithm>
#include <limits>
#include <atomic>
#include <charconv>
#include <cmath>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/units.h"
#include "policies/registry.h"

namespace remat {
namespace {

absl::StatusOr<double> ParseNumber(std::string_view text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a number", std::string(text)));
  }
  return v;
}

// (Debian's Abseil has its own string_view: absl::StrSplit does not take ours.)
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    const std::size_t at = text.find(sep);
    parts.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

}  // namespace

double SweepResult::Overhead(const SweepRow& row) const {
  return baseline.time_ns > 0
             ? static_cast<double>(row.report.time_ns) / static_cast<double>(baseline.time_ns)
             : 0.0;
}

absl::StatusOr<std::vector<double>> ParseRatios(std::string_view text) {
  std::vector<double> ratios;
  const std::vector<std::string_view> range = Split(text, ':');
  if (range.size() == 3) {
    absl::StatusOr<double> from = ParseNumber(range[0]), to = ParseNumber(range[1]),
                           step = ParseNumber(range[2]);
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    if (!step.ok()) return step.status();
    if (!(*step > 0) || *to < *from) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ratios %s: expected FROM:TO:STEP with FROM <= TO and STEP > 0", std::string(text)));
    }
    // Counted in floating point: a huge range must not wrap an int to a small one.
    const double span = std::floor((*to - *from) / *step + 1e-9) + 1;
    if (!(span <= 1000)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ratios %s: %.0f of them, more than the 1000 a sweep takes", std::string(text), span));
    }
    const auto count = static_cast<int>(span);
    for (int i = 0; i < count; ++i) {
      ratios.push_back(std::round((*from + i * *step) * 1e9) / 1e9);
    }
  } else if (range.size() == 1) {
    for (std::string_view item : Split(text, ',')) {
      absl::StatusOr<double> v = ParseNumber(item);
      if (!v.ok()) return v.status();
      ratios.push_back(*v);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ratios '%s': expected FROM:TO:STEP or a list like 0.3,0.5", std::string(text)));
  }
  for (double r : ratios) {
    if (!(r > 0) || r > 100) {
      return absl::InvalidArgumentError(absl::StrFormat("ratio %g is not in (0, 100]", r));
    }
  }
  return ratios;
}

namespace {

// The replay options every budgeted run of a sweep shares.
OpReplayOptions BaseOptions(const SweepOptions& options) {
  OpReplayOptions base;
  base.link_gbps = options.link_gbps;
  base.link_latency_ns = options.link_latency_ns;
  base.host_memory = options.host_memory;
  base.enable_drop = options.enable_drop;
  base.enable_offload = options.enable_offload;
  base.offload_guard = options.offload_guard;
  base.retry_in_one_place = options.retry_in_one_place;
  base.in_one_place_after_failure = options.in_one_place_after_failure;
  base.keep_regenerated = options.keep_regenerated;
  base.outputs_first_after_oom = options.outputs_first_after_oom;
  base.copy_ahead = options.copy_ahead;
  base.future = options.future;
  base.thrash_limit = options.thrash_limit;
  base.max_split_size = options.max_split_size;
  base.alloc_conf = options.alloc_conf;
  return base;
}

}  // namespace

absl::StatusOr<OpReplayReport> ReplayPlan(const OpTrace& planned, const SweepOptions& options,
                                          std::uint64_t budget,
                                          const policies::PolicySpec& fallback) {
  if (!fallback.ok()) return fallback.status();
  OpReplayOptions o = BaseOptions(options);
  o.policy = fallback;
  o.thrash_limit = std::max(o.thrash_limit, kPlanThrashLimit);
  // The plan drops a released storage again after each regeneration that
  // brings it back, as the program it was solved with says; a kept one would
  // hold room the plan gave to something else.
  o.keep_regenerated = false;
  // (The solver's model holds a call's inputs while its outputs are made.)
  o.outputs_first_after_oom = false;
  MemoryBudget{budget, options.live ? Accounting::kLive : Accounting::kReserved}.ApplyTo(o);
  absl::StatusOr<OpReplayReport> report = ReplayOpTrace(planned, o);
  if (report.ok()) report->budget_bytes = budget;
  return report;
}

absl::StatusOr<SweepResult> RunSweep(const OpTrace& trace, const SweepOptions& options) {
  if (options.ratios.empty() || options.policies.empty()) {
    return absl::InvalidArgumentError("a sweep needs at least one ratio and one policy");
  }
  for (const policies::PolicySpec& spec : options.policies) {
    if (!spec.ok()) return spec.status();
  }
  const OpReplayOptions base = BaseOptions(options);
  SweepResult result;
  result.trace = trace.name;
  result.live = options.live;
  // The reference: PyTorch's default allocator (no split limit) whatever the
  // budgeted runs use, so that a ratio names the same bytes either way.
  OpReplayOptions reference = base;
  reference.future = Future::kKnown;  // nothing is evicted: one step says it all
  reference.max_split_size = std::numeric_limits<std::size_t>::max();
  reference.alloc_conf.clear();
  absl::StatusOr<OpReplayReport> unlimited = ReplayOpTrace(trace, reference);
  if (!unlimited.ok()) return unlimited.status();
  result.baseline = *unlimited;
  const Accounting accounting = options.live ? Accounting::kLive : Accounting::kReserved;
  std::vector<std::size_t> spec_of_row;  // its index in options.policies
  for (std::size_t p = 0; p < options.policies.size(); ++p) {
    for (double ratio : options.ratios) {
      SweepRow row;
      row.policy = options.policies[p].given();
      spec_of_row.push_back(p);
      row.ratio = ratio;
      const MemoryBudget budget = MemoryBudget::FromRatio(ratio, *unlimited, accounting);
      if (absl::Status honoured = budget.Check(); !honoured.ok()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("ratio %g: %s", ratio, honoured.message()));
      }
      row.budget = budget.bytes;
      result.rows.push_back(std::move(row));
    }
  }

  std::atomic<std::size_t> next{0};
  std::mutex mu;  // the first error, and the progress callback
  std::size_t done = 0;
  absl::Status error;
  auto work = [&] {
    for (std::size_t i = next++; i < result.rows.size(); i = next++) {
      SweepRow& row = result.rows[i];
      OpReplayOptions o = base;
      o.policy = options.policies[spec_of_row[i]];
      MemoryBudget{row.budget, accounting}.ApplyTo(o);
      absl::StatusOr<OpReplayReport> r = ReplayOpTrace(trace, o);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        if (error.ok()) error = r.status();
        continue;
      }
      row.report = *r;
      row.report.budget_bytes = row.budget;
      ++done;
      if (options.progress) options.progress(done, result.rows.size(), row);
    }
  };
  const int jobs = std::clamp<int>(options.jobs, 1, static_cast<int>(result.rows.size()));
  std::vector<std::thread> threads;
  for (int j = 1; j < jobs; ++j) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (!error.ok()) return error;
  return result;
}

namespace {

// A CSV field, quoted (RFC 4180: a quote doubled): trace names from a
// --model spec and policy specs contain commas.
std::string CsvQuoted(absl::string_view field) {
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

}  // namespace

std::string SweepCsv(const SweepResult& result) {
  std::string csv =
      "trace,policy,accounting,ratio,budget_bytes,status,overhead,time_ns,baseline_ns,"
      "peak_reserved_bytes,peak_live_bytes,recomputed_ops,recompute_ns,offloaded_bytes,"
      "restored_bytes,stall_ns,evictions,pressure_events,choose_ns_per_event,wall_seconds,plan,"
      "copies_ahead,ahead_offloads,kept_policy,in_one_place,max_split_bytes\n";
  for (const SweepRow& row : result.rows) {
    const OpReplayReport& r = row.report;
    const double choose = r.pressure_events > 0 ? static_cast<double>(r.choose_wall_ns) /
                                                      static_cast<double>(r.pressure_events)
                                                : 0.0;
    absl::StrAppendFormat(
        &csv, "%s,%s,%s,%g,%d,%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.1f,%.6f,%s,%d,%d,%s,%d,%d\n",
        CsvQuoted(result.trace), CsvQuoted(row.policy), result.live ? "live" : "reserved",
        row.ratio, row.budget, r.status,
        // Empty where the run did not finish: not a number anyone should average.
        r.status == "ok" ? absl::StrFormat("%.6f", result.Overhead(row)) : std::string(),
        r.time_ns, result.baseline.time_ns,
        r.peak_reserved_bytes, r.peak_live_bytes, r.recomputed_ops, r.recompute_ns,
        r.offloaded_bytes, r.restored_bytes, r.stall_ns, r.evictions, r.pressure_events, choose,
        r.wall_seconds, r.plan, r.copies_ahead, r.ahead_offloads,
        r.kept_policy.empty() ? std::string() : CsvQuoted(r.kept_policy), r.in_one_place ? 1 : 0,
        r.max_split_bytes);
  }
  return csv;
}

std::string SweepTable(const SweepResult& result, const std::map<double, std::string>* bounds,
                       const std::map<double, std::string>* plans) {
  std::vector<std::string> policies;
  std::vector<double> ratios;
  for (const SweepRow& row : result.rows) {
    if (std::find(policies.begin(), policies.end(), row.policy) == policies.end()) {
      policies.push_back(row.policy);
    }
    if (std::find(ratios.begin(), ratios.end(), row.ratio) == ratios.end()) {
      ratios.push_back(row.ratio);
    }
  }
  std::sort(ratios.begin(), ratios.end());
  std::size_t width = 9;
  for (const std::string& p : policies) width = std::max(width, p.size() + 2);
  std::string out = absl::StrFormat("overhead (time / unlimited time; %s budget; * best)\n",
                                    result.live ? "live" : "reserved");
  absl::StrAppendFormat(&out, "%-7s", "ratio");
  for (const std::string& p : policies) absl::StrAppendFormat(&out, "%*s", width, p);
  if (plans != nullptr) absl::StrAppendFormat(&out, "%*s", width, "plan");
  if (bounds != nullptr) absl::StrAppendFormat(&out, "%*s", width, "bound");
  out += "\n";
  for (double ratio : ratios) {
    const SweepRow* best = nullptr;
    for (const SweepRow& row : result.rows) {
      if (row.ratio != ratio || row.report.status != "ok") continue;
      if (best == nullptr || result.Overhead(row) < result.Overhead(*best)) best = &row;
    }
    absl::StrAppendFormat(&out, "%-7g", ratio);
    for (const std::string& p : policies) {
      for (const SweepRow& row : result.rows) {
        if (row.ratio != ratio || row.policy != p) continue;
        const std::string cell =
            row.report.status == "ok"
                ? absl::StrFormat("%.3f%s", result.Overhead(row), &row == best ? "*" : " ")
                : row.report.status + " ";
        absl::StrAppendFormat(&out, "%*s", width, cell);
      }
    }
    if (plans != nullptr) {
      auto it = plans->find(ratio);
      absl::StrAppendFormat(&out, "%*s", width, it == plans->end() ? "-" : it->second + " ");
    }
    if (bounds != nullptr) {
      auto it = bounds->find(ratio);
      absl::StrAppendFormat(&out, "%*s", width, it == bounds->end() ? "-" : it->second + " ");
    }
    out += "\n";
  }
  return out;
}

std::string SweepConclusion(const SweepResult& result) {
  // The best finished run at each ratio, smallest ratio first.
  std::vector<const SweepRow*> best;
  for (const SweepRow& row : result.rows) {
    if (row.report.status != "ok") continue;
    auto same = std::find_if(best.begin(), best.end(),
                             [&](const SweepRow* b) { return b->ratio == row.ratio; });
    if (same == best.end()) {
      best.push_back(&row);
    } else if (result.Overhead(row) < result.Overhead(**same)) {
      *same = &row;
    }
  }
  if (result.baseline.time_ns <= 0) return "";  // no overhead to speak of
  if (best.empty()) {
    return "conclusion: no policy finished at any of these budgets; try larger ratios (the "
           "least budget above is a floor)\n";
  }
  std::sort(best.begin(), best.end(),
            [](const SweepRow* a, const SweepRow* b) { return a->ratio < b->ratio; });
  auto describe = [&](const SweepRow& row) {
    return absl::StrFormat("%s with %s, %+.1f%% time (overhead %.3f)", FormatBytes(row.budget),
                           row.policy, 100.0 * (result.Overhead(row) - 1.0), result.Overhead(row));
  };
  const SweepRow& least = *best.front();
  std::string out = absl::StrFormat(
      "conclusion: the step ran in %.0f%% of its memory (%s budget of %s)", 100.0 * least.ratio,
      result.live ? "live" : "reserved", describe(least));
  const SweepRow* half = nullptr;
  for (const SweepRow* row : best) {
    if (row != &least && (half == nullptr || std::abs(row->ratio - 0.5) < std::abs(half->ratio - 0.5))) {
      half = row;
    }
  }
  if (half != nullptr) {
    absl::StrAppendFormat(&out, "; at %.0f%%: %s", 100.0 * half->ratio, describe(*half));
  }
  out += ".\n";
  return out;
}

std::string SweepPlotScript(const std::string& csv_path, const std::string& png_path,
                            const std::string& script_path) {
  // Paths as Python string literals.
  auto quote = [](const std::string& text) {
    std::string q = "'";
    for (char c : text) {
      if (c == '\\' || c == '\'') q += '\\';
      q += c;
    }
    return q + "'";
  };
  std::string script = R"PY(# Drawn by remat sweep; edit and run again: python3 @@SCRIPT@@
import csv
import textwrap
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(@@CSV@@)))
policies = list(dict.fromkeys(r["policy"] for r in rows))
ok = [float(r["overhead"]) for r in rows if r["status"] == "ok"]
top = max(ok + [1.0]) * 1.05
low = min(ok + [1.0])
step = (top - low) * 0.06 or 0.05
# Every policy its own dash and marker, later ones drawn thinner on top, so a
# line equal to another still shows; its failures sit in a band above the
# plot, one row a policy, marked by kind.
dashes = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1))]
markers = ["o", "s", "D", "v", "P", "*", "h", "<", ">", "p"]
kinds = {"oom": "x", "thrash": "^"}
fig, ax = plt.subplots(figsize=(9, 5))
failures = []
for i, policy in enumerate(policies):
    mine = sorted(((float(r["ratio"]), r) for r in rows if r["policy"] == policy), key=lambda p: p[0])
    xs = [x for x, r in mine if r["status"] == "ok"]
    ys = [float(r["overhead"]) for x, r in mine if r["status"] == "ok"]
    line, = ax.plot(xs, ys, linestyle=dashes[i % len(dashes)], marker=markers[i % len(markers)],
                    markersize=7 - 4 * i / max(len(policies), 1),
                    linewidth=2.4 - 1.6 * i / max(len(policies), 1), label=policy, zorder=2 + i)
    band = top + step * (i + 1)
    for x, r in mine:
        if r["status"] != "ok":
            failures.append(r["status"])
            ax.scatter([x], [band], marker=kinds.get(r["status"], "s"), s=60,
                       color=line.get_color(), zorder=10)
if failures:
    height = step * (len(policies) + 1)
    ax.axhspan(top, top + height, color="grey", alpha=0.12, linewidth=0)
    ax.text(0.005, top + height, " failed, a row a policy: x oom, ^ thrash",
            transform=ax.get_yaxis_transform(), va="top", fontsize=8, color="dimgrey")
    ax.set_ylim(top=top + height + step * 0.5)
ax.axhline(1.0, color="grey", linewidth=0.8)
accounting = rows[0]["accounting"] if rows else "reserved"
ax.set_xlabel("budget / unlimited peak (" + accounting + " bytes)")
ax.set_ylabel("overhead (time / unlimited time)")
# A --model spec is long: wrapped at its commas.
title = (rows[0]["trace"] if rows else "").replace(",", ", ")
ax.set_title(textwrap.fill(title + ": overhead by budget", 90), fontsize=10)
# Outside the plotting area: it never covers a mark.
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(@@PNG@@, dpi=120, bbox_inches="tight")
)PY";
  // One pass over the template: a path that contains a token is not rescanned.
  std::string out;
  for (std::size_t at = 0; at < script.size();) {
    const std::size_t token = script.find("@@", at);
    if (token == std::string::npos) {
      out.append(script, at, std::string::npos);
      break;
    }
    out.append(script, at, token - at);
    const std::size_t end = script.find("@@", token + 2);
    const std::string key = script.substr(token + 2, end - token - 2);
    out += key == "SCRIPT" ? script_path : key == "CSV" ? quote(csv_path) : quote(png_path);
    at = end + 2;
  }
  return out;
}

}  // namespace remat
