#include "bench/ratio_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json_writer.h"

namespace remat::bench {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> Columns() {
  std::vector<std::string> c = {kOurs};
  for (const char* r : kReferences) c.emplace_back(r);
  return c;
}

std::string FormatNs(std::optional<double> ns) {
  if (!ns) return "-";
  return *ns >= 100 ? absl::StrFormat("%.0f", *ns) : absl::StrFormat("%.1f", *ns);
}

std::string FormatRatio(std::optional<double> r) {
  return r ? absl::StrFormat("%.2f", *r) : std::string("-");
}

}  // namespace

RatioReporter::Entry& RatioReporter::EntryFor(const Run& run) {
  const std::string name = run.run_name.str();
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.name == name; });
  if (it == entries_.end()) {
    it = entries_.insert(entries_.end(), Entry{name, {}, {}, 0, run.family_index});
  }
  return *it;
}

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    const std::string name = run.run_name.str();
    if (run.error_occurred) {
      errors_.push_back(absl::StrCat(name, ": ", run.error_message));
      continue;
    }
    // With --benchmark_report_aggregates_only only the aggregates come here;
    // the median's accumulated times are the median over repetitions.
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (run.run_type != Run::RT_Iteration && !median) continue;
    auto ops = run.counters.find("ops");
    const double per_iter = ops != run.counters.end() ? ops->second.value : 1.0;
    const double iterations =
        static_cast<double>(std::max<benchmark::IterationCount>(1, run.iterations));
    const Sample sample{run.real_accumulated_time * 1e9 / iterations / per_iter,
                        run.cpu_accumulated_time * 1e9 / iterations / per_iter, per_iter};
    Entry& entry = EntryFor(run);
    if (median) {
      entry.median = sample;
      entry.repetitions = static_cast<int>(run.repetitions);
    } else {
      entry.samples.push_back(sample);
      entry.repetitions = static_cast<int>(entry.samples.size());
    }
  }
  ConsoleReporter::ReportRuns(runs);
}

std::optional<double> RatioRow::NsPerOp(const std::string& allocator) const {
  auto it = allocators.find(allocator);
  if (it == allocators.end()) return std::nullopt;
  return it->second.cpu_ns_per_op;
}

std::optional<double> RatioRow::Ratio(const std::string& reference) const {
  std::optional<double> ours = NsPerOp(kOurs), theirs = NsPerOp(reference);
  if (!ours || !theirs || *theirs <= 0) return std::nullopt;
  return *ours / *theirs;
}

RatioTable::RatioTable(const std::vector<RatioReporter::Entry>& reported) {
  // Registration order, whatever order the runs came in (they may be interleaved).
  std::vector<RatioReporter::Entry> entries = reported;
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.family_index < b.family_index; });
  for (const RatioReporter::Entry& entry : entries) {
    const std::string& name = entry.name;
    const std::size_t slash = name.rfind('/');
    const std::string group = slash == std::string::npos ? name : name.substr(0, slash);
    const std::string allocator = slash == std::string::npos ? name : name.substr(slash + 1);
    auto row = std::find_if(rows_.begin(), rows_.end(),
                            [&](const RatioRow& r) { return r.group == group; });
    if (row == rows_.end()) {
      rows_.push_back(RatioRow{group, {}});
      row = rows_.end() - 1;
    }
    std::vector<double> real, cpu;
    for (const RatioReporter::Sample& s : entry.samples) {
      real.push_back(s.real_ns_per_op);
      cpu.push_back(s.cpu_ns_per_op);
    }
    if (!entry.samples.empty()) {
      const auto [lo, hi] = std::minmax_element(cpu.begin(), cpu.end());
      row->allocators[allocator] =
          Cell{Median(cpu),      Median(real), *lo, *hi, entry.samples.front().ops_per_iteration,
               entry.repetitions};
    } else if (entry.median) {
      const double m = entry.median->cpu_ns_per_op;
      row->allocators[allocator] = Cell{m, entry.median->real_ns_per_op,    m,
                                        m, entry.median->ops_per_iteration, entry.repetitions};
    }
  }
}

std::vector<FloorResult> RatioTable::Check(const std::vector<Floor>& floors) const {
  std::vector<FloorResult> results;
  for (const Floor& floor : floors) {
    for (const RatioRow& row : rows_) {
      if (row.group.rfind(floor.group_prefix, 0) != 0) continue;
      std::optional<double> ours = row.NsPerOp(kOurs);
      if (!ours) continue;
      if (floor.max_ns_per_op) {
        results.push_back(FloorResult{row.group, floor.description, *ours, *floor.max_ns_per_op,
                                      *ours < *floor.max_ns_per_op});
      }
      if (floor.reference) {
        std::optional<double> ratio = row.Ratio(*floor.reference);
        if (!ratio) continue;
        results.push_back(FloorResult{row.group, floor.description, *ratio, 1.0, *ratio <= 1.0});
      }
    }
  }
  return results;
}

std::string RatioTable::FormatText() const {
  std::size_t width = 9;
  for (const RatioRow& row : rows_) width = std::max(width, row.group.size());
  std::string out = absl::StrFormat("%-*s", width, "benchmark");
  for (const std::string& c : Columns()) absl::StrAppend(&out, absl::StrFormat(" %10s", c));
  for (const char* r : kReferences)
    absl::StrAppend(&out, absl::StrFormat(" %14s", absl::StrCat("/", r)));
  absl::StrAppend(&out, "\n", std::string(out.size(), '-'), "\n");
  for (const RatioRow& row : rows_) {
    absl::StrAppend(&out, absl::StrFormat("%-*s", width, row.group));
    for (const std::string& c : Columns()) {
      absl::StrAppend(&out, absl::StrFormat(" %10s", FormatNs(row.NsPerOp(c))));
    }
    for (const char* r : kReferences) {
      absl::StrAppend(&out, absl::StrFormat(" %14s", FormatRatio(row.Ratio(r))));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out,
                  "(ns per operation: thread CPU time, system time included, median over "
                  "repetitions; /X = remat's ns/op divided by X's: below 1, remat is faster)\n");
  return out;
}

std::string RatioTable::FormatMarkdown() const {
  std::string out = "| benchmark | ops/iter |";
  for (const std::string& c : Columns()) absl::StrAppend(&out, " ", c, " ns/op |");
  for (const char* r : kReferences) absl::StrAppend(&out, " remat / ", r, " |");
  absl::StrAppend(&out, "\n|---|---:|");
  for (std::size_t i = 0; i < Columns().size() + std::size(kReferences); ++i) {
    absl::StrAppend(&out, "---:|");
  }
  absl::StrAppend(&out, "\n");
  for (const RatioRow& row : rows_) {
    const double ops =
        row.allocators.empty() ? 0 : row.allocators.begin()->second.ops_per_iteration;
    absl::StrAppend(&out, "| ", row.group, " | ", absl::StrFormat("%.0f", ops), " |");
    for (const std::string& c : Columns()) {
      auto it = row.allocators.find(c);
      if (it == row.allocators.end()) {
        absl::StrAppend(&out, " - |");
      } else if (it->second.repetitions > 1) {
        absl::StrAppend(&out, " ", FormatNs(it->second.cpu_ns_per_op), " (",
                        FormatNs(it->second.cpu_min), "–", FormatNs(it->second.cpu_max), ") |");
      } else {
        absl::StrAppend(&out, " ", FormatNs(it->second.cpu_ns_per_op), " |");
      }
    }
    for (const char* r : kReferences) absl::StrAppend(&out, " ", FormatRatio(row.Ratio(r)), " |");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string RatioTable::FormatCsv() const {
  std::string out =
      "group,allocator,cpu_ns_per_op,cpu_min,cpu_max,real_ns_per_op,ops_per_iteration,repetitions,"
      "remat_ratio\n";
  for (const RatioRow& row : rows_) {
    for (const auto& [allocator, cell] : row.allocators) {
      std::optional<double> ratio =
          allocator == kOurs ? std::optional<double>(1.0) : row.Ratio(allocator);
      absl::StrAppend(
          &out, absl::StrFormat("%s,%s,%.3f,%.3f,%.3f,%.3f,%.0f,%d,%s\n", row.group, allocator,
                                cell.cpu_ns_per_op, cell.cpu_min, cell.cpu_max, cell.real_ns_per_op,
                                cell.ops_per_iteration, cell.repetitions,
                                ratio ? absl::StrFormat("%.4f", *ratio) : ""));
    }
  }
  return out;
}

std::string RatioTable::FormatJson(const std::string& context_json,
                                   const std::vector<FloorResult>& floors) const {
  JsonWriter w;
  w.BeginObject();
  w.Key("context").Raw(context_json.empty() ? "{}" : context_json);
  w.Key("rows").BeginArray();
  for (const RatioRow& row : rows_) {
    w.BeginObject().Key("group").String(row.group);
    w.Key("cpu_ns_per_op").BeginObject();
    for (const auto& [allocator, cell] : row.allocators)
      w.Key(allocator).Double(cell.cpu_ns_per_op);
    w.EndObject();
    w.Key("cpu_ns_per_op_min_max").BeginObject();
    for (const auto& [allocator, cell] : row.allocators) {
      w.Key(allocator).BeginArray().Double(cell.cpu_min).Double(cell.cpu_max).EndArray();
    }
    w.EndObject();
    w.Key("real_ns_per_op").BeginObject();
    for (const auto& [allocator, cell] : row.allocators)
      w.Key(allocator).Double(cell.real_ns_per_op);
    w.EndObject();
    w.Key("ops_per_iteration")
        .Double(row.allocators.empty() ? 0 : row.allocators.begin()->second.ops_per_iteration);
    w.Key("remat_ratio_to").BeginObject();
    for (const char* r : kReferences) {
      std::optional<double> ratio = row.Ratio(r);
      w.Key(r);
      if (ratio) {
        w.Double(*ratio);
      } else {
        w.Null();
      }
    }
    w.EndObject().EndObject();
  }
  w.EndArray();
  w.Key("floors").BeginArray();
  for (const FloorResult& f : floors) {
    w.BeginObject()
        .Key("group")
        .String(f.group)
        .Key("floor")
        .String(f.description)
        .Key("measured")
        .Double(f.measured)
        .Key("bound")
        .Double(f.bound)
        .Key("met")
        .Bool(f.met)
        .EndObject();
  }
  w.EndArray().EndObject();
  return w.Take() + "\n";
}

std::string FormatFloorsText(const std::vector<FloorResult>& results) {
  std::string out;
  for (const FloorResult& f : results) {
    absl::StrAppend(
        &out, absl::StrFormat("%-4s %-14s %s: measured %.3g (bound %.3g)\n", f.met ? "MET" : "MISS",
                              f.group, f.description, f.measured, f.bound));
  }
  return out;
}

std::string FormatFloorsMarkdown(const std::vector<FloorResult>& results) {
  std::string out = "| benchmark | floor | measured | bound | met |\n|---|---|---:|---:|---|\n";
  for (const FloorResult& f : results) {
    absl::StrAppend(&out,
                    absl::StrFormat("| %s | %s | %.3g | %.3g | %s |\n", f.group, f.description,
                                    f.measured, f.bound, f.met ? "yes" : "**no**"));
  }
  return out;
}

}  // namespace remat::bench
