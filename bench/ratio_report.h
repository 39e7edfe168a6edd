// Ratios against the reference allocators measured in the same run.
//
// Benchmarks are named GROUP/ALLOCATOR ("churn/4096/remat", "churn/4096/glibc")
// and set the counter "ops" to the allocator calls one iteration makes.
// RatioReporter prints Google Benchmark's usual console lines and keeps every
// run; RatioTable then turns them into nanoseconds per operation per group and
// allocator, and remat's ratio to each reference: ours / theirs, so below 1
// means remat is faster. The figure compared is thread CPU time (which counts
// the system time of an allocator's mmap and munmap calls but not the time the
// thread waited for a core, so a busy machine disturbs it less than wall
// time), the median over repetitions; wall time is kept alongside.
#ifndef REMAT_BENCH_RATIO_REPORT_H_
#define REMAT_BENCH_RATIO_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

namespace remat::bench {

inline constexpr const char* kOurs = "remat";
inline constexpr const char* kReferences[] = {"glibc", "jemalloc", "mimalloc"};

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  using benchmark::ConsoleReporter::ConsoleReporter;
  void ReportRuns(const std::vector<Run>& runs) override;

  struct Sample {
    double real_ns_per_op;
    double cpu_ns_per_op;
    double ops_per_iteration;
  };
  struct Entry {
    std::string name;              // the benchmark's name, "churn/4096/remat"
    std::vector<Sample> samples;   // one per repetition, when those are reported
    std::optional<Sample> median;  // the "median" aggregate, when reported
    int repetitions = 0;
    std::int64_t family_index = 0;  // registration order
  };
  // In the order the benchmarks first reported.
  const std::vector<Entry>& entries() const { return entries_; }
  // Names of runs that reported an error, with the message.
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  Entry& EntryFor(const Run& run);

  std::vector<Entry> entries_;
  std::vector<std::string> errors_;
};

struct Cell {
  double cpu_ns_per_op = 0;  // median over repetitions (or the median aggregate)
  double real_ns_per_op = 0;
  double cpu_min = 0, cpu_max = 0;  // the spread over repetitions
  double ops_per_iteration = 0;
  int repetitions = 0;
};

struct RatioRow {
  std::string group;                       // "churn/4096"
  std::map<std::string, Cell> allocators;  // "remat" -> cell
  // ours / reference, for each reference measured alongside ours.
  std::optional<double> Ratio(const std::string& reference) const;
  std::optional<double> NsPerOp(const std::string& allocator) const;
};

// A floor the issue sets: remat's ns/op in `group_prefix`* groups below an
// absolute bound, or no slower than a reference allocator.
struct Floor {
  std::string description;
  std::string group_prefix;
  std::optional<double> max_ns_per_op;   // absolute
  std::optional<std::string> reference;  // ratio to it at most 1
};
struct FloorResult {
  std::string group;
  std::string description;
  double measured = 0;  // ns/op, or the ratio
  double bound = 0;
  bool met = false;
};

class RatioTable {
 public:
  explicit RatioTable(const std::vector<RatioReporter::Entry>& entries);

  const std::vector<RatioRow>& rows() const { return rows_; }
  std::vector<FloorResult> Check(const std::vector<Floor>& floors) const;

  // A fixed-width table for the terminal.
  std::string FormatText() const;
  // The same table as Markdown.
  std::string FormatMarkdown() const;
  // One line per (group, allocator): group,allocator,cpu_ns_per_op,cpu_min,
  // cpu_max,real_ns_per_op,ops_per_iteration,repetitions,remat_ratio (ours / its).
  std::string FormatCsv() const;
  // {"context": <context_json>, "rows": [...], "floors": [...]}
  std::string FormatJson(const std::string& context_json,
                         const std::vector<FloorResult>& floors) const;

 private:
  std::vector<RatioRow> rows_;  // in the order the groups were registered
};

std::string FormatFloorsText(const std::vector<FloorResult>& results);
std::string FormatFloorsMarkdown(const std::vector<FloorResult>& results);

}  // namespace remat::bench

#endif  // REMAT_BENCH_RATIO_REPORT_H_
